#!/usr/bin/env bash
# GPU end-to-end checks of zcta-prof on a machine with >= 2 GPUs, torch and NCCL.
# Builds nothing: expects the shim (and the zcta CLI) built beforehand, e.g. with
#   cargo build --release --workspace && mkdir -p .carry && cp target/release/{libzcta_prof.so,zcta} .carry/
# usage: tests/gpu/run.sh [SHIM_DIR (default .carry)] ; logs go to $OUT (or ./gpu-out)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0   # NVLink multicast is forbidden on the shared test host
export PYTHONUNBUFFERED=1
steps=${SMOKE_STEPS:-200}
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
shim="$bin/libzcta_prof.so"
[ -f "$shim" ] || { echo "missing $shim"; exit 2; }
status=0
work=$(mktemp -d)

echo "== smoke: plain run"
torchrun --standalone --nproc-per-node "$ngpu" "$here/smoke_job.py" --steps "$steps" --out "$work/plain" \
  >"$out/smoke_plain.log" 2>&1 || { echo "plain run failed"; tail -20 "$out/smoke_plain.log"; status=1; }
echo "== smoke: under the shim"
runs="$work/runs"
ZCTA_OUT="$runs" LD_PRELOAD="$shim" torchrun --standalone --nproc-per-node "$ngpu" "$here/smoke_job.py" \
  --steps "$steps" --out "$work/shim" >"$out/smoke_shim.log" 2>&1 || { echo "shim run failed"; tail -20 "$out/smoke_shim.log"; status=1; }
if grep -q "zcta" "$out/smoke_shim.log"; then echo "FAIL  stray zcta output:"; grep zcta "$out/smoke_shim.log"; status=1; fi
run=$(ls -d "$runs"/*/ 2>/dev/null | head -1)
echo "run dir: $run ($(ls "$runs" | wc -l) run directories)"
python3 "$here/verify_smoke.py" "$run" "$work/plain" "$work/shim" | tee "$out/smoke_verify.txt" || status=1
python3 "$here/verify_plugin.py" default "$run" | tee -a "$out/smoke_verify.txt" || status=1

# NCCL's network transport (sockets) instead of NVLink: the proxy thread moves the data.
echo "== plugin: NET transport"
netruns="$work/net"
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 ZCTA_OUT="$netruns" LD_PRELOAD="$shim" torchrun --standalone \
  --nproc-per-node "$ngpu" "$here/smoke_job.py" --steps 10 --out "$work/net-results" >"$out/net.log" 2>&1 \
  || { echo "NET run failed"; tail -20 "$out/net.log"; status=1; }
python3 "$here/verify_plugin.py" net "$(ls -d "$netruns"/*/ | head -1)" | tee -a "$out/smoke_verify.txt" || status=1

# KernelCh GPU timers (off by default).
echo "== plugin: KernelCh timers"
kcruns="$work/kc"
ZCTA_NCCL_KERNEL_CH=1 ZCTA_OUT="$kcruns" LD_PRELOAD="$shim" torchrun --standalone --nproc-per-node "$ngpu" \
  "$here/smoke_job.py" --steps 10 --out "$work/kc-results" >"$out/kc.log" 2>&1 \
  || { echo "KernelCh run failed"; tail -20 "$out/kc.log"; status=1; }
python3 "$here/verify_plugin.py" kernelch "$(ls -d "$kcruns"/*/ | head -1)" | tee -a "$out/smoke_verify.txt" || status=1

# A user's own profiler plugin wins; the shim leaves NCCL_PROFILER_PLUGIN alone.
echo "== plugin: user-set NCCL_PROFILER_PLUGIN"
userruns="$work/user"
NCCL_PROFILER_PLUGIN=/nonexistent/libnccl-profiler-user.so ZCTA_OUT="$userruns" LD_PRELOAD="$shim" torchrun \
  --standalone --nproc-per-node "$ngpu" "$here/smoke_job.py" --steps 10 --out "$work/user-results" \
  >"$out/user.log" 2>&1 || { echo "user-plugin run failed"; tail -20 "$out/user.log"; status=1; }
python3 "$here/verify_plugin.py" user "$(ls -d "$userruns"/*/ | head -1)" | tee -a "$out/smoke_verify.txt" || status=1
[ -x "$bin/zcta" ] && "$bin/zcta" summary "$run" | tee "$out/smoke_summary.txt"
cp -r "$work/plain" "$runs/_plain_results"; cp -r "$work/shim" "$runs/_shim_results"
tar czf "$out/smoke_run.tgz" -C "$runs" . 2>/dev/null

# Multiprocessing instead of torchrun: fork (parent without NCCL, workers leave with
# os._exit) and torch.multiprocessing.spawn (run id from the parent).
for mode in fork spawn; do
  echo "== multiprocessing: $mode"
  mpout="$work/mp-$mode"
  extra=()
  [ "$mode" = fork ] && extra=(ZCTA_RUN_ID=mp-fork-test)
  env "${extra[@]}" ZCTA_OUT="$mpout" LD_PRELOAD="$shim" python3 "$here/mp_job.py" "$mode" 20 \
    >"$out/mp_$mode.log" 2>&1 || { echo "mp $mode job failed"; tail -5 "$out/mp_$mode.log"; status=1; }
  if grep -q "zcta" "$out/mp_$mode.log"; then echo "FAIL  stray zcta output:"; grep zcta "$out/mp_$mode.log"; status=1; fi
  python3 "$here/check_mp.py" "$mpout" "$mode" 20 "$ngpu" | tee -a "$out/smoke_verify.txt" || status=1
done
rm -rf "$work"
exit $status
