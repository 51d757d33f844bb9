#!/usr/bin/env bash
# Job creation through the real control plane with each store, side by side in one run:
# sqlite (the default) and etcd (one member on this machine, the same disk, started
# here from Debian's etcd-server with the flags docs/replicas.md recommends).
#   bench/etcd_store.sh [machines] [jobs] [tasks]
# BASELINE=<another build directory> runs the same phases with that build's control plane
# and simulator too (the previous release, say), each store's runs back to back:
#   git worktree add /tmp/prev <commit> && cmake -S /tmp/prev -B /tmp/prev/build -G Ninja \
#     -DCMAKE_BUILD_TYPE=RelWithDebInfo && ninja -C /tmp/prev/build fleet_sim weft-controlplane
#   BASELINE=/tmp/prev/build bench/etcd_store.sh 5000 1000 36
# ALLOCATORS="glibc jemalloc mimalloc" runs this build's control plane once per malloc
# (LD_PRELOAD of Debian's libjemalloc2 / libmimalloc2.0 into the control plane alone;
# "glibc": none, or whatever the binary links), STORES="etcd" one store only, DAEMONS=1
# one session a machine instead of three (10,000 machines under a 20,000-descriptor
# limit).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
builds=("$here/build")
[ -n "${BASELINE:-}" ] && builds=("$BASELINE" "$here/build")
machines=${1:-1000} jobs=${2:-1000} tasks=${3:-36}
dir=$(mktemp -d /var/tmp/weft-etcd-bench.XXXXXX)
. "$here/bench/etcd.sh"
start_etcd "$dir"
port=$etcd_port
common=(--machines "$machines" --jobs "$jobs" --tasks "$tasks" --clients 8 --rest 2
        --phases register,rest,create --machine-cpu-milli 64000 --machine-mem-mb 262144
        --domain-size 20 --task-cpu-milli 100 --task-mem-mb 64 --daemons "${DAEMONS:-3}")
lib=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
variants=()
for b in "${builds[@]}"; do
  if [ -n "${ALLOCATORS:-}" ] && [ "$b" = "$here/build" ]; then
    for a in $ALLOCATORS; do variants+=("$b|$a"); done
  else
    variants+=("$b|")
  fi
done
n=0
for store in ${STORES:-sqlite etcd}; do
  for v in "${variants[@]}"; do
    b=${v%%|*} alloc=${v#*|}
    n=$((n + 1))
    case "$alloc" in
      jemalloc) export WEFT_BENCH_CP_PRELOAD=$lib/libjemalloc.so.2 ;;
      mimalloc) export WEFT_BENCH_CP_PRELOAD=$lib/libmimalloc.so.2 ;;
      glibc | "") unset WEFT_BENCH_CP_PRELOAD ;;
      *) echo "unknown allocator $alloc" >&2; exit 2 ;;
    esac
    extra=()
    if [ "$store" = etcd ]; then
      # A prefix of its own per run: each run starts from an empty state.
      extra=(--cp-config "$(printf '[store]\nkind = "etcd"\netcd_endpoints = ["http://127.0.0.1:%s"]\netcd_prefix = "/run%s/"\netcd_max_txn_ops = 4096\n' "$port" "$n")")
    fi
    echo "== $store, $b${alloc:+, $alloc}"
    "$b/bench/fleet_sim" "${common[@]}" "${extra[@]}" | grep -E "fleet_sim:|^rest|create|jobs/s" || true
  done
done
