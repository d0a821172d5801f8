{{/* Names */}}
{{- define "gpuq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuq.fullname" -}}
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

{{- define "gpuq.scaled" -}}{{- if eq .Values.shape "scaled" -}}true{{- end -}}{{- end -}}

{{/* Labels; call with (dict "root" $ "component" "serve") */}}
{{- define "gpuq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuq.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuq.labels" -}}
{{ include "gpuq.selectorLabels" . }}
app.kubernetes.io/part-of: gpuq
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpuq.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "gpuq.storeSecretName" -}}
{{- default (printf "%s-store" (include "gpuq.fullname" .)) .Values.store.existingSecret -}}
{{- end -}}
{{- define "gpuq.authSecretName" -}}
{{- default (printf "%s-auth" (include "gpuq.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}
{{- define "gpuq.queuesConfigMapName" -}}
{{- default (printf "%s-queues" (include "gpuq.fullname" .)) .Values.queues.existingConfigMap -}}
{{- end -}}
{{- define "gpuq.hasDsn" -}}{{- if or .Values.store.dsn .Values.store.existingSecret -}}true{{- end -}}{{- end -}}

{{/* Refuse values the chart cannot turn into a working install, naming the value. */}}
{{- define "gpuq.validate" -}}
{{- if not (has .Values.shape (list "single" "scaled")) -}}
{{- fail (printf "values: shape must be single or scaled (got %q)" (toString .Values.shape)) -}}
{{- end -}}
{{- if and (include "gpuq.scaled" .) (not (include "gpuq.hasDsn" .)) -}}
{{- fail "values: shape scaled needs a ClickHouse server: set store.dsn (http(s)://user:password@host:8123/database) or store.existingSecret (a Secret with the DSN under store.existingSecretKey). chDB, the embedded store, allows one process per path, so it cannot back two gpuq serve replicas and a collector" -}}
{{- end -}}
{{- if and .Values.nvml.enabled (not (include "gpuq.scaled" .)) -}}
{{- fail "values: nvml.enabled runs a collector on every GPU node, which needs shape scaled and a ClickHouse server (chDB allows one process per path)" -}}
{{- end -}}
{{- if not (has .Values.scheduler.actuator (list "dry-run" "kubernetes" "ray")) -}}
{{- fail (printf "values: scheduler.actuator must be dry-run, kubernetes or ray (got %q)" (toString .Values.scheduler.actuator)) -}}
{{- end -}}
{{- if and (eq .Values.scheduler.actuator "kubernetes") (not .Values.scheduler.namespaces) -}}
{{- fail "values: scheduler.actuator kubernetes needs scheduler.namespaces: the namespaces it may act in (one Role each; it gets no cluster-wide write)" -}}
{{- end -}}
{{- if and (eq .Values.scheduler.actuator "kubernetes") (not .Values.kubernetes.enabled) -}}
{{- fail "values: scheduler.actuator kubernetes needs kubernetes.enabled (the actuator acts on what the Kubernetes target lists)" -}}
{{- end -}}
{{- if and (eq .Values.scheduler.actuator "kubernetes") .Values.kubernetes.namespaces (ne (toJson (sortAlpha .Values.kubernetes.namespaces)) (toJson (sortAlpha .Values.scheduler.namespaces))) -}}
{{- fail "values: with scheduler.actuator kubernetes the Kubernetes target watches scheduler.namespaces; leave kubernetes.namespaces empty or equal to it" -}}
{{- end -}}
{{- $c := .Values.config | default dict -}}
{{- if and (hasKey $c "api") (hasKey (index $c "api" | default dict) "tokens") -}}
{{- fail "values: config.api.tokens would land in a ConfigMap: put the tokens in auth.tokens or auth.existingSecret (a Secret)" -}}
{{- end -}}
{{- if and (hasKey $c "dashboard") (hasKey (index $c "dashboard" | default dict) "token") -}}
{{- fail "values: config.dashboard.token would land in a ConfigMap: use auth.dashboardToken or auth.existingSecret" -}}
{{- end -}}
{{- if and (hasKey $c "store") (hasKey (index $c "store" | default dict) "dsn") -}}
{{- fail "values: config.store.dsn would land in a ConfigMap: use store.dsn or store.existingSecret (a Secret)" -}}
{{- end -}}
{{- if and .Values.otel.enabled (not .Values.otel.endpoint) -}}
{{- fail "values: otel.enabled needs otel.endpoint (the OTLP/HTTP receiver, e.g. http://otel-collector:4318)" -}}
{{- end -}}
{{- end -}}

{{/* gpuq.yaml: the chart's settings with .Values.config merged over them (a dict as YAML). */}}
{{- define "gpuq.config" -}}
{{- $scaled := include "gpuq.scaled" . -}}
{{- $store := dict "spill_dir" "/var/lib/gpuq/spill" -}}
{{- if not $scaled }}{{ $_ := set $store "dsn" "chdb:///var/lib/gpuq/store" }}{{ end -}}
{{- $collector := dict "metrics_host" "0.0.0.0" "metrics_port" 9464 -}}
{{- if .Values.kubernetes.enabled -}}
{{- $ns := .Values.kubernetes.namespaces -}}
{{- if eq .Values.scheduler.actuator "kubernetes" }}{{ $ns = .Values.scheduler.namespaces }}{{ end -}}
{{- $_ := set $collector "kubernetes" (list (dict "cluster" .Values.kubernetes.cluster "in_cluster" true "namespaces" $ns)) -}}
{{- end -}}
{{- if .Values.otel.enabled }}{{ $_ := set $collector "otel_exporter" "otlp" }}{{ end -}}
{{- $sched := dict "actuator" .Values.scheduler.actuator "cluster" .Values.scheduler.cluster -}}
{{- if and (eq .Values.scheduler.actuator "kubernetes") .Values.kubernetes.enabled -}}
{{- $_ := set $sched "kubernetes" (dict "cluster" .Values.kubernetes.cluster) -}}
{{- end -}}
{{- $api := dict "host" "0.0.0.0" "port" (int .Values.service.port) -}}
{{- $dash := dict "api_url" (printf "http://%s.%s.svc:%d" (include "gpuq.fullname" .) .Release.Namespace (int .Values.service.port)) "host" "0.0.0.0" "port" (int .Values.dashboard.port) -}}
{{- $cfg := dict "store" $store "collector" $collector "scheduler" $sched "api" $api "dashboard" $dash "queues_file" "/etc/gpuq/queues/queues.yaml" -}}
{{- if ne (.Values.queues.from | default "file") "file" -}}
{{- $cfg = dict "store" $store "collector" $collector "scheduler" $sched "api" $api "dashboard" $dash "queues_from" .Values.queues.from -}}
{{- if eq .Values.queues.from "yunikorn" -}}
{{- $yk := .Values.queues.yunikorn | default dict -}}
{{- $_ := set $cfg "yunikorn" (dict "namespace" ($yk.namespace | default "yunikorn") "partition" ($yk.partition | default "default")) -}}
{{- end -}}
{{- end -}}
{{- if $scaled -}}
{{- $_ := set $cfg "leader" (dict "enabled" true "lease_name" (include "gpuq.fullname" .) "namespace" .Release.Namespace "in_cluster" true "lease_duration_s" .Values.leader.leaseDurationS "renew_deadline_s" .Values.leader.renewDeadlineS "retry_period_s" .Values.leader.retryPeriodS) -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $cfg (deepCopy (.Values.config | default dict))) -}}
{{- end -}}

{{/* gpuq-nvml.yaml: the same store and collector timing, NVML as the only source. */}}
{{- define "gpuq.nvmlConfig" -}}
{{- $full := include "gpuq.config" . | fromYaml -}}
{{- $collector := deepCopy (get $full "collector") -}}
{{- $_ := set $collector "ray" list -}}
{{- $_ := set $collector "dcgm" list -}}
{{- $_ := set $collector "kubernetes" list -}}
{{- $_ := set $collector "nvml" (dict "enabled" true "cluster" .Values.kubernetes.cluster) -}}
{{- toYaml (dict "store" (get $full "store") "collector" $collector) -}}
{{- end -}}

{{/* Pod and container security */}}
{{- define "gpuq.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* env of every gpuq container: the pod's name and namespace, the DSN, the OTLP exporter */}}
{{- define "gpuq.env" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
{{- if include "gpuq.hasDsn" . }}
- name: GPUQ_STORE__DSN
  valueFrom:
    secretKeyRef: {name: {{ include "gpuq.storeSecretName" . }}, key: {{ ternary (.Values.store.existingSecretKey | default "dsn") "dsn" (not (empty .Values.store.existingSecret)) }}}
{{- end }}
{{- if .Values.otel.enabled }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .Values.otel.protocol | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .Values.otel.serviceName | quote }}
{{- with .Values.otel.resourceAttributes }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ . | quote }}
{{- end }}
{{- with .Values.otel.headersSecret }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: headers}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpuq.checksums" -}}
checksum/config: {{ include "gpuq.config" . | sha256sum }}
checksum/secrets: {{ toJson (list .Values.store .Values.auth) | sha256sum }}
{{- end -}}

{{/* NetworkPolicy egress rules */}}
{{- define "gpuq.egressTo" -}}
{{- /* (dict "cidrs" [...] "namespaceSelector" {} "podSelector" {} "ports" [...]) */ -}}
- ports:
  {{- range .ports }}
    - {port: {{ . }}, protocol: TCP}
  {{- end }}
  {{- if or .cidrs .namespaceSelector .podSelector }}
  to:
    {{- range .cidrs }}
    - ipBlock: {cidr: {{ . }}}
    {{- end }}
    {{- if or .namespaceSelector .podSelector }}
    {{- $peer := dict }}
    {{- with .namespaceSelector }}{{ $_ := set $peer "namespaceSelector" . }}{{ end }}
    {{- with .podSelector }}{{ $_ := set $peer "podSelector" . }}{{ end }}
    {{- toYaml (list $peer) | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end -}}
{{- define "gpuq.egressDns" -}}
- ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
  to:
    - namespaceSelector:
        {{- toYaml .dns.namespaceSelector | nindent 8 }}
      podSelector:
        {{- toYaml .dns.podSelector | nindent 8 }}
{{- end -}}
