#!/usr/bin/env bash
# Installs dependencies, builds with -Werror (the "ci" preset) and runs every test, runs each
# libFuzzer target of fuzz/ for a short while (the "fuzz" preset: clang, ASan + UBSan, build/fuzz),
# compiles the CUDA backend where nvcc exists, and runs the fresh-machine check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset ci >/dev/null
cmake --build --preset ci
ctest --preset ci
bash scripts/fuzz.sh "${MT_FUZZ_SECONDS:-15}"
# The CUDA backend must keep building where the toolkit is installed (no GPU needed: its tests skip).
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -n "$NVCC" ]; then
  cmake -S . -B build/cuda -DCMAKE_BUILD_TYPE=Release -DMT_CUDA=ON -DMT_WERROR=ON -DMT_BUILD_BENCH=OFF \
    -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
  cmake --build build/cuda -j2 --target test_cuda meshtrain
  ./build/cuda/tests/test_cuda --gtest_brief=1
else
  echo "test.sh: no nvcc: the CUDA backend is not built"
fi
# A clean Debian root installs, builds and trains with nothing but scripts/install-deps.sh.
bash scripts/fresh-machine-check.sh
