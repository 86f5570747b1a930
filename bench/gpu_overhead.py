"""One measurement round for bench/gpu_overhead.sh (run under torchrun, 2 ranks).

Measures, on the configuration this process was started with (plain, under the shim,
or inside torch.profiler with --profiler):
- host_loop_us: 8-byte all_reduce issued back to back, wall time per call;
- a2a_<size>_us: all_to_all_single of 1 MiB / 128 MiB, median of CUDA-event times;
- a2a_<size>_loop_us: the same ops back to back, wall time per op (throughput).
Rank 0 prints one JSON line prefixed with RESULT.
"""

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--profiler", action="store_true")
ap.add_argument("--calls", type=int, default=5000)
args = ap.parse_args()

rank = int(os.environ["RANK"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
world = dist.get_world_size()


def host_loop(n):
    x = torch.ones(2, device=dev)  # 8 bytes
    for _ in range(200):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def a2a(nbytes, n):
    a = torch.randn(nbytes // 4, device=dev)
    b = torch.empty_like(a)
    for _ in range(5):
        dist.all_to_all_single(b, a)
    torch.cuda.synchronize()
    ev = []
    for _ in range(n):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dist.all_to_all_single(b, a)
        e1.record()
        ev.append((e0, e1))
    torch.cuda.synchronize()
    med = statistics.median(e0.elapsed_time(e1) * 1e3 for e0, e1 in ev)
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_to_all_single(b, a)
    torch.cuda.synchronize()
    return med, (time.perf_counter() - t0) / n * 1e6


ctx = contextlib.nullcontext()
if args.profiler:
    from torch.profiler import ProfilerActivity, profile
    ctx = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
with ctx:
    res = {"config": args.config, "host_loop_us": host_loop(args.calls)}
    res["a2a_1m_us"], res["a2a_1m_loop_us"] = a2a(1 << 20, 300)
    res["a2a_128m_us"], res["a2a_128m_loop_us"] = a2a(128 << 20, 40)
if rank == 0:
    print("RESULT " + json.dumps(res), flush=True)
dist.barrier()
dist.destroy_process_group()
