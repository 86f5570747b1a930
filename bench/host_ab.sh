#!/usr/bin/env bash
# Host cost of one shim build against another, per call, at a real program's call
# rate: the C host of tests/fixtures calls the no-op stand-in libnccl once every GAP_NS
# (busy in between), runs alternating plain / build A / build B. With HOST_BENCH_SR=1
# each call is a group of a Send and a Recv (ncclGroupStart, ncclSend, ncclRecv,
# ncclGroupEnd). Environment passes through (e.g. ZCTA_GPU=off ZCTA_NCCL_MASK=0: host
# rows only). A bigger queue (ZCTA_QUEUE_CAPACITY) than the default keeps records from
# being dropped if the writer falls behind; the number dropped is printed.
# usage: bench/host_ab.sh A_DIR B_DIR [CALLS (300000)] [GAP_NS (10000)] [REPEATS (6)]
#   A_DIR, B_DIR: directories holding libzcta_prof.so. FX: a tests/fixtures/build.sh
#   output (built into a temporary directory when unset).
set -euo pipefail
cd "$(dirname "$0")/.."
a=$(cd "$1" && pwd)/libzcta_prof.so
b=$(cd "$2" && pwd)/libzcta_prof.so
calls=${3:-300000}
gap=${4:-10000}
reps=${5:-6}
for f in "$a" "$b"; do [ -f "$f" ] || { echo "host_ab.sh: no $f" >&2; exit 2; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fx=${FX:-}
if [ -z "$fx" ]; then
  fx=$tmp/fx
  tests/fixtures/build.sh "$fx" >/dev/null
fi
ns() { awk '/ns_per_call/ {print $2}'; }
dropped() {
  python3 - "$1" <<'PY' 2>/dev/null || echo "?"
import glob, sys
import pyarrow.parquet as pq
rows = [pq.read_table(f).to_pylist()[-1] for f in glob.glob(f"{sys.argv[1]}/process/*.parquet")]
print(sum(r.get("records_dropped") or 0 for r in rows))
PY
}
P=(); A=(); B=(); DA=(); DB=()
for i in $(seq "$reps"); do
  P+=("$("$fx/host" bench "$calls" "$gap" | ns)")
  for which in A B; do
    lib=$a; [ "$which" = B ] && lib=$b
    run=$tmp/out/$which$i
    v=$(ZCTA_QUEUE_CAPACITY=${ZCTA_QUEUE_CAPACITY:-1048576} ZCTA_OUT="$tmp/out" ZCTA_RUN_ID="$which$i" \
      LD_PRELOAD="$lib" "$fx/host" bench "$calls" "$gap" | ns)
    d=$(dropped "$run")
    if [ "$which" = A ]; then A+=("$v"); DA+=("$d"); else B+=("$v"); DB+=("$d"); fi
  done
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mp=$(median "${P[@]}"); ma=$(median "${A[@]}"); mb=$(median "${B[@]}")
echo "calls per run: $calls, one every $gap ns, x$reps runs each, alternating"
echo "plain ns/call: ${P[*]}  median $mp"
echo "A ns/call:     ${A[*]}  median $ma  (dropped: ${DA[*]})"
echo "B ns/call:     ${B[*]}  median $mb  (dropped: ${DB[*]})"
echo "added ns/call (medians): A $(awk -v x="$ma" -v y="$mp" 'BEGIN {printf "%.1f", x-y}')  B $(awk -v x="$mb" -v y="$mp" 'BEGIN {printf "%.1f", x-y}')"
