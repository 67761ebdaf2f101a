"""Does an image's Python environment hold everything its service imports? Run with the image's interpreter.

    python docker/import_check.py --entry rlfleet.services.buffer [--entry ...] [--walk rlfleet] [--root DIR]

Each --entry runs `python -m ENTRY --help` in a child process (the service's real start-up imports, with argparse's
exit). --walk imports every module of a package, and finds every name any of its files imports (inside functions
too: a feature's lazy import); a module may fail to import, and a name may be absent, only where one of
pyproject.toml's optional extras provides it (Megatron, NIXL, SGLang, dashboards, GGUF, the OpenAI client, the
Kubernetes client): anything else missing is a dependency the image lacks. Prints one line per problem and exits 1
when there is any. Used by tests/cluster/test_image_requirements.py on a fresh venv made from each image's lock,
and inside built images. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

# Distributions whose import name is not the distribution name with '-' as '_'.
_IMPORT_NAME = {"megatron-core": "megatron"}


def optional_modules(pyproject: Path) -> dict[str, str]:
    """Top-level import name -> the pyproject extra that provides it (the `test` extra is not an install option)."""
    extras = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
    found: dict[str, str] = {}
    for extra, reqs in extras.items():
        if extra == "test":
            continue
        for req in reqs:
            dist = req.split(";")[0].split("[")[0]
            for sep in "<>=!~ ":
                dist = dist.split(sep)[0]
            dist = dist.strip().lower()
            found.setdefault(_IMPORT_NAME.get(dist, dist.replace("-", "_")), extra)
    return found


def check_entry(entry: str, root: Path) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", entry, "--help"], cwd=root, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return [f"python -m {entry} --help exited {proc.returncode}: {' | '.join(tail)}"]
    return []


def imported_names(folder: Path) -> dict[str, str]:
    """Top-level name -> first file importing it, of every absolute import in the folder's sources, those inside
    functions included (a dependency imported only when a feature is used is still a dependency)."""
    names: dict[str, str] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                names.setdefault(top, str(path))
    return names


def check_walk(package: str, optional: dict[str, str]) -> list[str]:
    problems: list[str] = []
    top = importlib.import_module(package)
    own = package.split(".")[0]
    for name, where in sorted(imported_names(Path(top.__path__[0])).items()):
        if name == own or name in sys.stdlib_module_names or name in optional:
            continue
        if importlib.util.find_spec(name) is None:
            problems.append(f"{where} imports {name!r}, which is not installed (not an optional extra's package)")
    for info in pkgutil.walk_packages(top.__path__, prefix=f"{package}."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if missing not in optional:
                problems.append(f"import {info.name}: no module {exc.name!r} (not an optional extra's package)")
        except ImportError as exc:
            problems.append(f"import {info.name}: {exc}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entry", action="append", default=[], help="a module run as `python -m ENTRY --help`")
    parser.add_argument("--walk", action="append", default=[], help="a package whose every module must import")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the source tree (holds rlfleet/ and pyproject.toml)")
    ns = parser.parse_args(argv)
    sys.path.insert(0, str(ns.root))
    optional = optional_modules(ns.root / "pyproject.toml")
    problems = [p for entry in ns.entry for p in check_entry(entry, ns.root)]
    problems += [p for package in ns.walk for p in check_walk(package, optional)]
    for problem in problems:
        print(f"import_check: {problem}")
    if not problems:
        print(f"import_check: ok ({len(ns.entry)} entry points, {len(ns.walk)} packages walked)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
