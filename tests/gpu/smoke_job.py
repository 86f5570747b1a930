"""2-rank torch.distributed job for the GPU smoke test (run under torchrun).

Every step issues: all_reduce, all_to_all_single with equal splits (ncclAlltoAll),
all_to_all_single with unequal splits (grouped ncclSend/ncclRecv), all_gather_into_tensor,
reduce_scatter_tensor, broadcast. Inputs are deterministic per (rank, step); every
result is folded into a SHA-256 so a run with the shim can be compared bit for bit
with a run without it. Writes <out>/rank<r>.json: digest, per-op call counts and the
message sizes (nccl-tests convention) the profiler must report.
"""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)

    digest = hashlib.sha256()
    f32 = 4
    n_ar, n_a2a, n_ag, n_rs, n_bc = 65536, 8192 * world, 12288, 20480 * world, 4096
    # Unequal splits: rank r sends (p + 1) * 1000 + r elements to peer p.
    send_splits = [(p + 1) * 1000 + rank for p in range(world)]
    recv_splits = [(rank + 1) * 1000 + p for p in range(world)]
    expect = {
        "AllReduce": {"bytes": n_ar * f32, "calls": 0},
        "AlltoAll": {"bytes": n_a2a * f32, "calls": 0},  # count per peer x nranks x size
        "AllGather": {"bytes": n_ag * world * f32, "calls": 0},
        "ReduceScatter": {"bytes": (n_rs // world) * world * f32, "calls": 0},
        "Broadcast": {"bytes": n_bc * f32, "calls": 0},
        "a2a_unequal": {"send_bytes": [s * f32 for s in send_splits],
                        "recv_bytes": [s * f32 for s in recv_splits], "calls": 0},
    }
    g = torch.Generator(device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(args.steps):
        g.manual_seed(1000003 * rank + step)
        x = torch.randn(n_ar, device=dev, generator=g)
        dist.all_reduce(x)
        expect["AllReduce"]["calls"] += 1

        a = torch.randn(n_a2a, device=dev, generator=g)
        b = torch.empty_like(a)
        dist.all_to_all_single(b, a)
        expect["AlltoAll"]["calls"] += 1

        u = torch.randn(sum(send_splits), device=dev, generator=g)
        v = torch.empty(sum(recv_splits), device=dev)
        dist.all_to_all_single(v, u, output_split_sizes=recv_splits, input_split_sizes=send_splits)
        expect["a2a_unequal"]["calls"] += 1

        s = torch.randn(n_ag, device=dev, generator=g)
        ag = torch.empty(n_ag * world, device=dev)
        dist.all_gather_into_tensor(ag, s)
        expect["AllGather"]["calls"] += 1

        r_in = torch.randn(n_rs, device=dev, generator=g)
        r_out = torch.empty(n_rs // world, device=dev)
        dist.reduce_scatter_tensor(r_out, r_in)
        expect["ReduceScatter"]["calls"] += 1

        c = torch.randn(n_bc, device=dev, generator=g)
        dist.broadcast(c, src=step % world)
        expect["Broadcast"]["calls"] += 1

        for t in (x, b, v, ag, r_out, c):
            digest.update(t.cpu().numpy().tobytes())
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "digest": digest.hexdigest(),
                   "steps": args.steps, "elapsed_s": elapsed, "expect": expect}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
