#!/bin/bash
# PERF.md (n): 2-rank GPT-2 steps at ZeRO 0-3 with and without the huge-page re-exec (comm::mpi_prepare_process).
# Usage, from the repository root: scripts/bench-mpi-malloc.sh [path/to/meshtrain]
M=${1:-build/ci/meshtrain}
for st in 0 1 2 3; do for mode in off on; do
  env=""; [ $mode = off ] && env="-x MT_MALLOC_REEXEC=1"
  mpirun --allow-run-as-root --bind-to none -np 2 -x OMP_NUM_THREADS=1 -x MT_LAUNCHED=1 $env $M train configs/plan-gpt2-mid.json --set zero_optimization.stage=$st --set train_batch_size=8 --set train_iters=8 2>&1 | grep "^time" | tail -6 | awk '{print $5+$8+$11}' | sort -n | sed -n 3p | xargs printf "stage %s huge-pages %s: median step %.0f ms\n" $st $mode
done; done
