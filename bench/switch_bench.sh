#!/usr/bin/env bash
# Host-profile switch time, weft-sidekick side by side with TuneD, in one run.
#
#   sudo bench/switch_bench.sh [ITERATIONS]      (default 30)
#
# The profile: 20 net.* sysctls + MTU and txqueuelen of a veth + IRQ affinity of the
# virtio NIC queues + THP enabled/defrag. Everything runs in a private network and mount
# namespace (the sysctls and the veth are the namespace's own); THP and IRQ affinity are
# host-wide and restored on exit. TuneD (Debian's `tuned`, installed here if missing)
# runs in its no-daemon mode with its own config bind-mounted inside the namespace, so
# the host's /etc/tuned is untouched.
#
# Prints, for weft: engine time (plan + apply + verify + commit, as the daemon reports
# it) and `weftctl profile switch` wall time; for TuneD: `tuned --profile` wall time in
# its one-shot mode (Python start-up included: that is what applying a TuneD profile
# without a running daemon costs).
# Full switch = from `default`/off to the profile; diff switch = between two profiles
# that differ in 4 settings.
set -euo pipefail
N=${1:-30}
here=$(cd "$(dirname "$0")/.." && pwd)
build=${WEFT_BUILD:-$here/build}
[ "$(id -u)" -eq 0 ] || { echo "needs root" >&2; exit 1; }
command -v tuned-adm >/dev/null || {
  echo "installing Debian's tuned for the comparison" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends tuned >/dev/null
}
if [ "${1:-}" != "--inner" ] && [ -z "${WEFT_BENCH_INNER:-}" ]; then
  # Save what is host-wide, run the rest in fresh namespaces, restore.
  thp_en=$(sed 's/.*\[\(.*\)\].*/\1/' /sys/kernel/mm/transparent_hugepage/enabled)
  thp_df=$(sed 's/.*\[\(.*\)\].*/\1/' /sys/kernel/mm/transparent_hugepage/defrag)
  declare -A irq_saved
  for irq in $(awk '/virtio[0-9]+-input/ {sub(":", "", $1); print $1}' /proc/interrupts); do
    irq_saved[$irq]=$(cat /proc/irq/$irq/smp_affinity_list)
  done
  restore() {
    echo "$thp_en" > /sys/kernel/mm/transparent_hugepage/enabled
    echo "$thp_df" > /sys/kernel/mm/transparent_hugepage/defrag
    for irq in "${!irq_saved[@]}"; do echo "${irq_saved[$irq]}" > /proc/irq/$irq/smp_affinity_list 2>/dev/null || true; done
  }
  trap restore EXIT
  WEFT_BENCH_INNER=1 unshare -n -m "$0" "$N"
  exit $?
fi

# ---- inside the namespaces
mount --make-rprivate /
mount -t sysfs sysfs /sys            # /sys/class/net shows this namespace's links
mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null || true
ip link set lo up
ip link add wb0 type veth peer name wb1
tmp=$(mktemp -d /tmp/weft-switch-bench.XXXXXX)
trap 'kill $(cat $tmp/sk.pid 2>/dev/null) 2>/dev/null || true; rm -rf $tmp' EXIT
mkdir -p "$tmp/profiles" "$tmp/tuned/bench-a" "$tmp/tuned/bench-b" "$tmp/cg"
echo "" > "$tmp/cg/cgroup.subtree_control"

sysctls_a=(
  "net.core.somaxconn=8192" "net.ipv4.tcp_rmem=4096 262144 16777216" "net.ipv4.tcp_wmem=4096 65536 16777216"
  "net.ipv4.ip_forward=1" "net.ipv4.tcp_fin_timeout=15" "net.ipv4.tcp_keepalive_time=600"
  "net.ipv4.tcp_keepalive_intvl=30" "net.ipv4.tcp_keepalive_probes=5" "net.ipv4.tcp_syncookies=0"
  "net.ipv4.tcp_max_syn_backlog=8192" "net.ipv4.tcp_tw_reuse=1" "net.ipv4.tcp_slow_start_after_idle=0"
  "net.ipv4.tcp_mtu_probing=1" "net.ipv4.ip_local_port_range=1024 65000" "net.ipv4.tcp_sack=1"
  "net.ipv4.tcp_timestamps=1" "net.ipv4.tcp_window_scaling=1" "net.ipv4.conf.all.rp_filter=1"
  "net.ipv4.conf.default.rp_filter=1" "net.ipv4.icmp_echo_ignore_broadcasts=1")
