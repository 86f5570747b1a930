#!/usr/bin/env bash
# One GPU: bench/gpu_self_ab.py plain, then under the shim once per setting of the
# developers' knobs (bench/knob_settings.sh), each its own process.
# usage: [BLOCKS=16] [SETTINGS=default,between-windows,...] bench/gpu_self_decompose.sh [CARRY_DIR] ; logs to $OUT (default ./gpu-out)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$here/knob_settings.sh"
{
  timeout 120 python3 "$here/gpu_self_ab.py" --blocks "${BLOCKS:-16}" --tag plain 2>&1 | grep -v Warn
  for i in "${!names[@]}"; do
    selected "${names[$i]}" || continue
    # shellcheck disable=SC2086
    env ${envs[$i]} ZCTA_OUT="$work/runs-${names[$i]}" LD_PRELOAD="$bin/libzcta_prof.so" timeout 120 \
      python3 "$here/gpu_self_ab.py" --blocks "${BLOCKS:-16}" --tag "${names[$i]}" \
      >"$work/${names[$i]}.log" 2>&1 || { echo "${names[$i]}: failed"; tail -5 "$work/${names[$i]}.log"; continue; }
    grep -v Warn "$work/${names[$i]}.log"
  done
} | tee "$out/self_decompose.txt"
for d in "$work/runs-default"/*/; do "$bin/zcta" report "$d" 2>&1 | head -12; done
