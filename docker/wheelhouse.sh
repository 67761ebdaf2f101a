#!/usr/bin/env bash
# A wheelhouse made from locks on the host: every file those locks name (--no-deps --require-hashes), for the images'
# Python (CPython 3.11, glibc 2.36 x86_64: Debian bookworm and python:3.11-slim-bookworm alike), in
#   $RLFLEET_CACHE_DIR/wheelhouse/<key>    key: hash of this script and of each lock's name and content
# so a changed lock gives a new wheelhouse and an unchanged one is reused. Prints the folder.
#   bash docker/wheelhouse.sh [--print-key] LOCK...
# Why on the host: inside a container the package index may not verify (a proxy's TLS chain lives in the host's
# trust store only), and installing with --no-index from files named by hash makes image builds reproducible.
# The download goes through pip's own configuration (index, find-links) and cache.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=engine.sh
source "$HERE/engine.sh"
PRINT_KEY=0
[[ "${1:-}" == "--print-key" ]] && { PRINT_KEY=1; shift; }
[[ $# -gt 0 ]] || { echo "usage: wheelhouse.sh [--print-key] LOCK..." >&2; exit 2; }
KEY="$( { sha256sum "${BASH_SOURCE[0]}" | cut -c1-64; for lock in "$@"; do basename "$lock"; sha256sum <"$lock"; done; } \
        | sha256sum | cut -c1-16)"
[[ "$PRINT_KEY" == 1 ]] && { echo "$KEY"; exit 0; }
DIR="$RLFLEET_CACHE_DIR/wheelhouse/$KEY"
if [[ -f "$DIR/.complete" ]]; then echo "$DIR"; exit 0; fi
mkdir -p "$RLFLEET_CACHE_DIR/wheelhouse"
TMP="$(mktemp -d "$RLFLEET_CACHE_DIR/wheelhouse/.$KEY.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
PYTHON="${PYTHON:-$(command -v python3)}"
# Every glibc the image's (2.36) can run: pip 23 does not widen a --platform manylinux tag to older glibc versions
PLATFORMS=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for minor in $(seq 5 36); do PLATFORMS+=(--platform "manylinux_2_${minor}_x86_64"); done
start=$SECONDS
for lock in "$@"; do
  "$PYTHON" -m pip download -q --no-deps --require-hashes --only-binary :all: --dest "$TMP" \
    --python-version 3.11 --implementation cp --abi cp311 "${PLATFORMS[@]}" -r "$lock" >&2
done
touch "$TMP/.complete"
# Publish whole or not at all: a concurrent maker of the same key may have won; its folder is as good as ours
mv -T "$TMP" "$DIR" 2>/dev/null || true
echo "wheelhouse: $DIR ($(du -sh "$DIR" | cut -f1)) made in $((SECONDS - start)) s" >&2
echo "$DIR"
