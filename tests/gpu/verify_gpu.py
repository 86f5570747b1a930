"""Checks one paths_job.py run recorded under the shim (GPU capture through CUPTI).

usage: verify_gpu.py MODE RUN_DIR RESULTS_DIR
Prints PASS/FAIL lines and one summary line `SUMMARY mode=... ` for the final table;
exits 1 on any FAIL.
"""

import glob
import json
import os
import sys

import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis"))
from zcta_analysis import read_table, stream_time_ns  # noqa: E402

mode, run, results = sys.argv[1], sys.argv[2], sys.argv[3]
failed = False


def check(ok, msg):
    global failed
    try:
        ok = bool(ok)
    except TypeError:  # pd.NA: a NULL where a value is required fails
        ok = False
    print(("PASS  " if ok else "FAIL  ") + msg)
    failed |= not ok


ops, gpu, proc = read_table(run, "ops"), read_table(run, "gpu"), read_table(run, "process")
ranks = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(results, "rank*.json")))]
profile = any(r["profiler_nccl_kernels"] is not None for r in ranks)

check(len(proc) == 2, f"two process rows: {len(proc)}")
for _, p in proc.iterrows():
    want = "stopped" if profile else "on"
    check(str(p.cupti).startswith(want), f"pid {p.pid} cupti: {p.cupti}")
    check(p.cupti_dropped == 0, f"pid {p.pid} CUPTI records dropped: {p.cupti_dropped}")
    bad = p.get("gpu_inconsistent")
    check(bad == 0, f"pid {p.pid} GPU records dropped for a correlation to a later call: {bad}")
    check(p.gpu_clock == "CLOCK_REALTIME", f"pid {p.pid} gpu clock {p.gpu_clock}, offset {p.gpu_clock_offset_ns} ns")

sampled = "gpu_sampling" in proc and proc.gpu_sampling.notna().any()
ok_ops = ops[ops.result == 0]
measured = ok_ops[ok_ops.engine.notna()]
with_gpu = measured[measured.gpu_start_ns.notna()]
share = len(with_gpu) / max(len(measured), 1)
if "gpu_ready_ns" in with_gpu:
    print(f"INFO  gpu_ready_ns known for {int(with_gpu.gpu_ready_ns.notna().sum())} of {len(with_gpu)} ops "
          f"with GPU times")
if profile:
    # Ops issued before torch.profiler took CUPTI are measured, later ones are not.
    check(len(measured) > 0 and len(measured) < len(ok_ops),
          f"{len(measured)} of {len(ok_ops)} ops measured before the profiler took CUPTI")
    for r, d in enumerate(ranks):
        check(d["profiler_nccl_kernels"] > 0,
              f"rank {r}: torch.profiler trace holds {d['profiler_nccl_kernels']} NCCL kernels with the shim loaded")
elif sampled:
    # ZCTA_SAMPLE: only ops called in the windows are measured, the same ops on both
    # ranks (windows aligned to the clock), and none of those loses its GPU side.
    desc = proc.gpu_sampling.iloc[0]
    on_ms, every_ms = (int(w) for w in desc.split()[0:5:4])  # "ON ms of every EVERY ms ..."
    check(0 < len(measured) < len(ok_ops), f"sampled ({desc}): {len(measured)} of {len(ok_ops)} ops measured")
    check(int(proc.ops_unsampled.sum()) == int(ops.engine.isna().sum()),
          f"process.ops_unsampled {int(proc.ops_unsampled.sum())} = ops with engine NULL {int(ops.engine.isna().sum())}")
    check((proc.ops_without_gpu == 0).fillna(False).all(), f"no sampled op without its GPU side: {list(proc.ops_without_gpu)}")
    # An ungrouped op is sampled by its own call's start; a grouped one by its group's
    # ncclGroupEnd (not in the ops table), so only ungrouped ones are checked.
    alone = measured[measured.group_id.isna()]
    phase_ms = (alone.api_start_ns % (every_ms * 1_000_000)) / 1e6
    check(len(alone) > 0 and (phase_ms < on_ms).all(),
          f"ungrouped measured ops called in a window: latest {phase_ms.max():.1f} ms into the period")
    # Ranks sample the same op only when they call it within one window: how many do
    # depends on how far apart the ranks' hosts run (information, not a check).
    keys = [set(map(tuple, measured[measured["rank"] == r][["op", "comm_id", "seq"]].values)) for r in (0, 1)]
    both = len(keys[0] & keys[1]) / max(len(keys[0] | keys[1]), 1)
    print(f"INFO  ops sampled on both ranks: {both:.1%} of {len(keys[0] | keys[1])}")
    # How far apart the ranks' hosts ran: when each rank's host calls the same collective
    # (comm_id, seq), every op of the run.
    coll = ops[~ops.op.isin(["Send", "Recv"]) & ops.seq.notna()]
    at = coll.pivot_table(index=["comm_id", "seq"], columns="rank", values="api_start_ns", aggfunc="first").dropna()
    if len(at) and {0, 1} <= set(at.columns):
        gap_ms = (at[1] - at[0]) / 1e6
        print(f"INFO  rank 1 called each collective {gap_ms.median():+.1f} ms after rank 0 (median; p10 "
              f"{gap_ms.quantile(.1):+.1f}, p90 {gap_ms.quantile(.9):+.1f}; {len(at)} collectives)")
