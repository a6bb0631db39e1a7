#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU: build the CUDA backend (or unpack a bundle made by
# scripts/gpu-bundle.sh), run the GPU tests (cross-backend ops, PyTorch golden data, the engine
# against the CPU engine), train a few steps through the CLI, and benchmark GPT-2 124M against
# PyTorch (eager and torch.compile) in the same run. Results go under $OUT (default build/gpu-check):
# gpu.txt, test_cuda.log (test_cuda_alone.log, sanitizer.log on failures), train.log,
# dp.log, bench.jsonl, torch.err (at most 8 files: what a lent device machine sends back).
# Usage: scripts/gpu-check.sh [--bundle FILE] [--quick] [--no-peer]
#   --quick: tests only, no benchmark; --no-peer: meshtrain's benchmark without PyTorch's
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu-check}
mkdir -p "$OUT"
BUNDLE=""
QUICK=0
PEER=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-peer) PEER=0; shift ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
# cuBLASLt: the toolkit's, or the one PyTorch's wheels bring.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas", "nccl")))' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
  [ -e "$d/libnccl.so.2" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
if [ -n "$BUNDLE" ]; then
  W=$(mktemp -d)
  tar -xJf "$BUNDLE" -C "$W"
  BIN=$W/bin
  export LD_LIBRARY_PATH="$W/lib:${LD_LIBRARY_PATH:-}"
  export MT_GOLDEN_DIR=$W/golden
  DATA=$W/data
else
  bash scripts/install-deps.sh
  cmake -S . -B build/cuda -DCMAKE_BUILD_TYPE=Release -DMT_CUDA=ON >/dev/null
  cmake --build build/cuda -j"$(nproc)" --target meshtrain test_cuda || exit 1
  /usr/bin/python3 tools/make_golden.py --configs configs/models --out build/cuda/golden >/dev/null
  BIN=$ROOT/build/cuda
  cp build/cuda/tests/test_cuda "$BIN/test_cuda" 2>/dev/null || true
  W=$(mktemp -d)
  DATA=$W/data
  mkdir -p "$DATA"
  python3 -c 'import random; random.seed(1); s="ka lo mi ter an sul dor ve qui ny pha ro est ing ba zu".split(); w=["".join(random.choice(s) for _ in range(random.randint(1,4))) for _ in range(3000)]; print("\n".join(" ".join(random.choice(w) for _ in range(12)) for _ in range(4000)))' > "$DATA/corpus.txt"
  "$BIN/meshtrain" tokenize "$DATA/corpus.txt" --train-bpe 512 -o "$DATA/corpus" >/dev/null
fi
if ldd "$BIN/test_cuda" | grep -q 'not found'; then
  echo "gpu-check: libraries missing:"; ldd "$BIN/test_cuda" | grep 'not found'
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
status=0

uname -r | sed 's/^/kernel: /' | tee -a "$OUT/gpu.txt"
T0=$(date +%s)
echo "== GPU tests"
timeout 200 "$BIN/test_cuda" > "$OUT/test_cuda.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |^\[  FAILED|Failure|error|Expected|Which is|actual" "$OUT/test_cuda.log" | tail -60
tail -3 "$OUT/test_cuda.log"
# A device fault poisons the rest of the process: each failed test again on its own, and the first
# one under compute-sanitizer where the runtime allows it (Firecracker).
FAILED=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/test_cuda.log" | awk '{print $4}' | tr -d , | sort -u)
if [ -n "$FAILED" ]; then
  echo "== failed tests, each alone"
  for t in $(echo "$FAILED" | head -6); do
    echo "---- $t" >> "$OUT/test_cuda_alone.log"
    timeout 40 "$BIN/test_cuda" --gtest_filter="$t" >> "$OUT/test_cuda_alone.log" 2>&1 && echo "$t: passes alone" || echo "$t: fails alone"
  done
  if command -v compute-sanitizer >/dev/null && grep -qiE 'illegal|misaligned|out of bounds|unspecified launch' "$OUT/test_cuda.log" "$OUT/test_cuda_alone.log"; then
    first=$(echo "$FAILED" | head -1)
    echo "== compute-sanitizer $first"
    timeout 90 compute-sanitizer --print-limit 20 "$BIN/test_cuda" --gtest_filter="$first" > "$OUT/sanitizer.log" 2>&1
    grep -m 30 -E 'Invalid|at 0x|by thread|Address|Error|========= +at' "$OUT/sanitizer.log"
  fi
fi
echo "tests took $(( $(date +%s) - T0 )) s"

echo "== train through the CLI on the GPU (data loader, progress, metrics, checkpoint)"
cat > "$W/train.json" <<JSON
{"model": {"model_type": "gpt2", "vocab_size": 512, "n_positions": 256, "n_embd": 256, "n_layer": 4, "n_head": 4},
 "data": {"train": "$DATA/corpus", "tokenizer": "$DATA/corpus.tokenizer.json"},
 "seq_length": 256, "train_iters": 200, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
 "steps_per_print": 50, "save_dir": "$W/run", "save_interval": 200, "bf16": {"enabled": true},
 "gradient_clipping": 1.0, "device": "cuda",
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}}}
JSON
(cd "$W" && timeout 90 "$BIN/meshtrain" train "$W/train.json" --metrics "$W/train-metrics.jsonl") > "$OUT/train.log" 2>&1 || status=1
tail -6 "$OUT/train.log"

