"""One-GPU checks of zcta's default GPU side (CUDA events on each op's stream), run by
tests/gpu/events.sh:

    python3 events.py accuracy OUT_JSON            (under the shim, ZCTA_BUDGET=all)
    python3 events.py check-accuracy OUT_JSON RUN_DIR
    python3 events.py capture OUT_JSON             (plain, then under the shim)
    python3 events.py check-capture PLAIN_JSON ZCTA_JSON RUN_DIR
    python3 events.py check-report RUN_DIR         (after `zcta phases RUN_DIR`)

accuracy: send/recv to itself and all_to_all_single at 1, 16 and 64 MiB, each op
between two CUDA events of the program's own, with the stream kept busy (a sleep
kernel) past the call, so the op's stream becomes free after its launch; the check
compares zcta's gpu_end_ns - gpu_ready_ns of the same ops with those events. The
program's events hold zcta's two records as well, so each iteration also measures,
on the same stream behind the same sleep, what two event records between a pair of
events add (three records back to back: the third minus the first); the check takes
that off the program's window of the same op. Under the shim the same ops run
again with zcta's recording paused (no zcta event inside the program's pair), and the
check shows zcta's durations against that window's median (shown, not judged: the ops
are not the same ones). ITERS (40) ops per kind and size.
capture: NCCL ops captured into a CUDA graph (torch.cuda.graph, global capture mode)
and replayed; the check wants the same graph (node types and counts) and the same
results with and without zcta, and zcta's rows of the captured ops marked
graph_capture with no GPU times.
"""

import json
import os
import sys
from pathlib import Path

MiB = 1 << 20
SIZES = [MiB, 16 * MiB, 64 * MiB]
ITERS = int(os.environ.get("ITERS", "40"))


def setup():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import nccl_bench as nb

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    return torch, dist, nb, dev


def accuracy(out):
    torch, dist, nb, dev = setup()
    s = torch.cuda.Stream()
    torch.cuda.set_stream(s)
    me = nb.SelfComm(s)
    import ctypes

    set_recording = getattr(ctypes.CDLL(None), "zcta_set_recording", None)
    if set_recording is not None:
        set_recording.argtypes, set_recording.restype = [ctypes.c_int], ctypes.c_int
    res, paused = [], []
    for nbytes in SIZES:
        n = nbytes // 4
        a, b = torch.ones(n, device=dev), torch.empty(n, device=dev)
        ops = {"sr": me.sendrecv(a, b), "a2a": lambda k: [dist.all_to_all_single(b, a) for _ in range(k)]}
        for kind, fn in ops.items():
            fn(3)  # warm-up (same sizes: the check takes the last ITERS rows)
            torch.cuda.synchronize()
            for _ in range(ITERS):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(200_000)  # ~100 us: the stream is busy past the call
                e0.record(s)
                fn(1)
                e1.record(s)
                c = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                torch.cuda._sleep(200_000)
                for x in c:
                    x.record(s)
                res.append({"kind": kind, "bytes": nbytes, "e": (e0, e1), "c": (c[0], c[2])})
            torch.cuda.synchronize()
            # The same op with zcta's recording paused (no event of zcta's inside the
            # program's pair): the window CUDA events give without zcta, in this process.
            if set_recording is not None:
                set_recording(0)
                for _ in range(ITERS):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda._sleep(200_000)
                    e0.record(s)
                    fn(1)
                    e1.record(s)
                    paused.append({"kind": kind, "bytes": nbytes, "e": (e0, e1)})
                set_recording(1)
                torch.cuda.synchronize()
    for r in paused:
        e0, e1 = r.pop("e")
        r["paused_us"] = e0.elapsed_time(e1) * 1e3
    res += paused
    for r in res:
        if "paused_us" in r:
            continue
        e0, e1 = r.pop("e")
        r["events_us"] = e0.elapsed_time(e1) * 1e3
        c0, c2 = r.pop("c")
        r["two_records_us"] = c0.elapsed_time(c2) * 1e3
    me.destroy()
    Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def rows(run_dir, table, columns=None):
    import pyarrow.dataset as ds

    files = sorted(Path(run_dir).glob(f"{table}/*.parquet"))
    return ds.dataset(files).to_table(columns=columns).to_pandas()


