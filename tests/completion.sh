#!/bin/bash
# weftctl's shell completion (cli/completion.cc) as bash and zsh run it: commands,
# options, values of options skipped, file arguments, and nothing missing from the
# command table (every command `weftctl --help` lists is completed). Fails naming the case.
#   completion.sh WEFTCTL
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
"$bin" completion bash >"$dir/weftctl.bash" || { echo "FAIL: completion bash" >&2; exit 1; }
"$bin" completion zsh >"$dir/_weftctl" || { echo "FAIL: completion zsh" >&2; exit 1; }
mkdir "$dir/bin" && ln -s "$(readlink -f "$bin")" "$dir/bin/weftctl"
# The completion scripts call weftctl (for names): this one, with no control plane.
export PATH="$dir/bin:$PATH" WEFT_CONTROLPLANE="$dir/none.sock"

# bash: COMPREPLY for the command line "$1" (the cursor at its end), one per line.
complete_bash() {
  bash -c '
    source "$1"
    line=$2
    read -ra COMP_WORDS <<<"$line"
    case "$line" in *" ") COMP_WORDS+=("") ;; esac
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    _weftctl_bash
    printf "%s\n" "${COMPREPLY[@]}"' _ "$dir/weftctl.bash" "$1"
}
# expect CASE LINE WORD: completing LINE offers WORD.
expect() {
  out=$(cd "$dir" && complete_bash "$2")
  if ! grep -qxF -- "$3" <<<"$out"; then
    echo "FAIL $1: '$2' does not offer '$3': $(echo $out)" >&2
    fail=1
  fi
}
# refuse CASE LINE WORD: completing LINE does not offer WORD.
refuse() {
  out=$(cd "$dir" && complete_bash "$2")
  if grep -qxF -- "$3" <<<"$out"; then
    echo "FAIL $1: '$2' offers '$3'" >&2
    fail=1
  fi
}
touch "$dir/site.toml"
expect "a command" "weftctl jo" job
refuse "only matching" "weftctl jo" task
expect "a subcommand" "weftctl job " logs
expect "a new one" "weftctl entitlement " update
expect "machine assign" "weftctl machine as" assign
expect "an option" "weftctl job logs --i" --index
expect "a global option" "weftctl job logs --js" --json
expect "past an option's value" "weftctl --controlplane /x job lo" logs
expect "a file argument" "weftctl job create s" site.toml
expect "a file option" "weftctl task run --spec s" site.toml
refuse "hidden" "weftctl __" __names
# Nothing drifts: every command weftctl's help lists is offered.
for cmd in $("$bin" --help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && NF { print $1 }'); do
  expect "help's $cmd" "weftctl " "$cmd"
done
for grp in job entitlement machine task; do
  for cmd in $("$bin" "$grp" --help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && NF { print $1 }'); do
    expect "help's $grp $cmd" "weftctl $grp " "$cmd"
  done
done
# No control plane: a name argument offers nothing, quickly, and says nothing.
start=$(date +%s)
out=$(complete_bash "weftctl job show " 2>&1)
[ -z "$out" ] || { echo "FAIL: names without a control plane: $out" >&2; fail=1; }
[ $(($(date +%s) - start)) -le 3 ] || { echo "FAIL: names took too long" >&2; fail=1; }

# Names are data: a name holding $(...) or `...` (from a control plane that let it in,
# or a hostile one) runs nothing when completed, and is offered quoted. A weftctl whose
# __names prints such names, in front of the real one:
mkdir "$dir/hostile"
cat >"$dir/hostile/weftctl" <<SH
#!/bin/sh
if [ "\$1" = __names ]; then
  printf '%s\n' 'pay\$(touch $dir/ran-dollar)' 'pay\`touch $dir/ran-tick\`' 'pay *' 'payroll'
  exit 0
fi
exec "$(readlink -f "$bin")" "\$@"
SH
chmod +x "$dir/hostile/weftctl"
out=$(cd "$dir" && PATH="$dir/hostile:$PATH" complete_bash "weftctl entitlement show pay")
if [ -e "$dir/ran-dollar" ] || [ -e "$dir/ran-tick" ]; then
  echo "FAIL: completing a name ran a command embedded in it" >&2
  fail=1
fi
grep -qxF 'payroll' <<<"$out" || { echo "FAIL: names: no payroll in: $out" >&2; fail=1; }
grep -qxF 'pay\ \*' <<<"$out" || { echo "FAIL: names: 'pay *' not offered quoted: $out" >&2; fail=1; }
grep -qF 'touch' <<<"$out" && ! grep -qF 'pay\$\(touch' <<<"$out" &&
  { echo "FAIL: names: a command name offered unquoted: $out" >&2; fail=1; }
[ "$(wc -l <<<"$out")" = 4 ] || { echo "FAIL: names: want 4 candidates: $out" >&2; fail=1; }

# zsh: the file parses, and the shared part gives what bash gives.
if ! command -v zsh >/dev/null; then
  echo "FAIL: zsh is not installed (scripts/setup.sh --test installs it)" >&2
  exit 1
fi
zsh -n "$dir/_weftctl" || { echo "FAIL: _weftctl does not parse in zsh" >&2; fail=1; }
zout=$(cd "$dir" && zsh -c 'source <(sed "/^_weftctl_zsh \"\$@\"$/d" "$1"); _weftctl_complete lo job' _ "$dir/_weftctl")
grep -qxF logs <<<"$zout" || { echo "FAIL zsh: 'job lo' does not offer logs: $zout" >&2; fail=1; }
zout=$(cd "$dir" && zsh -c 'source <(sed "/^_weftctl_zsh \"\$@\"$/d" "$1"); _weftctl_complete --ma entitlement update' _ "$dir/_weftctl")
grep -qxF -- --max-unavailable <<<"$zout" || { echo "FAIL zsh: no --max-unavailable: $zout" >&2; fail=1; }
exit $fail
