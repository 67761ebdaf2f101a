#!/usr/bin/env bash
# The project's two commands.
#   bash scripts/dev.sh run [rlfleet run options]   set up .venv, then run the addition example end to end
#   bash scripts/dev.sh test [pytest options]       set up .venv and test tools, then lint and run every test
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

setup_test_services() {
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
    setup_python
    setup_test_services
    export PATH="$VENV/bin:$PATH"
    "$PY" -m ruff check .
    "$PY" scripts/gen_protos.py --check
    exec "$PY" -m pytest -q -rs "$@"
    ;;
  *)
    echo "usage: bash scripts/dev.sh run|test [options]" >&2
    exit 2
    ;;
esac
