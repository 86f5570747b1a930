"""Host-loop cost of tiny collectives: 8-byte all_reduce issued back to back (the case
where a profiler's per-call overhead shows most). Prints us/call for rank 0.
Run under torchrun, with or without LD_PRELOAD of the shim."""

import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
x = torch.ones(2, device=dev)  # 8 bytes
n = int(os.environ.get("HOST_LOOP_CALLS", "20000"))
for _ in range(2000):
    dist.all_reduce(x)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(n):
    dist.all_reduce(x)
torch.cuda.synchronize()
dt = time.perf_counter() - t0
if rank == 0:
    print(f"host_loop_us_per_call {dt / n * 1e6:.2f}")
dist.destroy_process_group()
