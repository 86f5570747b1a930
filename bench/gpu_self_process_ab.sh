#!/usr/bin/env bash
# One GPU, process A/B: what each setting of the developers' knobs (bench/knob_settings.sh)
# costs a process that keeps it all along, against plain processes. bench/gpu_self_ab.py
# (send/recv to self on a 1-rank communicator, 8 B and 1 MiB; a tiny torch kernel; 30
# kernels + one send/recv) runs once per setting and round, rotated, recording never
# paused (--always-on); every process on the same CPUs (PIN_CPUS, default 2-5; empty: not
# pinned). Why not the in-process A/B of bench/gpu_self_decompose.sh: a process that
# enabled CUPTI's event kinds stayed slow after they were switched off
# (docs/dev/cupti-measurements.md, "CUPTI's event records"), so "off" blocks need not be plain.
# Prints per setting and item the median over rounds of the process medians and the
# median [min, max] over rounds of the ratio to that round's plain process.
# usage: [ROUNDS=5] [BLOCKS=6] [PIN_CPUS=2-5] [SETTINGS=default,no-kinds,...] \
#        bench/gpu_self_process_ab.sh [CARRY_DIR] ; logs to $OUT (default ./gpu-out)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
# These runs measure CUPTI, which only deep mode uses (bench/always_on.sh and
# tests/gpu/events.sh measure the default, CUDA events).
export ZCTA_GPU=${ZCTA_GPU:-deep} PYTHONUNBUFFERED=1
source "$here/knob_settings.sh"
pin=()
cpus=${PIN_CPUS-2-5}
if [ -n "$cpus" ]; then
  command -v taskset >/dev/null || { echo "PIN_CPUS needs taskset; PIN_CPUS= runs unpinned"; exit 2; }
  pin=(taskset -c "$cpus")
fi
chosen=(plain)
for i in "${!names[@]}"; do selected "${names[$i]}" && chosen+=("${names[$i]}"); done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
n=${#chosen[@]}
for ((r = 0; r < ${ROUNDS:-5}; r++)); do
  for ((j = 0; j < n; j++)); do
    s=${chosen[$(((j + r) % n))]}
    e=(X=1)   # the setting's environment (knob_settings.sh's envs)
    if [ "$s" != plain ]; then
      for i in "${!names[@]}"; do [ "${names[$i]}" = "$s" ] && read -r -a e <<<"X=1 ${envs[$i]}"; done
      e+=(LD_PRELOAD="$bin/libzcta_prof.so" ZCTA_OUT="$work/runs-$s-$r")
    fi
    env "${e[@]}" timeout 120 ${pin[@]+"${pin[@]}"} python3 "$here/gpu_self_ab.py" --always-on \
      --blocks "${BLOCKS:-6}" --tag "$s:$r" >"$work/$s-$r.log" 2>&1 \
      || { echo "$s round $r: failed" >&2; tail -5 "$work/$s-$r.log" >&2; continue; }
    grep -v Warn "$work/$s-$r.log"
  done
done >"$out/self_process_ab.log"
python3 "$here/self_process_ab_report.py" "$out/self_process_ab.log" | tee "$out/self_process_ab.txt"
