#!/usr/bin/env bash
# Chat fine-tuning end to end, as ChatGLM's fine-tuning walk-through does it, with meshtrain only:
#   1. SFT records (prompt / response / history, Chinese and English) -> make_records.py
#   2. `meshtrain tokenize` trains a BPE on them and writes the indexed dataset and its loss mask
#      (only the responses are trained)
#   3. `meshtrain train` with a DeepSpeed ds_config.json
#   4. `meshtrain serve`, then the curl call of ChatGLM's api.py against the fine-tuned model, the
#      OpenAI endpoints, the errors, a short load test and a SIGTERM that drains.
# Usage: examples/chat/run.sh [MESHTRAIN] [WORKDIR]   (STEPS=N training steps, default 2000: ~15 s)
# Exits non-zero, naming the check, when any step fails. ctest runs it with the default steps.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../../scripts/lib-serve.sh"
MT="${1:-$HERE/../../build/release/meshtrain}"
W="${2:-$(mktemp -d /tmp/mt_chat.XXXXXX)}"
STEPS="${STEPS:-2000}"
mkdir -p "$W"
SERVER_PID=""
# The server is local: a proxy in the environment must not carry curl's and urllib's requests.
export no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}" NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true; }
trap cleanup EXIT
fail() { echo "chat example: FAILED: $*" >&2; [ -f "$W/serve.log" ] && cat "$W/serve.log" >&2; exit 1; }

python3 "$HERE/make_records.py" "$W/sft.jsonl" 2000
"$MT" tokenize "$W/sft.jsonl" -o "$W/sft" --train-bpe 300
"$MT" train --deepspeed "$HERE/ds_config.json" --model "$HERE/model.json" --data "$W/sft" \
  --tokenizer "$W/sft.tokenizer.json" --set seq_length=64 --set train_iters="$STEPS" \
  --set scheduler.params.total_num_steps="$STEPS" --set save_dir="$W/run" --set save_interval="$STEPS" \
  --set eval_interval=0 --overwrite

"$MT" serve "$W/run" --port 0 --model-name chat --slots 4 --max-body-bytes 65536 2> "$W/serve.log" &
SERVER_PID=$!
PORT=$(serve_wait_port "$W/serve.log" 20) || fail "the server did not start"
URL="http://127.0.0.1:$PORT"
echo "serving on $URL"

# ChatGLM's call (its default sampling) answers with what the fine-tuning taught.
GREETING="你好！我是用 meshtrain 微调的助手。"
out=$(curl -s -X POST "$URL" -H 'Content-Type: application/json' -d '{"prompt": "你好", "history": []}')
echo "POST / -> $out"
python3 - "$out" "$GREETING" <<'PY' || fail "POST / did not answer the fine-tuned greeting"
import json, sys
r = json.loads(sys.argv[1])
assert r["status"] == 200 and r["response"] == sys.argv[2], r
assert r["history"] == [["你好", sys.argv[2]]], r
assert len(r["time"]) == 19, r
PY
# The arithmetic, greedily, with the previous turn as history: how many of the 100 sums are right.
python3 - "$URL" <<'PY' || fail "the fine-tuned model does not add"
import json, sys, urllib.request
url, right = sys.argv[1], 0
for a in range(10):
    for b in range(10):
        body = {"prompt": f"{a}加{b}等于几？", "history": [["你好", "你好！我是用 meshtrain 微调的助手。"]], "temperature": 0}
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = json.load(urllib.request.urlopen(req))
        right += r["response"] == f"{a}加{b}等于{a + b}。"
print(f"sums answered right: {right}/100")
assert right >= 90, "the fine-tuned model should add (it does at 2000 steps)"
PY

# OpenAI endpoints.
curl -sf "$URL/v1/models" | grep -q '"id":"chat"' || fail "/v1/models"
chat=$(curl -sf "$URL/v1/chat/completions" -d '{"model": "chat", "messages": [{"role": "user", "content": "Hello"}], "temperature": 0}')
echo "chat -> $chat"
echo "$chat" | grep -q 'Hello! I am an assistant fine-tuned with meshtrain.' || fail "chat completion"
stream=$(curl -sfN "$URL/v1/completions" -d '{"prompt": "Hello\n", "max_tokens": 8, "temperature": 0, "stream": true}')
echo "$stream" | tail -n 2 | grep -q '^data: \[DONE\]$' || fail "the stream does not end with [DONE]: $stream"
# Errors: one JSON line with a 4xx status each, and the server goes on.
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
[ "$(code "$URL/v1/completions" -d 'not json')" = 400 ] || fail "bad JSON is not 400"
[ "$(code "$URL/v1/completions" -d '{"prompt": 1}')" = 400 ] || fail "a wrong type is not 400"
[ "$(code "$URL/v1/completions" -d '{"prompt": "a", "model": "nope"}')" = 404 ] || fail "an unknown model is not 404"
head -c 70000 /dev/zero | tr '\0' a > "$W/big.txt"
[ "$(code "$URL/v1/completions" --data-binary @"$W/big.txt")" = 413 ] || fail "a large body is not 413"
[ "$(code "$URL/nowhere")" = 404 ] || fail "an unknown path is not 404"
curl -sf "$URL/metrics" | grep -q 'meshtrain_requests_total{endpoint="/v1/completions",status="413"} 1' || fail "/metrics"
# A short load test: no errors.
"$MT" loadtest --url "$URL" --clients 1,4 --duration 1 --max-tokens 8 || fail "loadtest"
# A base URL with /v1 (an OpenAI client's), and a failure that says what the server answered.
"$MT" loadtest --url "$URL/v1" --clients 1 --duration 0.3 --max-tokens 2 > /dev/null || fail "loadtest of $URL/v1"
if "$MT" loadtest --url "$URL" --clients 1 --duration 0.3 --max-tokens 5000 > /dev/null 2> "$W/lt.err"; then fail "loadtest past the context passed"; fi
grep -q "the first got HTTP 400 .*context_length_exceeded" "$W/lt.err" || fail "loadtest's failure: $(cat "$W/lt.err")"

# SIGTERM while a stream runs: the stream finishes, the server exits 0.
curl -sN "$URL/v1/completions" -d '{"prompt": "Hello", "max_tokens": 60, "ignore_eos": true, "stream": true}' > "$W/last.txt" &
CURL_PID=$!
for _ in $(seq 200); do grep -q '^data: ' "$W/last.txt" 2>/dev/null && break; sleep 0.05; done  # the stream has begun
kill -TERM "$SERVER_PID"
wait "$CURL_PID" || true
rc=0
wait "$SERVER_PID" || rc=$?
SERVER_PID=""
[ "$rc" = 0 ] || fail "the server exited $rc after SIGTERM"
grep -q "SIGTERM: draining" "$W/serve.log" || fail "no drain message"
tail -n 2 "$W/last.txt" | grep -q '^data: \[DONE\]$' || fail "the in-flight stream was cut: $(tail -c 300 "$W/last.txt")"
echo "chat example: all checks passed ($W)"
