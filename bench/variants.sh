#!/usr/bin/env bash
# Builds measurement builds of the shim: the tree at HEAD with one patch of
# bench/variants/ applied each (never kept in the tree: each takes a part of the
# shim's work away to measure what that part costs), into OUT_DIR/NAME/libzcta_prof.so
# (stripped), for bench/always_on.sh's SHIM2 … SHIM9.
#   bash bench/variants.sh OUT_DIR NAME...      e.g. bash bench/variants.sh .carry nostamp
# A patch that no longer applies to HEAD is an error: mend it, do not measure a guess.
# rustc warns of the code a variant skips (unreachable, unused): expected.
# The variants (bench/variants/NAME.patch, each says what it leaves out):
#   nostamp   timing: everything a timed op does but its two stamp launches (the
#             budget's choice, the capture check, the pool, the charge)
# (The variants that measured the CUDA events' cost, norec, nores, noanchor, charge20
# and sidestream, are in git history with the events: docs/PERFORMANCE.md.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: bench/variants.sh OUT_DIR NAME...}
shift
[ $# -gt 0 ] || { echo "variants.sh: name at least one variant (bench/variants/*.patch)" >&2; exit 2; }
for name in "$@"; do
  [ -f "$root/bench/variants/$name.patch" ] || { echo "variants.sh: no bench/variants/$name.patch" >&2; exit 2; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach "$work/tree" HEAD >/dev/null
for name in "$@"; do
  git -C "$work/tree" checkout -q -- .
  git -C "$work/tree" apply "$root/bench/variants/$name.patch"
  # One target directory for every variant: only the shim's crate is rebuilt.
  CARGO_TARGET_DIR="$root/target/variants" cargo build --release -p zcta-shim --manifest-path "$work/tree/Cargo.toml" >&2
  mkdir -p "$out/$name"
  cp "$root/target/variants/release/libzcta_prof.so" "$out/$name/libzcta_prof.so"
  strip "$out/$name/libzcta_prof.so"
  echo "$out/$name/libzcta_prof.so ($(git -C "$root" rev-parse --short HEAD) + $name)"
done