def check_accuracy(out, run_dir, plain=None):
    """Per op and size: zcta's gpu_end - gpu_ready against the program's own events
    around the same op in this run, less what zcta's two event records inside them
    add (measured in the same run: the median of `two_records_us`), within max(1 us,
    2 %) for >= 95 % of the ops; with `plain`, also against the median of the same
    events in a run without zcta (shown, not judged: ops differ from run to run)."""
    got = json.loads(Path(out).read_text())
    want = [w for w in got if "events_us" in w]
    paused = [w for w in got if "paused_us" in w]
    ref = json.loads(Path(plain).read_text()) if plain else []
    ops = rows(run_dir, "ops").sort_values("op_id")
    ok_all, lines = True, []
    for kind, op in [("sr", "Send"), ("a2a", "AlltoAll")]:
        for nbytes in SIZES:
            ev = [w["events_us"] for w in want if w["kind"] == kind and w["bytes"] == nbytes]
            z = ops[(ops.op == op) & (ops.bytes == nbytes)].tail(len(ev))
            timed = z[z.timing == "timed"]
            dur = ((timed.gpu_end_ns - timed.gpu_ready_ns) / 1e3).tolist()
            evt = [e for e, t in zip(ev, (z.timing == "timed").tolist()) if t]
            two = sorted(w["two_records_us"] for w in want if w["kind"] == kind and w["bytes"] == nbytes)
            two_med = two[len(two) // 2] if two else 0.0
            corr = [e - two_med for e in evt]
            near = sum(abs(d - c) <= max(1.0, 0.02 * c) for d, c in zip(dur, corr))
            near_share = near / len(dur) if dur else 0.0
            errs = sorted(d - e for d, e in zip(dur, evt))
            med = errs[len(errs) // 2] if errs else float("nan")
            plain_ev = sorted(w["events_us"] for w in ref if w["kind"] == kind and w["bytes"] == nbytes)
            p5, p95 = (errs[len(errs) // 20], errs[-1 - len(errs) // 20]) if errs else (float("nan"),) * 2
            line = (f"accuracy {kind:3} {nbytes // MiB:3} MiB: {len(timed)}/{len(ev)} timed; same run: events median "
                    f"{sorted(evt)[len(evt) // 2] if evt else float('nan'):7.2f} us, zcta - events median {med:+.2f} us "
                    f"[p5 {p5:+.2f}, p95 {p95:+.2f}]; two records add {two_med:.2f} us; zcta within "
                    f"max(1 us, 2 %) of the same op's events less them: {near}/{len(dur)} ({near_share:.0%})")
            good = len(timed) == len(ev) and near_share >= 0.95
            if plain_ev:
                pm = plain_ev[len(plain_ev) // 2]
                within = sum(abs(d - pm) <= max(1.0, 0.02 * pm) for d in dur)
                line += (f"; without zcta: events median {pm:7.2f} us, zcta within max(1 us, 2 %) of it: "
                         f"{within}/{len(dur)}")
            pz = sorted(w["paused_us"] for w in paused if w["kind"] == kind and w["bytes"] == nbytes)
            if pz:
                pm = pz[len(pz) // 2]
                within = sum(abs(d - pm) <= max(1.0, 0.02 * pm) for d in dur)
                line += (f"; paused in this process: events median {pm:7.2f} us [p5 {pz[len(pz) // 20]:.2f}, p95 "
                         f"{pz[-1 - len(pz) // 20]:.2f}], zcta median {sorted(dur)[len(dur) // 2]:7.2f} us, "
                         f"zcta within max(1 us, 2 %) of the paused median: {within}/{len(dur)}")
            ok_all &= good
            lines.append(f"{'ok  ' if good else 'FAIL'} {line}")
    print("\n".join(lines))
    return ok_all


def capture(out, what="sr"):
    """`what`: sr (send/recv to itself through ctypes) or a2a (dist.all_to_all_single),
    each with a torch kernel before and after it in the graph."""
    torch, dist, nb, dev = setup()
    s = torch.cuda.Stream()
    torch.cuda.set_stream(s)
    me = nb.SelfComm(s)
    n = MiB // 4
    a = torch.arange(n, device=dev, dtype=torch.float32)
    a2, b, c = torch.empty_like(a), torch.empty_like(a), torch.empty_like(a)
    sr = me.sendrecv(a2, b)

    def body():
        a2.copy_(a * 2)
        if what == "sr":
            sr(1)
            c.copy_(b)
        else:
            dist.all_to_all_single(c, a2)
        c.add_(1)

    # Warm up outside the capture (NCCL connects, torch allocates).
    body()
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        body()
    results = []
    for i in range(3):
        a.add_(1)
        g.replay()
        torch.cuda.synchronize()
        results.append(float(c.double().sum().item()))
    kinds = graph_node_types(g)
    me.destroy()
    Path(out).write_text(json.dumps({"results": results, "nodes": kinds}))
    dist.destroy_process_group()


def graph_node_types(g):
    """Node types of the captured graph and how many of each (CUgraphNodeType codes:
    0 kernel, 1 memcpy, 2 memset, 3 host, 4 child graph, 5 empty, 6 event wait, 7 event
    record, ...), read through the driver."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    graph = ctypes.c_void_p(g.raw_cuda_graph())
    n = ctypes.c_size_t(0)
    assert cu.cuGraphGetNodes(graph, None, ctypes.byref(n)) == 0
    nodes = (ctypes.c_void_p * n.value)()
    assert cu.cuGraphGetNodes(graph, nodes, ctypes.byref(n)) == 0
    kinds = {}
    for node in nodes:
        t = ctypes.c_int(-1)
        assert cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t)) == 0
        kinds[str(t.value)] = kinds.get(str(t.value), 0) + 1
    return kinds


def check_capture(plain, zcta, run_dir):
    p, z = json.loads(Path(plain).read_text()), json.loads(Path(zcta).read_text())
    ops = rows(run_dir, "ops")
    ok = p == z and bool(p["nodes"])
    print(f"{'ok  ' if ok else 'FAIL'} capture: graph nodes plain {p['nodes']} zcta {z['nodes']}; "
          f"results plain {p['results']} zcta {z['results']}")
    proc = rows(run_dir, "process").iloc[0]
    # Every op called while its stream was capturing: marked, with no GPU times.
    cap = ops[ops.timing == "graph_capture"]
    good = len(cap) >= 1 and cap.gpu_end_ns.isna().all()
    print(f"{'ok  ' if good else 'FAIL'} capture: {len(cap)} ops rows marked graph_capture without GPU times "
          f"(process.timing_captured={proc.get('timing_captured')}, timing_errors={proc.get('timing_errors')}); "
          f"timing of the others: {dict(ops[ops.timing != 'graph_capture'].timing.value_counts())}")
    return ok and good


def check_report(run_dir):
    ph = rows(run_dir, "phases")
    ops = rows(run_dir, "ops", ["timing", "timing_level", "gpu_end_ns"])
    timed = ph[ph.window_ns.notna()]
    win = timed.window_ns.sum()
    unres = timed.unresolved_ns.sum()
    share = 1 - unres / win if win else 0.0
    names = ["init_ns", "queue_ns", "sync_ns", "barrier_ns", "transfer_ns", "memcpy_ns", "proxy_ns"]
    parts = {n[:-3]: round(float(timed[n].sum()) / win, 3) for n in names if n in timed and win}
    good = share >= 0.95 and len(timed) > 0
    print(f"{'ok  ' if good else 'FAIL'} report: {len(timed)} of {len(ph)} ops with a window; "
          f"{share:.1%} of the summed window in measured phases {parts}; ops timing "
          f"{dict(ops.timing.value_counts())}, levels {sorted(set(ops.timing_level.dropna().astype(int)))}")
    return good


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "accuracy":
        accuracy(sys.argv[2])
    elif cmd == "capture":
        capture(*sys.argv[2:])
    else:
        fn = {"check-accuracy": check_accuracy, "check-capture": check_capture, "check-report": check_report}[cmd]
        sys.exit(0 if fn(*sys.argv[2:]) else 1)
