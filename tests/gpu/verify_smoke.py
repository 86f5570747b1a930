"""Checks a zcta run directory against what smoke_job.py says it did.

usage: verify_smoke.py RUN_DIR PLAIN_RESULTS_DIR SHIM_RESULTS_DIR
Prints one line per check (PASS/FAIL) and exits 1 if any failed.
"""

import glob
import json
import os
import sys

import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis"))
from zcta_analysis import read_table  # noqa: E402


def main() -> int:
    run, plain_dir, shim_dir = sys.argv[1:4]
    checks = []

    def check(name: str, ok, detail="") -> None:
        ok = bool(ok)
        checks.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + str(detail) if str(detail) else ''}")

    plain = {json.load(open(f))["rank"]: json.load(open(f)) for f in glob.glob(f"{plain_dir}/rank*.json")}
    shim = {json.load(open(f))["rank"]: json.load(open(f)) for f in glob.glob(f"{shim_dir}/rank*.json")}
    world = len(plain)
    check("both runs finished on every rank", world >= 2 and set(plain) == set(shim), f"{sorted(plain)} vs {sorted(shim)}")
    for r in sorted(plain):
        check(f"rank {r} results bit-identical with and without the shim",
              plain[r]["digest"] == shim.get(r, {}).get("digest"), plain[r]["digest"][:16])

    ops = read_table(run, "ops")
    comms = read_table(run, "comms")
    proc = read_table(run, "process")
    calls = read_table(run, "calls")
    check("ops rows present", len(ops) > 0, f"{len(ops)} rows")
    check("one process row per rank, none from the launcher", len(proc) == world,
          f"{len(proc)} rows: {proc[['pid', 'rank_env', 'end_reason']].to_dict('records') if len(proc) else ''}")
    check("every process ended cleanly", len(proc) > 0 and (proc.end_reason == "exit").all()
          and (proc.records_dropped == 0).fillna(False).all(), proc[["end_reason", "records_dropped"]].to_dict("records") if len(proc) else "")
    check("no pending write-ahead logs", not glob.glob(os.path.join(run, "*", "_*.wal")))
    check("all results ncclSuccess", len(ops) > 0 and (ops.result == 0).all())

    exp = shim[min(shim)]["expect"]
    steps = shim[min(shim)]["steps"]
    for r in range(world):
        mine = ops[ops["rank"] == r] if len(ops) else ops
        for op in ("AllReduce", "AlltoAll", "AllGather", "ReduceScatter", "Broadcast"):
            # torch's broadcast calls ncclBcast, recorded under its own name.
            names = ["Broadcast", "Bcast"] if op == "Broadcast" else [op]
            n = int(((mine.op.isin(names)) & (mine.bytes == exp[op]["bytes"])).sum()) if len(mine) else 0
            check(f"rank {r} {op}: one row per call with nccl-tests bytes {exp[op]['bytes']}", n == exp[op]["calls"],
                  f"{n} rows of {exp[op]['calls']} calls")
        sends = mine[(mine.op == "Send")] if len(mine) else mine
        recvs = mine[(mine.op == "Recv")] if len(mine) else mine
        my_exp = shim[r]["expect"]["a2a_unequal"]
        ok_s = all(int(((sends.peer == p) & (sends.bytes == b)).sum()) == steps for p, b in enumerate(my_exp["send_bytes"]))
        ok_r = all(int(((recvs.peer == p) & (recvs.bytes == b)).sum()) == steps for p, b in enumerate(my_exp["recv_bytes"]))
        check(f"rank {r} unequal all_to_all: {steps} Send and Recv rows per peer with the split's bytes", ok_s and ok_r,
              f"{len(sends)} sends, {len(recvs)} recvs")
        grouped = sends.group_id.notna().all() and recvs.group_id.notna().all() if len(sends) else False
        check(f"rank {r} Send/Recv rows carry their group id", bool(grouped))

    coll = ops[~ops.op.isin(["Send", "Recv"])] if len(ops) else ops
    if len(coll):
        g = coll.groupby(["comm_id", "seq"]).agg(n=("rank", "nunique"), ops=("op", "nunique"), b=("bytes", "nunique"))
        check("collectives join across ranks on (comm_id, seq)", bool((g.n == world).all() and (g.ops == 1).all() and (g.b == 1).all()),
              f"{len(g)} collectives, {int((g.n != world).sum())} without all ranks")
    p2p = ops[ops.op.isin(["Send", "Recv"])] if len(ops) else ops
    if len(p2p):
        s = p2p[p2p.op == "Send"][["comm_id", "seq", "rank", "peer", "bytes"]]
        r = p2p[p2p.op == "Recv"][["comm_id", "seq", "rank", "peer", "bytes"]]
        j = s.merge(r, left_on=["comm_id", "seq", "rank", "peer"], right_on=["comm_id", "seq", "peer", "rank"], suffixes=("_s", "_r"))
        check("every Send joins its Recv on (comm_id, seq, rank<->peer) with equal bytes",
              len(j) == len(s) == len(r) and bool((j.bytes_s == j.bytes_r).fillna(False).all()), f"{len(j)} of {len(s)} sends matched")
    check("comms rows for every rank, same comm_id on all ranks",
          len(comms) > 0 and comms.groupby("comm_id")["rank"].nunique().max() == world,
          comms[["comm_id", "rank", "nranks", "device", "init"]].to_dict("records") if len(comms) else "")
    check("api_end_ns >= api_start_ns", len(ops) > 0 and bool((ops.api_end_ns >= ops.api_start_ns).all()))
    host_us = (ops.api_end_ns - ops.api_start_ns) / 1e3 if len(ops) else []
    print(f"INFO  rows: ops {len(ops)}, calls {len(calls)}, comms {len(comms)}, process {len(proc)}; "
          f"host time per op p50 {pd.Series(host_us).median():.1f} us")
    for r in sorted(plain):
        print(f"INFO  rank {r} job time: plain {plain[r]['elapsed_s']:.3f} s, shim {shim[r]['elapsed_s']:.3f} s")
    print(f"SUMMARY {sum(checks)} passed, {len(checks) - sum(checks)} failed")
    return 0 if all(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
