{{/* Names: <release>-<chart> unless overridden, cut to 63 characters (DNS label). */}}
{{- define "gpuslice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuslice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object's metadata. Pod templates get "gpuslice.podLabels" instead: no chart
version there, so a chart upgrade that changes nothing in a pod does not restart it. */}}
{{- define "gpuslice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuslice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* "gpuslice.labels" plus a component and extra labels, as one mapping (each key once; the chart's
own keys win): include "gpuslice.componentLabels" (list . "scheduler" .Values.some.labels) */}}
{{- define "gpuslice.componentLabels" -}}
{{- $root := index . 0 -}}
{{- $labels := include "gpuslice.labels" $root | fromYaml -}}
{{- $_ := set $labels "app.kubernetes.io/component" (index . 1) -}}
{{- if gt (len .) 2 -}}{{- $labels = merge $labels (deepCopy (default (dict) (index . 2))) -}}{{- end -}}
{{- toYaml $labels -}}
{{- end -}}

{{/* Selector labels of one component: include "gpuslice.selector" (list . "scheduler") */}}
{{- define "gpuslice.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "gpuslice.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Labels of one component's pod template: its selector labels and `podLabels` (which never
replace a selector label), each key once. */}}
{{- define "gpuslice.podLabels" -}}
{{- $root := index . 0 -}}
{{- $labels := include "gpuslice.selector" . | fromYaml -}}
{{- toYaml (merge $labels (deepCopy $root.Values.podLabels)) -}}
{{- end -}}

{{/* Annotations of a pod template: `podAnnotations` and the chart's own (given as a dict; they win).
include "gpuslice.podAnnotations" (list . (dict "checksum/x" "...")) */}}
{{- define "gpuslice.podAnnotations" -}}
{{- $root := index . 0 -}}
{{- $annotations := merge (deepCopy (index . 1)) (deepCopy $root.Values.podAnnotations) -}}
{{- with $annotations -}}{{- toYaml . -}}{{- end -}}
{{- end -}}

