#!/usr/bin/env bash
# Two builds of the shim on one GPU: bench/gpu_self_ab.py plain, then under OLD and NEW
# (each a directory holding libzcta_prof.so), alternating, ROUNDS times.
# usage: [ROUNDS=3] [BLOCKS=10] bench/gpu_self_versions.sh OLD_DIR NEW_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq "${ROUNDS:-3}"); do
  python3 "$here/gpu_self_ab.py" --blocks "${BLOCKS:-10}" --tag "plain$i" 2>&1 | grep -v Warn
  for v in old new; do
    dir=$old
    [ "$v" = new ] && dir=$new
    ZCTA_OUT="$work/$v-$i" LD_PRELOAD="$dir/libzcta_prof.so" \
      python3 "$here/gpu_self_ab.py" --blocks "${BLOCKS:-10}" --tag "$v$i" 2>&1 |
      grep -v -e Warn -e "no ZCTA_RUN_ID"
  done
done
