"""Kubernetes API client on pykube-ng: thread-safe, retrying, with the verbs an operator needs.

pykube-ng gives us configuration loading and authenticated `requests` sessions; everything else
here works around its traps: one session per thread (requests.Session is
not thread-safe), a separate long-read-timeout session per watch, the in-cluster token re-read
from disk (bound tokens rotate hourly), explicit Content-Types, real PUT/JSON-patch/apply verbs,
and a single `ApiError` carrying the HTTP code for every failure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pykube
import requests
import tenacity

from controller.runtime.metrics import REST_LATENCY, REST_REQUESTS
from kube import objects
from kube.objects import JSON
from kube.rest import ApiError, Resource

log = logging.getLogger("lumigo.kube")

JSONList = list[JSON]  # an alias: `list` is shadowed by methods named list in classes
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# What a client says it is unless told (the operator passes its own: api.constants.USER_AGENT).
DEFAULT_USER_AGENT = "python-kube-client"
RETRYABLE_CODES = frozenset({0, 429, 500, 502, 503, 504})
FIRST_ERROR_CODE = 400  # a status from here on is an error (4xx client, 5xx server)


class TokenFileAuth(requests.auth.AuthBase):
    """Bearer token re-read from the projected service-account file (cached for a minute)."""

    def __init__(self, path: Path, ttl: float = 60.0) -> None:
        self._path = path
        self._ttl = ttl
        self._token = ""
        self._read_at = 0.0
        self._lock = threading.Lock()

    def token(self) -> str:
        with self._lock:
            if not self._token or time.monotonic() - self._read_at > self._ttl:
                self._token = self._path.read_text().strip()
                self._read_at = time.monotonic()
            return self._token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.token()}"
        return request


def _retry_wait(state: tenacity.RetryCallState) -> float:
    """Exponential backoff with jitter, or the server's Retry-After when it sent one."""
    err = state.outcome.exception() if state.outcome else None
    if isinstance(err, ApiError) and err.retry_after is not None:
        return min(err.retry_after, 30.0)
    backoff: float = tenacity.wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2)(state)
    return backoff


def _is_retryable(err: BaseException) -> bool:
    return isinstance(err, ApiError) and err.code in RETRYABLE_CODES


