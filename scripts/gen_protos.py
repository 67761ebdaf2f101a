"""Regenerate the committed gRPC stubs in rlfleet/v1/ from proto/rlfleet/v1/*.proto.

Usage: python scripts/gen_protos.py [--check]   (--check: exit 1 when the committed stubs are stale)

The generator (grpcio-tools, with its protoc) is pinned by locks/dev.txt, so --check compares byte for byte: the
stubs carry the generator's version stamps, which set the oldest grpcio/protobuf they import under (scripts/locks.py
check holds pyproject.toml's floors to them). A stale stub whose code is unchanged and only the stamps moved means
the generator moved without `python scripts/locks.py refresh` (which regenerates them): the message says so.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "proto"
OUT_PACKAGE = Path("rlfleet") / "v1"


def generate(out_root: Path) -> list[Path]:
    protos = sorted((PROTO_DIR / "rlfleet" / "v1").glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out_root}", f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}"] + [str(p) for p in protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    pkg = out_root / OUT_PACKAGE
    doc = '"""Generated gRPC stubs for rlfleet.v1 (scripts/gen_protos.py). Do not edit."""\n'
    (pkg / "__init__.py").write_text(doc)
    return sorted(p for p in pkg.iterdir() if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    ns = parser.parse_args()
    if not ns.check:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [f.name for f in fresh if not (ROOT / OUT_PACKAGE / f.name).exists()
                 or not filecmp.cmp(f, ROOT / OUT_PACKAGE / f.name, shallow=False)]
        committed = {p.name for p in (ROOT / OUT_PACKAGE).iterdir() if p.is_file()}
        extra = sorted(committed - {f.name for f in fresh})
        committed_dir, fresh_dir = ROOT / OUT_PACKAGE, Path(tmp) / OUT_PACKAGE
        stamps_only = [name for name in stale if (committed_dir / name).exists()
                       and _without_stamps(fresh_dir / name) == _without_stamps(committed_dir / name)]
    if stale or extra:
        print(f"stale generated stubs: {stale} extra: {extra}; run python scripts/gen_protos.py", file=sys.stderr)
        if stamps_only and len(stamps_only) == len(stale):
            print("only the generator's version stamps differ: this grpcio-tools is not the locked one (run bash "
                  "scripts/dev.sh test, which rebuilds .venv from locks/dev.txt, or python scripts/locks.py refresh "
                  "after changing the lock)", file=sys.stderr)
        return 1
    return 0


_STAMP = re.compile(r"^(GRPC_GENERATED_VERSION = .*|# Protobuf Python Version: .*|\s+\d+,)$", re.M)


def _without_stamps(path: Path) -> str:
    """A stub's text with the generator's version stamps blanked (the version lines and the runtime-check numbers)."""
    return _STAMP.sub("", path.read_text())


if __name__ == "__main__":
    raise SystemExit(main())
