#!/usr/bin/env bash
# Installs dependencies, builds with -Werror (the "ci" preset) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset ci >/dev/null
cmake --build --preset ci
ctest --preset ci
