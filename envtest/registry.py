"""A real OCI registry for the tests: the CNCF distribution registry (Debian's `docker-registry`),
serving HTTPS with a certificate from a private CA, behind htpasswd (bcrypt) basic auth, its
storage in a temporary directory, on loopback.

Why real: a user's cluster pulls the product's images from a registry, with TLS verification and
credentials from `imagePullSecrets`; importing tars into containerd skips all of that. The local
node's containerd runs in this machine's network namespace, so it reaches 127.0.0.1; trust in the
CA is given per node (`LocalNode.trust_registry`), credentials only through pull Secrets.

    with LocalRegistry() as registry:
        digest = registry.push(Path("image.tar"), "lumigo/busybox", "1")   # "sha256:..."
        registry.ref("lumigo/busybox", digest=digest)   # "127.0.0.1:PORT/lumigo/busybox@sha256:..."
        registry.pull_secret("regcred")                 # a kubernetes.io/dockerconfigjson Secret

    python -m envtest.registry up     # run one until Ctrl-C (prints host, user, CA and auth file)

Other tools reach it with `ca_file` (skopeo/oras `--*cert-dir=cert_dir`, helm `--ca-file`) and
`auth_file` (a containers-auth / docker `config.json`: skopeo `--authfile`, helm
`--registry-config`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from envtest.cluster import sweep_stale_workdirs
from envtest.process import Process, free_port, wait_for_a_stop_signal, wait_healthy
from kube import certs

REGISTRY_BINARY = Path("/usr/bin/docker-registry")  # Debian's package of CNCF distribution
INSTALL_HINT = (
    "run `hack/install-system-deps` (Debian packages docker-registry, skopeo, apache2-utils)"
)
USERNAME = "lumigo-test"
WORKDIR_PREFIX = "lumigo-registry-"
_HTTP_UNAUTHORIZED = 401


class RegistryError(RuntimeError):
    """A registry that cannot start, or a push it refused (the message has the tool's output)."""


class LocalRegistry:
    """One registry process; a context manager like envtest's other components."""

    def __init__(self, workdir: Path | None = None, host: str = "127.0.0.1") -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        self.port = free_port()
        self.address = host
        self.username = USERNAME
        self.password = secrets.token_urlsafe(24)
        self.process: Process | None = None

    # -- what clients need --------------------------------------------------------------------
    @property
    def host(self) -> str:
        """`127.0.0.1:PORT`: the registry part of an image reference (and the certs.d name)."""
        return f"{self.address}:{self.port}"

    @property
    def cert_dir(self) -> Path:
        """Holds only `ca.crt`: skopeo's `--src-cert-dir`/`--dest-cert-dir`."""
        return self.workdir / "trust"

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / "ca.crt"

    @property
    def ca_pem(self) -> bytes:
        return self.ca_file.read_bytes()

    @property
    def auth_file(self) -> Path:
        """A docker `config.json` with this registry's credentials (skopeo --authfile)."""
        return self.workdir / "auth.json"

    def ref(self, repository: str, tag: str | None = None, digest: str | None = None) -> str:
        """`host/repository:tag` or `host/repository@digest`."""
        if digest is not None:
            return f"{self.host}/{repository}@{digest}"
        return f"{self.host}/{repository}:{tag or 'latest'}"

    def dockerconfigjson(self, password: str | None = None) -> dict[str, Any]:
        """What a `kubernetes.io/dockerconfigjson` Secret holds, for this registry only (with
        another `password`: credentials it refuses, for tests of that)."""
        password = self.password if password is None else password
        token = base64.b64encode(f"{self.username}:{password}".encode()).decode()
        entry = {"username": self.username, "password": password, "auth": token}
        return {"auths": {self.host: entry}}

    def pull_secret(
        self, name: str, namespace: str | None = None, *, password: str | None = None
    ) -> dict[str, Any]:
        """A Secret manifest for `imagePullSecrets` (apply it with kubectl)."""
        payload = json.dumps(self.dockerconfigjson(password)).encode()
        metadata: dict[str, str] = {"name": name}
        if namespace is not None:
            metadata["namespace"] = namespace
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(payload).decode()},
        }

    # -- pushing ------------------------------------------------------------------------------
    def push(self, archive: Path, repository: str, tag: str) -> str:
        """Push a docker-archive tar (what build/images/manifest.json lists); its manifest
        digest (`sha256:...`) as the registry stores it."""
        return self.copy(f"docker-archive:{archive}", repository, tag)

    def copy(self, source: str, repository: str, tag: str, *, all_images: bool = False) -> str:
        """`skopeo copy` from any skopeo transport (`oci-archive:`, `oci:`, `docker-archive:`,
        or `docker://` of this registry) to `repository:tag` here; the pushed digest.
        `all_images` keeps a multi-arch index whole (else only this machine's image)."""
        digest_file = self.workdir / f"digest-{secrets.token_hex(4)}"
        args = ["copy", "--quiet", "--digestfile", str(digest_file)]
        args += ["--all"] if all_images else []
        args += ["--dest-cert-dir", str(self.cert_dir), "--dest-authfile", str(self.auth_file)]
        if source.startswith("docker://"):
            args += ["--src-cert-dir", str(self.cert_dir), "--src-authfile", str(self.auth_file)]
        self.skopeo(*args, source, f"docker://{self.ref(repository, tag)}")
        try:
            return digest_file.read_text().strip()
        finally:
            digest_file.unlink(missing_ok=True)

    def skopeo(self, *args: str) -> str:
        """Run skopeo with this registry's signature policy (accept: the images are ours)."""
        cmd = ["skopeo", "--policy", str(self.workdir / "policy.json"), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        except FileNotFoundError:
            raise RegistryError(f"skopeo is missing: {INSTALL_HINT}") from None
        if proc.returncode != 0:
            raise RegistryError(f"skopeo {' '.join(args)} failed:\n{proc.stderr.strip()}")
        return proc.stdout

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> LocalRegistry:
        if not REGISTRY_BINARY.exists() or shutil.which("htpasswd") is None:
            raise RegistryError(f"{REGISTRY_BINARY} or htpasswd is missing: {INSTALL_HINT}")
        sweep_stale_workdirs(WORKDIR_PREFIX)  # storage and keys of a SIGKILLed run
        try:
            config = self._write_files()
            self.process = Process(
                "registry",
                [str(REGISTRY_BINARY), "serve", str(config)],
                self.workdir / "registry.log",
                missing_hint=INSTALL_HINT,
            )
            self.process.start()
            wait_healthy(self.process, self._answers, 30, RegistryError)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the process and remove its storage and keys; idempotent."""
        if self.process is not None:
            self.process.stop()
            self.process = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def report(self) -> str:
        return self.process.report() if self.process is not None else "registry: not started"

    def _write_files(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cert_dir.mkdir(exist_ok=True)
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        now = dt.datetime.now(dt.UTC)
        policy = certs.CertPolicy(
            service="registry",
            namespace="local",
            ca_validity=dt.timedelta(days=2),
            serving_validity=dt.timedelta(days=1),
            ca_lookahead=dt.timedelta(hours=2),
            serving_lookahead=dt.timedelta(minutes=30),
            extra_dns_names=("localhost",),
            extra_ip_addresses=(self.address,),
        )
        ca = certs.generate_ca(policy, now, common_name="lumigo-test-registry-ca")
        serving = certs.issue_serving(ca, policy, now)
        self.ca_file.write_bytes(ca.cert_pem)
        (self.workdir / "tls.crt").write_bytes(serving.cert_pem)
        key = self.workdir / "tls.key"
        key.write_bytes(serving.key_pem)
        key.chmod(0o600)
        htpasswd = subprocess.run(
            ["htpasswd", "-niB", self.username],  # -B: bcrypt, the only scheme it accepts
            input=self.password,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (self.workdir / "htpasswd").write_text(htpasswd)
        self.auth_file.write_text(json.dumps(self.dockerconfigjson()))
        self.auth_file.chmod(0o600)
        (self.workdir / "policy.json").write_text(
            json.dumps({"default": [{"type": "insecureAcceptAnything"}]})
        )
        config = self.workdir / "config.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "version": 0.1,
                    "log": {"level": "info", "accesslog": {"disabled": True}},
                    "storage": {
                        "filesystem": {"rootdirectory": str(self.workdir / "storage")},
                        "delete": {"enabled": True},
                    },
                    "http": {
                        "addr": self.host,
                        "tls": {
                            "certificate": str(self.workdir / "tls.crt"),
                            "key": str(key),
                        },
                    },
                    "auth": {
                        "htpasswd": {"realm": "lumigo-test", "path": str(self.workdir / "htpasswd")}
                    },
                },
                indent=2,
            )
        )
        return config

    def _answers(self) -> bool:
        """`/v2/` answers 401 without credentials: up, serving TLS, and enforcing auth."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            urllib.request.urlopen(f"https://{self.host}/v2/", timeout=2, context=context)
        except urllib.error.HTTPError as err:
            return err.code == _HTTP_UNAUTHORIZED
        return False


def main() -> int:
    if sys.argv[1:] != ["up"]:
        print("usage: python -m envtest.registry up", file=sys.stderr)
        return 2
    with LocalRegistry() as registry:
        print(f"registry {registry.host} user {registry.username}", flush=True)
        print(f"  CA {registry.ca_file}  auth file {registry.auth_file}", flush=True)
        wait_for_a_stop_signal()
    return 0


if __name__ == "__main__":
    sys.exit(main())
