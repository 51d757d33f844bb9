#!/usr/bin/env bash
# A region's size and its moves (issue 45; docs/benchmarks.md), each on its own etcd
# member: bench/region_bench with a broker, three shards and a front end.
#   bench/region_move.sh move [machines] [tasks]   an entitlement of `machines` machines and
#                                                  `tasks` tasks moved between s1 and s2
#                                                  (default 1000 and 10000), 5 times
#   bench/region_move.sh spread [jobs] [tasks]     job.create into one shard, then three
#   bench/region_move.sh hold [machines]           machines held by three shards at rest;
#                                                  above 15,000 the simulator is two
#                                                  processes (each may hold 20,000 sessions)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-move}
bin="$here/build/bench/region_bench"
run() {
  local dir
  dir=$(mktemp -d /var/tmp/weft-region-move.XXXXXX)
  . "$here/bench/etcd.sh"
  start_etcd "$dir" --quota-backend-bytes 8589934592
  "$bin" --etcd "http://127.0.0.1:$etcd_port" "$@"
}
case $what in
  move)
    m=${2:-1000} t=${3:-10000}
    # Tasks of 6 cores on machines of 64: ten a machine, so that 10,000 tasks hold 1,000
    # machines.
    run --machines $((m + 40)) --move-machines "$m" --move-jobs 10 --move-tasks $((t / 10)) \
      --task-cpu-milli 6000 --moves 5 --phases register,move --timeout 600
    ;;
  spread)
    jobs=${2:-1000} tasks=${3:-36}
    for n in 1 3; do
      (run --machines 3000 --jobs "$jobs" --tasks "$tasks" --clients 8 --spread-shards "$n" \
        --phases register,spread --timeout 600)
    done
    ;;
  hold)
    m=${2:-30000}
    if [ "$m" -le 15000 ]; then
      run --machines "$m" --hold-machines "$m" --rest 30 --heartbeat 5 --phases register,hold \
        --timeout 1200
    else
      # The region and the first half of the machines in one process; the second half
      # joins the same broker from another (its port read from the first one's output).
      half=$((m / 2))
      dir=$(mktemp -d /var/tmp/weft-region-hold.XXXXXX)
      . "$here/bench/etcd.sh"
      start_etcd "$dir" --quota-backend-bytes 8589934592
      "$bin" --etcd "http://127.0.0.1:$etcd_port" --machines "$half" --hold-machines "$m" \
        --rest 30 --heartbeat 5 --phases register,hold --timeout 1800 \
        >"$dir/first.out" 2>&1 &
      first=$!
      for _ in $(seq 600); do
        port=$(sed -n 's/^region_bench: broker2 port //p' "$dir/first.out" | head -1)
        [ -n "$port" ] && break
        sleep 0.5
      done
      # dc2's machines, with dc2's broker (broker2).
      "$bin" --etcd "http://127.0.0.1:$etcd_port" --attach "$port" --first "$half" --dc dc2 \
        --machines "$half" --rest 600 --heartbeat 5 --phases register,rest --timeout 1800 &
      second=$!
      wait $first || true
      kill $second 2>/dev/null || true
      wait $second 2>/dev/null || true
      cat "$dir/first.out"
    fi
    ;;
  *) echo "usage: $0 move|spread|hold ..." >&2; exit 2 ;;
esac
