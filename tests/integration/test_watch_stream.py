"""The watch stream on a real API server: closing it before it is iterated sends nothing."""

from __future__ import annotations

import pykube

from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from kube.kinds import CONFIGMAPS
from tests.support.tcpproxy import TCPProxy


def test_a_stream_closed_before_iterating_sends_no_request(
    cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    kube.create(CONFIGMAPS, {"metadata": {"name": "there"}, "data": {}}, namespace)
    proxy = TCPProxy("127.0.0.1", cluster.apiserver_port)  # counts the connections made
    try:
        config = pykube.KubeConfig.from_file(str(cluster.kubeconfig))
        config.cluster["server"] = proxy.url
        client = KubeClient(config, retry_attempts=1)
        # A short server timeout: a stream that wrongly went out still ends by itself.
        stream = client.watch(CONFIGMAPS, namespace, timeout_seconds=2)
        stream.close()  # e.g. an informer stopped between creating the stream and reading it
        assert list(stream) == []  # without the fix: an ADDED event for "there"
        assert proxy.accepted == 0
    finally:
        proxy.close()
