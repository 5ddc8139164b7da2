"""What every benchmark shares: its argument parser, the machine it ran on, and where its figures
are written (bench/results/<name>.json, the file README's figures cite)."""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The script's argument parser, described by the first paragraph of its docstring."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: CPUs, their model, Python, the platform, the load."""
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_before": os.getloadavg(),
    }


def results_file(name: str) -> Path:
    return RESULTS_DIR / f"{name}.json"


def save(where: str | Path, figures: Any) -> Path:
    """Write `figures` as JSON to bench/results/<where>.json (or the path `where`), say where."""
    path = where if isinstance(where, Path) else results_file(where)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return path
