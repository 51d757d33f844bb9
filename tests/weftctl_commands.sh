#!/bin/sh
# weftctl builds only the command group its command line names (cli/main.cc): the
# global options before it are skipped with their values, in both spellings; help asked
# for before any command, no command, or a word weftctl does not know builds them all,
# so CLI11 answers as it did when it was given every command. Fails naming the case.
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
# expect NAME STATUS TEXT -- ARGS: weftctl ARGS exits STATUS and prints TEXT.
expect() {
  name=$1 status=$2 text=$3
  shift 4
  out=$("$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" != "$status" ]; then
    echo "FAIL $name: exit $rc, not $status: $out" >&2; fail=1; return
  fi
  case "$out" in *"$text"*) ;; *) echo "FAIL $name: no '$text' in: $out" >&2; fail=1 ;; esac
}
for cmd in machine entitlement job service maintenance audit controlplane task agent image health profile; do
  expect "help lists $cmd" 0 "  $cmd " -- --help
done
expect "a group's help" 0 "start a task; prints its id" -- --agent "$dir/a" task --help
expect "help before the group" 0 "start a task; prints its id" -- --agent "$dir/a" --help task
expect "the value of --agent is skipped" 1 "connect to $dir/a" -- --agent "$dir/a" task ls
expect "--agent=value" 1 "connect to $dir/b" -- --agent="$dir/b" task ls
expect "flags after the command" 1 "connect to $dir/c" -- task ls --json --agent "$dir/c"
expect "another group's socket" 1 "connect to $dir/h" -- --agent "$dir/a" --hcs "$dir/h" health
expect "the control plane's" 1 "connect to $dir/cp" -- --controlplane "$dir/cp" job ls
expect "an unknown word" 2 "A subcommand is required" -- bogus
expect "an unknown option" 2 "--nonsense" -- --nonsense task ls
expect "no command" 2 "A subcommand is required" --
expect "a command from another group is not taken as a subcommand" 2 "profile" -- task profile ls
[ "$fail" = 0 ] && echo "weftctl commands: all cases passed"
exit "$fail"
