#!/usr/bin/env bash
# A run over two hosts against the same run on one: GPT-2 8 x 512 on T = 256
# (configs/bench-pp-bubble.json, data from scripts/demo.sh), 8 micro-batches per step, two ranks
# of one core each, pp = 2 (1F1B) and dp = 2. "one host": both ranks here (shared memory between
# them); "two hosts": one rank in each of two network-namespace hosts (scripts/netns-hosts.sh: TCP
# over a veth bridge, mpirun through ssh). Medians over steps 2-4 of the step time and tokens/s,
# and for pp the time a stage waited on its neighbour (pp_wait_seconds, rank 0's).
set -euo pipefail
cd "$(dirname "$0")/.."
MT=${MT:-./build/release/meshtrain}
out=${OUT:-/tmp/multihost-bench}
mkdir -p "$out"
export OMP_NUM_THREADS=1  # one core per rank, here and on the hosts (which share this machine's)
MT_SLOTS=1 bash scripts/netns-hosts.sh up 2 "$out/hosts" >/dev/null
trap 'bash scripts/netns-hosts.sh down "$out/hosts"' EXIT
printf "%-6s %-10s %8s %9s %9s\n" layout hosts "step s" "tok/s" "pp wait s"
for layout in pp2 dp2; do
  sets="--set train_batch_size=8"
  [ "$layout" = dp2 ] && sets="$sets --set parallel.pp=1"
  for where in one two; do
    f="$out/$layout-$where.jsonl"; rm -f "$f"
    if [ "$where" = one ]; then
      $MT launch -n 2 -- train configs/bench-pp-bubble.json $sets --metrics "$f" > "$out/$layout-$where.log" 2>&1
    else
      ( source "$out/hosts/env"
        $MT launch -n 2 --hostfile "$out/hosts/hostfile" -- train configs/bench-pp-bubble.json $sets --metrics "$f" \
          > "$out/$layout-$where.log" 2>&1 )
    fi
    python3 - "$f" "$layout" "$where" <<'PY'
import json, statistics, sys
f, layout, where = sys.argv[1:4]
rows = [json.loads(l) for l in open(f)][1:]
tok = statistics.median(r["tokens_per_s"] for r in rows)
step = 8 * 256 / tok
wait = statistics.median(r.get("pp_wait_seconds", 0.0) for r in rows)
print(f"{layout:<6} {where:<10} {step:8.2f} {tok:9.0f} {wait:9.3f}")
PY
  done
done
