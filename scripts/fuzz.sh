#!/usr/bin/env bash
# Builds the libFuzzer targets (the "fuzz" preset: clang, ASan + UBSan, build/fuzz) and runs each
# for SECONDS (default 20) from its seed corpus (fuzz/make_seeds.py) plus the corpus earlier runs
# grew in build/fuzz/corpus/. Exits non-zero if any target finds a crash, a sanitizer report, an
# exception other than mt::Error, a leak or an input slower than 10 s; the input that did it is
# saved as build/fuzz/artifacts/TARGET-crash-... (rerun it: build/fuzz/fuzz/TARGET_fuzz FILE).
# Usage: [MT_FUZZ_OPT=-O1] scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: safetensors
# indexed_dataset tokenizer ds_config chat_template; default all)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-20}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(safetensors indexed_dataset tokenizer ds_config chat_template); fi

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found; run scripts/install-deps.sh" >&2
  exit 2
fi
# Unoptimised unless MT_FUZZ_OPT says (e.g. -O1 for a long campaign): CI's short runs are mostly build.
cmake --preset fuzz -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="${MT_FUZZ_OPT:--O0} -gline-tables-only" >/dev/null
cmake --build --preset fuzz

out=build/fuzz
rm -rf "$out/seeds"
python3 fuzz/make_seeds.py "$out/seeds"
mkdir -p "$out/artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

failed=()
for t in "${targets[@]}"; do
  bin="$out/fuzz/${t}_fuzz"
  log="$out/artifacts/$t.log"
  mkdir -p "$out/corpus/$t"
  dict=()
  if [ -f "fuzz/$t.dict" ]; then dict=(-dict="fuzz/$t.dict"); fi
  # stdin from /dev/null: a config may name /dev/stdin as its model file.
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$out/artifacts/$t-" "${dict[@]}" "$out/corpus/$t" "$out/seeds/$t" \
       </dev/null >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    done_line=$(grep -o "cov: [0-9]* ft: [0-9]* corp: [0-9]*" "$log" | tail -1)
    echo "fuzz: $t: ok, $runs runs in ${seconds} s ($done_line)"
  else
    echo "fuzz: $t: FAILED; the log ($log) ends:" >&2
    tail -n 40 "$log" >&2
    grep -o "Test unit written to .*" "$log" | sort -u | sed "s|^|fuzz: $t: |; s|\$| (rerun: $bin FILE)|" >&2 || true
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
