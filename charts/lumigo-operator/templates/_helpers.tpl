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
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
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

{{- /*
One image reference, for every image the chart deploys or makes the operator deploy or inject.
`global.imageRegistry` (host[:port][/path]) replaces the registry host of `repository` (its first
component when that has a '.' or ':' or is localhost, as Docker reads references). A `digest`
gives <repository>@<digest>, the tag ignored: tools such as skopeo refuse tag@digest. Anything
that could never be pulled fails the render here, naming the value, instead of an
ImagePullBackOff later (the schema checks the same; this holds with --skip-schema-validation).
Arguments: image (the values' image object), name (its values path, for the messages), root,
defaultTag (the tag when `tag` is empty; "" = a tag or digest is required).
*/ -}}
{{- define "lumigo-operator.imageRef" -}}
{{- $component := `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*` }}
{{- $host := `[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?` }}
{{- $repository := toString (.image.repository | default "") }}
{{- if not (regexMatch (printf "^(?:%s/)?%s(?:/%s)*$" $host $component $component) $repository) }}
{{- fail (printf "%s.repository %q is not an image repository (e.g. quay.io/lumigo/lumigo-operator: lower-case path, optional registry host)" .name $repository) }}
{{- end }}
{{- $registry := toString (((.root.Values.global).imageRegistry) | default "") | trimSuffix "/" }}
{{- if $registry }}
{{- if not (regexMatch (printf "^%s(?:/%s)*$" $host $component) $registry) }}
{{- fail (printf "global.imageRegistry %q is not a registry (host[:port][/path], e.g. registry.example.com:5000/mirror)" $registry) }}
{{- end }}
{{- $parts := splitList "/" $repository }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $repository = join "/" (rest $parts) }}
{{- end }}
{{- $repository = printf "%s/%s" $registry $repository }}
{{- end }}
{{- $digest := toString (.image.digest | default "") }}
{{- $tag := toString (.image.tag | default .defaultTag | default "") }}
{{- if $digest }}
{{- if not (regexMatch "^sha256:[a-f0-9]{64}$" $digest) }}
{{- fail (printf "%s.digest %q is not a digest (sha256: and 64 lower-case hex digits)" .name $digest) }}
{{- end }}
{{- printf "%s@%s" $repository $digest }}
{{- else }}
{{- if not (regexMatch "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$" $tag) }}
{{- fail (printf "%s.tag %q is not an image tag (letters, digits, '_', '.', '-'; at most 128), and %s.digest is empty" .name $tag .name) }}
{{- end }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{/* One of this chart's own images: an empty tag is v<appVersion>. */}}
{{- define "lumigo-operator.image" -}}
{{- include "lumigo-operator.imageRef" (dict "image" .image "name" .name "root" .root "defaultTag" (printf "v%s" .root.Chart.AppVersion)) }}
{{- end }}

{{- /*
The reference operator's own images (public.ecr.aws/lumigo/…, or its chart's development
defaults host.docker.internal:5000/…) under keys this chart shares with it: a values file kept
from the reference chart must not run the reference's controller, proxy or injector in this
chart's pods, so such a repository is replaced by this chart's own (`default`, with its default
tag) and NOTES.txt names the key. Arguments: image, default (the chart's repository).
*/ -}}
{{- define "lumigo-operator.isReferenceImage" -}}
{{- if regexMatch `^(public\.ecr\.aws/lumigo|host\.docker\.internal:5000)/` (toString (.repository | default "")) }}true{{ end }}
{{- end }}

{{- define "lumigo-operator.ownImage" -}}
{{- if include "lumigo-operator.isReferenceImage" .image }}
{{- toYaml (dict "repository" .default "pullPolicy" (.image.pullPolicy | default "IfNotPresent")) }}
{{- else }}
{{- toYaml .image }}
{{- end }}
{{- end }}

{{- define "lumigo-operator.managerImage" -}}
{{- $image := include "lumigo-operator.ownImage" (dict "image" .Values.controllerManager.manager.image "default" "quay.io/lumigo/lumigo-operator") | fromYaml }}
{{- include "lumigo-operator.image" (dict "image" $image "name" "controllerManager.manager.image" "root" .) }}
{{- end }}

{{- define "lumigo-operator.injectorImage" -}}
{{- $image := include "lumigo-operator.ownImage" (dict "image" .Values.injectorWebhook.lumigoInjector.image "default" "quay.io/lumigo/lumigo-autotrace") | fromYaml }}
{{- include "lumigo-operator.image" (dict "image" $image "name" "injectorWebhook.lumigoInjector.image" "root" .) }}
{{- end }}

{{- define "lumigo-operator.kubeStateMetricsImage" -}}
{{- include "lumigo-operator.imageRef" (dict "image" .Values.kubeStateMetrics.image "name" "kubeStateMetrics.image" "root" .) }}
{{- end }}

{{- define "lumigo-operator.nodeExporterImage" -}}
{{- include "lumigo-operator.imageRef" (dict "image" .Values.prometheusNodeExporter.image "name" "prometheusNodeExporter.image" "root" .) }}
{{- end }}

