"""In-process A/B of zcta's cost (run under torchrun with the shim preloaded):

    LD_PRELOAD=$PWD/.carry/libzcta_prof.so torchrun --standalone --nproc-per-node 2 bench/gpu_ab.py

The same two processes alternate blocks with recording on and off
(`zcta_set_recording`, exported by the shim: off = calls forwarded, nothing recorded,
CUPTI's activity kinds and launch callbacks disabled (ZCTA_PAUSE_CUPTI=1, set here),
NCCL asked for no profiler events), so machine and start-up variance cancel out. Before commit 3cbd2b5 "off" left
NCCL's event mask set (the plugin declined each event), so NCCL's own profiler work
was in both halves. Rank 0 prints one line per measurement: median of the "on" blocks, of the
"off" blocks, their ratio with a 95 % bootstrap interval, and the median of the
paired ratios (each "on" block over its neighbouring "off" block, which cancels slow
drift) with its interval, and the ratio of the means (what sampled detail,
ZCTA_SAMPLE, costs over time: blocks inside a window cost more than the others).
Each measurement starts on both ranks together (`nccl_bench.together`; since commit
e041325, before only each block did).
"""

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import nccl_bench as nb  # noqa: E402
import train  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--blocks", type=int, default=20, help="blocks per setting")
ap.add_argument("--only", help="comma-separated subset: train, allreduce, a2a1, a2a128")
args = ap.parse_args()

# "Off" blocks switch CUPTI off too (the GPU is synchronised before every switch, which
# this needs: docs/dev/cupti.md, "Switching CUPTI"); read when capture starts.
os.environ.setdefault("ZCTA_PAUSE_CUPTI", "1")
rank, _, dev = nb.setup()
try:
    set_recording = ctypes.CDLL(None).zcta_set_recording
except AttributeError:
    raise SystemExit("bench/gpu_ab.py needs the shim preloaded (LD_PRELOAD=.../libzcta_prof.so)")

small = torch.ones(2, device=dev)
a1, b1 = torch.randn((1 << 20) // 4, device=dev), torch.empty((1 << 20) // 4, device=dev)
a128, b128 = torch.randn((128 << 20) // 4, device=dev), torch.empty((128 << 20) // 4, device=dev)




model = train.Model(train.parse_args([]), int(os.environ["WORLD_SIZE"]), rank, dev)


def train_steps(n=10):
    t = time.perf_counter()
    for _ in range(n):
        model.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


tests = {
    "train": ("examples/train.py step, ms", train_steps),
    "allreduce": ("8-byte all_reduce, us/call", lambda: nb.per_call_us(lambda: dist.all_reduce(small), 2000)),
    "a2a1": ("1 MiB all_to_all, us/op", lambda: nb.per_call_us(lambda: dist.all_to_all_single(b1, a1), 1000)),
    "a2a128": ("128 MiB all_to_all, us/op", lambda: nb.per_call_us(lambda: dist.all_to_all_single(b128, a128), 40)),
}
if args.only:
    tests = {k: v for k, v in tests.items() if k in args.only.split(",")}
tests = dict(tests.values())
for _ in range(10):  # warm-up, recording on
    model.step()
for fn in tests.values():
    fn()
res = {name: {True: [], False: []} for name in tests}
pairs = {name: [] for name in tests}  # (on, off) of blocks 2k and 2k+1: neighbours in time
for blk in range(2 * args.blocks):
    on = nb.abba_on(blk)
    torch.cuda.synchronize()
    dist.barrier()
    set_recording(1 if on else 0)
    for name, fn in tests.items():
        res[name][on].append(nb.together(fn))
        if blk % 2 == 1:
            pairs[name].append(res[name][True][-1] / res[name][False][-1])
set_recording(1)


def ratio_of_medians(on, off):
    return statistics.median(on) / statistics.median(off)


if rank == 0:
    print(f"{'measurement':28} {'on (median)':>12} {'off (median)':>13} {'ratio':>7}  95% CI           "
          f"{'paired':>7}  95% CI           {'means':>7}  95% CI")
    for name, v in res.items():
        m_on, m_off = statistics.median(v[True]), statistics.median(v[False])
        lo, hi = nb.bootstrap_ci(ratio_of_medians, [v[True], v[False]])
        pm = statistics.median(pairs[name])
        plo, phi = nb.bootstrap_ci(statistics.median, [pairs[name]])
        mr = statistics.fmean(v[True]) / statistics.fmean(v[False])
        mlo, mhi = nb.bootstrap_ci(lambda a, b: statistics.fmean(a) / statistics.fmean(b), [v[True], v[False]])
        print(f"{name:28} {m_on:12.2f} {m_off:13.2f} {m_on / m_off:7.3f}  [{lo:.3f}, {hi:.3f}]  "
              f"{pm:7.3f}  [{plo:.3f}, {phi:.3f}]  {mr:7.3f}  [{mlo:.3f}, {mhi:.3f}]")
dist.barrier()
dist.destroy_process_group()