else:
    check(len(measured) == len(ok_ops), f"every op measured (engine not NULL): {len(measured)} of {len(ok_ops)}")
check(share >= 0.99, f"ops with GPU times: {len(with_gpu)} of {len(measured)} ({share:.1%})")

# Each op's kernel is one its op launches (a wrong correlation would join another op's
# kernel): ncclDevKernel_<family>_..., AlltoAll and Send/Recv through SendRecv.
FAMILY = {"Bcast": "Broadcast", "AlltoAll": "SendRecv", "Send": "SendRecv", "Recv": "SendRecv",
          "Gather": "SendRecv", "Scatter": "SendRecv"}
dev_k = measured[measured.kernel.fillna("").str.startswith("ncclDevKernel_")]
fam = dev_k.kernel.str.split("_").str[1]
want = dev_k.op.map(lambda o: FAMILY.get(o, o))
wrong = dev_k[(fam != want) & (dev_k.group_id.isna() | dev_k.op.isin(["Send", "Recv"]))]
check(len(wrong) == 0, f"kernel names fit their ops: {len(wrong)} of {len(dev_k)} do not"
      + (f" (e.g. {wrong.op.iloc[0]} ran {wrong.kernel.iloc[0]})" if len(wrong) else ""))

mix = measured.groupby(["op", "engine"]).size().unstack(fill_value=0)
print(mix.to_string())


def engine_share(ops_names, engine, min_bytes=0):
    sel = measured[measured.op.isin(ops_names) & (measured.bytes >= min_bytes)]
    return (sel.engine == engine).mean() if len(sel) else float("nan"), len(sel)


if mode == "default" or mode in ("shm", "net"):
    s, n = engine_share(list(measured.op.unique()), "sm_kernel")
    check(s >= 0.99, f"{mode}: engine sm_kernel on {s:.1%} of {n} ops")
elif mode == "ce":
    for op in ("AlltoAll", "AllGather"):
        s, n = engine_share([op], "copy_engine")
        check(s >= 0.99, f"ce: {op} engine copy_engine on {s:.1%} of {n} ops")
    ce = measured[measured.engine == "copy_engine"]
    check(len(ce) and (ce.n_kernels == 0).fillna(False).all() and (ce.n_memcpy >= 2).fillna(False).all(),
          "ce: copy-engine ops launch no kernel and at least 2 copies")
elif mode == "proxy":
    s, n = engine_share(["AlltoAll"], "proxy_memcpy", 16 << 20)
    check(s >= 0.99, f"proxy: AlltoAll engine proxy_memcpy on {s:.1%} of {n} ops")
    pc = gpu[gpu["attribution"] == "proxy_window"] if len(gpu) else gpu
    check(len(pc) > 0, f"proxy: {len(pc)} proxy-thread copies attributed by the kernel-window rule")

