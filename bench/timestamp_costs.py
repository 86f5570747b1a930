"""What it costs the program's GPU work to stamp a communication stream, by method: no
stamp, a CUDA event without timing (CU_EVENT_DISABLE_TIMING), a CUDA event with timing
(what zcta's default records), and a one-thread kernel that writes %globaltimer into
pinned host memory (`stamp`).

    python3 bench/timestamp_costs.py [--out FILE.json]

Parts (each prints one table line per method):
- overlap: a compute stream runs a chain of short sleep kernels, queued far ahead of
  the GPU (as a launch-bound training step's backward is); every `--every` kernels the
  communication stream waits on a marker of the compute stream (as torch makes the
  NCCL stream wait), takes two stamps and records an end marker, and the compute stream
  waits on the last end marker before its final kernel. Wall time per chain, median of
  rotated repetitions, and its ratio to no stamps.
- idle: the same chain, with the stamps on a third, idle stream that waits on nothing.
- latency: while the compute stream runs a ~2 ms sleep, one stamp on an idle stream:
  host time until it is seen done (event query / memory poll).
- stamp kernel facts: host ns per launch, stream time per stamp back to back, the
  %globaltimer's step (successive distinct reads in one thread), and a sleep kernel
  bracketed by timing events and by stamps: the two durations' difference.
"""

import argparse
import ctypes as C
import json
import statistics as st
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import nccl_bench as nb  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out")
ap.add_argument("--reps", type=int, default=7)
ap.add_argument("--kernels", type=int, default=400)
ap.add_argument("--every", type=int, default=10)
ap.add_argument("--sleep-cycles", type=int, default=20_000)
args = ap.parse_args()

dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
torch.zeros(1, device=dev)
cu = C.CDLL("libcuda.so.1")
P = C.c_void_p


def ck(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


# zcta's stamp kernel (the shim's PTX: examples/nccl_bench.py's stamp_ptx), and one
# that reads %globaltimer until it changes, n times, to find the timer's step.
PTX = nb.stamp_ptx().encode() + b"""
.visible .entry steps(.param .u64 p, .param .u32 n)
{
  .reg .u64 %rd<8>;
  .reg .u32 %r<4>;
  .reg .pred %q;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, 0;
  mov.u64 %rd2, %globaltimer;
LOOP:
  mov.u64 %rd3, %globaltimer;
  setp.eq.u64 %q, %rd3, %rd2;
  @%q bra LOOP;
  sub.u64 %rd4, %rd3, %rd2;
  mul.wide.u32 %rd5, %r2, 8;
  add.u64 %rd6, %rd1, %rd5;
  st.volatile.global.u64 [%rd6], %rd4;
  mov.u64 %rd2, %rd3;
  add.u32 %r2, %r2, 1;
  setp.lt.u32 %q, %r2, %r1;
  @%q bra LOOP;
  ret;
}
"""

mod = P()
ck(cu.cuModuleLoadData(C.byref(mod), C.c_char_p(PTX + b"\0")), "cuModuleLoadData")
f_stamp, f_steps = P(), P()
ck(cu.cuModuleGetFunction(C.byref(f_stamp), mod, b"zcta_stamp"), "zcta_stamp")
ck(cu.cuModuleGetFunction(C.byref(f_steps), mod, b"steps"), "steps")
SLOTS = 1 << 16
host = P()
ck(cu.cuMemHostAlloc(C.byref(host), SLOTS * 8, 0x02 | 0x01), "cuMemHostAlloc")  # DEVICEMAP|PORTABLE
devp = C.c_uint64()
ck(cu.cuMemHostGetDevicePointer_v2(C.byref(devp), host, 0), "cuMemHostGetDevicePointer")
slots = (C.c_uint64 * SLOTS).from_address(host.value)
nxt = [0]


def launch(f, stream, *params):
    holders = [C.c_uint64(p) if isinstance(p, int) and p > 0xFFFFFFFF else C.c_uint32(p) for p in params]
    arr = (P * len(holders))(*[C.cast(C.pointer(h), P) for h in holders])
    ck(cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, P(stream), arr, None), "cuLaunchKernel")


def stamp(stream):
    """Launches one stamp kernel; returns its slot."""
    i = nxt[0] % SLOTS
    nxt[0] += 1
    slots[i] = 0
    holder = C.c_uint64(devp.value + 8 * i)
    arr = (P * 1)(C.cast(C.pointer(holder), P))
    ck(cu.cuLaunchKernel(f_stamp, 1, 1, 1, 1, 1, 1, 0, P(stream), arr, None), "cuLaunchKernel")
    return i


def event(timing):
    e = P()
    ck(cu.cuEventCreate(C.byref(e), 0 if timing else 2), "cuEventCreate")
    return e


def rec(e, stream):
    ck(cu.cuEventRecord(e, P(stream)), "cuEventRecord")


POOL = {True: [event(True) for _ in range(4096)], False: [event(False) for _ in range(4096)]}
pos = {True: 0, False: 0}


def take(timing):
    p = POOL[timing]
    e = p[pos[timing] % len(p)]
    pos[timing] += 1
    return e


def mark(method, stream):
    if method == "none":
        return
    if method == "stamp":
        stamp(stream)
        return
    rec(take(method == "event_timing"), stream)


METHODS = ["none", "event_notiming", "event_timing", "stamp"]
comp = torch.cuda.Stream()
comm = torch.cuda.Stream()
idle = torch.cuda.Stream()


