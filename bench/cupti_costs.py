"""What CUPTI's parts and CUDA events cost per launch, on one GPU, without NCCL's
second rank and without the shim:

    python3 bench/cupti_costs.py [--blocks 10] [--noop-cb .carry/libnoop_cb.so]

Host wall time per item of short loops (tiny torch kernels, DtoD copies, cudaEventRecord,
a 1-rank NCCL all_reduce), with CUPTI set up one way per "mode", the modes rotated within
each block so drift cancels; shown: median per mode and the median of the per-block
ratios to "none". Then a check of CUDA_EVENT device timestamps against kernel records.
"""

import argparse
import ctypes
import os
import statistics
import struct
import time

import torch
import torch.distributed as dist
from cupti_ctypes import Activity, mapped

ap = argparse.ArgumentParser()
ap.add_argument("--blocks", type=int, default=10)
ap.add_argument("--n", type=int, default=4000, help="items per loop")
ap.add_argument("--noop-cb", help="shared object exporting noop_cb (a native CUPTI callback)")
args = ap.parse_args()

dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
x = torch.ones(2, device=dev)
y = torch.empty(2, device=dev)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
dist.all_reduce(x)
torch.cuda.synchronize()


act = Activity()
cupti, bufs, done, chk = act.cupti, act.bufs, act.done, act.check
cudart = ctypes.CDLL(mapped("libcudart.so"))
vp = ctypes.c_void_p


def event_timestamps(on):
    chk("event timestamps", cupti.cuptiActivityEnableCudaEventDeviceTimestamps(ctypes.c_uint8(1 if on else 0)))


sub = vp()
cb_ptr = None
if args.noop_cb:
    cb_ptr = ctypes.cast(ctypes.CDLL(os.path.abspath(args.noop_cb)).noop_cb, vp)
# driver cuLaunchKernel 307, cuLaunchKernelEx 652, cuStreamBatchMemOp_v2 667;
# runtime cudaMemcpyBatchAsync 509/510, cudaMemcpyAsync 41, cudaMemcpyPeerAsync 161
DRV, RT = [307, 652, 667], [509, 510, 41, 161]


def callbacks(on):
    if on:
        chk("subscribe", cupti.cuptiSubscribe(ctypes.byref(sub), cb_ptr, None))
        for c in DRV:
            chk("enable cb", cupti.cuptiEnableCallback(1, sub, 1, c))  # CUPTI_CB_DOMAIN_DRIVER_API
        for c in RT:
            chk("enable cb", cupti.cuptiEnableCallback(1, sub, 2, c))  # CUPTI_CB_DOMAIN_RUNTIME_API
    else:
        chk("unsubscribe", cupti.cuptiUnsubscribe(sub))


KERNEL, MEMCPY, MEMSET, MEMCPY2, CUDA_EVENT, SYNCHRONIZATION = 10, 1, 2, 22, 36, 38
modes = {
    "none": ([], False),
    "kernel": ([KERNEL], False),
    "memcpy+memset": ([MEMCPY, MEMCPY2, MEMSET], False),
    # CUPTI 13.0 writes CUDA_EVENT records only with the synchronization kind on too
    # (bench/launch_gap.py); with and without the events' device timestamps.
    "events+sync": ([CUDA_EVENT, SYNCHRONIZATION], False),
    "events+sync, device ts": ([CUDA_EVENT, SYNCHRONIZATION], False),
    "zcta default": ([KERNEL, MEMCPY, MEMCPY2, MEMSET], True),
}
if cb_ptr is not None:
    modes["callbacks"] = ([], True)
else:
    del modes["zcta default"]


def set_mode(name, on):
    kinds, cbs = modes[name]
    if name.endswith("device ts"):
        event_timestamps(on)
    for k in kinds:
        chk(f"kind {k}", (cupti.cuptiActivityEnable if on else cupti.cuptiActivityDisable)(k))
    if cbs:
        callbacks(on)


stream = torch.cuda.current_stream().cuda_stream
events = []
for _ in range(64):
    e = vp()
    assert cudart.cudaEventCreateWithFlags(ctypes.byref(e), 0) == 0
    events.append(e)
rec = cudart.cudaEventRecord
rec.argtypes = [vp, vp]
noop = cudart.cudaGetLastError


