#!/usr/bin/env bash
# The fresh-machine check: does the README's install work on a Debian 12 that has nothing on it?
# Builds a clean root with debootstrap from the mirror this machine's apt already uses (read from
# the apt sources, never written here), copies the working tree in, and inside it (chroot, with
# /proc, /sys and /dev mounted) runs scripts/install-deps.sh, a configure + build of meshtrain
# (the ci preset's flags, through this machine's ccache: see finish) and a 20-step tiny train. A
# package installed by hand on the CI machine but missing from install-deps.sh fails here.
# The bare root is cached as build/fresh-root-<suite>.tar between local runs; with CI=true (CI) it
# is always built anew. Needs root (debootstrap, chroot, mount).
# Usage: scripts/fresh-machine-check.sh [--prepare | --finish]   (env MT_FRESH_KEEP=1 keeps the root
# for inspection). --prepare does the root and the install (mostly downloads and dpkg) and leaves
# the root in build/fresh; --finish builds and trains in it and removes it (--clean only removes
# it): scripts/test.sh runs the first beside its own build and the second at its end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SUITE=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
WORK=$REPO/build/fresh
ROOT=$WORK/root
CACHE=$REPO/build/fresh-root-$SUITE.tar

# The mirror of the apt sources: deb822 (*.sources) or one-line (sources.list) format.
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  mirror=$(awk -v s="$SUITE" '
    /^URIs:/ {u=$2} /^Suites:/ {for (i = 2; i <= NF; i++) if ($i == s) ok=1}
    /^$/ {if (ok && u !~ /security/) {print u; exit} ok=0}
    END {if (ok && u !~ /security/) print u}' "$f" | head -1)
  [ -n "$mirror" ] && break
done
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk -v s="$SUITE" '$1 == "deb" && $3 == s && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "fresh-machine-check: no $SUITE mirror in the apt sources" >&2; exit 1; }

if ! command -v debootstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

unmount() {
  for m in root/.cache/ccache dev/pts dev sys proc; do
    mountpoint -q "$ROOT/$m" 2>/dev/null && umount -l "$ROOT/$m"
  done
  return 0
}
cleanup() {
  unmount
  # Never delete through a mount that is still there (the root's /dev is the machine's).
  if grep -q " $WORK/" /proc/mounts; then
    echo "fresh-machine-check: mounts remain under $WORK; it is left in place" >&2
    return 1
  fi
  [ "${MT_FRESH_KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
mount_root() {
  mount -t proc proc "$ROOT/proc"
  mount -t sysfs sys "$ROOT/sys"
  mount --bind /dev "$ROOT/dev"
  mount --bind /dev/pts "$ROOT/dev/pts"
}
in_root() {  # in_root SCRIPT: runs it in the root as a fresh login would, from the tree's copy
  chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    /bin/bash -euo pipefail -c "cd /src/meshtrain; $1"
}

# Phase one, mostly downloads and dpkg (little CPU): the root, the tree and install-deps.sh.
prepare() {
  cleanup
  mkdir -p "$WORK"
  local t0 t1
  t0=$(date +%s)
  if [ -f "$CACHE" ] && [ "${CI:-}" != true ]; then
    echo "fresh-machine-check: bare $SUITE root from $CACHE"
    mkdir -p "$ROOT" && tar -xf "$CACHE" -C "$ROOT"
  else
    echo "fresh-machine-check: debootstrap $SUITE from $mirror"
    debootstrap --variant=minbase "$SUITE" "$ROOT" "$mirror" > "$WORK/debootstrap.log" 2>&1 ||
      { tail -20 "$WORK/debootstrap.log"; return 1; }
    [ "${CI:-}" = true ] || tar -cf "$CACHE" -C "$ROOT" .
  fi
  t1=$(date +%s)
  # The working tree as CI sees it: tracked and untracked-but-not-ignored files.
  mkdir -p "$ROOT/src/meshtrain"
  git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$ROOT/src/meshtrain"
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  # The packages this machine's apt already fetched, as hard links (copies across filesystems): apt
  # in the root checks each against its own index and downloads what is missing or of another
  # version, so what gets installed is still decided by install-deps.sh alone.
  mkdir -p "$ROOT/var/cache/apt/archives"
  local deb to
  for deb in /var/cache/apt/archives/*.deb; do
    to="$ROOT/var/cache/apt/archives/${deb##*/}"
    [ -e "$deb" ] && [ ! -e "$to" ] || continue  # none there, or debootstrap's own
    ln "$deb" "$to" 2>/dev/null || cp "$deb" "$to" || true
  done
  mount_root
  in_root 'bash scripts/install-deps.sh'
  unmount
  echo "fresh-machine-check: prepared (root $((t1 - t0)) s, install-deps $(($(date +%s) - t1)) s)"
}

# Phase two, the CPU's: configure, build and a 20-step train in the prepared root.
finish() {
  [ -f "$ROOT/src/meshtrain/scripts/install-deps.sh" ] ||
    { echo "fresh-machine-check: no prepared root in $ROOT (run --prepare first)" >&2; return 1; }
  local t1
  t1=$(date +%s)
  mount_root
  # The ci preset's flags and folder, compiled through this machine's ccache mounted in the root:
  # with base_dir the tree's own paths hash as relative ones, so the objects scripts/test.sh's ci
  # build just made are handed over, and the check costs a link instead of a second build (it
  # compiles as before where the cache lacks them). It still checks the packages: ccache hashes
  # every header a compile includes, read from the root's files (one missing or of another version
  # compiles, and fails, for real), and the link is against the root's libraries.
  local cache
  cache=$(ccache -k cache_dir 2>/dev/null || true)
  if [ -n "$cache" ] && [ -d "$cache" ]; then
    mkdir -p "$ROOT/root/.cache/ccache"
    mount --bind "$cache" "$ROOT/root/.cache/ccache"
  fi
  in_root '
  export CCACHE_BASEDIR=/src/meshtrain CCACHE_DIR=/root/.cache/ccache
  cmake --preset ci -DMT_BUILD_TESTS=OFF -DMT_BUILD_BENCH=OFF >/dev/null
  ccache -z >/dev/null
  cmake --build build/ci --target meshtrain -j"$(nproc)" >/dev/null
  ccache -s | grep -E "^ *(Hits|Misses):" || true
  m=build/ci/meshtrain
  mkdir -p /tmp/fresh && cd /tmp/fresh
  "/src/meshtrain/$m" tokenize /usr/share/games/fortunes/fortunes --train-bpe 512 -o corpus >/dev/null
  cat > tiny.json <<JSON
{"model": {"model_type": "gpt2", "vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 2},
 "data": {"train": "corpus", "tokenizer": "corpus.tokenizer.json"},
 "seq_length": 64, "train_iters": 20, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "steps_per_print": 10, "save_dir": "run", "save_interval": 20,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}}
JSON
  "/src/meshtrain/$m" train tiny.json
  test -f run/latest
'
  echo "fresh-machine-check: passed (build + 20-step train $(($(date +%s) - t1)) s)"
}

case "${1:-}" in
  "") trap cleanup EXIT; prepare; finish ;;
  --prepare) trap 'if [ $? -eq 0 ]; then unmount; else cleanup; fi' EXIT; prepare ;;
  --finish) trap cleanup EXIT; finish ;;
  --clean) cleanup ;;
  *) echo "usage: scripts/fresh-machine-check.sh [--prepare | --finish | --clean]" >&2; exit 2 ;;
esac
