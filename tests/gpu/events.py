"""One-GPU checks of zcta's default GPU side (stamps on each op's stream), run by
tests/gpu/events.sh:

    python3 events.py accuracy OUT_JSON            (under the shim, ZCTA_BUDGET=all)
    python3 events.py check-accuracy OUT_JSON RUN_DIR
    python3 events.py capture OUT_JSON             (plain, then under the shim)
    python3 events.py check-capture PLAIN_JSON ZCTA_JSON RUN_DIR
    python3 events.py check-report RUN_DIR         (after `zcta phases RUN_DIR`)
    python3 events.py anchors                      (under the shim, ZCTA_BUDGET=all)
    python3 events.py check-anchors RUN_DIR

accuracy: send/recv to itself and all_to_all_single at 1, 16 and 64 MiB, each op
between two CUDA events of the program's own, with the stream kept busy (a sleep
kernel) past the call, so the op's stream becomes free after its launch; the check
compares zcta's gpu_end_ns - gpu_ready_ns of the same ops with those events. The
program's events hold zcta's two stamps as well, so each iteration also measures,
on the same stream behind the same sleep, what two of zcta's stamps add to a pair of
events beyond the interval that zcta reads between them (the program launches the
same kernel into slots of its own: examples/nccl_bench.py's two_stamps; the events'
elapsed time less the two stamps' own clock readings); the check takes that off the
program's window of the same op. That
correction is a median: what a record or a stamp really adds varies from op to op
(a record 1.3 to 2.5 us right before or after a large kernel:
bench/event_records.py), so no tool whose marks sit exactly where zcta's do can pass
every op. The check therefore also measures two ideal tools in the same process, with
zcta's recording paused: one records two inner CUDA events where zcta stamps (just
before and just after the launching call), judged the same way less what two records
add (three records back to back: the third minus the first); the other launches two
stamps of its own there (examples/nccl_bench.py's like_zcta_stamps: zcta's mechanism,
done by the program), judged as zcta is. An op size passes when all its ops were
timed, zcta is within max(1 us, 2 %) for >= 95 % of its ops or for as many as the
events' ideal is (less two standard errors of the two shares: what the program's own
events allow a tool at zcta's places), and zcta's residuals agree on average within
0.25 us with the stamps' ideal (zcta's stamps sit where the ideal's do and its clocks
convert them right; means of the middle 90 %, since the residuals take a few discrete
values). Files written before the stamps' ideal (no such rows) compare the means with
the events' ideal. ITERS (100) ops per
kind and size.
capture: NCCL ops captured into a CUDA graph (torch.cuda.graph, global capture mode)
and replayed; the check wants the same graph (node types and counts) and the same
results with and without zcta, and zcta's rows of the captured ops marked
graph_capture with no GPU times.
anchors: 8-byte send/recv groups to itself for ANCHOR_S (4) seconds, the stream idle
before each (synchronised, then 1 ms apart), every group timed; the check reads each
group's ready stamp on CLOCK_REALTIME against the return of the group's last op (its
ncclRecv): the stamp is launched later, in the ncclGroupEnd, and runs once the idle
stream takes it, so it cannot come before that return. (Not against the
ncclGroupEnd's own entry: `api_start_ns` is read after the ready stamp's launch, which
the GPU may run before the launch call has returned.) A ready time earlier than that
return by more than the error the process row claims (`gpu_clock_error_ns`) is a
clock that lies; the check wants none, and prints the claimed error and the offsets'
spread, against both.
"""

import json
import os
import sys
from pathlib import Path

MiB = 1 << 20
SIZES = [MiB, 16 * MiB, 64 * MiB]
ITERS = int(os.environ.get("ITERS", "100"))


