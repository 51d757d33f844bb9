#!/usr/bin/env bash
# One libFuzzer harness for a bounded time from its seed corpus (a ctest test labelled
# fuzz; scripts/fuzz.sh and scripts/test.sh run them). A crash, leak, timeout or
# sanitizer report fails it and leaves the reproducer in BUILD/fuzz/artifacts/.
#   fuzz/run.sh HARNESS_BINARY SEED_DIR WORK_DIR
#   WEFT_FUZZ_SECONDS=N   seconds (default 30; scripts/test.sh gives 20, scripts/fuzz.sh 300)
set -euo pipefail
bin=$1 seeds=$2 work=$3
name=$(basename "$bin")
seconds="${WEFT_FUZZ_SECONDS:-30}"
mkdir -p "$work/corpus/$name" "$work/artifacts"
log="$work/$name.log"
echo "== fuzz $name (${seconds}s)"
# The harness's own exit status decides; its output goes to a log, of which only the
# summary and any report is shown. (A pipe into grep here once hid every failure:
# `|| true` reset PIPESTATUS.)
rc=0
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$bin" -max_total_time="$seconds" -max_len=262144 -timeout=20 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/$name-" "$work/corpus/$name" "$seeds" \
  >"$log" 2>&1 || rc=$?
grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==|SUMMARY|.*(ERROR|Crash|crash|runtime error))" "$log" || true
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$log"
  echo "fuzz: $name failed (exit $rc); reproducer in $work/artifacts/, output in $log" >&2
  exit 1
fi
