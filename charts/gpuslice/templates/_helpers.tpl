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

{{- define "gpuslice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuslice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include "gpuslice.selector" (list . "scheduler") */}}
{{- define "gpuslice.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "gpuslice.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gpuslice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
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

{{/* Checks of value combinations that cannot work. */}}
{{- define "gpuslice.validate" -}}
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
