{{/* The namespace of every namespaced object: the release's (helm install --namespace). The
agent's config names it too: its shadows and Lease live there, and a shadow is trusted only there. */}}
{{- define "gpushare.namespace" -}}
{{- .Release.Namespace -}}
{{- end -}}

{{/* The labels every object carries (Kubernetes' recommended app.kubernetes.io set and Helm's
chart label). .component names the part: agent, agent-dra, admission, monitoring, dra, ...
.name defaults to gpushare, which is also the agent DaemonSet's selector: a pod of anything else
(the hooks') must name itself otherwise, or the DaemonSet controller adopts and deletes it. */}}
{{- define "gpushare.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .name | default "gpushare" }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: gpushare
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* "[registry/]repository:tag" of an image block; an empty tag means the chart's appVersion,
an empty registry global.imageRegistry (a mirror for every image the chart names). */}}
{{- define "gpushare.image" -}}
{{- $registry := .image.registry | default .root.Values.global.imageRegistry | default "" | trimSuffix "/" -}}
{{- $name := printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- if $registry }}{{ printf "%s/%s" $registry $name }}{{ else }}{{ $name }}{{ end -}}
{{- end -}}

{{/* imagePullSecrets of every pod the chart makes: global.imagePullSecrets, then imagePullSecrets;
each a name or {name: ...}. */}}
{{- define "gpushare.imagePullSecrets" -}}
{{- $names := list -}}
{{- range (concat (.Values.global.imagePullSecrets | default list) (.Values.imagePullSecrets | default list)) -}}
{{- $n := . -}}
{{- if kindIs "map" . }}{{ $n = .name }}{{ end -}}
{{- if not (has $n $names) }}{{ $names = append $names $n }}{{ end -}}
{{- end -}}
{{- with $names }}
imagePullSecrets:
{{- range . }}
  - name: {{ . | quote }}
{{- end }}
{{- end -}}
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
{{- /* A release of the chart before 0.2 created and owned gpushare-system. An upgrade to a chart
without that Namespace would have Helm delete it, shadows and all, or move the agents to the
release's namespace: refused, with the way through (CHANGELOG.md, docs/install.md). lookup
answers only against a cluster, never in `helm template`. */}}
{{- if .Release.IsUpgrade }}
{{- $owned := lookup "v1" "Namespace" "" "gpushare-system" }}
{{- if and $owned (eq (dig "metadata" "annotations" "meta.helm.sh/release-name" "" $owned) .Release.Name) }}
{{- fail (printf "release %s was installed by a gpushare chart that created and owned the namespace gpushare-system; upgrading would delete it with every shadow pod. Remove the pods that share GPUs, `helm uninstall %s -n %s`, then `helm install` into a namespace of your own (CHANGELOG.md, 0.2.0)" .Release.Name .Release.Name .Release.Namespace) }}
{{- end }}
{{- end }}
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
{{- $written := list "version" "namespace" "shareSpecs" "devShareSpecs" "realResources" "shadowImage" "shadowPriorityClass" "shadowPreemption" "warmShadows" "shadowIdleTimeout" "idleWindow" "maxBlockMs" "stateDir" "nri" "kubelet" "metrics" "dra" }}
{{- range $k, $_ := ($c.extra | default dict) }}
{{- if has $k $written }}
{{- fail (printf "config.extra.%s: the chart writes %s itself (from config.%s, kubelet.rootDir, priorityClasses or dra); set it there, not in config.extra" $k $k $k) }}
{{- end }}
{{- end }}
{{- $kubelet := include "gpushare.kubeletRoot" $r }}
    version: v1
    # The release's namespace: the agent's shadows and Lease live there.
    namespace: {{ $r.Release.Namespace | toJson }}
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
      {{- with omit $c.metrics "source" "vendor" "listen" "tls" }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- with include "gpushare.metricsTlsConfig" $r }}
      {{- . | nindent 6 }}
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

{{/* The job label of the agents' series (prometheus.jobLabel), which the rules and the dashboard
select. It is written into PromQL strings inside YAML and JSON, so it is kept to characters none of
the three quotes: letters, digits and _ . : / - (a PodMonitor's "<namespace>/<name>" passes). */}}
{{- define "gpushare.jobLabel" -}}
{{- $job := .Values.prometheus.jobLabel | toString -}}
{{- if not (regexMatch "^[A-Za-z0-9_.:/-]+$" $job) -}}
{{- fail (printf "prometheus.jobLabel must be a job name of letters, digits and _ . : / - such as gpushare-agent or gpushare-system/gpushare-agent (got %q)" $job) -}}
{{- end -}}
{{- $job -}}
{{- end -}}