{{- /*
The pull secrets of every pod of the chart (all in the release namespace; the cluster agent
DaemonSet the operator makes copies the telemetry proxy's): `global.imagePullSecrets` (names or
{name: …}) then the top-level `imagePullSecrets`, without repeats. Pods the operator instruments
in other namespaces never get these: they pull the injected image with their own (see
docs/operations.md, Images from your own registry).
*/ -}}
{{- define "lumigo-operator.imagePullSecrets" -}}
{{- $names := list }}
{{- range concat (((.Values.global).imagePullSecrets) | default list) (.Values.imagePullSecrets | default list) }}
{{- $name := . }}
{{- if kindIs "map" . }}{{ $name = .name }}{{ end }}
{{- $name = toString ($name | default "") }}
{{- if not (regexMatch `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$` $name) }}
{{- fail (printf "global.imagePullSecrets / imagePullSecrets: %q is not a Secret name" $name) }}
{{- end }}
{{- $names = append $names $name | uniq }}
{{- end }}
{{- $secrets := list }}
{{- range $names }}
{{- $secrets = append $secrets (dict "name" .) }}
{{- end }}
{{- with $secrets }}
{{- toYaml (dict "imagePullSecrets" .) }}
{{- end }}
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
{{- $image := include "lumigo-operator.ownImage" (dict "image" $proxy.image "default" "quay.io/lumigo/lumigo-operator-telemetry-proxy") | fromYaml }}
{{- include "lumigo-operator.image" (dict "image" $image "name" "telemetryProxy.image" "root" .) }}
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
{{- /*
A pod's affinity: the first `affinity` of `sources` that is set, which replaces the chart's
(Linux nodes, amd64 or arm64), else the chart's. Arguments: root, sources.
*/ -}}
{{- define "lumigo-operator.affinity" -}}
{{- $affinity := dict }}
{{- range .sources }}
{{- $affinity = $affinity | default .affinity }}
{{- end }}
affinity:
{{- if $affinity }}
{{- toYaml $affinity | nindent 2 }}
{{- else }}
{{- include "lumigo-operator.nodeAffinity" .root | nindent 2 }}
{{- end }}
{{- end }}

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

{{- /*
Tolerations and nodeSelector of one pod: each is the first non-empty one of `sources`, then
`global.*`, then the reference chart's `tolerations.global` / `nodeSelector.global`. A source is
a values map of this chart (e.g. .Values.telemetryProxy) or a string naming a component of the
reference chart, whose `tolerations.<name>` / `nodeSelector.<name>` a Lumigo user upgrading to
this chart keeps (docs/operations.md). Arguments: root, sources.
*/ -}}
{{- define "lumigo-operator.placement" -}}
{{- $values := .root.Values }}
{{- $referenceTolerations := $values.tolerations | default dict }}
{{- $referenceSelectors := $values.nodeSelector | default dict }}
{{- $tolerations := list }}
{{- $nodeSelector := dict }}
{{- range concat .sources (list $values.global "global") }}
{{- if kindIs "string" . }}
{{- $tolerations = $tolerations | default (get $referenceTolerations .) }}
{{- $nodeSelector = $nodeSelector | default (get $referenceSelectors .) }}
{{- else }}
{{- $tolerations = $tolerations | default (.tolerations) }}
{{- $nodeSelector = $nodeSelector | default (.nodeSelector) }}
{{- end }}
{{- end }}
{{- with $tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with $nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The webhook's placement (its own, then the manager's) and pull secrets. */}}
{{- define "lumigo-operator.webhookScheduling" -}}
{{- include "lumigo-operator.placement" (dict "root" . "sources" (list .Values.injectorWebhook .Values.controllerManager "controllerManager")) }}
{{- with include "lumigo-operator.imagePullSecrets" . }}
{{ . }}
{{- end }}
{{- end }}

{{/* The manager's placement and pull secrets. */}}
{{- define "lumigo-operator.scheduling" -}}
{{- include "lumigo-operator.placement" (dict "root" . "sources" (list .Values.controllerManager "controllerManager")) }}
{{- with include "lumigo-operator.imagePullSecrets" . }}
{{ . }}
{{- end }}
{{- end }}

{{/* A hook Job's placement (the reference's `installHook` or `uninstallHook`, then the manager's) and pull secrets. Arguments: root, hook. */}}
{{- define "lumigo-operator.hookScheduling" -}}
{{- include "lumigo-operator.placement" (dict "root" .root "sources" (list .hook .root.Values.controllerManager "controllerManager")) }}
{{- with include "lumigo-operator.imagePullSecrets" .root }}
{{ . }}
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

{{- /* "set" when the dotted `path` holds a value (not null) in .root.Values. */ -}}
{{- define "lumigo-operator.isSet" -}}
{{- $value := .root.Values }}
{{- $found := true }}
{{- range splitList "." .path }}
{{- if and $found (kindIs "map" $value) (hasKey $value .) }}
{{- $value = index $value . }}
{{- else }}
{{- $found = false }}
{{- end }}
{{- end }}
{{- if and $found (not (kindIs "invalid" $value)) }}set{{ end }}
{{- end }}

