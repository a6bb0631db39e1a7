#!/usr/bin/env bash
# Packs meshtrain with the OpenMPI runtime it needs (mpirun, its plugins and help files, PMIx and
# every shared library they load that a bare machine may lack) as one .tar.xz, for a machine with
# no network and none of this project's Debian packages: a lent device machine, where the planner's
# 4-8-rank validation gets a core per rank (scripts/planner-campaign.sh). On the other machine:
#   tar -xJf mpi-bundle.tar.xz -C DIR && source DIR/env.sh
# env.sh uses the machine's own OpenMPI where it has one (mpirun on PATH: the same ABI, libmpi.so.40,
# and one PMIx; mixing ours with its plugins does not load). Otherwise it copies ours to the paths
# Debian built it for, without replacing any file already there. Either way meshtrain and the
# libraries come first on PATH and LD_LIBRARY_PATH. MT_BUNDLE_MPI=1 takes ours in any case.
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
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/mpi" "$STAGE/mpibin" "$STAGE/root" "$STAGE/configs"
cp "$BUILD/meshtrain" "$STAGE/bin/"
ln -s /usr/bin/orterun "$STAGE/mpibin/mpirun"
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
  while read -r lib; do
    # OpenMPI and what it loads go apart (mpi/): a machine with its own OpenMPI uses its own.
    if [[ $(basename "$lib") =~ ^lib(mpi|mca_common|oshmem|infinipath|open-(pal|rte)|pmix|hwloc|event|fabric|uc[mpst]|psm|ibverbs|rdmacm|nl-|efa|munge|ltdl|numa) ]]; then
      cp -L "$lib" "$STAGE/mpi/"
    else
      cp -L "$lib" "$STAGE/lib/"
    fi
  done
cat > "$STAGE/env.sh" <<'SH'
# source DIR/env.sh: meshtrain first on PATH, its libraries first on LD_LIBRARY_PATH, and an OpenMPI.
_mt_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$_mt_b/bin:$PATH"
if command -v mpirun >/dev/null 2>&1 && [ -z "${MT_BUNDLE_MPI:-}" ]; then
  # The machine's own OpenMPI; ours only for a library it lacks (libhwloc, say).
  export LD_LIBRARY_PATH="$_mt_b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for _mt_l in $(ldd "$_mt_b/bin/meshtrain" | awk '/not found/ {print $1}'); do
    [ -f "$_mt_b/mpi/$_mt_l" ] && ln -sf "$_mt_b/mpi/$_mt_l" "$_mt_b/lib/$_mt_l"
  done
  echo "env.sh: the machine's OpenMPI: $(command -v mpirun)"
else
  cp -an "$_mt_b/root/." / 2>/dev/null
  export PATH="$_mt_b/mpibin:$PATH"
  export LD_LIBRARY_PATH="$_mt_b/lib:$_mt_b/mpi:/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "env.sh: the bundle's OpenMPI"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# OpenMPI's single-copy path (CMA) is left as it is: a sandbox that refuses cross-memory attach
# needs OMPI_MCA_btl_vader_single_copy_mechanism=none, which makes every large message copy twice
# and move only while its sender is inside MPI (docs/PLANNER.md, "A core per rank").
# One host, as on the machine that made the bundle: ob1 over shared memory (Debian's defaults leave
# UCX and OFI out; another distribution's OpenMPI may pick them first).
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_osc=${OMPI_MCA_osc:-^ucx}
unset _mt_b _mt_l
SH
tar -cJf "$OUT" -C "$STAGE" .
echo "mpi-bundle: $OUT ($(du -h "$OUT" | cut -f1))"
