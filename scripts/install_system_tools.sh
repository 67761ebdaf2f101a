#!/usr/bin/env bash
# Debian packages the tests need beside the locked venvs: redis-server (real Redis for the buffer's Redis store),
# prometheus (promtool checks the chart's alert rules), and for the `chart_play` tests the container engine: podman
# with runc (docker/podman/containers.conf picks it), netavark, aardvark-dns and iptables (networks, their names and
# their NAT rules), and debootstrap (docker/base/build_base.sh builds the images' base). Idempotent: a no-op when
# every one is present.
#   bash scripts/install_system_tools.sh
# Debian's versions are not locked (a stable release's mirror keeps only its current security build); the tests use
# each tool's long-stable interface. A set-up killed inside dpkg is finished first (dpkg --configure -a), so an
# interrupted install recovers by itself instead of failing every later apt-get.
set -euo pipefail
declare -A PACKAGE_OF=(
  [redis-server]=redis-server
  [promtool]=prometheus
  [podman]=podman
  [runc]=runc
  [debootstrap]=debootstrap
  [/usr/lib/podman/netavark]=netavark
  [/usr/lib/podman/aardvark-dns]=aardvark-dns
  [iptables]=iptables
)
missing=()
for cmd in "${!PACKAGE_OF[@]}"; do
  command -v "$cmd" >/dev/null || missing+=("${PACKAGE_OF[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
if [ -n "$($SUDO dpkg --audit 2>/dev/null)" ]; then
  echo "install_system_tools: finishing an interrupted dpkg run"
  $SUDO env DEBIAN_FRONTEND=noninteractive dpkg --configure -a
fi
echo "install_system_tools: apt-get install ${missing[*]}"
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for cmd in "${!PACKAGE_OF[@]}"; do
  command -v "$cmd" >/dev/null || { echo "install_system_tools: $cmd still missing" >&2; exit 1; }
done
