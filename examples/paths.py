"""The source article's question, measured on your machine: is the copy-engine
("zero-CTA") path really active and really cheaper, and what does each fallback cost?

    python examples/paths.py                       # every local GPU, every path below
    python examples/paths.py --paths default,ce --sizes 1M,16M,256M

For each data path NCCL can take on one machine, the same sweep — all_to_all_single and
all_gather_into_tensor from 1 MiB to 1 GiB, on a side stream, each op between its own
CUDA events — runs as its own torchrun job under the zcta shim, into its own run
directory. Then it prints, per (op, size): the CUDA-event median on each path with its
bus bandwidth, the engine zcta saw move the bytes, and `zcta diff` of each path
against the default one (what changed, phase by phase, with bootstrap intervals).

Paths (docs/dev/data-paths.md says how each is forced and what moves the bytes):
  ce               NCCL_CTA_POLICY=2, buffers in registered symmetric windows
  ce-unregistered  NCCL_CTA_POLICY=2 but plain buffers: NCCL falls back, silently
  default          SM kernels over NVLink P2P
  proxy            NCCL_P2P_USE_CUDA_MEMCPY=1: the proxy thread copies with cudaMemcpy
  shm              NCCL_P2P_DISABLE=1: through host shared memory
  net              NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: through the network stack

The shim and the zcta binary are found with --shim/--zcta, $ZCTA_SHIM/$ZCTA_BIN, or in
target/release or .carry next to this repository.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

PATHS = {
    "ce": ({"NCCL_CTA_POLICY": "2"}, True),
    "ce-unregistered": ({"NCCL_CTA_POLICY": "2"}, False),
    "default": ({}, False),
    "proxy": ({"NCCL_P2P_USE_CUDA_MEMCPY": "1"}, False),
    "shm": ({"NCCL_P2P_DISABLE": "1"}, False),
    "net": ({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, False),
}
# Every variable a path sets; cleared for the other paths so the user's environment
# cannot leak one path's setting into another.
PATH_VARS = sorted({k for env, _ in PATHS.values() for k in env})
OPS = {"all_to_all": "AlltoAll", "all_gather": "AllGather"}  # ours -> zcta's op name
SHORT = {"copy_engine": "CE", "sm_kernel": "SM", "symmetric_kernel": "symk",
         "proxy_memcpy": "proxy", "none": "none", "not measured": "n/m"}


def args_of(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated, from the list below")
    ap.add_argument("--sizes", default="1M,4M,16M,64M,256M,1G", help="message sizes (nccl-tests bytes)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per op and size")
    ap.add_argument("--nproc", type=int, default=0, help="ranks (default: every local GPU)")
    ap.add_argument("--out", help="parent of the run directories (default zcta-runs/paths-<time>)")
    ap.add_argument("--shim"), ap.add_argument("--zcta")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # set by the launcher
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ---- the job each torchrun rank runs ---------------------------------------------------

def worker(args):
    import torch
    import torch.distributed as dist

    import nccl_bench as nb

    rank, world, dev = nb.setup()
    sizes = [nb.parse_size(s) for s in args.sizes.split(",")]
    top = nb.elements(max(sizes), world)
    _, symmetric = PATHS[args.worker]
    bufs = nb.buffers(dev, {"a2a_in": top, "a2a_out": top, "ag_in": top // world, "ag_out": top},
                      symmetric)
    for t in bufs.values():
        t.normal_()
    stream = torch.cuda.Stream(device=dev)  # the copy-engine path needs a non-default stream
    results = []
    with torch.cuda.stream(stream):
        for size in sizes:
            n = nb.elements(size, world)
            calls = {
                "all_to_all": lambda: dist.all_to_all_single(bufs["a2a_out"][:n], bufs["a2a_in"][:n]),
                "all_gather": lambda: dist.all_gather_into_tensor(bufs["ag_out"][:n],
                                                                  bufs["ag_in"][:n // world]),
            }
            for op, fn in calls.items():
                us = nb.time_op(fn, stream, args.iters)
                results.append({"op": op, "bytes": size, **nb.stats(us)})
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"path": args.worker, "world": world, "rows": results}, f)
    dist.barrier()
    dist.destroy_process_group()


# ---- the launcher ----------------------------------------------------------------------

def find(explicit, env, name):
    for cand in [explicit, os.environ.get(env), ROOT / "target/release" / name, ROOT / ".carry" / name]:
        if cand and Path(cand).is_file():
            return str(Path(cand).resolve())
    sys.exit(f"paths.py: cannot find {name}: pass --{'shim' if name.endswith('.so') else 'zcta'}, "
             f"set {env}, or build it (cargo build --release)")


def launch(args):
    import torch  # only to count GPUs

    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    bad = [p for p in paths if p not in PATHS]
    if bad:
        sys.exit(f"paths.py: unknown path(s) {', '.join(bad)}; choose from {', '.join(PATHS)}")
    nproc = args.nproc or torch.cuda.device_count()
    if nproc < 2:
        sys.exit(f"paths.py: needs 2 or more GPUs on this machine, found {nproc}")
    shim, zcta = find(args.shim, "ZCTA_SHIM", "libzcta_prof.so"), find(args.zcta, "ZCTA_BIN", "zcta")
    out = Path(args.out or f"zcta-runs/paths-{time.strftime('%Y%m%dT%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    events = out / "events"
    events.mkdir(exist_ok=True)
    measured = {}
    for path in paths:
        env = {k: v for k, v in os.environ.items() if k not in PATH_VARS}
        env.update(PATHS[path][0])
        # The slow paths queue seconds of GPU work behind a call (1 GiB over sockets:
        # ~0.3 s per op): let an op's row wait long enough for its GPU side.
        env.setdefault("ZCTA_GPU_HOLD_MS", "30000")
        env.update(ZCTA_OUT=str(out), ZCTA_RUN_ID=path,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
                   LD_PRELOAD=" ".join(filter(None, [shim, os.environ.get("LD_PRELOAD")])))
        if (out / path).exists():
            shutil.rmtree(out / path)
        result = events / f"{path}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               __file__, "--worker", path, "--result", str(result), "--sizes", args.sizes,
               "--iters", str(args.iters)]
        t0 = time.time()
        print(f"== {path:16} {' '.join(f'{k}={v}' for k, v in PATHS[path][0].items()) or '(no NCCL setting)'}",
              flush=True)
        rc = subprocess.run(cmd, env=env).returncode
        if rc != 0 or not result.exists():
            print(f"   {path}: the job failed (exit {rc}); left out", flush=True)
            continue
        measured[path] = json.loads(result.read_text())
        print(f"   {time.time() - t0:.0f} s, run directory {out / path}", flush=True)
    if not measured:
        sys.exit("paths.py: no path ran")
    engines = {p: engines_seen(zcta, out / p) for p in measured}
    print_matrix(measured, engines)
    base = "default" if "default" in measured else next(iter(measured))
    for p in measured:
        if p != base:
            print(f"\n== zcta diff {base} {p}", flush=True)
            subprocess.run([zcta, "diff", str(out / base), str(out / p)])
    print(f"\nrun directories: {out}/<path>; try: {zcta} report {out / base}")


def engines_seen(zcta, run):
    """(zcta op, bytes) -> the engines zcta recorded, most frequent first."""
    r = subprocess.run([zcta, "report", "--format", "json", str(run)], capture_output=True, text=True)
    if not r.stdout.strip():
        print(f"   zcta report {run} failed: {r.stderr.strip()}")
        return {}
    seen = {}
    for g in json.loads(r.stdout)["groups"]:
        seen.setdefault((g["op"], g["size_bucket_bytes"]), []).append((g["count"], g["engine"]))
    return {k: [e for _, e in sorted(v, reverse=True)] for k, v in seen.items()}


def print_matrix(measured, engines):
    import nccl_bench as nb

    paths = list(measured)
    world = next(iter(measured.values()))["world"]
    print(f"\nCUDA-event median per op, us (busbw GB/s) [engine zcta saw], {world} ranks")
    head = f"{'op':11} {'size':>8}" + "".join(f" {p:>26}" for p in paths)
    print(head)
    print("-" * len(head))
    keys = [(r["op"], r["bytes"]) for r in next(iter(measured.values()))["rows"]]
    for op, size in keys:
        line = f"{op:11} {nb.fmt_bytes(size):>8}"
        for p in paths:
            row = next((r for r in measured[p]["rows"] if (r["op"], r["bytes"]) == (op, size)), None)
            if row is None:
                line += f" {'-':>26}"
                continue
            eng = engines[p].get((OPS[op], size), [])
            tag = "+".join(SHORT.get(e, e) for e in eng) or "?"
            bw = nb.busbw_gbs(op, size, row["median"], world)
            line += f" {row['median']:>9.1f} ({bw:6.1f}) [{tag:>5}]"
        print(line)


if __name__ == "__main__":
    a = args_of()
    worker(a) if a.worker else launch(a)
