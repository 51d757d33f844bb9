#!/usr/bin/env bash
# Twine's Fig. 14 with weft (docs/benchmarks.md): a rolling update of a job of 1,000 tasks
# holding 15,000 shards x 3 replicas, a fault domain of 50 machines failing at T120 and
# back at T415, run twice on the fleet simulator (fleet_sim --phases register,fig14):
# with the reference shard controller (floor 2) and with max_unavailable pacing only,
# both at most 50 restarts in flight. Writes the per-second CSVs and two PNG plots.
#
#   bench/fig14.sh [BUILD_DIR] [OUT_DIR]     (SCALE=0.25 RUN_DELAY_MS=6000 by default)
set -euo pipefail
build=${1:-build}
out=${2:-docs/fig14}
scale=${SCALE:-0.25}
delay=${RUN_DELAY_MS:-6000}
mkdir -p "$out"
common=(--machines 1000 --tasks 1000 --task-cpu-milli 3000 --task-mem-mb 1024
        --machine-cpu-milli 4000 --machine-mem-mb 8192 --domain-size 50
        --shards 15000 --replicas 3 --floor 2 --max-unavailable 50
        --scale "$scale" --run-delay-ms "$delay" --timeout 1200 --phases register,fig14)
"$build/bench/fleet_sim" "${common[@]}" --out "$out/with-taskcontrol.csv" \
  --controller "$build/examples/shard_controller/shard_controller" --max-in-flight 50
"$build/bench/fleet_sim" "${common[@]}" --out "$out/without-taskcontrol.csv"
for run in with-taskcontrol without-taskcontrol; do
  title="weft, ${run/-/ }: rolling update of 1,000 tasks, fault domain down T120-T415"
  gnuplot <<GP
set terminal pngcairo size 1000,640 font "sans,11"
set output "$out/$run.png"
set datafile separator ","
set multiplot layout 2,1 title "$title"
set ylabel "tasks"
set key outside right
set xrange [0:*]
plot "$out/$run.csv" every ::1 using 1:2 with lines lw 2 title "being updated", \
     "" every ::1 using 1:3 with lines lw 2 title "blocked by the controller", \
     "" every ::1 using 1:5 with lines lw 2 title "down by the failure"
set ylabel "shards"
set xlabel "seconds since the update began"
plot "$out/$run.csv" every ::1 using 1:6 with lines lw 2 title "one replica down", \
     "" every ::1 using 1:7 with lines lw 2 title "two or more down"
unset multiplot
GP
done
echo "fig14: plots and CSVs in $out"
