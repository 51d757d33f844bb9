#!/usr/bin/env bash
# Builds the libFuzzer harnesses in the sanitizer tree (build-asan: clang, ASan+UBSan,
# the whole product compiled with the fuzzer's coverage, as scripts/test.sh builds it)
# and runs each for a bounded time from its seed corpus in fuzz/corpus/, two side by
# side. A crash, leak, timeout or sanitizer report fails the run and leaves the
# reproducer in build-asan/fuzz/artifacts/.
#
#   WEFT_FUZZ_SECONDS=N            seconds per harness (default 30; CI uses the default)
#   scripts/fuzz.sh fuzz_rpc ...   only these harnesses
set -euo pipefail
cd "$(dirname "$0")/.."
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DWEFT_SANITIZE=ON -DWEFT_FUZZ=ON -DWEFT_BENCH=OFF >/dev/null
cmake --build build-asan --target fuzz_all
filter=()
if [ "$#" -gt 0 ]; then filter=(-R "^($(IFS='|'; echo "$*"))\$"); fi
scripts/ctest-pass.sh build-asan -j 2 -L fuzz "${filter[@]}"
echo "== fuzzing passed"
