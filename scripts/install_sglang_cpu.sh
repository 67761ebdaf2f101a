#!/usr/bin/env bash
# .venv-sglang: SGLang 0.5.23 on CPU, for the `sglang` tests and the engine bench, from its lock
# (locks/sglang-cpu.txt: torch 2.13.0's CPU build and sglang's light dependencies, a closure installed --no-deps; a
# plain `pip install sglang` pulls a CUDA torch and ~200 packages). A no-op when the venv already holds exactly that
# lock; a venv a killed set-up left half-made is rebuilt. rlfleet never imports sglang: it starts
# `$VENV/bin/python -m sglang.launch_server` as a subprocess and talks to it over HTTP. torchvision and sgl_kernel
# cannot load on CPU; the tests put an import stub for them on PYTHONPATH (tests/support/sglang_stub).
#   bash scripts/install_sglang_cpu.sh            # -> .venv-sglang (SGLANG_VENV overrides)
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/venv_from_lock.sh "${SGLANG_VENV:-.venv-sglang}" locks/sglang-cpu.txt
