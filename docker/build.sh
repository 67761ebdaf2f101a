#!/usr/bin/env bash
# Build every rlfleet image, tagged as the Helm chart expects:
#   $REGISTRY/rlfleet-<role>:$TAG            buffer, weight-sync, controller
#   $REGISTRY/rlfleet-<role>-<variant>:$TAG  trainer and rollout, variant cpu or cuda (chart value image.variant)
#   $REGISTRY/rlfleet-redis:$TAG             a stand-in for the chart's redis.image (docker/stand-ins/redis.Dockerfile)
# Usage: docker/build.sh [--engine podman|docker] [--base local|IMAGE] [--only NAME] [--cuda-torch cuda|cpu] [--push]
#   --engine      podman (default when installed; runs with docker/podman/containers.conf) or docker (buildx)
#   --base        the image every Dockerfile starts from (build argument BASE): `local` builds Debian bookworm with
#                 python3 here (docker/base/build_base.sh, cached) -- the default where debootstrap is installed --,
#                 else the public python:3.11.9-slim-bookworm
#   --only NAME   only images whose name contains NAME
#   --cuda-torch  cuda (default): the CUDA images install locks/image-cuda.txt as locked. cpu: they install it with
#                 the runtime lock's CPU torch in place of the CUDA torch and its nvidia-*/cuda-*/triton wheels, for
#                 machines without the CUDA wheels or a GPU (the image then checks everything but CUDA; never push it)
#   --push        push after building (REGISTRY must then be set)
#   REGISTRY (default localhost) and TAG (default: the chart's appVersion) come from the environment; DRY_RUN=1
#   prints the build commands only.
# Every image installs from a wheelhouse made on the host from its lock (docker/wheelhouse.sh, cached by the lock's
# hash) and passed to the build as an image (build argument WHEELS, a stage the install bind-mounts): nothing is
# fetched inside a build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REGISTRY="${REGISTRY:-localhost}"
TAG="${TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/deploy/helm/rlfleet/Chart.yaml")}"
PUSH=0
ONLY=""
CUDA_TORCH=cuda
DRY_RUN="${DRY_RUN:-0}"
BASE="${BASE:-}"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --engine) ENGINE="$2"; shift 2 ;;
    --base) BASE="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --cuda-torch) CUDA_TORCH="$2"; shift 2 ;;
    --push) PUSH=1; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=engine.sh
source "$ROOT/docker/engine.sh"
[[ "$CUDA_TORCH" == cuda || "$CUDA_TORCH" == cpu ]] || { echo "--cuda-torch is cuda or cpu" >&2; exit 2; }
if [[ "$PUSH" == 1 && ( "$REGISTRY" == localhost || "$CUDA_TORCH" == cpu ) ]]; then
  echo "--push needs REGISTRY set to your registry, and CUDA images with their CUDA torch (--cuda-torch cuda)" >&2
  exit 2
fi
if [[ -z "$BASE" ]]; then
  if command -v debootstrap >/dev/null; then BASE=local; else BASE=python:3.11.9-slim-bookworm; fi
fi

run() {
  echo "+ $*"
  if [[ "$DRY_RUN" != 1 ]]; then "$@"; fi
}

if [[ "$BASE" == local ]]; then
  if [[ "$DRY_RUN" == 1 ]]; then BASE="$(bash "$ROOT/docker/base/build_base.sh" --print-ref)"
  else BASE="$(bash "$ROOT/docker/base/build_base.sh" | tail -1)"; fi
fi

# The wheelhouse of a set of locks, as an image holding /wheels (made once per lock content; reused after)
wheels_image() {
  local key dir ref
  key="$(bash "$ROOT/docker/wheelhouse.sh" --print-key "$@")"
  ref="localhost/rlfleet-wheelhouse:$key"
  if [[ "$DRY_RUN" == 1 ]] || "$ENGINE" image inspect "$ref" >/dev/null 2>&1; then echo "$ref"; return; fi
  dir="$(bash "$ROOT/docker/wheelhouse.sh" "$@")"
  printf 'FROM scratch\nCOPY . /wheels\n' >"$dir.Containerfile"
  "$ENGINE" build -q -f "$dir.Containerfile" -t "$ref" "$dir" >/dev/null
  rm -f "$dir.Containerfile"
  echo "$ref"
}

