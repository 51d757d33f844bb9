#!/usr/bin/env bash
# Test: `systemd-analyze verify` accepts every weft unit with nothing on stderr, with
# the binaries and man pages where the packages put them. Runs in a private mount
# namespace in which overlays add them to /usr/sbin, /usr/libexec and /usr/share/man,
# so nothing on the machine changes. Needs root.
#   verify_units.sh SOURCE_DIR WEFT_AGENT_BIN WEFT_INIT_BIN WEFT_SIDEKICK_BIN WEFT_HCS_BIN
#                   WEFT_CONTROLPLANE_BIN
set -euo pipefail
src=$1 agent=$2 init=$3 sidekick=$4 hcs=$5 controlplane=$6
if [ "$(id -u)" -ne 0 ]; then
  if [ -n "${WEFT_REQUIRE_ROOT_TESTS:-}" ]; then echo "FAIL: needs root"; exit 1; fi
  echo "SKIP: needs root"; exit 77
fi
tmp=$(mktemp -d /tmp/weft-verify.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/{sbin,libexec/weft,man/man1,man/man8,units}/ "$tmp"/{w1,w2,w3,u1,u2,u3}
cp "$agent" "$tmp/sbin/weft-agent"
cp "$sidekick" "$tmp/sbin/weft-sidekick"
cp "$hcs" "$tmp/sbin/weft-hcs"
cp "$controlplane" "$tmp/sbin/weft-controlplane"
cp "$init" "$tmp/libexec/weft/weft-init"
gzip -9nc "$src/packaging/man/weft-agent.8" > "$tmp/man/man8/weft-agent.8.gz"
gzip -9nc "$src/packaging/man/weft-sidekick.8" > "$tmp/man/man8/weft-sidekick.8.gz"
gzip -9nc "$src/packaging/man/weft-hcs.8" > "$tmp/man/man8/weft-hcs.8.gz"
gzip -9nc "$src/packaging/man/weft-controlplane.8" > "$tmp/man/man8/weft-controlplane.8.gz"
gzip -9nc "$src/packaging/man/weftctl.1" > "$tmp/man/man1/weftctl.1.gz"
cp "$src"/packaging/systemd/*.service "$tmp/units/"
unshare -m bash -c '
  set -e
  t=$1
  mount --make-rprivate /
  mkdir -p /usr/libexec
  mount -t overlay overlay -o lowerdir=$t/sbin:/usr/sbin /usr/sbin
  mount -t overlay overlay -o lowerdir=$t/libexec:/usr/libexec /usr/libexec
  mount -t overlay overlay -o lowerdir=$t/man:/usr/share/man /usr/share/man
  cd "$t/units"
  systemd-analyze verify ./*.service >"$t/out" 2>"$t/err" || { echo "exit $?" >>"$t/err"; }
' _ "$tmp"
if [ -s "$tmp/err" ]; then
  echo "FAIL: systemd-analyze verify reported:"
  cat "$tmp/err"
  exit 1
fi
echo "PASS: $(ls "$tmp/units" | tr '\n' ' ')verified with nothing on stderr"
