"""Where the 4-6 us between CUDA events around an NCCL op and CUPTI's kernel span go
(2 GPUs, no shim):

    torchrun --standalone --nproc-per-node 2 bench/launch_gap.py [--iters 60]

Per op and size, NCCL is called directly on stream S after a GPU sleep on S, between
two CUDA events e0, e1 of our own: [sleep] e0 [NCCL: waits, kernel, its event] e1.
CUPTI (kernel and CUDA_EVENT kinds, event device timestamps, latency timestamps) gives
every piece's GPU time, so the event span e1 - e0 splits into
    e0 -> kernel start (NCCL's stream waits and the kernel's launch on the GPU),
    the kernel (CUPTI's span, what zcta reports),
    kernel end -> e1 (NCCL's finishing event record, then ours).
Also printed: sleep end -> kernel start (what a "stream ready" rule would add to the
kernel span) and the kernel record's queued/submitted timestamps relative to e0.
Rank 0 prints one line per op and size; medians over --iters calls.
"""

import argparse
import ctypes
import os
import statistics
import struct
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from nccl_bench import SLEEP_CYCLES, mapped_nccl, setup  # noqa: E402
from cupti_ctypes import Activity  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--iters", type=int, default=60)
ap.add_argument("--no-events", action="store_true",
                help="kernel records only (no CUDA_EVENT/synchronization kinds, which slow event records)")
args = ap.parse_args()

rank, world, dev = setup()
stream = torch.cuda.Stream(dev)
nccl = mapped_nccl()
comm = ctypes.c_void_p(dist.group.WORLD._get_backend(dev)._comm_ptr())
raw_stream = ctypes.c_void_p(stream.cuda_stream)


act = Activity()
cupti, done, chk = act.cupti, act.done, act.check
vp = ctypes.c_void_p
KERNEL, CUDA_EVENT, SYNCHRONIZATION = 10, 36, 38
chk("event timestamps", cupti.cuptiActivityEnableCudaEventDeviceTimestamps(ctypes.c_uint8(1)))
chk("latency timestamps", cupti.cuptiActivityEnableLatencyTimestamps(ctypes.c_uint8(1)))
# CUPTI's stream id of S: from the sleep kernels' records (the only kernels on S besides NCCL's).
chk("kernel kind", cupti.cuptiActivityEnable(KERNEL))
if not args.no_events:
    chk("event kind", cupti.cuptiActivityEnable(CUDA_EVENT))
    # CUPTI 13.0 writes no CUDA_EVENT records without the synchronization kind (seen on the H200).
    chk("synchronization kind", cupti.cuptiActivityEnable(SYNCHRONIZATION))

