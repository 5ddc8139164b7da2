#!/usr/bin/env python3
"""Container log lines per second through one cluster agent, its CPU and its memory.

The real pieces: a local kube-apiserver (the agent's k8s_attributes watches the pods of its
node there), the project's collector binary running exactly the rendered agent configuration
(`controller.telemetry.agent_config`: filelog with the container parser and multi-line joining,
offsets in file_storage, the disk-backed export queue, root-owner enrichment, batches), and an
OTLP/HTTP sink as upstream that decodes every request to count the records. The log files are
CRI-format files in a kubelet-like directory (`<ns>_<pod>_<uid>/<container>/0.log`) of a Pod
bound to the cluster's node, written by this script.

Figures:
- idle: the agent's RSS with nothing to read;
- steady: `--rate` lines/s written for `--seconds` (a busy node): CPU share of one core, RSS, and
  how far delivery lags behind writing at the end;
- saturated: `--backlog` lines already in the file when the agent starts (what it does on a
  first install or after an outage): lines/s from start to the last delivery, and its CPU.
Writer, agent and sink share the machine's cores, so these are floors for the agent.

    .venv/bin/python bench/cluster_logs.py [--rate 2000] [--seconds 20] [--backlog 300000] [--json]
        [--without-json-parser] [--rounds N]

`--json` writes JSON-object lines of the same size instead (each becomes a map body).
`--without-json-parser` runs the agent without its JSON-body parse (the configuration before
JSON-object lines became map bodies), to measure what that parse costs on the same lines.
`--rounds N` measures only the steady phase, N paired rounds each running the agent with and
without the parse (in alternating order, each on a new container's file, so that the load of the
machine weighs on both alike), and prints the medians and every round's increase.

Prints a summary and writes bench/results/cluster_logs.json (`--json`: cluster_logs_json.json;
`--without-json-parser` adds `_without_json_parser` to the name, `--rounds` `_paired`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench import benchkit
from controller.runtime.kube import KubeClient
from controller.telemetry.agent_config import JSON_BODY, AgentSettings, build_agent
from envtest.cluster import FAKE_NODE, LocalCluster
from envtest.process import wait_until
from kube.kinds import PODS
from tests.support.otel import Collector, local_settings, running_sink

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("cluster_logs")
NAMESPACE = "bench"
# A typical application log line (about 120 bytes with the CRI prefix).
MESSAGE = 'level=info msg="request served" method=GET path=/api/items status=200 ms=3 seq='
# The same as a JSON object (`--json`): the sequence number closes it.
JSON_MESSAGE = '{"level":"info","msg":"request served","path":"/api/items","status":200,"seq":'


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


JSON_LINES = False  # --json
WITHOUT_JSON_PARSER = False  # --without-json-parser


def cri_lines(start: int, count: int) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    if JSON_LINES:
        return "".join(
            f"{stamp} stdout F {JSON_MESSAGE}{i}}}\n" for i in range(start, start + count)
        )
    return "".join(f"{stamp} stdout F {MESSAGE}{i}\n" for i in range(start, start + count))


def bound_pod(kube: KubeClient, name: str) -> str:
    """A Pod on the cluster's node: its UID names its log directory."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"nodeName": FAKE_NODE, "containers": [{"name": "app", "image": "app:bench"}]},
    }
    return str(kube.create(PODS, pod, NAMESPACE)["metadata"]["uid"])


def log_file(pods_dir: Path, pod: str, uid: str) -> Path:
    path = pods_dir / f"{NAMESPACE}_{pod}_{uid}" / "app" / "0.log"
    path.parent.mkdir(parents=True)
    return path