{{- /*
The reference chart's values this chart accepts (a Lumigo user's values file works unchanged,
docs/operations.md) but does not use, with why; NOTES.txt names those a release sets. Every
other key of the reference chart has the same meaning here.
*/ -}}
{{- define "lumigo-operator.ignoredReferenceValues" -}}
output.color: this chart's notes have no colours
output.showOperatorStatus: these notes do not query the operator; see `kubectl get lumigoes -A` and the operator's pods
watchdog.image: the watchdog runs this chart's operator image (controllerManager.manager.image)
telemetryProxy.logs.batchProcessor: the proxy always batches each tenant's logs in its exporter
controllerManager.kubeRbacProxy: there is no kube-rbac-proxy; the manager itself serves /metrics over HTTPS to authorised tokens (metrics.secure)
controllerManager.telemetryProxy: the reference chart's older place of telemetryProxy; set telemetryProxy instead
controllerManager.namespaceFileServer: there is no namespace file server
controllerManager.initContainer: the hook Jobs run this chart's operator image
logFileCollector: the cluster agent (clusterCollection.logs) reads the log files, with the telemetry proxy's image
injectorWebhookService: this chart's webhook Service has fixed ports and type ClusterIP
metricsService: this chart's metrics Service has fixed ports and type ClusterIP
kubernetesClusterDomain: Services are named by their <name>.<namespace>.svc names, which need no cluster domain
targetAllocator: there is no target allocator; each node's agent scrapes the kube-state-metrics shards on its own node
tolerations.targetAllocator: there is no target allocator
nodeSelector.targetAllocator: there is no target allocator
kube-state-metrics: this chart's own kube-state-metrics is configured with kubeStateMetrics
{{- end }}

{{- /* The init container's resources as --init-resources takes them (LUMIGO_INIT_RESOURCES). */ -}}
{{- define "lumigo-operator.initResources" -}}
{{- $resources := .Values.injectorWebhook.lumigoInjector.resources | default dict }}
{{- $items := list }}
{{- range $kind := list "requests" "limits" }}
{{- range $name := list "cpu" "memory" }}
{{- with (get ($resources | default dict) $kind | default dict) }}
{{- with get . $name }}
{{- $items = append $items (printf "%s.%s=%v" $kind $name .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- join "," $items }}
{{- end }}

{{- /*
Egress (values `egress`): the environment of a container that exports to Lumigo. HTTPS_PROXY
only (the exports are HTTPS; in-cluster scrapes over http:// stay direct whatever NO_PROXY
says), with a NO_PROXY that keeps the API server (its Service IP, from the variable every pod
gets), cluster Service names and loopback direct, then the user's entries. SSL_CERT_DIR adds the
CA bundle's directory to the image's trust store (Go reads every file there after the system
bundle; the watchdog does the same: controller/runtime/trust.py). The cluster agent's DaemonSet
copies all of it from the proxy's pod (controller/telemetry/agent.py).
*/ -}}
{{- define "lumigo-operator.egressEnv" -}}
{{- $egress := .Values.egress | default dict }}
{{- with $egress.httpsProxy }}
- name: HTTPS_PROXY
  value: {{ . | quote }}
- name: NO_PROXY
  value: {{ concat (list "$(KUBERNETES_SERVICE_HOST)" ".svc" ".cluster.local" "localhost" "127.0.0.1" "::1") ($egress.noProxy | default list) | uniq | join "," | quote }}
{{- end }}
{{- if include "lumigo-operator.egressCA" . }}
- name: SSL_CERT_DIR
  value: /etc/lumigo/egress-ca
{{- end }}
{{- end }}

{{- /* "set" when egress.caBundle names a ConfigMap or a Secret. */ -}}
{{- define "lumigo-operator.egressCA" -}}
{{- $ca := (.Values.egress | default dict).caBundle | default dict }}
{{- if and $ca.configMap $ca.secret }}
{{- fail "egress.caBundle: name a ConfigMap or a Secret, not both" }}
{{- end }}
{{- if or $ca.configMap $ca.secret }}set{{ end }}
{{- end }}

{{- define "lumigo-operator.egressVolumeMount" -}}
{{- if include "lumigo-operator.egressCA" . }}
- name: egress-ca
  mountPath: /etc/lumigo/egress-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "lumigo-operator.egressVolume" -}}
{{- $ca := (.Values.egress | default dict).caBundle | default dict }}
{{- $items := list (dict "key" ($ca.key | default "ca.crt") "path" "ca.crt") }}
{{- if $ca.configMap }}
- name: egress-ca
  configMap:
    name: {{ $ca.configMap }}
    items: {{ toJson $items }}
{{- else if $ca.secret }}
- name: egress-ca
  secret:
    secretName: {{ $ca.secret }}
    items: {{ toJson $items }}
{{- end }}
{{- end }}
