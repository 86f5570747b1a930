#!/usr/bin/env bash
# Where zcta's cost on a small collective comes from (2 GPUs): the in-process A/B of
# bench/gpu_ab.py on the 8-byte all_reduce host loop and the train step (ONLY=...), once per setting of the
# developers' knobs (docs/dev/cupti.md), each its own process pair:
#   default          every activity kind + launch callbacks + host records + plugin
#   no-kinds         launch callbacks + host records + plugin (ZCTA_CUPTI_KINDS=none)
#   copies-only      memcpy/memset records only + callbacks (no kernel records)
#   no-callbacks     every kind, no launch callbacks (ZCTA_CUPTI_CALLBACKS=0)
#   nccl-mask-0      everything but NCCL's profiler events (ZCTA_NCCL_MASK=0)
#   host-only        no CUPTI at all (ZCTA_CUPTI=0): host records + plugin
#   host-no-plugin   ZCTA_CUPTI=0 ZCTA_NCCL_PLUGIN=0: host records only
# usage: [BLOCKS=16] bench/gpu_decompose.sh [CARRY_DIR] ; logs to $OUT (default ./gpu-out)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
names=(default no-kinds copies-only no-callbacks nccl-mask-0 host-only host-no-plugin)
envs=("" "ZCTA_CUPTI_KINDS=none" "ZCTA_CUPTI_KINDS=memcpy,memcpy2,memset" "ZCTA_CUPTI_CALLBACKS=0"
      "ZCTA_NCCL_MASK=0" "ZCTA_CUPTI=0" "ZCTA_CUPTI=0 ZCTA_NCCL_PLUGIN=0")
only=${ONLY:-allreduce,train}
printf '%-16s %s\n' setting "measurement  on (median)  off (median)  ratio  95% CI  paired  95% CI"
for i in "${!names[@]}"; do
  # shellcheck disable=SC2086
  env ${envs[$i]} ZCTA_OUT="$work/runs" LD_PRELOAD="$bin/libzcta_prof.so" timeout 200 \
    torchrun --standalone --nproc-per-node 2 "$here/gpu_ab.py" --blocks "${BLOCKS:-16}" --only "$only" \
    >"$work/${names[$i]}.log" 2>&1 || { echo "${names[$i]}: failed"; tail -5 "$work/${names[$i]}.log"; continue; }
  grep -A9 '^measurement' "$work/${names[$i]}.log" | tail -n +2 | sed "s/^/$(printf '%-16s' "${names[$i]}") /"
done | tee "$out/decompose.txt"
