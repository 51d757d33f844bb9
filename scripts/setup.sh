#!/usr/bin/env bash
# Installs weft's dependencies from Debian's packages. Safe to run again; needs root (or
# sudo). Each of the README's commands installs what it needs through this script:
#   scripts/setup.sh            what building weft and running it needs (scripts/demo.sh)
#   scripts/setup.sh --package  and what making the .deb and .rpm needs: rpmbuild and the
#                               linters (scripts/package.sh)
#   scripts/setup.sh --test     and what the test suite needs: the peers the tests run
#                               (crun, etcd, docker-registry), the QEMU guest's tools, the
#                               fuzzers' runtime (scripts/test.sh)
#   scripts/setup.sh --list [--package|--test]
#                               prints that set's packages, one a line, installs nothing
#                               (tests/fresh_clone.sh checks each command's needs with it)
set -euo pipefail

list=0
if [ "${1:-}" = "--list" ]; then list=1; shift; fi
mode="${1:-}"
case "$mode" in
  ""|--package|--test) ;;
  *) echo "setup: unknown option $mode (--package, --test, --list)" >&2; exit 2 ;;
esac

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  libsystemd-dev libsqlite3-dev sqlite3 libjemalloc-dev libsimdjson-dev libglpk-dev
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev
  libnl-3-dev libnl-route-3-dev libnl-genl-3-dev
  libgtest-dev
  busybox-static iproute2 procps util-linux
  clang bpftool libbpf-dev
  libseccomp-dev
  libssl-dev openssl
  libmicrohttpd-dev libcurl4-openssl-dev libarchive-dev
  libldns-dev libnftables-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
)
# scripts/package.sh: cpack's RPM generator runs rpmbuild; the .deb is checked by lintian
# (which reads man pages with man-db's tools and types with file), the .rpm by rpmlint.
PACKAGE_TOOLS=(dpkg-dev rpm lintian rpmlint file man-db)
if [ "$mode" = "--package" ] || [ "$mode" = "--test" ]; then PACKAGES+=("${PACKAGE_TOOLS[@]}"); fi
if [ "$mode" = "--test" ]; then
  PACKAGES+=(
    libgmock-dev googletest
    crun socat python3 ldnsutils nftables strace
    qemu-system-x86 mmdebstrap e2fsprogs
    clang-format
    libfuzzer-14-dev libclang-rt-14-dev
    gnuplot-nox libmimalloc2.0
    etcd-server etcd-client
    docker-registry
    chromium zsh bash-completion cpio
    libfaketime libfuse3-dev fuse3
  )
fi

if [ "$list" = 1 ]; then
  printf '%s\n' "${PACKAGES[@]}"
  exit 0
fi

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
