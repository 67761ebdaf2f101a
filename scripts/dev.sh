#!/usr/bin/env bash
# The project's two commands.
#   bash scripts/dev.sh run [rlfleet run options]   set up .venv, then run the addition example end to end
#   bash scripts/dev.sh test [pytest options]       set up .venv and test tools, then lint, type-check and run every test
# Every Python package comes from a committed, hashed lock (locks/, docs/dependencies.md): .venv from locks/dev.txt
# (test) or locks/runtime.txt (run), .venv-sglang from locks/sglang-cpu.txt. A venv that does not hold exactly its
# lock (a killed set-up, an older lock, a package added by hand) is rebuilt: green here means green on a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RLFLEET_VENV:-.venv}
PY="$VENV/bin/python"

cmd=${1:-}
shift || true
case "$cmd" in
  run)
    bash scripts/venv_from_lock.sh "$VENV" locks/runtime.txt --editable --accept locks/dev.txt
    export PATH="$VENV/bin:$PATH"
    exec rlfleet run examples/addition/config.yaml "$@"
    ;;
  test)
    # .venv-sglang for the `sglang` tests (~2.5 min once; a no-op after): its own venv, so it installs while .venv,
    # the lint and the type check do; pytest waits for it
    mkdir -p build
    bash scripts/install_sglang_cpu.sh >build/install-sglang.log 2>&1 &
    sglang_setup=$!
    bash scripts/install_system_tools.sh
    echo "dev.sh: Redis, promtool, podman and debootstrap ready at ${SECONDS}s"
    # The `chart_play` tests' images: the local base (~2-5 min once: docker/base/build_base.sh) starts now, the
    # wheelhouse and the seven images (~6-10 min once; seconds when cached) once .venv's pip can fetch the wheels;
    # both overlap the set-up and checks below, and pytest waits for them
    bash docker/base/build_base.sh >build/image-base.log 2>&1 &
    bash scripts/venv_from_lock.sh "$VENV" locks/dev.txt --editable
    echo "dev.sh: .venv ready at ${SECONDS}s"
    PYTHON="$(realpath -s "$PY")" bash docker/build.sh --engine podman --base local --cuda-torch cpu >build/images.log 2>&1 &
    images_setup=$!
    export PATH="$VENV/bin:$PATH"
    "$PY" scripts/locks.py check                 # the locks satisfy pyproject.toml and agree with each other
    "$PY" -m ruff check .
    "$PY" scripts/gen_protos.py --check
    "$PY" scripts/gen_config_docs.py --check     # docs/config-reference.md and the chart schema match the config
    "$PY" -m mypy                              # the whole tree but the generated stubs (pyproject [tool.mypy])
    echo "dev.sh: lock, ruff, stub and config-doc checks, mypy done at ${SECONDS}s"
    if ! wait "$sglang_setup"; then
      cat build/install-sglang.log >&2
      echo "dev.sh: installing .venv-sglang failed (log above)" >&2
      exit 1
    fi
    cat build/install-sglang.log
    echo "dev.sh: .venv-sglang ready at ${SECONDS}s"
    if ! wait "$images_setup"; then
      cat build/image-base.log build/images.log >&2
      echo "dev.sh: building the images failed (logs above)" >&2
      exit 1
    fi
    grep -h 'built in' build/image-base.log build/images.log || true
    echo "dev.sh: images ready at ${SECONDS}s; pytest starts"
    exec "$PY" -m pytest -q -rs "$@"
    ;;
  *)
    echo "usage: bash scripts/dev.sh run|test [options]" >&2
    exit 2
    ;;
esac
