"""A small, real training loop for torchrun: a DDP-replicated dense block followed by an
expert-parallel mixture-of-experts layer, trained on random data to imitate a fixed
random "teacher" network (so the loss really falls).

    torchrun --standalone --nproc-per-node 2 examples/train.py
    zcta run -- torchrun --standalone --nproc-per-node 2 examples/train.py   # recorded

What it puts on the wire each step, the traffic of a real MoE job:
- the router's token counts per expert, exchanged with an equal-split
  `all_to_all_single` (NCCL >= 2.28: one ncclAlltoAll);
- the tokens themselves, dispatched to the rank that owns their expert and combined
  back, with unequal splits (grouped ncclSend/ncclRecv), forward and backward;
- the dense block's gradients, all-reduced by DistributedDataParallel in buckets;
- `--dispatch capacity` pads every expert to a fixed capacity instead (equal splits:
  ncclAlltoAll for the tokens too), the way capacity-factor MoE layers do.

Each rank owns `--experts-per-rank` experts; their weights are rank-local (expert
parallelism), so DDP replicates only the dense block and the router. Random data only:
no downloads. Rank 0 prints the loss every `--log-every` steps and, at the end, the
median step time. `--json FILE` writes the per-step times. bench/gpu_job.py and
bench/gpu_ab.py import Model from here to time its step.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dfn
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=4096, help="tokens per rank per step")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=2048, help="expert MLP width")
    ap.add_argument("--experts-per-rank", type=int, default=2)
    ap.add_argument("--dispatch", choices=["dropless", "capacity"], default="dropless")
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write per-step times (seconds) here (rank 0)")
    return ap.parse_args(argv)


class Dense(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Front(nn.Module):
    """The replicated part: a dense block and the MoE router (top-1)."""

    def __init__(self, dim, n_experts):
        super().__init__()
        self.dense = Dense(dim)
        self.gate = nn.Linear(dim, n_experts, bias=False)

    def forward(self, x):
        h = self.dense(x)
        weight, expert = self.gate(h).softmax(-1).max(-1)
        return h, weight, expert


class Experts(nn.Module):
    """This rank's experts: rank-local weights, one MLP each."""

    def __init__(self, n, dim, hidden):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(n, dim, hidden) * dim**-0.5)
        self.w2 = nn.Parameter(torch.randn(n, hidden, dim) * hidden**-0.5)

    def forward(self, x, counts):
        """x: tokens grouped by local expert; counts: tokens per local expert."""
        outs = []
        for e, chunk in enumerate(x.split(counts)):
            outs.append(F.gelu(chunk @ self.w1[e]) @ self.w2[e])
        return torch.cat(outs) if outs else x


