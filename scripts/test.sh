#!/usr/bin/env bash
# Installs dependencies, builds with -Werror (the "ci" preset) and runs every test, runs each
# libFuzzer target of fuzz/ for a short while (the "fuzz" preset: clang, ASan + UBSan, build/fuzz),
# compiles the CUDA backend where nvcc exists, and runs the fresh-machine check. Prints each
# stage's wall time at the end (also when a stage fails): CI has to stay under ~25 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

times=()
fresh_pid=""
on_exit() {
  [ ${#times[@]} -eq 0 ] || echo "test.sh: wall time by stage: ${times[*]} (total $((SECONDS)) s)"
  if [ -n "$fresh_pid" ]; then  # a stage failed while the fresh root was being prepared
    wait "$fresh_pid" 2>/dev/null || true
    bash scripts/fresh-machine-check.sh --clean || true
  fi
}
trap on_exit EXIT
stage() {  # stage NAME COMMAND...: runs it and records its wall time
  local name=$1 t0=$SECONDS
  shift
  "$@"
  times+=("$name $((SECONDS - t0)) s;")
}

stage install bash scripts/install-deps.sh
# ccache hashes the tree's paths relative to its root, so the fresh-machine check's copy of the tree
# (another path) gets this build's objects too.
export CCACHE_BASEDIR=$PWD
# The fresh-machine check's first phase (debootstrap, install-deps.sh in a clean root: downloads and
# dpkg, little CPU) runs beside the build and the tests; its second phase, at the end.
mkdir -p build
bash scripts/fresh-machine-check.sh --prepare > build/fresh-prepare.log 2>&1 &
fresh_pid=$!
cmake --preset ci >/dev/null
stage build cmake --build --preset ci
stage ctest ctest --preset ci
stage fuzz bash scripts/fuzz.sh "${MT_FUZZ_SECONDS:-15}"
# The CUDA backend must keep building where the toolkit is installed (no GPU needed: its tests
# skip). Its C++ is the ci build's, with the same flags: ccache hands those objects over.
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
cuda() {
  cmake -S . -B build/cuda -DCMAKE_BUILD_TYPE=Release -DMT_CUDA=ON -DMT_WERROR=ON -DMT_BUILD_BENCH=OFF \
    -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
  if command -v ccache >/dev/null; then ccache -z >/dev/null; fi
  cmake --build build/cuda -j2 --target test_cuda meshtrain
  if command -v ccache >/dev/null; then ccache -s | grep -E '^ *(Hits|Misses):' || true; fi
  ./build/cuda/tests/test_cuda --gtest_brief=1
}
if [ -n "$NVCC" ]; then
  stage cuda cuda
else
  echo "test.sh: no nvcc: the CUDA backend is not built"
fi
# A clean Debian root installs, builds and trains with nothing but scripts/install-deps.sh.
fresh() {
  local rc=0
  wait "$fresh_pid" || rc=$?
  fresh_pid=""
  cat build/fresh-prepare.log
  [ "$rc" -eq 0 ] || { echo "test.sh: the fresh-machine check's --prepare failed (exit $rc)" >&2; return 1; }
  bash scripts/fresh-machine-check.sh --finish
}
stage fresh-machine fresh
