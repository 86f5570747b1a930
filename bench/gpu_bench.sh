#!/usr/bin/env bash
# The GPU benchmark (2 GPUs, torch, NCCL 2.28; 378 s on the 2×H200 with its five
# default configurations, 2026-11-30, unpinned): is zcta
# cheap enough to leave on, and right?
#
# 1. Overhead, process A/B: ROUNDS rounds; each round runs bench/gpu_job.py once per
#    configuration — plain, zcta (defaults), ready (zcta with ZCTA_BUDGET=all: every op
#    timed with CUDA events, so every op has gpu_ready_ns), kernelch (zcta + NCCL's per-channel GPU timers),
#    profiler (torch.profiler, CPU + CUDA activities) — in a rotated order. More for
#    CONFIGS, to split zcta's cost: nokinds (ZCTA_CUPTI_KINDS=none), kernelonly
#    (ZCTA_CUPTI_KINDS=kernel), copyonly (ZCTA_CUPTI_KINDS=memcpy,memcpy2,memset),
#    hostonly (ZCTA_CUPTI=0), nocallbacks (ZCTA_CUPTI_CALLBACKS=0: kinds on, nothing
#    joined), noplugin (ZCTA_NCCL_PLUGIN=0), kernelchonly (ZCTA_CUPTI=0 with NCCL's
#    per-channel GPU timers: what GPU times from NCCL alone would cost), kernelchmin (the
#    same with NCCL's Coll, P2p and KernelCh events only: ZCTA_NCCL_MASK=0x46). MEASURES
#    (gpu_job.py --measures) limits what each process measures; AB_BLOCKS=0 skips step 2.
#    Each rank pins itself to its CPU set of BENCH_RANK_CPUS (default 0-7:8-15; empty:
#    not pinned; pin_rank in examples/nccl_bench.py): unpinned, plain processes' 8-byte
#    loop ranged 44–58 us on the 2xH200; with the whole torchrun on cores 0-7, 33–39 us
#    (docs/dev/cupti-measurements.md, "The same, pinned"). The report also gives each configuration's
#    time inside the NCCL call, from zcta's own rows of every run.
#    Measures: examples/train.py step time, 8-byte all_reduce host loop, 1 MiB and
#    128 MiB all_to_all loops.
# 2. Overhead, in-process A/B (bench/gpu_ab.py): the same processes alternate blocks
#    with zcta recording on and off (ABBA), so start-up variance cancels out.
# 3. Accuracy (in the first zcta process, defaults: without gpu_ready_ns the duration is
#    the kernels' span; tests/gpu/cupti.sh checks it with ZCTA_BUDGET=all): zcta's GPU duration per op vs CUDA events
#    around the same op; zcta's busbw vs an nccl-tests-style loop; phase conservation
#    over every op of the run (`zcta phases`).
# 4. Data: bytes on disk per op, writer lag (bench/wal_lag.py watching the write-ahead
#    log), CUPTI records dropped, queue drops.
# bench/gpu_bench_report.py prints every table (markdown) at the end.
#
# Builds nothing: expects the shim and the zcta CLI in CARRY_DIR, e.g. after
#   cargo build --release --workspace && mkdir -p .carry && cp target/release/{libzcta_prof.so,zcta} .carry/
# usage: [ROUNDS=3] [AB_BLOCKS=16] [CONFIGS="plain zcta ready kernelch profiler"]
#        [BENCH_RANK_CPUS=0-7:8-15] [MEASURES=allreduce_8B_us,...] bench/gpu_bench.sh [CARRY_DIR]
# Logs, the report and the run directories' summaries go to $OUT (default ./gpu-out),
# with round 0's run directories in runs0.tgz.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
rounds=${ROUNDS:-3}
blocks=${AB_BLOCKS:-16}
read -r -a configs <<<"${CONFIGS:-plain zcta ready kernelch profiler}"
export BENCH_RANK_CPUS=${BENCH_RANK_CPUS-0-7:8-15}
export NCCL_NVLS_ENABLE=0
# These runs measure CUPTI, which only deep mode uses (bench/always_on.sh and
# tests/gpu/events.sh measure the default, CUDA events).
export ZCTA_GPU=${ZCTA_GPU:-deep} PYTHONUNBUFFERED=1   # NVLink multicast is forbidden on the test host
shim="$bin/libzcta_prof.so"
[ -f "$shim" ] && [ -x "$bin/zcta" ] || { echo "missing $shim or $bin/zcta"; exit 2; }
# The environment configuration $1 adds, one assignment per line; fails for an unknown one.
config_env() {
  case $1 in
    plain | profiler) ;;
    zcta) echo "LD_PRELOAD=$shim" ;;
    ready) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_BUDGET=all ;;
    kernelch) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_NCCL_KERNEL_CH=1 ;;
    nokinds) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_CUPTI_KINDS=none ;;
    kernelonly) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_CUPTI_KINDS=kernel ;;
    copyonly) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_CUPTI_KINDS=memcpy,memcpy2,memset ;;
    hostonly) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_CUPTI=0 ;;
    nocallbacks) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_CUPTI_CALLBACKS=0 ;;
    noplugin) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_NCCL_PLUGIN=0 ;;
    kernelchonly) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_CUPTI=0 ZCTA_NCCL_KERNEL_CH=1 ;;
    kernelchmin) printf '%s\n' "LD_PRELOAD=$shim" ZCTA_CUPTI=0 ZCTA_NCCL_MASK=0x46 ;;
    *) return 1 ;;
  esac
}
for c in "${configs[@]}"; do
  config_env "$c" >/dev/null || {
    echo "unknown configuration $c (known: plain zcta ready kernelch profiler nokinds kernelonly copyonly hostonly nocallbacks noplugin kernelchonly kernelchmin)"
    exit 2
  }
