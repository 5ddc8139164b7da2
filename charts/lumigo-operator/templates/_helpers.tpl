{{/* Chart name. */}}
{{- define "lumigo-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, e.g. lumigo-lumigo-operator (object names derive from it). At most
26 characters, so that <fullname>-controller-manager-metrics-service is a valid Service name (63).
*/}}
{{- define "lumigo-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 26 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 26 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 26 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "lumigo-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "lumigo-operator.labels" -}}
helm.sh/chart: {{ include "lumigo-operator.chart" . }}
app.kubernetes.io/name: {{ include "lumigo-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: lumigo-operator
{{- end }}

{{/* Selector of the manager pods (never changes across upgrades). */}}
{{- define "lumigo-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lumigo-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
control-plane: controller-manager
{{- end }}

{{- define "lumigo-operator.serviceAccountName" -}}
lumigo-kubernetes-operator
{{- end }}

{{/* The webhook Deployment's pods (disjoint from the manager's selector). */}}
{{- define "lumigo-operator.webhookSelectorLabels" -}}
app.kubernetes.io/name: {{ include "lumigo-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
control-plane: webhook
{{- end }}

{{- define "lumigo-operator.webhookServiceAccountName" -}}
{{ include "lumigo-operator.fullname" . }}-webhook
{{- end }}

{{/* What the webhook serves: the serving pair and the CA certificates, no CA key. */}}
{{- define "lumigo-operator.servingCertSecret" -}}
{{ include "lumigo-operator.certSecret" . }}-serving
{{- end }}

{{/* Where the manager publishes the injection mode it decides (`auto`) for the webhook. */}}
{{- define "lumigo-operator.injectionModeConfigMap" -}}
{{ include "lumigo-operator.fullname" . }}-injection-mode
{{- end }}

{{- define "lumigo-operator.webhookService" -}}
{{ include "lumigo-operator.fullname" . }}-webhooks-service
{{- end }}

{{- define "lumigo-operator.certSecret" -}}
{{ include "lumigo-operator.fullname" . }}-lumigo-injector-webhook-certs
{{- end }}

{{- define "lumigo-operator.injectorWebhookConfiguration" -}}
{{ include "lumigo-operator.fullname" . }}-injector-webhook-configuration
{{- end }}

{{- define "lumigo-operator.defaulterWebhookConfiguration" -}}
{{ include "lumigo-operator.fullname" . }}-defaulter-webhook-configuration
{{- end }}

{{- define "lumigo-operator.telemetryProxyEndpoint" -}}
http://{{ include "lumigo-operator.fullname" . }}-telemetry-proxy-service.$(POD_NAMESPACE).svc.cluster.local
{{- end }}

{{/* <repository>:<tag> of one of this chart's own images; an empty tag is v<appVersion>. */}}
{{- define "lumigo-operator.image" -}}
{{- printf "%s:%s" .image.repository (default (printf "v%s" .root.Chart.AppVersion) .image.tag) }}
{{- end }}

{{- define "lumigo-operator.managerImage" -}}
{{- include "lumigo-operator.image" (dict "image" .Values.controllerManager.manager.image "root" .) }}
{{- end }}

{{- define "lumigo-operator.injectorImage" -}}
{{- include "lumigo-operator.image" (dict "image" .Values.injectorWebhook.lumigoInjector.image "root" .) }}
{{- end }}

{{- /*
The telemetry proxy's image: by default this operator's collector build (hack/tools/otelcol), which
has the lumigo_k8s_enricher processor. An upstream OpenTelemetry Collector distribution
(otel/opentelemetry-collector-contrib, -k8s, …) has not: it refuses the configuration the operator
renders with `telemetryProxy.enricher: true` and would forward no tenant's telemetry, so that
combination is refused here.
*/ -}}
{{- define "lumigo-operator.telemetryProxyImage" -}}
{{- $proxy := .Values.telemetryProxy }}
{{- if and $proxy.enricher (regexMatch "(^|/)opentelemetry-collector[^/]*$" $proxy.image.repository) }}
{{- fail (printf "telemetryProxy.image.repository %s is an upstream OpenTelemetry Collector without this operator's lumigo_k8s_enricher processor: set telemetryProxy.enricher=false with it, or keep the default image" $proxy.image.repository) }}
{{- end }}
{{- include "lumigo-operator.image" (dict "image" $proxy.image "root" .) }}
{{- end }}

{{/* The restricted Pod Security Standard, for every pod of the chart. */}}
{{- define "lumigo-operator.podSecurityContext" -}}
runAsNonRoot: true
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "lumigo-operator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop:
  - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Linux nodes of the architectures the images are built for. */}}
{{- define "lumigo-operator.nodeAffinity" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
    - matchExpressions:
      - key: kubernetes.io/os
        operator: In
        values:
        - linux
      - key: kubernetes.io/arch
        operator: In
        values:
        - amd64
        - arm64
{{- end }}

{{/* Tolerations / nodeSelector of the webhook, falling back to the manager's, then global. */}}
{{- define "lumigo-operator.webhookScheduling" -}}
{{- $tolerations := .Values.injectorWebhook.tolerations | default .Values.controllerManager.tolerations | default .Values.global.tolerations }}
{{- $nodeSelector := .Values.injectorWebhook.nodeSelector | default .Values.controllerManager.nodeSelector | default .Values.global.nodeSelector }}
{{- with $tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with $nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Tolerations / nodeSelector of the manager, falling back to global. */}}
{{- define "lumigo-operator.scheduling" -}}
{{- $tolerations := .Values.controllerManager.tolerations | default .Values.global.tolerations }}
{{- $nodeSelector := .Values.controllerManager.nodeSelector | default .Values.global.nodeSelector }}
{{- with $tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with $nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- /*
The injector's matchConditions (the same in config/webhook/manifests.yaml): the API server does
not call it for what it would leave unchanged anyway, namely the operator's own writes (they
already carry the instrumentation or its removal) and ReplicaSets a Deployment owns (their
Deployment is instrumented instead). On a cluster that scales a lot, or while the operator
instruments many workloads, that removes most of its calls.
*/ -}}
{{- define "lumigo-operator.injectorMatchConditions" -}}
matchConditions:
- name: not-the-operators-own-write
  expression: "request.userInfo.username != 'system:serviceaccount:{{ .Release.Namespace }}:{{ include "lumigo-operator.serviceAccountName" . }}'"
- name: not-a-deployments-replicaset
  expression: "!(request.kind.kind == 'ReplicaSet' && has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, r.kind == 'Deployment' && r.apiVersion == 'apps/v1'))"
{{- end }}
