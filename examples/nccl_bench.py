"""Shared pieces of the examples' NCCL timing loops (paths.py, stress.py) and the GPU
tests: rank setup, buffers in NCCL symmetric windows (the copy-engine recipe of
docs/doctor.md), CUDA-event timing of one op at a time, and nccl-tests bandwidth.
torch is imported where it is used, so the arithmetic can be tested without it.
"""

import ctypes
import math
import os
import random
import statistics

# A GPU sleep before the start event keeps the GPU busy while the host enqueues the op,
# so the events time the GPU's work, not the host's enqueue (~500 us at H200 clocks).
# It was 200,000 cycles (~100 us): in a loop of sleep + op + events without a
# synchronise, one rank's host took longer per torch all_to_all (~60-90 us in the call
# alone) than the GPU per iteration, the GPU went idle before the launch, and 10 of 240
# event pairs (8 of that rank's 30 torch all_to_all) timed host enqueue too, 80-210 us
# around a 55 us op (tests/gpu/cupti.sh, CUPTI mode, 2xH200, 2026-11-30).
SLEEP_CYCLES = 1_000_000

# nccl-tests bus-bandwidth factors, n = ranks.
BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


# The CPUs `setup` pinned this rank to (None: not pinned).
PINNED = None


def parse_cpu_list(text):
    """CPUs of a list like "0-3,8,10-11" (taskset's form), as a set."""
    cpus = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdecimal() or (dash and not hi.isdecimal()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"not a CPU list: {text!r} (e.g. 0-7 or 0-3,8)")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pin_rank(local_rank, spec=None):
    """Pins this process (and the threads it starts later: NCCL's, zcta's, CUPTI's) to
    its rank's CPUs when BENCH_RANK_CPUS (or `spec`) is set: one CPU list per local rank,
    separated by ':', e.g. "0-7:8-15". Between processes, where the threads land
    changes the small-op loops more than what the benchmarks compare
    (docs/dev/cupti-measurements.md, "The same, pinned"). Returns the CPUs pinned to, or None."""
    spec = os.environ.get("BENCH_RANK_CPUS", "") if spec is None else spec
    if not spec:
        return None
    sets = spec.split(":")
    if local_rank >= len(sets):
        raise ValueError(f"BENCH_RANK_CPUS={spec!r} names {len(sets)} CPU sets, local rank {local_rank} has none")
    try:
        cpus = parse_cpu_list(sets[local_rank])
    except ValueError as e:
        raise ValueError(f"BENCH_RANK_CPUS={spec!r}, local rank {local_rank}: {e}") from None
    cpus &= os.sched_getaffinity(0)
    if not cpus:
        raise ValueError(f"BENCH_RANK_CPUS={spec!r}: none of {sets[local_rank]!r} is available to this process")
    os.sched_setaffinity(0, cpus)
    return cpus