class KubeClient:
    """All Kubernetes API calls of the operator go through this class.

    Thread-safe: each thread gets its own pykube HTTPClient (its own requests.Session); watches
    get a fresh client with a long read timeout. Transient failures (connection errors, 429, 5xx)
    are retried with exponential backoff honouring Retry-After; the last error is raised as
    `ApiError` so callers (reconcilers) can requeue with their own rate limiter.
    """

    def __init__(
        self,
        config: pykube.KubeConfig,
        *,
        timeout: float = 30.0,
        watch_read_timeout: float = 90.0,
        token_file: Path | None = None,
        retry_attempts: int = 5,
        user_agent: str = DEFAULT_USER_AGENT,
    ) -> None:
        self.config = config
        self.timeout = timeout
        self.watch_read_timeout = watch_read_timeout
        self._token_file = token_file
        self._auth = TokenFileAuth(token_file) if token_file else None
        self._local = threading.local()
        self._retry_attempts = retry_attempts
        self.user_agent = user_agent
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_is_retryable),
            wait=_retry_wait,
            stop=tenacity.stop_after_attempt(retry_attempts) | tenacity.stop_after_delay(60),
            reraise=True,
            before_sleep=self._log_retry,
        )
        server = str(config.cluster["server"]).rstrip("/")
        self.server = server
        self.host = urlparse(server).netloc
        self.namespace = str(config.namespace or "default")

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], **kwargs: Any) -> KubeClient:
        try:
            config = pykube.KubeConfig.from_file(str(path))
        except (pykube.exceptions.PyKubeError, OSError, KeyError, ValueError) as err:
            raise ValueError(f"cannot load kubeconfig {path}: {err}") from None
        return cls(config, **kwargs)

    @classmethod
    def in_cluster(cls, **kwargs: Any) -> KubeClient:
        config = pykube.KubeConfig.from_service_account(str(SERVICE_ACCOUNT_DIR))
        return cls(config, token_file=SERVICE_ACCOUNT_DIR / "token", **kwargs)

    @classmethod
    def from_env(cls, kubeconfig: str | None = None, **kwargs: Any) -> KubeClient:
        """An explicit kubeconfig, else in-cluster credentials, else $KUBECONFIG/~/.kube/config."""
        if kubeconfig:
            return cls.from_kubeconfig(kubeconfig, **kwargs)
        if os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").exists():
            return cls.in_cluster(**kwargs)
        path = os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config"))
        return cls.from_kubeconfig(path.split(os.pathsep)[0], **kwargs)

    def clone(
        self, *, timeout: float | None = None, retry_attempts: int | None = None
    ) -> KubeClient:
        """The same credentials with other limits (e.g. no retries for leader election)."""
        return KubeClient(
            self.config,
            timeout=self.timeout if timeout is None else timeout,
            watch_read_timeout=self.watch_read_timeout,
            token_file=self._token_file,
            retry_attempts=self._retry_attempts if retry_attempts is None else retry_attempts,
            user_agent=self.user_agent,
        )

    def _new_http(self) -> pykube.HTTPClient:
        http = pykube.HTTPClient(self.config, timeout=self.timeout)
        if self._auth is not None:
            http.session.auth = self._auth
        http.session.headers["User-Agent"] = self.user_agent
        return http

    def _http(self) -> pykube.HTTPClient:
        http: pykube.HTTPClient | None = getattr(self._local, "http", None)
        if http is None:
            http = self._new_http()
            self._local.http = http
        return http

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        log.info("retrying API call", extra={"attempt": state.attempt_number, "error": str(err)})

    # -- raw request ----------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry: bool = True,
    ) -> Any:
        """One API call; returns the decoded JSON body (or None for an empty body)."""

        def once() -> Any:
            return self._send(method, path, params=params, body=body, content_type=content_type)

        return self._retrying(once) if retry else once()

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
    ) -> Any:
        http = self._http()
        headers = {"Accept": "application/json"}
        data: bytes | None = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        started = time.monotonic()
        try:
            resp = http.session.request(
                method,
                self.server + path,
                params=dict(params or {}),
                data=data,
                headers=headers,
                timeout=self.timeout,
            )
        except requests.RequestException as err:
            REST_REQUESTS.labels("<error>", method, self.host).inc()
            raise ApiError(0, f"{method} {path}: {err}", "ConnectionError") from err
        finally:
            REST_LATENCY.labels(method, self.host).observe(time.monotonic() - started)
        REST_REQUESTS.labels(str(resp.status_code), method, self.host).inc()
        if resp.status_code >= FIRST_ERROR_CODE:
            raise _api_error(resp, method, path)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text

    # -- verbs -----------------------------------------------------------------------------------
    def get(self, resource: Resource, name: str, namespace: str | None = None) -> JSON:
        result: JSON = self.request("GET", resource.path(namespace, name))
        return result

    def get_or_none(
        self, resource: Resource, name: str, namespace: str | None = None
    ) -> JSON | None:
        try:
            return self.get(resource, name, namespace)
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        transform: Callable[[JSON], JSON] | None = None,
    ) -> tuple[JSONList, str]:
        """Every object (paginated); returns (items, list resourceVersion).

        `transform` is applied to each item as its page arrives, so a caller that keeps only a
        projection never holds more than one page of full objects.
        """
        items: JSONList = []
        params: dict[str, Any] = {"limit": limit, **_selectors(label_selector, field_selector)}
        while True:
            try:
                page: JSON = self.request("GET", resource.path(namespace), params=params)
            except ApiError as err:
                if err.gone and "continue" in params:
                    # The continue token expired mid-list: start over with a fresh consistent list.
                    items, params = [], {k: v for k, v in params.items() if k != "continue"}
                    continue
                raise
            kind = resource.kind
            for item in page.pop("items", None) or []:
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", kind)
                items.append(transform(item) if transform else item)
            meta = objects.metadata(page)
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))
            params["continue"] = token

    def create(self, resource: Resource, body: JSON, namespace: str | None = None) -> JSON:
        result: JSON = self.request("POST", resource.path(namespace), body=body)
        return result

    def replace(
        self,
        resource: Resource,
        body: JSON,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        """PUT the whole object; its metadata.resourceVersion makes this optimistic locking."""
        result: JSON = self.request(
            "PUT", _body_path(resource, body, namespace, subresource), body=body
        )
        return result

    def merge_patch(
        self,
        resource: Resource,
        name: str,
        patch: JSON,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        path = resource.path(namespace, name) + (f"/{subresource}" if subresource else "")
        return self._patch(path, patch, "application/merge-patch+json")

    def json_patch(
        self, resource: Resource, name: str, ops: JSONList, namespace: str | None = None
    ) -> JSON:
        return self._patch(resource.path(namespace, name), ops, "application/json-patch+json")

    def apply(self, resource: Resource, body: JSON, field_manager: str, namespace: str) -> JSON:
        """Server-side apply, forcing conflicts (JSON is valid YAML, so the body is sent as-is)."""
        path = _body_path(resource, body, namespace, None)
        params = {"fieldManager": field_manager, "force": "true"}
        result: JSON = self.request(
            "PATCH", path, params=params, body=body, content_type="application/apply-patch+yaml"
        )
        return result

    def _patch(self, path: str, body: JSON | JSONList, content_type: str) -> JSON:
        result: JSON = self.request("PATCH", path, body=body, content_type=content_type)
        return result

    def delete(
        self, resource: Resource, name: str, namespace: str | None = None, *, propagation: str = ""
    ) -> JSON | None:
        """DELETE; None when the object is already gone."""
        options: JSON = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            options["propagationPolicy"] = propagation
        try:
            result: JSON | None = self.request(
                "DELETE", resource.path(namespace, name), body=options
            )
        except ApiError as err:
            if err.not_found:
                return None
            raise
        return result

    def update_with_retry(
        self,
        resource: Resource,
        name: str,
        namespace: str | None,
        mutate: Callable[[JSON], JSON | None],
        *,
        subresource: str | None = None,
        current: JSON | None = None,
    ) -> JSON | None:
        """GET, mutate, PUT; on 409 re-read and re-apply (client-go's RetryOnConflict).

        `mutate` gets a fresh copy and returns the object to write, or None when nothing needs
        to change (then nothing is written and None is returned). A `current` copy (e.g. from a
        LIST just made) saves the first GET; a stale one only costs the 409 and a retry.
        """
        attempts = 5
        for attempt in range(attempts):
            if attempt > 0 or current is None:
                current = self.get(resource, name, namespace)
            desired = mutate(current)
            if desired is None:
                return None
            try:
                return self.replace(resource, desired, namespace, subresource=subresource)
            except ApiError as err:
                if not err.conflict or attempt == attempts - 1:
                    raise
                time.sleep(0.01 * (2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    # -- watch -----------------------------------------------------------------------------------
    def watch(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        resource_version: str = "",
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> WatchStream:
        """A stream of (type, object) events; iterate it, `close()` it from any thread.

        An ERROR event is raised as ApiError (410 Gone means: relist). BOOKMARK events are
        yielded so the caller can track the resourceVersion. A silent stream longer than
        `watch_read_timeout` raises ApiError(0) (bookmarks arrive about once a minute).
        """
        params: dict[str, Any] = {
            "watch": "true",
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true",
            **_selectors(label_selector, field_selector),
        }
        if resource_version:
            params["resourceVersion"] = resource_version
        return WatchStream(self, resource, namespace, params)


class WatchStream:
    """One WATCH request on its own session (a watch pins a connection for minutes)."""

    def __init__(
        self, client: KubeClient, resource: Resource, namespace: str | None, params: JSON
    ) -> None:
        self._client = client
        self._resource = resource
        self._path = resource.path(namespace)
        self._params = params
        self._http = client._new_http()
        self._response: requests.Response | None = None
        self._closed = False
        self._lock = threading.Lock()  # orders `close` against the response being set

    def close(self) -> None:
        """Interrupt the stream; safe to call from another thread.

        Closing the response object from another thread would block on the reader's buffer
        lock, so shut the socket down instead: the reader's recv() returns at once and the
        reading thread cleans up in its own `finally`.
        """
        with self._lock:
            self._closed = True
            response = self._response
        if response is None:
            return  # not sent yet: `__iter__` sees `_closed` and sends nothing
        connection = getattr(response.raw, "connection", None) or getattr(
            response.raw, "_connection", None
        )
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def __iter__(self) -> Iterator[tuple[str, JSON]]:
        client, resource = self._client, self._resource
        try:
            if self._is_closed():
                return  # closed before iterating: no request at all
            try:
                resp = self._http.session.get(
                    client.server + self._path,
                    params=self._params,
                    headers={"Accept": "application/json"},
                    stream=True,
                    timeout=(10, client.watch_read_timeout),
                )
            except requests.RequestException as err:
                raise ApiError(0, f"watch {resource.plural}: {err}", "ConnectionError") from err
            REST_REQUESTS.labels(str(resp.status_code), "WATCH", client.host).inc()
            with self._lock:
                self._response = resp
            if self._is_closed():
                return  # closed while the request was on its way
            if resp.status_code >= FIRST_ERROR_CODE:
                raise _api_error(resp, "WATCH", self._path)
            try:
                for line in resp.iter_lines(chunk_size=None):
                    if line:
                        yield _watch_event(line, resource)
            except (requests.RequestException, ValueError, OSError) as err:
                if self._is_closed():
                    return
                raise ApiError(0, f"watch {resource.plural}: {err}", "ConnectionError") from err
        finally:
            self._closed = True
            if self._response is not None:
                self._response.close()
            self._http.session.close()


def _watch_event(line: bytes, resource: Resource) -> tuple[str, JSON]:
    """The type and object of one line of a watch stream (the object's apiVersion and kind filled
    in, but for a BOOKMARK); raises ApiError for an ERROR event."""
    event = json.loads(line)
    kind, obj = event.get("type", ""), event.get("object") or {}
    if kind == "ERROR":
        raise ApiError(
            int(obj.get("code", 500)),
            str(obj.get("message", "watch error")),
            str(obj.get("reason", "")),
            obj,
        )
    if kind != "BOOKMARK":
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
    return kind, obj


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    """The query parameters of a LIST or WATCH for the given selectors."""
    params = {"labelSelector": label_selector, "fieldSelector": field_selector}
    return {name: value for name, value in params.items() if value}


def _body_path(
    resource: Resource, body: JSON, namespace: str | None, subresource: str | None
) -> str:
    """The path of the object `body` names (its own namespace unless one is given)."""
    meta = body["metadata"]
    ns = namespace if namespace is not None else meta.get("namespace")
    return resource.path(ns, meta["name"]) + (f"/{subresource}" if subresource else "")


def _api_error(resp: requests.Response, method: str, path: str) -> ApiError:
    reason, message, body = "", resp.text.strip()[:500], None
    try:
        payload = resp.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        body = payload
        reason = str(payload.get("reason", ""))
        message = str(payload.get("message", message))
    retry_after: float | None = None
    header = resp.headers.get("Retry-After")
    if header:
        try:
            retry_after = float(header)
        except ValueError:
            retry_after = None
    return ApiError(resp.status_code, f"{method} {path}: {message}", reason, body, retry_after)
