"""Shared helpers for the eval tests: the CLI module (the shared data directory: tests/shared_data.py)."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_script(name: str):
    """Import ``experiments/<name>.py`` as a module (experiments/ is not a package)."""
    path = REPO / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_experiments_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
