#!/usr/bin/env bash
# What "always on" costs, on ONE GPU: plain, zcta's default (CUDA events under the
# budget), zcta's deep mode (ZCTA_GPU=deep: CUPTI's records too) and torch.profiler,
# one process per configuration, ROUNDS rounds, the order rotated every round
# (bench/always_on.py says what each process measures). Prints the table last.
#   bash bench/always_on.sh [SHIM_DIR (default .carry)]     logs and JSON under $OUT
# Env: ROUNDS (5), REPS (7), CONFIGS ("plain default deep profiler"), MEASURES.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/bench-out}
mkdir -p "$out/json" "$out/runs"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
rounds=${ROUNDS:-5}
read -r -a configs <<<"${CONFIGS:-plain default deep profiler}"
measures=${MEASURES:-}
n=${#configs[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    c=${configs[$(((i + r) % n))]}
    env_args=()
    case $c in
      plain | profiler) ;;
      default) env_args=(LD_PRELOAD="$bin/libzcta_prof.so") ;;
      deep) env_args=(LD_PRELOAD="$bin/libzcta_prof.so" ZCTA_GPU=deep) ;;
      off) env_args=(LD_PRELOAD="$bin/libzcta_prof.so" ZCTA_GPU=off) ;;
    esac
    timeout "${PROC_TIMEOUT:-150}" env "${env_args[@]}" ZCTA_OUT="$out/runs" ZCTA_RUN_ID="$c-$r" \
      python3 "$root/bench/always_on.py" --config "$c" --round "$r" --out "$out/json" \
      --reps "${REPS:-7}" ${measures:+--measures "$measures"} >>"$out/always_on.log" 2>&1 ||
      echo "round $r $c failed (see $out/always_on.log)"
  done
done
python3 "$root/bench/always_on_report.py" "$out/json" "$out/runs"
