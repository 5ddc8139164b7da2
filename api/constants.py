"""Names and values shared by the webhook, the controller and the manifests.

These are part of the compatibility contract with the reference Lumigo operator: changing one
breaks users' selectors, dashboards or existing instrumented workloads.
"""

from __future__ import annotations

from typing import Final

from api import __version__
from kube import kinds

# --- API identity -------------------------------------------------------------------------
GROUP: Final = "operator.lumigo.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "Lumigo"
LIST_KIND: Final = "LumigoList"
PLURAL: Final = "lumigoes"
SINGULAR: Final = "lumigo"
SHORT_NAMES: Final = ("lmg",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

FINALIZER: Final = "operator.lumigo.io/lumigo-finalizer"

# --- Labels -------------------------------------------------------------------------------
LABEL_AUTO_TRACE: Final = "lumigo.auto-trace"
# On namespaces with an active Lumigo, maintained by the operator: the injector webhook's
# namespaceSelector requires it, so the API server calls it nowhere else.
LABEL_MONITORED: Final = "operator.lumigo.io/monitored"
# On Nodes that have a spec.providerID, maintained by the operator: the collectors read it as
# `k8s.provider.id` (their Kubernetes processor reads a Node's annotations, not its spec).
ANNOTATION_PROVIDER_ID: Final = "operator.lumigo.io/provider-id"
AUTO_TRACE_VERSION_PREFIX: Final = "lumigo-operator.v"
AUTO_TRACE_FALSE: Final = "false"
AUTO_TRACE_TRUE: Final = "true"
AUTO_TRACE_SKIP_NEXT_INJECTOR: Final = "skip-next-injector"

# Label-based opt-in when there is no Lumigo resource in the namespace.
LABEL_TOKEN_SECRET: Final = "lumigo.token-secret"
LABEL_TOKEN_KEY: Final = "lumigo.token-key"
LABEL_ENABLE_TRACES: Final = "lumigo.enable-traces"
LABEL_ENABLE_LOGS: Final = "lumigo.enable-logs"
DEFAULT_TOKEN_SECRET: Final = "lumigo-credentials"
DEFAULT_TOKEN_KEY: Final = "token"
# What the API server accepts as a Secret's name (a DNS-1123 subdomain) and as a key of its data
# (`IsConfigMapKey`: not ".", not starting with ".."). RE2-compatible (no look-arounds), so the CRD
# carries the same patterns; "" is let through because a blank reference has its own message.
SECRET_NAME_MAX_LENGTH: Final = 253
SECRET_NAME_PATTERN: Final = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
SECRET_KEY_MAX_LENGTH: Final = 253
SECRET_KEY_PATTERN: Final = r"^(\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*)?$"
# A label value, and a container name (a DNS-1123 label), are at most this long.
LABEL_VALUE_MAX_LENGTH: Final = 63
CONTAINER_NAME_MAX_LENGTH: Final = 63

# --- Conditions ---------------------------------------------------------------------------
CONDITION_ACTIVE: Final = "Active"
CONDITION_ERROR: Final = "Error"
CONDITION_PROGRESSING: Final = "Progressing"  # beyond the reference: the rollout budget
# Beyond the reference: left out of the telemetry proxy's configuration (too large for a Secret).
CONDITION_TELEMETRY_LEFT_OUT: Final = "TelemetryLeftOut"

# --- Safe rollouts (beyond the reference) -------------------------------------------------
DEFAULT_MAX_CONCURRENT_ROLLOUTS: Final = 5
# On a workload the controller instrumented: the generation its change produced, when, and
# whether the workload was healthy just before (only those are ever reverted).
ANNOTATION_INSTRUMENTED_GENERATION: Final = "operator.lumigo.io/instrumented-generation"
ANNOTATION_INSTRUMENTED_AT: Final = "operator.lumigo.io/instrumented-at"
ANNOTATION_HEALTHY_BEFORE: Final = "operator.lumigo.io/healthy-before-instrumentation"
# The mark of a reverted workload: what was observed. Neither the webhook nor the controller
# instruments a workload that carries it; removing it retries once.
ANNOTATION_REVERTED: Final = "operator.lumigo.io/instrumentation-reverted"
REASON_REVERTED: Final = "LumigoRevertedInstrumentation"

# --- Per-container control (beyond the reference): annotations of the workload ---------------
ANNOTATION_EXCLUDE_CONTAINERS: Final = "operator.lumigo.io/exclude-containers"
ANNOTATION_INCLUDE_CONTAINERS: Final = "operator.lumigo.io/include-containers"
REASON_INVALID_CONTAINERS: Final = "LumigoInvalidContainerSelection"

# --- Event reasons ------------------------------------------------------------------------
REASON_ADDED: Final = "LumigoAddedInstrumentation"
REASON_REMOVED: Final = "LumigoRemovedInstrumentation"
REASON_UPDATED: Final = "LumigoUpdatedInstrumentation"
REASON_CANNOT_ADD: Final = "LumigoCannotAddInstrumentation"
REASON_CANNOT_REMOVE: Final = "LumigoCannotRemoveInstrumentation"
REASON_CANNOT_UPDATE: Final = "LumigoCannotUpdateInstrumentation"

# --- Injection ----------------------------------------------------------------------------
INJECTOR_VOLUME: Final = "lumigo-injector"
INJECTOR_INIT_CONTAINER: Final = "lumigo-injector"
INJECTOR_VOLUME_SIZE_LIMIT: Final = "200M"
INJECTOR_TARGET_DIRECTORY: Final = "/target"
LUMIGO_MOUNT_PATH: Final = "/opt/lumigo"
LD_PRELOAD_VALUE: Final = "/opt/lumigo/injector/lumigo_injector.so"
# Our own autotrace image, pinned to the operator's version (never a `:latest` tag, which would
# make the kubelet pull it on every pod start, and never another project's image).
INJECTOR_IMAGE_REPOSITORY: Final = "quay.io/lumigo/lumigo-autotrace"
DEFAULT_INJECTOR_IMAGE: Final = f"{INJECTOR_IMAGE_REPOSITORY}:v{__version__}"
# Set explicitly on the init container: a pinned tag is pulled once per node.
DEFAULT_INJECTOR_PULL_POLICY: Final = "IfNotPresent"
PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")
DEFAULT_INIT_CONTAINER_UID: Final = 1234
# Who the lumigo-injector init container runs as. fsgroup: the pod's fsGroup, else 1234 (the
# reference). unset: no runAsUser/runAsGroup, so the pod's, or what the platform assigns
# (OpenShift's SecurityContextConstraints refuse any UID outside the namespace's range).
INIT_USER_FSGROUP: Final = "fsgroup"
INIT_USER_UNSET: Final = "unset"
INIT_USERS: Final = (INIT_USER_FSGROUP, INIT_USER_UNSET)
INIT_USER_AUTO: Final = "auto"  # unset on OpenShift (the API serves security.openshift.io)
# How the payload reaches a pod: copied by the init container into an emptyDir, or the autotrace
# image mounted read-only as an `image` volume (KEP-4639: Kubernetes >= 1.35, containerd >= 2.2
# or CRI-O >= 1.33 for the subPath), with no copy and no init container.
INJECTION_MODE_INIT_CONTAINER: Final = "init-container"
INJECTION_MODE_IMAGE_VOLUME: Final = "image-volume"
INJECTION_MODES: Final = (INJECTION_MODE_INIT_CONTAINER, INJECTION_MODE_IMAGE_VOLUME)
INJECTION_MODE_AUTO: Final = "auto"  # image-volume where the whole cluster supports it
PAYLOAD_IMAGE_PATH: Final = "payload"  # where the autotrace image keeps the payload

ENV_LD_PRELOAD: Final = "LD_PRELOAD"
ENV_TRACER_TOKEN: Final = "LUMIGO_TRACER_TOKEN"
ENV_ENDPOINT: Final = "LUMIGO_ENDPOINT"
ENV_LOGS_ENDPOINT: Final = "LUMIGO_LOGS_ENDPOINT"
ENV_ENABLE_LOGS: Final = "LUMIGO_ENABLE_LOGS"
ENV_ENABLE_TRACES: Final = "LUMIGO_ENABLE_TRACES"
ENV_CONTAINER_NAME: Final = "LUMIGO_CONTAINER_NAME"
INJECTED_ENV_NAMES: Final = (
    ENV_LD_PRELOAD,
    ENV_TRACER_TOKEN,
    ENV_ENDPOINT,
    ENV_LOGS_ENDPOINT,
    ENV_ENABLE_LOGS,
    ENV_ENABLE_TRACES,
    ENV_CONTAINER_NAME,
)
# Where we keep a user's own LD_PRELOAD so that removal can restore it exactly (our fix of the
# reference, which overwrote it). Stored on the container as an env var nobody else reads.
ENV_ORIGINAL_LD_PRELOAD: Final = "LUMIGO_ORIGINAL_LD_PRELOAD"

DEFAULT_TELEMETRY_PROXY_SERVICE: Final = (
    "http://lumigo-lumigo-operator-telemetry-proxy-service.lumigo-system.svc.cluster.local"
)

# --- Token validation ---------------------------------------------------------------------
# The whole value (surrounding whitespace aside, e.g. the newline of `echo t_... > file`) must
# match: the reference searches instead, which let `t_<21 hex>${env:X}` through into the proxy's
# configuration.
TOKEN_PATTERN: Final = r"t_[0-9A-Fa-f]{21}"

# --- Workload kinds -----------------------------------------------------------------------
# The kinds Lumigo instruments, in the order the reference uses for status and injection.
WORKLOAD_KINDS: Final = (
    kinds.DAEMONSETS,
    kinds.DEPLOYMENTS,
    kinds.REPLICASETS,
    kinds.STATEFULSETS,
    kinds.CRONJOBS,
    kinds.JOBS,
)
KIND_ORDER: Final = {resource.kind: i for i, resource in enumerate(WORKLOAD_KINDS)}

# --- Webhooks -----------------------------------------------------------------------------
INJECT_PATH: Final = "/v1alpha1/inject"
MUTATE_PATH: Final = "/v1alpha1/mutate"
INJECTOR_WEBHOOK_NAME: Final = "lumigoinjector.kb.io"
DEFAULTER_WEBHOOK_NAME: Final = "lumigodefaulter.kb.io"

LEADER_ELECTION_ID: Final = "1447aab8.lumigo.io"
# How the operator's Kubernetes clients name themselves to the API server (audit logs).
USER_AGENT: Final = "lumigo-operator"
