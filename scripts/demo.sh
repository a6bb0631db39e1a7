#!/usr/bin/env bash
# The quick start: installs dependencies, builds, gets real English text from Debian's `fortunes`,
# trains a 4096-token BPE on it, tokenizes it into Megatron indexed datasets, and trains a small
# GPT (configs/demo.json) for a few minutes on this machine's cores with a progress bar. The
# validation loss at the end is printed beside the text's unigram entropy, the loss curve is drawn
# (runs/demo-metrics.png), and the trained model writes a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release
MT=./build/release/meshtrain
mkdir -p data runs
if [ ! -f data/fortunes-valid.idx ]; then
  # Fortune files hold quotes separated by lines of "%": every 20th goes to validation.
  files=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8')
  cat $files | awk -v RS='%\n' 'NF { out = (NR % 20 == 0) ? "data/fortunes-valid.txt" : "data/fortunes-train.txt"; printf "%s\n\n", $0 > out }'
  $MT tokenize data/fortunes-train.txt -o data/fortunes-train --train-bpe 4096
  $MT tokenize data/fortunes-valid.txt -o data/fortunes-valid --tokenizer data/fortunes-train.tokenizer.json | tee data/valid-stats.txt
fi
rm -f runs/demo-metrics.jsonl
$MT train configs/demo.json --overwrite --metrics runs/demo-metrics.jsonl
echo "validation data: $(grep 'unigram entropy' data/valid-stats.txt) (a model that ignores context)"
echo "--- a sample from runs/demo (temperature 0.8, top-k 40):"
$MT generate runs/demo --prompt "The meaning of life is" --temperature 0.8 --top-k 40 --seed 1 --max-new-tokens 60
