"""A real forward proxy (Debian's tinyproxy) and a firewall rule that leaves it the only way to an
upstream: the egress tests' corporate network, on this machine only."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from envtest.process import free_port, wait_until

NFT_TABLE = "lumigo_egress_test"
# An address of this machine that is not the node's: NO_PROXY lists the node's own IP (the
# agent's kubelet), which must not also be the upstream's. TEST-NET-2, never routed anywhere.
UPSTREAM_ADDRESS = "198.51.100.10"


@dataclass(frozen=True)
class ForwardProxy:
    url: str
    log: Path

    def connects(self, host: str, port: int) -> int:
        """How many CONNECT tunnels it opened to host:port."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count(f"CONNECT {host}:{port} ")


@contextlib.contextmanager
def tinyproxy(listen: str, connect_ports: tuple[int, ...], workdir: Path) -> Iterator[ForwardProxy]:
    """tinyproxy on listen:<free port>, allowing CONNECT to those ports only."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / "tinyproxy.log"
    conf = workdir / "tinyproxy.conf"
    lines = [f"Port {port}", f"Listen {listen}", "Timeout 60", "MaxClients 64",
             "LogLevel Connect", f'LogFile "{log}"', "DisableViaHeader Yes"]  # fmt: skip
    lines += [f"ConnectPort {p}" for p in connect_ports]
    conf.write_text("\n".join(lines) + "\n")
    process = subprocess.Popen(
        ["tinyproxy", "-d", "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "tinyproxy.stderr").open("w"),
    )
    try:
        wait_until(lambda: _accepts(listen, port), 20, "tinyproxy listening")
        yield ForwardProxy(f"http://{listen}:{port}", log)
    finally:
        process.terminate()
        process.wait(10)


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def reachable_only_locally(address: str, port: int) -> Iterator[None]:
    """Drop every packet to address:port that does not come from this machine itself (pods
    arrive through their bridge; the forward proxy, a local process, through loopback)."""
    rules = (
        f"add table inet {NFT_TABLE}\n"
        f"add chain inet {NFT_TABLE} input {{ type filter hook input priority -5; }}\n"
        f"add rule inet {NFT_TABLE} input ip daddr {address} tcp dport {port}"
        ' iifname != "lo" drop\n'
    )
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE], check=False)


@contextlib.contextmanager
def upstream_address(address: str = UPSTREAM_ADDRESS) -> Iterator[str]:
    """`address` on this machine's loopback link while the block runs (this kernel has no dummy
    links): pods reach it through their node (their default route), as they would reach a host
    outside the cluster."""
    prefix = f"{address}/32"
    subprocess.run(["ip", "addr", "del", prefix, "dev", "lo"], check=False, capture_output=True)
    subprocess.run(["ip", "addr", "add", prefix, "dev", "lo"], check=True)
    try:
        yield address
    finally:
        subprocess.run(["ip", "addr", "del", prefix, "dev", "lo"], check=False)
