"""Are GPU records still joined to the right op when capture is switched off and on
while the GPU is busy? ONE GPU, a one-rank send/recv to self (nccl_bench.SelfComm).

    python3 bench/cupti_toggle_check.py .carry/libzcta_prof.so

Per round, on one stream: a GPU sleep, then 100 recorded send/recv groups of 64 MiB,
zcta_set_recording(0), a GPU sleep and 100 groups of 8 B (not recorded), and
zcta_set_recording(1) while the GPU is still working through them, then 100 more
recorded 64 MiB groups. The 8 B kernels run in a few microseconds, the 64 MiB ones far
longer, so a GPU record of a paused (8 B) launch that zcta gives to a recorded (64 MiB)
op shows up by its duration (under 10 us). Run with CUPTI left on while paused (the default) and switched
off with it (ZCTA_PAUSE_CUPTI=1). Then sampling windows: for 3 s, GPU sleeps and 64 MiB
groups back to back under ZCTA_SAMPLE=50ms/200ms (the writer thread switches marking and
NCCL's events at each window). Prints, per run: ops measured,
ops with exactly one kernel, ops whose kernel is too short to be theirs, GPU records
dropped for naming a later call (process.gpu_inconsistent), and kernel records
sharing a correlation id.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROUNDS, K = 10, 100


def child(mode):
    import ctypes
    import time

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import nccl_bench as nb

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    set_recording = ctypes.CDLL(None).zcta_set_recording
    me = nb.SelfComm(stream)
    big = me.sendrecv(torch.ones((64 << 20) // 4, device=dev), torch.empty((64 << 20) // 4, device=dev))
    small = me.sendrecv(torch.ones(2, device=dev), torch.empty(2, device=dev))
    big(5)
    torch.cuda.synchronize()
    if mode == "pause":
        for _ in range(ROUNDS):
            torch.cuda._sleep(nb.SLEEP_CYCLES * 4)  # ~2 ms
            big(K)
            set_recording(0)
            torch.cuda._sleep(nb.SLEEP_CYCLES * 4)  # ~2 ms
            small(K)
            set_recording(1)  # the GPU is still busy with the paused launches
            big(K)
            torch.cuda.synchronize()
    else:  # windows: the writer thread switches capture while this one launches
        end = time.monotonic() + 3
        while time.monotonic() < end:
            torch.cuda._sleep(nb.SLEEP_CYCLES)  # ~0.5 ms
            big(20)
        torch.cuda.synchronize()
    me.destroy()


def check(shim, mode, pause_cupti):
    out = tempfile.mkdtemp(prefix="zcta-toggle-")
    env = dict(os.environ, LD_PRELOAD=shim, ZCTA_OUT=out, ZCTA_RUN_ID="t", ZCTA_PAUSE_CUPTI=pause_cupti)
    if mode == "windows":
        env["ZCTA_SAMPLE"] = "50ms/200ms"
    subprocess.run([sys.executable, __file__, "--child", mode], env=env, check=True)
    return verdict(f"{out}/t", mode, pause_cupti)


def verdict(run, mode, pause_cupti):
    """Prints one run's line; True when every measured op has its one kernel of its own
    and no GPU record was dropped or shared (a NULL process.gpu_inconsistent fails)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
    import pandas as pd
    from zcta_analysis import read_table

    ops, gpu, proc = (read_table(run, t) for t in ("ops", "gpu", "process"))
    recorded = ops[(ops.op == "Send") & (ops.bytes >= 1 << 20) & ops.engine.notna()]
    kern = gpu[gpu.kind == "kernel"]
    # A 64 MiB send/recv to self takes tens of microseconds on an H200; an 8 B one a few.
    by = kern.groupby("group_id")
    n_kernels, dur_us = by.size(), (by.end_ns.max() - by.start_ns.min()) / 1e3
    one = recorded.group_id.map(n_kernels).eq(1).sum()
    short = recorded.group_id.map(dur_us).lt(10.0).sum()
    shared = int((kern.groupby("correlation_id").size() > 1).sum())
    p = proc.iloc[0]
    print(f"{mode:8} ZCTA_PAUSE_CUPTI={pause_cupti} measured ops {len(recorded):5}  with one kernel {one:5}  too short to be theirs {short:5}  "
          f"dropped as naming a later call {p.gpu_inconsistent:5}  correlation ids shared by kernels {shared:4}")
    return (short == 0 and pd.notna(p.gpu_inconsistent) and p.gpu_inconsistent == 0 and shared == 0
            and one == len(recorded))


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        ok = [check(sys.argv[1], "pause", p) for p in ("0", "1")] + [check(sys.argv[1], "windows", "0")]
        sys.exit(0 if all(ok) else 1)
