#!/usr/bin/env bash
# The main job: build zcta-prof, record a workload under the shim, print what it saw.
# - With >= 2 GPUs and torch: a real 2-rank torch.distributed job (tests/gpu/smoke_job.py)
#   under torchrun.
# - Otherwise: a STAND-IN — a C program driving a stand-in libnccl and a stand-in
#   libcupti (tests/fixtures/) as two ranks; no GPU is involved: the "GPU" records and
#   times are synthetic, made by the stand-ins where real NCCL would launch work.
set -euo pipefail
cd "$(dirname "$0")"
cargo build --release --workspace
shim=$PWD/target/release/libzcta_prof.so
zcta=$PWD/target/release/zcta
out=${ZCTA_OUT:-$PWD/zcta-runs}
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if [ "$ngpu" -ge 2 ]; then
  run_id=demo-$(date -u +%Y%m%dT%H%M%SZ)
  echo "== recording a real $ngpu-GPU torch job under zcta ($out/$run_id)"
  NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} ZCTA_OUT="$out" ZCTA_RUN_ID="$run_id" LD_PRELOAD="$shim" \
    torchrun --standalone --nproc-per-node "$ngpu" tests/gpu/smoke_job.py --steps 50 --out "$out/$run_id/job"
else
  run_id=standin-$(date -u +%Y%m%dT%H%M%SZ)
  echo "== no GPU here: STAND-IN run (stand-in libnccl + libcupti, 2 ranks; GPU times are synthetic) -> $out/$run_id"
  fx=$(mktemp -d)
  tests/fixtures/build.sh "$fx"
  head -c 128 /dev/urandom >"$fx/id"
  for r in 0 1; do
    RANK=$r HOST_CUPTI="$fx/cupti/libcupti.so.13" ZCTA_OUT="$out" ZCTA_RUN_ID="$run_id" LD_PRELOAD="$shim" \
      "$fx/host" ops $r 2 "$fx/id" 100 >/dev/null &
  done
  wait
  rm -rf "$fx"
fi
echo
"$zcta" summary "$out/$run_id"
echo
"$zcta" report "$out/$run_id"
echo
echo "DuckDB: select op, count(*), sum(bytes) from read_parquet('$out/$run_id/ops/**/*.parquet') group by op;"
