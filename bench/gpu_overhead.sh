#!/usr/bin/env bash
# GPU overhead of zcta next to torch.profiler, alternating configurations in one
# invocation (2 GPUs): plain, zcta (defaults: CUPTI + profiler plugin), zcta without
# CUPTI (host records + plugin), zcta without the profiler plugin (host records +
# CUPTI), zcta with the plugin's KernelCh timers, torch.profiler (CPU + CUDA
# activities). Each round starts
# one torchrun per configuration (bench/gpu_overhead.py); prints medians over the
# rounds, the spread (min..max) and the ratio to plain.
# usage: [CONFIGS="plain zcta ..."] bench/gpu_overhead.sh [SHIM_DIR (default .carry)] [ROUNDS (default 3)]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
rounds=${2:-3}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
work=$(mktemp -d)
shim="$bin/libzcta_prof.so"
names=(plain zcta zcta-no-cupti zcta-no-plugin zcta-kernelch torch.profiler)
envs=("" "LD_PRELOAD=$shim" "LD_PRELOAD=$shim ZCTA_CUPTI=0" "LD_PRELOAD=$shim ZCTA_NCCL_PLUGIN=0"
      "LD_PRELOAD=$shim ZCTA_NCCL_KERNEL_CH=1" "")
extra=("" "" "" "" "" "--profiler")
# CONFIGS="plain zcta ...": run only these set-ups (default: all).
only=" ${CONFIGS:-${names[*]}} "
: >"$work/results.jsonl"
for i in $(seq "$rounds"); do
  for k in "${!names[@]}"; do
    [[ "$only" == *" ${names[$k]} "* ]] || continue
    env ${envs[$k]} ZCTA_OUT="$work/runs" ZCTA_RUN_ID="${names[$k]}-$i" timeout 240 torchrun --standalone \
      --nproc-per-node 2 "$here/gpu_overhead.py" --config "${names[$k]}" ${extra[$k]} >"$work/${names[$k]}-$i.log" 2>&1
    grep '^RESULT ' "$work/${names[$k]}-$i.log" | sed 's/^RESULT //' >>"$work/results.jsonl" \
      || { echo "round $i ${names[$k]} failed:"; tail -5 "$work/${names[$k]}-$i.log"; }
  done
done
[ -n "${OUT:-}" ] && cp "$work/results.jsonl" "$OUT/gpu_overhead.jsonl"
python3 - "$work/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cols = ["host_loop_us", "a2a_1m_us", "a2a_1m_loop_us", "a2a_128m_us", "a2a_128m_loop_us"]
by = {}
for r in rows:
    by.setdefault(r["config"], []).append(r)
base = {c: statistics.median(r[c] for r in by.get("plain", [])) for c in cols} if "plain" in by else {}
print(f"{'config':15} " + " ".join(f"{c:>26}" for c in cols))
for name, rs in by.items():
    cells = []
    for c in cols:
        v = [r[c] for r in rs]
        m = statistics.median(v)
        ratio = f"{m / base[c]:.3f}x" if base else "-"
        cells.append(f"{m:9.1f} ({min(v):.0f}..{max(v):.0f}) {ratio:>7}")
    print(f"{name:15} " + " ".join(f"{x:>26}" for x in cells))
print(f"(us; median over {len(next(iter(by.values())))} alternating rounds; ratio = median / plain median)")
PY
