#!/usr/bin/env bash
# What the shim adds to a send/recv group on the real NCCL, in ns, with no Python in
# the way: bench/sr_ab.c (in-process A/B against libnccl's own functions) run in one
# process per configuration and repetition, pinned (PIN, default 2-9). Prints one
# line per process and a table of medians last.
#   bash bench/sr_ab.sh [SHIM_DIR (default .carry)]         logs under $OUT
# Env: CONFIGS ("plain nomask default"; the others of bench/configs.sh too), REPS (3), BYTES (8),
# PER_BLOCK (4000 groups), BLOCKS (16), GAP_NS (4000: a busy gap after each group, so
# the GPU keeps up and the host's time is what is measured), SHIM2 … SHIM9 (other
# builds: a configuration with a trailing digit N, e.g. default2, runs build SHIMN),
# NCCL_LIB (the libnccl to load; default: torch's, found through python3), SR_AB (the
# bench/sr_ab.c binary; built here with cc when unset).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin1=$(cd "${1:-$root/.carry}" && pwd)
# shellcheck source=bench/configs.sh
. "$root/bench/configs.sh"
out=${OUT:-$root/bench-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
lib=${NCCL_LIB:-$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))')}
[ -f "$lib" ] || { echo "sr_ab.sh: no libnccl at $lib (set NCCL_LIB)" >&2; exit 2; }
ab=${SR_AB:-}
if [ -z "$ab" ]; then
  ab=$out/sr_ab
  cc -O2 -o "$ab" "$root/bench/sr_ab.c" -ldl
fi
read -r -a configs <<<"${CONFIGS:-plain nomask default}"
pin=(taskset -c "${PIN:-2-9}")
log=$out/sr_ab.log
: >"$log"
: >"$log.err"
for ((r = 0; r < ${REPS:-3}; r++)); do
  for c in "${configs[@]}"; do
    if ! config_env "$c" "$bin1"; then
      echo "sr_ab.sh: unknown configuration $c" >&2
      exit 2
    fi
    if ! line=$(env "${env_args[@]}" ZCTA_OUT="$out/runs" ZCTA_RUN_ID="sr_ab-$c-$r" "${pin[@]}" \
      "$ab" "$lib" "${BYTES:-8}" "${PER_BLOCK:-4000}" "${BLOCKS:-16}" "${GAP_NS:-4000}" 2>>"$log.err" | tail -1); then
      echo "sr_ab.sh: $c (round $r) failed; $log.err ends:" >&2
      tail -3 "$log.err" >&2
      continue
    fi
    echo "$c $r $line" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) \d+ .*shim ([\d.]+) ns, direct ([\d.]+) ns, added ([-\d.]+) ns \(([\d.]+)x\)", line)
    if m:
        rows.setdefault(m.group(1), []).append(tuple(float(x) for x in m.groups()[1:]))
print("| configuration | processes | direct ns/group | added ns/group, median [min, max] | ratio, median [min, max] |")
print("|---|---|---|---|---|")
for c, v in rows.items():
    d = [x[1] for x in v]; a = [x[2] for x in v]; r = [x[3] for x in v]
    print(f"| {c} | {len(v)} | {statistics.median(d):.0f} | {statistics.median(a):.0f} [{min(a):.0f}, {max(a):.0f}] "
          f"| {statistics.median(r):.3f}x [{min(r):.3f}, {max(r):.3f}] |")
PY
