"""2-rank job for the GPU-capture checks (run under torchrun, with or without the shim).

Per iteration, on every data path: all_reduce, broadcast, reduce, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single with equal splits (ncclAlltoAll) and with
unequal splits (grouped Send/Recv), all_to_all with tensor lists, and a send/recv pair
(batch_isend_irecv). Then a timed phase: TIMED ops of 16 MiB each (all_reduce and
all_to_all_single) with CUDA events around each one (after a GPU sleep, so the events
time GPU work rather than the host's enqueue), written to <out>/rank<r>.json in issue
order, so the checker can compare zcta's GPU duration of the same op.

--mode ce: tensors come from NCCL's allocator and are registered as symmetric windows
(ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC) and ops run on a side stream, the
recipe of docs/dev/data-paths.md for the copy-engine path (set NCCL_CTA_POLICY=2 too).
--profile: the timed phase runs inside torch.profiler (CPU + CUDA activities); the
number of NCCL kernels in its trace is written to the JSON (coexistence check).
"""

import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from nccl_bench import SLEEP_CYCLES, nccl, register_windows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="default")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--timed", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    ce = args.mode == "ce"
    mib = 1 << 20
    n1 = mib // 4          # 1 MiB of float32
    n16 = 16 * mib // 4    # 16 MiB

    def alloc(n):
        return torch.empty(n, device=dev)

    if ce:
        backend = dist.group.WORLD._get_backend(dev)
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            bufs = {k: alloc(n) for k, n in
                    [("a", n1), ("b", n1), ("ag_in", n1), ("ag_out", n1 * world),
                     ("t_in", n16), ("t_out", n16)]}
        dist.barrier()
        register_windows(backend, list(bufs.values()))
        stream = torch.cuda.Stream(device=dev)
    else:
        bufs = {k: alloc(n) for k, n in
                [("a", n1), ("b", n1), ("ag_in", n1), ("ag_out", n1 * world),
                 ("t_in", n16), ("t_out", n16)]}
        stream = torch.cuda.current_stream(dev)
    for t in bufs.values():
        t.normal_()
    torch.cuda.synchronize()
    send_splits = [(p + 1) * 1000 + rank for p in range(world)]
    recv_splits = [(rank + 1) * 1000 + p for p in range(world)]
    u = torch.randn(sum(send_splits), device=dev)
    v = torch.empty(sum(recv_splits), device=dev)
    peer = (rank + 1) % world

    with torch.cuda.stream(stream):
        for _ in range(args.iters):
            dist.all_reduce(bufs["a"])
            dist.broadcast(bufs["b"], src=0)
            dist.reduce(bufs["b"], dst=0)
            dist.all_gather_into_tensor(bufs["ag_out"], bufs["ag_in"])
            dist.reduce_scatter_tensor(bufs["ag_in"], bufs["ag_out"])
            dist.all_to_all_single(bufs["b"], bufs["a"])
            dist.all_to_all_single(v, u, output_split_sizes=recv_splits, input_split_sizes=send_splits)
            dist.all_to_all(list(bufs["b"].chunk(world)), list(bufs["a"].chunk(world)))
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, bufs["a"], peer),
                                           dist.P2POp(dist.irecv, bufs["b"], (rank - 1) % world)])
            for r in reqs:
                r.wait()
        torch.cuda.synchronize()

        timed = []
        # The same ops called on NCCL directly, on the stream the events are on: no
        # torch stream hand-off inside the events.
        lib = nccl()
        comm = ctypes.c_void_p(dist.group.WORLD._get_backend(dev)._comm_ptr())
        raw = ctypes.c_void_p(stream.cuda_stream)
        tin, tout = ctypes.c_void_p(bufs["t_in"].data_ptr()), ctypes.c_void_p(bufs["t_out"].data_ptr())

        def direct_allreduce():
            rc = lib.ncclAllReduce(tin, tout, ctypes.c_size_t(n16), 7, 0, comm, raw)
            assert rc == 0, rc

        def direct_alltoall():
            rc = lib.ncclAlltoAll(tin, tout, ctypes.c_size_t(n16 // world), 7, comm, raw)
            assert rc == 0, rc

        def timed_phase():
            for i in range(args.timed):
                for name, fn in (("AllReduce", lambda: dist.all_reduce(bufs["t_in"])),
                                 ("AlltoAll", lambda: dist.all_to_all_single(bufs["t_out"], bufs["t_in"])),
                                 ("nccl:AllReduce", direct_allreduce),
                                 ("nccl:AlltoAll", direct_alltoall)):
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    # Keep the GPU busy while the host enqueues the op, so the events
                    # time the GPU's work, not the host's enqueue (an idle GPU would
                    # wait for it between e0 and the launch).
                    torch.cuda._sleep(SLEEP_CYCLES)
                    e0.record(stream)
                    fn()
                    e1.record(stream)
                    timed.append((name, e0, e1))
            torch.cuda.synchronize()

        prof_kernels = None
        if args.profile:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                timed_phase()
            trace = os.path.join(args.out, f"trace{rank}.json")
            prof.export_chrome_trace(trace)
            with open(trace) as f:
                ev = json.load(f)["traceEvents"]
            prof_kernels = sum(1 for e in ev if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower())
            # After the profiler: the job goes on.
            for _ in range(5):
                dist.all_reduce(bufs["a"])
            torch.cuda.synchronize()
        else:
            timed_phase()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"mode": args.mode, "iters": args.iters, "bytes_timed": n16 * 4,
                   "timed": [(n, e0.elapsed_time(e1) * 1e6) for n, e0, e1 in timed],
                   "profiler_nccl_kernels": prof_kernels}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
