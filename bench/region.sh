#!/usr/bin/env bash
# What a region's front end costs (docs/regions.md, issue 44), side by side in one run:
# the fleet simulator's machines on a shard (weft-controlplane as shard s1 of a region on
# one etcd member, started here), job.create reaching the shard directly and then through
# a front end (weft-controlplane as front end, routing to s1). Each run prints the
# shard's CPU, RSS and messages at rest and while creating, and the front end's CPU and
# RSS while it routes; then what a machine at rest costs a broker against a shard.
#   bench/region.sh [machines] [jobs] [tasks]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
machines=${1:-2000} jobs=${2:-1000} tasks=${3:-36}
dir=$(mktemp -d /var/tmp/weft-region-bench.XXXXXX)
. "$here/bench/etcd.sh"
start_etcd "$dir"
common=(--machines "$machines" --jobs "$jobs" --tasks "$tasks" --clients 8 --rest 5
        --phases register,rest,create --machine-cpu-milli 64000 --machine-mem-mb 262144
        --domain-size 20 --task-cpu-milli 100 --task-mem-mb 64
        --region-etcd "http://127.0.0.1:$etcd_port")
for via in shard front-end; do
  echo "== job.create through the $via"
  "$here/build/bench/fleet_sim" "${common[@]}" --jobs-via "$via" |
    grep -E "fleet_sim:|rest|create|jobs/s" || true
done
# What a machine at rest costs a broker (a free machine) against a shard (a lent one):
# the same machines registered and then at rest for 10 s, side by side.
rest=(--machines "$machines" --clients 8 --rest 10 --phases register,rest
      --machine-cpu-milli 64000 --machine-mem-mb 262144 --domain-size 20
      --region-etcd "http://127.0.0.1:$etcd_port")
for role in broker shard; do
  echo "== $machines machines at rest on a $role"
  "$here/build/bench/fleet_sim" "${rest[@]}" --region-role "$role" |
    grep -E "fleet_sim:|register|rest" || true
done
