#!/usr/bin/env bash
# Runs tests many times in a row under a CPU hog, to show they are not flaky on a loaded
# machine (docs/testing.md). By default: the tests that wait on time (replicas and chaos,
# multi-machine and cluster, failover, readiness, maintenance, TaskControl, service moves
# and discovery), 10 runs each,
# side by side as the suite runs them, with one core kept busy by a spinning process.
#   scripts/soak.sh [BUILD_DIR]      (default build)
#   WEFT_SOAK_RUNS=N                 runs per test (default 10)
#   WEFT_SOAK_REGEX=RE               which tests (ctest -R)
#   WEFT_SOAK_HOGS=N                 cores kept busy (default 1)
#   WEFT_TEST_JOBS=N                 tests side by side (default 8)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
runs=${WEFT_SOAK_RUNS:-10}
regex=${WEFT_SOAK_REGEX:-'Replica|Chaos|MultiMachine|Cluster|Failover|Failures|Readiness|Maintenance|TaskControl|Controller|Fig14|Drain|Heartbeat|Leader|ServiceMoves|Discovery'}
hogs=${WEFT_SOAK_HOGS:-1}
hog_pids=()
stop_hogs() { for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_hogs EXIT
for ((i = 0; i < hogs; i++)); do
  (while :; do :; done) &
  hog_pids+=($!)
done
echo "== soak: $runs runs of /$regex/ in $dir with $hogs core(s) busy"
export WEFT_HOST_WIDE_TESTS=1
if [ "$(id -u)" -eq 0 ]; then export WEFT_REQUIRE_ROOT_TESTS=1; fi
# until-fail: each test is run again until it has passed $runs times or failed once.
scripts/ctest-pass.sh "$dir" -j "${WEFT_TEST_JOBS:-8}" -R "$regex" --repeat "until-fail:$runs"
