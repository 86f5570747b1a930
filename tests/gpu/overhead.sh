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
    v=$(env ${envs[$k]} ZCTA_OUT="$runs" torchrun --standalone --nproc-per-node "$ngpu" "$here/host_loop.py" 2>/dev/null \
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
dropped=$(python3 -c "
import glob, pyarrow.parquet as pq
print(sum(r['records_dropped'] or 0 for f in glob.glob('$runs/*/process/*.parquet') for r in pq.read_table(f).to_pylist()))")
echo "records dropped across shim runs: $dropped"
rm -rf "$runs"