done
work=$(mktemp -d)
mkdir -p "$out" "$work/res" "$work/logs"
runs="$work/runs"
status=0
t0=$(date +%s)

for ((r = 0; r < rounds; r++)); do
  n=${#configs[@]}
  for ((i = 0; i < n; i++)); do
    c=${configs[$(((i + r) % n))]}
    mapfile -t envs < <(config_env "$c")
    envs+=(ZCTA_OUT="$runs" ZCTA_RUN_ID="$c-$r")
    extra=()
    if [ -n "${MEASURES:-}" ]; then extra=(--measures "$MEASURES"); fi
    watcher=
    if [ "$c" = zcta ] && [ "$r" = 0 ]; then
      extra+=(--accuracy)
      python3 "$here/wal_lag.py" "$runs/zcta-0" "$work/res/wal_lag.json" "$work/stop" &
      watcher=$!
    fi
    echo "== round $r: $c"
    env "${envs[@]}" timeout 300 torchrun --standalone --nproc-per-node 2 "$here/gpu_job.py" \
      --config "$c" --round "$r" --out "$work/res" ${extra[@]+"${extra[@]}"} >"$work/logs/$c-$r.log" 2>&1 \
      || { echo "FAIL  $c round $r"; tail -15 "$work/logs/$c-$r.log"; status=1; }
    if [ -n "$watcher" ]; then touch "$work/stop"; wait "$watcher"; fi
  done
done

if [ "$blocks" -gt 0 ]; then
  echo "== in-process A/B ($blocks blocks per setting)"
  ZCTA_OUT="$runs" ZCTA_RUN_ID=ab LD_PRELOAD="$shim" timeout 300 torchrun --standalone --nproc-per-node 2 \
    "$here/gpu_ab.py" --blocks "$blocks" >"$work/logs/ab.log" 2>&1 \
    || { echo "FAIL  in-process A/B"; tail -15 "$work/logs/ab.log"; status=1; }
  grep -A10 '^measurement' "$work/logs/ab.log" >"$work/res/ab.txt"
fi

if [ -d "$runs/zcta-0" ]; then
  du -sb "$runs/zcta-0" | cut -f1 >"$work/res/disk_bytes"   # before `zcta phases` adds its table
  "$bin/zcta" phases "$runs/zcta-0" >"$work/logs/phases.log" 2>&1 || status=1
  "$bin/zcta" report --format json "$runs/zcta-0" >"$work/res/report.json" 2>"$work/logs/report.err" || status=1
  "$bin/zcta" summary "$runs/zcta-0" >"$work/logs/summary.txt" 2>&1
fi
python3 "$here/gpu_bench_report.py" "$work" "$runs" | tee "$out/bench.md" || status=1
echo "wall: $(($(date +%s) - t0)) s"
tar czf "$out/bench.tgz" -C "$work" logs res
# Round 0's run directories (~1 MB each: 60 bytes per op on disk, 2026-11-30), so the
# rows can be read again off the GPU machine (the device returns files up to 16 MiB).
(cd "$runs" 2>/dev/null && ls -d -- *-0 >/dev/null 2>&1) && tar czf "$out/runs0.tgz" -C "$runs" $(cd "$runs" && ls -d -- *-0)
exit $status
