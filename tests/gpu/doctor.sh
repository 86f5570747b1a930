#!/usr/bin/env bash
# `zcta doctor` on the GPU machine: the plain report, --json, and --probe on each data
# path, checking the exit status of each (and so that the probe saw what the doctor
# predicted). Builds nothing: the binaries come in CARRY_DIR, e.g.
#   cargo build --release --workspace && mkdir -p .carry && cp target/release/{libzcta_prof.so,zcta} .carry/
# usage: [QUICK=1] tests/gpu/doctor.sh CARRY_DIR ; logs go to $OUT (or ./gpu-out/doctor)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(cd "${1:-$root/.carry}" && pwd)
out=${OUT:-$root/gpu-out}/doctor
mkdir -p "$out"
zcta="$bin/zcta"
[ -x "$zcta" ] || { echo "missing $zcta"; exit 2; }
[ -f "$bin/libzcta_prof.so" ] || { echo "missing $bin/libzcta_prof.so"; exit 2; }
export ZCTA_SHIM="$bin/libzcta_prof.so"
export NCCL_NVLS_ENABLE=0   # NVLink multicast is forbidden on the shared test host
export PYTHONUNBUFFERED=1
# Start from a clean NCCL environment; each case sets what it tests.
unset NCCL_CTA_POLICY NCCL_P2P_DISABLE NCCL_SHM_DISABLE NCCL_P2P_USE_CUDA_MEMCPY NCCL_SHM_USE_CUDA_MEMCPY

{ nvidia-smi topo -m; nvidia-smi --query-gpu=index,name,driver_version,memory.free --format=csv; } \
  >"$out/nvidia-smi.txt" 2>&1

status=0
rows=()
# case NAME EXPECTED_EXIT [VAR=VALUE ...] -- ZCTA_DOCTOR_ARGS...
case_() {
  local name=$1 want=$2; shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local log="$out/$name.txt"
  echo "== $name: ${envs[*]:-} zcta doctor $*"
  env ${envs[@]+"${envs[@]}"} "$zcta" doctor "$@" >"$log" 2>&1
  local got=$?
  local probe
  probe=$(grep -m1 '^PROBE' "$log" | sed 's/^PROBE //' | cut -c1-70)
  [ -n "$probe" ] || probe="-"
  local mark=ok
  if [ "$got" != "$want" ]; then mark=FAIL; status=1; tail -40 "$log"; fi
  rows+=("$(printf '%-22s %-5s %-5s %-5s %s' "$name" "$want" "$got" "$mark" "$probe")")
}

case_ plain            0 -- 
case_ plain_json       0 -- --json
case_ probe_default    0 -- --probe --probe-timeout 150 --probe-dir "$out/probe_default"
case_ ce               0 NCCL_CTA_POLICY=2 -- 
case_ ce_json          0 NCCL_CTA_POLICY=2 -- --json
case_ probe_ce         0 NCCL_CTA_POLICY=2 -- --probe --probe-timeout 150 --probe-dir "$out/probe_ce"
# NCCL 2.28.9 decides the copy engine on CUDA P2P as NVML reports it, not on
# NCCL_P2P_DISABLE: the doctor predicts copy engine for AllGather/AlltoAll, SHM for the rest.
if [ -z "${QUICK:-}" ]; then  # QUICK=1: only the two probes the issue asks for
case_ probe_ce_p2poff  0 NCCL_CTA_POLICY=2 NCCL_P2P_DISABLE=1 -- --probe --probe-timeout 150 --probe-dir "$out/probe_ce_p2poff"
case_ probe_memcpy     0 NCCL_P2P_USE_CUDA_MEMCPY=1 -- --probe --probe-timeout 150 --probe-dir "$out/probe_memcpy"
case_ probe_net        0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 -- --probe --probe-timeout 150 --probe-dir "$out/probe_net"
fi
# Requests that cannot be honoured here: exit 3 without running anything.
case_ shm_memcpy_unused 3 NCCL_SHM_USE_CUDA_MEMCPY=1 --
case_ ce_two_nodes     3 NCCL_CTA_POLICY=2 -- --nodes 2
case_ ce_bad_value     3 NCCL_CTA_POLICY=zero --

python3 - "$out/plain_json.txt" "$out/ce_json.txt" <<'PY' >"$out/json_check.txt" 2>&1 || status=1
import json, sys
for p in sys.argv[1:]:
    j = json.load(open(p))
    assert j["zcta_doctor"] == 1 and j["facts"]["driver"]["nvml"] == "loaded", p
    fams = {f["family"]: f["path"] for f in j["report"]["families"]}
    print(p, j["exit_code"], fams)
PY
cat "$out/json_check.txt"

echo
printf '%-22s %-5s %-5s %-5s %s\n' case want exit check probe
for r in "${rows[@]}"; do echo "$r"; done
exit $status
