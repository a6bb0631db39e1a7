# Sourced by the device campaigns (planner-campaign.sh, bind-ab.sh). bundle_enter NAME [BUNDLE]:
# with a bundle made by scripts/mpi-bundle.sh, unpacks it, takes its environment (env.sh) and works
# from it; without, the checkout's build/ci. Then a meshtrain on PATH and the planner configs' corpus
# (data/fortunes-train) are required: NAME says which script lacks it, and it exits 2.
bundle_enter() {
  local name="$1" bundle="${2:-}" b
  if [ -n "$bundle" ]; then
    b=$(mktemp -d)
    tar -xJf "$bundle" -C "$b" || { echo "$name: cannot unpack $bundle" >&2; exit 2; }
    # shellcheck disable=SC1091
    source "$b/env.sh"
    cd "$b" || exit 1
  fi
  command -v meshtrain >/dev/null || export PATH="$PWD/build/ci:$PATH"
  [ -f data/fortunes-train.idx ] || { echo "$name: no data/fortunes-train (scripts/demo.sh makes it)" >&2; exit 2; }
}
