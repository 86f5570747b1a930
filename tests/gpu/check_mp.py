"""Checks the run directories written by mp_job.py. usage: check_mp.py OUT_DIR MODE STEPS WORLD"""

import glob
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis"))
from zcta_analysis import read_table  # noqa: E402

out, mode, steps, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
runs = sorted(d for d in glob.glob(os.path.join(out, "*")) if os.path.isdir(d))
ok = True


def check(name, cond, detail=""):
    global ok
    ok &= bool(cond)
    print(f"{'PASS' if cond else 'FAIL'}  {mode}: {name}{': ' + str(detail) if str(detail) else ''}")


check("one run directory for all workers", len(runs) == 1, [os.path.basename(r) for r in runs])
if runs:
    run = runs[0]
    proc, ops = read_table(run, "process"), read_table(run, "ops")
    check("one process row per worker (the parent wrote nothing)", len(proc) == world, len(proc))
    want = "_exit" if mode == "fork" else "exit"
    check(f"every worker closed its files (end_reason {want})", len(proc) and (proc.end_reason == want).all(),
          list(proc.end_reason) if len(proc) else "")
    check("no pending logs", not glob.glob(f"{run}/*/_*.wal"))
    n = ops[ops.op == "AllReduce"].groupby("rank").size().to_dict() if len(ops) else {}
    check(f"{steps} AllReduce rows per rank", n == {r: steps for r in range(world)}, n)
    print(f"INFO  {mode}: run id {os.path.basename(run)} (source {proc.run_id_source.iloc[0] if len(proc) else '?'})")
sys.exit(0 if ok else 1)
