"""In-process A/B of zcta's cost (run under torchrun with the shim preloaded):

    LD_PRELOAD=$PWD/.carry/libzcta_prof.so torchrun --standalone --nproc-per-node 2 bench/gpu_ab.py

The same two processes alternate blocks with recording on and off
(`zcta_set_recording`, exported by the shim: off = calls forwarded, nothing recorded,
CUPTI's activity kinds disabled), so machine and start-up variance cancel out. What
it cannot switch off is NCCL's own cost of having the profiler plugin loaded (the
plugin's callbacks return at once while paused); compare `ZCTA_NCCL_PLUGIN=0` runs
for that. Rank 0 prints one line per measurement: median of the "on" blocks, of the
"off" blocks, their ratio and a 95 % bootstrap interval of the ratio.
"""

import argparse
import ctypes
import os
import random
import statistics
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--blocks", type=int, default=20, help="blocks per setting")
args = ap.parse_args()

rank = int(os.environ["RANK"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
try:
    set_recording = ctypes.CDLL(None).zcta_set_recording
except AttributeError:
    raise SystemExit("bench/gpu_ab.py needs the shim preloaded (LD_PRELOAD=.../libzcta_prof.so)")

small = torch.ones(2, device=dev)
a1, b1 = torch.randn((1 << 20) // 4, device=dev), torch.empty((1 << 20) // 4, device=dev)
a128, b128 = torch.randn((128 << 20) // 4, device=dev), torch.empty((128 << 20) // 4, device=dev)


def host_loop(n=500):
    t = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(small)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def a2a_loop(a, b, n):
    t = time.perf_counter()
    for _ in range(n):
        dist.all_to_all_single(b, a)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


tests = {
    "8-byte all_reduce, us/call": host_loop,
    "1 MiB all_to_all, us/op": lambda: a2a_loop(a1, b1, 200),
    "128 MiB all_to_all, us/op": lambda: a2a_loop(a128, b128, 10),
}
for fn in tests.values():  # warm-up, recording on
    fn()
res = {name: {True: [], False: []} for name in tests}
for blk in range(2 * args.blocks):
    on = blk % 2 == 0 if (blk // 2) % 2 == 0 else blk % 2 == 1  # ABBA order
    torch.cuda.synchronize()
    dist.barrier()
    set_recording(1 if on else 0)
    for name, fn in tests.items():
        res[name][on].append(fn())
set_recording(1)


def ci(on, off, reps=2000):
    rng = random.Random(7)
    r = []
    for _ in range(reps):
        r.append(statistics.median(rng.choices(on, k=len(on))) / statistics.median(rng.choices(off, k=len(off))))
    r.sort()
    return r[int(0.025 * reps)], r[int(0.975 * reps)]


if rank == 0:
    print(f"{'measurement':28} {'on (median)':>12} {'off (median)':>13} {'ratio':>7}  95% CI")
    for name, v in res.items():
        m_on, m_off = statistics.median(v[True]), statistics.median(v[False])
        lo, hi = ci(v[True], v[False])
        print(f"{name:28} {m_on:12.2f} {m_off:13.2f} {m_on / m_off:7.3f}  [{lo:.3f}, {hi:.3f}]")
dist.barrier()
dist.destroy_process_group()
