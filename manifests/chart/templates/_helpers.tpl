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

{{/* Who may read /metrics from off the node: rbac (a reviewed bearer token) or open. */}}
{{- define "gpushare.metricsAccess" -}}
{{- .Values.config.metrics.access | default "rbac" | toString -}}
{{- end -}}

{{/* Where kubelet's probes reach the agent: its loopback, where the endpoint keeps slots for the
node's own clients however many others hold the rest. The listen address must include it. */}}
{{- define "gpushare.probeHost" -}}
{{- $host := splitList ":" (.Values.config.metrics.listen | toString) | initial | join ":" | trimPrefix "[" | trimSuffix "]" -}}
{{- if has $host (list "" "0.0.0.0" "::") -}}
127.0.0.1
{{- else if or (hasPrefix "127." $host) (eq $host "::1") -}}
{{- $host -}}
{{- else -}}
{{- fail (printf "config.metrics.listen must be on every address (0.0.0.0:PORT) or on loopback (127.0.0.1:PORT), where kubelet's probes reach the agent (got %q)" .Values.config.metrics.listen) -}}
{{- end -}}
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
{{- $access := include "gpushare.metricsAccess" . -}}
{{- if not (has $access (list "rbac" "open")) -}}
{{- fail (printf "config.metrics.access must be rbac (clients off the node show a bearer token allowed to get /metrics) or open (anyone who reaches the port) (got %q)" $access) -}}
{{- end -}}
{{- $source := .Values.config.metrics.source | toString -}}
{{- if and $source (not (hasPrefix "/" $source)) (not (contains "://" $source)) -}}
{{- fail (printf "config.metrics.source must be a URL or an absolute file path on the node (got %q)" $source) -}}
{{- end -}}
{{- end -}}


{{/* The agent's config file; .dra: the DRA node pool's (docs/dra.md). */}}
{{- define "gpushare.configFile" }}
{{- $r := .root }}
{{- $c := $r.Values.config }}
{{- /* config.extra is written after the keys below: the same key twice would be refused by the
agent at start (docs/config.md), so it is refused here, naming the value that sets it. */}}
{{- $written := list "version" "shareSpecs" "devShareSpecs" "realResources" "shadowImage" "shadowPriorityClass" "shadowPreemption" "warmShadows" "shadowIdleTimeout" "idleWindow" "maxBlockMs" "stateDir" "nri" "kubelet" "metrics" "dra" }}
{{- range $k, $_ := ($c.extra | default dict) }}
{{- if has $k $written }}
{{- fail (printf "config.extra.%s: the chart writes %s itself (from config.%s, kubelet.rootDir, priorityClasses or dra); set it there, not in config.extra" $k $k $k) }}
{{- end }}
{{- end }}
{{- $kubelet := include "gpushare.kubeletRoot" $r }}
    version: v1
    shareSpecs: [{{ join ", " $c.shareSpecs }}]
    devShareSpecs: [{{ join ", " $c.devShareSpecs }}]
    realResources: {{ $c.realResources | toJson }}
    shadowImage: {{ $c.shadowImage | toJson }}
    shadowPriorityClass: {{ $r.Values.priorityClasses.shadow.name | toJson }}
    shadowPreemption: {{ $r.Values.priorityClasses.shadow.preemption | toJson }}
    warmShadows: {{ $c.warmShadows }}
    shadowIdleTimeout: {{ $c.shadowIdleTimeout | toJson }}
    idleWindow: {{ $c.idleWindow | toJson }}
    maxBlockMs: {{ $c.maxBlockMs }}
    stateDir: {{ $c.stateDir | toJson }}
    nri:
      socket: {{ $c.nri.socket | toJson }}
    kubelet:
      devicePluginDir: {{ printf "%s/device-plugins/" $kubelet | toJson }}
      podResourcesSocket: {{ printf "%s/pod-resources/kubelet.sock" $kubelet | toJson }}
      rootDir: {{ $kubelet | toJson }}
    metrics:
      # dcgm-exporter on the node; spot lending stays off (spot-gpu Unhealthy) while it is unreachable.
      source: {{ $c.metrics.source | toJson }}
      vendor: {{ $c.metrics.vendor | toJson }}
      listen: {{ $c.metrics.listen | toJson }}
      {{- with omit $c.metrics "source" "vendor" "listen" }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- if .dra }}
    dra:
      enabled: true
      vendorKind: {{ $r.Values.dra.vendorKind | toJson }}
      cdiRoot: {{ $r.Values.dra.cdiRoot | toJson }}
    {{- end }}
    {{- with $c.extra }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
