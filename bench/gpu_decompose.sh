#!/usr/bin/env bash
# Where zcta's cost on a small collective comes from (2 GPUs): the in-process A/B of
# bench/gpu_ab.py on the 8-byte all_reduce host loop and the train step (ONLY=...), once
# per setting of the developers' knobs (bench/knob_settings.sh), each its own process pair.
# usage: [BLOCKS=16] [ONLY=allreduce,train] [SETTINGS=default,sampled,...] bench/gpu_decompose.sh [CARRY_DIR] ; logs to $OUT (default ./gpu-out)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
# These runs measure CUPTI, which only deep mode uses (bench/always_on.sh and
# tests/gpu/events.sh measure the default, CUDA events).
export ZCTA_GPU=${ZCTA_GPU:-deep} PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$here/knob_settings.sh"
only=${ONLY:-allreduce,train}
printf '%-16s %s\n' setting "measurement  on (median)  off (median)  ratio  95% CI  paired  95% CI  means  95% CI"
for i in "${!names[@]}"; do
  selected "${names[$i]}" || continue
  # shellcheck disable=SC2086
  env ${envs[$i]} ZCTA_OUT="$work/runs-${names[$i]}" LD_PRELOAD="$bin/libzcta_prof.so" timeout 200 \
    torchrun --standalone --nproc-per-node 2 "$here/gpu_ab.py" --blocks "${BLOCKS:-16}" --only "$only" \
    >"$work/${names[$i]}.log" 2>&1 || { echo "${names[$i]}: failed"; tail -5 "$work/${names[$i]}.log"; continue; }
  grep -A9 '^measurement' "$work/${names[$i]}.log" | tail -n +2 | sed "s/^/$(printf '%-16s' "${names[$i]}") /"
  # What the "on" blocks recorded: ops, and how many have their GPU side (sampled runs).
  python3 - "$root/analysis" "$work/runs-${names[$i]}" <<'PY' | sed "s/^/$(printf '%-16s' "${names[$i]}") /"
import glob, sys
sys.path.insert(0, sys.argv[1])
from zcta_analysis import read_table
ops = [read_table(run, "ops") for run in glob.glob(f"{sys.argv[2]}/*/")]
n, measured = sum(len(o) for o in ops), sum(int(o.engine.notna().sum()) for o in ops if len(o))
print(f"recorded {n} ops, {measured} with their GPU side")
PY
done | tee "$out/decompose.txt"
