#!/usr/bin/env bash
# A C1M-style run (after Nomad's C1M): 1,000 jobs x 1,000 tasks = 1,000,000 tasks onto
# 5,000 simulated machines through the real control plane, on etcd (one member on this
# machine, started here as bench/etcd_store.sh does) or on sqlite.
#   bench/c1m.sh [etcd|sqlite] [machines] [jobs] [tasks]
# One session per machine carries its three daemons' calls (--daemons 1), to stay under
# this VM's descriptor limit.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
store=${1:-etcd} machines=${2:-5000} jobs=${3:-1000} tasks=${4:-1000}
sim=${SIM:-$here/build/bench/fleet_sim}
args=(--machines "$machines" --daemons 1 --jobs "$jobs" --tasks "$tasks" --task-cpu-milli 100
      --task-mem-mb 64 --rest 20 --clients 8 --phases register,rest,create,rest --timeout 400)
if [ "$store" = sqlite ]; then
  exec "$sim" "${args[@]}"
fi
dir=$(mktemp -d /var/tmp/weft-c1m.XXXXXX)
port=$((30000 + RANDOM % 20000))
peer=$((port + 1))
etcd --name bench --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "bench=http://127.0.0.1:$peer" --max-txn-ops 4096 \
  --max-request-bytes 10485760 --quota-backend-bytes 8589934592 --log-level error \
  >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  curl -sf -X POST "http://127.0.0.1:$port/v3/kv/range" -d '{"key":"eA=="}' >/dev/null && break
  sleep 0.1
done
"$sim" "${args[@]}" --cp-config "$(printf '[store]\nkind = "etcd"\netcd_endpoints = ["http://127.0.0.1:%s"]\netcd_max_txn_ops = 4096\n' "$port")"
