#!/usr/bin/env bash
# Make VENV hold exactly what LOCK pins (and, with --editable, this checkout installed editable), or rebuild it.
#   bash scripts/venv_from_lock.sh VENV LOCK [--editable] [--accept OTHER_LOCK]
# A stamp named for the lock's content is written last, after the venv is verified against the lock; a venv without
# the current stamp (a set-up killed half-way, a venv kept from an older lock, a package installed by hand) is
# deleted and built again, never trusted. --accept: a venv already verified against OTHER_LOCK will do (the dev lock
# holds everything the runtime lock does, at the same versions: scripts/locks.py check).
# Installs with --no-deps --require-hashes --only-binary: the lock is the whole closure, every file is checked against
# its hash, and nothing is built from source with an unpinned build backend.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$1
LOCK=$2
shift 2
EDITABLE=0
ACCEPT=()
while [ $# -gt 0 ]; do
  case "$1" in
    --editable) EDITABLE=1; shift ;;
    --accept) ACCEPT+=("$2"); shift 2 ;;
    *) echo "venv_from_lock: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$VENV" in ""|/|.|..) echo "venv_from_lock: refusing VENV='$VENV'" >&2; exit 2 ;; esac
PY="$VENV/bin/python"
PROJECT=()
[ "$EDITABLE" = 1 ] && PROJECT=(--project rlfleet)

stamp_of() { echo "$VENV/.locked-$(basename "$1" .txt)-$(sha256sum "$1" | cut -c1-16)"; }
verified() {  # the stamp is there and the venv still holds exactly what the lock pins
  [ -f "$(stamp_of "$1")" ] && "$PY" scripts/locks.py verify "$1" "${PROJECT[@]}" 2>/dev/null
}

pip_install() {  # pip, without this machine kind's notes about local index folders that hold no such project
  "$PY" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
install_lock() {
  pip_install --no-deps --require-hashes --only-binary :all: -r "$LOCK"
  if [ "$EDITABLE" = 1 ]; then
    pip_install --no-deps --no-build-isolation -e .
  fi
}

for lock in "$LOCK" "${ACCEPT[@]}"; do
  if verified "$lock"; then exit 0; fi
done

start=$SECONDS
# A venv finished and verified against another lock whose pins this lock shares (a `run` venv before `test`): top it
# up. Anything else that is there is rebuilt.
if compgen -G "$VENV/.locked-*" >/dev/null && "$PY" scripts/locks.py verify "$LOCK" --subset "${PROJECT[@]}" 2>/dev/null; then
  rm -f "$VENV"/.locked-*
  install_lock
  if "$PY" scripts/locks.py verify "$LOCK" "${PROJECT[@]}"; then
    touch "$(stamp_of "$LOCK")"
    echo "venv_from_lock: $VENV topped up from $LOCK in $(( SECONDS - start ))s"
    exit 0
  fi
fi
if [ -e "$VENV" ]; then
  echo "venv_from_lock: $VENV does not match $LOCK (half-made, from an older lock, or changed by hand): rebuilding"
  "$PY" scripts/locks.py verify "$LOCK" "${PROJECT[@]}" 2>&1 | head -5 || true
  rm -rf "$VENV"
fi
if ! python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "venv_from_lock: the locks are for CPython 3.11; python3 is $(python3 --version 2>&1)" >&2
  exit 1
fi
python3 -m venv "$VENV"
install_lock
"$PY" scripts/locks.py verify "$LOCK" "${PROJECT[@]}"
rm -f "$VENV"/.locked-*
touch "$(stamp_of "$LOCK")"
echo "venv_from_lock: $VENV built from $LOCK in $(( SECONDS - start ))s"
