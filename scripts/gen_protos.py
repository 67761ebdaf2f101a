"""Regenerate the committed gRPC stubs in rlfleet/v1/ from proto/rlfleet/v1/*.proto.

Usage: python scripts/gen_protos.py [--check]   (--check: exit 1 when the committed stubs are stale)
"""

from __future__ import annotations

import argparse
import filecmp
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
    if stale or extra:
        print(f"stale generated stubs: {stale} extra: {extra}; run python scripts/gen_protos.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
