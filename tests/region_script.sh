#!/usr/bin/env bash
# scripts/region.sh --check (docs/regions.md): a small region on this machine (etcd, a
# broker, two shards, a front end) and this machine's real daemons joining it through
# the broker; the sample job, created through the front end, must run on the shard that
# borrowed the machine. Then the script's cleanup must leave nothing: no directory, no
# cgroup, no process of its own. Root.
#   region_script.sh SOURCE_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
if [ "$(id -u)" -ne 0 ]; then echo "FAIL: needs root (scripts/region.sh runs an agent)"; exit 1; fi
cg2=$(awk '$9 == "cgroup2" {print $5; exit}' /proc/self/mountinfo)
lease=/run/weft-test-cgroup2
. "$(dirname "$0")/cgroup_lease.sh"
out=$(mktemp /var/tmp/weft-region-test.XXXXXX)
fail=0
bad() { echo "FAIL $*" >&2; fail=1; }
lease_take
trap 'lease_release; rm -f "$out"' EXIT
before=$(ls -d /tmp/weft-region.* 2>/dev/null | sort)
# Its own process group: whatever it leaves running is found by that group.
WEFT_DEMO_KEEP_CONTROLLERS=1 setsid "$src/scripts/region.sh" --check >"$out" 2>&1 &
pid=$!
wait "$pid"
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || bad "scripts/region.sh --check exited $rc"
grep -q "region check: the sample job runs on its shard" "$out" || bad "the job did not run"
grep -q '"shard": "s1"' "$out" && grep -q '"shard": "s2"' "$out" ||
  bad "the two entitlements did not go to the two shards"
grep -q "^== stopped" "$out" || bad "the script did not stop cleanly"
grep -qi "error\|broken pipe" "$out" && bad "the script printed an error"
after=$(ls -d /tmp/weft-region.* 2>/dev/null | sort)
[ "$before" = "$after" ] || bad "a directory was left: $after"
ls -d "$cg2"/weft-region-* >/dev/null 2>&1 && bad "a cgroup was left: $(ls -d "$cg2"/weft-region-*)"
if pgrep -g "$pid" >/dev/null 2>&1; then
  bad "processes of the region were left: $(pgrep -g "$pid" -a)"
  pkill -KILL -g "$pid" 2>/dev/null
fi
exit "$fail"
