#!/usr/bin/env bash
# Play the rendered Helm chart on podman (docs/cluster.md, "Playing the chart"): build the images (docker/build.sh,
# cached), render deploy/helm/rlfleet with deploy/values/play-cpu.yaml, play what it renders (tests/cluster/play/),
# operate on the run as users do, and print held-out before/after, each event's recovery and the ledger; then tear
# everything down (containers, network, volumes; logs stay in the work folder).
#   bash scripts/chart_play.sh [--ops scale,kill-buffer,kill-rollout,restart-trainer,partition] [--set KEY=VALUE]...
#                              [--work DIR] [--values FILE] [--no-build]
# --ops '' plays the run with no operation. TAG (default: the chart's appVersion) names the images built and played.
# Needs root, podman, runc and iptables (scripts/install_system_tools.sh) and the dev venv (.venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
TAG=${TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/rlfleet/Chart.yaml)}
build=1
args=()
for a in "$@"; do
  if [[ "$a" == --no-build ]]; then build=0; else args+=("$a"); fi
done
if [[ "$build" == 1 ]]; then
  log=$(mktemp)
  for only in buffer weight-sync cpu redis; do         # the images the CPU values play (cpu: trainer and rollout)
    TAG="$TAG" bash docker/build.sh --engine podman --only "$only" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
    grep '^build.sh:' "$log" || true
  done
  rm -f "$log"
fi
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/docker/podman/containers.conf}"
exec env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m tests.cluster.play \
  --set image.tag="$TAG" --set redis.image="localhost/rlfleet-redis:$TAG" ${args[@]+"${args[@]}"}
