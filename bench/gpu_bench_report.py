"""Tables of bench/gpu_bench.sh (markdown, for docs/PERFORMANCE.md).

usage: gpu_bench_report.py WORK_DIR RUNS_DIR
WORK_DIR/res holds the jobs' JSON (<config>-<round>.json), ab.txt, wal_lag.json,
report.json, disk_bytes; RUNS_DIR/zcta-0 is the run the accuracy and data tables use,
and every RUNS_DIR/<config>-<round> gives the time-in-call table.
"""

import glob
import json
import os
import statistics
import sys

import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "analysis"))
from zcta_analysis import read_table, stream_time_ns  # noqa: E402

work, runs = sys.argv[1], sys.argv[2]
res = os.path.join(work, "res")
run = os.path.join(runs, "zcta-0")
jobs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(res, "*-*.json")))]
by = {}
for j in jobs:
    by.setdefault(j["config"], {})[j["round"]] = j["medians"]

MEASURES = [("train_step_ms", "examples/train.py step (ms)", 1.01),
            ("allreduce_8B_us", "8-byte all_reduce host loop (us/call)", 1.03),
            ("a2a_1MiB_us", "1 MiB all_to_all (us/op)", 1.01),
            ("a2a_128MiB_us", "128 MiB all_to_all (us/op)", 1.01)]
CONFIGS = [c for c in ("plain", "zcta", "kernelonly", "copyonly", "nokinds", "nocallbacks", "noplugin", "hostonly",
                       "kernelchonly", "kernelchmin", "ready", "kernelch", "profiler") if c in by]

print("### Overhead: process A/B, rounds in rotated order\n")
# What the jobs said they pinned (older job files do not say).
pins = sorted({str((j.get("pinned") or {}).get("spec")) if "pinned" in j else "unknown" for j in jobs})
print("Median over rounds of each process pair's median; ratio = that round's config / plain, "
      "median over rounds [min, max]. Ranks pinned (BENCH_RANK_CPUS, one CPU set per local rank): "
      + ", ".join("no" if p == "None" else p for p in pins) + ".\n")
print("| measure | target | " + " | ".join(CONFIGS) + " |")
print("|---|---|" + "---|" * len(CONFIGS))
for key, label, target in MEASURES:
    if not any(key in by[c][r] for c in CONFIGS for r in by[c]):
        continue  # not measured (gpu_job.py --measures)
    cells = []
    for c in CONFIGS:
        vals = [by[c][r][key] for r in sorted(by[c]) if key in by[c][r]]
        if not vals:
            cells.append("—")
            continue
        m = statistics.median(vals)
        ratios = [by[c][r][key] / by["plain"][r][key] for r in sorted(by[c])
                  if key in by[c][r] and key in by.get("plain", {}).get(r, {})]
        if c == "plain" or not ratios:
            cells.append(f"{m:.2f}")
            continue
        cells.append(f"{m:.2f} ({statistics.median(ratios):.3f}× [{min(ratios):.3f}, {max(ratios):.3f}])")
    print(f"| {label} | zcta ≤ {target}× | " + " | ".join(cells) + " |")

# Time inside the NCCL call, per configuration with the shim: api_end_ns − api_start_ns
# as zcta recorded it in every run of the job. CUPTI's work inside the launch (its
# callbacks, its kernel instrumentation), NCCL's profiler events and zcta's callbacks
# for them happen inside the call; only zcta's ops row is built after the call returns.
# Measured per call, this splits the in-call costs without the placement noise of the
# ratios. Calls from the accuracy phase (ops timed alone behind a GPU sleep, in the
# run of zcta round 0) are left out.
IN_CALL = [("AllReduce", 8, "8-byte all_reduce"), ("AlltoAll", 1 << 20, "1 MiB all_to_all")]
in_call = {}
for d in sorted(glob.glob(os.path.join(runs, "*-*"))):
    config, _, rnd = os.path.basename(d).rpartition("-")
    if not rnd.isdigit():
        continue
    o = read_table(d, "ops")
    if not len(o):
        continue
    acc = next((j["accuracy_start_ns"] for j in jobs if j["config"] == config and str(j["round"]) == rnd
                and j.get("accuracy")), None)
    if acc is not None:
        o = o[o.api_start_ns < acc]
    for op, nbytes, _ in IN_CALL:
        sel = o[(o.op == op) & (o.bytes == nbytes)]
        if len(sel):
            us = (sel.api_end_ns - sel.api_start_ns).median() / 1e3
            in_call.setdefault(config, {}).setdefault((op, nbytes), []).append((us, len(sel)))
