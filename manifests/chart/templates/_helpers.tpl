{{/* The namespace of every namespaced object: fixed, see values.yaml. */}}
{{- define "gpushare.namespace" -}}
gpushare-system
{{- end -}}

{{/* "repository:tag" of an image block; an empty tag means the chart's appVersion. */}}
{{- define "gpushare.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .chart.AppVersion) -}}
{{- end -}}

