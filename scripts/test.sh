#!/usr/bin/env bash
# The whole weft test suite: installs dependencies, builds, runs every test (unit and
# root tests) in a normal build, then again under AddressSanitizer and
# UndefinedBehaviorSanitizer. Run as root so the root tests run (CI does).
#
#   WEFT_SKIP_SANITIZERS=1   skip the sanitizer pass (quick local runs)
#   WEFT_HOST_WIDE_TESTS=0   skip the tests that change host-wide settings (huge page
#                            pool); by default they run and restore what they change
set -euo pipefail
if [ "${WEFT_HOST_WIDE_TESTS:-1}" = "1" ]; then export WEFT_HOST_WIDE_TESTS=1; else unset WEFT_HOST_WIDE_TESTS; fi
cd "$(dirname "$0")/.."

./scripts/setup.sh

echo "== format check"
mapfile -t sources < <(git ls-files '*.cc' '*.h' 2>/dev/null || find common agent cli tests bench -name '*.cc' -o -name '*.h')
clang-format --dry-run -Werror "${sources[@]}"

run_suite() {
  local dir=$1; shift
  echo "== build ($dir)"
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir"
  echo "== test ($dir)"
  ctest --test-dir "$dir" --output-on-failure --timeout 300 -j2
}

run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ -z "${WEFT_SKIP_SANITIZERS:-}" ]; then
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DWEFT_SANITIZE=ON
fi
echo "== all tests passed"