# B differs from A in three sysctls and the MTU.
sysctls_b=("${sysctls_a[@]}")
sysctls_b[0]="net.core.somaxconn=16384"; sysctls_b[4]="net.ipv4.tcp_fin_timeout=30"; sysctls_b[5]="net.ipv4.tcp_keepalive_time=900"
irq_glob='virtio*-input*'
write_weft() {  # name mtu sysctls...
  local name=$1 mtu=$2; shift 2
  { echo "[sysctl]"
    for kv in "$@"; do echo "\"${kv%%=*}\" = \"${kv#*=}\""; done
    printf '[thp]\nenabled = "madvise"\ndefrag = "defer+madvise"\n'
    printf '[nic."wb0"]\nmtu = %s\ntxqueuelen = 5000\n' "$mtu"
    printf '[irq."%s"]\ncpus = "0"\nbest_effort = true\n' "$irq_glob"
  } > "$tmp/profiles/$name.toml"
}
write_tuned() {  # name mtu sysctls...
  local name=$1 mtu=$2; shift 2
  { printf '[main]\nsummary=weft switch benchmark\n[sysctl]\n'
    for kv in "$@"; do echo "${kv%%=*}=${kv#*=}"; done
    printf '[vm]\ntransparent_hugepages=madvise\n'
    printf '[sysfs]\n/sys/kernel/mm/transparent_hugepage/defrag=defer+madvise\n'
    printf '/sys/class/net/wb0/mtu=%s\n/sys/class/net/wb0/tx_queue_len=5000\n' "$mtu"
  } > "$tmp/tuned/$name/tuned.conf"
}
write_weft a 9000 "${sysctls_a[@]}"
write_weft b 4000 "${sysctls_b[@]}"
printf 'description = "nothing"\n' > "$tmp/profiles/default.toml"
write_tuned bench-a 9000 "${sysctls_a[@]}"
write_tuned bench-b 4000 "${sysctls_b[@]}"

# TuneD: its own /etc/tuned with daemon = 0: `tuned --profile X` applies the profile
# once ("one shot no daemon mode") and exits. tuned-adm would try to restart the daemon
# through systemd instead. Everything else in TuneD's config stays at its defaults.
cp -r /etc/tuned "$tmp/etc-tuned"
sed -i 's/^daemon *=.*/daemon = 0/' "$tmp/etc-tuned/tuned-main.conf"
cp -r "$tmp/tuned/bench-a" "$tmp/tuned/bench-b" "$tmp/etc-tuned/"
mount --bind "$tmp/etc-tuned" /etc/tuned

cat > "$tmp/sidekick.toml" <<TOML
socket = "$tmp/sk.sock"
state_dir = "$tmp/state"
profile_dirs = ["$tmp/profiles"]
workload_cgroup = "$tmp/cg"
verify_interval = "1h"
TOML
"$build/sidekick/weft-sidekick" -c "$tmp/sidekick.toml" >"$tmp/sk.log" 2>&1 &
echo $! > "$tmp/sk.pid"
for _ in $(seq 100); do [ -S "$tmp/sk.sock" ] && break; sleep 0.05; done
ctl() { "$build/cli/weftctl" --sidekick "$tmp/sk.sock" "$@"; }

