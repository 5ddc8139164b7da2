"""Authentication and authorization delegated to the API server, for endpoints such as /metrics.

The model is controller-runtime's `filters.WithAuthenticationAndAuthorization`: the caller's
bearer token is checked with a TokenReview (authentication.k8s.io/v1), then the user it names is
checked with a SubjectAccessReview (authorization.k8s.io/v1) for the non-resource URL of the
request and the verb of its method (`get` for GET and HEAD). No token, or one the API server does
not accept: 401. A user who may not: 403. The API server unreachable: 503 (never an open door).

Decisions are cached briefly, as controller-runtime does (a token's review 1 minute, an allowed
access 5 minutes, a denied one 30 seconds), in caches of bounded size keyed by a hash of the token
(the token itself is never kept nor logged), so a Prometheus scraping every few seconds costs the
API server two reviews a few times an hour, and a client sending random tokens cannot grow memory.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from kube.http.messages import Request, RequestHandler, Response, status_response
from kube.objects import JSON
from kube.rest import ApiError, Resource

log = logging.getLogger("lumigo.delegated_auth")

TOKEN_REVIEWS = Resource(
    "authentication.k8s.io/v1", "TokenReview", "tokenreviews", namespaced=False
)
SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io/v1", "SubjectAccessReview", "subjectaccessreviews", namespaced=False
)
MAX_TOKEN_BYTES = 16 * 1024  # a projected ServiceAccount token is about 1 KiB


class ReviewAPI(Protocol):
    """What the filter needs of a Kubernetes client: `create` (TokenReview, SubjectAccessReview
    are create-only and answer in the returned object's status)."""

    def create(self, resource: Resource, body: JSON, namespace: str | None = None) -> JSON: ...


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class CacheSettings:
    token_ttl: float = 60.0
    allow_ttl: float = 300.0
    deny_ttl: float = 30.0
    max_entries: int = 1024  # per cache; the oldest entry goes first


class _TTLCache:
    """A bounded map whose entries expire (insertion order = eviction order)."""

    def __init__(self, max_entries: int, clock: Callable[[], float]) -> None:
        self._entries: collections.OrderedDict[object, tuple[float, object]] = (
            collections.OrderedDict()
        )
        self._max = max_entries
        self._clock = clock
        self._lock = threading.Lock()

    def get(self, key: object) -> object | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            if found[0] <= self._clock():
                del self._entries[key]
                return None
            return found[1]

    def put(self, key: object, value: object, ttl: float) -> None:
        if ttl <= 0 or self._max <= 0:
            return
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = (self._clock() + ttl, value)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class Unavailable(Exception):
    """The API server could not answer a review (not cached; the client sees 503)."""


_NOT_AUTHENTICATED = object()


class DelegatedAuth:
    """Authenticates a request's bearer token and authorizes its non-resource URL and verb
    through the API server, caching decisions briefly."""

    def __init__(
        self,
        api: ReviewAPI,
        cache: CacheSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.cache = cache or CacheSettings()
        self._tokens = _TTLCache(self.cache.max_entries, clock)
        self._decisions = _TTLCache(self.cache.max_entries, clock)
        self.reviews = 0  # TokenReviews and SubjectAccessReviews sent (tests and benches)

    def check(self, request: Request) -> Response | None:
        """None when the request may proceed; otherwise the 401/403/503 response to send."""
        token = bearer_token(request.headers)
        if token is None:
            return _unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        try:
            user = self.authenticate(token)
            if user is None:
                return _unauthorized("the bearer token was not accepted by the API server")
            path = request.path
            verb = "get" if request.method in ("GET", "HEAD") else request.method.lower()
            if not self.authorize(user, verb, path):
                return status_response(
                    403,
                    f"forbidden: user {_printable(user.name)!r} may not {verb} the non-resource "
                    f"URL {_printable(path)!r} (bind it to a role that allows it)",
                )
        except Unavailable as err:
            return status_response(503, str(err), headers={"Retry-After": "5"})
        return None

    def guard(self, handler: RequestHandler) -> RequestHandler:
        """`handler` behind the check."""

        def guarded(request: Request) -> Response:
            return self.check(request) or handler(request)

        return guarded

    def authenticate(self, token: str) -> User | None:
        key = hashlib.sha256(token.encode()).digest()
        cached = self._tokens.get(key)
        if cached is _NOT_AUTHENTICATED:
            return None
        if isinstance(cached, User):
            return cached
        review = self._create(
            TOKEN_REVIEWS,
            {
                "apiVersion": TOKEN_REVIEWS.api_version,
                "kind": TOKEN_REVIEWS.kind,
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        user: User | None = None
        if status.get("authenticated") is True:
            info = status.get("user") or {}
            user = User(
                name=str(info.get("username") or ""),
                uid=str(info.get("uid") or ""),
                groups=tuple(str(g) for g in info.get("groups") or ()),
                extra=tuple(
                    sorted(
                        (str(k), tuple(str(x) for x in v or ()))
                        for k, v in (info.get("extra") or {}).items()
                    )
                ),
            )
        self._tokens.put(key, user or _NOT_AUTHENTICATED, self.cache.token_ttl)
        return user

    def authorize(self, user: User, verb: str, path: str) -> bool:
        key = (user, verb, path)
        cached = self._decisions.get(key)
        if isinstance(cached, bool):
            return cached
        spec: JSON = {
            "user": user.name,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        review = self._create(
            SUBJECT_ACCESS_REVIEWS,
            {
                "apiVersion": SUBJECT_ACCESS_REVIEWS.api_version,
                "kind": SUBJECT_ACCESS_REVIEWS.kind,
                "spec": spec,
            },
        )
        status = review.get("status") or {}
        allowed = status.get("allowed") is True and status.get("denied") is not True
        ttl = self.cache.allow_ttl if allowed else self.cache.deny_ttl
        self._decisions.put(key, allowed, ttl)
        if not allowed:
            log.info("access denied", extra={"user": user.name, "verb": verb, "path": path})
        return allowed

    def _create(self, resource: Resource, body: JSON) -> JSON:
        self.reviews += 1
        try:
            return self.api.create(resource, body)
        except ApiError as err:
            # The message is the API server's; it never contains the token we sent.
            log.warning("review failed", extra={"kind": resource.kind, "error": str(err)})
            raise Unavailable(f"cannot check access: the {resource.kind} failed: {err}") from None


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of `Authorization: Bearer <token>`; None when absent, empty or malformed."""
    value = headers.get("authorization", "")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_BYTES:
        return None
    if "," in token or any(c.isspace() for c in token):
        return None  # two Authorization headers joined, or garbage: never a token
    return token


def _unauthorized(message: str) -> Response:
    return status_response(401, message, headers={"WWW-Authenticate": 'Bearer realm="metrics"'})


def _printable(text: str, limit: int = 256) -> str:
    return "".join(c if c.isprintable() else "?" for c in text[:limit])
