"""zcta doctor --probe: a tiny 2-rank NCCL exchange, run by torch.distributed.run.

Each rank runs all_reduce, all_gather_into_tensor, all_to_all_single (equal splits,
so ncclAlltoAll), reduce_scatter_tensor and broadcast on messages of --mib MiB,
--iters times. With --symmetric (zcta doctor passes it when NCCL_CTA_POLICY=2) the
buffers come from NCCL's allocator, are registered as symmetric windows
(ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC) and the collectives run on a side
stream: the torch 2.11 recipe for NCCL's copy-engine path. The doctor then reads what
the zcta shim recorded. Lines starting with "zcta-probe:" are for the doctor.

It is embedded in the zcta binary and runs from a temporary directory on machines
without this repository, so it cannot import examples/nccl_bench.py: the window
registration below repeats that file's `register_windows` on purpose.
"""

import argparse
import ctypes
import os
import sys


def say(msg):
    print(f"zcta-probe: {msg}", flush=True)


def nccl_api():
    """NCCL's API: the zcta shim's exports when it is preloaded (so calls are
    recorded), else the libnccl this process mapped."""
    try:
        lib = ctypes.CDLL(None)
        lib.ncclCommWindowRegister  # noqa: B018 (probe for the symbol)
        return lib
    except (OSError, AttributeError):
        with open("/proc/self/maps") as maps:
            path = next(line.split()[-1] for line in maps if "libnccl.so" in line and "zcta" not in line)
        return ctypes.CDLL(path)


def register(backend, tensors):
    f = nccl_api().ncclCommWindowRegister
    f.restype = ctypes.c_int
    comm = ctypes.c_void_p(backend._comm_ptr())
    for t in tensors:
        win = ctypes.c_void_p()
        rc = f(comm, ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(t.numel() * t.element_size()),
               ctypes.byref(win), ctypes.c_int(1))  # 1 = NCCL_WIN_COLL_SYMMETRIC
        if rc != 0:
            raise RuntimeError(f"ncclCommWindowRegister returned {rc}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--symmetric", action="store_true")
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        say(f"error: cannot import torch ({e})")
        sys.exit(3)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    if torch.cuda.device_count() < world:
        say(f"error: needs {world} GPUs, torch sees {torch.cuda.device_count()}")
        sys.exit(3)
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    n = args.mib * (1 << 20) // 4  # float32 elements of one message
    shapes = {"ar": n, "ag_in": n // world, "ag_out": n, "a2a_in": n, "a2a_out": n,
              "rs_in": n, "rs_out": n // world, "bc": n}
    if args.symmetric:
        backend = dist.group.WORLD._get_backend(dev)
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            bufs = {k: torch.empty(v, device=dev) for k, v in shapes.items()}
        dist.barrier()
        register(backend, bufs.values())
        stream = torch.cuda.Stream(device=dev)
    else:
        bufs = {k: torch.empty(v, device=dev) for k, v in shapes.items()}
        stream = torch.cuda.current_stream(dev)
    for t in bufs.values():
        t.fill_(rank + 1)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        for _ in range(args.iters):
            dist.all_reduce(bufs["ar"])
            dist.all_gather_into_tensor(bufs["ag_out"], bufs["ag_in"])
            dist.all_to_all_single(bufs["a2a_out"], bufs["a2a_in"])
            dist.reduce_scatter_tensor(bufs["rs_out"], bufs["rs_in"])
            dist.broadcast(bufs["bc"], src=0)
    torch.cuda.synchronize()
    # The all_gather result must hold every rank's value in its slot.
    chunk = n // world
    got = [bufs["ag_out"][r * chunk].item() for r in range(world)]
    if got != [float(r + 1) for r in range(world)]:
        say(f"error: all_gather gave {got}")
        sys.exit(4)
    dist.destroy_process_group()
    say(f"rank {rank} ok symmetric={int(args.symmetric)}")


if __name__ == "__main__":
    main()
