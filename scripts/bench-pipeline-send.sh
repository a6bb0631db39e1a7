#!/usr/bin/env bash
# The pipeline's sends with and without OpenMPI's single-copy path (CMA), GPT-2 mid
# (configs/plan-gpt2-mid.json, data from scripts/demo.sh) at pp = 2, 1F1B, B 1 x 8, two ranks of
# one thread each, 12 steps: mean tokens/s and rank 0's pipeline wait over steps 3-12. With
# MT_BEFORE=path/to/an/older/meshtrain, that binary runs in turn with this one (DESIGN-NOTES 45).
# Usage: [MT=build/ci/meshtrain] [MT_BEFORE=...] [ROUNDS=2] scripts/bench-pipeline-send.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MT=${MT:-build/ci/meshtrain}
ROUNDS=${ROUNDS:-2}
export OMP_NUM_THREADS=1
bins=("$MT")
[ -n "${MT_BEFORE:-}" ] && bins=("$MT_BEFORE" "$MT")
printf "%-6s %-40s %9s %16s\n" copy binary "tok/s" "rank 0 wait ms"
for ((r = 1; r <= ROUNDS; ++r)); do
  for bin in "${bins[@]}"; do
    for copy in cma none; do
      OMPI_MCA_btl_vader_single_copy_mechanism=$copy "$bin" launch -n 2 -- train configs/plan-gpt2-mid.json \
        --set parallel.pp=2 --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=8 \
        --set train_iters=12 --set zero_optimization.stage=0 2>&1 |
        python3 -c '
import re, sys
tok, wait = [], []
for line in sys.stdin:
    m = re.search(r"step (\d+)/\d+ .* (\d+) tok/s", line)
    if m and int(m.group(1)) > 2: tok.append(int(m.group(2)))
    m = re.search(r"pipeline wait: ([\d.]+)", line)
    if m: wait.append(float(m.group(1)))
wait = wait[2:]
print("%-6s %-40s %9.0f %16.0f" % (sys.argv[1], sys.argv[2][-40:], sum(tok) / len(tok), sum(wait) / len(wait)))
' "$copy" "$bin"
    done
  done
done
