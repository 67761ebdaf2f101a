# Sourced by rlfleet's image scripts (docker/build.sh, docker/base/build_base.sh, scripts/dev.sh): picks the container
# engine and points podman at the repository's containers.conf (docker/podman/containers.conf) unless the caller set
# CONTAINERS_CONF. Sets ENGINE (podman or docker) and exports CONTAINERS_CONF for podman.
#   ENGINE=podman|docker  (default: podman when installed, else docker)
# shellcheck shell=bash
_rlfleet_docker_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${ENGINE:-}" ]]; then
  if command -v podman >/dev/null; then ENGINE=podman; else ENGINE=docker; fi
fi
case "$ENGINE" in
  podman) export CONTAINERS_CONF="${CONTAINERS_CONF:-$_rlfleet_docker_dir/podman/containers.conf}" ;;
  docker) ;;
  *) echo "engine.sh: ENGINE must be podman or docker, not '$ENGINE'" >&2; return 2 ;;
esac
# Where built artefacts that outlive a run are kept (base root filesystem key, wheelhouses), keyed by content
RLFLEET_CACHE_DIR="${RLFLEET_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache}/rlfleet}"
