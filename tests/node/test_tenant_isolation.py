"""Tenant isolation at the telemetry proxy, on the real node (issue 28, items 5 and 6).

A hostile pod in a namespace of its own (with its own active Lumigo, so it holds one valid token:
its own) sends 10,000 OTLP requests with random forged tokens to the proxy's Service, then a span
whose resource claims a pod of another namespace (its uid, its IP, its namespace, its
Deployment, its node). Meanwhile, and afterwards, a traced Flask app of a legitimate namespace
starts and serves requests: its spans must all reach the sink, the forged requests must be
refused, and the hostile span must carry the hostile pod's own identity and nothing of the pod
it claimed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.node.conftest import NodeHolder
from tests.node.test_product import proxy_settled
from tests.support.packaging import get_json
from tests.support.product import (
    OPERATOR_NS,
    Product,
    apply_readme,
    deployment,
    http_get,
    installed_product,
    rolled_out,
    wait_for,
)

JSON = dict[str, Any]
FORGED = 10_000
LEGIT_NS, HOSTILE_NS = "legit", "hostile"

# Runs in the hostile pod (python3 of the python-app image, no package needed): OTLP/HTTP JSON.
ATTACKER = r"""
import http.client, json, os, secrets, socket, sys, time

# Resolved once: a refused request may close the connection, and a lookup per reconnect is slow.
host = socket.gethostbyname(os.environ["PROXY"])

def span(name, resource):
    now = time.time_ns()
    attributes = [{"key": k, "value": {"stringValue": v}} for k, v in resource.items()]
    return json.dumps({"resourceSpans": [{"resource": {"attributes": attributes},
        "scopeSpans": [{"scope": {"name": "attacker"}, "spans": [{
            "traceId": secrets.token_hex(16), "spanId": secrets.token_hex(8), "name": name,
            "kind": 2, "startTimeUnixNano": str(now), "endTimeUnixNano": str(now + 1000000)}]}]}]})

# Not PORT: the python-app image sets PORT=8080 for its Flask app (the proxy's Service is on 80).
port = int(os.environ.get("PROXY_PORT", "80"))
conn = http.client.HTTPConnection(host, port, timeout=30)

def send(token, body):
    global conn
    try:
        conn.request("POST", "/v1/traces", body=body, headers={
            "Content-Type": "application/json", "Authorization": "LumigoToken " + token})
        response = conn.getresponse()
        response.read()
        if response.will_close:
            conn.close()
        return response.status
    except (OSError, http.client.HTTPException):
        conn.close()
        conn = http.client.HTTPConnection(host, port, timeout=30)
        return 0

forged = span("forged", {"service.name": "attacker"})
statuses = {}
for i in range(int(os.environ["FORGED"])):
    status = send("t_" + secrets.token_hex(11)[:21], forged)
    statuses[status] = statuses.get(status, 0) + 1
    if (i + 1) % 1000 == 0:
        print(json.dumps({"sent": i + 1}), flush=True)
