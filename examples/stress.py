"""A stress sweep in the spirit of the source article's stress-cta.py (§4.4), corrected:

    zcta run --out zcta-runs -- torchrun --standalone --nproc-per-node 2 examples/stress.py
    NCCL_CTA_POLICY=2 zcta run -- torchrun --standalone --nproc-per-node 2 examples/stress.py --symmetric

What the article's version got wrong, and what this one does instead:
- it passed one tensor as both input and output of all_to_all_single (in place, which
  NCCL does not promise to handle and which is not what a job does): here send and
  receive buffers are distinct;
- it timed with time.time() around synchronize(), so every figure included the host's
  launch and sync latency: here each call sits between its own pair of CUDA events,
  after a GPU sleep so the events time GPU work, not the host's enqueue;
- it printed a mean and called np.std without importing numpy: here the median, p99,
  min/max, standard deviation and the jitter (p99 / median − 1, and the coefficient of
  variation) per size and per rank, and a line for each above --jitter-limit;
- run under zcta, the same calls land in a run directory, so `zcta report` says which
  engine moved the bytes and where the time went.
"""

import argparse
import ctypes
import json

import torch
import torch.distributed as dist

import nccl_bench as nb


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,16M,128M,1G")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--op", choices=["all_to_all", "all_gather", "all_reduce"], default="all_to_all")
    ap.add_argument("--symmetric", action="store_true",
                    help="buffers in registered symmetric windows (with NCCL_CTA_POLICY=2: the copy-engine path)")
    ap.add_argument("--jitter-limit", type=float, default=0.10,
                    help="flag sizes whose p99 exceeds the median by more than this fraction")
    ap.add_argument("--json", help="write every rank's figures here (rank 0)")
    args = ap.parse_args()

    rank, world, dev = nb.setup()
    try:
        ctypes.CDLL(None).zcta_set_recording  # noqa: B018 (is the shim preloaded?)
    except AttributeError:
        if rank == 0:
            print("note: zcta is not loaded: CUDA-event figures only, no run directory "
                  "(run under `zcta run -- torchrun ...` to record)")
    sizes = [nb.parse_size(s) for s in args.sizes.split(",")]
    top = nb.elements(max(sizes), world)
    bufs = nb.buffers(dev, {"inp": top, "out": top}, args.symmetric)
    bufs["inp"].normal_()
    bufs["out"].normal_()
    stream = torch.cuda.Stream(device=dev)
    rows = []
    with torch.cuda.stream(stream):
        for size in sizes:
            n = nb.elements(size, world)
            inp, out = bufs["inp"][:n], bufs["out"][:n]
            fn = {
                "all_to_all": lambda: dist.all_to_all_single(out, inp),
                "all_gather": lambda: dist.all_gather_into_tensor(out, inp[:n // world]),
                "all_reduce": lambda: dist.all_reduce(out, op=dist.ReduceOp.AVG),  # stays finite
            }[args.op]
            s = nb.stats(nb.time_op(fn, stream, args.iters))
            rows.append({"bytes": size, **s})
    # Every rank's figures to rank 0: jitter is a property of the slowest rank.
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        print(f"{args.op}, {world} ranks, {args.iters} calls per size, CUDA events per call (us)")
        print(f"{'size':>8} {'rank':>4} {'median':>9} {'p99':>9} {'min':>9} {'max':>9} {'std':>8} "
              f"{'p99/med-1':>9} {'cv':>6} {'busbw GB/s':>10}")
        flagged = []
        for i, size in enumerate(sizes):
            for r in range(world):
                s = gathered[r][i]
                jit, cv = s["p99"] / s["median"] - 1, s["std"] / s["mean"]
                bw = nb.busbw_gbs(args.op, size, s["median"], world)
                print(f"{nb.fmt_bytes(size):>8} {r:>4} {s['median']:9.1f} {s['p99']:9.1f} {s['min']:9.1f} "
                      f"{s['max']:9.1f} {s['std']:8.1f} {jit:9.1%} {cv:6.1%} {bw:10.1f}")
                if jit > args.jitter_limit:
                    flagged.append(f"{nb.fmt_bytes(size)} on rank {r}: p99 {jit:.0%} above the median")
        for f in flagged:
            print(f"jitter above {args.jitter_limit:.0%}: {f}")
        if not flagged:
            print(f"jitter within {args.jitter_limit:.0%} (p99 vs median) at every size on every rank")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"op": args.op, "world": world, "sizes": sizes, "ranks": gathered}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
