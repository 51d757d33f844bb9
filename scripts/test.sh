#!/usr/bin/env bash
# The whole weft test suite: installs dependencies, builds, runs every test (unit,
# process and root tests, the QEMU guest) in a normal build and the packages, then every
# unit, process and root test again under AddressSanitizer and UndefinedBehaviorSanitizer,
# then every parser's libFuzzer harness, then the README's commands in a fresh copy of
# the tree (alone). Run as root so the root tests run (CI does).
#
# Where the time goes (docs/testing.md): the normal tree is the demo's and the packages'
# tree too (one build); tests that wait run side by side; the sanitizer tree (clang, which
# holds the fuzzers too) compiles at the lowest priority while the packages are made and
# the normal pass's tests run, so their waits are not idle cores. Each stage prints its start minute and each
# pass its ten slowest tests.
#
#   WEFT_SKIP_SANITIZERS=1   skip the sanitizer pass
#   WEFT_SKIP_GUEST=1        skip the QEMU system-test guest (quick local runs)
#   WEFT_SKIP_FUZZ=1         skip the fuzzers (quick local runs); WEFT_FUZZ_SECONDS=N
#                            sets each harness's time (default 20 here, 300 in
#                            scripts/fuzz.sh, the long opt-in run)
#   WEFT_HOST_WIDE_TESTS=0   skip the tests that change host-wide settings (huge page
#                            pool); by default they run and restore what they change
#   WEFT_TEST_JOBS=N         tests side by side (default 8: most tests wait; the
#                            sanitizer pass WEFT_ASAN_TEST_JOBS, default 4)
#   CCACHE_DISABLE=1         compile without the compiler cache (it is keyed on content;
#                            nothing depends on it)
set -euo pipefail
if [ "${WEFT_HOST_WIDE_TESTS:-1}" = "1" ]; then export WEFT_HOST_WIDE_TESTS=1; else unset WEFT_HOST_WIDE_TESTS; fi
# As root this is the suite CI runs: a root test that cannot run is a failure, not a
# silent skip. Without root the root tests skip, and ctest lists them as skipped.
if [ "$(id -u)" -eq 0 ]; then export WEFT_REQUIRE_ROOT_TESTS="${WEFT_REQUIRE_ROOT_TESTS:-1}"; fi
cd "$(dirname "$0")/.."
. scripts/lib.sh
jobs="${WEFT_TEST_JOBS:-8}"

started=$SECONDS
# Each stage's start, with the minutes spent so far (where CI's time goes).
stage() { echo "== $* (at $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s)"; }

stage setup
./scripts/setup.sh --test

stage "format check"
mapfile -t sources < <(git ls-files '*.cc' '*.h' 2>/dev/null || find common agent cli tests bench -name '*.cc' -o -name '*.h')
# (No files would make clang-format read its standard input and pass: refuse that.)
[ "${#sources[@]}" -gt 100 ] || { echo "format check: only ${#sources[@]} sources found" >&2; exit 1; }
clang-format --dry-run -Werror "${sources[@]}"

stage "build (build)"
weft_configure build
cmake --build build

bg_pid=""
bg_log=build-background.log
if [ -z "${WEFT_SKIP_SANITIZERS:-}" ] || [ -z "${WEFT_SKIP_FUZZ:-}" ]; then
  # The sanitizer tree (build-san: clang, ASan+UBSan, the harnesses too), compiled while
  # the packages are made and the normal pass's tests run: nice 19 gives the tests the
  # CPU whenever they want it (they mostly wait), the compiler the rest. The output goes
  # to a log, shown if it fails.
  stage "build (build-san: in the background while the packages and the normal tests run)"
  background_builds() {
    weft_configure_san && nice -n 19 cmake --build build-san
  }
  background_builds >"$bg_log" 2>&1 &
  bg_pid=$!
fi
# If the suite stops early, the background build stops with it.
trap '[ -n "$bg_pid" ] && kill "$bg_pid" 2>/dev/null || true' EXIT

# Packages first: lintian/rpmlint are part of the suite and the guest installs the .deb.
# From the normal tree: nothing is compiled again.
stage packages
WEFT_BUILD_DIR=build ./scripts/package.sh

stage "test (build)"
scripts/ctest-pass.sh build -j "$jobs" -LE fresh

if [ -n "$bg_pid" ]; then
  stage "waiting for the background builds"
  if ! wait "$bg_pid"; then
    bg_pid=""
    tail -n 60 "$bg_log"
    echo "a background build failed (whole log: $bg_log)" >&2
    exit 1
  fi
  bg_pid=""
fi
if [ -z "${WEFT_SKIP_SANITIZERS:-}" ]; then
  # Fewer side by side than in the normal pass: every process is two to three times
  # heavier under the sanitizers.
  stage "test (build-san)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    scripts/ctest-pass.sh build-san -j "${WEFT_ASAN_TEST_JOBS:-4}" -LE fuzz
fi
# Every parser's libFuzzer harness, bounded (WEFT_FUZZ_SECONDS per harness, two side by
# side: they are the only tests that keep a core busy; a crash fails the suite).
if [ -z "${WEFT_SKIP_FUZZ:-}" ]; then
  stage "fuzz (build-san)"
  # The suite's bounded run: 20 s a harness, built at -O0 in the sanitizer tree (the long
  # form, 5 minutes each by default at -O2: scripts/fuzz.sh).
  export WEFT_FUZZ_SECONDS="${WEFT_FUZZ_SECONDS:-20}"
  scripts/ctest-pass.sh build-san -j 2 -L fuzz
fi
# The README's commands on their own in a fresh copy of the tree (tests/fresh_clone.sh),
# alone: it compiles, copies and lints, and beside other tests its disk load stalled
# etcd's fsyncs.
stage "fresh copy (build)"
scripts/ctest-pass.sh build -L fresh
stage "all tests passed"
