"""One process pair of bench/gpu_bench.sh (run under torchrun): the workloads whose
cost the benchmark compares, measured the same way whatever is attached.

    torchrun --standalone --nproc-per-node 2 bench/gpu_job.py --config zcta --out DIR

--config names what is attached (the launcher sets LD_PRELOAD and the environment;
this job only checks it): plain, zcta, ready (zcta with ZCTA_BUDGET=all), kernelch
(zcta + NCCL's per-channel GPU timers), nokinds / kernelonly / copyonly (zcta with no
activity kinds, the kernel kind only, the memcpy/memcpy2/memset kinds only), hostonly
(zcta without CUPTI), nocallbacks (zcta without CUPTI's launch callbacks), noplugin (zcta
without its NCCL profiler plugin), kernelchonly (zcta without CUPTI, with NCCL's
per-channel GPU timers), kernelchmin (the same with only NCCL's Coll, P2p and KernelCh
events), profiler (torch.profiler with CPU + CUDA activities around the
measured part).

Measured, in this order, each the median of --reps repetitions, each repetition started
on both ranks together (synchronise, barrier: a rank that starts late holds the other's
loop on the GPU, and its lag would count as time per call):
- train step: examples/train.py's model, --train-steps steps after 10 warm-up steps,
  each step synchronised (ms);
- 8-byte all_reduce host loop: 2,000 calls then one synchronise (us per call; 500 calls
  and no barrier before commit e041325);
- 1 MiB and 128 MiB all_to_all_single: back-to-back loops of 500 and 20 ops (us per op;
  200 and 10 before).
--accuracy (last, so the run's final ops are these): per op and size, 30 calls each
between its own CUDA events (zcta's GPU duration of the same op is compared later), and
an nccl-tests-style loop (events around 20 back-to-back calls, enqueued while the GPU
sleeps) for busbw.
Rank 0 writes DIR/<config>-<round>.json.
"""

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import nccl_bench as nb  # noqa: E402
import train  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True,
                choices=["plain", "zcta", "ready", "kernelch", "profiler",
                         "nokinds", "kernelonly", "copyonly", "hostonly", "nocallbacks", "noplugin",
                         "kernelchonly", "kernelchmin"])
ap.add_argument("--round", type=int, default=0)
ap.add_argument("--out", required=True)
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--train-steps", type=int, default=30)
ap.add_argument("--accuracy", action="store_true")
ap.add_argument("--measures", default="train_step_ms,allreduce_8B_us,a2a_1MiB_us,a2a_128MiB_us",
                help="comma-separated subset of the measures (fewer: shorter processes, more rounds)")
args = ap.parse_args()

rank, world, dev = nb.setup()
try:
    ctypes.CDLL(None).zcta_set_recording  # noqa: B018
    shim = True
except AttributeError:
    shim = False
if shim != (args.config not in ("plain", "profiler")):
    sys.exit(f"gpu_job.py: config {args.config} but the shim is {'' if shim else 'not '}preloaded")

model = train.Model(train.parse_args(["--dispatch", "dropless"]), world, rank, dev)
small = torch.ones(2, device=dev)
mib = 1 << 20
a1, b1 = torch.randn(mib // 4, device=dev), torch.empty(mib // 4, device=dev)
a128, b128 = torch.randn(128 * mib // 4, device=dev), torch.empty(128 * mib // 4, device=dev)


def train_step_ms():
    times = []
    for _ in range(args.train_steps):
        t = time.perf_counter()
        model.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


tests = {
    "train_step_ms": train_step_ms,
    "allreduce_8B_us": lambda: nb.per_call_us(lambda: dist.all_reduce(small), 2000),
    "a2a_1MiB_us": lambda: nb.per_call_us(lambda: dist.all_to_all_single(b1, a1), 500),
    "a2a_128MiB_us": lambda: nb.per_call_us(lambda: dist.all_to_all_single(b128, a128), 20),
}
wanted = set(args.measures.split(","))
if wanted - set(tests):
    sys.exit(f"gpu_job.py: unknown measures {sorted(wanted - set(tests))}; known: {', '.join(tests)}")
tests = {k: fn for k, fn in tests.items() if k in wanted}
for _ in range(10):  # warm-up: connections, allocator, autotuning
    model.step()
for fn in tests.values():
    fn()
torch.cuda.synchronize()
dist.barrier()

if args.config == "profiler":
    from torch.profiler import ProfilerActivity, profile
    ctx = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
else:
    ctx = contextlib.nullcontext()
res = {k: [] for k in tests}
with ctx:
    for _ in range(args.reps):
        for name, fn in tests.items():
            res[name].append(nb.together(fn))

acc, acc_start_ns = [], time.time_ns()
if args.accuracy:
    stream = torch.cuda.current_stream(dev)
    for size in (mib, 16 * mib, 128 * mib):
        n = size // 4
        x, y = a128[:n], b128[:n]
        for op, fn in (("AllReduce", lambda: dist.all_reduce(x, op=dist.ReduceOp.AVG)),  # stays finite
                       ("AlltoAll", lambda: dist.all_to_all_single(y, x))):
            per_call = nb.time_op(fn, stream, 30)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # ~10 ms of GPU sleep: both hosts enqueue all 20 calls (~1-2 ms through
            # torch) before either GPU reaches e0, so the loop times the GPU, as
            # nccl-tests does, not Python's enqueue. (With ~2 ms the 16 MiB AlltoAll loop
            # twice timed 20-27 GB/s against zcta's 166-173, ~7 ms lost in 20 ops, cause
            # not established; a longer sleep also absorbs the ranks' skew after the
            # barrier. docs/PERFORMANCE.md.)
            # Both ranks start the sleep together, or one waits for the other.
            nb.together(lambda: torch.cuda._sleep(20 * nb.SLEEP_CYCLES))
            e0.record(stream)
            for _ in range(20):
                fn()
            e1.record(stream)
            torch.cuda.synchronize()
            loop_us = e0.elapsed_time(e1) * 1e3 / 20
            acc.append({"op": op, "bytes": size, "event_us": per_call, "loop_us": loop_us})

if rank == 0:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / f"{args.config}-{args.round}.json", "w") as f:
        json.dump({"config": args.config, "round": args.round, "world": world, "pid": os.getpid(),
                   "pinned": {"spec": os.environ.get("BENCH_RANK_CPUS") or None,
                              "rank0_cpus": sorted(nb.PINNED) if nb.PINNED else None},
                   "medians": {k: statistics.median(v) for k, v in res.items()}, "reps": res,
                   "accuracy": acc, "accuracy_start_ns": acc_start_ns}, f)
dist.barrier()
dist.destroy_process_group()
