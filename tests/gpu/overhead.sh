#!/usr/bin/env bash
# Alternating plain / shim runs of the 8-byte all_reduce host loop; prints medians.
# usage: tests/gpu/overhead.sh [SHIM_DIR (default .carry)] [REPEATS (default 5)]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
reps=${2:-5}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
runs=$(mktemp -d)
plain=(); shim=()
for i in $(seq "$reps"); do
  p=$(torchrun --standalone --nproc-per-node "$ngpu" "$here/host_loop.py" 2>/dev/null | awk '/host_loop_us_per_call/ {print $2}')
  s=$(ZCTA_OUT="$runs" LD_PRELOAD="$bin/libzcta_prof.so" torchrun --standalone --nproc-per-node "$ngpu" "$here/host_loop.py" 2>/dev/null | awk '/host_loop_us_per_call/ {print $2}')
  plain+=("$p"); shim+=("$s")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mp=$(median "${plain[@]}"); ms=$(median "${shim[@]}")
echo "8-byte all_reduce host loop, us/call (rank 0, $reps alternating runs of 20000 calls)"
echo "plain: ${plain[*]}  median $mp"
echo "shim:  ${shim[*]}  median $ms"
echo "ratio shim/plain: $(awk -v a="$ms" -v b="$mp" 'BEGIN {printf "%.3f", a/b}')"
dropped=$(python3 -c "
import glob, pyarrow.parquet as pq
print(sum(r['records_dropped'] for f in glob.glob('$runs/*/process/*.parquet') for r in pq.read_table(f).to_pylist()))")
echo "records dropped across shim runs: $dropped"
rm -rf "$runs"
