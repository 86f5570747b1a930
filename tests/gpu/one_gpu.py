"""GPU-capture checks that need ONE GPU: a one-rank communicator sending to itself
(nccl_bench.SelfComm: ncclGroupStart, ncclSend, ncclRecv, ncclGroupEnd; one
ncclDevKernel_SendRecv per group), recorded under the shim with real CUPTI records.
tests/gpu/cupti.sh needs two GPUs; this covers, on one, the join of GPU records to ops,
gpu_ready_ns from the events next to CUPTI's kernel spans, pruning
over a run longer than the join keeps anything, sampling windows, and the op's GPU
duration on its stream against CUDA events, and send/recv groups captured in a CUDA
graph and replayed (written as captured, GPU side not measured; the kernels of the
graph's launches as gpu rows without an op).

    python3 tests/gpu/one_gpu.py SHIM_DIR [PARTS]  # SHIM_DIR holds libzcta_prof.so and zcta;
                                                   # PARTS: default,sampled,graph (all)

Prints PASS/FAIL/INFO lines and a last SUMMARY line; exits 1 on any FAIL.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[1] / "examples"))
sys.path.insert(0, str(here.parents[1] / "analysis"))

SIZES = {"1MiB": 1 << 20, "16MiB": 16 << 20}
TIMED = 30          # timed groups per size and variant
MIXED_SECONDS = 6   # longer than the join keeps correlations (2 x hold + 2 s)
# The default and sampled parts check gpu_ready_ns, which comes from the stamps of
# the ops zcta times: every op with ZCTA_BUDGET=all.
READY = {"ZCTA_BUDGET": "all"}


def child(kind, res):
    import json

    import torch

    import nccl_bench as nb

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    me = nb.SelfComm(side)
    bufs = {k: (torch.ones(n // 4, device=dev), torch.empty(n // 4, device=dev)) for k, n in SIZES.items()}
    run = {k: me.sendrecv(*b) for k, b in bufs.items()}
    x = torch.ones(1 << 20, device=dev)
    with torch.cuda.stream(side):
        run["1MiB"](20)
    torch.cuda.synchronize()
    if kind == "graph":
        # Capture 10 groups into a CUDA graph on the side stream, replay it 20 times.
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            run["1MiB"](10)
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()
        # ncclCommDestroy waits for every graph holding the communicator's captured
        # work to be destroyed (it hangs otherwise, with or without the shim).
        g.reset()
        torch.cuda.synchronize()
        me.destroy()
        return
    # Mixed: the program's own kernels on the main stream, the side stream made to wait
    # for them (an event record and a stream wait, as torch hands work to NCCL), then a
    # group on the side stream.
    end = time.monotonic() + MIXED_SECONDS
    while time.monotonic() < end:
        for _ in range(50):
            x.add_(1)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                run["1MiB"](1)
        torch.cuda.synchronize()
    timed = []
    if kind == "default":
        for _ in range(TIMED):
            for size in SIZES:
                for how in ("same", "wait"):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    if how == "same":
                        # Busy GPU on the op's own stream: the events time GPU work.
                        with torch.cuda.stream(side):
                            torch.cuda._sleep(nb.SLEEP_CYCLES)
                    else:
                        # The op's stream waits for a sleep on the main stream: its
                        # readiness comes through the event the wait names.
                        torch.cuda._sleep(nb.SLEEP_CYCLES)
                        side.wait_stream(main)
                    e0.record(side)
                    with torch.cuda.stream(side):
                        run[size](1)
                    e1.record(side)
                    timed.append((f"{how}:{size}", e0, e1))
        torch.cuda.synchronize()
    me.destroy()
    with open(res, "w") as f:
        json.dump([(label, e0.elapsed_time(e1) * 1e6) for label, e0, e1 in timed], f)


failed = False


def check(ok, msg):
    global failed
    try:
        ok = bool(ok)
    except TypeError:  # pd.NA: a NULL where a value is required fails
        ok = False
    print(("PASS  " if ok else "FAIL  ") + msg)
    failed |= not ok


def record(kind, shim_dir, env_extra):
    out = tempfile.mkdtemp(prefix=f"zcta-one-{kind}-")
    res = os.path.join(out, "timed.json")
    # Deep mode: these checks are of CUPTI's records (the default has none).
    env = dict(os.environ, LD_PRELOAD=str(shim_dir / "libzcta_prof.so"), ZCTA_OUT=out, ZCTA_RUN_ID="r",
               NCCL_NVLS_ENABLE="0", ZCTA_GPU="deep", **env_extra)
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, __file__, "--child", kind, res], env=env, capture_output=True,
                           text=True, timeout=300)
    except subprocess.TimeoutExpired:
        check(False, f"{kind}: job did not finish within 300 s under the shim")
        print("SUMMARY " + kind + " timed out FAIL")
        sys.exit(1)
    stray = [line for line in (p.stdout + p.stderr).splitlines() if line.startswith("zcta")]
    check(p.returncode == 0, f"{kind}: job exits 0 under the shim ({time.monotonic() - t0:.0f} s)"
          + ("" if p.returncode == 0 else f": {p.stderr[-2000:]}"))
    check(not stray, f"{kind}: no output from zcta {stray[:3]}")
    return f"{out}/r", res


def main(shim_dir, parts):
    summary = []
    for part in parts:
        PARTS[part](shim_dir, summary)
    print("SUMMARY " + "; ".join(summary) + (" FAIL" if failed else " ok"))
    return 1 if failed else 0


def full_detail(shim_dir, summary):
    """Join, stream readiness and accuracy with every op measured."""
    import json

    import pandas as pd
    from zcta_analysis import read_table, stream_time_ns

    run, res = record("default", shim_dir, READY)
    ops, gpu, proc = (read_table(run, t) for t in ("ops", "gpu", "process"))
    p = proc.iloc[0]
    check(str(p.cupti).startswith("on"), f"default: cupti {p.cupti}")
    for col in ("cupti_dropped", "gpu_inconsistent", "ops_without_gpu", "records_dropped"):
        check(p[col] == 0, f"default: process.{col} = {p[col]}")
    sends = ops[ops.op == "Send"].sort_values("api_start_ns")
    with_gpu = sends[sends.gpu_start_ns.notna()]
    check(len(sends) > 1000 and len(with_gpu) == len(sends), f"default: {len(with_gpu)} of {len(sends)} groups have GPU times")
    check((sends.engine == "sm_kernel").all() and (sends.kernel == "ncclDevKernel_SendRecv").all(),
          f"default: engines {dict(sends.engine.value_counts())}, kernels {dict(sends.kernel.value_counts())}")
    check((sends.n_kernels == 1).fillna(False).all(), f"default: one kernel per group ({dict(sends.n_kernels.value_counts())})")
    # Each group's kernel is its own: every kernel row names one group, once.
    kern = gpu[gpu.kind == "kernel"]
    check(kern.group_id.notna().all() and not kern.group_id.duplicated().any() and len(kern) == len(sends),
          f"default: {len(kern)} kernel rows, one per group")
    ready = sends.gpu_ready_ns.notna()
    check(ready.mean() >= 0.99, f"default: gpu_ready_ns known for {int(ready.sum())} of {len(sends)} groups")
    r = sends[ready]
    # Ready is an event time put on CLOCK_REALTIME through the anchors, start CUPTI's:
    # the two agree within the anchors' error bound.
    slack = int(p.gpu_clock_error_ns) if pd.notna(p.gpu_clock_error_ns) else 0
    early = r[r.gpu_ready_ns > r.gpu_start_ns + slack]
    worst = int((early.gpu_ready_ns - early.gpu_start_ns).max()) if len(early) else 0
    check(early.empty, f"default: gpu_ready_ns <= gpu_start_ns + the anchors' error ({slack} ns) everywhere "
          f"({len(early)} of {len(r)} groups start before their ready, by up to {worst} ns)")
    if len(early):
        e = early.head(3)
        for _, o in e.iterrows():
            print(f"INFO  early start: group {o.group_id} launch {o.launch_ns} ready {o.gpu_ready_ns} "
                  f"start {o.gpu_start_ns} end {o.gpu_end_ns}")
    span_s = (sends.api_start_ns.max() - sends.api_start_ns.min()) / 1e9
    print(f"INFO  default: {len(sends)} groups over {span_s:.1f} s; gpu rows {len(gpu)}")

    timed = json.load(open(res))
    rows = sends.tail(len(timed))
    errs = []
    for (label, t), (_, o), z in zip(timed, rows.iterrows(), stream_time_ns(rows)):
        want = SIZES[label.split(":")[1]]
        if pd.isna(o["bytes"]) or o["bytes"] != want:
            check(False, f"timed op order: {label} matched a {o['bytes']}-byte op")
            break
        errs.append((label, t, z, z - t, abs(z - t) <= max(0.05 * t, 5000), o.gpu_end_ns - o.gpu_start_ns - t))
    e = pd.DataFrame(errs, columns=["label", "event", "zcta", "diff", "ok", "kdiff"])
    for label, g in e.groupby("label", sort=False):
        print(f"      {label:10} n={len(g):3} event median {g.event.median() / 1e3:7.1f} us  zcta - event: median "
              f"{g['diff'].median() / 1e3:+6.2f} us  p10 {g['diff'].quantile(.1) / 1e3:+6.2f}  p90 "
              f"{g['diff'].quantile(.9) / 1e3:+6.2f}  within 5 %/5 us: {g.ok.mean():.0%}  "
              f"(kernel span - event: median {g.kdiff.median() / 1e3:+6.2f} us)")
    check(len(e) == len(timed) and e.ok.mean() >= 0.95,
          f"default: GPU duration on the stream within 5 % or 5 us of CUDA events for {e.ok.mean():.1%} of {len(e)} timed groups")
    summary.append(f"default groups={len(sends)} gpu={len(with_gpu)} ready={int(ready.sum())} "
                   f"within5%={int(e.ok.sum())}/{len(e)}")
    rep = subprocess.run([str(shim_dir / "zcta"), "report", run], capture_output=True, text=True)
    check(rep.returncode == 0 and "sync" in rep.stdout and "Queue and sync not split" not in rep.stdout,
          f"default: zcta report exits {rep.returncode}, with queue and sync measured")



def sampled(shim_dir, summary):
    """Sampling windows: measured ops keep their GPU side, the others are counted."""
    import pandas as pd
    from zcta_analysis import read_table

    run, _ = record("sampled", shim_dir, {"ZCTA_SAMPLE": "50ms/250ms", **READY})
    ops, proc = read_table(run, "ops"), read_table(run, "process")
    p = proc.iloc[0]
    # A Send always launches its group's kernel: one without a CUPTI span was outside
    # the windows (its engine may still be known, from NCCL's own events).
    sends = ops[ops.op == "Send"]
    measured = sends[sends.gpu_start_ns.notna()]
    check(0 < len(measured) < len(sends), f"sampled: {len(measured)} of {len(sends)} groups measured")
    check(p.ops_without_gpu == 0, f"sampled: every sampled op has its GPU side (ops_without_gpu {p.ops_without_gpu})")
    # Unsampled: at least the Send and Recv of each group without a CUPTI span that the
    # budget did not time with stamps either (those have their GPU side from the
    # stamps), at most every op without a CUPTI span.
    untimed = sends[sends.gpu_start_ns.isna() & (sends.timing != "timed")]
    lo, hi = 2 * len(untimed), int(ops.gpu_start_ns.isna().sum())
    check(pd.notna(p.ops_unsampled) and lo <= int(p.ops_unsampled) <= hi,
          f"sampled: ops_unsampled {p.ops_unsampled} within [{lo}, {hi}]")
    check(p.gpu_inconsistent == 0, f"sampled: gpu_inconsistent {p.gpu_inconsistent}")
    rk = measured.gpu_ready_ns.notna()
    print(f"INFO  sampled: gpu_ready_ns known for {int(rk.sum())} of {len(measured)} measured groups")
    summary.append(f"sampled measured={len(measured)}/{len(sends)} ready={int(rk.sum())}")



def graph(shim_dir, summary):
    """Send/recv groups captured into a CUDA graph: written as captured, their GPU side
    not measured (the graph's launches run their kernels under the graph launch's
    correlation, which zcta does not join to ops), never as "no GPU work"."""
    import pandas as pd
    from zcta_analysis import read_table

    run, _ = record("graph", shim_dir, {})
    ops, gpu, proc = (read_table(run, t) for t in ("ops", "gpu", "process"))
    p = proc.iloc[0]
    p2p = ops[ops.op.isin(["Send", "Recv"])].sort_values("api_start_ns")
    eager, cap = p2p.head(40), p2p.tail(20)
    check(len(p2p) == 60, f"graph: {len(p2p)} Send/Recv rows (20 eager groups + 10 captured)")
    # A NULL counts as a failure (the column is pandas' nullable boolean: .all() skips NA).
    check(eager.graph_captured.eq(False).fillna(False).all() and (eager.engine == "sm_kernel").all(),
          f"graph: eager groups: graph_captured {dict(eager.graph_captured.value_counts(dropna=False))}, "
          f"engines {dict(eager.engine.value_counts(dropna=False))}")
    check(cap.graph_captured.eq(True).fillna(False).all() and cap.engine.isna().all()
          and cap.gpu_start_ns.isna().all(),
          f"graph: captured groups: graph_captured {dict(cap.graph_captured.value_counts(dropna=False))}, "
          f"engines {dict(cap.engine.value_counts(dropna=False))} (NULL: not measured)")
    check(pd.notna(p.ops_graph_captured) and pd.notna(p.ops_without_gpu)
          and p.ops_graph_captured == 20 and p.ops_without_gpu == 0,
          f"graph: process.ops_graph_captured {p.ops_graph_captured}, ops_without_gpu {p.ops_without_gpu}")
    launches = gpu[gpu.attribution == "graph_launch"] if len(gpu) else gpu
    check(len(launches) == 200 and (launches.graph_id.fillna(0) != 0).all()
          and launches.op_id.isna().all() and launches.group_id.isna().all(),
          f"graph: {len(launches)} gpu rows of the graph's 20 launches x 10 kernels with attribution graph_launch, "
          f"a graph id and no op")
    summary.append(f"graph captured={int(cap.graph_captured.eq(True).fillna(False).sum())}/20 "
                   f"ops_graph_captured={p.ops_graph_captured}")


PARTS = {"default": full_detail, "sampled": sampled, "graph": graph}


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        parts = sys.argv[2].split(",") if len(sys.argv) > 2 else list(PARTS)
        sys.exit(main(Path(sys.argv[1]).resolve(), parts))