def agent(
    workdir: Path, sink_url: str, env: dict[str, str], without_parser: bool = False
) -> Collector:
    proxy = local_settings(sink_url, NAMESPACE)
    settings = AgentSettings(
        "lumigo-system",
        proxy=proxy,
        pods_dir=str(workdir / "pods"),
        state_dir=str(workdir / "state"),
    )
    run = workdir / "agent"
    run.mkdir(exist_ok=True)
    env = {**env, "K8S_NODE_NAME": FAKE_NODE, "LUMIGO_CLUSTER_TOKEN": "t_0123456789abcdef01234"}
    config = build_agent(settings)
    if without_parser or WITHOUT_JSON_PARSER:
        without_json_body(config)
    # As render_agent writes it.
    text = yaml.safe_dump(config, sort_keys=True, width=1000)
    return Collector(text, run, proxy.health_port, env)


def without_json_body(config: dict[str, Any]) -> None:
    """The agent's configuration without the parse that turns JSON-object lines into maps."""
    filelog = config["receivers"]["filelog"]
    filelog["operators"] = [o for o in filelog["operators"] if o.get("id") != "json-body"]
    pipeline = config["service"]["pipelines"]["logs/container-files"]
    pipeline["processors"] = [p for p in pipeline["processors"] if p != JSON_BODY]
    config["processors"].pop(JSON_BODY, None)


def paired(cluster: LocalCluster, sink: Any, kube: KubeClient, args: Any) -> dict[str, Any]:
    """`--rounds`: the steady phase with and without the parse, alternating, on new files."""
    rounds: list[dict[str, Any]] = []
    for n in range(args.rounds):
        shares: dict[str, float] = {}
        rss: dict[str, float] = {}
        order = (False, True) if n % 2 == 0 else (True, False)
        for without in order:
            with tempfile.TemporaryDirectory() as tmp:
                workdir = Path(tmp)
                (workdir / "pods").mkdir()
                collector = agent(workdir, sink.url, cluster.env(), without).start()
                try:
                    assert collector.popen is not None
                    time.sleep(3)
                    name = f"r{n}-{'without' if without else 'with'}"
                    path = log_file(workdir / "pods", name, bound_pod(kube, name))
                    run = steady(path, sink, collector.popen.pid, args.rate, args.seconds)
                    key = "without" if without else "with"
                    shares[key] = run["cpu_share_of_one_core"]
                    rss[key] = round(collector.rss_kib()[0] / 1024, 1)
                finally:
                    collector.stop()
        increase = round(100 * (shares["with"] / shares["without"] - 1), 1)
        rounds.append({"cpu": shares, "rss_mib": rss, "increase_percent": increase})
        print(f"round {n}: {rounds[-1]}", flush=True)
    return {
        "rate_lines_per_s": args.rate,
        "seconds": args.seconds,
        "rounds": rounds,
        "median_cpu_without": statistics.median(r["cpu"]["without"] for r in rounds),
        "median_cpu_with": statistics.median(r["cpu"]["with"] for r in rounds),
        "median_increase_percent": statistics.median(r["increase_percent"] for r in rounds),
        "increase_range_percent": [
            min(r["increase_percent"] for r in rounds),
            max(r["increase_percent"] for r in rounds),
        ],
        "median_rss_mib_without": statistics.median(r["rss_mib"]["without"] for r in rounds),
        "median_rss_mib_with": statistics.median(r["rss_mib"]["with"] for r in rounds),
    }


def steady(path: Path, sink: Any, pid: int, rate: int, seconds: float) -> dict[str, Any]:
    """Append `rate` lines per second in 10 slices a second; measure the agent meanwhile."""
    base = sink.logs_received
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    written, slice_lines = 0, max(rate // 10, 1)
    with path.open("a") as out:
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * rate) + slice_lines
            if written < due:
                out.write(cri_lines(written, due - written))
                out.flush()
                written = due
            time.sleep(0.1)
    cpu = cpu_seconds(pid) - cpu_before
    duration = time.monotonic() - started
    lag = written - (sink.logs_received - base)
    wait_until(lambda: sink.logs_received - base >= written, 120, "the steady lines delivered")
    return {
        "rate_lines_per_s": rate,
        "written": written,
        "cpu_share_of_one_core": round(cpu / duration, 3),
        "lag_lines_at_end": lag,
        "drain_s_after_end": round(time.monotonic() - started - duration, 2),
    }


