#!/usr/bin/env bash
# Builds the libFuzzer harnesses (build-fuzz: clang, ASan+UBSan, the libraries with the
# fuzzer's coverage, as scripts/test.sh builds it) and runs each for a bounded time from
# its seed corpus in fuzz/corpus/, two side by side. A crash, leak, timeout or sanitizer
# report fails the run and leaves the reproducer in build-fuzz/fuzz/artifacts/.
#
#   WEFT_FUZZ_SECONDS=N            seconds per harness (default 300: the long run; the
#                                  suite's bounded one, scripts/test.sh, gives 20)
#   scripts/fuzz.sh fuzz_rpc ...   only these harnesses
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
weft_configure_fuzz
cmake --build build-fuzz --target fuzz_all
export WEFT_FUZZ_SECONDS="${WEFT_FUZZ_SECONDS:-300}"
filter=()
if [ "$#" -gt 0 ]; then filter=(-R "^($(IFS='|'; echo "$*"))\$"); fi
scripts/ctest-pass.sh build-fuzz -j 2 -L fuzz "${filter[@]}"
echo "== fuzzing passed"
