#!/usr/bin/env python3
"""`make release` figures: the time of a release to a registry on loopback (first run: empty
registry; second run: the same tars again), each image's compressed size, whether the second run
pushed the same digests (reproducibility), and `make verify-release`'s time.

The images must be built (`make images`) and cosign installed (`hack/install-tools release`);
their cold build times are separate figures (docs/releasing.md). Usage:
    .venv/bin/python bench/release.py
Writes bench/results/release.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import benchkit
from envtest.registry import LocalRegistry

RELEASE = benchkit.ROOT / "hack" / "release"
VERSION = "0.0.1-bench"


def release(registry: LocalRegistry, command: str, *args: str) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, str(RELEASE), command, "--registry", f"{registry.host}/bench",
         "--version", VERSION, "--auth-file", str(registry.auth_file),
         "--ca-file", str(registry.ca_file), *args],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return time.monotonic() - started


def main() -> int:
    benchkit.parser(__doc__).parse_args()
    figures: dict[str, Any] = {"machine": benchkit.machine()}
    with LocalRegistry() as registry, tempfile.TemporaryDirectory() as workdir:
        runs = []
        for number in (1, 2):
            out = Path(workdir) / f"run{number}"
            seconds = release(registry, "publish", "--out", str(out), "--key-dir", workdir)
            runs.append((seconds, json.loads((out / "release.json").read_text())))
        verify_seconds = release(registry, "verify", "--key", str(Path(workdir) / "cosign.pub"))
    first, second = runs[0][1]["images"], runs[1][1]["images"]
    figures.update(
        publish_seconds=[round(s, 1) for s, _ in runs],
        verify_seconds=round(verify_seconds, 1),
        images={
            name: {
                "index": image["digest"],
                "compressed_bytes": {
                    a: p["compressed_bytes"] for a, p in image["platforms"].items()
                },
                "same_digest_second_run": second[name]["digest"] == image["digest"],
            }
            for name, image in first.items()
        },
    )
    for name, image in figures["images"].items():
        mb = image["compressed_bytes"]["amd64"] / 1e6
        print(f"{name:20} {mb:7.1f} MB (amd64, compressed)  reproducible: "
              f"{image['same_digest_second_run']}  {image['index']}")  # fmt: skip
    print(f"publish: {figures['publish_seconds']} s (empty registry, then again); "
          f"verify: {figures['verify_seconds']} s")  # fmt: skip
    benchkit.save("release", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