def setup():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import nccl_bench as nb

    nb.one_rank_env()
    import torch
    import torch.distributed as dist

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

    # Each block's stamps are read after its synchronise, before the ring comes round.
    if 6 * ITERS > nb.STAMP_SLOTS:
        raise SystemExit(f"ITERS={ITERS}: a block takes {6 * ITERS} stamp slots, more than the "
                         f"{nb.STAMP_SLOTS} of examples/nccl_bench.py's ring")
    res = []
    for nbytes in SIZES:
        n = nbytes // 4
        a, b = torch.ones(n, device=dev), torch.empty(n, device=dev)
        ops = {"sr": me.sendrecv(a, b), "a2a": lambda k: [dist.all_to_all_single(b, a) for _ in range(k)]}
        for kind, fn in ops.items():
            fn(3)  # warm-up (same sizes: the check takes the last ITERS rows)
            torch.cuda.synchronize()
            block = []
            for _ in range(ITERS):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(200_000)  # ~100 us: the stream is busy past the call
                e0.record(s)
                fn(1)
                e1.record(s)
                c, slots = nb.two_stamps(s)
                block.append({"kind": kind, "bytes": nbytes, "e": (e0, e1), "c": c, "slots": slots})
            torch.cuda.synchronize()
            # The ideal tools, with zcta's recording paused (no stamp of zcta's inside
            # the program's pair): the program records the inner pair of events, or
            # launches the inner pair of stamps, where zcta stamps.
            if set_recording is not None:
                set_recording(0)
            for _ in range(ITERS):
                (e0, r, e, e1), c = nb.like_zcta(s, fn)
                block.append({"kind": kind, "bytes": nbytes, "ideal": True, "e": (e0, e1), "i": (r, e), "c": c})
            for _ in range(ITERS):
                e, inner, (c, slots) = nb.like_zcta_stamps(s, fn)
                block.append({"kind": kind, "bytes": nbytes, "ideal_stamps": True, "e": e, "si": inner, "c": c,
                              "slots": slots})
            if set_recording is not None:
                set_recording(1)
            torch.cuda.synchronize()
            res += [settle(r, nb.stamp_value) for r in block]
    me.destroy()
    Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def settle(r, stamp_value):
    """One measured row, after a synchronise: its events and stamps read into µs
    (`stamp_value(slot)`: a stamp's GPU clock in ns). `events_us`: the program's window;
    `two_records_us`: what two records (the events' ideal) or two stamps (zcta and the
    stamps' ideal) add to it beyond what the inner marks read: for stamps, the events'
    elapsed time around two stamps less the stamps' own interval, which a reading
    between stamps includes; `inner_us`: an ideal tool's own reading."""
    e0, e1 = r.pop("e")
    r["events_us"] = e0.elapsed_time(e1) * 1e3
    c0, c2 = r.pop("c")
    r["two_records_us"] = c0.elapsed_time(c2) * 1e3
    if "slots" in r:
        a, b = r.pop("slots")
        r["stamps_between_us"] = (stamp_value(b) - stamp_value(a)) / 1e3
        r["two_records_us"] -= r["stamps_between_us"]
    if "i" in r:
        i0, i1 = r.pop("i")
        r["inner_us"] = i0.elapsed_time(i1) * 1e3
    if "si" in r:
        a, b = r.pop("si")
        r["inner_us"] = (stamp_value(b) - stamp_value(a)) / 1e3
    return r


def rows(run_dir, table, columns=None):
    import pyarrow.dataset as ds

    files = sorted(Path(run_dir).glob(f"{table}/*.parquet"))
    return ds.dataset(files).to_table(columns=columns).to_pandas()


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def trimmed_mean(xs):
    """Mean of the middle 90 % (the residuals jump between a few values: a median
    would jump with them)."""
    xs = sorted(xs)
    k = len(xs) // 20
    mid = xs[k:len(xs) - k] or xs
    return sum(mid) / len(mid) if mid else float("nan")


def residuals(outer, inner, two):
    """Per op: the program's window less the median of `two` (what two records add),
    less the inner duration; and whether that is within max(1 us, 2 %) of it."""
    t = median(two)
    res = [o - t - i for o, i in zip(outer, inner)]
    return res, sum(abs(x) <= max(1.0, 0.02 * i) for x, i in zip(res, inner))


