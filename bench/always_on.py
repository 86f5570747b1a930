"""One process of bench/always_on.sh on ONE GPU: the workloads whose cost "always on"
is judged by, measured the same way whatever is attached (the launcher sets
LD_PRELOAD and the environment; --config only names it; `profiler` wraps the measured
part in torch.profiler with CPU and CUDA activities).

    python3 bench/always_on.py --config plain --out DIR [--round R] [--reps 7]

A 1-rank process group (NCCL), then, each the median of --reps repetitions:
- train_step_ms: a 6-layer d=768 transformer encoder (batch 8 x 128 tokens) under DDP
  with AdamW, 20 steps per repetition, each synchronised: launch-bound, several hundred
  kernels a step and DDP's bucket all_reduces;
- sr_8B_us, sr_1MiB_us, sr_64MiB_us: send/recv to itself on a 1-rank communicator
  (ncclGroupStart, ncclSend, ncclRecv, ncclGroupEnd: NCCL plans and launches one
  ncclDevKernel_SendRecv), back-to-back loops of 2,000 / 2,000 / 100 groups (us each);
- tsr_8B_us, tsr_1MiB_us: the same through torch's send/recv path (ProcessGroupNCCL's
  send and recv in torch's coalescing manager, as dist.batch_isend_irecv issues them;
  the backend's calls where torch's Python layer refuses a rank sending to itself);
- a2a_8B_us, a2a_1MiB_us, a2a_64MiB_us: dist.all_to_all_single (ncclAlltoAll; on one
  rank NCCL's one-rank path: a device copy), loops of 2,000 / 2,000 / 100 (us each);
- srp_8B_us, srp_1MiB_us: the raw send/recv group, each followed by 16 us of the program's
  own host work (a spin on the clock, the same on both sides of the A/B): an item of about
  25 us, a self send/recv op at the scale of the targets' small ops (~20-30 us; the 1 MiB
  copy takes the GPU less than the item, so items do not queue behind each other), whose
  A/B is against libnccl's own functions like sr_*'s, so its ratio is zcta's whole cost
  on the calling thread at that scale (the budget's timing included, which grows with
  the op's time);
- psr_8B_us, psr_1MiB_us: the raw send/recv loops with recording paused on both sides
  of the A/B: through the shim's paused path against libnccl's own functions, so that
  their ratio is what the paused path costs a group, the part of the shim's cost that
  the A/B of the loops through torch (tsr_*, a2a_*) leaves out.
With --ab, every repetition measures each loop in --ab-blocks (10) blocks with
recording on and as many with it paused (`zcta_set_recording(0)`: the shim forwards,
NCCL generates no profiler events), interleaved; without zcta in the process (plain,
torch.profiler) the same blocks run with nothing switched (an A/A: the method's own
noise, and the same work as a zcta process for the rotated comparison). In zcta's
processes the ratio of the two, per repetition, is an in-process A/B that the
spread between processes, and drifts within one, do not blur. While paused the shim
still keeps communicators, sequence numbers and group nesting, so for the raw
send/recv loops (sr_*), which call NCCL through ctypes, the paused blocks also call
libnccl's own functions (looked up on its handle, which the preload does not
interpose): their ratio is against the same calls without any of the shim's work
(`ab_off` says which baseline each loop had). The loops through torch cannot bypass
the shim: their ratio leaves out what the paused path costs. Three ratios are kept:
of the blocks' means (`ab`); the median over the block pairs (each recording block
against the paused block next to it) of their ratio (`ab_pairs`: one slow block, a
collection or a stall, moves it by little); and of the fastest block of each side
(`ab_fastest`, for loops whose speed jumps between two modes: the all_to_all loops on
one H200). Each block lasts at least --ab-block-ms (100 ms; the loop's length grows to
fit: five training steps, some 7,000 send/recv groups): the budget allows a burst of
20 us of timing after any quiet stretch, a paused block included, so a block of 2 ms
would pay ~1 % for it where a continuous loop pays it once; at 100 ms it is 0.02 %.
--ab-block-ms 0 keeps the loop lengths above. With --ab-fine N each repetition of a
loop ends with up to N pairs of single items (at most --ab-fine-s seconds of them),
recording switched at every item (`fine_ab`): the fine A/B (`ab_fine`: the median over
the pairs of their ratio; `ab_fine_items`: every item's ns, and which side of each pair
ran first). Not for the 64 MiB loops:
their items queue behind each other on the GPU, so one item's time is not its own. Every block's time per item is kept
(`ab_blocks`), for a training step with the part spent issuing its work (before the
synchronize that ends it): a cost that grows the step but not its issuing lies on the
GPU. Writes DIR/<config>-<round>.json.
"""

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import nccl_bench as nb  # noqa: E402

