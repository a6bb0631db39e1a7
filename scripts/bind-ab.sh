#!/usr/bin/env bash
# Does binding each rank to a core of its own (`launch --bind_cores_to_rank`) make one layout's runs
# repeat? Runs two 4-rank layouts of GPT-2 mid (dp 4 ZeRO 1, B 2; dp 2 x tp 2 sp, B 4) in turn,
# unbound and bound to cores 0-3, ROUNDS times each, with the machine's speed probe before each run,
# and prints each run's median step (rank 0's forward + backward + step of steps 3 on) and each
# condition's spread (slowest run / fastest). For a lent device machine (docs/PLANNER.md), from a
# bundle made by scripts/mpi-bundle.sh. Results: $OUT/bind-ab.log (default build/bind-ab).
# Usage: scripts/bind-ab.sh [--bundle FILE] [--rounds R (default 3)] [--steps S (default 8)]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/build/bind-ab}
mkdir -p "$OUT"
BUNDLE=""
ROUNDS=3
STEPS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    *) echo "bind-ab: unknown argument $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=scripts/lib-bundle.sh
source "$PWD/scripts/lib-bundle.sh"
bundle_enter bind-ab "$BUNDLE"
export OMP_NUM_THREADS=1
unset MT_BIND_CORES
LOG=$OUT/bind-ab.log
: > "$LOG"
layout_args() {  # LAYOUT
  case $1 in
    dp4) echo "--set train_micro_batch_size_per_gpu=2 --set zero_optimization.stage=1" ;;
    tp2) echo "--set train_micro_batch_size_per_gpu=4 --set parallel.tp=2 --set parallel.sequence_parallel=true --set zero_optimization.stage=1" ;;
  esac
}
for r in $(seq 1 "$ROUNDS"); do
  for layout in dp4 tp2; do
    for mode in unbound bound; do
      bind=()
      [ "$mode" = bound ] && bind=(--bind_cores_to_rank --bind_core_list 0-3)
      probe=$(meshtrain calibrate --speed-probe --threads 1 | awk '/^speed probe:/ {print $3}')
      # shellcheck disable=SC2046
      if timeout 120 meshtrain launch -n 4 "${bind[@]}" -- train configs/plan-gpt2-mid.json \
           --set train_iters="$STEPS" $(layout_args $layout) > "$OUT/last-run.txt" 2>&1; then
        step=$(awk -F'|' '/^\[[0-9]+,0\]<stdout>:time \(ms\)/ { ++n; if (n < 3) next;
                  split($2, f, ":"); split($3, b, ":"); split($4, s, ":"); print (f[2] + b[2] + s[2]) / 1000 }' "$OUT/last-run.txt" |
               sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
      else
        step=""; tail -3 "$OUT/last-run.txt"
      fi
      echo "round $r $layout $mode probe ${probe:-?} step ${step:-failed}" | tee -a "$LOG"
    done
  done
done
# Each condition's runs: median, and the spread (slowest / fastest).
awk '$8 != "failed" { k = $3 " " $4; v[k] = v[k] " " $8; p[k] = p[k] " " $6 }
     END { for (k in v) { n = split(v[k], a, " "); mn = a[1]; mx = a[1]; for (i = 2; i <= n; ++i) { if (a[i] < mn) mn = a[i]; if (a[i] > mx) mx = a[i] }
           printf "%-12s runs:%s  spread %.2f  probes:%s\n", k, v[k], (mn > 0 ? mx / mn : 0), p[k] } }' "$LOG" | sort | tee -a "$LOG"
rm -f "$OUT/last-run.txt"
