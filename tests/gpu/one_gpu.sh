#!/usr/bin/env bash
# Every check that one GPU allows, in one go: the default GPU side
# (tests/gpu/events.sh: accuracy, CUDA-graph capture, report of a one-rank training
# run), deep mode (tests/gpu/one_gpu.py), `zcta doctor` and `./demo.sh` on the real
# example. Expects the shim and CLI built beforehand (SHIM_DIR, default .carry), e.g.
#   cargo build --release --workspace && mkdir -p .carry && cp target/release/{libzcta_prof.so,zcta} .carry/
#   bash tests/gpu/one_gpu.sh [SHIM_DIR]      logs under $OUT (default ./gpu-out); a table last
# Env: SKIP (parts to leave out: events deep doctor demo).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
skip=" ${SKIP:-} "
rows=()
part() { # NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 t0 rc
  shift 2
  [[ "$skip" == *" $name "* ]] && { rows+=("$name|skipped|"); return; }
  t0=$(date +%s)
  timeout "$limit" "$@" >"$out/part-$name.log" 2>&1
  rc=$?
  rows+=("$name|rc $rc|$(($(date +%s) - t0)) s")
}
{
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
} >"$out/versions.txt" 2>&1
part events 330 env OUT="$out" bash "$here/events.sh" "$bin"
part deep 120 python3 "$here/one_gpu.py" "$bin"
part doctor 60 "$bin/zcta" doctor
part demo 240 env DEMO_BIN="$bin" ZCTA_OUT="$(mktemp -d)" DEMO_STEPS=50 bash "$root/demo.sh"
echo "== versions"
cat "$out/versions.txt"
echo "== events"
cat "$out/events_summary.txt" 2>/dev/null
echo "== deep"
grep -E '^(FAIL|SUMMARY)' "$out/part-deep.log"
echo "== doctor (last lines)"
tail -5 "$out/part-doctor.log"
echo "== demo (report lines)"
grep -E '^(ok|run|==|  *[0-9]+ ops)|report|measured' "$out/part-demo.log" | head -12
echo "== parts"
for r in "${rows[@]}"; do IFS='|' read -r a b c <<<"$r"; printf '%-8s %-8s %s\n' "$a" "$b" "$c"; done