def check_accuracy(out, run_dir, plain=None):
    """Per op and size: zcta's gpu_end - gpu_ready against the program's own events
    around the same op in this run, less what two event records add (module doc),
    judged next to the ideal tool measured in the same process; with `plain`, the
    median of the same events in a run without zcta is shown too."""
    got = json.loads(Path(out).read_text())
    ref = json.loads(Path(plain).read_text()) if plain else []
    ops = rows(run_dir, "ops").sort_values("op_id")
    ok_all, lines = True, []
    # Over every size and kind: timed ops within max(1 us, 2 %), timed ops, ops measured.
    near_all, timed_all, want_all = 0, 0, 0
    for kind, op in [("sr", "Send"), ("a2a", "AlltoAll")]:
        for nbytes in SIZES:
            mine = [w for w in got if w["kind"] == kind and w["bytes"] == nbytes]
            want = [w for w in mine if "ideal" not in w and "ideal_stamps" not in w]
            ideal = [w for w in mine if "ideal" in w]
            # Where the check compares the means: the stamps' ideal, else (files
            # written before it) the events'.
            like = [w for w in mine if "ideal_stamps" in w] or ideal
            # zcta's rows of the measured ops (the ideal tool's ran paused: no rows).
            z = ops[(ops.op == op) & (ops.bytes == nbytes)].tail(len(want))
            timed = (z.timing == "timed").tolist()
            dur = ((z.gpu_end_ns - z.gpu_ready_ns) / 1e3).tolist()
            zw = [w for w, t in zip(want, timed) if t]
            zd = [d for d, t in zip(dur, timed) if t]
            zres, znear = residuals([w["events_us"] for w in zw], zd, [w["two_records_us"] for w in want])
            ires, inear = residuals([w["events_us"] for w in ideal], [w["inner_us"] for w in ideal],
                                    [w["two_records_us"] for w in ideal])
            lres, lnear = residuals([w["events_us"] for w in like], [w["inner_us"] for w in like],
                                    [w["two_records_us"] for w in like])
            zs = znear / len(zd) if zd else 0.0
            ish = inear / len(ideal) if ideal else 0.0
            se = (ish * (1 - ish) * (1 / max(len(zd), 1) + 1 / max(len(ideal), 1))) ** 0.5
            shift = trimmed_mean(zres) - trimmed_mean(lres)
            good = (sum(timed) == len(want) and len(want) > 0 and (zs >= 0.95 or zs >= ish - 2 * se)
                    and abs(shift) <= 0.25)
            q = lambda xs, f: sorted(xs)[min(int(f * len(xs)), len(xs) - 1)] if xs else float("nan")  # noqa: E731
            line = (f"accuracy {kind:3} {nbytes // MiB:3} MiB: {sum(timed)}/{len(want)} timed; events median "
                    f"{median([w['events_us'] for w in want]):7.2f} us, zcta median {median(zd):7.2f} us; "
                    f"events less two records minus zcta: median {median(zres):+.2f} [p5 {q(zres, .05):+.2f}, "
                    f"p95 {q(zres, .95):+.2f}] us, within max(1 us, 2 %): {znear}/{len(zd)} ({zs:.0%}); "
                    f"ideal tool (same process, paused): median {median(ires):+.2f} [p5 {q(ires, .05):+.2f}, "
                    f"p95 {q(ires, .95):+.2f}] us, within: {inear}/{len(ideal)} ({ish:.0%}); "
                    + (f"stamps' ideal: median {median(lres):+.2f} [p5 {q(lres, .05):+.2f}, "
                       f"p95 {q(lres, .95):+.2f}] us, within: {lnear}/{len(like)}; " if like is not ideal else "")
                    + f"means (middle 90 %) of zcta and the {'stamps' if like is not ideal else 'events'}' "
                    f"ideal differ by {shift:+.2f} us")
            plain_ev = [w["events_us"] for w in ref if w["kind"] == kind and w["bytes"] == nbytes
                        and "ideal" not in w and "ideal_stamps" not in w]
            if plain_ev:
                line += f"; without zcta: events median {median(plain_ev):7.2f} us"
            ok_all &= good
            lines.append(f"{'ok  ' if good else 'FAIL'} {line}")
            near_all, timed_all, want_all = near_all + znear, timed_all + len(zd), want_all + len(want)
    # The target's own statistic: of all timed ops >= 1 MiB, the share within max(1 us,
    # 2 %). Every size must pass its own check above as well.
    share = near_all / timed_all if timed_all else 0.0
    good = timed_all == want_all > 0 and share >= 0.95
    ok_all &= good
    lines.append(f"{'ok  ' if good else 'FAIL'} accuracy, every size: {timed_all}/{want_all} timed; "
                 f"within max(1 us, 2 %): {near_all}/{timed_all} ({share:.1%})")
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
    # A phase no op measured is "n/m" (not measured), never 0.
    parts = {n[:-3]: round(float(timed[n].sum()) / float(win), 3) if timed[n].notna().any() else "n/m"
             for n in names if n in timed and win}
    good = share >= 0.95 and len(timed) > 0
    print(f"{'ok  ' if good else 'FAIL'} report: {len(timed)} of {len(ph)} ops with a window; "
          f"{share:.1%} of the summed window in measured phases {parts}; ops timing "
          f"{ {k: int(v) for k, v in ops.timing.value_counts().items()} }, "
          f"levels {sorted(int(x) for x in set(ops.timing_level.dropna()))}")
    return good