if in_call:
    print("\n### Time inside the NCCL call (zcta's api_end_ns − api_start_ns), per configuration\n")
    print("Median over each run's calls (both ranks), then median over rounds [min, max]; calls per "
          "run in parentheses. Includes CUPTI's work inside the launch, NCCL's profiler events and "
          "zcta's callbacks; excludes zcta's ops row, built after the call returns, and the "
          "accuracy phase's calls.\n")
    print("| configuration | " + " | ".join(f"{label} (us)" for _, _, label in IN_CALL) + " |")
    print("|---|" + "---|" * len(IN_CALL))
    order = [c for c in CONFIGS if c in in_call] + sorted(c for c in in_call if c not in CONFIGS)
    for c in order:
        cells = []
        for op, nbytes, _ in IN_CALL:
            v = in_call[c].get((op, nbytes))
            if not v:
                cells.append("—")
                continue
            us = [u for u, _ in v]
            n = statistics.median(k for _, k in v)
            cells.append(f"{statistics.median(us):.2f} [{min(us):.2f}, {max(us):.2f}] ({n:.0f})")
        print(f"| {c} | " + " | ".join(cells) + " |")

ab = os.path.join(res, "ab.txt")
if os.path.exists(ab):
    print("\n### Overhead: in-process A/B (recording on vs off in the same processes, ABBA blocks)\n")
    print("```\n" + open(ab).read().rstrip() + "\n```")


def stream_us(ops):
    """The op's time on its stream (docs/phases.md), µs: from when the stream was free
    for it (or its launch call, if later) to its GPU end; the kernel span without
    gpu_ready_ns (older runs, or the event kinds off)."""
    return stream_time_ns(ops).fillna((ops.gpu_end_ns - ops.gpu_start_ns).astype("float64")) / 1e3


