#!/usr/bin/env bash
# Host cost of the shim per NCCL call, against a no-op stand-in libnccl, and memory
# growth over many calls. Alternates plain and shim runs; prints medians.
# usage: bench/host_cost.sh [CALLS (default 10000000)] [REPEATS (default 5)]
# Needs: cargo build --release --workspace (target/release/libzcta_prof.so), a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-10000000}
reps=${2:-5}
shim=$PWD/target/release/libzcta_prof.so
[ -f "$shim" ] || { echo "build first: cargo build --release --workspace"; exit 2; }
fx=$(mktemp -d)
trap 'rm -rf "$fx"' EXIT
tests/fixtures/build.sh "$fx"
plain=(); shimmed=(); rss=()
for i in $(seq "$reps"); do
  p=$("$fx/host" bench "$calls" | awk '/ns_per_call/ {print $2}')
  o=$(ZCTA_OUT="$fx/out" ZCTA_RUN_ID="run$i" LD_PRELOAD="$shim" "$fx/host" bench "$calls")
  s=$(echo "$o" | awk '/ns_per_call/ {print $2}')
  rb=$(echo "$o" | awk '/rss_kb_before/ {print $2}'); ra=$(echo "$o" | awk '/rss_kb_after/ {print $2}')
  plain+=("$p"); shimmed+=("$s"); rss+=("$((ra - rb))")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mp=$(median "${plain[@]}"); ms=$(median "${shimmed[@]}")
echo "calls per run:           $calls  (x$reps runs each, alternating)"
echo "plain ns/call:           ${plain[*]}  median $mp"
echo "shim ns/call:            ${shimmed[*]}  median $ms"
echo "added ns/call (median):  $(awk -v a="$ms" -v b="$mp" 'BEGIN {printf "%.1f", a-b}')"
echo "RSS growth over the calls under the shim (kB): ${rss[*]}"
# Rows written vs dropped, and bytes per ops row on disk, from the last run.
if command -v python3 >/dev/null && python3 -c 'import pyarrow' 2>/dev/null; then
python3 - "$fx/out/run$reps" <<'PY'
import glob, os, sys
import pyarrow.parquet as pq
run = sys.argv[1]
files = glob.glob(f"{run}/ops/*.parquet")
rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
size = sum(os.path.getsize(f) for f in files)
p = pq.read_table(glob.glob(f"{run}/process/*.parquet")[0]).to_pylist()[0]
print(f"ops rows written: {rows}, dropped (queue full): {p['records_dropped']}, bytes/row on disk: {size / max(rows, 1):.2f}")
PY
fi