def anchors():
    import time

    torch, dist, nb, dev = setup()
    stream = torch.cuda.current_stream()
    me = nb.SelfComm(stream)
    a, b = torch.ones(2, device=dev), torch.empty(2, device=dev)
    run = me.sendrecv(a, b)
    end = time.monotonic() + float(os.environ.get("ANCHOR_S", "4"))
    n = 0
    while time.monotonic() < end:
        torch.cuda.synchronize()
        time.sleep(0.001)
        run(1)
        n += 1
    torch.cuda.synchronize()
    me.destroy()
    dist.destroy_process_group()
    print(f"anchors: {n} groups")


def check_anchors(run_dir):
    """Each timed group's gpu_ready_ns against the last return of its ops (a causal
    bound: never earlier by more than the claimed anchor error), and for information
    against its ncclGroupEnd's api_start_ns."""
    p = rows(run_dir, "process", ["gpu_clock_error_ns", "gpu_clock_drift_ns_per_s"])
    err = p.gpu_clock_error_ns.dropna()
    ops = rows(run_dir, "ops", ["group_id", "gpu_ready_ns", "api_end_ns"]).dropna(subset=["group_id"])
    last = ops.groupby("group_id").api_end_ns.max().rename("ops_end")
    ready = ops.dropna(subset=["gpu_ready_ns"]).drop_duplicates("group_id").set_index("group_id").gpu_ready_ns
    calls = rows(run_dir, "calls", ["call", "group_id", "api_start_ns"])
    entry = calls[calls.call == "GroupEnd"].dropna().set_index("group_id").api_start_ns
    j = ready.to_frame().join(last, how="inner").join(entry, how="inner")
    if err.empty or j.empty:
        print(f"FAIL anchors: claimed error {list(err)}, {len(j)} groups with a ready time")
        return False
    e = int(err.max())

    def spread(d):
        d = sorted(int(x) for x in d)
        q = lambda f: d[min(len(d) - 1, int(f * len(d)))] / 1e3  # noqa: E731
        return d, f"min {d[0] / 1e3:.2f}, p1 {q(0.01):.2f}, median {q(0.5):.2f}, p99 {q(0.99):.2f} us"

    d, text = spread(j.gpu_ready_ns - j.ops_end)
    _, at_entry = spread(j.gpu_ready_ns - j.api_start_ns)
    lies = sum(x < -e for x in d)
    print(f"{'ok  ' if lies == 0 else 'FAIL'} anchors: claimed error {e / 1e3:.2f} us (drift "
          f"{list(p.gpu_clock_drift_ns_per_s)} ns/s); {len(d)} groups, ready - last op's return: {text}; "
          f"earlier {sum(x < 0 for x in d)}, by more than the claimed error {lies}; ready - GroupEnd's "
          f"api_start_ns: {at_entry}")
    return lies == 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "accuracy":
        accuracy(sys.argv[2])
    elif cmd == "capture":
        capture(*sys.argv[2:])
    elif cmd == "anchors":
        anchors()
    else:
        fn = {"check-accuracy": check_accuracy, "check-capture": check_capture, "check-report": check_report,
              "check-anchors": check_anchors}[cmd]
        sys.exit(0 if fn(*sys.argv[2:]) else 1)
