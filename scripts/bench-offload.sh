#!/usr/bin/env bash
# ZeRO-Infinity's optimizer swap against the disk's ceiling and against the same run in memory:
# configs/bench-offload.json (a 24-layer, n_embd 1024 GPT-2, ~306M parameters, bf16, stage 1, one
# rank) trained 4 steps in memory, swapped without pipelining (DeepSpeed's default) and swapped
# with pipeline_read/pipeline_write. Prints the disk's ceiling (bench --io) and, per run, the mean
# of steps 2-4: step, optimizer, its update compute, its waits on the disk, the I/O threads' read
# and write seconds, and the swap's share of the ceiling.
# Usage: scripts/bench-offload.sh SWAP_DIR [MESHTRAIN]   (SWAP_DIR on the disk to measure)
set -euo pipefail
cd "$(dirname "$0")/.."
SWAP=${1:?usage: bench-offload.sh SWAP_DIR [MESHTRAIN]}
MT=${2:-./build/release/meshtrain}
OUT=$(mktemp -d)
$MT bench --io "$SWAP" --io-size 4096 --json > "$OUT/io-before.json"
run() {  # name, extra --set flags
  local name=$1; shift
  $MT train configs/bench-offload.json --metrics "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1
}
run memory
run nvme --set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path="$SWAP" \
  --set zero_optimization.sub_group_size=50000000
run nvme-pipelined --set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path="$SWAP" \
  --set zero_optimization.sub_group_size=50000000 --set zero_optimization.offload_optimizer.pipeline_read=true \
  --set zero_optimization.offload_optimizer.pipeline_write=true
$MT bench --io "$SWAP" --io-size 4096 --json > "$OUT/io-after.json"
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys, statistics as st
out = sys.argv[1]
ios = [json.load(open(f"{out}/io-{w}.json")) for w in ("before", "after")]
io = {k: max(i[k] for i in ios) for k in ("read_gbs", "write_gbs", "mixed_gbs")}
for w, i in zip(("before", "after"), ios):
    print(f"disk ceiling {w} the runs: write {i['write_gbs']:.2f} GB/s, read {i['read_gbs']:.2f} GB/s, "
          f"read+write at once {i['mixed_gbs']:.2f} GB/s "
          f"({'O_DIRECT' if i['direct'] else 'buffered'}, {'io_uring' if i['io_uring'] else 'pread'}, 1 MiB x 8); the better of the two is the ceiling")
print("| run | step s | optimizer step s | swap: update compute s | swap: wait on disk s | I/O thread read s | I/O thread write s | GB read+written | same bytes at the mixed ceiling s | swap / max(compute, I/O at ceiling) | swap GB/s (share of the mixed ceiling) | loss step 4 |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in ["memory", "nvme", "nvme-pipelined"]:
    rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl")][1:]
    m = lambda k: st.mean(r.get(k, 0.0) for r in rows)
    step = m("step_seconds") + m("forward_seconds") + m("backward_seconds")
    if name == "memory":
        print(f"| {name} | {step:.2f} | {m('step_seconds'):.2f} | | | | | | | | | {rows[-1]['loss']:.6f} |")
        continue
    gb_r, gb_w = m("swap_read_bytes") / 1e9, m("swap_write_bytes") / 1e9
    ceil_s = (gb_r + gb_w) / io["mixed_gbs"]
    opt, comp = m("swap_optimizer_seconds"), m("swap_compute_seconds")
    print(f"| {name} | {step:.2f} | {m('step_seconds'):.2f} | {comp:.2f} | {m('swap_wait_seconds'):.2f} | {m('swap_read_seconds'):.2f} | "
          f"{m('swap_write_seconds'):.2f} | {gb_r + gb_w:.2f} | {ceil_s:.2f} | {opt / max(comp, ceil_s):.2f} | "
          f"{(gb_r + gb_w) / opt:.2f} ({100 * ceil_s / opt:.0f}%) | {rows[-1]['loss']:.6f} |")
PY
rm -rf "$OUT" "$SWAP/zero_stage_1"
