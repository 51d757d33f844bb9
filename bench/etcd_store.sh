#!/usr/bin/env bash
# Job creation through the real control plane with each store, side by side in one run:
# sqlite (the default) and etcd (one member on this machine, the same disk, started
# here from Debian's etcd-server with the flags docs/replicas.md recommends).
#   bench/etcd_store.sh [machines] [jobs] [tasks]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
sim="$here/build/bench/fleet_sim"
machines=${1:-1000} jobs=${2:-1000} tasks=${3:-36}
dir=$(mktemp -d /var/tmp/weft-etcd-bench.XXXXXX)
port=$((30000 + RANDOM % 20000))
peer=$((port + 1))
etcd --name bench --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "bench=http://127.0.0.1:$peer" --max-txn-ops 4096 \
  --max-request-bytes 10485760 --log-level error >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  curl -sf -X POST "http://127.0.0.1:$port/v3/kv/range" -d '{"key":"eA=="}' >/dev/null && break
  sleep 0.1
done
common=(--machines "$machines" --jobs "$jobs" --tasks "$tasks" --clients 8 --rest 2
        --phases register,rest,create --machine-cpu-milli 64000 --machine-mem-mb 262144
        --domain-size 20 --task-cpu-milli 100 --task-mem-mb 64)
echo "== sqlite"
"$sim" "${common[@]}" | grep -E "fleet_sim:|create|jobs/s" || true
echo "== etcd (1 member, same disk)"
"$sim" "${common[@]}" --cp-config "$(printf '[store]\nkind = "etcd"\netcd_endpoints = ["http://127.0.0.1:%s"]\netcd_max_txn_ops = 4096\n' "$port")" \
  | grep -E "fleet_sim:|create|jobs/s" || true
