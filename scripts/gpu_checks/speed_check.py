"""Device-machine check for issue 15: the engine bench and rlfleet-vs-TRL in their GPU modes, one script.

    python scripts/gpu_checks/speed_check.py [--steps 30] [--skip-trl]

1. bench/engine_decode.py on CUDA in bf16 at batch 64 (fast decode, HF-modules path, compiled, HF generate).
2. bench/vs_trl.py --gpu on the addition example (TRL needs its own venv there: RLFLEET_TRL_PYTHON; --skip-trl
   without it). Prints what the benches print; exits non-zero if one fails. Not run where no GPU was lent.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip-trl", action="store_true")
    a = p.parse_args()
    engine = [sys.executable, str(ROOT / "bench/engine_decode.py"), "--device", "cuda", "--dtype", "bfloat16",
              "--prompts", "64", "--new-tokens", "64", "--hidden", "128", "--layers", "4", "--compile"]
    vs = [sys.executable, str(ROOT / "bench/vs_trl.py"), "--gpu", "--steps", str(a.steps)] + \
        (["--skip-trl"] if a.skip_trl else [])
    rc = 0
    for cmd in (engine, vs):
        print("$", " ".join(cmd), flush=True)
        rc |= subprocess.run(cmd, cwd=str(ROOT)).returncode
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
