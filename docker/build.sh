#!/usr/bin/env bash
# Build (and optionally push) every rlfleet image, tagged as the Helm chart expects:
#   $REGISTRY/rlfleet-<role>:$TAG            buffer, weight-sync, controller
#   $REGISTRY/rlfleet-<role>-<variant>:$TAG  trainer and rollout, variant cpu or cuda (chart value image.variant)
# Usage: docker/build.sh [--push] [--only ROLE] [--platform linux/amd64]
#   REGISTRY (default ghcr.io/rlfleet) and TAG (default: the chart's appVersion) come from the environment.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REGISTRY="${REGISTRY:-ghcr.io/rlfleet}"
TAG="${TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/deploy/helm/rlfleet/Chart.yaml")}"
PUSH=0
ONLY=""
PLATFORM="linux/amd64"
DRY_RUN="${DRY_RUN:-0}"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --push) PUSH=1; shift ;;
    --only) ONLY="$2"; shift 2 ;;
    --platform) PLATFORM="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

# Dockerfile (in docker/) -> image name
IMAGES=(
  "buffer.Dockerfile rlfleet-buffer"
  "weight-sync.Dockerfile rlfleet-weight-sync"
  "controller.Dockerfile rlfleet-controller"
  "trainer-cpu.Dockerfile rlfleet-trainer-cpu"
  "trainer-cuda.Dockerfile rlfleet-trainer-cuda"
  "rollout-cpu.Dockerfile rlfleet-rollout-cpu"
  "rollout-cuda.Dockerfile rlfleet-rollout-cuda"
)

for entry in "${IMAGES[@]}"; do
  read -r dockerfile image <<<"$entry"
  if [[ -n "$ONLY" && "$image" != *"$ONLY"* ]]; then
    continue
  fi
  ref="$REGISTRY/$image:$TAG"
  cmd=(docker buildx build --platform "$PLATFORM" -f "$ROOT/docker/$dockerfile" -t "$ref"
       --label "org.opencontainers.image.version=$TAG"
       --label "org.opencontainers.image.revision=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)")
  if [[ "$PUSH" == 1 ]]; then cmd+=(--push); else cmd+=(--load); fi
  cmd+=("$ROOT")
  echo "+ ${cmd[*]}"
  if [[ "$DRY_RUN" != 1 ]]; then
    "${cmd[@]}"
  fi
done
