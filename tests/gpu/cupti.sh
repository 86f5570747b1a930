#!/usr/bin/env bash
# GPU-capture checks (CUPTI) on a machine with 2 GPUs, torch and NCCL 2.28:
# paths_job.py on the five data paths (paths_job.py says how each is forced), plus a torch.profiler
# run and a run with sampled detail (ZCTA_SAMPLE), each under the shim; verify_gpu.py checks every run. Builds nothing: expects
# the shim in SHIM_DIR (default .carry), e.g. after
#   cargo build --release --workspace && mkdir -p .carry && cp target/release/{libzcta_prof.so,zcta} .carry/
# usage: [MODES=default,ce,...] tests/gpu/cupti.sh [SHIM_DIR] ; everything (logs, run directories) is packed
# into $OUT/cupti.tgz (default ./gpu-out)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
# These runs measure CUPTI, which only deep mode uses (bench/always_on.sh and
# tests/gpu/events.sh measure the default, GPU stamps).
export ZCTA_GPU=${ZCTA_GPU:-deep}   # NVLink multicast is forbidden on the shared test host
export PYTHONUNBUFFERED=1
# The accuracy check compares the op's time on its stream (from gpu_ready_ns, which the
# stamps of the ops zcta times give) with CUDA events: every op is timed here.
export ZCTA_BUDGET=${ZCTA_BUDGET:-all}
shim="$bin/libzcta_prof.so"
[ -f "$shim" ] || { echo "missing $shim"; exit 2; }
work=$(mktemp -d)
logs="$work/logs"
mkdir -p "$logs"
status=0
summary=()
run_mode() {  # NAME EXTRA_ARGS ENV...
  local name=$1 extra=$2; shift 2
  [[ -z "${MODES:-}" || ",$MODES," == *",$name,"* ]] || return 0
  local runs="$work/runs-$name" res="$work/res-$name"
  mkdir -p "$res"
  echo "== $name ($*)"
  env "$@" ZCTA_OUT="$runs" LD_PRELOAD="$shim" timeout 300 torchrun --standalone --nproc-per-node 2 \
    "$here/paths_job.py" --mode "${name%%+*}" --out "$res" $extra >"$logs/$name.log" 2>&1 \
    || { echo "FAIL  $name: job failed"; tail -20 "$logs/$name.log"; status=1; }
  # zcta speaks only when it backs off (the profiler run): one line per rank.
  local stray; stray=$(grep '^zcta:' "$logs/$name.log" | grep -vc 'another CUPTI client')
  [ "$name" = "default+profiler" ] || stray=$(grep -c '^zcta:' "$logs/$name.log")
  [ "$stray" -eq 0 ] || { echo "FAIL  $name: zcta printed:"; grep '^zcta:' "$logs/$name.log"; status=1; }
  local run; run=$(ls -d "$runs"/*/ 2>/dev/null | head -1)
  cp -r "$res" "$logs/res-$name"
  python3 "$here/verify_gpu.py" "${name%%+*}" "$run" "$res" >"$logs/$name.verify" 2>&1 || status=1
  grep -v '^SUMMARY' "$logs/$name.verify"
  summary+=("$(grep '^SUMMARY' "$logs/$name.verify" || echo "SUMMARY mode=$name verify crashed")")
  [ -x "$bin/zcta" ] && "$bin/zcta" summary "$run" >"$logs/$name.summary" 2>&1
  mv "$runs" "$work/run-$name"
}
run_mode default ""
run_mode ce "" NCCL_CTA_POLICY=2
run_mode proxy "" NCCL_P2P_USE_CUDA_MEMCPY=1
run_mode shm "" NCCL_P2P_DISABLE=1
run_mode net "--timed 10" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
run_mode default+profiler "--profile"
run_mode default+sampled "--iters 800" ZCTA_SAMPLE=50ms/250ms   # ~3 s of calls
tar czf "$out/cupti.tgz" -C "$work" logs $(cd "$work" && ls -d run-* 2>/dev/null)
echo
printf '%s\n' "${summary[@]}"
exit $status
