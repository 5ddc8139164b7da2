"""Import a hack/ script (a Python file without .py suffix) to call its functions in a test."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def hack_script(name: str) -> ModuleType:
    """hack/<name> as a module named like it (`-` -> `_`), registered in sys.modules because
    dataclasses look their module up there."""
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(ROOT / "hack" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module
    loader.exec_module(module)
    return module
