# Sourced by the benchmarks that need etcd (bench/etcd_store.sh, bench/c1m.sh): one
# member on this machine, from Debian's etcd-server, with the flags docs/replicas.md
# recommends.
#   start_etcd DIR [more etcd flags]   -> $etcd_port; etcd (and DIR) go when the script exits
start_etcd() {
  local dir=$1
  shift
  etcd_port=$((30000 + RANDOM % 20000))
  local peer=$((etcd_port + 1))
  etcd --name bench --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "bench=http://127.0.0.1:$peer" --max-txn-ops 4096 \
    --max-request-bytes 10485760 --log-level error "$@" >"$dir/etcd.log" 2>&1 &
  etcd_pid=$!
  etcd_dir=$dir
  # (each step may fail under set -e: the next still runs)
  trap 'kill $etcd_pid 2>/dev/null || true; wait $etcd_pid 2>/dev/null || true; rm -rf "$etcd_dir"' EXIT
  for _ in $(seq 100); do
    curl -sf -X POST "http://127.0.0.1:$etcd_port/v3/kv/range" -d '{"key":"eA=="}' >/dev/null &&
      return 0
    sleep 0.1
  done
  echo "etcd did not answer on 127.0.0.1:$etcd_port ($dir/etcd.log)" >&2
  return 1
}
