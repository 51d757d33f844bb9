#!/usr/bin/env bash
# Twine's Fig. 12 in weft's terms (docs/benchmarks.md, issue 45): a shard's CPU against
# the job allocations it makes a second. For each rate, 2,000 simulated machines register
# with weft-controlplane as shard s1 of a region on one etcd member (started here), then
# 8 callers create jobs of 36 tasks paced at that rate (fleet_sim --create-rate) for
# about 8 s; the shard's CPU over the creates is read from /proc (the allocator, the
# scheduler, the etcd writes and the task.run commands: the shard's whole cost of an
# allocation). Writes a CSV and a PNG.
#   bench/fig12.sh [BUILD_DIR] [OUT_DIR] [RATES]   (rates: "25 50 100 200 300 400")
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-docs/fig12}
rates=${3:-"25 50 100 200 300 400"}
mkdir -p "$out"
dir=$(mktemp -d /var/tmp/weft-fig12.XXXXXX)
. "$here/bench/etcd.sh"
start_etcd "$dir"
csv="$out/shard-allocating.csv"
echo "rate,jobs_per_s,tasks_per_s,cpu_percent,create_p50_ms,create_p99_ms" >"$csv"
for rate in $rates; do
  jobs=$((rate * 8 > 100 ? rate * 8 : 100))
  line=$("$build/bench/fleet_sim" --machines 2000 --jobs "$jobs" --tasks 36 --clients 8 \
    --create-rate "$rate" --phases register,create --machine-cpu-milli 64000 \
    --machine-mem-mb 262144 --domain-size 20 --task-cpu-milli 100 --task-mem-mb 64 \
    --region-etcd "http://127.0.0.1:$etcd_port" --region-role shard --jobs-via shard |
    tee /dev/stderr | awk '/^create/ {
      for (i = 1; i <= NF; i++) {
        if ($i == "CPU") cpu = $(i + 1)
        if ($i == "jobs/s") jps = $(i - 1)
        if ($i == "tasks/s),") tps = $(i - 1)
        if ($i == "p50" && $(i - 1) == "job.create") p50 = $(i + 1)
        if ($i == "p99") p99 = $(i + 1)
      }
    } END { sub("%", "", cpu); sub("\\(", "", tps); printf "%s,%s,%s,%s,%s", jps, tps, cpu, p50, p99 }')
  echo "$rate,$line" >>"$csv"
done
cat "$csv"
gnuplot <<GP
set terminal pngcairo size 1000,520 font "sans,11"
set output "$out/shard-allocating.png"
set datafile separator ","
set title "weft shard: CPU against jobs allocated a second (36 tasks a job, 2,000 machines, 2 vCPUs)"
set xlabel "jobs allocated a second (x36 tasks)"
set ylabel "shard CPU, % of a core"
set key top left
set xrange [0:*]
set yrange [0:*]
plot "$csv" every ::1 using 2:4 with linespoints lw 2 title "shard CPU while creating"
GP
echo "wrote $csv and $out/shard-allocating.png"
