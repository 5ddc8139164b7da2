"""10,000+ random and malformed AdmissionReviews against the running HTTPS server.

Every answer must be a 200 carrying a valid AdmissionReview that echoes the request uid, or a
400 with a message; never a 5xx, never a hang (clients time out), and the server answers
normally afterwards.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping

from prometheus_client import REGISTRY

from kube.http.routing import Route
from kube.http.tls import ServingTLS
from tests.support import fuzz, reviews, standin_handler
from tests.support.webhook_server import client_context, new_pki, running
from tests.unit.webhook_samples import RecordingRecorder, StaticLister, lumigo
from webhook.inject_handler import InjectHandler
from webhook.lumigo_defaulter import MutateHandler
from webhook.pod_injection import InjectionSettings
from webhook.routes import admission_routes

TOTAL = 10_000
CLIENTS = 4
SEED = int(os.environ.get("LUMIGO_FUZZ_SEED", "20260417"))


def check_answer(status: int, body: bytes, expected_uid: str | None, case: str) -> None:
    assert status in (200, 400), f"{case}: HTTP {status}: {body[:300]!r}"
    reply = json.loads(body)
    if status == 400:
        assert reply["kind"] == "Status", case
        assert reply["message"], case
        return
    assert reply["apiVersion"] == "admission.k8s.io/v1", case
    assert reply["kind"] == "AdmissionReview", case
    response = reply["response"]
    assert isinstance(response["allowed"], bool), case
    assert isinstance(response["uid"], str), case
    assert response["uid"], case
    if expected_uid is not None:
        assert response["uid"] == expected_uid, case


def fuzz_routes(routes: Mapping[str, Route]) -> None:
    pki = new_pki()
    tls = ServingTLS()
    tls.load_pem(pki.serving.cert_pem, pki.serving.key_pem)
    paths = sorted(routes)
    five_xx_before = sum(
        REGISTRY.get_sample_value(
            "controller_runtime_webhook_requests_total", {"webhook": p, "code": "500"}
        )
        or 0.0
        for p in paths
    )
    failures: list[str] = []
    answered = [0] * CLIENTS

    with running(routes, tls) as server:

        def worker(index: int) -> None:
            client = reviews.Client(server.port, client_context(pki), timeout=30)
            seed = SEED * 100 + index
            try:
                for n, (body, content_type, uid) in enumerate(fuzz.cases(seed, TOTAL // CLIENTS)):
                    path = paths[n % len(paths)]
                    case = f"seed={seed} case={n} path={path} content-type={content_type!r}"
                    status, reply = client.post(path, body, content_type)
                    check_answer(status, reply, uid, case)
                    answered[index] += 1
            except Exception as err:  # reported below with the seed to reproduce it
                failures.append(f"client {index}: {type(err).__name__}: {err}")
            finally:
                client.close()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, "\n".join(failures)
        assert sum(answered) >= TOTAL
        # Still healthy afterwards.
        server.ready()
        client = reviews.Client(server.port, client_context(pki))
        try:
            for path in paths:
                body = reviews.body_of(reviews.review(reviews.deployment(), uid="after-fuzz"))
                status, reply = client.post(path, body)
                check_answer(status, reply, "after-fuzz", f"after fuzzing {path}")
                assert status == 200
        finally:
            client.close()
    five_xx_after = sum(
        REGISTRY.get_sample_value(
            "controller_runtime_webhook_requests_total", {"webhook": p, "code": "500"}
        )
        or 0.0
        for p in paths
    )
    assert five_xx_after == five_xx_before


def test_fuzz_the_server_with_the_standin_handler() -> None:
    fuzz_routes({"/v1alpha1/inject": standin_handler.handle})


def test_fuzz_the_server_with_the_real_handlers() -> None:
    """Both operator paths, with an Active Lumigo in some of the fuzzed namespaces."""
    lister = StaticLister({f"ns{i}": [lumigo(namespace=f"ns{i}")] for i in (0, 1, 2)})
    lister.by_namespace["ns3"] = [lumigo(namespace="ns3", active=False)]
    inject = InjectHandler(lister, RecordingRecorder(), InjectionSettings(operator_version="0.1.0"))
    fuzz_routes(admission_routes(inject, MutateHandler(lister)))