nb.one_rank_env()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

MEASURES = ["train_step_ms", "sr_8B_us", "sr_1MiB_us", "sr_64MiB_us", "tsr_8B_us", "tsr_1MiB_us",
            "a2a_8B_us", "a2a_1MiB_us", "a2a_64MiB_us", "psr_8B_us", "psr_1MiB_us", "srp_8B_us",
            "srp_1MiB_us"]

ap = argparse.ArgumentParser()
CONFIGS = ["plain", "default", "deep", "profiler", "off", "nomask", "noplugin", "disabled",
           "all", "tiny", "half", "events0"]
# A trailing digit N names the same configuration of another build (always_on.sh's SHIMN).
ap.add_argument("--config", required=True, choices=CONFIGS + [c + str(d) for c in CONFIGS for d in range(2, 10)])
ap.add_argument("--round", type=int, default=0)
ap.add_argument("--out", required=True)
ap.add_argument("--reps", type=int, default=7)
ap.add_argument("--measures", default=",".join(MEASURES))
ap.add_argument("--ab", action="store_true")
ap.add_argument("--ab-blocks", type=int, default=10)
ap.add_argument("--ab-block-ms", type=float, default=100.0)
ap.add_argument("--ab-fine", type=int, default=0,
                help="with --ab, also up to this many item pairs per repetition of each loop but "
                     "the 64 MiB ones, recording switched at every item (the fine A/B)")
ap.add_argument("--ab-fine-s", type=float, default=10.0,
                help="the fine A/B's pairs stop after this many seconds per loop and repetition")
ap.add_argument("--isolate", action="store_true",
                help="after the warm-up, keep this (the measuring) thread alone on one CPU core "
                     "and the process's other threads on the other cores (bench/affinity.py)")
args = ap.parse_args()

dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
torch.manual_seed(0)


def build_model():
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True)
    m = torch.nn.TransformerEncoder(layer, 6).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(m, device_ids=[0])
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-4)


model, opt = build_model()
x = torch.randn(8, 128, 768, device=dev)


# Seconds the training steps spent issuing their work (up to the synchronize that ends
# each): against a step's whole time, whether a cost lies on the host or on the GPU.
issued = [0.0]


def train_steps(n):
    for _ in range(n):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()
        issued[0] += time.perf_counter() - t
        torch.cuda.synchronize()


stream = torch.cuda.current_stream()
me = nb.SelfComm(stream)


# The raw send/recv loops' paused blocks call libnccl's own functions (`direct`).
direct = {}


