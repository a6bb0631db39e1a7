#!/usr/bin/env bash
# Packs meshtrain with the OpenMPI runtime it needs (mpirun, its plugins and help files, PMIx and
# every shared library they load that a bare machine may lack) as one .tar.xz, for a machine with
# no network and none of this project's Debian packages: a lent device machine, where the planner's
# 4-8-rank validation gets a core per rank (scripts/planner-campaign.sh). On the other machine:
#   tar -xJf mpi-bundle.tar.xz -C DIR && source DIR/env.sh
# env.sh copies OpenMPI's own files to the paths Debian built it for, without replacing any file
# already there, and puts meshtrain, mpirun and the libraries first on PATH and LD_LIBRARY_PATH.
# Usage: scripts/mpi-bundle.sh [BUILD_DIR (build/ci)] [OUT (build/mpi-bundle.tar.xz)]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/ci}
OUT=${2:-build/mpi-bundle.tar.xz}
[ -x "$BUILD/meshtrain" ] || { echo "mpi-bundle: no $BUILD/meshtrain (build it first)" >&2; exit 2; }
command -v orterun >/dev/null || { echo "mpi-bundle: OpenMPI is not installed (scripts/install-deps.sh)" >&2; exit 2; }
mkdir -p "$(dirname "$OUT")"
OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/root" "$STAGE/configs"
cp "$BUILD/meshtrain" "$STAGE/bin/"
ln -s /usr/bin/orterun "$STAGE/bin/mpirun"
cp -r configs/. "$STAGE/configs/"
# The planner configs' corpus (scripts/demo.sh makes it), at the relative path they name.
if ls data/fortunes-train.* >/dev/null 2>&1; then mkdir -p "$STAGE/data"; cp data/fortunes-train.{bin,idx,tokenizer.json} "$STAGE/data/"; fi
# OpenMPI's files (symbolic links kept) at their absolute paths, /etc/openmpi's MCA defaults included.
for p in openmpi-bin openmpi-common libopenmpi3 libpmix2; do
  dpkg -L "$p" | while read -r f; do if [ -f "$f" ] || [ -L "$f" ]; then echo "${f#/}"; fi; done
done | sort -u > "$STAGE/files.txt"
tar -C / -cf - -T "$STAGE/files.txt" | tar -C "$STAGE/root" -xf -
rm "$STAGE/files.txt"
# Every library that meshtrain, mpirun or a plugin resolves here, except the C and C++ runtimes
# (the other machine's own, at least as new on the machines this is for).
{ ldd "$BUILD/meshtrain"; find "$STAGE/root" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec ldd {} \; 2>/dev/null; } |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|libcuda\.|libcudart|libcublas|libnccl' |
  while read -r lib; do cp -L "$lib" "$STAGE/lib/"; done
cat > "$STAGE/env.sh" <<'SH'
# source DIR/env.sh: OpenMPI's files where Debian's build looks for them, meshtrain and mpirun first.
_mt_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cp -an "$_mt_b/root/." /
export PATH="$_mt_b/bin:$PATH"
export LD_LIBRARY_PATH="$_mt_b/lib:/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Sandboxed kernels may refuse cross-memory attach; the shared-memory transport then copies twice.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
unset _mt_b
SH
tar -cJf "$OUT" -C "$STAGE" .
echo "mpi-bundle: $OUT ($(du -h "$OUT" | cut -f1))"
