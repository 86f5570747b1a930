#!/usr/bin/env bash
# One-GPU checks of the default GPU side (GPU stamps): accuracy against the program's
# own CUDA events, a CUDA-graph capture with and without zcta, the clock anchors
# (no ready time before its call), and the default report of a 1-rank training run
# (examples/train.py). tests/gpu/events.py says what each
# checks. Expects the shim and CLI built beforehand (SHIM_DIR, default .carry).
#   bash tests/gpu/events.sh [SHIM_DIR]        logs under $OUT (default ./gpu-out)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
shim=$bin/libzcta_prof.so
work=$(mktemp -d)
status=0
parts=${PARTS:-accuracy capture anchors report}
py() { timeout "${PART_TIMEOUT:-120}" python3 "$here/events.py" "$@" >>"$out/events.log" 2>&1; }
check() { python3 "$here/events.py" "$@" 2>>"$out/events.log" | tee -a "$out/events_summary.txt" || status=1; }

if [[ " $parts " == *" accuracy "* ]]; then
  py accuracy "$work/acc-plain.json" || { echo "FAIL accuracy run, plain"; status=1; }
  LD_PRELOAD=$shim ZCTA_BUDGET=all ZCTA_OUT=$work ZCTA_RUN_ID=acc py accuracy "$work/acc.json" || { echo "FAIL accuracy run"; status=1; }
  check check-accuracy "$work/acc.json" "$work/acc" "$work/acc-plain.json"
fi
if [[ " $parts " == *" capture "* ]]; then
  # Only a2a: NCCL's send/recv to itself captured into a graph did not finish on one
  # H200 (torch 2.11, NCCL 2.28.9), without zcta too.
  for what in ${CAPTURE_VARIANTS:-a2a}; do
    py capture "$work/cap-$what-plain.json" "$what" || { echo "FAIL capture $what, plain (rc $?)"; status=1; continue; }
    LD_PRELOAD=$shim ZCTA_OUT=$work ZCTA_RUN_ID=cap-$what py capture "$work/cap-$what-zcta.json" "$what" ||
      { echo "FAIL capture $what under zcta (rc $?)"; status=1; continue; }
    check check-capture "$work/cap-$what-plain.json" "$work/cap-$what-zcta.json" "$work/cap-$what"
  done
fi
if [[ " $parts " == *" anchors "* ]]; then
  LD_PRELOAD=$shim ZCTA_BUDGET=all ZCTA_OUT=$work ZCTA_RUN_ID=anchors py anchors || { echo "FAIL anchors run"; status=1; }
  check check-anchors "$work/anchors"
fi
[[ " $parts " == *" report "* ]] || { tar czf "$out/events_runs.tgz" -C "$work" . 2>/dev/null; exit $status; }
timeout "${TRAIN_TIMEOUT:-300}" "$bin/zcta" run --out "$work" --run-id train --shim "$shim" -- \
  torchrun --standalone --nproc-per-node 1 "$root/examples/train.py" --steps "${TRAIN_STEPS:-100}" \
  >"$out/train_report.txt" 2>&1 || { echo "FAIL train under zcta run"; status=1; }
"$bin/zcta" phases "$work/train" >>"$out/events.log" 2>&1 || { echo "FAIL zcta phases"; status=1; }
check check-report "$work/train"
tar czf "$out/events_runs.tgz" -C "$work" . 2>/dev/null
exit $status
