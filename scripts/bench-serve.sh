#!/usr/bin/env bash
# Serving speed, side by side in one run (docs/PERF.md (l)): GPT-2 124M f32 (random weights, one
# training step) on this machine's cores.
#   1. the engine alone: `meshtrain bench --decode` at 1 and 8 sequences a step (the weights read
#      once a step: the memory-bandwidth ceiling of batch 1)
#   2. the HTTP server under `meshtrain loadtest` with 1, 8 and 32 clients (8 slots)
#   3. the PyTorch peer: tools/decode_peer.py, Hugging Face's GPT-2 with a KV cache, batch 1 and 8
# Usage: scripts/bench-serve.sh [MESHTRAIN] [SECONDS a loadtest phase, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-serve.sh
MT="${1:-./build/release/meshtrain}"
SECS="${2:-20}"
W=$(mktemp -d /tmp/mt_bench_serve.XXXXXX)
trap 'kill $SERVER 2>/dev/null || true; rm -rf "$W"' EXIT
TOK=""
for d in build/*/tokenizer_golden; do [ -f "$d/encoder.json" ] && TOK="$d" && break; done
[ -n "$TOK" ] || { echo "bench-serve: needs GPT-2's vocabulary (ctest -R tokenizer_golden writes it)" >&2; exit 2; }
MB="$(dirname "$MT")/bench/mt_microbench"
if [ -x "$MB" ]; then
  echo "== memory-bandwidth ceiling (STREAM triad, 2 threads)"
  OMP_NUM_THREADS=2 "$MB" --benchmark_filter=BM_StreamTriad 2>/dev/null | grep BM_StreamTriad
fi
echo "== engine: meshtrain bench --decode"
for b in 1 8; do
  "$MT" bench configs/models/gpt2-124m.json --decode 64 --seq 16 --threads 2 --decode-batch "$b" | grep decode
done
echo "== HTTP: meshtrain serve + meshtrain loadtest (max_tokens 32, ignore_eos)"
for i in $(seq 200); do echo "A short text for one training step, line $i."; echo; done > "$W/text.txt"
"$MT" train configs/demo.json --model configs/models/gpt2-124m.json --data "$W/text.txt" --tokenizer "$TOK" \
  --set data.valid=null --set seq_length=64 --set train_iters=1 --set train_micro_batch_size_per_gpu=1 \
  --set save_dir="$W/g124" --set save_interval=1 --set eval_interval=0 > /dev/null
"$MT" serve "$W/g124" --port 0 --slots 8 --context 256 2> "$W/serve.log" &
SERVER=$!
PORT=$(serve_wait_port "$W/serve.log" 60) || { echo "bench-serve: the server did not start" >&2; cat "$W/serve.log" >&2; exit 1; }
"$MT" loadtest --url "http://127.0.0.1:$PORT" --clients 1,8,32 --duration "$SECS" --max-tokens 32
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^meshtrain_decode_(steps|rows)_total'
kill -TERM $SERVER; wait $SERVER || true
echo "== PyTorch peer (OPENBLAS_NUM_THREADS=1: its fastest setting here)"
(cd tools && OPENBLAS_NUM_THREADS=1 /usr/bin/python3 decode_peer.py ../configs/models/gpt2-124m.json --batch 1,8 \
  --prompt 16 --decode 32 --threads 2 | grep '^torch')
