"""Workers started by Python multiprocessing instead of torchrun.

usage: mp_job.py fork|spawn NSTEPS
- fork: a parent that never touched CUDA or NCCL forks one worker per GPU; workers
  leave with os._exit (as multiprocessing fork children do), so only the shim's _exit
  hook can close their files.
- spawn: torch.multiprocessing.spawn; the shim gives all workers their parent's run id.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world: int, steps: int) -> None:
    os.environ["RANK"] = str(rank)
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    x = torch.ones(1024, device=dev)
    for _ in range(steps):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main() -> None:
    mode, steps = sys.argv[1], int(sys.argv[2])
    world = torch.cuda.device_count()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if mode == "spawn":
        mp.spawn(worker, args=(world, steps), nprocs=world, join=True)
        return
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=worker, args=(r, world, steps)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))


if __name__ == "__main__":
    main()
