#!/usr/bin/env bash
# zcta under an NCCL newer than torch's wheel, on one GPU: builds NCCL from a source
# tarball (tests/gpu/nccl_build.sh), puts it in place of the wheel's libnccl.so.2 for
# this machine's python (put back at the end), and runs the deep-mode checks
# (tests/gpu/one_gpu.py) and a default-mode send/recv loop under it; prints what
# NCCL and zcta said of each other (version, profiler ABI loaded).
#   git -C NCCL_REPO archive --prefix=nccl/ v2.30.7-1 | gzip > .carry/nccl-2.30.7.tar.gz
#   bash tests/gpu/newer_nccl.sh .carry/nccl-2.30.7.tar.gz [SHIM_DIR]   logs under $OUT
# Env: BUILD_TIMEOUT (s, default 420), DEEP_RUNS (how many times the deep-mode checks
# run, default 1), EVENTS_PARTS (tests/gpu/events.sh's parts to
# run under it too, e.g. "accuracy capture report"), and nccl_build.sh's.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tarball=$(realpath "$1")
bin=$(cd "${2:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
build=$(mktemp -d)
t0=$(date +%s)
if ! timeout "${BUILD_TIMEOUT:-420}" bash "$here/nccl_build.sh" "$tarball" "$build" >"$out/nccl_build.log" 2>&1; then
  echo "FAIL build after $(($(date +%s) - t0)) s (see nccl_build.log)"
  tail -15 "$out/nccl_build.log"
  exit 1
fi
echo "built in $(($(date +%s) - t0)) s: $(ls "$build/lib")"
lib=$(find "$build/lib" -name 'libnccl.so.2.*' | head -1)
wheel_dir=$(python3 -c 'import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], "lib"))')
saved=$(mktemp)
cp "$wheel_dir/libnccl.so.2" "$saved"
trap 'cp "$saved" "$wheel_dir/libnccl.so.2"' EXIT
cp "$lib" "$wheel_dir/libnccl.so.2"
# torch.cuda.nccl.version() is the version torch was built with; ncclGetVersion of
# the library a torch process loads is the one that runs.
python3 -c '
import ctypes, torch
v = ctypes.c_int()
ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(v))
print("torch", torch.__version__, "built with NCCL", ".".join(map(str, torch.cuda.nccl.version())), "loads", v.value)'
status=0
for i in $(seq "${DEEP_RUNS:-1}"); do
  timeout 180 python3 "$here/one_gpu.py" "$bin" >"$out/newer-deep-$i.log" 2>&1 || status=1
  echo "== deep-mode checks (tests/gpu/one_gpu.py), run $i"
  grep -E '^(FAIL|SUMMARY|INFO  early)' "$out/newer-deep-$i.log"
done
if [ -n "${EVENTS_PARTS:-}" ]; then
  echo "== default GPU side (tests/gpu/events.sh: $EVENTS_PARTS)"
  OUT="$out" PARTS="$EVENTS_PARTS" bash "$here/events.sh" "$bin" || status=1
fi
runs=$(mktemp -d)
timeout 120 env LD_PRELOAD="$bin/libzcta_prof.so" ZCTA_OUT="$runs" ZCTA_RUN_ID=newer \
  python3 "$root/bench/always_on.py" --config default --out "$runs/json" --reps 3 \
  --measures sr_8B_us,sr_1MiB_us >"$out/newer-sr.log" 2>&1 || status=1
echo "== default mode, send/recv loop"
tail -1 "$out/newer-sr.log"
python3 - "$runs/newer" <<'PY' || status=1
import sys
from pathlib import Path
import pyarrow.dataset as ds
run = Path(sys.argv[1])
p = ds.dataset(str(run / "process"), format="parquet").to_table().to_pylist()[0]
for k in ["nccl_version", "nccl_lib", "profiler_plugin", "profiler_abi", "plugin_comms", "gpu_timing", "ops_timed"]:
    print(f"{k}: {p.get(k)}")
ops = ds.dataset(str(run / "ops"), format="parquet").to_table(columns=["timing", "engine"]).to_pylist()
from collections import Counter
print("ops timing:", dict(Counter(o["timing"] for o in ops)))
print("ops engine:", dict(Counter(o["engine"] for o in ops)))
n = ds.dataset(str(run / "nccl_ops"), format="parquet").count_rows() if (run / "nccl_ops").exists() else 0
print("nccl_ops rows:", n)
PY
exit $status
