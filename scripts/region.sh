#!/usr/bin/env bash
# A small region on this machine, for trying one (docs/regions.md): etcd, a Resource
# Broker, two scheduler shards and a front end (each a weft-controlplane in its role),
# and this machine's daemons (agent, sidekick, hcs) joining the region through the
# broker. Through the front end it creates two entitlements (one per shard), the sample
# job examples/hello.job.toml in one of them: that shard borrows the machine from the
# broker, and the machine's daemons move to it. Then it shows the region through the
# front end and follows a task's output. Ctrl-C stops everything and removes it.
#   sudo scripts/region.sh           # until Ctrl-C
#   sudo scripts/region.sh --check   # stops once the job runs: exit 0 (tests/region_script.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then exec sudo --preserve-env=PATH "$0" "$@"; fi
check=0
[ "${1:-}" = --check ] && check=1

./scripts/setup.sh
. scripts/lib.sh
weft_configure build
cmake --build build --target $WEFT_PRODUCT_TARGETS

dev=$(mktemp -d /tmp/weft-region.XXXXXX)
cg2=$(awk '$9 == "cgroup2" {print $5; exit}' FS=' ' /proc/self/mountinfo)
cgroot="$cg2/weft-region-$$"
controllers_before=$(cat "$cg2/cgroup.subtree_control")
machine="region-$(hostname -s)"
cp_bin=./build/controlplane/weft-controlplane
pids=()
follow_pid=""
weftctl() { ./build/cli/weftctl --controlplane "$dev/frontend.sock" "$@"; }
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "== stopping the job, then the region"
  weft_trial_stop_job hello
  weft_trial_stop "$cgroot" "$cg2" "$controllers_before"
  echo "== stopped"
}
trap cleanup INT TERM EXIT

# etcd: one member on loopback ports no one uses.
for _ in $(seq 20); do
  port=$((20000 + RANDOM % 20000))
  (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null || (echo >"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null || break
done
setsid etcd --name region --data-dir "$dev/etcd" \
  --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-cluster "region=http://127.0.0.1:$((port + 1))" --log-level error >"$dev/etcd.log" 2>&1 &
pids+=($!)

# Each role's controlplane.toml: the same etcd, each group its own prefix, one region.
shards="[region.shards]
s1 = \"unix:$dev/s1.sock\"
s2 = \"unix:$dev/s2.sock\""
role_config() {  # NAME ROLE-LINES
  cat > "$dev/$1.toml" <<TOML
socket = "$dev/$1.sock"
state_dir = "$dev/$1"
listen = ""                    # this trial's roles and machine use Unix sockets
heartbeat_interval = "1s"
[store]
kind = "etcd"
etcd_endpoints = ["http://127.0.0.1:$port"]
etcd_prefix = "/weft/$1/"
[region]
prefix = "/weft/region/"
$2
TOML
}
role_config broker "role = \"broker\"
$shards"
for s in s1 s2; do
  role_config "$s" "role = \"shard\"
shard = \"$s\"
brokers = \"unix:$dev/broker.sock\""
done
role_config frontend "role = \"front-end\"
brokers = \"unix:$dev/broker.sock\"
$shards"
weft_machine_configs "$dev" "$machine" "$cgroot" "unix:$dev/broker.sock"

echo "== etcd, a broker, two shards and a front end"
for role in broker s1 s2 frontend; do
  weft_trial_start "$role" "$cp_bin" "$dev/$role.toml"
  weft_trial_wait_socket "$dev/$role.sock"
done
for _ in $(seq 150); do
  weftctl --json controlplane status 2>/dev/null | grep -q '"connected": false' || break
  sleep 0.2
done
echo "== this machine's daemons join the region through the broker"
weft_trial_start agent ./build/agent/weft-agent "$dev/agent.toml"
weft_trial_wait_socket "$dev/agent.sock"
weft_trial_start sidekick ./build/sidekick/weft-sidekick "$dev/sidekick.toml"
weft_trial_wait_socket "$dev/sidekick.sock"
weft_trial_start hcs ./build/hcs/weft-hcs "$dev/hcs.toml"
weft_trial_wait_socket "$dev/hcs.sock"
for _ in $(seq 150); do
  weftctl --json machine ls 2>/dev/null | grep -q '"state": "\(ok\|degraded\)"' && break
  sleep 0.2
done
weftctl machine ls

echo "== an entitlement through the front end (a shard is chosen for it), the sample job in it"
weftctl entitlement create demo --quota 1 --profile dev
# The shard that owns "demo" borrows the machine; once its daemons have moved there,
# the job fits.
created=0
for _ in $(seq 60); do
  if weftctl job create --timeout 60 examples/hello.job.toml >"$dev/create.out" 2>&1; then
    created=1
    break
  fi
  sleep 1
done
cat "$dev/create.out"
if [ "$created" -ne 1 ]; then
  echo "region: the job did not start; the machine says:" >&2
  weftctl machine show "$machine" >&2 || true
  exit 1
fi
# A second entitlement goes to the other shard (the one with fewer); the broker has no
# machine left to lend it.
weftctl entitlement create spare --quota 1
echo
weftctl --json entitlement ls | grep -E '"(name|shard)"'
echo
weftctl machine ls
echo
weftctl job ls
echo
weftctl controlplane status
if [ "$check" -eq 1 ]; then
  running=0
  for _ in $(seq 150); do
    running=$(weftctl --json job show hello | grep -c '"state": "running"' || true)
    [ "$running" -ge 2 ] && break
    sleep 0.2
  done
  if [ "$running" -lt 2 ]; then
    echo "region: the sample job's tasks are not running" >&2
    exit 1
  fi
  echo "== region check: the sample job runs on its shard"
  exit 0
fi
task=$(weftctl --json job show hello | sed -n 's/.*"id": "\(hello[^"]*\)".*/\1/p' | awk 'NR == 1')
echo "== following $task's output (Ctrl-C stops everything)"
weftctl task logs "$task" -f &
follow_pid=$!
wait "${pids[0]}"