def single(cluster: LocalCluster, sink: Any, kube: KubeClient, args: Any) -> dict[str, Any]:
    """Idle, steady and saturated figures of one agent configuration."""
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "pods").mkdir()
        # Steady: the agent runs first, then one container writes at a fixed rate.
        collector = agent(workdir, sink.url, cluster.env()).start()
        try:
            assert collector.popen is not None
            pid = collector.popen.pid
            time.sleep(3)
            figures["idle_rss_mib"] = round(collector.rss_kib()[0] / 1024, 1)
            path = log_file(workdir / "pods", "steady", bound_pod(kube, "steady"))
            figures["steady"] = steady(path, sink, pid, args.rate, args.seconds)
            rss, peak = collector.rss_kib()
            figures["steady"].update(
                rss_mib=round(rss / 1024, 1), peak_rss_mib=round(peak / 1024, 1)
            )
        finally:
            collector.stop()
        # Saturated: a backlog waiting in a new container's file when the agent starts.
        path = log_file(workdir / "pods", "backlog", bound_pod(kube, "backlog"))
        with path.open("w") as out:
            for start in range(0, args.backlog, 10_000):
                out.write(cri_lines(start, min(10_000, args.backlog - start)))
        base = sink.logs_received
        collector = agent(workdir, sink.url, cluster.env())
        started = time.monotonic()
        collector.start()
        try:
            assert collector.popen is not None
            wait_until(lambda: sink.logs_received - base >= args.backlog, 600, "the backlog")
            took = time.monotonic() - started
            cpu = cpu_seconds(collector.popen.pid)
            rss, peak = collector.rss_kib()
        finally:
            collector.stop()
        figures["saturated"] = {
            "lines": args.backlog,
            "bytes": path.stat().st_size,
            "seconds": round(took, 2),
            "lines_per_s": round(args.backlog / took),
            "mib_per_s": round(path.stat().st_size / took / 2**20, 2),
            "cpu_cores": round(cpu / took, 2),
            "rss_mib": round(rss / 1024, 1),
            "peak_rss_mib": round(peak / 1024, 1),
        }
        figures["duplicates"] = sink.logs_received - (base + args.backlog)
    return figures


def _arguments() -> argparse.Namespace:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--rate", type=int, default=2000, help="lines/s of the steady phase")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--backlog", type=int, default=300_000, help="lines of the saturated phase")
    parser.add_argument("--json", action="store_true", help="JSON-object lines (map bodies)")
    parser.add_argument(
        "--without-json-parser",
        action="store_true",
        help="the agent without its JSON-body parse (every line stays a string)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="paired rounds of the steady phase with and without the parse (nothing else)",
    )
    return parser.parse_args()


def main() -> int:
    args = _arguments()
    global JSON_LINES, WITHOUT_JSON_PARSER
    JSON_LINES, WITHOUT_JSON_PARSER = args.json, args.without_json_parser

    figures: dict[str, Any] = {
        "lines": "json" if args.json else "text",
        "json_parser": not args.without_json_parser,
    }
    with LocalCluster() as cluster, running_sink(count_only=True) as sink:
        kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
        cluster.kubectl("create", "namespace", NAMESPACE)
        if args.rounds:
            figures["paired"] = paired(cluster, sink, kube, args)
        else:
            figures.update(single(cluster, sink, kube, args))
    figures["machine"] = {
        **benchkit.machine(),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }
    name = "cluster_logs" + ("_json" if args.json else "")
    name += "_without_json_parser" if args.without_json_parser else ""
    name += "_paired" if args.rounds else ""
    results = RESULTS.with_name(f"{name}.json")
    benchkit.save(results, figures)
    for key, value in figures.items():
        print(f"{key:14} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
