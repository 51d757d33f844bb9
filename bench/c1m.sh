#!/usr/bin/env bash
# A C1M-style run (after Nomad's C1M): 1,000 jobs x 1,000 tasks = 1,000,000 tasks onto
# 5,000 simulated machines through the real control plane, on etcd (one member on this
# machine, started by bench/etcd.sh) or on sqlite.
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
. "$here/bench/etcd.sh"
start_etcd "$dir" --quota-backend-bytes 8589934592
port=$etcd_port
"$sim" "${args[@]}" --cp-config "$(printf '[store]\nkind = "etcd"\netcd_endpoints = ["http://127.0.0.1:%s"]\netcd_max_txn_ops = 4096\n' "$port")"
