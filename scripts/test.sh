#!/usr/bin/env bash
# The whole weft test suite: installs dependencies, builds, runs every test (unit and
# root tests) in a normal build, then again under AddressSanitizer and
# UndefinedBehaviorSanitizer. Run as root so the root tests run (CI does).
#
#   WEFT_SKIP_SANITIZERS=1   skip the sanitizer pass (quick local runs)
#   WEFT_HOST_WIDE_TESTS=0   skip the tests that change host-wide settings (huge page
#                            pool); by default they run and restore what they change
#   WEFT_SKIP_GUEST=1        skip the QEMU system-test guest (quick local runs)
#   WEFT_SKIP_FUZZ=1         skip the fuzzers (quick local runs); WEFT_FUZZ_SECONDS=N
#                            sets each harness's time (default 30)
set -euo pipefail
if [ "${WEFT_HOST_WIDE_TESTS:-1}" = "1" ]; then export WEFT_HOST_WIDE_TESTS=1; else unset WEFT_HOST_WIDE_TESTS; fi
# As root this is the suite CI runs: a root test that cannot run is a failure, not a
# silent skip. Without root the root tests skip, and ctest lists them as skipped.
if [ "$(id -u)" -eq 0 ]; then export WEFT_REQUIRE_ROOT_TESTS="${WEFT_REQUIRE_ROOT_TESTS:-1}"; fi
cd "$(dirname "$0")/.."

./scripts/setup.sh

echo "== format check"
mapfile -t sources < <(git ls-files '*.cc' '*.h' 2>/dev/null || find common agent cli tests bench -name '*.cc' -o -name '*.h')
clang-format --dry-run -Werror "${sources[@]}"

started=$SECONDS
# Each stage's start, with the minutes spent so far (where CI's time goes).
stage() { echo "== $* (at $(( (SECONDS - started) / 60 )) min)"; }
build() {
  local dir=$1; shift
  stage "build ($dir)"
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir"
}
run_tests() {
  stage "test ($1)"
  ctest --test-dir "$1" --output-on-failure --timeout 1200 -j2
}

build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
# Packages first: lintian/rpmlint are part of the suite and the guest installs the .deb.
stage packages
./scripts/package.sh
run_tests build
if [ -z "${WEFT_SKIP_SANITIZERS:-}" ]; then
  build build-asan -DCMAKE_BUILD_TYPE=Debug -DWEFT_SANITIZE=ON -DWEFT_BENCH=OFF
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_tests build-asan
fi
# Every parser's libFuzzer harness, bounded (WEFT_FUZZ_SECONDS per harness; a crash
# fails the suite). WEFT_SKIP_FUZZ=1 skips it for quick local runs.
if [ -z "${WEFT_SKIP_FUZZ:-}" ]; then
  ./scripts/fuzz.sh
fi
stage "all tests passed"