# Data parallelism, 2 ranks x micro-batch 8 against 1 rank x 16 (the same global batch): the losses
# must agree. comm_backend "mpi" stages the gradients through the host and runs on this machine's
# GPU(s), two ranks sharing one where there is one (NCCL refuses that); "nccl" needs 2 or more GPUs.
dp_against_one() {  # BACKEND
  (cd "$W" && timeout 180 mpirun --allow-run-as-root --oversubscribe -n 2 -x LD_LIBRARY_PATH "$BIN/meshtrain" train \
     "$W/dp.json" --set train_micro_batch_size_per_gpu=8 --set comm_backend="$1" --metrics "$W/two-$1.jsonl" \
     >> "$OUT/dp.log" 2>&1) || status=1
  python3 - "$W/one.jsonl" "$W/two-$1.jsonl" "$1" <<'PY' || status=1
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f) if '"loss"' in l] for f in sys.argv[1:3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print(f"2 ranks ({sys.argv[3]}) against 1: {len(a)} steps, worst relative loss difference {worst:.2e}")
sys.exit(0 if worst < 2e-2 else 1)
PY
}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if command -v mpirun >/dev/null; then
  echo "== data parallelism: 2 ranks against 1 ($NGPU GPU(s))"
  sed 's/"train_iters": 200/"train_iters": 20/; s|"save_dir": "[^"]*", "save_interval": 200, ||' "$W/train.json" > "$W/dp.json"
  (cd "$W" && timeout 120 "$BIN/meshtrain" train "$W/dp.json" --set train_micro_batch_size_per_gpu=16 \
     --metrics "$W/one.jsonl" > "$OUT/dp.log" 2>&1) || status=1
  dp_against_one mpi
  [ "$NGPU" -ge 2 ] && dp_against_one nccl
  grep -m 4 -E "comm:|error" "$OUT/dp.log"
fi

if [ "$QUICK" = 0 ]; then
  echo "== benchmark: GPT-2 124M, bf16, B=16, T=1024, AdamW"
  : > "$OUT/bench.jsonl"
  timeout 120 "$BIN/meshtrain" bench configs/models/gpt2-124m.json --device cuda --dtype bf16 --batch 16 --seq 1024 \
    --steps 20 --warmup 5 --json --profile | tee -a "$OUT/bench.jsonl" || status=1
  if [ "$PEER" = 1 ]; then
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/gpu/torch_gpt2_train.py --batch 16 --seq 1024 --steps 20 --modes eager,compile \
      2> "$OUT/torch.err" | tee -a "$OUT/bench.jsonl" || status=1
  fi
  python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    name = r.get("peer") or f"meshtrain ({r.get('device', '')})"
    extra = f", {100*r['mfu_vs_ceiling']:.1f}% of {r['gemm_ceiling_tflops']:.0f} TFLOP/s bf16 GEMM" if "mfu_vs_ceiling" in r else ""
    print(f"{name:45s} {r['tokens_per_s']:>10.0f} tok/s  step {1e3*r['step_seconds']:.1f} ms{extra}")
    prof = r.get("profile", [])
    if prof:
        total = sum(e["ms_per_step"] for e in prof)
        print(f"  per op, event-timed ({total:.1f} ms of ops a step):")
        for e in prof[:60]:
            if "tflops" in e:
                print(f"    {e['op']:50s} {e['tflops']:8.1f} TFLOP/s")
            else:
                print(f"    {e['op']:32s} {e['ms_per_step']:8.3f} ms {100*e['ms_per_step']/total:5.1f}%  x{e['calls_per_step']}")
PY
fi
exit $status
