#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan+UBSan) and runs each for a bounded time
# from its seed corpus in fuzz/corpus/. A crash, leak, timeout or sanitizer report
# fails the run and leaves the reproducer in build-fuzz/artifacts/.
#
#   WEFT_FUZZ_SECONDS=N   seconds per harness (default 30; CI uses the default)
#   scripts/fuzz.sh fuzz_rpc ...   only these harnesses
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${WEFT_FUZZ_SECONDS:-30}"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWEFT_FUZZ=ON >/dev/null
cmake --build build-fuzz --target fuzz_all
harnesses=("$@")
if [ "${#harnesses[@]}" -eq 0 ]; then harnesses=(fuzz_rpc fuzz_spec fuzz_job fuzz_profile fuzz_config fuzz_cp_dispatch fuzz_task_control fuzz_etcd_rows fuzz_oci fuzz_image_cache fuzz_handoff); fi
mkdir -p build-fuzz/artifacts
for h in "${harnesses[@]}"; do
  seeds="fuzz/corpus/${h#fuzz_}"
  work="build-fuzz/corpus/${h#fuzz_}"
  mkdir -p "$work"
  echo "== fuzz $h (${seconds}s)"
  # The harness's own exit status decides; its output goes to a log, of which only the
  # summary and any report is shown. (A pipe into grep here once hid every failure:
  # `|| true` reset PIPESTATUS.)
  log="build-fuzz/$h.log"
  rc=0
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "build-fuzz/fuzz/$h" -max_total_time="$seconds" -max_len=262144 -timeout=20 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$h-" \
    "$work" "$seeds" >"$log" 2>&1 || rc=$?
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==|SUMMARY|.*(ERROR|Crash|crash|runtime error))" "$log" || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $h failed (exit $rc); reproducer in build-fuzz/artifacts/, output in $log" >&2
    exit 1
  fi
done
echo "== fuzzing passed"
