#!/bin/bash
# A waiting rank's nap between polls (comm/mpi_backend.h, mpi_idle_sleep_us), side by side in one
# run: MT_WAIT_NAP_US=50 (the nap before 2026-11-30 everywhere) against the default (1000 us where
# a host has fewer cores than its ranks' threads, else 50). GPT-2 mid (configs/plan-gpt2-mid.json),
# B 8, T 256, bf16; each layout trains 8 steps, its step is the median of steps 3-8 (the
# tokens/s of --metrics), three rounds with the two naps in turn. docs/PERF.md (hh).
#   scripts/bench-wait-nap.sh [BUILD_DIR]   (default build/ci)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/ci}/meshtrain
[ -x "$BIN" ] || { echo "bench-wait-nap.sh: no $BIN (build first)" >&2; exit 1; }
[ -f data/fortunes-train.bin ] || { echo "bench-wait-nap.sh: no data/fortunes-train (see README)" >&2; exit 1; }
M=$(mktemp -d)
trap 'rm -rf "$M"' EXIT

# step NP ARGS...: the median step in seconds of one run
step() {
  local np=$1; shift
  "$BIN" launch -n "$np" -- train configs/plan-gpt2-mid.json --set train_iters=8 --metrics "$M/m.jsonl" "$@" \
    > "$M/log" 2>&1 || { echo "bench-wait-nap.sh: the run failed:" >&2; tail -5 "$M/log" >&2; exit 1; }
  python3 - "$M/m.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print(round(statistics.median(8 * 256 / r["tokens_per_s"] for r in rows), 4))
EOF
  rm -f "$M/m.jsonl"
}

PP="--set zero_optimization.stage=0 --set train_micro_batch_size_per_gpu=1"
cases=(
  "pp4_n4|4|--set parallel.pp=4 $PP --set gradient_accumulation_steps=8"
  "tp2pp2_n4|4|--set parallel.tp=2 --set parallel.pp=2 --set zero_optimization.stage=0 --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=4"
  "dp4_z1_n4|4|--set zero_optimization.stage=1 --set train_micro_batch_size_per_gpu=2"
  "dp2pp4_n8|8|--set parallel.pp=4 $PP --set gradient_accumulation_steps=4"
  "dp8_z1_n8|8|--set zero_optimization.stage=1 --set train_micro_batch_size_per_gpu=1"
  "pp2_n2|2|--set parallel.pp=2 $PP --set gradient_accumulation_steps=8"
)
echo "layout      ranks  MT_WAIT_NAP_US=50 (s/step)   default (s/step)"
for c in "${cases[@]}"; do
  IFS='|' read -r name np args <<< "$c"
  a=() b=()
  for _ in 1 2 3; do
    # shellcheck disable=SC2086
    a+=("$(MT_WAIT_NAP_US=50 step "$np" --set train_batch_size=8 $args)")
    # shellcheck disable=SC2086
    b+=("$(step "$np" --set train_batch_size=8 $args)")
  done
  printf '%-11s %5s  %-27s  %s\n' "$name" "$np" "${a[*]}" "${b[*]}"
done
