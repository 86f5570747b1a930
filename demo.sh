#!/usr/bin/env bash
# The main job: build zcta-prof, record a workload under the shim, print what it saw.
# - With a GPU and torch: examples/train.py (an MoE + DDP training loop) on every
#   local GPU under torchrun (one rank on a one-GPU box), recorded with `zcta run`,
#   which prints the report.
# - Otherwise: a STAND-IN — a C program driving a stand-in libnccl and a stand-in CUDA
#   driver (tests/fixtures/) as two ranks; no GPU is involved: the "GPU" work and its
#   event times are synthetic, made by the stand-ins where real NCCL would launch work.
# DEMO_BIN=DIR uses a libzcta_prof.so and zcta already built there (no cargo needed).
set -euo pipefail
cd "$(dirname "$0")"
if [ -n "${DEMO_BIN:-}" ]; then
  bin=$(cd "$DEMO_BIN" && pwd)
else
  cargo build --release --workspace
  bin=$PWD/target/release
fi
shim=$bin/libzcta_prof.so
zcta=$bin/zcta
out=${ZCTA_OUT:-$PWD/zcta-runs}
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if [ "$ngpu" -ge 1 ]; then
  run_id=demo-$(date -u +%Y%m%dT%H%M%SZ)
  echo "== recording examples/train.py on $ngpu GPUs under zcta ($out/$run_id)"
  "$zcta" run --out "$out" --run-id "$run_id" --shim "$shim" -- \
    torchrun --standalone --nproc-per-node "$ngpu" examples/train.py --steps "${DEMO_STEPS:-100}"
  echo
  "$zcta" summary "$out/$run_id"
else
  run_id=standin-$(date -u +%Y%m%dT%H%M%SZ)
  echo "== no GPU here: STAND-IN run (stand-in libnccl + CUDA driver, 2 ranks; GPU times are synthetic) -> $out/$run_id"
  fx=$(mktemp -d)
  tests/fixtures/build.sh "$fx"
  head -c 128 /dev/urandom >"$fx/id"
  for r in 0 1; do
    RANK=$r HOST_CUDA="$fx/cuda/libcuda.so.1" FAKE_CUDA_KERNEL_NS=2000 ZCTA_OUT="$out" ZCTA_RUN_ID="$run_id" LD_PRELOAD="$shim" \
      "$fx/host" ops $r 2 "$fx/id" 100 >/dev/null &
  done
  wait
  rm -rf "$fx"
  echo
  "$zcta" summary "$out/$run_id"
  echo
  "$zcta" report "$out/$run_id"
fi
echo
echo "DuckDB: select op, engine, count(*), median(gpu_end_ns - gpu_ready_ns) / 1e3 as gpu_us"
echo "        from read_parquet('$out/$run_id/ops/**/*.parquet') group by all order by 3 desc;"
