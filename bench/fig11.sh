#!/usr/bin/env bash
# Twine's Fig. 11 in weft's terms (docs/benchmarks.md, issue 45): a shard's CPU, memory
# and messages against the machines it holds, at rest. For each size, the fleet
# simulator's machines (three daemon sessions each, heartbeat 2 s) register with
# weft-controlplane as shard s1 of a region on one etcd member (started here), then rest
# 10 s; the shard's CPU and RSS are read from /proc. Writes a CSV and a PNG.
#   bench/fig11.sh [BUILD_DIR] [OUT_DIR] [SIZES]   (sizes: "1000 2000 3000 4000 5000")
# The simulator holds three descriptors a machine too: sizes stay under the workplace's
# 20,000-descriptor limit per process.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-docs/fig11}
sizes=${3:-"1000 2000 3000 4000 5000"}
mkdir -p "$out"
dir=$(mktemp -d /var/tmp/weft-fig11.XXXXXX)
. "$here/bench/etcd.sh"
start_etcd "$dir"
csv="$out/shard-at-rest.csv"
echo "machines,cpu_percent,rss_mib,msgs_per_s,register_s" >"$csv"
for n in $sizes; do
  line=$("$build/bench/fleet_sim" --machines "$n" --rest 10 --phases register,rest \
    --machine-cpu-milli 64000 --machine-mem-mb 262144 --domain-size 20 \
    --region-etcd "http://127.0.0.1:$etcd_port" --region-role shard | tee /dev/stderr |
    awk '/^register/ {reg=$2} /^rest/ {
      for (i = 1; i <= NF; i++) {
        if ($i == "CPU") cpu = $(i + 1)
        if ($i == "RSS") rss = $(i + 1)
        if ($i == "sent") msg = $(i + 1)
      }
    } END { sub("%", "", cpu); printf "%s,%s,%s,%s", cpu, rss, msg, reg }')
  echo "$n,$line" >>"$csv"
done
cat "$csv"
gnuplot <<GP
set terminal pngcairo size 1000,520 font "sans,11"
set output "$out/shard-at-rest.png"
set datafile separator ","
set title "weft shard at rest: CPU and memory against the machines it holds (2 vCPUs, heartbeat 2 s)"
set xlabel "machines held (three daemon sessions each)"
set ylabel "CPU, % of a core"
set y2label "RSS, MiB"
set y2tics
set ytics nomirror
set key top left
set xrange [0:*]
set yrange [0:*]
set y2range [0:*]
plot "$csv" every ::1 using 1:2 with linespoints lw 2 title "CPU", \
     "" every ::1 using 1:3 axes x1y2 with linespoints lw 2 title "RSS"
GP
echo "wrote $csv and $out/shard-at-rest.png"
