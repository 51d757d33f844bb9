#!/usr/bin/env bash
# weft's main job on one machine: installs dependencies, builds, starts weft-agent in the
# foreground with a sample task started through weftctl, and follows its output.
# Ctrl-C stops the sample task and the agent and removes everything it made.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then exec sudo --preserve-env=PATH "$0" "$@"; fi

./scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build

dev=$(mktemp -d /tmp/weft-demo.XXXXXX)
cg2=$(awk '$9 == "cgroup2" {print $5; exit}' FS=' ' /proc/self/mountinfo)
cgroot="$cg2/weft-demo-$$"
cat > "$dev/agent.toml" <<TOML
socket = "$dev/agent.sock"
state_dir = "$dev/state"
cgroup_root = "$cgroot"
[labels]
role = "demo"
TOML
weftctl() { ./build/cli/weftctl --agent "$dev/agent.sock" "$@"; }

agent_pid=""
follow_pid=""
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "== stopping the sample task and the agent"
  [ -n "$follow_pid" ] && kill "$follow_pid" 2>/dev/null || true
  weftctl task stop sample --grace 2s >/dev/null 2>&1 || true
  for _ in $(seq 50); do
    weftctl --json task ls 2>/dev/null | grep -q '"state": "stopping"' || break
    sleep 0.1
  done
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null || true
  # Tasks outlive the agent by design; the demo cleans up after itself.
  if [ -d "$cgroot" ]; then
    find "$cgroot" -depth -type d | while read -r d; do
      echo 1 > "$d/cgroup.kill" 2>/dev/null || true
      for _ in $(seq 100); do rmdir "$d" 2>/dev/null && break; sleep 0.02; done
    done
  fi
  rm -rf "$dev"
}
trap cleanup INT TERM EXIT

# Its own session: Ctrl-C reaches this script, which stops things in order.
setsid ./build/agent/weft-agent -c "$dev/agent.toml" &
agent_pid=$!
for _ in $(seq 100); do [ -S "$dev/agent.sock" ] && weftctl agent info >/dev/null 2>&1 && break; sleep 0.05; done

echo "== agent"
weftctl agent info
echo "== starting a sample task"
weftctl task run --name sample --restart on-failure --stop-grace 2s -- \
  sh -c 'n=0; while true; do n=$((n+1)); echo "hello from a weft task ($n), pid $$ in $(grep ^0:: /proc/self/cgroup)"; sleep 2; done'
weftctl task ls
echo "== following its output (Ctrl-C stops everything)"
weftctl task logs sample -f &
follow_pid=$!
wait "$agent_pid"
