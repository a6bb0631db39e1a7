#!/usr/bin/env bash
# The measured pipeline bubble against the formula: pp = 2 (two MPI ranks, one core each), GPT-2
# 8 x 512 on T = 256 (configs/bench-pp-bubble.json, data from scripts/demo.sh), 1F1B and
# interleaved (v = 2) at m = 4, 8, 16 micro-batches. Per run, medians over steps 2-4 of each stage's
# idle share 1 - compute / (the schedule's wall time, the longest stage's), beside
# (p-1)/(m+p-1) and (p-1)/(v·m+p-1). The stage with the most compute is the bottleneck: its idle
# share is the bubble; the other stage also waits for the difference (imbalance = max / min compute).
set -euo pipefail
cd "$(dirname "$0")/.."
MT=${MT:-./build/release/meshtrain}
out=${OUT:-/tmp/pp-bubble}
mkdir -p "$out"
printf "%-12s %3s %9s %9s %9s %9s %8s %9s\n" schedule m "idle s0" "idle s1" formula imbalance "step s" "tok/s"
for sched in 1f1b interleaved; do
  v=1; [ "$sched" = interleaved ] && v=2
  for m in 4 8 16; do
    f="$out/$sched-$m.jsonl"; rm -f "$f"
    $MT launch -n 2 -- train configs/bench-pp-bubble.json --set train_batch_size=$m \
      --set parallel.pipeline_schedule=$sched --set parallel.virtual_stages=$v --metrics "$f" > "$out/$sched-$m.log" 2>&1
    python3 - "$f" "$sched" "$m" "$v" <<'PY'
import json, statistics, sys
f, sched, m, v = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(f)][1:]
p = 2
idle = [statistics.median(1.0 - r["pp_stage_compute_seconds"][q] / r["pp_schedule_seconds"] for r in rows) for q in range(p)]
imb = statistics.median(max(r["pp_stage_compute_seconds"]) / min(r["pp_stage_compute_seconds"]) for r in rows)
step = statistics.median(1.0 / (r["tokens_per_s"] / (m * 256)) for r in rows)
tok = statistics.median(r["tokens_per_s"] for r in rows)
print(f"{sched:<12} {m:3d} {idle[0]:9.3f} {idle[1]:9.3f} {(p-1)/(v*m+p-1):9.3f} {imb:9.2f} {step:8.2f} {tok:9.0f}")
PY
  done
done
