#!/usr/bin/env bash
# The README's commands, each on its own in a fresh clone (issue 43: scripts/package.sh
# once failed there, because the suite's full build had always made what it needed
# first). In a copy of the tree as a clone of it would be (tracked files, and new ones
# not ignored), nothing built:
#  - scripts/package.sh makes the .deb and .rpm, with everything they install;
#  - scripts/demo.sh starts the single-machine cluster, runs the sample job, follows a
#    task's output, and Ctrl-C (SIGINT to its process group) stops it cleanly: no error
#    printed, its cgroups and directory gone;
#  - each of the two installs what it runs (issue 59: package.sh once needed rpmbuild
#    that only the test command installed, unseen here because this machine has the
#    test packages): both run under strace, and every program they executed must come
#    from a package their `scripts/setup.sh` set names, a dependency of one, or a
#    package every Debian machine has (tests/command_needs.py).
# (The test command is this suite itself.) Compiles go through ccache when it is there
# (keyed on content, so the copy's compiles are the suite's own). Root; cleans up.
#   fresh_clone.sh SOURCE_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
if [ "$(id -u)" -ne 0 ]; then
  if [ -n "${WEFT_REQUIRE_ROOT_TESTS:-}" ]; then echo "FAIL: needs root"; exit 1; fi
  echo "SKIP: needs root"; exit 77
fi
fail=0
bad() { echo "FAIL $*" >&2; fail=1; }
work=$(mktemp -d /var/tmp/weft-fresh.XXXXXX)
cg2=$(awk '$9 == "cgroup2" {print $5; exit}' /proc/self/mountinfo)
lease=/run/weft-test-cgroup2
demo_pid=""
# The cgroup2 root's subtree_control is shared with the other root tests (their lease).
. "$(dirname "$0")/cgroup_lease.sh"
cleanup() {
  if [ -n "$demo_pid" ] && kill -0 "$demo_pid" 2>/dev/null; then
    kill -INT -- "-$demo_pid" 2>/dev/null
    for _ in $(seq 300); do kill -0 "$demo_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$demo_pid" 2>/dev/null
  fi
  [ -n "$demo_pid" ] && lease_release
  rm -rf "$work"
}
trap cleanup EXIT

mkdir "$work/clone"
(cd "$src" && git ls-files -z -co --exclude-standard) | while IFS= read -r -d '' f; do
  [ -e "$src/$f" ] && printf '%s\0' "$f"
done | tar -C "$src" --null -T - -cf - | tar -C "$work/clone" -xf - || bad "cannot copy the tree"
clone=$work/clone
[ -x "$clone/scripts/package.sh" ] || { bad "the copy has no scripts/package.sh"; exit 1; }

# scripts/package.sh on its own.
start=$SECONDS
# At the lowest priority: the tests beside this one mostly wait, on heartbeats among
# other things, and get the CPU whenever they want it (as scripts/test.sh's background
# builds do).
# Every program it runs, traced (seccomp-filtered: only execve stops the tracee).
trace() { strace -f -qq --seccomp-bpf -e trace=execve -e status=successful -o "$1" -- "${@:2}"; }
needs() {  # needs MODE TRACE WHAT
  local out
  out=$("$(dirname "$0")/command_needs.py" "$clone/scripts/setup.sh" "$1" "$2" 2>&1) ||
    bad "$3 runs what it does not install: $out"
  echo "$3: $out"
}
if (cd "$clone" && trace "$work/package.trace" nice -n 19 scripts/package.sh) >"$work/package.log" 2>&1; then
  deb=$(ls "$clone"/dist/weft_*.deb 2>/dev/null)
  rpm=$(ls "$clone"/dist/weft-*.rpm 2>/dev/null)
  [ -f "$deb" ] || bad "package.sh made no .deb"
  [ -f "$rpm" ] || bad "package.sh made no .rpm"
  for f in ./usr/share/bash-completion/completions/weftctl ./usr/share/zsh/vendor-completions/_weftctl \
           ./usr/sbin/weft-agent ./usr/sbin/weft-controlplane ./usr/bin/weftctl \
           ./usr/libexec/weft/weft-init ./usr/share/man/man1/weftctl.1.gz; do
    dpkg-deb -c "$deb" | awk '{print $6}' | grep -qxF "$f" || bad "the .deb lacks $f"
  done
  echo "package.sh in a fresh copy: $((SECONDS - start)) s"
  needs --package "$work/package.trace" package.sh