mib = 1 << 20
sizes = [1 * mib, 16 * mib, 128 * mib]
t_in = torch.ones(max(sizes) // 4, device=dev)
t_out = torch.empty_like(t_in)
p_in, p_out = ctypes.c_void_p(t_in.data_ptr()), ctypes.c_void_p(t_out.data_ptr())


def op_fn(op, nbytes):
    n = nbytes // 4
    if op == "AllReduce":
        return lambda: nccl.ncclAllReduce(p_in, p_out, ctypes.c_size_t(n), 7, 0, comm, raw_stream)
    return lambda: nccl.ncclAlltoAll(p_in, p_out, ctypes.c_size_t(n // world), 7, comm, raw_stream)


plan = [(op, s) for op in ("AllReduce", "AlltoAll") for s in sizes]
elapsed = {k: [] for k in plan}
with torch.cuda.stream(stream):
    for op, s in plan:  # warm-up: connections, first-call set-up
        for _ in range(3):
            assert op_fn(op, s)() == 0
    torch.cuda.synchronize()
    cupti.cuptiActivityFlushAll(1)
    done.clear()
    for k in plan:
        fn = op_fn(*k)
        for _ in range(args.iters):
            dist.barrier()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(SLEEP_CYCLES)
            e0.record(stream)
            assert fn() == 0
            e1.record(stream)
            e1.synchronize()
            elapsed[k].append(e0.elapsed_time(e1) * 1e6)  # ns
torch.cuda.synchronize()
cupti.cuptiActivityFlushAll(1)

kinds = {}
kernels, events = [], []  # (start, end, stream, queued, submitted, name), (ts, stream)
nxt = cupti.cuptiActivityGetNextRecord
nxt.argtypes = [vp, ctypes.c_size_t, ctypes.POINTER(vp)]
for a, valid in done:
    r = vp()
    while nxt(a, valid, ctypes.byref(r)) == 0:
        kind = struct.unpack_from("<I", ctypes.string_at(r.value, 4))[0]
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == KERNEL:
            b = ctypes.string_at(r.value, 216)
            start, end = struct.unpack_from("<QQ", b, 16)
            sid = struct.unpack_from("<I", b, 48)[0]
            queued, submitted = struct.unpack_from("<QQ", b, 120)
            name_p = struct.unpack_from("<Q", b, 104)[0]
            name = ctypes.string_at(name_p).decode(errors="replace") if name_p else ""
            kernels.append((start, end, sid, queued, submitted, "nccl" if "nccl" in name.lower() else "other"))
        elif kind == CUDA_EVENT:
            b = ctypes.string_at(r.value, 56)
            sid = struct.unpack_from("<I", b, 12)[0]
            ts = struct.unpack_from("<Q", b, 40)[0]
            events.append((ts, sid))

kernels.sort()
events.sort()
nccl_k = [k for k in kernels if k[5] == "nccl"]
sleep_k = [k for k in kernels if k[5] == "other"]
s_id = statistics.mode(k[2] for k in sleep_k) if sleep_k else None
ev_s = [t for t, sid in events if sid == s_id and t > 0]
print(f"rank {rank}: {len(kernels)} kernel records ({len(nccl_k)} NCCL), {len(events)} event records "
      f"({sum(1 for t, _ in events if t > 0)} with a device timestamp, {len(ev_s)} on S); records by kind {kinds}", flush=True)


def med(xs):
    return statistics.median(xs) / 1e3 if xs else float("nan")


# Our op's kernel: the first NCCL kernel on S after each GPU sleep (the "other" kernels
# on S longer than 20 us; torch's barrier puts short kernels and events on S too).
sleeps = [x for x in sleep_k if x[2] == s_id and x[1] - x[0] > 20_000]
ours = []
for sl in sleeps:
    k = next((x for x in nccl_k if x[2] == s_id and x[0] >= sl[1]), None)
    if k is not None:
        ours.append((sl, k))
rows = []
for j, k in enumerate(plan):
    pre, kspan, post, ev_span, ready_pre, nccl_ev, q, sub, n_post = [], [], [], [], [], [], [], [], []
    for sl, (start, end, sid, queued, submitted, _) in ours[j * args.iters:(j + 1) * args.iters]:
        before = [t for t in ev_s if sl[1] <= t <= start]
        after = [t for t in ev_s if end <= t <= end + 50_000]
        n_post.append(len(after))
        ready_pre.append(start - sl[1])
        kspan.append(end - start)
        if not before or len(after) < 2:
            continue
        e0, e_nccl, e1 = before[-1], after[0], after[1]
        pre.append(start - e0)
        nccl_ev.append(e_nccl - end)
        post.append(e1 - end)
        ev_span.append(e1 - e0)
        if queued and queued != 0xFFFFFFFFFFFFFFFF:
            q.append(queued - e0)
        if submitted and submitted != 0xFFFFFFFFFFFFFFFF:
            sub.append(submitted - e0)
    print(f"rank {rank} {k}: events on S within 50 us after the kernel: {sorted(set(n_post))}", flush=True)
    rows.append((k, len(kspan), med(elapsed[k]), med(ev_span), med(pre), med(kspan), med(nccl_ev), med(post),
                 med(ready_pre), med(q), med(sub)))

if rank == 0:
    print("op         size    n  elapsed  e1-e0(dev)  e0->kstart  kernel  kend->ncclEv  kend->e1  "
          "sleepEnd->kstart  queued-e0  submitted-e0  elapsed-kernel   (us, medians)")
    for (op, s), n, el, sp, pre, ks, ne, post, rp, q, sub in rows:
        print(f"{op:10} {s // mib:4}M {n:4} {el:8.1f} {sp:10.1f} {pre:11.1f} {ks:7.1f} {ne:12.1f} {post:9.1f} "
              f"{rp:17.1f} {q:10.1f} {sub:13.1f} {el - ks:15.1f}")
dist.destroy_process_group()
