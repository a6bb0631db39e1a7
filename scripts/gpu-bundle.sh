#!/usr/bin/env bash
# Packs a CUDA build for a GPU machine that has the NVIDIA driver and CUDA runtime but not this
# project's Debian dependencies (and no network): meshtrain and test_cuda, the shared libraries they
# load that such a machine lacks (oneDNN, OpenMPI, PCRE2, ...), the PyTorch golden data and a tiny
# tokenized corpus, as one .tar.xz. scripts/gpu-check.sh --bundle FILE runs from it.
# Usage: scripts/gpu-bundle.sh [BUILD_DIR (build/cuda)] [OUT (build/gpu-bundle.tar.xz)]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/cuda}
OUT=${2:-build/gpu-bundle.tar.xz}
if [ ! -x "$BUILD/meshtrain" ] || [ ! -x "$BUILD/tests/test_cuda" ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMT_CUDA=ON >/dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target meshtrain test_cuda
fi
mkdir -p "$(dirname "$OUT")"
OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/golden" "$STAGE/data"
cp "$BUILD/meshtrain" "$BUILD/tests/test_cuda" "$STAGE/bin/"
# Every resolved library except the C runtime, the CUDA driver/toolkit and NCCL (the GPU machine's
# own: the toolkit's or PyTorch's wheels').
for bin in "$STAGE"/bin/*; do
  ldd "$bin" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|libcublas|libcudart|libcuda\.|libnccl' |
  while read -r lib; do cp -L "$lib" "$STAGE/lib/"; done
[ -f "$BUILD/golden/tiny-gpt2.safetensors" ] ||
  /usr/bin/python3 tools/make_golden.py --configs configs/models --out "$BUILD/golden" >/dev/null
cp "$BUILD"/golden/*.safetensors "$STAGE/golden/"
# A tiny corpus for `meshtrain train --set device=cuda` (tokenized here: BPE vocabulary of 512).
python3 - "$STAGE/data/corpus.txt" <<'PY'
import random, sys
random.seed(1)
syl = ["ka", "lo", "mi", "ter", "an", "sul", "dor", "ve", "qui", "ny", "pha", "ro", "est", "ing", "ba", "zu"]
words = ["".join(random.choice(syl) for _ in range(random.randint(1, 4))) for _ in range(3000)]
with open(sys.argv[1], "w") as f:
    for i in range(4000):
        f.write(" ".join(random.choice(words) for _ in range(random.randint(5, 20))) + ".\n")
PY
"$BUILD/meshtrain" tokenize "$STAGE/data/corpus.txt" --train-bpe 512 -o "$STAGE/data/corpus" >/dev/null
rm "$STAGE/data/corpus.txt"
tar -cJf "$OUT" -C "$STAGE" .
echo "gpu-bundle: $OUT ($(du -h "$OUT" | cut -f1))"
