#!/usr/bin/env bash
# weft's main job on one machine: installs dependencies, builds, and starts a
# single-machine cluster in a dev directory: weft-controlplane, weft-agent,
# weft-sidekick and weft-hcs, the way a fleet machine runs them, with the agent's tasks
# in their own cgroup subtree and the host profile limited to a safe dev profile
# (examples/dev.toml touches only that subtree). It creates an entitlement, deploys the
# sample job examples/hello.job.toml through the control plane, shows the cluster and
# follows a task's output. Ctrl-C stops the job, the daemons, and removes everything.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then exec sudo --preserve-env=PATH "$0" "$@"; fi

./scripts/setup.sh
# Only what the demo runs (the test command builds the rest, in the same tree).
. scripts/lib.sh
weft_configure build
cmake --build build --target $WEFT_PRODUCT_TARGETS

dev=$(mktemp -d /tmp/weft-demo.XXXXXX)
cg2=$(awk '$9 == "cgroup2" {print $5; exit}' FS=' ' /proc/self/mountinfo)
cgroot="$cg2/weft-demo-$$"
# The agent enables its controllers from the cgroup2 mount down (as systemd's Delegate=
# would); the demo puts the mount's subtree_control back as it found it.
controllers_before=$(cat "$cg2/cgroup.subtree_control")
machine="demo-$(hostname -s)"
cat > "$dev/controlplane.toml" <<TOML
socket = "$dev/controlplane.sock"
state_dir = "$dev/controlplane"
listen = ""                    # machines of this demo use the Unix socket
heartbeat_interval = "1s"
TOML
weft_machine_configs "$dev" "$machine" "$cgroot" "unix:$dev/controlplane.sock"
weftctl_cmd=(./build/cli/weftctl --agent "$dev/agent.sock" --sidekick "$dev/sidekick.sock"
  --hcs "$dev/hcs.sock" --controlplane "$dev/controlplane.sock")
weftctl() { "${weftctl_cmd[@]}" "$@"; }

pids=()
follow_pid=""
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "== stopping the job, then the daemons"
  weft_trial_stop_job hello
  weft_trial_stop "$cgroot" "$cg2" "$controllers_before"
  echo "== stopped"
}
trap cleanup INT TERM EXIT

weft_trial_start controlplane ./build/controlplane/weft-controlplane "$dev/controlplane.toml"
weft_trial_wait_socket "$dev/controlplane.sock"
weft_trial_start agent ./build/agent/weft-agent "$dev/agent.toml"
weft_trial_wait_socket "$dev/agent.sock"
weft_trial_start sidekick ./build/sidekick/weft-sidekick "$dev/sidekick.toml"
weft_trial_wait_socket "$dev/sidekick.sock"
weft_trial_start hcs ./build/hcs/weft-hcs "$dev/hcs.toml"
weft_trial_wait_socket "$dev/hcs.sock"

echo "== the machine joins the control plane (agent, sidekick, HCS verdict)"
for _ in $(seq 100); do
  weftctl --json machine ls | grep -q '"state": "\(ok\|degraded\|failed\)"' && break
  sleep 0.2
done
weftctl machine ls
echo "== an entitlement with the dev host profile, and the sample job"
weftctl entitlement create demo --quota 1 --profile dev
if ! weftctl job create --timeout 60 examples/hello.job.toml; then
  echo "demo: the job did not start; the machine says:" >&2
  weftctl machine show "$machine" >&2 || true
fi
echo
weftctl machine ls
echo
weftctl job show hello
# awk, not head: head closing the pipe early would fail this line under pipefail.
task=$(weftctl --json job show hello | sed -n 's/.*"id": "\(hello[^"]*\)".*/\1/p' | awk 'NR == 1')
echo "== following $task's output (Ctrl-C stops everything)"
"${weftctl_cmd[@]}" task logs "$task" -f &
follow_pid=$!
wait "${pids[0]}"
