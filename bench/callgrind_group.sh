#!/usr/bin/env bash
# Instructions the calling thread executes per send/recv group (ncclGroupStart,
# ncclSend, ncclRecv, ncclGroupEnd) on the stand-in libnccl, per configuration: the
# difference of callgrind's counts at N2 and N1 groups over N2 - N1, so that start-up
# and exit cancel. Deterministic, unlike times: a hot-path change shows here to the
# instruction, and this is how docs/PERFORMANCE.md's "instructions per group" rows are
# counted. NCCL's plugin is off (ZCTA_NCCL_PLUGIN=0) so the stand-in does the same
# work in every row. Modes: alone (no LD_PRELOAD), disabled (ZCTA_ENABLE=0), paused
# (recording paused, host rows off), nomask (host rows, no GPU side), default (against
# the stand-in CUDA driver), tiny (default with ZCTA_BUDGET=0.001%, the host sleeping
# 1.5 s after its warm-up calls so that the writer, which the loop starves under
# valgrind, sets the level from them: the loop runs at level 16, each op's key hashed
# and tested).
#   bash bench/callgrind_group.sh [SHIM_SO (target/release/libzcta_prof.so)]
# Env: FX (the stand-in's build dir; built with tests/fixtures/build.sh when missing,
# default $TMPDIR/zcta-fx), N1 (2000), N2 (12000), MODES ("alone disabled paused nomask
# default tiny"), PAIRS (1: the sends and receives a group holds; e.g. PAIRS=1000 N1=10
# N2=30 for an all_to_all of uneven splits over a thousand ranks). Needs valgrind.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
so=$(realpath "${1:-$root/target/release/libzcta_prof.so}")
fx=${FX:-${TMPDIR:-/tmp}/zcta-fx}
n1=${N1:-2000}
n2=${N2:-12000}
command -v valgrind >/dev/null || { echo "callgrind_group.sh: valgrind is needed" >&2; exit 2; }
[ -x "$fx/host" ] || bash "$root/tests/fixtures/build.sh" "$fx" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
count() { # mode N -> the calling thread's instruction count
  local env_args=(ZCTA_OUT="$work/out" ZCTA_NCCL_PLUGIN=0 ZCTA_QUEUE_CAPACITY=262144 HOST_BENCH_SR="${PAIRS:-1}")
  local pre=(LD_PRELOAD="$so")
  case $1 in
  alone) pre=() ;;
  disabled) env_args+=(ZCTA_ENABLE=0) ;;
  paused) env_args+=(ZCTA_GPU=off ZCTA_NCCL_MASK=0 HOST_BENCH_PAUSED=1) ;;
  nomask) env_args+=(ZCTA_GPU=off ZCTA_NCCL_MASK=0) ;;
  default) env_args+=(HOST_CUDA="$fx/cuda/libcuda.so.1") ;;
  tiny) env_args+=(HOST_CUDA="$fx/cuda/libcuda.so.1" ZCTA_BUDGET=0.001% HOST_BENCH_SETTLE_MS=1500) ;;
  *) echo "callgrind_group.sh: unknown mode $1" >&2; exit 2 ;;
  esac
  env "${env_args[@]}" "${pre[@]}" valgrind --tool=callgrind --separate-threads=yes \
    --callgrind-out-file="$work/cg.$1.$2" "$fx/host" bench "$2" >/dev/null 2>&1
  # Thread 1 is the program's own (the calling) thread.
  grep -m1 '^summary:' "$work/cg.$1.$2-01" | cut -d' ' -f2
}
printf '%-9s %s\n' mode "instructions per group (calling thread)"
for m in ${MODES:-alone disabled paused nomask default tiny}; do
  a=$(count "$m" "$n1")
  b=$(count "$m" "$n2")
  printf '%-9s %d\n' "$m" $(((b - a) / (n2 - n1)))
done
