"""A namespace admin cannot make the operator read another namespace's Secret (issue 28, item 1).

The attack: `spec.lumigoToken.secretRef.name: ../../<victim>/secrets/<name>`. Concatenated into
the REST path, the HTTP client resolves the dot-segments and the operator, with its cluster-wide
`get secrets`, reads the victim's Secret; the Lumigo's status then tells the attacker whether it
exists and holds a token, and a real token there activates the attacker's namespace under it.
Both ends are closed: the name is refused as the API server refuses Secret names (the CRD, the
schema, hence the defaulter and the reconcilers), and every path segment the client builds is
escaped, so a name that slipped through (stored before this CRD) still stays in its namespace.
Played against the real API server, with a real token Secret in a victim namespace.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from api import constants
from controller.lumigo import status as st
from controller.lumigo.instrumentation import Instrumenter
from controller.lumigo.lumigo_reconciler import LumigoReconciler
from controller.lumigo.resources import LUMIGOES
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from envtest.cluster import KubectlError, LocalCluster
from kube.kinds import SECRETS
from kube.rest import ApiError
from tests.support.lumigo import create_token_secret, random_token
from webhook import pod_injection

JSON = dict[str, Any]
STOLEN = "stolen-token"


class NoEvents:
    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        pass


@pytest.fixture
def victim(cluster: LocalCluster, kube: KubeClient, namespace: str) -> Iterator[str]:
    """Another tenant's namespace holding a real, valid token Secret."""
    name = f"{namespace[:50]}-victim"
    cluster.kubectl("create", "namespace", name)
    try:
        create_token_secret(kube, name, random_token(), name=STOLEN)
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def walking_out(victim: str) -> str:
    return f"../../{victim}/secrets/{STOLEN}"


def hostile_lumigo(namespace: str, name: str, key: str = "token") -> JSON:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "lumigo", "namespace": namespace, "generation": 1},
        "spec": {"lumigoToken": {"secretRef": {"name": name, "key": key}}},
    }


def test_the_crd_refuses_a_secret_name_or_key_that_is_not_a_kubernetes_one(
    cluster: LocalCluster, namespace: str, victim: str, crd: object
) -> None:
    for name, key in ((walking_out(victim), "token"), ("lumigo-credentials", "../token")):
        with pytest.raises(KubectlError) as refused:
            cluster.kubectl(
                "create", "-f", "-", input=json.dumps(hostile_lumigo(namespace, name, key))
            )
        assert "should match" in str(refused.value), str(refused.value)
    with pytest.raises(KubectlError) as too_long:
        cluster.kubectl("create", "-f", "-", input=json.dumps(hostile_lumigo(namespace, "a" * 254)))
    assert "253" in str(too_long.value), str(too_long.value)


def test_the_client_never_leaves_the_namespace_whatever_name_it_is_given(
    kube: KubeClient, namespace: str, victim: str
) -> None:
    def read(name: str, where: str) -> int:
        """200 if the Secret was read, else the API server's answer (404, or 400 for a name no
        Secret can have): either way, never the victim's Secret."""
        try:
            return 200 if kube.get_or_none(SECRETS, name, where) is not None else 404
        except ApiError as err:
            return err.code

    assert read(STOLEN, victim) == 200  # it is there to be stolen
    assert read(walking_out(victim), namespace) in (400, 404)
    assert read(f"..%2F..%2F{victim}%2Fsecrets%2F{STOLEN}", namespace) in (400, 404)
    assert read("..", namespace) in (400, 404)
    # A namespace of ".." cannot climb either: the path stays /api/v1/namespaces/%2E%2E/...
    # (which this API server answers with an error of its own, 500: never a Secret).
    assert read(STOLEN, "..") >= 400


def test_the_reconciler_refuses_such_a_lumigo_and_reads_no_secret(
    kube: KubeClient, namespace: str, victim: str, crd: object
) -> None:
    lumigoes = Informer(kube, Selection(LUMIGOES, namespace=namespace))
    lumigoes.start()
    try:
        assert lumigoes.wait_for_sync(30), lumigoes.last_error
        reconciler = LumigoReconciler(
            client=kube,
            lumigoes=lumigoes,
            workloads={},
            instrumenter=Instrumenter(kube, NoEvents(), component="test"),
            settings_for=pod_injection.InjectionSettings(operator_version="0.1.0").for_spec,
            resync_period=1.0,
            error_requeue=1.0,
        )
        # As if stored before the CRD carried the patterns: the spec itself is refused, with a
        # message saying what to fix and nothing about the victim's Secret.
        problem, reason, spec = reconciler._problem(hostile_lumigo(namespace, walking_out(victim)))
    finally:
        lumigoes.stop()
    assert spec is None
    assert reason == st.REASON_INVALID_SPEC
    assert problem is not None
    assert "DNS-1123 subdomain" in problem
    assert "spec.lumigoToken.secretRef.name" in problem
