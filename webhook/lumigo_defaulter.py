"""/v1alpha1/mutate: the Lumigo defaulter (mutating, but it also validates).

Wiring:

    handler = MutateHandler(lumigoes=lumigo_informer.store)   # inject_handler.LumigoLister
    response = handler.handle(request)

Behaviour (the reference operator's defaulter's; failurePolicy Fail, so a denial is what the
user sees):
- DELETE, and kinds other than operator.lumigo.io/v1alpha1 Lumigo: allowed.
- CREATE when a Lumigo already exists in the namespace: denied, "There is already an instance of
  operator.lumigo.io/v1alpha1.Lumigo in the '<ns>' namespace".
- Blank `lumigoToken.secretRef.name` / `.key`: denied with the reference's messages.
- A spec with wrong types: denied (422 Invalid) with the message naming each field.
- Otherwise: allowed with a JSON patch filling every default (`api.lumigo.load_spec` and
  `dump_spec` are the single source of defaults).
- The Lumigo resources cannot be listed: refused with code 500, like the reference.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from api import constants
from api.lumigo import InvalidSpecError, dump_spec, load_spec
from kube import objects
from kube.http.routing import BadRequest
from kube.jsonpatch import diff
from webhook.admission_review import (
    AdmissionRequest,
    AdmissionResponse,
    allow,
    deny,
    errored,
    patched,
)
from webhook.inject_handler import NOTHING_ON_DELETE, LumigoLister

log = logging.getLogger("lumigo.webhook.mutate")

NOT_A_LUMIGO: Final = (
    f"Not a {constants.API_VERSION}.{constants.KIND} resource, nothing to validate"
)
ALREADY_EXISTS: Final = (
    f"There is already an instance of {constants.API_VERSION}.{constants.KIND} "
    "in the '{namespace}' namespace"
)
BLANK_NAME: Final = "no reference to a Lumigo token ('.Spec.LumigoToken.SecretRef.Name' is blank)"
BLANK_KEY: Final = (
    "invalid reference to a Lumigo token ('.Spec.LumigoToken.SecretRef.Key' is blank)"
)
LIST_FAILED: Final = "cannot retrieve Lumigo instances in namespace {namespace}: {error}"


class MutateHandler:
    def __init__(self, lumigoes: LumigoLister) -> None:
        self.lumigoes = lumigoes

    def handle(self, request: AdmissionRequest) -> AdmissionResponse:
        try:
            return self._handle(request)
        except BadRequest:
            raise
        except Exception as err:  # a bug or absurd input: refuse clearly rather than crash
            log.exception("defaulter webhook failed", extra={"uid": request.uid})
            return errored(
                request,
                500,
                f"internal error in the Lumigo defaulter webhook ({type(err).__name__})",
            )

    def _handle(self, request: AdmissionRequest) -> AdmissionResponse:
        if request.operation not in ("CREATE", "UPDATE"):
            return allow(request, NOTHING_ON_DELETE if request.operation == "DELETE" else "")
        kind = request.kind
        if (kind.group, kind.version, kind.kind) != (
            constants.GROUP,
            constants.VERSION,
            constants.KIND,
        ):
            return allow(request, NOT_A_LUMIGO)
        obj = request.object or {}
        meta = objects.metadata(obj)
        if not isinstance(meta, Mapping):
            raise BadRequest("cannot decode the Lumigo resource: metadata must be an object")
        namespace = request.namespace or str(meta.get("namespace") or "")
        spec = obj.get("spec")
        if spec is not None and not isinstance(spec, Mapping):
            return deny(
                request, str(InvalidSpecError({"spec": "must be an object"})), 422, "Invalid"
            )

        if request.operation == "CREATE":
            refused = self._refuse_second(request, namespace)
            if refused is not None:
                return refused

        name, key = _secret_ref(spec)
        if name is None or name == "":
            return deny(request, BLANK_NAME)
        if key is None or key == "":
            return deny(request, BLANK_KEY)
        try:
            defaulted = dump_spec(load_spec(spec))
        except InvalidSpecError as err:
            return deny(request, str(err), 422, "Invalid")
        return patched(request, diff(obj, {**obj, "spec": defaulted}))

    def _refuse_second(self, request: AdmissionRequest, namespace: str) -> AdmissionResponse | None:
        """The refusal of a CREATE in a namespace that already has a Lumigo resource (or whose
        Lumigo resources cannot be listed); None when the namespace has none."""
        try:
            existing = list(self.lumigoes.list(namespace))
        except Exception as err:
            log.warning(
                "cannot list Lumigo resources",
                extra={"namespace": namespace, "error": str(err)},
            )
            return errored(request, 500, LIST_FAILED.format(namespace=namespace, error=err))
        if existing:
            return deny(request, ALREADY_EXISTS.format(namespace=namespace))
        return None


def _secret_ref(spec: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """The raw secretRef name and key (None when absent), before any type checking."""
    node: Any = spec
    for step in ("lumigoToken", "secretRef"):
        node = node.get(step) if isinstance(node, Mapping) else None
    if not isinstance(node, Mapping):
        return None, None
    return node.get("name"), node.get("key")