# Accuracy: zcta's GPU duration vs CUDA events around the same op (timed phase). Each
# op is timed twice: through torch ("AllReduce") and called on NCCL directly on the
# events' stream ("nccl:AllReduce"); rows are matched in issue order per NCCL op.
# The op's duration on its stream is gpu_end_ns - max(gpu_ready_ns, launch_ns): from the
# end of the work it waited for (here the GPU sleep before the events), or from its launch
# call if the stream was idle by then. The kernel span (gpu_end_ns - gpu_start_ns) misses
# NCCL's stream synchronisation and launch and is printed beside it.
errs = []
if not profile and not sampled:
    for r, d in enumerate(ranks):
        mine = ops[(ops["rank"] == r) & (ops["bytes"] == d["bytes_timed"])].sort_values("api_start_ns")
        for op in ("AllReduce", "AlltoAll"):
            ev = [(n, t) for n, t in d["timed"] if n.split(":")[-1] == op]
            rows = mine[mine.op == op].tail(len(ev))
            for (label, t), (_, o), z in zip(ev, rows.iterrows(), stream_time_ns(rows)):
                k = o.gpu_end_ns - o.gpu_start_ns
                spare = o.gpu_ready_ns - o.launch_ns  # how long the sleep outlasted the launch
                errs.append((label, o.engine, t, z, z - t, abs(z - t) <= max(0.05 * t, 5000), k - t, spare))
    if errs:
        e = pd.DataFrame(errs, columns=["label", "engine", "event", "zcta", "diff", "ok", "kdiff", "spare"])
        e["idle"] = e.spare < 0  # the op's stream was free before its launch
        check(e.zcta.notna().all(), f"gpu_ready_ns known for {e.zcta.notna().sum()} of {len(e)} timed ops")
        # The GPU sleep before each start event should outlast the host's enqueue; where
        # the op's stream was free before its launch, the events also timed host time.
        print(f"INFO  timed ops whose stream was idle before their launch (the events include host "
              f"enqueue there): {int(e.idle.sum())} of {len(e)}; of the ops outside 5 %/5 us: "
              f"{int(e[~e.ok].idle.sum())} of {int((~e.ok).sum())}")
        # With little of the sleep left at the launch, the op can end before the host,
        # still in the framework after the call, records the end event.
        tight = ~e.idle & (e.spare < 25_000)
        print(f"INFO  timed ops with under 25 us of the sleep left at their launch: {int(tight.sum())} of "
              f"{len(e)}, {int((tight & ~e.ok).sum())} of them outside 5 %/5 us; ops with more outside: "
              f"{int((~e.idle & ~tight & ~e.ok).sum())} of {int((~e.idle & ~tight).sum())}")
        for (label, engine), g in e.groupby(["label", "engine"]):
            print(f"      {label:16} {engine:16} n={len(g):3} event median {g.event.median() / 1e3:8.1f} us  "
                  f"zcta - event: median {g['diff'].median() / 1e3:+6.1f} us  p10 {g['diff'].quantile(.1) / 1e3:+6.1f}  "
                  f"p90 {g['diff'].quantile(.9) / 1e3:+6.1f}  within 5 %/5 us: {g.ok.mean():.0%}  "
                  f"(kernel span - event: median {g.kdiff.median() / 1e3:+6.1f} us)")
        # Copy-engine ops end at their last copy: the flag synchronisation with the peer
        # that closes them (cuStreamBatchMemOp) has no CUPTI record (docs/phases.md).
        ce = e[e.engine == "copy_engine"]
        if len(ce):
            print(f"INFO  copy-engine ops (not checked: their closing flag sync is not visible): "
                  f"{ce.ok.mean():.0%} of {len(ce)} within 5 %/5 us, median {ce['diff'].median() / 1e3:+.1f} us")
        e = e[e.engine != "copy_engine"]
        for what, sel in (("direct NCCL calls", e.label.str.startswith("nccl:")),
                          ("calls through torch", ~e.label.str.startswith("nccl:"))):
            g = e[sel]
            check(len(g) and g.ok.mean() >= 0.95,
                  f"{what} at 16 MiB: zcta GPU duration on the stream within 5 % or 5 us of CUDA events for "
                  f"{g.ok.mean():.1%} of {len(g)} ops")
    else:
        check(False, "no timed ops found to compare")
engines = ",".join(f"{e}:{n}" for e, n in measured.engine.value_counts().items())
acc = (f"{sum(e[5] for e in errs)}/{len(errs)}" if errs else "-")
print(f"SUMMARY mode={mode}{'+profiler' if profile else ''}{'+sampled' if sampled else ''} ops={len(ok_ops)} measured={len(measured)} "
      f"gpu={share:.1%} engines={engines} within5%={acc} gpu_rows={len(gpu)} "
      f"dropped={int(proc.cupti_dropped.fillna(0).sum())} {'FAIL' if failed else 'ok'}")
sys.exit(1 if failed else 0)
