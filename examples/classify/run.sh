#!/usr/bin/env bash
# Sentence-pair classification end to end, in the layout of the CLUE AFQMC fine-tuning scripts
# (sentence1, sentence2, label, id; 2 labels; weight decay 0.1, warm-up 1%, clipping 1.0,
# val_acc monitored with save_top_k 3, a checkpoint every 200 steps, predictions to a JSON file):
#   1. make_pairs.py: pairs from Debian's fortunes with a checkable rule (held-out quotes for
#      validation) and a pretraining corpus without the held-out quotes
#   2. meshtrain tokenize --train-bpe 2048 on that corpus
#   3. meshtrain train pretrain.json: a 4-layer GPT-2 causal LM on it, 1500 steps (~70 s on 2 cores)
#   4. meshtrain train config.json ("task": "classification", init_from the LM: its score.weight
#      starts fresh), 3 epochs (~100 s)
#   5. meshtrain predict with the best checkpoint by val_acc -> predict.json, and its accuracy
# Usage: examples/classify/run.sh [MESHTRAIN] [WORKDIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
MT="${1:-$HERE/../../build/release/meshtrain}"
W="${2:-runs/classify}"
mkdir -p "$W"
python3 "$HERE/make_pairs.py" "$W/data" 12000 1000
"$MT" tokenize "$W/data/corpus.txt" -o "$W/data/corpus" --train-bpe 2048
"$MT" train "$HERE/pretrain.json" --set data.train="$W/data/corpus" --set data.tokenizer="$W/data/corpus.tokenizer.json" \
  --set save_dir="$W/lm" --overwrite
"$MT" train "$HERE/config.json" --set model.init_from="$W/lm" --set data.train="$W/data/train.jsonl" --set data.valid="$W/data/dev.jsonl" \
  --set data.tokenizer="$W/data/corpus.tokenizer.json" --set save_dir="$W/run" --overwrite --metrics "$W/metrics.jsonl"
BEST=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['best'][0]['path'])" "$W/run/top_k/top_k.json")
"$MT" predict "$BEST" "$W/data/dev.jsonl" -o "$W/predict.json"
head -n 3 "$W/predict.json"
