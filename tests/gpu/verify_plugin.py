"""Checks NCCL's own view (the profiler plugin) in run directories of smoke_job.py.

usage: verify_plugin.py default RUN_DIR | net RUN_DIR | user RUN_DIR VALUE
- default: every collective ops row has a Coll event with algorithm and protocol;
  every Send/Recv has P2p events; no proxy rows (NVLink P2P needs no proxy).
- net (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1): every op has ProxyOp and ProxyStep rows,
  with non-zero step times.
- user (NCCL_PROFILER_PLUGIN set by the user): left alone, no plugin rows, and the
  process row says why.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis"))
from zcta_analysis import read_table  # noqa: E402


mode, run = sys.argv[1], sys.argv[2]
ok = True


def check(name, cond, detail=""):
    global ok
    cond = bool(cond)
    ok &= cond
    print(f"{'PASS' if cond else 'FAIL'}  plugin/{mode}: {name}{': ' + str(detail) if str(detail) else ''}")


ops, nops, proxy, proc, ncomms = (read_table(run, t) for t in ("ops", "nccl_ops", "proxy", "process", "nccl_comms"))
key = ["host", "pid", "op_id"]
if mode == "kernelch":
    kc = proxy[proxy.event == "KernelCh"] if len(proxy) else proxy
    coll_ops = ops[~ops.op.isin(["Send", "Recv", "AlltoAll"])]
    cov = coll_ops.merge(kc[key].drop_duplicates(), on=key, how="inner") if len(kc) else ops.iloc[:0]
    check("KernelCh rows with GPU timers for every collective", len(coll_ops) > 0 and len(cov) == len(coll_ops)
          and kc.gpu_timer_start.notna().all() and kc.gpu_timer_stop.notna().all(), f"{len(cov)} of {len(coll_ops)}")
    if len(kc):
        d = (kc.gpu_timer_stop.astype("Int64") - kc.gpu_timer_start.astype("Int64")) / 1e3
        print(f"INFO  plugin/kernelch: {len(kc)} KernelCh rows, GPU channel time p50 {d.median():.1f} us")
    sys.exit(0 if ok else 1)
if mode == "user":
    check("process row says the user's plugin was left in place",
          len(proc) > 0 and proc.profiler_plugin.str.startswith("user: ").all(), list(proc.profiler_plugin))
    check("no plugin rows", len(nops) == 0 and len(proxy) == 0, f"{len(nops)} nccl_ops, {len(proxy)} proxy")
    check("ops still recorded", len(ops) > 0, len(ops))
    sys.exit(0 if ok else 1)

check("plugin loaded by NCCL for every communicator",
      len(proc) > 0 and (proc.profiler_plugin == "zcta").all() and (proc.plugin_comms > 0).all(),
      proc[["profiler_plugin", "plugin_comms"]].to_dict("records") if len(proc) else "")
check("nccl_comms rows joined to our comm_id", len(ncomms) > 0 and ncomms.comm_id.notna().all(),
      ncomms[["comm_hash", "comm_id", "rank", "nranks"]].to_dict("records") if len(ncomms) else "")
coll = ops[~ops.op.isin(["Send", "Recv", "AlltoAll"])]
ev = nops[nops.event == "Coll"]
j = coll.merge(ev, on=key, how="left", suffixes=("", "_n"))
with_algo = j.algo.notna() & j.proto.notna()
check("every collective has NCCL's algorithm and protocol", len(coll) > 0 and with_algo.all(),
      f"{int(with_algo.sum())} of {len(coll)}; mix: {j.groupby(['op', 'algo', 'proto', 'n_channels']).size().to_dict()}")
p2p_ops = ops[ops.op.isin(["Send", "Recv", "AlltoAll"])]
p2p_ev = nops[nops.event == "P2p"]
joined = p2p_ops.merge(p2p_ev[key].drop_duplicates(), on=key, how="inner")
check("every Send/Recv/AlltoAll has P2p events", len(p2p_ops) > 0 and len(joined) == len(p2p_ops),
      f"{len(joined)} of {len(p2p_ops)}; channels {p2p_ev.n_channels.value_counts().to_dict() if len(p2p_ev) else {}}")
check("plugin rows not joined to an op", True, int(nops.op_id.isna().sum()) if len(nops) else 0)
steps = proxy[proxy.event == "ProxyStep"] if len(proxy) else proxy
pops = proxy[proxy.event == "ProxyOp"] if len(proxy) else proxy
if mode == "default":
    check("no ProxyOp/ProxyStep rows on the NVLink path", len(steps) == 0 and len(pops) == 0,
          f"{len(pops)} ProxyOp, {len(steps)} ProxyStep")
else:
    # A Send/Recv to oneself is a local copy: no network, so no proxy work.
    net_ops = ops[~(ops.op.isin(["Send", "Recv"]) & (ops.peer == ops["rank"]).fillna(False))]
    covered = net_ops.merge(pops[key].drop_duplicates(), on=key, how="inner") if len(pops) else ops.iloc[:0]
    check("every op that crosses the network has ProxyOp rows", len(net_ops) > 0 and len(covered) == len(net_ops),
          f"{len(covered)} of {len(net_ops)} ({len(ops) - len(net_ops)} self Send/Recv excluded)")
    covered_s = net_ops.merge(steps[key].drop_duplicates(), on=key, how="inner") if len(steps) else ops.iloc[:0]
    check("every op that crosses the network has ProxyStep rows",
          len(net_ops) > 0 and len(covered_s) == len(net_ops), f"{len(covered_s)} of {len(net_ops)}")
    if len(steps):
        dur = steps.stop_ns - steps.start_ns
        state_cols = [c for c in steps.columns if c.endswith("_wait_ns")]
        some_state = steps[state_cols].notna().any(axis=1)
        check("step times are non-zero and states recorded", (dur > 0).fillna(False).all() and some_state.all(),
              f"median step {dur.median() / 1e3:.1f} us; states seen: "
              f"{ {c: int(steps[c].notna().sum()) for c in state_cols} }")
    print(f"INFO  plugin/{mode}: {len(pops)} ProxyOp, {len(steps)} ProxyStep, "
          f"{int((proxy.event == 'ProxyCtrl').sum()) if len(proxy) else 0} ProxyCtrl rows")
sys.exit(0 if ok else 1)