zj = next((j for j in jobs if j["config"] == "zcta" and j["accuracy"]), None)
ops = read_table(run, "ops")
if zj is not None and len(ops):
    print("\n### Accuracy: zcta's GPU duration vs CUDA events around the same op (rank 0)\n")
    print("Each op timed alone between its own events after a GPU sleep (30 calls per row); "
          "zcta = the op's time on its stream, gpu_end_ns − max(gpu_ready_ns, launch_ns) (the kernel "
          "span where gpu_ready_ns is NULL); error = zcta − events.\n")
    print("| op | size | engine | events median (us) | zcta median (us) | error median (us) | "
          "error p10..p90 (us) | within 2 % | within 5 % or 5 us | kernel span error median (us) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    mine = ops[(ops["rank"] == 0) & (ops.api_start_ns >= zj["accuracy_start_ns"])].sort_values("api_start_ns")
    bw_rows = []
    for a in zj["accuracy"]:
        rows = mine[(mine.op == a["op"]) & (mine.bytes == a["bytes"])]
        timed = rows.iloc[3:3 + len(a["event_us"])]  # after time_op's 3 warm-up calls
        kspan = ((timed.gpu_end_ns - timed.gpu_start_ns).astype("float64") / 1e3).tolist()
        z = stream_us(timed).tolist()
        ev = a["event_us"][:len(z)]
        if not z:
            continue
        err = [zi - ei for zi, ei in zip(z, ev)]
        s = pd.Series(err)
        w2 = sum(abs(e) <= 0.02 * t for e, t in zip(err, ev)) / len(err)
        w5 = sum(abs(e) <= max(0.05 * t, 5.0) for e, t in zip(err, ev)) / len(err)
        mib = a["bytes"] >> 20
        eng = timed.engine.mode().iat[0] if timed.engine.notna().any() else "n/m"
        kerr = statistics.median(k - e for k, e in zip(kspan, ev))
        print(f"| {a['op']} | {mib} MiB | {eng} | {statistics.median(ev):.1f} | {statistics.median(z):.1f} | "
              f"{s.median():+.1f} | {s.quantile(.1):+.1f}..{s.quantile(.9):+.1f} | {w2:.0%} | {w5:.0%} | "
              f"{kerr:+.1f} |")
        bw_rows.append(a)
    rep = os.path.join(res, "report.json")
    if os.path.exists(rep):
        groups = json.load(open(rep))["groups"]
        factor = {"AllReduce": 2 * (zj["world"] - 1) / zj["world"], "AlltoAll": (zj["world"] - 1) / zj["world"]}
        print("\n### Accuracy: busbw, `zcta report` vs an nccl-tests-style loop (20 back-to-back calls "
              "between two events)\n")
        print("| op | size | loop busbw (GB/s) | zcta report busbw (GB/s) | difference |")
        print("|---|---|---|---|---|")
        for a in bw_rows:
            loop = a["bytes"] / (a["loop_us"] * 1e-6) / 1e9 * factor[a["op"]]
            g = [g for g in groups if g["op"] == a["op"] and g["size_bucket_bytes"] == a["bytes"]
                 and g["busbw_gbs"] is not None]
            if not g:
                continue
            g = max(g, key=lambda g: g["count"])
            print(f"| {a['op']} | {a['bytes'] >> 20} MiB | {loop:.1f} | {g['busbw_gbs']:.1f} | "
                  f"{g['busbw_gbs'] / loop - 1:+.1%} |")

ph = read_table(run, "phases")
if len(ph):
    cols = ["init_ns", "queue_ns", "sync_ns", "barrier_ns", "transfer_ns", "memcpy_ns", "proxy_ns"]
    w = ph[ph.window_ns.notna()]
    total = w[cols].fillna(0).sum(axis=1) + w.unresolved_ns
    bad = (total != w.window_ns).sum()
    neg = (w[cols + ["unresolved_ns"]] < 0).any(axis=1).sum()
    unres = (w.unresolved_ns > 0).sum()
    print("\n### Phase conservation over every op of the run\n")
    print(f"{len(ph)} ops, {len(w)} with a window; window ≠ Σ phases + unresolved: **{bad}**; "
          f"a negative phase: **{neg}**; ops with some time unresolved: {unres} "
          f"({unres / max(len(w), 1):.1%}).")

proc = read_table(run, "process")
if len(ops) and len(proc):
    disk = int(open(os.path.join(res, "disk_bytes")).read()) if os.path.exists(os.path.join(res, "disk_bytes")) else None
    gpu = read_table(run, "gpu")
    lag = json.load(open(os.path.join(res, "wal_lag.json"))) if os.path.exists(os.path.join(res, "wal_lag.json")) else {}
    print("\n### Data (the zcta process pair of round 0)\n")
    print("| measure | value |")
    print("|---|---|")
    print(f"| ops rows / gpu rows | {len(ops)} / {len(gpu)} |")
    if disk:
        print(f"| bytes on disk per op (whole run directory, every table) | {disk / len(ops):.1f} |")
    if lag.get("rows"):
        print(f"| writer lag, GPU end → row in the log (p50 / p99 / max, {lag['rows']} rows, ±{lag['poll_ms']} ms) | "
              f"{lag['p50_ms']:.0f} / {lag['p99_ms']:.0f} / {lag['max_ms']:.0f} ms |")
    print(f"| CUPTI records dropped | {int(proc.cupti_dropped.fillna(0).sum())} |")
    print(f"| queue drops (records_dropped) | {int(proc.records_dropped.fillna(0).sum())} |")
    print(f"| ops without GPU side (engine none) | {int(proc.ops_without_gpu.fillna(0).sum())} |")
    print(f"| CUPTI | {', '.join(sorted(set(proc.cupti)))} |")