{{/* .text (the shipped rule file, or with .json the dashboard) with its job matcher set to
prometheus.jobLabel. The shipped files are rendered for the default job, gpushare-agent, so that
promtool and a hand-made Prometheus read them as they are: its matcher is the placeholder. */}}
{{- define "gpushare.withJob" -}}
{{- $job := include "gpushare.jobLabel" .root -}}
{{- if .json -}}
{{- .text | replace `job=\"gpushare-agent\"` (printf `job=\"%s\"` $job) -}}
{{- else -}}
{{- .text | replace `job="gpushare-agent"` (printf `job="%s"` $job) -}}
{{- end -}}
{{- end -}}

{{/* Where the DaemonSet mounts config.metrics.tls.secretName. */}}
{{- define "gpushare.metricsTlsDir" -}}
/etc/gpushare-tls
{{- end -}}

{{/* config.metrics.tls.secretName, checked with its sibling values; "" without TLS. */}}
{{- define "gpushare.metricsTlsSecret" -}}
{{- $tls := .Values.config.metrics.tls | default dict -}}
{{- range $k, $_ := $tls -}}
{{- if not (has $k (list "secretName" "requireClientCert")) -}}
{{- fail (printf "config.metrics.tls.%s is not a value: name a Secret with tls.crt, tls.key and ca.crt in config.metrics.tls.secretName, and set requireClientCert for client certificates" $k) -}}
{{- end -}}
{{- end -}}
{{- if and $tls.requireClientCert (not $tls.secretName) -}}
{{- fail "config.metrics.tls.requireClientCert needs config.metrics.tls.secretName: the client CA is that Secret's ca.crt" -}}
{{- end -}}
{{- $tls.secretName | default "" -}}
{{- end -}}

{{/* The agent's metrics.tls keys: the Secret's files where the DaemonSet mounts them. */}}
{{- define "gpushare.metricsTlsConfig" -}}
{{- $dir := include "gpushare.metricsTlsDir" . -}}
{{- if include "gpushare.metricsTlsSecret" . -}}
tls:
  certFile: {{ printf "%s/tls.crt" $dir }}
  keyFile: {{ printf "%s/tls.key" $dir }}
  {{- if .Values.config.metrics.tls.requireClientCert }}
  clientCAFile: {{ printf "%s/ca.crt" $dir }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/* What the ServiceMonitor and the PodMonitor say of their one endpoint besides its port
(templates/65-monitoring.yaml): .monitor (the values), .job, .tlsConfig, .tokenFile, .secretToken,
.tokenSecret, .tokenKey. */}}
{{- define "gpushare.monitorEndpoint" }}
path: /metrics
scheme: {{ ternary "https" "http" (not (empty .tlsConfig)) }}
interval: {{ .monitor.interval | quote }}
scrapeTimeout: {{ .monitor.scrapeTimeout | quote }}
honorLabels: true
{{- if .tokenFile }}
bearerTokenFile: {{ .tokenFile | quote }}
{{- else if .secretToken }}
authorization:
  type: Bearer
  credentials:
    name: {{ .tokenSecret }}
    key: {{ .tokenKey }}
{{- end }}
{{- with .tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  - action: replace
    targetLabel: job
    replacement: {{ .job | quote }}
{{- end }}

{{/* Where a pod's in-cluster client dials the API server: apiServer.host/port when set (values.yaml). */}}
{{- define "gpushare.apiServerEnv" -}}
{{- with .Values.apiServer.host }}
- { name: KUBERNETES_SERVICE_HOST, value: {{ . | toString | quote }} }
- { name: KUBERNETES_SERVICE_PORT, value: {{ $.Values.apiServer.port | toString | quote }} }
{{- end }}
{{- end -}}

{{/* The pod-spec fields every hook pod shares (the uninstall Jobs, helm test's check). */}}
{{- define "gpushare.hookPodSpec" -}}
restartPolicy: Never
{{- with include "gpushare.imagePullSecrets" . | trim }}
{{ . }}
{{- end }}
{{- if .Values.hooks.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .Values.hooks.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.hooks.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A hook's one container: the agent image running `gpushare ARGS...`, read-only and unprivileged. */}}
{{- define "gpushare.hookContainer" -}}
image: {{ include "gpushare.image" (dict "image" .root.Values.image "root" .root) }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
command: {{ .command | toJson }}
env:
  - { name: PYTHONDONTWRITEBYTECODE, value: "1" }
  {{- with include "gpushare.apiServerEnv" .root | trim }}
  {{- . | nindent 2 }}
  {{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65534
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: { drop: [ALL] }
resources:
  requests: { cpu: 10m, memory: 64Mi }
  limits: { memory: 128Mi }
{{- end -}}
