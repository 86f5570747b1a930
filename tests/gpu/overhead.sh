#!/usr/bin/env bash
# Alternating runs of the 8-byte all_reduce host loop under several set-ups; prints
# each one's median and its ratio to plain.
# usage: tests/gpu/overhead.sh [SHIM_DIR (default .carry)] [REPEATS (default 5)]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
reps=${2:-5}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
runs=$(mktemp -d)
names=(plain shim shim-no-plugin shim-kernelch)
envs=("" "LD_PRELOAD=$bin/libzcta_prof.so" "LD_PRELOAD=$bin/libzcta_prof.so ZCTA_NCCL_PLUGIN=0"
      "LD_PRELOAD=$bin/libzcta_prof.so ZCTA_NCCL_KERNEL_CH=1")
declare -A res
for i in $(seq "$reps"); do
  for k in "${!names[@]}"; do
    v=$(env ${envs[$k]} ZCTA_OUT="$runs/${names[$k]}" ZCTA_RUN_ID="r$i" torchrun --standalone --nproc-per-node "$ngpu" "$here/host_loop.py" 2>/dev/null \
        | awk '/host_loop_us_per_call/ {print $2}')
    res[$k]="${res[$k]:-} $v"
  done
done
median() { printf '%s\n' $@ | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "8-byte all_reduce host loop, us/call (rank 0, $reps alternating rounds of 20000 calls)"
base=$(median ${res[0]})
for k in "${!names[@]}"; do
  m=$(median ${res[$k]})
  printf '%-16s %-40s median %8s  ratio %s\n' "${names[$k]}" "${res[$k]}" "$m" "$(awk -v a="$m" -v b="$base" 'BEGIN {printf "%.3f", a/b}')"
done
# The shim's own measure of each call's host time (api_end_ns - api_start_ns) shows
# what the profiler plugin's callbacks add inside the call, free of run-to-run noise.
python3 - "$runs" <<'PY'
import glob, sys
import pandas as pd, pyarrow.parquet as pq
runs = sys.argv[1]
dropped = 0
for variant in ("shim", "shim-no-plugin", "shim-kernelch"):
    meds = []
    for run in sorted(glob.glob(f"{runs}/{variant}/*")):
        ops = pd.concat([pq.read_table(f).to_pandas() for f in glob.glob(f"{run}/ops/*.parquet")])
        ar = ops[(ops.op == "AllReduce") & (ops["rank"] == 0)]
        meds.append(((ar.api_end_ns - ar.api_start_ns) / 1e3).median())
        dropped += sum(r["records_dropped"] or 0 for f in glob.glob(f"{run}/process/*.parquet")
                       for r in pq.read_table(f).to_pylist())
    print(f"host time inside ncclAllReduce, {variant:<15} per-run medians (us): "
          + " ".join(f"{m:.2f}" for m in meds) + f"  median {pd.Series(meds).median():.2f}")
print(f"records dropped across shim runs: {dropped}")
PY
rm -rf "$runs"