else
  bad "scripts/package.sh in a fresh copy: $(tail -n 20 "$work/package.log")"
fi

# scripts/demo.sh on its own, stopped by Ctrl-C.
lease_take || bad "cannot take the subtree_control lease"
start=$SECONDS
# Traced: strace stays out of the demo's process group (the demo is its child, in a
# session of its own), so Ctrl-C reaches the demo alone and strace ends when it has.
# The demo's pid is written by the shell that becomes it (strace's child is no group
# leader, so setsid makes its session in place, without a fork): the test never guesses
# it from the process tree, where a loaded machine made a fixed window miss it.
(cd "$clone" && WEFT_DEMO_KEEP_CONTROLLERS=1 exec nice -n 19 strace -f -qq --seccomp-bpf \
  -e trace=execve -e status=successful -o "$work/demo.trace" -- \
  sh -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec setsid scripts/demo.sh' "$work/demo.pid" </dev/null) \
  >"$work/demo.log" 2>&1 &
strace_pid=$!
# Until the pid is written or strace has ended (10 minutes: only a failure's bound).
for _ in $(seq 6000); do
  [ -s "$work/demo.pid" ] && { demo_pid=$(cat "$work/demo.pid"); break; }
  kill -0 "$strace_pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$demo_pid" ] || { bad "the demo did not start under strace: $(cat "$work/demo.log")"; demo_pid=$strace_pid; }
followed=0
for _ in $(seq 1500); do  # up to 300 s: it builds the programs first
  if grep -q '^hello [0-9]* from pid' "$work/demo.log"; then followed=1; break; fi
  kill -0 "$demo_pid" 2>/dev/null || break
  sleep 0.2
done
[ "$followed" = 1 ] || bad "the demo never showed the job's output: $(tail -n 30 "$work/demo.log")"
echo "demo.sh in a fresh copy: the job's output after $((SECONDS - start)) s"
kill -INT -- "-$demo_pid" 2>/dev/null
stopped=0
for _ in $(seq 600); do
  kill -0 "$demo_pid" 2>/dev/null || { stopped=1; break; }
  sleep 0.1
done
[ "$stopped" = 1 ] || bad "the demo did not stop within 60 s of Ctrl-C"
# strace ends with the last process the demo made: one left behind is a defect.
for _ in $(seq 300); do kill -0 "$strace_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$strace_pid" 2>/dev/null; then
  bad "a process of the demo outlived it: $(pgrep -a -P "$strace_pid")"
  kill "$strace_pid" 2>/dev/null
fi
wait "$strace_pid" 2>/dev/null
grep -q '^== stopped' "$work/demo.log" || bad "the demo did not say it stopped: $(tail -n 20 "$work/demo.log")"
if grep -qiE 'broken pipe|weftctl: |demo: ' "$work/demo.log"; then
  bad "the demo printed an error: $(grep -iE 'broken pipe|weftctl: |demo: ' "$work/demo.log" | head -n 5)"
fi
left=$(ls -d "$cg2"/weft-demo-* /tmp/weft-demo.* 2>/dev/null)
[ -z "$left" ] || bad "the demo left: $left"
demo_pid=""
lease_release
needs "" "$work/demo.trace" demo.sh
[ "$fail" = 0 ] && echo "fresh copy: package.sh and demo.sh each work on their own"
exit $fail
