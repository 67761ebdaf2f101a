#!/usr/bin/env bash
# A separate venv with SGLang 0.5.23 for CPU, for the `sglang` tests and the engine bench. Idempotent: a no-op when
# the venv already holds exactly this requirements file. rlfleet never imports sglang: it starts
# `$VENV/bin/python -m sglang.launch_server` as a subprocess and talks to it over HTTP.
#   bash scripts/install_sglang_cpu.sh            # -> .venv-sglang (SGLANG_VENV overrides)
# Recipe: torch held at 2.13.0 (the CPU build), then sglang and its light dependencies with --no-deps (a plain
# `pip install sglang` pulls a CUDA torch and ~200 packages). torchvision and sgl_kernel cannot load on CPU; the tests
# put an import stub for them on PYTHONPATH (tests/support/sglang_stub), never installed into the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGLANG_VENV:-.venv-sglang}
REQS=scripts/sglang-cpu-requirements.txt
STAMP="$VENV/.installed-$(sha256sum "$REQS" | cut -c1-16)"
PY="$VENV/bin/python"

if [ -f "$STAMP" ] && "$PY" -c "import importlib.metadata as m; assert m.version('sglang') == '0.5.23'" 2>/dev/null; then
  exit 0
fi
start=$(date +%s)
if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q --no-deps -r "$REQS"
"$PY" -c "import importlib.metadata as m; assert m.version('sglang') == '0.5.23', m.version('sglang')"
rm -f "$VENV"/.installed-*
touch "$STAMP"
echo "install_sglang_cpu: $VENV ready in $(( $(date +%s) - start ))s"