def sr(nbytes):
    n = max(nbytes // 4, 2)
    a, b = torch.ones(n, device=dev), torch.empty(n, device=dev)
    run = me.sendrecv(a, b)
    direct[run] = me.sendrecv(a, b, direct=True)
    return run


# The host work that pads each of srp's groups (ns).
PAD_NS = 16_000


def padded(run):
    """`run`'s items one at a time, each followed by PAD_NS of host work: a spin on
    the clock for a fixed time after the item returned (not up to a deadline, which
    would hide a slower item)."""
    clock = time.perf_counter_ns

    def go(k):
        for _ in range(k):
            run(1)
            end = clock() + PAD_NS
            while clock() < end:
                pass

    return go


def srp(nbytes):
    run = sr(nbytes)
    p = padded(run)
    direct[p] = padded(direct[run])
    return p


def tsr(nbytes):
    """send/recv to itself through torch's own send/recv path: ProcessGroupNCCL's send
    and recv inside torch's coalescing manager (a group of ncclSend and ncclRecv, with
    torch's work around each call), as dist.batch_isend_irecv issues them. torch's
    Python layer refuses a rank sending to itself (ValueError), so where it does the
    loop calls the backend's send and recv under the same coalescing manager, which is
    what batch_isend_irecv does past that check. None where neither runs."""
    n = max(nbytes // 4, 2)
    a, b = torch.ones(n, device=dev), torch.empty(n, device=dev)
    ops = [dist.P2POp(dist.isend, a, 0), dist.P2POp(dist.irecv, b, 0)]

    def public(k):
        for _ in range(k):
            for w in dist.batch_isend_irecv(ops):
                w.wait()

    c10d = dist.distributed_c10d
    pg = c10d._get_default_group()

    def backend(k):
        be = pg._get_backend(dev)
        for _ in range(k):
            with c10d._coalescing_manager(group=pg, device=dev, async_ops=True) as cm:
                be.send([a], 0, 0)
                be.recv([b], 0, 0)
            cm.wait()

    for name, run in (("batch_isend_irecv", public), ("the backend's send and recv", backend)):
        try:
            b.zero_()
            run(2)
            torch.cuda.synchronize()
            if not bool((b == 1).all()):
                raise RuntimeError("the received tensor does not hold what was sent")
        except Exception as e:  # noqa: BLE001
            print(f"torch send/recv to itself through {name} failed: {e}", file=sys.stderr)
            continue
        print(f"tsr: torch send/recv to itself through {name}", file=sys.stderr)
        return run
    return None


def a2a(nbytes):
    n = max(nbytes // 4, 2)
    a, b = torch.ones(n, device=dev), torch.empty(n, device=dev)

    def run(k):
        for _ in range(k):
            dist.all_to_all_single(b, a)

    return run


def per_item(fn, k):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn(k)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / k


MiB = 1 << 20
work = {
    "train_step_ms": (train_steps, 20, 1e3),
    "sr_8B_us": (sr(8), 2000, 1e6),
    "sr_1MiB_us": (sr(MiB), 2000, 1e6),
    "sr_64MiB_us": (sr(64 * MiB), 100, 1e6),
    "tsr_8B_us": (tsr(8), 2000, 1e6),
    "tsr_1MiB_us": (tsr(MiB), 2000, 1e6),
    "a2a_8B_us": (a2a(8), 2000, 1e6),
    "a2a_1MiB_us": (a2a(MiB), 2000, 1e6),
    "a2a_64MiB_us": (a2a(64 * MiB), 100, 1e6),
    "psr_8B_us": (sr(8), 2000, 1e6),
    "psr_1MiB_us": (sr(MiB), 2000, 1e6),
    "srp_8B_us": (srp(8), 2000, 1e6),
    "srp_1MiB_us": (srp(MiB), 2000, 1e6),
}
# Loops whose A/B keeps recording paused on both sides (psr_*).
PAUSED_BOTH = {"psr_8B_us", "psr_1MiB_us"}
wanted = [m for m in args.measures.split(",") if m and work[m][0] is not None]
# Warm-up: connections, allocator, clocks; and each loop's item time, which sets
# the A/B's block length.
train_steps(10)
item_s = {m: per_item(work[m][0], max(work[m][1] // 10, 2)) for m in wanted}
placement = None
if args.isolate:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import affinity  # noqa: E402

    placement = affinity.isolate_this_thread()
    print(args.config, args.round, "placement:", placement, file=sys.stderr)

prof = contextlib.nullcontext()
if args.config.rstrip("23456789") == "profiler":
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
import ctypes  # noqa: E402

set_recording = None
if args.ab:
    set_recording = getattr(ctypes.CDLL(None), "zcta_set_recording", None)
    if set_recording is not None:
        set_recording.argtypes, set_recording.restype = [ctypes.c_int], ctypes.c_int
    else:
        # Without zcta (plain, torch.profiler) the same blocks run with nothing to
        # switch: the process does the same work as a zcta one, so the rotated
        # processes compare like with like, and its "A/B" is an A/A, the method's
        # own noise.
        def set_recording(_on):
            return 0


def fine_ab(m, n, seconds):
    """The fine A/B of loop `m`: `n` pairs of single items (fewer where they would take
    more than `seconds`), one with recording on and one paused (for psr paused on both
    sides; for the raw loops the paused side calls libnccl's own functions; a training
    step is an item, synchronised at its end), the order of each pair drawn at random
    (seeded by the configuration, round and loop: a pattern of the loop's own with any
    period cannot fall on one side more than the other, as one of period 4 does on
    alternating orders on-off, off-on, ...), each item timed alone and the switch left
    out of its time. Neighbouring items share the
    machine's state of the moment, so the drifts and two speeds that move whole blocks
    (docs/PERFORMANCE.md) fall on both sides of nearly every pair. What it measures is
    what the calling thread pays per item: work zcta does later or on another thread
    (the writer) falls on both sides alike, which the block pairs do not let happen."""
    fn = work[m][0]
    off_fn = direct.get(fn, fn)
    record = m not in PAUSED_BOTH
    clock = time.perf_counter_ns
    got = fine[m]
    order = random.Random(f"{args.config}/{args.round}/{m}/{len(got['on'])}")
    stop = time.monotonic() + seconds
    for i in range(n):
        if time.monotonic() > stop:
            break
        on_first = order.random() < 0.5
        got["on_first"].append(on_first)
        for on in ((True, False) if on_first else (False, True)):
            set_recording(int(on and record))
            f = fn if on else off_fn
            t = clock()
            f(1)
            got["on" if on else "off"].append(clock() - t)


res = {m: [] for m in wanted}
paused = {m: [] for m in wanted}
# The fastest block of each side (A/B), for loops whose speed jumps between modes.
fastest = {True: {}, False: {}}
# Items per A/B block, per loop.
ab_items = {}
# Per repetition, the median over its block pairs of recording / paused.
pairs = {m: [] for m in wanted}
# The fine A/B: each item timed alone, recording switched at every item (ns; pair i is
# on[i] with off[i]).
fine = {m: {"on": [], "off": [], "on_first": []} for m in wanted}
# Every block, in the order run: [recording?, seconds per item, of which issuing
# (training steps only, else null)] (a slow block's place among the others; where a
# cost lies).
block_log = {m: [] for m in wanted}
with prof:
    for rep in range(args.reps):
        for m in wanted:
            fn, k, scale = work[m]
            if set_recording is None:
                res[m].append(per_item(fn, k) * scale)
                continue
            # Interleaved in blocks (paused, recording, recording, paused, ...), so that
            # a drift of the machine's speed within the repetition falls on both.
            sums = {True: 0.0, False: 0.0}
            ratios = []
            blocks = max(min(args.ab_blocks, k // 2), 1)
            per_block = max(k // blocks, int(args.ab_block_ms / 1e3 / max(item_s[m], 1e-9)) + 1)
            ab_items[m] = per_block
            for b in range(blocks):
                pair = {}
                for on in ((False, True) if (rep + b) % 2 == 0 else (True, False)):
                    set_recording(int(on and m not in PAUSED_BOTH))
                    issued[0] = 0.0
                    t = per_item(fn if on else direct.get(fn, fn), per_block)
                    sums[on] += t
                    pair[on] = t
                    fastest[on][m] = min(fastest[on].get(m, t), t)
                    block_log[m].append([on, t, issued[0] / per_block if fn is train_steps else None])
                ratios.append(pair[True] / pair[False])
            if args.ab_fine > 0 and not m.endswith("_64MiB_us"):
                fine_ab(m, args.ab_fine, args.ab_fine_s)
            set_recording(1)
            pairs[m].append(statistics.median(ratios))
            res[m].append(sums[True] / blocks * scale)
            paused[m].append(sums[False] / blocks * scale)
me.destroy()


def threads():
    """CPU seconds and last CPU of each of this process's threads, by name (the
    writer's share of a core next to the measured loops)."""
    tick = os.sysconf("SC_CLK_TCK")
    got = {}
    for t in Path("/proc/self/task").iterdir():
        try:
            name = (t / "comm").read_text().strip()
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # Fields after the name start at field 3: utime 14, stime 15, processor 39.
        cpu = (int(f[11]) + int(f[12])) / tick
        e = got.setdefault(name, {"cpu_s": 0.0, "n": 0, "last_cpu": []})
        e["cpu_s"] += cpu
        e["n"] += 1
        e["last_cpu"].append(int(f[36]))
    return got


thr = threads()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
(out / f"{args.config}-{args.round}.json").write_text(
    json.dumps({"config": args.config, "round": args.round, "reps": res,
                "median": {m: statistics.median(v) for m, v in res.items()}, "threads": thr,
                "placement": placement,
                **({"paused": paused,
                    "ab": {m: statistics.median(a / b for a, b in zip(res[m], paused[m])) for m in wanted},
                    "ab_pairs": {m: statistics.median(pairs[m]) for m in wanted},
                    "ab_fastest": {m: fastest[True][m] / fastest[False][m] for m in wanted},
                    "ab_block_items": ab_items,
                    "ab_blocks": block_log,
                    **({"ab_fine": {m: statistics.median(a / b for a, b in zip(v["on"], v["off"]))
                                    for m, v in fine.items() if v["on"]},
                        "ab_fine_items": {m: v for m, v in fine.items() if v["on"]}}
                       if args.ab_fine > 0 else {}),
                    "ab_off": {m: ("direct, both paused" if m in PAUSED_BOTH else
                                   "direct" if work[m][0] in direct else "paused") for m in wanted}}
                   if set_recording is not None else {})}))
# The measures' line last (scripts read the last line).
print(args.config, args.round, "threads:", ", ".join(f"{k} {v['cpu_s']:.2f} s cpu {v['last_cpu']}"
                                                    for k, v in sorted(thr.items(), key=lambda kv: -kv[1]["cpu_s"])[:6]),
      flush=True)
print(args.config, args.round, " ".join(f"{m}={statistics.median(v):.3f}" for m, v in res.items()), flush=True)
dist.destroy_process_group()