# Dockerfile (in docker/) -> image name, and the locks its wheelhouse holds
IMAGES=(
  "buffer.Dockerfile rlfleet-buffer cpu"
  "weight-sync.Dockerfile rlfleet-weight-sync cpu"
  "controller.Dockerfile rlfleet-controller cpu"
  "trainer-cpu.Dockerfile rlfleet-trainer-cpu cpu"
  "rollout-cpu.Dockerfile rlfleet-rollout-cpu cpu"
  "trainer-cuda.Dockerfile rlfleet-trainer-cuda cuda"
  "rollout-cuda.Dockerfile rlfleet-rollout-cuda cuda"
  "stand-ins/redis.Dockerfile rlfleet-redis none"     # the chart's Redis where redis:7.2.5-bookworm cannot be pulled
)
CPU_LOCKS=("$ROOT/locks/runtime.txt" "$ROOT/locks/controller.txt")
if [[ "$CUDA_TORCH" == cpu ]]; then
  CUDA_LOCKS=("$ROOT/build/images/image-cuda-cpu-torch.txt")
else
  CUDA_LOCKS=("$ROOT/locks/image-cuda.txt" "$ROOT/locks/sglang-cuda.txt")
fi

revision="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
base_id="$("$ENGINE" image inspect --format '{{.Id}}' "$BASE" 2>/dev/null || echo "$BASE")"
# Everything a build reads, hashed: the Dockerfile, the build arguments, and every file the context lets in
# (.dockerignore). An image labelled with the same hash is up to date and is not rebuilt (~0.2 s instead of the
# engine's ~7 s walk through its cached layers).
context_files="$(cd "$ROOT" && { ls locks/*.txt docker/*.py docker/stand-ins/redis-server .dockerignore
                                 find rlfleet examples -type f ! -path '*/__pycache__/*' ! -name '*.pyc'; } \
                 | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-64)"
inputs_key() {  # DOCKERFILE WHEELS
  { sha256sum <"$ROOT/docker/$1"; echo "$base_id $2 $CUDA_TORCH $TAG $context_files"; } | sha256sum | cut -c1-32
}
for entry in "${IMAGES[@]}"; do
  read -r dockerfile image kind <<<"$entry"
  if [[ -n "$ONLY" && "$image" != *"$ONLY"* ]]; then
    continue
  fi
  wheels=""
  if [[ "$kind" == cpu ]]; then
    wheels="$(wheels_image "${CPU_LOCKS[@]}")"
  elif [[ "$kind" == cuda ]]; then
    if [[ "$CUDA_TORCH" == cpu ]]; then    # the lock the Dockerfile makes under TORCH=cpu, made here for the wheels
      mkdir -p "$ROOT/build/images"
      python3 "$ROOT/docker/cpu_torch_lock.py" "$ROOT/locks/image-cuda.txt" "$ROOT/locks/runtime.txt" \
        >"$ROOT/build/images/image-cuda-cpu-torch.txt"
    fi
    wheels="$(wheels_image "${CUDA_LOCKS[@]}")"
  fi
  ref="$REGISTRY/$image:$TAG"
  key="$(inputs_key "$dockerfile" "$wheels")"
  if [[ "$DRY_RUN" != 1 && "$("$ENGINE" image inspect --format '{{index .Labels "org.rlfleet.inputs"}}' "$ref" \
                             2>/dev/null)" == "$key" ]]; then
    echo "build.sh: $ref is up to date" >&2
    if [[ "$PUSH" == 1 ]]; then run "$ENGINE" push "$ref"; fi
    continue
  fi
  if [[ "$ENGINE" == docker ]]; then cmd=(docker buildx build --platform linux/amd64 --load)
  else cmd=(podman build --layers --format docker); fi
  cmd+=(-f "$ROOT/docker/$dockerfile" -t "$ref" --build-arg "BASE=$BASE")
  [[ -z "$wheels" ]] || cmd+=(--build-arg "WHEELS=$wheels")
  cmd+=(--label "org.opencontainers.image.version=$TAG" --label "org.opencontainers.image.revision=$revision"
        --label "org.opencontainers.image.base.name=$BASE" --label "org.rlfleet.inputs=$key")
  [[ "$kind" == cuda ]] && cmd+=(--build-arg "TORCH=$CUDA_TORCH")
  cmd+=("$ROOT")
  start=$SECONDS
  run "${cmd[@]}"
  [[ "$DRY_RUN" == 1 ]] || echo "build.sh: $ref built in $((SECONDS - start)) s" >&2
  if [[ "$PUSH" == 1 ]]; then run "$ENGINE" push "$ref"; fi
done
