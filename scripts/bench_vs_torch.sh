#!/usr/bin/env bash
# Side by side, one run: meshtrain and PyTorch (Debian's python3-torch, as installed) training the
# same model with the same batch, sequence length and threads; fp32, and bf16 (meshtrain: bf16
# GEMMs with f32 master weights; PyTorch: torch.autocast bf16). Prints a table with the speed-up
# and meshtrain's fraction of its GEMM ceiling.
# Usage: scripts/bench_vs_torch.sh [MODEL_CONFIG] [BATCH] [SEQ] [THREADS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-configs/models/gpt2-124m.json}
B=${2:-4}; T=${3:-256}; THREADS=${4:-2}; STEPS=${5:-5}
MT=${MT:-build/release/meshtrain}
[ -x "$MT" ] || { echo "build first: cmake --preset release && cmake --build --preset release" >&2; exit 2; }
printf "%-6s %14s %14s %9s %12s %10s\n" dtype "meshtrain tok/s" "pytorch tok/s" speedup "mt TFLOP/s" "of ceiling"
for dtype in fp32 bf16; do
  mt=$("$MT" bench "$CONFIG" --batch "$B" --seq "$T" --dtype "$dtype" --threads "$THREADS" --steps "$STEPS" --warmup 2 --json)
  pt=$(/usr/bin/python3 tools/bench_torch.py "$CONFIG" --batch "$B" --seq "$T" --dtype "$dtype" --threads "$THREADS" --steps "$STEPS" --warmup 2 --json | tail -n 1)
  /usr/bin/python3 - "$dtype" "$mt" "$pt" <<'PY'
import json, sys
d, mt, pt = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(f"{d:<6} {mt['tokens_per_s']:14.1f} {pt['tokens_per_s']:14.1f} {mt['tokens_per_s'] / pt['tokens_per_s']:8.2f}x "
      f"{mt['tflops']:12.3f} {100 * mt['mfu_vs_ceiling']:9.0f}%")
PY
done
