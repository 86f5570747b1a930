"""zcta's cost per NCCL call on ONE GPU: a 1-rank communicator whose ranks send to
themselves (ncclGroupStart, ncclSend, ncclRecv, ncclGroupEnd to peer 0). NCCL plans,
profiles and launches that like any send/recv (ncclDevKernel_SendRecv through
cuLaunchKernelEx); only the bytes stay on the GPU. It measures what the shim adds to
a call (host records, profiler plugin, CUPTI kinds and launch callbacks) where no
second GPU is available. Collectives on one rank take NCCL's one-rank shortcut (no
plan, no kernel) and are not representative; they are left out.

    LD_PRELOAD=$PWD/.carry/libzcta_prof.so python3 bench/gpu_self_ab.py   # in-process A/B
    python3 bench/gpu_self_ab.py                                            # plain: loops only

Under the shim, blocks with recording on and off alternate (ABBA), as in
bench/gpu_ab.py; it prints medians, the ratio and the median paired ratio with 95 %
bootstrap intervals. Without the shim it prints the plain medians.
"""

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import nccl_bench as nb  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--blocks", type=int, default=16)
ap.add_argument("--tag", default="", help="label printed before each line")
ap.add_argument("--always-on", action="store_true",
                help="under the shim, never pause: every block recorded, medians printed as for plain "
                     "(for a process A/B between settings: bench/gpu_self_process_ab.sh)")
args = ap.parse_args()

dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
stream = torch.cuda.Stream()
torch.cuda.set_stream(stream)

# "Off" blocks switch CUPTI off too; every switch happens with the GPU synchronised,
# which that needs (docs/dev/cupti.md, "Switching CUPTI").
os.environ.setdefault("ZCTA_PAUSE_CUPTI", "1")
set_recording = getattr(ctypes.CDLL(None), "zcta_set_recording", None)
label = "on" if set_recording is not None else "plain"
if args.always_on:
    set_recording = None
me = nb.SelfComm(stream)
small_a, small_b = torch.ones(2, device=dev), torch.empty(2, device=dev)
big_a, big_b = torch.ones((1 << 20) // 4, device=dev), torch.empty((1 << 20) // 4, device=dev)
x = torch.ones(2, device=dev)


def launch(k):
    for _ in range(k):
        x.add_(1)


sr8, sr1m = me.sendrecv(small_a, small_b), me.sendrecv(big_a, big_b)


def step_like(k):
    # a model step's mix: many small kernels of the program's own, one NCCL call
    for _ in range(k):
        launch(30)
        sr1m(1)


def per_item_us(fn, k):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn(k)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / k * 1e6


tests = {
    "send/recv to self, 8 B": (sr8, 2000),
    "send/recv to self, 1 MiB": (sr1m, 2000),
    "torch tiny kernel": (launch, 4000),
    "30 kernels + 1 MiB send/recv": (step_like, 200),
}
for fn, k in tests.values():
    per_item_us(fn, k // 4)
sr8(1)
torch.cuda.synchronize()
b_small = small_b.cpu()
assert b_small.tolist() == [1.0, 1.0], f"send/recv to self gave {b_small.tolist()}"

res = {t: {True: [], False: []} for t in tests}
pairs = {t: [] for t in tests}
for blk in range(2 * args.blocks):
    on = nb.abba_on(blk)
    if set_recording is None:
        on = True
    else:
        set_recording(1 if on else 0)
    for t, (fn, k) in tests.items():
        res[t][on].append(per_item_us(fn, k))
        if set_recording is not None and blk % 2 == 1:
            pairs[t].append(res[t][True][-1] / res[t][False][-1])
if set_recording is not None:
    set_recording(1)


tag = f"{args.tag:16} " if args.tag else ""
for t, v in res.items():
    m_on = statistics.median(v[True])
    if set_recording is None:
        print(f"{tag}{t:30} {label} {m_on:9.3f} us")
        continue
    m_off = statistics.median(v[False])
    pm = statistics.median(pairs[t])
    plo, phi = nb.bootstrap_ci(statistics.median, [pairs[t]])
    print(f"{tag}{t:30} on {m_on:9.3f}  off {m_off:9.3f}  +{m_on - m_off:6.3f} us  paired {pm:6.3f} "
          f"[{plo:.3f}, {phi:.3f}]")
me.destroy()
sys.stdout.flush()
