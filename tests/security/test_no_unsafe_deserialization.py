"""CI check: no code in services/ or rlfleet/ deserializes attacker-writable bytes with a code-running loader.

Fails on pickle.load / pickle.loads / marshal.loads, torch.load without weights_only=True, yaml.load (safe_load is
fine), and the eval / exec builtins. An AST scan: comments and strings do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = [p for p in (ROOT / "rlfleet").rglob("*.py") if "rlfleet/v1" not in p.as_posix()]


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _weights_only_true(call: ast.Call) -> bool:
    return any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
               for k in call.keywords)


def findings(source: str, name: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Call):
            continue
        fn = _dotted(node.func)
        where = f"{name}:{node.lineno}"
        if fn in ("pickle.load", "pickle.loads", "cPickle.load", "cPickle.loads", "marshal.load", "marshal.loads",
                  "dill.load", "dill.loads", "yaml.load", "yaml.unsafe_load", "yaml.full_load"):
            out.append(f"{where}: {fn}")
        elif fn == "torch.load" and not _weights_only_true(node):
            out.append(f"{where}: torch.load without weights_only=True")
        elif isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
            out.append(f"{where}: {node.func.id}()")
    return out


def test_the_scan_catches_each_kind() -> None:
    bad = ("import pickle, torch, yaml\npickle.loads(b'')\ntorch.load('x')\ntorch.load('x', weights_only=False)\n"
           "yaml.load('a')\neval('1')\nexec('1')\n")
    assert len(findings(bad, "bad.py")) == 6
    good = "import torch, yaml\ntorch.load('x', weights_only=True)\nyaml.safe_load('a')\nmodel.eval()\n"
    assert findings(good, "good.py") == []


def test_no_unsafe_deserialization_in_service_code() -> None:
    assert len(SCANNED) > 50
    found = [f for p in SCANNED for f in findings(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "\n".join(found)
