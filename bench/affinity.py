"""Keeps a benchmark's measuring thread alone on one CPU core: the thread that calls
`isolate_this_thread` runs on one CPU of the process's allowed set, and every other
thread of the process (torch's, NCCL's, zcta's writer) on the allowed CPUs that share
no core with it. Used by bench/always_on.py (`--isolate`) so that a loop whose speed
depends on where the scheduler puts its thread, and on what shares that thread's core,
is measured in one place.

Threads created after the call inherit their creator's CPUs: call it once the
process's threads exist (after a warm-up)."""

import os
import threading
from pathlib import Path


def core_siblings(cpu, sys_root="/sys/devices/system/cpu"):
    """The CPUs that share `cpu`'s core (itself included), from sysfs; {cpu} where
    sysfs does not say."""
    p = Path(sys_root) / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    try:
        text = p.read_text().strip()
    except OSError:
        return {cpu}
    out = set()
    for part in text.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out or {cpu}


def plan(allowed, siblings_of):
    """(the measuring thread's CPU, the other threads' CPUs) within `allowed`: the
    lowest allowed CPU for the measuring thread, the others on every allowed CPU of
    another core. None when no allowed CPU is left for the others."""
    allowed = sorted(allowed)
    if not allowed:
        return None
    main = allowed[0]
    rest = set(allowed) - siblings_of(main) - {main}
    if not rest:
        return None
    return main, rest


def isolate_this_thread(sys_root="/sys/devices/system/cpu"):
    """Applies `plan` to this process; returns what was done (for the run's JSON) or
    why nothing was."""
    allowed = os.sched_getaffinity(0)
    p = plan(allowed, lambda c: core_siblings(c, sys_root))
    if p is None:
        return {"isolated": False, "why": f"no CPU of another core among {sorted(allowed)}"}
    main, rest = p
    me = threading.get_native_id()
    moved = 0
    for t in Path("/proc/self/task").iterdir():
        tid = int(t.name)
        if tid == me:
            continue
        try:
            os.sched_setaffinity(tid, rest)
            moved += 1
        except OSError:
            pass  # the thread has exited
    os.sched_setaffinity(0, {main})
    return {"isolated": True, "main_cpu": main, "others": sorted(rest), "threads_moved": moved}
