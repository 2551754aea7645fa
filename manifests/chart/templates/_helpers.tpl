{{/* The namespace of every namespaced object: fixed, see values.yaml. */}}
{{- define "gpushare.namespace" -}}
gpushare-system
{{- end -}}

{{/* "repository:tag" of an image block; an empty tag means the chart's appVersion. */}}
{{- define "gpushare.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .chart.AppVersion) -}}
{{- end -}}


{{/* kubelet's root dir without a trailing slash; refused unless absolute. */}}
{{- define "gpushare.kubeletRoot" -}}
{{- $root := .Values.kubelet.rootDir | toString | trimSuffix "/" -}}
{{- if not (hasPrefix "/" $root) -}}
{{- fail (printf "kubelet.rootDir must be an absolute path (got %q)" .Values.kubelet.rootDir) -}}
{{- end -}}
{{- $root -}}
{{- end -}}

{{/* The metrics source when it is a file on the node (an absolute path), else "". */}}
{{- define "gpushare.metricsFile" -}}
{{- $source := .Values.config.metrics.source | toString -}}
{{- if hasPrefix "/" $source -}}{{ $source }}{{- end -}}
{{- end -}}

{{/* Values that would render a DaemonSet that cannot work: refused with the value's name. */}}
{{- define "gpushare.validate" -}}
{{- $api := .Values.apiServer -}}
{{- if and (empty $api.host) (not (empty $api.port)) -}}
{{- fail "apiServer.port is set but apiServer.host is empty: set both, or neither for the in-cluster service" -}}
{{- end -}}
{{- if and (not (empty $api.host)) (empty $api.port) -}}
{{- fail "apiServer.host is set but apiServer.port is empty: set both, or neither for the in-cluster service" -}}
{{- end -}}
{{- if hasKey .Values.config "kubelet" -}}
{{- fail "config.kubelet is not a value: kubelet.rootDir names kubelet's root dir, and the device-plugin dir and PodResources socket under it are derived" -}}
{{- end -}}
{{- if not (has .Values.logFormat (list "json" "text")) -}}
{{- fail (printf "logFormat must be json or text (got %q)" .Values.logFormat) -}}
{{- end -}}
{{- $source := .Values.config.metrics.source | toString -}}
{{- if and $source (not (hasPrefix "/" $source)) (not (contains "://" $source)) -}}
{{- fail (printf "config.metrics.source must be a URL or an absolute file path on the node (got %q)" $source) -}}
{{- end -}}
{{- end -}}