{{/* An image reference: include "gpuslice.imageRef" (list . repository tag). `global.imageRegistry`
replaces the repository's registry host (its first path element when that names a host: it has a
dot or a port, or is localhost), or prefixes a repository without one. */}}
{{- define "gpuslice.imageRef" -}}
{{- $root := index . 0 -}}
{{- $repository := index . 1 -}}
{{- $tag := index . 2 -}}
{{- $registry := trimSuffix "/" (toString $root.Values.global.imageRegistry) -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- $repository = printf "%s/%s" $registry $repository -}}
{{- end -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{- define "gpuslice.image" -}}
{{- include "gpuslice.imageRef" (list . .Values.image.repository (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}

{{/* The cluster's Kubernetes version as a kube-scheduler tag: vX.Y.Z with any vendor suffix dropped
(v1.31.4+k3s1 and v1.30.8-eks-2d5f260 give v1.31.4 and v1.30.8), as HAMi's chart does
(charts/hami/templates/_helpers.tpl, strippedKubeVersion). */}}
{{- define "gpuslice.clusterVersion" -}}
{{- $version := toString .Capabilities.KubeVersion.Version -}}
{{- if not (regexMatch "^v?[0-9]+\\.[0-9]+\\.[0-9]+" $version) -}}
{{- fail (printf "cannot read a Kubernetes version vX.Y.Z from the cluster's %q; set scheduler.image.tag" $version) -}}
{{- end -}}
{{- regexReplaceAll "^v?([0-9]+)\\.([0-9]+)\\.([0-9]+).*$" $version "v${1}.${2}.${3}" -}}
{{- end -}}

{{/* The kube-scheduler image tag: scheduler.image.tag, or the cluster's version when it is empty. A
tag set by hand must name a release within the version-skew policy
(https://kubernetes.io/releases/version-skew-policy/): kube-scheduler may be one minor older than
the kube-apiserver, never newer. */}}
{{- define "gpuslice.schedulerTag" -}}
{{- $cluster := include "gpuslice.clusterVersion" . -}}
{{- $tag := trim (toString .Values.scheduler.image.tag) -}}
{{- if not $tag -}}
{{- $cluster -}}
{{- else -}}
{{- if not (regexMatch "^v[0-9]+\\.[0-9]+\\.[0-9]+[A-Za-z0-9_.-]{0,100}$" $tag) -}}
{{- fail (printf "scheduler.image.tag %q is not a kube-scheduler release tag such as %s; leave scheduler.image.tag empty to follow the cluster (%s)" $tag $cluster $cluster) -}}
{{- end -}}
{{- $t := regexReplaceAll "^v([0-9]+)\\.([0-9]+)\\..*$" $tag "${1} ${2}" | splitList " " -}}
{{- $c := regexReplaceAll "^v([0-9]+)\\.([0-9]+)\\..*$" $cluster "${1} ${2}" | splitList " " -}}
{{- $tMinor := index $t 1 | int -}}
{{- $cMinor := index $c 1 | int -}}
{{- if or (ne (index $t 0) (index $c 0)) (gt $tMinor $cMinor) (lt $tMinor (sub $cMinor 1)) -}}
{{- fail (printf "scheduler.image.tag %s is kube-scheduler %s.%d, outside the version-skew policy for a Kubernetes %s.%d cluster: kube-scheduler must be the kube-apiserver's minor version or one older, never newer (https://kubernetes.io/releases/version-skew-policy/); leave scheduler.image.tag empty to follow the cluster (%s)" $tag (index $t 0) $tMinor (index $c 0) $cMinor $cluster) -}}
{{- end -}}
{{- $tag -}}
{{- end -}}
{{- end -}}

{{- define "gpuslice.schedulerImage" -}}
{{- include "gpuslice.imageRef" (list . .Values.scheduler.image.repository (include "gpuslice.schedulerTag" .)) -}}
{{- end -}}

{{/* `imagePullSecrets` as a pod wants them, as a YAML list ('' when none): `{name: ...}` objects
(plain names, HAMi's form, are turned into those). */}}
{{- define "gpuslice.imagePullSecrets" -}}
{{- $secrets := list -}}
{{- range .Values.imagePullSecrets -}}
{{- if kindIs "string" . -}}{{- $secrets = append $secrets (dict "name" .) -}}{{- else -}}{{- $secrets = append $secrets . -}}{{- end -}}
{{- end -}}
{{- with $secrets -}}{{- toYaml . -}}{{- end -}}
{{- end -}}

{{/* The extender's URL as its caller sees it. */}}
{{- define "gpuslice.extenderURL" -}}
{{- $scheme := ternary "https" "http" .Values.tls.enabled -}}
{{- if .Values.scheduler.enabled -}}
{{- printf "%s://127.0.0.1:%d" $scheme (int .Values.extender.port) -}}
{{- else -}}
{{- printf "%s://%s.%s.svc:%d" $scheme (include "gpuslice.fullname" .) .Release.Namespace (int .Values.extender.port) -}}
{{- end -}}
{{- end -}}

{{/* Secret names of the serving and client certificates. */}}
{{- define "gpuslice.tlsSecret" -}}
{{- if eq .Values.tls.mode "secret" -}}{{ required "tls.existingSecret is required with tls.mode=secret" .Values.tls.existingSecret }}{{- else -}}{{ include "gpuslice.fullname" . }}-tls{{- end -}}
{{- end -}}
{{- define "gpuslice.clientTlsSecret" -}}
{{- if eq .Values.tls.mode "secret" -}}{{ required "tls.existingClientSecret is required with tls.mode=secret and tls.clientCA" .Values.tls.existingClientSecret }}{{- else -}}{{ include "gpuslice.fullname" . }}-client-tls{{- end -}}
{{- end -}}

{{/* Names in the serving certificate: both Services (extender and webhook) under every DNS form,
and localhost for the sidecar. */}}
{{- define "gpuslice.tlsDNSNames" -}}
{{- $fullname := include "gpuslice.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list -}}
{{- range $service := list $fullname (printf "%s-webhook" $fullname) -}}
{{- $names = concat $names (list $service (printf "%s.%s" $service $ns) (printf "%s.%s.svc" $service $ns) (printf "%s.%s.svc.cluster.local" $service $ns)) -}}
{{- end -}}
{{- append $names "localhost" | toJson -}}
{{- end -}}

{{/*
tls.mode=generate: the certificates as a JSON object with the keys of the secrets (ca.crt, ca.key,
tls.crt, tls.key, client.crt, client.key; PEM). Worked out once per render and kept in .Values, so
every template (the secrets, the webhook configurations' caBundle, the pods' checksum) sees the
same certificates.

The secret <fullname>-tls of an earlier install or upgrade is read back with lookup and kept, CA
key included. A client certificate (tls.clientCA) missing from <fullname>-client-tls is issued by
that CA; a release whose secret has no CA key (made by a chart that did not store it) gets a new
CA and certificates instead, and the pods roll with their checksum. lookup finds nothing under
`helm template` and GitOps renderers, so there every render makes new certificates.
*/}}
{{- define "gpuslice.tlsGenerated" -}}
{{- if not (hasKey .Values "_gpusliceTLS") -}}
{{- $fullname := include "gpuslice.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $days := int .Values.tls.validityDays -}}
{{- $m := dict -}}
{{- $old := lookup "v1" "Secret" $ns (printf "%s-tls" $fullname) -}}
{{- $data := dict -}}
{{- if and $old (index $old "data") -}}{{- $data = index $old "data" -}}{{- end -}}
{{- if and (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") -}}
{{- range $key := list "ca.crt" "ca.key" "tls.crt" "tls.key" -}}
{{- if index $data $key -}}{{- $_ := set $m $key (index $data $key | b64dec) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $m .Values.tls.clientCA -}}
{{- $oldClient := lookup "v1" "Secret" $ns (printf "%s-client-tls" $fullname) -}}
{{- $clientData := dict -}}
{{- if and $oldClient (index $oldClient "data") -}}{{- $clientData = index $oldClient "data" -}}{{- end -}}
{{- if and (index $clientData "tls.crt") (index $clientData "tls.key") (eq (index $clientData "ca.crt" | default "" | b64dec) (index $m "ca.crt")) -}}
{{- $_ := set $m "client.crt" (index $clientData "tls.crt" | b64dec) -}}
{{- $_ := set $m "client.key" (index $clientData "tls.key" | b64dec) -}}
{{- else if index $m "ca.key" -}}
{{- $ca := buildCustomCert (index $m "ca.crt" | b64enc) (index $m "ca.key" | b64enc) -}}
{{- $client := genSignedCert (printf "%s-kube-scheduler" $fullname) nil nil $days $ca -}}
{{- $_ := set $m "client.crt" $client.Cert -}}
{{- $_ := set $m "client.key" $client.Key -}}
{{- else -}}
{{- $m = dict -}}
{{- end -}}
{{- end -}}
{{- if not $m -}}
{{- $ca := genCA (printf "%s-ca" $fullname) $days -}}
{{- $cert := genSignedCert $fullname (list "127.0.0.1") (include "gpuslice.tlsDNSNames" . | fromJsonArray) $days $ca -}}
{{- $client := genSignedCert (printf "%s-kube-scheduler" $fullname) nil nil $days $ca -}}
{{- $m = dict "ca.crt" $ca.Cert "ca.key" $ca.Key "tls.crt" $cert.Cert "tls.key" $cert.Key "client.crt" $client.Cert "client.key" $client.Key -}}
{{- end -}}
{{- $_ := set .Values "_gpusliceTLS" $m -}}
{{- end -}}
{{- index .Values "_gpusliceTLS" | toJson -}}
{{- end -}}

{{/* The pod annotation that rolls a pod when its certificates change: the SHA-256 of the certificates
it mounts, with tls.mode=generate (the chart then knows them; cert-manager and existing secrets are
reloaded from disk by the servers). A dict for "gpuslice.podAnnotations":
include "gpuslice.tlsChecksum" (list . true) | fromYaml, true when the pod mounts the client certificate. */}}
{{- define "gpuslice.tlsChecksum" -}}
{{- $root := index . 0 -}}
{{- if eq $root.Values.tls.mode "generate" -}}
{{- $m := include "gpuslice.tlsGenerated" $root | fromJson -}}
{{- $text := printf "%s%s" (index $m "ca.crt") (index $m "tls.crt") -}}
{{- if index . 1 -}}{{- $text = printf "%s%s" $text (index $m "client.crt") -}}{{- end -}}
checksum/tls: {{ $text | sha256sum }}
{{- end -}}
{{- end -}}

{{/* The serving certificate's secret as a pod volume named tls. With tls.mode=generate only the
certificates and the server key are projected: the CA key stays in the secret. */}}
{{- define "gpuslice.tlsVolume" -}}
- name: tls
  secret:
    secretName: {{ include "gpuslice.tlsSecret" . }}
    {{- if eq .Values.tls.mode "generate" }}
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
      - {key: ca.crt, path: ca.crt}
    {{- end }}
{{- end -}}

{{/* Restricted pod security for every gpuslice container (read-only root, no privileges). */}}
{{- define "gpuslice.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The GPU resource names in the order count, memory, percentage, cores, priority. */}}
{{- define "gpuslice.resourceNames" -}}
{{- $n := .Values.resourceNames -}}
{{- list $n.count $n.memory $n.memoryPercentage $n.cores $n.priority | toJson -}}
{{- end -}}

{{/* `gpuslice serve` / `gpuslice webhook` flags naming the GPU resources (one per line). */}}
{{- define "gpuslice.resourceNameArgs" -}}
{{- $n := .Values.resourceNames -}}
- --resource-count-name={{ $n.count }}
- --resource-memory-name={{ $n.memory }}
- --resource-memory-percentage-name={{ $n.memoryPercentage }}
- --resource-core-name={{ $n.cores }}
- --resource-priority-name={{ $n.priority }}
{{- end -}}

{{/*
Keys of HAMi's chart (Project-HAMi/HAMi charts/hami/values.yaml) and what gpuslice calls them.
One line each: `<HAMi key> => <what gpuslice calls it>`. values.schema.json admits these keys (any
value) only so that this check can name the gpuslice key: JSON Schema's error for an unknown key
cannot. docs/install.md has the same table.
*/}}
{{- define "gpuslice.hamiKeys" -}}
schedulerName => is `scheduler.name` in gpuslice (default gpuslice-scheduler; set it to hami-scheduler to keep manifests that name HAMi's scheduler working)
namespaceOverride => has no gpuslice counterpart; install into the namespace you want (`helm install -n`)
resourceName => is `resourceNames.count` in gpuslice
resourceMem => is `resourceNames.memory` in gpuslice
resourceMemPercentage => is `resourceNames.memoryPercentage` in gpuslice
resourceCores => is `resourceNames.cores` in gpuslice
resourcePriority => is `resourceNames.priority` in gpuslice
podSecurityPolicy => has no gpuslice counterpart (PodSecurityPolicy is gone since Kubernetes 1.25; every gpuslice container runs restricted)
global.imagePullSecrets => is `imagePullSecrets` in gpuslice
global.imageTag => is `image.tag` in gpuslice (the kube-scheduler tag is `scheduler.image.tag`)
global.gpuHookPath => belongs to HAMi's device plugin, which stays on HAMi's chart
global.labels => has no gpuslice counterpart; `podLabels` labels the gpuslice pods
global.annotations => has no gpuslice counterpart; `podAnnotations` annotates the gpuslice pods
global.managedNodeSelectorEnable => has no gpuslice counterpart; use `nodeSelector` and `agent.nodeSelector`
global.managedNodeSelector => has no gpuslice counterpart; use `nodeSelector` and `agent.nodeSelector`
scheduler.kubeScheduler => is `scheduler.*` in gpuslice (`scheduler.enabled`, `scheduler.image`, `scheduler.resources`, `scheduler.extraArgs`)
scheduler.kubeScheduler.enabled => is `scheduler.enabled` in gpuslice (false = standalone)
scheduler.kubeScheduler.image => is `scheduler.image` in gpuslice (`repository`, `tag`, `pullPolicy`)
scheduler.kubeScheduler.image.registry => is part of `scheduler.image.repository` in gpuslice (or `global.imageRegistry` for every image)
scheduler.kubeScheduler.image.repository => is `scheduler.image.repository` in gpuslice (registry host included)
scheduler.kubeScheduler.image.tag => is `scheduler.image.tag` in gpuslice ('' = the cluster's version, as in HAMi)
scheduler.kubeScheduler.image.pullPolicy => is `scheduler.image.pullPolicy` in gpuslice
scheduler.kubeScheduler.image.pullSecrets => is `imagePullSecrets` in gpuslice
scheduler.kubeScheduler.imageTag => is `scheduler.image.tag` in gpuslice ('' = the cluster's version)
scheduler.kubeScheduler.resources => is `scheduler.resources` in gpuslice
scheduler.kubeScheduler.extraArgs => is `scheduler.extraArgs` in gpuslice (the chart writes --config and --v itself)
scheduler.kubeScheduler.extraNewArgs => is `scheduler.extraArgs` in gpuslice (the chart writes --config and --v itself)
scheduler.extender => is `image`, `resources` and `extender.extraArgs` in gpuslice
scheduler.extender.image => is `image` in gpuslice (`repository`, `tag`, `pullPolicy`)
scheduler.extender.image.registry => is part of `image.repository` in gpuslice (or `global.imageRegistry` for every image)
scheduler.extender.image.repository => is `image.repository` in gpuslice
scheduler.extender.image.tag => is `image.tag` in gpuslice
scheduler.extender.image.pullPolicy => is `image.pullPolicy` in gpuslice
scheduler.extender.image.pullSecrets => is `imagePullSecrets` in gpuslice
scheduler.extender.resources => is `resources` in gpuslice
scheduler.extender.extraArgs => is `extender.extraArgs` in gpuslice (HAMi's --debug is not a gpuslice flag)
scheduler.defaultSchedulerPolicy => is `policy.nodeSchedulerPolicy` and `policy.gpuSchedulerPolicy` in gpuslice
scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy => is `policy.nodeSchedulerPolicy` in gpuslice
scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy => is `policy.gpuSchedulerPolicy` in gpuslice
scheduler.metricsBindAddress => is `extender.metricsPort` in gpuslice (a port number)
scheduler.leaderElect => is `leaderElect.enabled` in gpuslice
scheduler.replicas => is `replicas` in gpuslice
scheduler.nodeLockExpire => is `nodeLock.expiry` in gpuslice
scheduler.nodeName => has no gpuslice counterpart; use `nodeSelector`
scheduler.nodeLabelSelector => is `nodeSelector` in gpuslice
scheduler.nodeSelector => is `nodeSelector` in gpuslice
scheduler.tolerations => is `tolerations` in gpuslice
scheduler.podAnnotations => is `podAnnotations` in gpuslice
scheduler.serviceAccountName => has no gpuslice counterpart (the chart makes one ServiceAccount per component)
scheduler.overwriteEnv => has no gpuslice counterpart
scheduler.forceOverwriteDefaultScheduler => has no gpuslice counterpart (the webhook always replaces default-scheduler)
scheduler.livenessProbe => has no gpuslice counterpart (the probes are always on)
scheduler.admissionWebhook => is `webhook.*` in gpuslice
scheduler.admissionWebhook.enabled => is `webhook.enabled` in gpuslice
scheduler.admissionWebhook.failurePolicy => is `webhook.failurePolicy` in gpuslice
scheduler.admissionWebhook.reinvocationPolicy => is `webhook.reinvocationPolicy` in gpuslice
scheduler.admissionWebhook.whitelistNamespaces => is `webhook.namespaceSelector` in gpuslice (an expression `{key: kubernetes.io/metadata.name, operator: NotIn, values: [...]}` under matchExpressions)
scheduler.admissionWebhook.namespaceSelector => is `webhook.namespaceSelector` in gpuslice
scheduler.admissionWebhook.objectSelector => is `webhook.objectSelector` in gpuslice
scheduler.admissionWebhook.customURL => is `webhook.url` in gpuslice
scheduler.admissionWebhook.manageNamespaceSelector => has no gpuslice counterpart (the chart always renders the namespaceSelector)
scheduler.certManager => is `tls.mode` in gpuslice (`certManager`)
scheduler.patch => is `tls.mode` in gpuslice (`generate`: the chart makes the certificates itself, no Jobs)
scheduler.service => has no gpuslice counterpart (ClusterIP Services; ports `extender.port`, `extender.metricsPort`)
devicePlugin => belongs to HAMi's device plugin, which stays on HAMi's chart (gpuslice needs it running and bundles none)
devicePlugin.deviceSplitCount => is `agent.splitCount` in gpuslice (with `agent.register` only; else keep it on HAMi's chart)
devicePlugin.deviceMemoryScaling => is `overcommit.deviceMemoryScaling` in gpuslice (with `agent.register` only; else keep it on HAMi's chart)
devicePlugin.deviceCoreScaling => is `overcommit.deviceCoreScaling` in gpuslice (with `agent.register` only; else keep it on HAMi's chart)
devicePlugin.nvidiaNodeSelector => is `agent.nodeSelector` in gpuslice (for the node agent)
devicePlugin.runtimeClassName => is `agent.runtimeClassName` in gpuslice (for the node agent)
devicePlugin.tolerations => is `agent.tolerations` in gpuslice (for the node agent)
mockDevicePlugin => belongs to HAMi's chart (gpuslice bundles no device plugin)
devices => has no gpuslice counterpart (device settings stay on HAMi's chart; the NVIDIA resource names are `resourceNames.*`)
devices.nvidia.resourceCountName => is `resourceNames.count` in gpuslice
devices.nvidia.resourceMemoryName => is `resourceNames.memory` in gpuslice
devices.nvidia.resourceMemoryPercentageName => is `resourceNames.memoryPercentage` in gpuslice
devices.nvidia.resourceCoreName => is `resourceNames.cores` in gpuslice
devices.nvidia.resourcePriorityName => is `resourceNames.priority` in gpuslice
legacyMetrics => has no gpuslice counterpart
prometheus => is `metrics.serviceMonitor` in gpuslice
device-config => has no gpuslice counterpart as a value; pass `gpuslice serve` flags (--memory-factor, --default-memory, --default-cores) in `extender.extraArgs`
{{- end -}}

{{/* Top-level keys of HAMi's chart for other vendors' devices (mluResourceName, dcuResourceMem, ...). */}}
{{- define "gpuslice.hamiVendorKeys" -}}
^(mlu|dcu|hcu|metax|enflame|kunlun|vastai|biren|iluvatar|mthreads|ascend|awsneuron|amd)[A-Za-z]*$
{{- end -}}

{{/* Fails naming the gpuslice key of every key of HAMi's chart found in the values. */}}
{{- define "gpuslice.validateHAMiKeys" -}}
{{- $map := dict -}}
{{- range $line := include "gpuslice.hamiKeys" . | trim | splitList "\n" -}}
{{- $pair := splitn " => " 2 $line -}}
{{- $_ := set $map $pair._0 $pair._1 -}}
{{- end -}}
{{- $paths := list -}}
{{- $found := list -}}
{{- range $path := keys $map | sortAlpha -}}
{{- $node := $.Values -}}
{{- $present := true -}}
{{- range $part := splitList "." $path -}}
{{- if and $present (kindIs "map" $node) (hasKey $node $part) -}}
{{- $node = index $node $part -}}
{{- else -}}
{{- $present = false -}}
{{- end -}}
{{- end -}}
{{- if $present -}}
{{- $paths = append $paths $path -}}
{{- end -}}
{{- end -}}
{{- /* the most specific key only: scheduler.kubeScheduler.image.tag, not also its parents */ -}}
{{- range $path := $paths -}}
{{- $parent := false -}}
{{- range $other := $paths -}}{{- if hasPrefix (printf "%s." $path) $other -}}{{- $parent = true -}}{{- end -}}{{- end -}}
{{- if not $parent -}}
{{- $found = append $found (printf "HAMi's `%s` %s" $path (index $map $path)) -}}
{{- end -}}
{{- end -}}
{{- range $key := keys .Values | sortAlpha -}}
{{- if regexMatch (include "gpuslice.hamiVendorKeys" $) $key -}}
{{- $found = append $found (printf "HAMi's `%s` has no gpuslice counterpart (gpuslice schedules NVIDIA GPUs only)" $key) -}}
{{- end -}}
{{- end -}}
{{- if $found -}}
{{- fail (printf "values of HAMi's chart, which gpuslice's chart does not read (docs/install.md, \"Values from HAMi's chart\"):\n- %s" (join "\n- " $found)) -}}
{{- end -}}
{{- end -}}

{{/* Checks of value combinations that cannot work. */}}
{{- define "gpuslice.validate" -}}
{{- include "gpuslice.validateHAMiKeys" . -}}
{{- if not (has .Values.tls.mode (list "generate" "certManager" "secret")) -}}
{{- fail (printf "tls.mode must be generate, certManager or secret, got %q" .Values.tls.mode) -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElect.enabled) -}}
{{- fail "replicas > 1 needs leaderElect.enabled (two leaders would both schedule)" -}}
{{- end -}}
{{- if and .Values.tls.clientCA (not .Values.tls.enabled) -}}
{{- fail "tls.clientCA needs tls.enabled" -}}
{{- end -}}
{{- if not (has .Values.podAntiAffinity (list "soft" "hard" "none")) -}}
{{- fail (printf "podAntiAffinity must be soft, hard or none, got %q" .Values.podAntiAffinity) -}}
{{- end -}}
{{- if not (has .Values.policy.nodeChoice (list "extender" "rank" "blend")) -}}
{{- fail (printf "policy.nodeChoice must be extender, rank or blend, got %q" .Values.policy.nodeChoice) -}}
{{- end -}}
{{- if lt (int .Values.scheduler.extenderWeight) 0 -}}
{{- fail "scheduler.extenderWeight must be >= 0 (0: what policy.nodeChoice needs)" -}}
{{- end -}}
{{- if not (has .Values.webhook.failurePolicy (list "Ignore" "Fail")) -}}
{{- fail (printf "webhook.failurePolicy must be Ignore or Fail, got %q" .Values.webhook.failurePolicy) -}}
{{- end -}}
{{- if not (has .Values.webhook.reinvocationPolicy (list "Never" "IfNeeded")) -}}
{{- fail (printf "webhook.reinvocationPolicy must be Never or IfNeeded, got %q" .Values.webhook.reinvocationPolicy) -}}
{{- end -}}
{{- if .Values.scheduler.enabled -}}
{{- $_ := include "gpuslice.schedulerTag" . -}}
{{- end -}}
{{- $names := include "gpuslice.resourceNames" . | fromJsonArray -}}
{{- if ne (len $names) (len (uniq $names)) -}}
{{- fail (printf "resourceNames must be five different names, got %s" (toJson $names)) -}}
{{- end -}}
{{- range $names -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$" (toString .)) -}}
{{- fail (printf "resourceNames: %q is not an extended-resource name such as example.com/vgpu" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
