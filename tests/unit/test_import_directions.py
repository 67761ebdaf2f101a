"""The allowed import directions, read from the source with ast (every import, module level or inside a function):
- one import root: everything installed is the `rlfleet` package; its services are `rlfleet.services.<name>`;
- the SDK (rlfleet/ outside rlfleet/services/) imports no service: services depend on the SDK, never the reverse;
- a service imports another service only through the declared exception, the weight transport library
  (rlfleet/services/weight_sync/transports/, which trainer and rollout run in-process), and that library imports nothing
  of the weight_sync service around it;
- nothing installed (rlfleet/) imports examples/ (they are user code, found by config dotted paths);
- the optional speed code sits behind one door each: rlfleet/cpu_kernels/, rlfleet/services/trainer/fast_paths/ and
  rlfleet/services/rollout/engines/lean_llama/ are imported from outside only as the package itself (the names its
  `__init__` exports), never a module inside it, so what the core depends on is one list a GPU user can read;
- the module graph of rlfleet/ and examples/ has no cycle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rlfleet", "examples")
SERVICES = "rlfleet.services."
LIBRARY = "rlfleet.services.weight_sync.transports"
DOORS = ("rlfleet.cpu_kernels", "rlfleet.services.trainer.fast_paths", "rlfleet.services.rollout.engines.lean_llama")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = _module_name(path)
            if not name.startswith("rlfleet.v1"):                    # generated stubs import only protobuf/grpc
                found[name] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> Iterator[str]:
    """Every project module this file imports (`from a.b import c` is a.b.c when that is a module, else a.b)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES:
                yield target


GRAPH = {name: sorted(set(_imports(path))) for name, path in MODULES.items()}


def _service(module: str) -> str:
    return module.split(".")[2] if module.startswith(SERVICES) else ""


def _sdk(module: str) -> bool:
    """The SDK: every module of rlfleet/ but its services (and rlfleet.services, the folder that holds them)."""
    return module.startswith("rlfleet") and not module.startswith(SERVICES) and module != "rlfleet.services"


def test_the_sdk_imports_no_service_and_nothing_installed_imports_examples() -> None:
    bad = [(m, t) for m, ts in GRAPH.items() for t in ts
           if (_sdk(m) and t.startswith(SERVICES)) or
           (not m.startswith("examples") and t.startswith("examples"))]
    assert bad == []


def test_services_meet_only_through_the_transport_library() -> None:
    crossing = [(m, t) for m, ts in GRAPH.items() for t in ts
                if _service(m) and _service(t) and _service(m) != _service(t) and not t.startswith(LIBRARY)]
    assert crossing == []
    library_into_service = [(m, t) for m, ts in GRAPH.items() for t in ts
                            if m.startswith(LIBRARY) and t.startswith(SERVICES) and not t.startswith(LIBRARY)]
    assert library_into_service == []
    # the exception is used as declared: trainer and rollout both take their data planes from it
    users = {_service(m) for m, ts in GRAPH.items() for t in ts if t.startswith(LIBRARY) and not m.startswith(LIBRARY)}
    assert {"trainer", "rollout"} <= users


def _through_doors(graph: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(importer, module) pairs where code outside a door package imports a module inside it."""
    return [(m, t) for m, ts in graph.items() for t in ts for door in DOORS
            if t.startswith(door + ".") and not (m == door or m.startswith(door + "."))]


def test_speed_code_is_reached_only_through_its_door() -> None:
    door = DOORS[0]
    assert _through_doors({"rlfleet.services.x": [f"{door}.onednn"], f"{door}.onednn": [f"{door}.rms_norm"],
                           "rlfleet.services.y": [door]}) == [("rlfleet.services.x", f"{door}.onednn")]  # the check
    assert _through_doors(GRAPH) == []
    assert all(name in MODULES for name in DOORS)       # every door exists (a renamed folder fails here, not silently)


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or of one that imports itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, []):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_module_graph_has_no_cycle() -> None:
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]   # the check itself
    assert _cycles(GRAPH) == []


def test_one_import_root_is_installed() -> None:
    """What `pip install .` installs: the packages setuptools finds with the project's own find settings."""
    import tomllib

    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = find_packages(str(ROOT), include=find["include"], exclude=find.get("exclude", ()))
    assert {name.split(".")[0] for name in found} == {"rlfleet"}
    assert {"rlfleet.services.buffer", "rlfleet.services.trainer", "rlfleet.services.rollout",
            "rlfleet.services.weight_sync", "rlfleet.services.controller"} <= set(found)
    assert not (ROOT / "services").exists()
