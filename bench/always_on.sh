#!/usr/bin/env bash
# What "always on" costs, on ONE GPU: plain, zcta's default (GPU stamps under the
# budget), zcta's deep mode (ZCTA_GPU=deep: CUPTI's records too) and torch.profiler,
# one process per configuration, ROUNDS rounds, the order rotated every round
# (bench/always_on.py says what each process measures). Prints the table last.
#   bash bench/always_on.sh [SHIM_DIR (default .carry)]     logs and JSON under $OUT
# Env: ROUNDS (5), REPS (7), CONFIGS ("plain default deep profiler"; also off, nomask,
# noplugin, disabled, all, tiny, half, events0: see below), MEASURES, AB=1 (in-process
# A/B against paused recording in zcta's configurations; the same blocks, an A/A, in
# the others; AB_BLOCK_MS: each block's least length, 100 by default; AB_FINE=N: also up
# to N pairs of single items a repetition, recording switched at every item, for at most
# AB_FINE_S seconds (10) a loop), PROC_TIMEOUT
# (seconds a process may run, 150 by default; torch.profiler's three times that), PIN (a CPU list
# for taskset, e.g. 2-5), ISOLATE=1 (after the warm-up, the measuring thread alone on
# one core of PIN's CPUs and the process's other threads on the rest:
# bench/affinity.py), SHIM2 … SHIM9 (other builds' directories: a zcta configuration
# named with a trailing digit N, e.g. default2, runs build SHIMN, so builds are
# compared in one run), START_ROUND (0: the first round to run, so that one run's
# rounds can be spread over several commands, e.g. ROUNDS=3, then START_ROUND=3
# ROUNDS=5 with the first command's json/ copied into this one's $OUT: the rotation
# goes on where it stopped, and the report reads every round's JSON).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
bin1=$(cd "${1:-$root/.carry}" && pwd)
# shellcheck source=bench/configs.sh
. "$root/bench/configs.sh"
out=${OUT:-$root/bench-out}
mkdir -p "$out/json" "$out/runs"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
rounds=${ROUNDS:-5}
read -r -a configs <<<"${CONFIGS:-plain default deep profiler}"
measures=${MEASURES:-}
n=${#configs[@]}
for ((r = ${START_ROUND:-0}; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    c=${configs[$(((i + r) % n))]}
    if ! config_env "$c" "$bin1"; then
      echo "always_on.sh: unknown configuration $c" >&2
      exit 2
    fi
    ab=()
    # Every process runs the same blocks (plain and torch.profiler an A/A).
    [ "${AB:-0}" = 1 ] && ab=(--ab ${AB_BLOCK_MS:+--ab-block-ms "$AB_BLOCK_MS"} ${AB_FINE:+--ab-fine "$AB_FINE"} ${AB_FINE_S:+--ab-fine-s "$AB_FINE_S"})
    iso=()
    [ "${ISOLATE:-0}" = 1 ] && iso=(--isolate)
    pin=()
    [ -n "${PIN:-}" ] && pin=(taskset -c "$PIN")
    # torch.profiler's processes run the same work slower and write their trace at the
    # end: three times the others' limit.
    limit=${PROC_TIMEOUT:-150}
    [ "${c%[2-9]}" = profiler ] && limit=$((limit * 3))
    timeout "$limit" "${pin[@]}" env "${env_args[@]}" ZCTA_OUT="$out/runs" ZCTA_RUN_ID="$c-$r" \
      python3 "$root/bench/always_on.py" --config "$c" --round "$r" --out "$out/json" \
      --reps "${REPS:-7}" ${measures:+--measures "$measures"} "${ab[@]}" "${iso[@]}" >>"$out/always_on.log" 2>&1 ||
      echo "round $r $c failed (see $out/always_on.log)"
  done
done
python3 "$root/bench/always_on_report.py" "$out/json" "$out/runs"
