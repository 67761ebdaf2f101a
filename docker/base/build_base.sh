#!/usr/bin/env bash
# Build rlfleet's local base image: Debian bookworm (debootstrap --variant=minbase) with python3 3.11, venv and the CA
# certificates, imported into the engine as localhost/rlfleet-base:bookworm-<key>, where <key> is the hash of this
# script: a changed recipe gives a new tag, an unchanged one is reused (a no-op taking well under a second).
#   bash docker/base/build_base.sh [--print-ref]      build if missing; print the image reference on stdout
# Why local: where no image registry is reachable, `FROM python:3.11...` cannot be pulled; the Dockerfiles take the
# base as a build argument (BASE) and default to the public python slim image elsewhere. Needs root (debootstrap),
# debootstrap and an apt mirror (MIRROR, default: the one apt uses, else deb.debian.org). ~5 min on 2 busy cores.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../engine.sh
source "$HERE/../engine.sh"
KEY="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"
REF="localhost/rlfleet-base:bookworm-$KEY"
[[ "${1:-}" == "--print-ref" ]] && { echo "$REF"; exit 0; }

mkdir -p "$RLFLEET_CACHE_DIR"
exec 9>"$RLFLEET_CACHE_DIR/base.lock"
flock 9                                    # dev.sh builds it in the background while build.sh may wait for it
if "$ENGINE" image inspect "$REF" >/dev/null 2>&1; then
  echo "$REF"; exit 0
fi
MIRROR="${MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-base.XXXXXX")"
trap 'rm -rf "$ROOTFS"' EXIT
start=$SECONDS
echo "build_base: debootstrap bookworm from $MIRROR into $ROOTFS" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOTFS" "$MIRROR" \
  >"$ROOTFS.log" 2>&1 || { tail -20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; exit 1; }
rm -f "$ROOTFS.log"
# What an image never needs: package downloads and lists, docs, man pages, translations
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/* \
       "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/* "$ROOTFS"/var/log/*.log
tar --numeric-owner -C "$ROOTFS" -c . | "$ENGINE" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$REF" >/dev/null
echo "build_base: $REF built in $((SECONDS - start)) s" >&2
echo "$REF"