def per_item_us(fn, n=args.n):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn(n)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def launch(n):
    for _ in range(n):
        x.add_(1)


def copy(n):
    for _ in range(n):
        y.copy_(x)


def event(n):
    for i in range(n):
        rec(events[i & 63], stream)


def ctypes_noop(n):
    for _ in range(n):
        noop()


def launch_2ev(n):
    for i in range(n):
        rec(events[i & 63], stream)
        x.add_(1)
        rec(events[(i + 1) & 63], stream)


def ar1(n):
    for _ in range(n):
        dist.all_reduce(x)


tests = {"launch": launch, "copy DtoD": copy, "cudaEventRecord": event, "ctypes baseline": ctypes_noop,
         "launch + 2 events": launch_2ev, "1-rank all_reduce": lambda n: ar1(n // 4)}
res = {m: {t: [] for t in tests} for m in modes}
names = list(modes)
for blk in range(args.blocks):
    order = names[blk % len(names):] + names[:blk % len(names)]
    for m in order:
        set_mode(m, True)
        launch(200)
        for t, fn in tests.items():
            res[m][t].append(per_item_us(fn) if t != "1-rank all_reduce" else per_item_us(fn, args.n // 4))
        set_mode(m, False)
        cupti.cuptiActivityFlushAll(1)
        for a, _ in done:
            bufs.pop(a, None)
        done.clear()

print(f"{'test':20} " + " ".join(f"{m:>22}" for m in names))
for t in tests:
    cells = []
    for m in names:
        med = statistics.median(res[m][t])
        ratios = [a / b for a, b in zip(res[m][t], res["none"][t])]
        cells.append(f"{med:8.3f} ({statistics.median(ratios):5.3f}x)")
    print(f"{t:20} " + " ".join(f"{c:>22}" for c in cells))

# CUDA_EVENT device timestamps against kernel records: A; kernel; B, after a GPU sleep.
set_mode("kernel", True)
set_mode("events+sync, device ts", True)
for i in range(50):
    torch.cuda._sleep(100000)
    rec(events[0], stream)
    x.add_(1)
    rec(events[1], stream)
    torch.cuda.synchronize()
    el = ctypes.c_float()
    cudart.cudaEventElapsedTime(ctypes.byref(el), events[0], events[1])
cupti.cuptiActivityFlushAll(1)
set_mode("kernel", False)
set_mode("events+sync, device ts", False)
cupti.cuptiActivityFlushAll(1)
kern, evs = [], []
nxt = cupti.cuptiActivityGetNextRecord
nxt.argtypes = [vp, ctypes.c_size_t, ctypes.POINTER(vp)]
for a, valid in done:
    r = vp()
    while nxt(a, valid, ctypes.byref(r)) == 0:
        raw = ctypes.string_at(r.value, 64)
        kind = struct.unpack_from("<I", raw)[0]
        if kind == KERNEL:
            s, e = struct.unpack_from("<QQ", raw, 16)
            kern.append((s, e))
        elif kind == CUDA_EVENT:
            corr, ctxid, sid, eid = struct.unpack_from("<IIII", raw, 4)
            ts = struct.unpack_from("<Q", raw, 40)[0]
            evs.append((ts, eid, sid))
print(f"\nkernel records {len(kern)}, CUDA_EVENT records {len(evs)} "
      f"({sum(1 for e in evs if e[0]) } with a device timestamp)")
kern.sort()
evs.sort()
pre, post, ev_span, k_span = [], [], [], []
for s, e in kern[-40:]:
    before = [t for t, _, _ in evs if 0 < t <= s]
    after = [t for t, _, _ in evs if t >= e]
    if before and after:
        pre.append(s - before[-1])
        post.append(after[0] - e)
        ev_span.append(after[0] - before[-1])
        k_span.append(e - s)
if pre:
    print(f"event A -> kernel start median {statistics.median(pre)} ns; kernel end -> event B "
          f"{statistics.median(post)} ns; event span {statistics.median(ev_span)} ns vs kernel "
          f"{statistics.median(k_span)} ns; last cudaEventElapsedTime {el.value * 1e6:.0f} ns")
print("event ids seen:", sorted({e[1] for e in evs})[:8], "streams:", sorted({e[2] for e in evs})[:4])
dist.destroy_process_group()