print(json.dumps({"forged": statuses}), flush=True)
claims = json.loads(os.environ["CLAIMS"])
spoofed = send(os.environ["OWN_TOKEN"], span("spoofed", {"service.name": "attacker", **claims}))
print(json.dumps({"spoofed": spoofed}), flush=True)
time.sleep(float(os.environ.get("LINGER", "3600")))
"""


@pytest.fixture(scope="module")
def product(node_holder: NodeHolder) -> Iterator[Product]:
    yield from installed_product(node_holder)


def attacker_pod(product: Product, token: str, claims: dict[str, str]) -> JSON:
    proxy = f"{product.release.fullname}-telemetry-proxy-service.{OPERATOR_NS}.svc.cluster.local"
    env = {"PROXY": proxy, "FORGED": str(FORGED), "CLAIMS": json.dumps(claims),
           "OWN_TOKEN": token}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        # Opted out: the attacker is a plain process, not a traced app.
        "metadata": {"name": "attacker", "labels": {"lumigo.auto-trace": "false"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "attacker",
                    "image": product.images["python-app"],
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", ATTACKER],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                }
            ],
        },
    }


def attacker_lines(product: Product) -> list[JSON]:
    out = product.kubectl("logs", "-n", HOSTILE_NS, "attacker", check=False)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_forged_tokens_neither_block_a_tenant_nor_borrow_another_pods_identity(
    product: Product,
) -> None:
    legit_token, hostile_token = (f"t_{uuid.uuid4().hex[:21]}" for _ in range(2))
    for namespace, token in ((LEGIT_NS, legit_token), (HOSTILE_NS, hostile_token)):
        product.new_namespace(namespace)
        apply_readme(product, namespace, token)
    # Both tenants in the proxy's configuration, and every proxy pod running it: no restart
    # from here on (the flood must meet the proxy that holds the legitimate tenant).
    proxy_settled(
        product,
        lambda text: legit_token in text and hostile_token in text,
        "the proxy configuration with both tenants",
    )
    # A pod of the legitimate namespace to claim: running, with an IP, never traced itself.
    victim = deployment("victim", product.images["python-app"])
    victim["spec"]["template"]["metadata"]["labels"]["lumigo.auto-trace"] = "false"
    product.kubectl("apply", "-n", LEGIT_NS, "-f", "-", input=json.dumps(victim))
    victim_pod = rolled_out(product, LEGIT_NS, "victim")
    claims = {
        "k8s.pod.uid": victim_pod["metadata"]["uid"],
        "k8s.pod.ip": victim_pod["status"]["podIP"],
        "k8s.pod.name": victim_pod["metadata"]["name"],
        "k8s.namespace.name": LEGIT_NS,
        "k8s.deployment.name": "victim",
        "k8s.node.name": "victim-node",
    }

    body = attacker_pod(product, hostile_token, claims)
    product.kubectl("apply", "-n", HOSTILE_NS, "-f", "-", input=json.dumps(body))
    # The legitimate app starts once 1,000 forged tokens are in (the old batcher's lifetime
    # limit): it is a tenant the proxy has not seen data from yet.
    try:
        wait_for(lambda: any("sent" in line for line in attacker_lines(product)), 300,
                 "the attacker's first 1,000 forged requests")  # fmt: skip
    except AssertionError as err:
        pod = get_json(product.cluster, "pod", "attacker", "-n", HOSTILE_NS)
        logs = product.kubectl("logs", "-n", HOSTILE_NS, "attacker", check=False)
        raise AssertionError(f"{err}: {pod.get('status')}\n{logs[-3000:]}") from err
    product.kubectl(
        "apply", "-n", LEGIT_NS, "-f", "-",
        input=json.dumps(deployment("flask", product.images["python-app"])),
    )  # fmt: skip
    app = rolled_out(product, LEGIT_NS, "flask")
    assert [c["name"] for c in app["spec"]["initContainers"]] == ["lumigo-injector"]
    app_name = app["metadata"]["name"]
    marker = uuid.uuid4().hex[:12]
    sent: list[str] = []

    def flood_over() -> bool:
        query = f"legit={marker}-{len(sent)}"
        http_get(product, LEGIT_NS, app_name, f"/?{query}", timeout=30)  # 200, or raises
        sent.append(query)
        return any("spoofed" in line for line in attacker_lines(product))

    wait_for(flood_over, 600, "the attacker's flood and spoofed span", interval=0.2)
    for _ in range(3):  # and after it
        flood_over()

    def delivered() -> set[str]:
        return {
            query
            for s in product.sink.spans()
            if s.resource.get("k8s.pod.name") == app_name
            for value in s.attributes.values()
            for query in sent
            if isinstance(value, str) and value.endswith(query)
        }

    wait_for(lambda: delivered() == set(sent), 180, "every legitimate span at the sink")
    lines = attacker_lines(product)
    (forged,) = [line["forged"] for line in lines if "forged" in line]
    assert forged == {"401": FORGED}
    (spoofed_status,) = [line["spoofed"] for line in lines if "spoofed" in line]
    assert spoofed_status == 200
    assert not [s for s in product.sink.spans() if s.name == "forged"]

    (spoofed,) = wait_for(
        lambda: [s for s in product.sink.spans() if s.name == "spoofed"], 60, "the spoofed span"
    )
    attacker = get_json(product.cluster, "pod", "attacker", "-n", HOSTILE_NS)
    assert spoofed.authorization == f"LumigoToken {hostile_token}"
    resource = spoofed.resource
    # Found by its connection's address: the attacker's own pod, namespace and node.
    assert resource["k8s.pod.name"] == "attacker"
    assert resource["k8s.pod.uid"] == attacker["metadata"]["uid"]
    assert resource["k8s.namespace.name"] == HOSTILE_NS
    assert resource["k8s.node.name"] == product.node.name
    assert "k8s.deployment.name" not in resource  # a bare pod has none
    assert not set(claims.values()) & {str(v) for v in resource.values()}, resource
    product.kubectl("delete", "pod", "attacker", "-n", HOSTILE_NS, "--wait=false")
