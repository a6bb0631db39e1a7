#!/usr/bin/env bash
# Installs dependencies, builds with -Werror (the "ci" preset) and runs every test, then runs each
# libFuzzer target of fuzz/ for a short while (the "fuzz" preset: clang, ASan + UBSan, build/fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset ci >/dev/null
cmake --build --preset ci
ctest --preset ci
bash scripts/fuzz.sh "${MT_FUZZ_SECONDS:-15}"