ms() { date +%s%N; }
declare -a w_full_e w_full_c w_diff_e w_diff_c t_full t_diff
switch_weft() {  # profile -> "engine_ms cli_ms"
  local t0 t1 out
  t0=$(ms); out=$(ctl --json profile switch "$1" || true); t1=$(ms)
  printf '%s' "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)
if r.get("outcome") not in ("ok", "degraded"):
    sys.exit("weft switch failed: " + json.dumps(r))
print(r["duration_us"] / 1000.0, int(sys.argv[1]) / 1e6)' "$((t1 - t0))"
}
switch_tuned() {
  local t0 t1; t0=$(ms)
  tuned --no-dbus --log="$tmp/tuned.log" --profile "$1" >/dev/null 2>&1 || { echo "tuned --profile $1 failed" >&2; exit 1; }
  t1=$(ms)
  awk "BEGIN{print ($t1-$t0)/1e6}"
}
for i in $(seq "$N"); do
  ctl profile off >/dev/null || true
  read -r e c < <(switch_weft a); w_full_e+=("$e"); w_full_c+=("$c")
  [ "$(cat /proc/sys/net/core/somaxconn)" = 8192 ] && [ "$(cat /sys/class/net/wb0/mtu)" = 9000 ] ||
    { echo "weft did not apply a" >&2; exit 1; }
  read -r e c < <(switch_weft b); w_diff_e+=("$e"); w_diff_c+=("$c")
  [ "$(cat /proc/sys/net/core/somaxconn)" = 16384 ] && [ "$(cat /sys/class/net/wb0/mtu)" = 4000 ] ||
    { echo "weft did not apply b" >&2; exit 1; }
  ctl profile off >/dev/null || true
  # TuneD's one-shot mode keeps no state between runs: each run applies its whole
  # profile, which is what a TuneD switch does anyway (roll back, re-apply everything).
  t_full+=("$(switch_tuned bench-a)")
  # Both tools must really have applied the profile, or the timing means nothing.
  [ "$(cat /proc/sys/net/core/somaxconn)" = 8192 ] && [ "$(cat /sys/class/net/wb0/mtu)" = 9000 ] ||
    { echo "TuneD did not apply bench-a" >&2; exit 1; }
  t_diff+=("$(switch_tuned bench-b)")
  [ "$(cat /proc/sys/net/core/somaxconn)" = 16384 ] && [ "$(cat /sys/class/net/wb0/mtu)" = 4000 ] ||
    { echo "TuneD did not apply bench-b" >&2; exit 1; }
done
pct() {  # p values... -> value at percentile p
  local p=$1; shift
  printf '%s\n' "$@" | sort -g | awk -v p="$p" '{a[NR]=$1} END {i=int(p*(NR-1)+0.5)+1; printf "%.1f", a[i]}'
}
echo "switch_bench: $N iterations, $(nproc) CPUs, kernel $(uname -r), TuneD $(tuned --version 2>&1 | head -1)"
echo "profile: 20 net.* sysctls, veth MTU + txqueuelen, IRQ affinity of $(grep -c 'virtio[0-9]*-input' /proc/interrupts) virtio queue IRQs (weft only), THP enabled + defrag"
printf '%-44s %10s %10s\n' "" "p50 ms" "p90 ms"
printf '%-44s %10s %10s\n' "weft full switch, engine" "$(pct .5 "${w_full_e[@]}")" "$(pct .9 "${w_full_e[@]}")"
printf '%-44s %10s %10s\n' "weft full switch, weftctl wall" "$(pct .5 "${w_full_c[@]}")" "$(pct .9 "${w_full_c[@]}")"
printf '%-44s %10s %10s\n' "weft diff switch (4 settings), engine" "$(pct .5 "${w_diff_e[@]}")" "$(pct .9 "${w_diff_e[@]}")"
printf '%-44s %10s %10s\n' "weft diff switch, weftctl wall" "$(pct .5 "${w_diff_c[@]}")" "$(pct .9 "${w_diff_c[@]}")"
printf '%-44s %10s %10s\n' "TuneD full switch, tuned --profile wall" "$(pct .5 "${t_full[@]}")" "$(pct .9 "${t_full[@]}")"
printf '%-44s %10s %10s\n' "TuneD diff switch, tuned --profile wall" "$(pct .5 "${t_diff[@]}")" "$(pct .9 "${t_diff[@]}")"
awk -v a="$(pct .9 "${t_full[@]}")" -v b="$(pct .9 "${w_full_c[@]}")" 'BEGIN{printf "ratio TuneD/weft p90, full switch (wall):   %.1fx\n", a/b}'
awk -v a="$(pct .9 "${t_diff[@]}")" -v b="$(pct .9 "${w_diff_c[@]}")" 'BEGIN{printf "ratio TuneD/weft p90, diff switch (wall):   %.1fx\n", a/b}'