def chain(method, where):
    """One chain of sleep kernels on `comp` with stamps every `every` kernels."""
    cs, ms = comp.cuda_stream, (comm if where == "overlap" else idle).cuda_stream
    last = None
    with torch.cuda.stream(comp):
        for k in range(args.kernels):
            torch.cuda._sleep(args.sleep_cycles)
            if k % args.every == args.every - 1:
                if where == "overlap":
                    m = take(False)
                    rec(m, cs)
                    ck(cu.cuStreamWaitEvent(P(ms), m, 0), "cuStreamWaitEvent")
                mark(method, ms)
                mark(method, ms)
                last = take(False)
                rec(last, ms)
        ck(cu.cuStreamWaitEvent(P(cs), last, 0), "cuStreamWaitEvent")
        torch.cuda._sleep(args.sleep_cycles)


def wall(method, where):
    torch.cuda.synchronize()
    t = time.perf_counter()
    chain(method, where)
    torch.cuda.synchronize()
    return time.perf_counter() - t


out = {"device": torch.cuda.get_device_name(0), "args": vars(args)}
for where in ("overlap", "idle"):
    for m in METHODS:
        wall(m, where)
    got = {m: [] for m in METHODS}
    for r in range(args.reps):
        order = METHODS[r % 4:] + METHODS[:r % 4]
        for m in order:
            got[m].append(wall(m, where))
    base = st.median(got["none"])
    out[where] = {m: {"median_ms": st.median(v) * 1e3, "ratio": st.median(v) / base, "all_ms": [x * 1e3 for x in v]} for m, v in got.items()}

# latency: one stamp on an idle stream while another stream runs ~2 ms.
lat = {}
for m in METHODS[1:]:
    xs = []
    for _ in range(15):
        torch.cuda.synchronize()
        with torch.cuda.stream(comp):
            torch.cuda._sleep(4_000_000)
        time.sleep(0.0002)
        t = time.perf_counter()
        if m == "stamp":
            i = stamp(idle.cuda_stream)
            while slots[i] == 0:
                pass
        else:
            e = take(m == "event_timing")
            rec(e, idle.cuda_stream)
            while cu.cuEventQuery(e) != 0:
                pass
        xs.append((time.perf_counter() - t) * 1e6)
    lat[m] = {"median_us": st.median(xs), "max_us": max(xs)}
torch.cuda.synchronize()
out["latency"] = lat

# the stamp kernel: host launch cost, stream time back to back, timer step, agreement.
torch.cuda.synchronize()
s = idle.cuda_stream
N = 2000
t = time.perf_counter_ns()
for _ in range(N):
    stamp(s)
host_stamp = (time.perf_counter_ns() - t) / N
torch.cuda.synchronize()
t = time.perf_counter_ns()
for _ in range(N):
    rec(take(True), s)
host_rec = (time.perf_counter_ns() - t) / N
torch.cuda.synchronize()
# Behind a sleep longer than the launches take from Python, so they are queued back to back.
with torch.cuda.stream(idle):
    torch.cuda._sleep(80_000_000)
first = nxt[0]
for _ in range(N):
    stamp(s)
torch.cuda.synchronize()
seq = [slots[(first + i) % SLOTS] for i in range(N)]
diffs = [b - a for a, b in zip(seq, seq[1:])]
ck(cu.cuMemsetD8_v2(C.c_uint64(devp.value), 0, 8 * 4096), "memset")
launch(f_steps, s, devp.value, 4096)
torch.cuda.synchronize()
step = sorted(slots[i] for i in range(4096))
agree = []
for cyc in (20_000, 200_000, 2_000_000):
    for _ in range(30):
        e0, e1 = take(True), take(True)
        with torch.cuda.stream(idle):
            torch.cuda._sleep(200_000)
            rec(e0, s)
            a = stamp(s)
            torch.cuda._sleep(cyc)
            b = stamp(s)
            rec(e1, s)
        torch.cuda.synchronize()
        ms = C.c_float()
        ck(cu.cuEventElapsedTime(C.byref(ms), e0, e1), "elapsed")
        agree.append((cyc, ms.value * 1e3, (slots[b] - slots[a]) / 1e3))
out["stamp"] = {
    "host_ns_per_stamp_launch_py": host_stamp,
    "host_ns_per_event_record_py": host_rec,
    "stream_ns_per_stamp_back_to_back": st.median(diffs),
    "timer_step_ns": {"min": step[0], "median": step[len(step) // 2], "max": step[-1]},
    "events_minus_stamps_us": {
        str(c): st.median([e - g for cc, e, g in agree if cc == c]) for c in (20_000, 200_000, 2_000_000)
    },
    "stamp_us": {str(c): st.median([g for cc, e, g in agree if cc == c]) for c in (20_000, 200_000, 2_000_000)},
}
if args.out:
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
print(f"# {out['device']}: chain of {args.kernels} sleep({args.sleep_cycles}) kernels, two stamps every {args.every}")
for where in ("overlap", "idle"):
    print(where, " ".join(f"{m} {v['median_ms']:.3f} ms ({v['ratio']:.3f}x)" for m, v in out[where].items()))
print("latency while another stream runs 2 ms:", " ".join(f"{m} {v['median_us']:.1f} us" for m, v in lat.items()))
print("stamp:", json.dumps(out["stamp"]))