class Model:
    def __init__(self, args, world, rank, dev):
        self.world, self.rank, self.dev, self.args = world, rank, dev, args
        self.epr = args.experts_per_rank
        self.n_experts = world * self.epr
        torch.manual_seed(args.seed)  # same dense/router init on every rank
        self.front = DDP(Front(args.dim, self.n_experts).to(dev),
                         device_ids=[dev.index] if dev.type == "cuda" else None)
        torch.manual_seed(args.seed + 1 + rank)  # experts differ per rank
        self.experts = Experts(self.epr, args.dim, args.hidden).to(dev)
        params = list(self.front.parameters()) + list(self.experts.parameters())
        self.opt = torch.optim.AdamW(params, lr=args.lr)
        # The teacher (fixed, identical on all ranks) defines the target.
        g = torch.Generator(device="cpu").manual_seed(1234)
        self.teacher = (torch.randn(args.dim, args.dim, generator=g) * args.dim**-0.5).to(dev)
        self.gen = torch.Generator(device=dev).manual_seed(args.seed + 100 + rank)

    def moe(self, h, weight, expert):
        """Route each token to its expert's rank, run it, bring it back."""
        world, epr = self.world, self.epr
        order = expert.argsort(stable=True)
        per_expert = torch.bincount(expert, minlength=self.n_experts)
        if self.args.dispatch == "capacity":
            cap = int(self.args.capacity_factor * h.shape[0] / self.n_experts) + 1
            # Keep at most `cap` tokens per expert, pad each expert's slot to `cap`.
            slots = torch.zeros(self.n_experts * cap, h.shape[1], device=h.device, dtype=h.dtype)
            start = torch.cumsum(per_expert, 0) - per_expert
            pos = torch.arange(h.shape[0], device=h.device) - start[expert[order]]
            keep = pos < cap
            idx = expert[order][keep] * cap + pos[keep]
            slots = slots.index_copy(0, idx, h[order][keep])
            recv = dfn.all_to_all_single(torch.empty_like(slots), slots)  # equal splits
            # recv: from each source rank, epr experts x cap tokens.
            x = recv.view(world, epr, cap, -1).transpose(0, 1).reshape(epr * world * cap, -1)
            y = self.experts(x, [world * cap] * epr)
            y = y.view(epr, world, cap, -1).transpose(0, 1).reshape(world * epr * cap, -1)
            back = dfn.all_to_all_single(torch.empty_like(y), y)
            out = torch.zeros_like(h)
            out = out.index_copy(0, order[keep], back[idx])
            return out * weight.unsqueeze(-1)
        # Dropless: exchange the counts (equal splits: ncclAlltoAll), then the tokens
        # with the splits those counts give (unequal: grouped ncclSend/ncclRecv).
        counts_in = torch.empty_like(per_expert)
        dist.all_to_all_single(counts_in, per_expert)
        send_splits = per_expert.view(world, epr).sum(1).tolist()
        recv_counts = counts_in.view(world, epr)  # [source rank, local expert]
        recv_splits = recv_counts.sum(1).tolist()
        x = dfn.all_to_all_single(h.new_empty(sum(recv_splits), h.shape[1]), h[order],
                                  output_split_sizes=recv_splits, input_split_sizes=send_splits)
        # Regroup received tokens by local expert (they arrive grouped by source rank).
        src_expert = torch.repeat_interleave(
            torch.arange(epr, device=h.device).repeat(world), recv_counts.flatten())
        by_expert = src_expert.argsort(stable=True)
        y = self.experts(x[by_expert], recv_counts.sum(0).tolist())
        y = y[by_expert.argsort()]
        back = dfn.all_to_all_single(h.new_empty(h.shape[0], h.shape[1]), y,
                                     output_split_sizes=send_splits, input_split_sizes=recv_splits)
        out = torch.empty_like(h).index_copy(0, order, back)
        return out * weight.unsqueeze(-1)

    def step(self):
        a = self.args
        x = torch.randn(a.batch, a.dim, device=self.dev, generator=self.gen)
        target = torch.tanh(x @ self.teacher)
        h, weight, expert = self.front(x)  # through DDP, so its gradients all-reduce
        y = h + self.moe(h, weight, expert)
        loss = F.mse_loss(y, target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


def setup():
    """NCCL on this rank's GPU; without CUDA, gloo on the CPU (a quick check of the
    model code only: nothing for zcta to see)."""
    if not torch.cuda.is_available():
        dist.init_process_group("gloo")
        return torch.device("cpu")
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    return dev


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main(argv=None):
    args = parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = setup()
    model = Model(args, world, rank, dev)
    times, first = [], None
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        loss = model.step()
        sync(dev)
        times.append(time.perf_counter() - t0)
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            # The mean over ranks: one more all_reduce, as real jobs log it.
            avg = loss.detach().clone()
            dist.all_reduce(avg)  # SUM then divide: gloo has no AVG
            avg /= world
            first = first if first is not None else avg.item()
            if rank == 0:
                print(f"step {step:5d}  loss {avg.item():.4f}  step {times[-1] * 1e3:7.2f} ms", flush=True)
    if rank == 0:
        steady = times[len(times) // 5:] or times
        print(f"done: {args.steps} steps on {world} ranks, loss {first:.4f} -> {avg.item():.4f}, "
              f"median step {statistics.median(steady) * 1e3:.2f} ms ({args.dispatch} dispatch)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"step_s": times, "loss_first": first, "loss_last": avg.item()}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
