#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of weft from Debian's
# packages. Safe to run again; needs root (or sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libsystemd-dev libsqlite3-dev sqlite3
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev
  libnl-3-dev libnl-route-3-dev libnl-genl-3-dev
  libgtest-dev libgmock-dev googletest
  busybox-static crun socat python3 iproute2 procps util-linux
  dpkg-dev rpm lintian rpmlint file man-db
  qemu-system-x86 mmdebstrap e2fsprogs
  clang-format
  clang bpftool libbpf-dev
  libseccomp-dev libfuzzer-14-dev libclang-rt-14-dev
  libssl-dev openssl
  libmicrohttpd-dev libcurl4-openssl-dev libarchive-dev
  gnuplot-nox
  etcd-server etcd-client
  docker-registry
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The agent's socket group. Created here for development machines; packages
# create it with sysusers.d.
getent group weft >/dev/null || $SUDO groupadd --system weft
echo "setup: all dependencies present" >&2