def setup():
    """init_process_group on this rank's GPU; returns (rank, world, device). Pins the
    rank's CPUs first when BENCH_RANK_CPUS is set (`pin_rank`)."""
    import torch
    import torch.distributed as dist

    global PINNED
    PINNED = pin_rank(int(os.environ["LOCAL_RANK"]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    return rank, world, dev


def nccl():
    """NCCL's API: the shim's exports when it is preloaded (so calls are recorded),
    else the libnccl this process mapped (torch's)."""
    try:
        lib = ctypes.CDLL(None)
        lib.ncclCommWindowRegister  # noqa: B018 (probe)
        return lib
    except (OSError, AttributeError):
        return mapped_nccl()


def mapped_nccl():
    """The libnccl this process mapped (torch's), for what the shim does not export
    (e.g. ncclGetUniqueId)."""
    with open("/proc/self/maps") as maps:
        path = next((line.split()[-1] for line in maps
                     if "libnccl.so" in line and "zcta" not in line), None)
    if path is None:
        raise RuntimeError("no libnccl mapped in this process (initialise the NCCL process group first)")
    return ctypes.CDLL(path)


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


NCCL_FLOAT = 7


class SelfComm:
    """A one-rank communicator whose rank sends to itself (ncclGroupStart, ncclSend,
    ncclRecv, ncclGroupEnd to peer 0): NCCL plans, profiles and launches that like any
    send/recv (one ncclDevKernel_SendRecv through cuLaunchKernelEx) on one GPU. Calls
    go through the shim's exports when it is preloaded."""

    def __init__(self, stream):
        self.lib = nccl()
        # libnccl's own functions, looked up on its handle: a preloaded shim does not
        # interpose those (its exports win only in the global scope).
        self.direct = mapped_nccl()
        uid = UniqueId()
        self._check("ncclGetUniqueId", mapped_nccl().ncclGetUniqueId(ctypes.byref(uid)))
        self.comm = ctypes.c_void_p()
        self._check("ncclCommInitRank", self.lib.ncclCommInitRank(ctypes.byref(self.comm), 1, uid, 0))
        self.stream = ctypes.c_void_p(stream.cuda_stream)

    @staticmethod
    def _check(what, rc):
        if rc != 0:
            raise SystemExit(f"{what} returned {rc}")

    def destroy(self):
        self._check("ncclCommDestroy", self.lib.ncclCommDestroy(self.comm))

    def sendrecv(self, a, b, direct=False):
        """A function running k send/recv groups of float32 tensor a into b; with
        `direct`, through libnccl's own functions, which bypass a preloaded shim."""
        lib, comm, s = (self.direct if direct else self.lib), self.comm, self.stream
        n = ctypes.c_size_t(a.numel())
        pa, pb = ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr())

        def run(k):
            for _ in range(k):
                lib.ncclGroupStart()
                lib.ncclSend(pa, n, NCCL_FLOAT, 0, comm, s)
                lib.ncclRecv(pb, n, NCCL_FLOAT, 0, comm, s)
                lib.ncclGroupEnd()

        return run


def register_windows(backend, tensors):
    """ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC) for each tensor."""
    f = nccl().ncclCommWindowRegister
    f.restype = ctypes.c_int
    comm = ctypes.c_void_p(backend._comm_ptr())
    for t in tensors:
        win = ctypes.c_void_p()
        rc = f(comm, ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(t.numel() * t.element_size()),
               ctypes.byref(win), ctypes.c_int(1))
        if rc != 0:
            raise RuntimeError(f"ncclCommWindowRegister returned {rc}")


_POOLS = []


def buffers(dev, sizes, symmetric):
    """float32 tensors of the given element counts (a dict name -> count). With
    `symmetric`, allocated from NCCL's allocator and registered as symmetric windows
    (the copy-engine path needs both), after a barrier so every rank registers."""
    import torch
    import torch.distributed as dist

    if not symmetric:
        return {k: torch.empty(n, device=dev) for k, n in sizes.items()}
    backend = dist.group.WORLD._get_backend(dev)
    pool = torch.cuda.MemPool(backend.mem_allocator)
    _POOLS.append(pool)  # a pool must outlive its tensors (else frees bypass ncclMemFree)
    with torch.cuda.use_mem_pool(pool):
        bufs = {k: torch.empty(n, device=dev) for k, n in sizes.items()}
    dist.barrier()
    register_windows(backend, list(bufs.values()))
    return bufs


def one_rank_env():
    """Environment defaults for a one-rank process group on this host, and NVLink
    multicast off; set before init_process_group."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def three_records(stream, sleep_cycles=200_000):
    """Three CUDA event records in a row behind a sleep kernel: the first and the
    third, whose elapsed time is what two records between a pair of events add."""
    import torch

    c = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    torch.cuda._sleep(sleep_cycles)
    for x in c:
        x.record(stream)
    return c[0], c[2]


def stamp_ptx():
    """zcta's stamp kernel, the PTX text of `STAMP_PTX` in the shim's source
    (shim/src/ffi/cuda.rs, read from this checkout): the GPU checks launch it
    themselves to measure what zcta's stamps add to the program's own window."""
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "shim" / "src" / "ffi" / "cuda.rs").read_text()
    head = 'const STAMP_PTX: &CStr = c"'
    start = src.index(head) + len(head)
    return src[start:src.index('";', start)]


_stamper = {}
# Slots for the program's own stamps (8 bytes each): `two_stamps` and `like_zcta_stamps`
# take the next ones round the ring, so a pair's values must be read before
# STAMP_SLOTS / 2 more pairs are taken (tests/gpu/events.py reads each block's).
STAMP_SLOTS = 8192


def stamp(stream, slot=0):
    """Launches zcta's stamp kernel on `stream` (a torch stream), as zcta does: it
    writes the GPU's clock (%globaltimer, ns) into `slot` of pinned host memory of this
    module's own, read with `stamp_value` after a synchronise."""
    import ctypes as C

    # Set up at the first launch (`_take_slots` may have taken slots before it).
    if "f" not in _stamper:
        cu = C.CDLL("libcuda.so.1")
        mod, f, host, dev = C.c_void_p(), C.c_void_p(), C.c_void_p(), C.c_uint64()

        def ck(rc, what):
            if rc != 0:
                raise RuntimeError(f"{what}: CUresult {rc}")

        # One at a time: each call needs what the one before made.
        ck(cu.cuModuleLoadData(C.byref(mod), C.c_char_p(stamp_ptx().encode())), "cuModuleLoadData")
        ck(cu.cuModuleGetFunction(C.byref(f), mod, b"zcta_stamp"), "cuModuleGetFunction")
        ck(cu.cuMemHostAlloc(C.byref(host), C.c_size_t(8 * STAMP_SLOTS), C.c_uint(3)), "cuMemHostAlloc")
        ck(cu.cuMemHostGetDevicePointer_v2(C.byref(dev), host, C.c_uint(0)), "cuMemHostGetDevicePointer")
        _stamper.update(cu=cu, f=f, dev=dev.value, host=host.value)
        _stamper.setdefault("next", 0)
    if not 0 <= slot < STAMP_SLOTS:
        raise ValueError(f"stamp slot {slot} outside 0..{STAMP_SLOTS - 1}")
    s = _stamper
    # The launch copies the argument: a local one serves.
    arg = C.c_uint64(s["dev"] + 8 * slot)
    params = (C.c_void_p * 1)(C.cast(C.pointer(arg), C.c_void_p))
    rc = s["cu"].cuLaunchKernel(s["f"], 1, 1, 1, 1, 1, 1, 0, C.c_void_p(stream.cuda_stream), params, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernel: CUresult {rc}")


def stamp_value(slot):
    """The GPU clock (ns) that the stamp launched into `slot` wrote (after a
    synchronise)."""
    import ctypes as C

    return C.c_uint64.from_address(_stamper["host"] + 8 * slot).value


def two_stamps(stream, sleep_cycles=200_000):
    """A pair of CUDA events around two of zcta's stamps, behind a sleep kernel.
    Returns ((c0, c1), (slot0, slot1)); after a synchronise, the events' elapsed time
    less the stamps' own interval (`stamp_value(slot1) - stamp_value(slot0)`) is what
    two stamps around an op add to a pair of events beyond what zcta reads between
    them: the events' gap to the first stamp's clock read and from the second's (as
    `three_records` for two records)."""
    import torch

    c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    slots = _take_slots()
    torch.cuda._sleep(sleep_cycles)
    c0.record(stream)
    stamp(stream, slots[0])
    stamp(stream, slots[1])
    c1.record(stream)
    return (c0, c1), slots


def _take_slots():
    """The next two stamp slots of the ring (STAMP_SLOTS)."""
    k = _stamper.get("next", 0)
    _stamper["next"] = k + 2
    return k % STAMP_SLOTS, (k + 1) % STAMP_SLOTS


def like_zcta_stamps(stream, fn, sleep_cycles=200_000):
    """One op (`fn(1)`) timed as zcta times it, by the program itself (zcta paused): a
    sleep kernel, E0, a stamp, the op, a stamp, E1, the stamps where zcta launches its
    own (just before and just after the launching call); then `two_stamps`. Returns
    ((e0, e1), (slot0, slot1), two_stamps' result); read them after a synchronise
    (`stamp_value`)."""
    import torch

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    inner = _take_slots()
    torch.cuda._sleep(sleep_cycles)
    e0.record(stream)
    stamp(stream, inner[0])
    fn(1)
    stamp(stream, inner[1])
    e1.record(stream)
    return (e0, e1), inner, two_stamps(stream, sleep_cycles)


def like_zcta(stream, fn, sleep_cycles=200_000):
    """One op (`fn(1)`) timed the way zcta's events see it, every event recorded by the
    program: a sleep kernel (~100 us at 200,000 cycles: the stream becomes free after
    the launch), E0, R, the op, E, E1, with R and E where zcta records its pair (just
    before and just after the launching call); then `three_records`. Returns
    ((e0, r, e, e1), (c0, c2)); read them after a synchronise."""
    import torch

    e0, r, e, e1 = (torch.cuda.Event(enable_timing=True) for _ in range(4))
    torch.cuda._sleep(sleep_cycles)
    e0.record(stream)
    r.record(stream)
    fn(1)
    e.record(stream)
    e1.record(stream)
    return (e0, r, e, e1), three_records(stream, sleep_cycles)


def time_op(fn, stream, iters, warmup=3):
    """GPU time of `fn` (one collective on `stream`) per call, in microseconds, each
    call between its own pair of CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    events = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        e0.record(stream)
        fn()
        e1.record(stream)
        events.append((e0, e1))
    torch.cuda.synchronize()
    return [e0.elapsed_time(e1) * 1e3 for e0, e1 in events]


def per_call_us(fn, n):
    """Host wall time per call of `fn` over n back-to-back calls and one final
    synchronise, in microseconds (what a loop of small ops costs the program)."""
    import time

    import torch

    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def together(fn):
    """Runs fn once every rank got here (synchronise, then barrier), so timed loops start
    together: a rank that starts late holds the other's collectives on the GPU, and its
    lag would count as the other's time per call."""
    import torch
    import torch.distributed as dist

    torch.cuda.synchronize()
    dist.barrier()
    return fn()


def abba_on(block):
    """In-process A/B: whether block number `block` has recording on, in ABBA order
    (on, off, off, on, ...), so a slow drift weighs on both halves alike."""
    return block % 2 == 0 if (block // 2) % 2 == 0 else block % 2 == 1


def bootstrap_ci(stat, samples, reps=2000):
    """95 % bootstrap interval of stat(resampled samples...) (fixed seed)."""
    rng = random.Random(7)
    r = sorted(stat(*[rng.choices(x, k=len(x)) for x in samples]) for _ in range(reps))
    return r[int(0.025 * reps)], r[int(0.975 * reps)]


def stats(us):
    """median, p99, mean, standard deviation, min, max of a list of times (us)."""
    s = sorted(us)
    p99 = s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]
    return {"median": statistics.median(s), "p99": p99, "mean": statistics.fmean(s),
            "std": statistics.pstdev(s), "min": s[0], "max": s[-1], "n": len(s)}


def busbw_gbs(op, nbytes, us, world):
    """nccl-tests bus bandwidth, GB/s (1e9 bytes), of an op moving `nbytes` in `us`."""
    return nbytes / (us * 1e-6) / 1e9 * BUSBW[op](world)


def fmt_bytes(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def elements(nbytes, world):
    """float32 elements for a message of `nbytes`, rounded down to a multiple of the
    rank count (all_to_all and all_gather split the buffer evenly)."""
    n = nbytes // 4
    return n - n % world


def parse_size(text):
    """'1M', '16MiB', '1G', '4096' -> bytes."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t[:-1] if mult > 1 else t) * mult
