#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job. Until the training engine lands, the main
# job is the benchmark: full GPT-2 124M training steps in bf16, with the GEMM ceiling beside them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release
./build/release/meshtrain bench configs/models/gpt2-124m.json --batch 4 --seq 256 --dtype bf16 --steps 5
