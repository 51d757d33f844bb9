#!/usr/bin/env bash
# One pass of ctest over a build tree, as scripts/test.sh runs it: every test's output
# on failure, then the pass's ten slowest tests (so the next slow one shows in CI's log).
#   scripts/ctest-pass.sh BUILD_DIR [ctest options: -j N, -L LABEL, -LE LABEL, -R RE ...]
set -euo pipefail
dir=$1; shift
log="$dir/ctest-pass.log"
# ctest's own status decides (read from PIPESTATUS right after the pipeline: an `|| rc=$?`
# here would reset it, as it once hid every failing fuzzer).
set +e
ctest --test-dir "$dir" --output-on-failure --timeout 1200 "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
echo "-- the ten slowest tests of this pass:"
# awk takes the first ten and reads the rest (a `head` here closed the pipe early, and
# under pipefail sort's SIGPIPE failed a pass whose tests had all passed).
sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' "$log" |
  sort -rn | awk 'NR <= 10 {printf "   %7.1f s  %s\n", $1, $2}'
exit "$rc"
