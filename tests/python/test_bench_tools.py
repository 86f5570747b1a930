"""The GPU benchmark's and examples' host-side pieces, driven without a GPU: the timing
arithmetic of examples/nccl_bench.py, bench/wal_lag.py on a live stand-in run, and
bench/gpu_bench_report.py on a stand-in run plus synthetic job results."""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import pandas as pd
import pytest

from test_readers import ROOT, host, run_job, shim, stand_in_cupti  # noqa: F401 (fixture)

sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "analysis"))
import nccl_bench as nb  # noqa: E402
from zcta_analysis import stream_time_ns  # noqa: E402

ZCTA = ROOT / "target" / "debug" / "zcta"


def test_nccl_bench_arithmetic():
    assert nb.parse_size("1M") == 1 << 20
    assert nb.parse_size("16MiB") == 16 << 20
    assert nb.parse_size("1g") == 1 << 30
    assert nb.parse_size("4096") == 4096
    assert nb.elements(1 << 20, 2) == 262144
    assert nb.elements(1 << 20, 3) % 3 == 0 and nb.elements(1 << 20, 3) <= 262144
    assert [nb.fmt_bytes(n) for n in (1 << 30, 3 << 20, 1536, 7)] == ["1 GiB", "3 MiB", "1536 B", "7 B"]
    s = nb.stats([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["min"], s["max"], s["n"], s["p99"]) == (3.0, 1.0, 5.0, 5, 5.0)
    # nccl-tests: AllReduce 2(n-1)/n, AlltoAll (n-1)/n, Broadcast 1; GB = 1e9 bytes.
    assert nb.busbw_gbs("all_reduce", 10**9, 1e6, 2) == pytest.approx(1.0)
    assert nb.busbw_gbs("all_to_all", 10**9, 1e6, 8) == pytest.approx(7 / 8)
    assert nb.busbw_gbs("broadcast", 10**9, 1e6, 4) == pytest.approx(1.0)


def test_pin_rank_cpu_sets():
    assert nb.parse_cpu_list("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    for bad in ("", "3-1", "a", "0-", "1,,2", "\u00b2"):
        with pytest.raises(ValueError):
            nb.parse_cpu_list(bad)
    assert nb.pin_rank(0, "") is None
    mine = sorted(os.sched_getaffinity(0))
    try:
        # Rank 1 of "A:B" gets B, intersected with what the process may use.
        assert nb.pin_rank(1, f"{mine[0]}:{mine[-1]},{mine[-1] + 1000}") == {mine[-1]}
        assert os.sched_getaffinity(0) == {mine[-1]}
        with pytest.raises(ValueError, match="local rank 2 has none"):
            nb.pin_rank(2, "0:1")
        with pytest.raises(ValueError, match="local rank 1: not a CPU list"):
            nb.pin_rank(1, "0-7:")
        with pytest.raises(ValueError, match="none of"):
            nb.pin_rank(0, f"{mine[-1] + 1000}")
    finally:
        os.sched_setaffinity(0, mine)


def test_ab_helpers():
    assert [nb.abba_on(b) for b in range(8)] == [True, False, False, True] * 2
    lo, hi = nb.bootstrap_ci(statistics.median, [[1.0] * 5 + [3.0] * 5])
    assert 1.0 <= lo <= hi <= 3.0
    assert nb.bootstrap_ci(statistics.median, [[2.0] * 9]) == (2.0, 2.0)


def test_wal_lag_sees_rows_become_durable(host, tmp_path):  # noqa: F811
    """A live process under the shim: every row the watcher sees in the log is
    durable within the hold (1 s) plus one flush (0.5 s), give or take the poll."""
    idfile = tmp_path / "id"
    idfile.write_bytes(os.urandom(128))
    env = {**os.environ, "LD_PRELOAD": str(shim()), "ZCTA_OUT": str(tmp_path), "ZCTA_RUN_ID": "lag",
           "HOST_CUPTI": stand_in_cupti(host), "ZCTA_GPU": "deep"}
    p = subprocess.Popen([host, "loop", idfile], env=env, stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"started"
    stop, out = tmp_path / "stop", tmp_path / "lag.json"
    w = subprocess.Popen([sys.executable, ROOT / "bench" / "wal_lag.py", tmp_path / "lag", out, stop])
    time.sleep(4)
    stop.touch()
    assert w.wait(timeout=30) == 0
    p.send_signal(signal.SIGKILL)
    p.wait()
    lag = json.loads(out.read_text())
    assert lag["rows"] > 100, lag
    assert lag["rows_without_gpu_end"] == 0, lag
    assert 0 < lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"] < 4000, lag


def test_gpu_bench_report_tables(host, tmp_path):  # noqa: F811
    runs = tmp_path / "runs"
    runs.mkdir()
    # Deep mode with the stand-in CUDA driver and every op timed with events, so
    # gpu_ready_ns exists.
    cuda = str(host.parent / "cuda" / "libcuda.so.1")
    run = run_job(host, runs, "zcta-0", ranks=2, iters=10, cupti=True,
                  extra_env={"HOST_CUDA": cuda, "ZCTA_BUDGET": "all"})
    subprocess.run([ZCTA, "phases", run], check=True, capture_output=True)
    # Nullable integer dtypes, as zcta_analysis reads them for the report: pandas' default
    # for an integer column holding NULLs (gpu_ready_ns where the event pool ran empty) is
    # float64, which holds these ns-since-epoch times to 256 ns only.
    ops = pd.read_parquet(run / "ops", dtype_backend="numpy_nullable")
    mine = ops[(ops["rank"] == 0) & (ops.op == "AllReduce")].sort_values("api_start_ns")
    size = int(mine.bytes.iloc[0])
    mine = mine[mine.bytes == size]
    # The op's time on its stream, as the report computes it: from the events where the
    # op was timed (a burst can find the event pool empty: those ops have the kernel
    # span, which the report falls back to).
    timed = mine.gpu_ready_ns.iloc[3:].notna()
    assert timed.any(), mine.timing.value_counts()
    span = mine.gpu_end_ns - mine.gpu_start_ns
    zcta_us = ((mine.gpu_end_ns - mine[["gpu_ready_ns", "launch_ns"]].max(axis=1)).where(
        mine.gpu_ready_ns.notna(), span) / 1e3).tolist()[3:]
    # The analysis package's helper says the same, and NaN where readiness is unknown.
    got = (stream_time_ns(mine).fillna(span.astype("float64")).iloc[3:] / 1e3).tolist()
    assert got == zcta_us
    assert stream_time_ns(mine.assign(gpu_ready_ns=None)).isna().all()
    assert stream_time_ns(mine.drop(columns="gpu_ready_ns")).isna().all()
    res = tmp_path / "work" / "res"
    res.mkdir(parents=True)
    measures = ["train_step_ms", "allreduce_8B_us", "a2a_1MiB_us", "a2a_128MiB_us"]
    for config, scale in (("plain", 1.0), ("zcta", 1.1)):
        for rnd in (0, 1):
            med = {m: 10.0 * scale * (1 + rnd) for m in measures}
            acc = []
            if config == "zcta" and rnd == 0:
                # Events 1 us longer than zcta's GPU span of the same calls.
                acc = [{"op": "AllReduce", "bytes": size, "event_us": [z + 1.0 for z in zcta_us], "loop_us": 50.0}]
            (res / f"{config}-{rnd}.json").write_text(json.dumps(
                {"config": config, "round": rnd, "world": 2, "medians": med, "reps": {}, "accuracy": acc,
                 "accuracy_start_ns": int(ops.api_start_ns.min()) - 1}))
    # A configuration run with fewer measures (gpu_job.py --measures): "—" where it has none.
    (res / "nokinds-0.json").write_text(json.dumps(
        {"config": "nokinds", "round": 0, "world": 2, "medians": {"allreduce_8B_us": 10.5}, "reps": {},
         "accuracy": [], "accuracy_start_ns": 0, "pinned": {"spec": "0-7:8-15", "rank0_cpus": [0, 1]}}))
    # Two rounds of a configuration with the shim: the time-in-call table takes each run's
    # median of api_end_ns - api_start_ns, then the median over rounds.
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Its ops files are zcta's (a real one's columns and metadata, with these rows' values):
    # zcta_analysis, like zcta, skips a file zcta did not write.
    real = pq.read_table(sorted((run / "ops").glob("*.parquet"))[0])
    for rnd, durs in ((0, [10_000, 20_000, 90_000]), (1, [40_000, 40_000, 50_000])):
        d = runs / f"nokinds-{rnd}" / "ops"
        d.mkdir(parents=True)
        # Round 1's job timed accuracy from t=500: its call at t=1000 is left out.
        late = [(1_000, 10_000_000)] if rnd == 1 else []
        cols = {"op": ["AllReduce"] * (3 + len(late)) + ["AlltoAll"],
                "bytes": [8] * (3 + len(late)) + [1 << 10],
                "api_start_ns": [0, 0, 0] + [t for t, _ in late] + [0],
                "api_end_ns": durs + [e for _, e in late] + [5_000],
                "rank": [0, 1, 0] + [0] * len(late) + [0]}
        t = real.slice(0, len(cols["op"]))
        for name, values in cols.items():
            i = t.column_names.index(name)
            t = t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type))
        pq.write_table(t, d / "x.parquet")
    (res / "nokinds-1.json").write_text(json.dumps(
        {"config": "nokinds", "round": 1, "world": 2, "medians": {}, "reps": {},
         "accuracy": [{"op": "AllReduce", "bytes": 8, "event_us": [], "loop_us": 1.0}], "accuracy_start_ns": 500}))
    (res / "disk_bytes").write_text("123456")
    (res / "wal_lag.json").write_text(json.dumps({"rows": 10, "p50_ms": 1200.0, "p99_ms": 1500.0,
                                                  "max_ms": 1510.0, "poll_ms": 50}))
    out = subprocess.run([sys.executable, ROOT / "bench" / "gpu_bench_report.py", tmp_path / "work", runs],
                         check=True, capture_output=True, text=True).stdout
    # Ratio per round against plain of the same round: 1.1 in both rounds.
    assert "| examples/train.py step (ms) | zcta ≤ 1.01× | 15.00 | 16.50 (1.100× [1.100, 1.100]) | — |" in out, out
    assert "Ranks pinned (BENCH_RANK_CPUS, one CPU set per local rank): 0-7:8-15, unknown." in out, out
    assert "| 8-byte all_reduce host loop (us/call) | zcta ≤ 1.03× | 15.00 | 16.50 (1.100× [1.100, 1.100]) | " \
           "10.50 (1.050× [1.050, 1.050]) |" in out, out
    row = next(line for line in out.splitlines() if line.startswith("| AllReduce |") and "sm_kernel" in line)
    assert "| -1.0 | -1.0..-1.0 |" in row, row
    assert "window ≠ Σ phases + unresolved: **0**" in out, out
    assert f"| bytes on disk per op (whole run directory, every table) | {123456 / len(ops):.1f} |" in out
    assert "| CUPTI records dropped | 0 |" in out
    assert "1200 / 1500 / 1510 ms" in out
    # Medians 20 and 40 us; the 1 KiB AlltoAll is not the 1 MiB one.
    assert "| nokinds | 30.00 [20.00, 40.00] (3) | — |" in out, out


def test_gpu_scripts_compile():
    """The GPU-only scripts (bench/, tests/gpu/, examples/) never run in CI: at least
    they must parse, and the shell ones pass `bash -n`."""
    scripts = sorted([*ROOT.glob("bench/*.py"), *ROOT.glob("tests/gpu/*.py"), *ROOT.glob("examples/*.py")])
    assert len(scripts) > 10
    for f in scripts:
        compile(f.read_text(), str(f), "exec")
    shells = sorted([*ROOT.glob("bench/*.sh"), *ROOT.glob("tests/gpu/*.sh")])
    assert len(shells) > 5
    for f in shells:
        r = subprocess.run(["bash", "-n", f], capture_output=True, text=True)
        assert r.returncode == 0, f"{f}: {r.stderr}"


def test_cupti_ctypes_collects_records_from_the_stand_in(host):  # noqa: F811
    """bench/cupti_ctypes.py (the CUPTI plumbing of the GPU-only benchmarks) against the
    stand-in libcupti: buffers are handed out, filled and collected."""
    code = f"""
import ctypes, struct, sys
sys.path.insert(0, {str(ROOT / 'bench')!r})
lib = ctypes.CDLL({stand_in_cupti(host)!r}, mode=ctypes.RTLD_GLOBAL)
from cupti_ctypes import Activity
act = Activity()
act.check("enable", act.cupti.cuptiActivityEnable(10))
for _ in range(3):
    lib.fake_cupti_user_kernel(0)
act.check("flush", act.cupti.cuptiActivityFlushAll(1))
nxt = act.cupti.cuptiActivityGetNextRecord
nxt.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
kinds = []
for a, valid in act.done:
    r = ctypes.c_void_p()
    while nxt(a, valid, ctypes.byref(r)) == 0:
        kinds.append(struct.unpack_from("<I", ctypes.string_at(r.value, 4))[0])
print(kinds.count(10), len(act.bufs) >= 1)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "True"], out.stdout


def test_self_process_ab_report():
    """bench/self_process_ab_report.py pairs each setting's process with the plain process
    of the same round, as gpu_self_ab.py --always-on prints them."""
    sys.path.insert(0, str(ROOT / "bench"))
    from self_process_ab_report import table

    item = "send/recv to self, 8 B"
    log = [f"{'plain:0':16} {item:30} plain {10.0:9.3f} us",
           f"{'plain:1':16} {item:30} plain {20.0:9.3f} us",
           f"{'default:0':16} {item:30} on {11.0:9.3f} us",
           f"{'default:1':16} {item:30} on {26.0:9.3f} us",
           f"{'no-kinds:2':16} {item:30} on {9.0:9.3f} us",  # no plain in round 2: no ratio
           "default round 1: failed"]
    out = table(log)
    row = next(line for line in out if line.startswith("default "))
    assert row.split()[-5:] == ["18.500", "1.200", "[1.100,", "1.300]", "(2)"], row
    assert next(line for line in out if line.startswith("no-kinds")).rstrip().endswith("9.000")
    assert next(line for line in out if line.startswith("plain")).rstrip().endswith("15.000")


def test_reencode_example(host, tmp_path):  # noqa: F811
    """examples/reencode.rs (built by `cargo build --all-targets`) sizes a run's table
    with today's Parquet settings, and reads the run without changing it."""
    run = run_job(host, tmp_path, "r", ranks=2, iters=5, cupti=True)
    tool = ROOT / "target" / "debug" / "examples" / "reencode"
    before = sorted((p.name, p.stat().st_size) for p in (run / "gpu").iterdir())
    out = subprocess.run([tool, run, "gpu"], check=True, capture_output=True, text=True).stdout
    n = len(pd.read_parquet(run / "gpu"))
    assert n > 0 and out.startswith(f"gpu: {n} rows in "), out
    assert sorted((p.name, p.stat().st_size) for p in (run / "gpu").iterdir()) == before
    bad = subprocess.run([tool, run, "proxy"], capture_output=True, text=True)  # the stand-in wrote none
    assert bad.returncode != 0 and f"no Parquet files in {run / 'proxy'}" in bad.stderr, bad.stderr
    bad = subprocess.run([tool, run, "phases"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown table phases" in bad.stderr, bad.stderr
    # A truncated file is an error that names it.
    f = next((run / "ops").glob("*.parquet"))
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    bad = subprocess.run([tool, run, "ops"], capture_output=True, text=True)
    assert bad.returncode != 0 and str(f) in bad.stderr and "truncated or corrupt" in bad.stderr, bad.stderr


def test_gpu_bench_configurations_agree():
    """bench/gpu_bench.sh's configurations (its config_env arms and its error message),
    gpu_job.py's --config choices and the report's column order name the same set."""
    import ast
    import re

    sh = (ROOT / "bench" / "gpu_bench.sh").read_text()
    body = sh[sh.index("config_env() {"):sh.index("\n}\n", sh.index("config_env() {"))]
    arms = {n.strip() for m in re.findall(r"^\s+([a-z| ]+)\)", body, re.M) for n in m.split("|")}
    known = set(re.search(r"known: ([a-z ]+)\)", sh).group(1).split())
    job = ast.parse((ROOT / "bench" / "gpu_job.py").read_text())
    choices = next(set(ast.literal_eval(k.value)) for n in ast.walk(job) if isinstance(n, ast.Call)
                   for k in n.keywords if k.arg == "choices")
    rep = (ROOT / "bench" / "gpu_bench_report.py").read_text()
    tup = re.search(r"CONFIGS = \[c for c in \(([^)]*)\)", rep).group(1)
    report = set(ast.literal_eval("(" + tup + ")"))
    assert len(arms) >= 10, arms
    assert arms == known == choices == report, (arms, known, choices, report)


def test_always_on_report_names_each_loops_baseline(tmp_path):
    """bench/always_on_report.py: the in-process ratios per configuration, and which
    blocks each loop was compared against (`direct`: libnccl's own functions, no shim
    work; `paused`: the shim's paused path; older runs wrote no `ab_off`)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from always_on_report import ab_off_note, ab_table

    def write(config, rnd, ratio, off):
        j = {"config": config, "round": rnd, "reps": {"sr_8B_us": [10.0]}, "median": {"sr_8B_us": 10.0},
             "threads": {}, "paused": {"sr_8B_us": [10.0 / ratio]}, "ab": {"sr_8B_us": ratio},
             "ab_pairs": {"sr_8B_us": ratio}, "ab_fastest": {"sr_8B_us": ratio}, "ab_block_items": {"sr_8B_us": 9}}
        if off is not None:
            j["ab_off"] = {"sr_8B_us": off}
        (tmp_path / f"{config}-{rnd}.json").write_text(json.dumps(j))

    write("default", 0, 1.04, "direct")
    write("default", 1, 1.02, "direct")
    write("default", 2, 1.03, None)
    row = next(line for line in ab_table(tmp_path).splitlines() if line.startswith("| sr_8B_us"))
    assert "**1.030×** [1.020, 1.040]" in row, row
    assert ab_off_note(tmp_path) == "off side of the A/B: sr_8B_us direct"
    write("nomask", 0, 1.01, "paused")
    assert ab_off_note(tmp_path) == "off side of the A/B: sr_8B_us direct/paused"


def test_always_on_report_compares_whole_processes_by_their_off_blocks_too(tmp_path):
    """bench/always_on_report.py's rotated tables: each configuration against plain of
    the same round, once by its recording blocks (`median`) and once by its off blocks
    (`paused`, the median over repetitions), so a cost that falls on both sides of the
    in-process ratios shows there."""
    sys.path.insert(0, str(ROOT / "bench"))
    from always_on_report import load, off_blocks, table

    def write(config, rnd, on, off):
        j = {"config": config, "round": rnd, "median": {"sr_8B_us": on}, "paused": {"sr_8B_us": off}}
        (tmp_path / f"{config}-{rnd}.json").write_text(json.dumps(j))

    write("plain", 0, 10.0, [10.0, 10.2])
    write("plain", 1, 20.0, [20.0, 19.8])
    write("default", 0, 11.0, [10.5, 10.7])
    write("default", 1, 21.0, [20.6, 20.0])
    on = next(line for line in table(load(tmp_path)).splitlines() if line.startswith("| sr_8B_us"))
    assert "16.00: **1.075×** [1.050, 1.100]" in on, on
    off = next(line for line in table(off_blocks(tmp_path), "off").splitlines() if line.startswith("| sr_8B_us"))
    # plain's off medians 10.1 and 19.9, default's 10.6 and 20.3.
    assert "| 15.00 (n=2) |" in off and "15.45: **1.035×** [1.020, 1.050]" in off, off


def test_always_on_report_pools_every_block_pair(tmp_path):
    """bench/always_on_report.py's pooled table: each process's block log is read in
    pairs of neighbouring blocks (either side first; a pair of one side, or a paused
    block without a positive time, is not a pair), every pair of every process of a
    configuration pooled, their median given with a seeded 95 % bootstrap interval that
    resamples the processes first (wider than resampling pairs alone when processes
    differ), and the numbers of pairs and processes."""
    sys.path.insert(0, str(ROOT / "bench"))
    from always_on_report import block_pairs, median_interval, pooled_table

    assert block_pairs([[False, 2.0], [True, 3.0], [True, 4.0], [False, 2.0], [True, 1.0], [True, 1.0],
                        [True, 1.0, 1.0], [False, 0.0, 1.0]]) == [1.5, 2.0]
    assert block_pairs([[True, 3.0, 2.0], [False, 2.0, None], [False, 2.0, 1.0], [True, 3.0, 3.0]], 2) == [3.0]
    v = [float(x) for x in range(1, 20)] + [1000.0]
    med, lo, hi = median_interval([v])
    assert med == 10.5 and 1.0 < lo < med < hi < 1000.0, (med, lo, hi)
    assert median_interval([v]) == (med, lo, hi), "seeded: the same interval"
    # Two processes of different speeds: resampling them widens the interval.
    slow, fast = [1.10 + 0.001 * i for i in range(10)], [1.00 + 0.001 * i for i in range(10)]
    _, lo2, hi2 = median_interval([slow, fast])
    _, lo1, hi1 = median_interval([slow + fast])
    assert lo2 < lo1 and hi2 > hi1 and lo2 <= 1.01 and hi2 >= 1.10, (lo1, hi1, lo2, hi2)

    def write(config, rnd, pairs):
        blocks = []
        for i, (on, off) in enumerate(pairs):
            side = [[True, on, None], [False, off, None]]
            blocks += side if i % 2 else side[::-1]
        (tmp_path / f"{config}-{rnd}.json").write_text(
            json.dumps({"config": config, "round": rnd, "ab_blocks": {"a2a_8B_us": blocks}}))

    write("default", 0, [(1.1, 1.0), (1.2, 1.0)])
    write("default", 1, [(1.3, 1.0), (0.9, 1.0), (1.0, 1.0)])
    write("plain", 0, [(1.0, 1.0)])
    table = pooled_table(tmp_path)
    row = next(line for line in table.splitlines() if line.startswith("| a2a_8B_us"))
    assert table.splitlines()[1] == "| measure | plain | default |", table
    cells = [c.strip() for c in row.split("|")[2:4]]
    assert cells[0].startswith("**1.000×**") and cells[0].endswith("(1 / 1)"), cells
    assert cells[1].startswith("**1.100×**") and cells[1].endswith("(5 / 2)"), cells
    assert pooled_table(tmp_path / "none") == ""


def test_always_on_report_reads_the_fine_ab(tmp_path):
    """bench/always_on_report.py's fine table: each process's single items are paired in
    order (on[i] with off[i]; a pair whose paused item took no time is passed over),
    each process gives its median pair ratio, and every pair of a configuration is
    pooled with its bootstrap interval and the numbers of pairs and processes."""
    sys.path.insert(0, str(ROOT / "bench"))
    from always_on_report import fine_table

    def write(config, rnd, on, off):
        (tmp_path / f"{config}-{rnd}.json").write_text(json.dumps(
            {"config": config, "round": rnd, "ab_fine_items": {"tsr_8B_us": {"on": on, "off": off}}}))

    # Process 0: ratios 1.02, 1.04, 1.06 (and one pair with a zero paused item);
    # process 1: 1.00, 1.01, 1.02.
    write("default", 0, [102, 104, 106, 500], [100, 100, 100, 0])
    write("default", 1, [100, 101, 102], [100, 100, 100])
    write("plain", 0, [100, 100], [100, 100])
    table = fine_table(tmp_path)
    assert table.splitlines()[1] == "| measure | plain | default |", table
    row = next(line for line in table.splitlines() if line.startswith("| tsr_8B_us"))
    cells = [c.strip() for c in row.split("|")[2:4]]
    assert cells[0].startswith("**1.000×** [1.000, 1.000]; pooled 1.000×"), cells
    assert cells[0].endswith("(2 / 1); on − off 0 ns a pair, off side 100 ns"), cells
    # Processes' medians 1.04 and 1.01: their median 1.025; pooled median of the six
    # ratios 1.02; the six differences 2, 4, 6, 0, 1, 2 (the pair with a zero paused
    # item passed over here too): median 2.
    assert cells[1].startswith("**1.025×** [1.010, 1.040]; pooled 1.020×"), cells
    assert cells[1].endswith("(6 / 2); on − off 2 ns a pair, off side 100 ns"), cells
    assert fine_table(tmp_path / "none") == ""


def test_always_on_report_splits_the_fine_ab_by_which_side_ran_first(tmp_path):
    """Where the JSON says which side of each pair ran first (`on_first`), the fine
    table gives the pooled median of the pairs that ran recording first and of those
    that ran it second; without it (or with a list of another length) neither."""
    sys.path.insert(0, str(ROOT / "bench"))
    from always_on_report import fine_table

    def write(name, config, v):
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": config, "round": 0,
                                                           "ab_fine_items": {"a2a_8B_us": v}}))

    # Running first costs 2 %: recording first 1.02 × 1.01, second 1.01 / 1.02.
    write("default-0", "default", {"on": [103.02, 103.02, 99.02], "off": [100, 100, 100],
                                    "on_first": [True, True, False]})
    write("plain-0", "plain", {"on": [100, 100], "off": [100, 100], "on_first": [True]})
    table = fine_table(tmp_path)
    row = next(line for line in table.splitlines() if line.startswith("| a2a_8B_us"))
    plain, default = (c.strip() for c in row.split("|")[2:4])
    assert default.endswith("; recording first 1.030×, second 0.990×"), default
    assert "first" not in plain, plain


def test_always_on_report_splits_the_steps_cost_into_issuing_and_the_rest(tmp_path):
    """bench/always_on_report.py's issue table: per process the median over block pairs
    (either order) of recording / paused, for the whole step and for its issuing; runs
    without the issuing part are left out."""
    sys.path.insert(0, str(ROOT / "bench"))
    from always_on_report import issue_table

    def write(config, rnd, blocks):
        (tmp_path / f"{config}-{rnd}.json").write_text(json.dumps(
            {"config": config, "round": rnd, "ab_blocks": {"train_step_ms": blocks}}))

    assert issue_table(tmp_path) == ""
    # Recording costs 0.3 ms of a 12 ms step, none of it in the 8 ms of issuing.
    write("default", 0, [[False, 0.0117, 0.008], [True, 0.0120, 0.008],
                         [True, 0.0120, 0.008], [False, 0.0117, 0.008]])
    write("default", 1, [[True, 0.0240, 0.016], [False, 0.0234, 0.016]])
    write("plain", 0, [[False, 0.0117, 0.008], [True, 0.0117, 0.008]])
    write("nomask", 0, [[False, 0.0117, None], [True, 0.0118, None]])
    lines = issue_table(tmp_path).splitlines()
    assert lines[3] == "| plain | **1.000×** [1.000, 1.000] | **1.000×** [1.000, 1.000] |", lines
    assert lines[4] == "| default | **1.026×** [1.026, 1.026] | **1.000×** [1.000, 1.000] |", lines
    assert len(lines) == 5, lines


def test_measurement_build_patches_apply_to_the_tree(tmp_path):
    """bench/variants.sh builds the shim with one of bench/variants/*.patch applied:
    each must still apply to the tree (mended with the code it patches), and the
    script refuses a call without a name or with an unknown one."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    patches = sorted((ROOT / "bench" / "variants").glob("*.patch"))
    assert {p.stem for p in patches} >= {"nostamp"}, patches
    for p in patches:
        r = subprocess.run(["git", "apply", "--check", str(p)], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, f"{p.name} no longer applies: {r.stderr}"
    script = ROOT / "bench" / "variants.sh"
    r = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "name at least one variant" in r.stderr, r
    r = subprocess.run(["bash", str(script), str(tmp_path), "nosuch"], capture_output=True, text=True)
    assert r.returncode == 2 and "no bench/variants/nosuch.patch" in r.stderr, r


def test_direct_calls_bypass_the_shim(host, tmp_path):  # noqa: F811
    """The baseline bench/always_on.py gives the raw send/recv loops: calls through
    libnccl's own handle (examples/nccl_bench.py's `SelfComm.direct`) do not reach a
    preloaded shim, while calls through the global scope do. Under the shim, with the
    stand-in libnccl: 3 groups through each; only the first 3 are recorded."""
    lib = host.parent / "libnccl.so.2"
    script = tmp_path / "calls.py"
    script.write_text(
        "import ctypes, sys\n"
        "own = ctypes.CDLL(sys.argv[1])\n"
        "glob = ctypes.CDLL(None)\n"
        "assert ctypes.cast(own.ncclGroupStart, ctypes.c_void_p).value != "
        "ctypes.cast(glob.ncclGroupStart, ctypes.c_void_p).value\n"
        "for f in (glob, own):\n"
        "    for _ in range(3):\n"
        "        assert f.ncclGroupStart() == 0 and f.ncclGroupEnd() == 0\n")
    out = tmp_path / "out"
    env = {**os.environ, "LD_PRELOAD": str(shim()), "ZCTA_OUT": str(out), "ZCTA_RUN_ID": "direct"}
    subprocess.run([sys.executable, str(script), str(lib)], check=True, env=env, capture_output=True)
    calls = pd.concat(pd.read_parquet(p) for p in (out / "direct" / "calls").glob("*.parquet"))
    assert calls["call"].value_counts().to_dict() == {"GroupStart": 3, "GroupEnd": 3}


def test_the_gpu_checks_launch_zctas_own_stamp_kernel():
    """tests/gpu/events.py measures what zcta's two stamps add to the program's own
    window by launching the same kernel: examples/nccl_bench.py's stamp_ptx reads the
    shim's PTX out of its source, which must still hold one kernel, zcta_stamp, that
    writes %globaltimer to its one parameter."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import nccl_bench
    finally:
        sys.path.pop(0)
    ptx = nccl_bench.stamp_ptx()
    assert ptx.startswith(".version") and ptx.count(".entry") == 1, ptx
    assert ".entry zcta_stamp(.param .u64 p)" in ptx and "%globaltimer" in ptx, ptx
    assert "st.volatile.global.u64" in ptx, ptx



class _Event:
    """A CUDA event's stand-in: recorded at `t_us` on the GPU."""

    def __init__(self, t_us):
        self.t_us = t_us

    def elapsed_time(self, end):
        return (end.t_us - self.t_us) / 1e3  # ms, as torch.cuda.Event's


def _accuracy_case(tmp_path, zcta_shift_us, events_ideal_shift_us=0.5, stamps_ideal=True):
    """A synthetic run of tests/gpu/events.py's accuracy part, settled as the GPU run
    settles it: per kind and size, 100 ops of `true` µs; the program's window holds the
    op, its launch gaps and zcta's two stamps; the correction's events around two stamps
    back to back read 6 µs, 2 µs of it the stamps' own interval; zcta's rows read the op
    `zcta_shift_us` off. The events' ideal reads `events_ideal_shift_us` off, the
    stamps' ideal reads what zcta should."""
    import random

    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    try:
        import events
    finally:
        sys.path.pop(0)
    rnd = random.Random(7)
    clock = {}

    def stamps(a_ns, b_ns):
        k = len(clock)
        clock[k], clock[k + 1] = a_ns, b_ns
        return k, k + 1

    def two_stamps():
        return (_Event(0.0), _Event(6.0)), stamps(10_000, 12_000)

    got, ops, op_id = [], [], 0
    for kind, op in [("sr", "Send"), ("a2a", "AlltoAll")]:
        for nbytes in events.SIZES:
            true_us = 4.0 + nbytes / (1 << 20)
            for _ in range(events.ITERS):
                jitter = rnd.choice([0.0, 0.03, 0.06])
                # E0 S1 op S2 E1: 4 us of gaps outside the stamps' reading.
                c, slots = two_stamps()
                got.append({"kind": kind, "bytes": nbytes, "e": (_Event(0.0), _Event(true_us + 4.0 + jitter)),
                            "c": c, "slots": slots})
                op_id += 1
                ops.append({"op_id": op_id, "op": op, "bytes": nbytes, "timing": "timed", "gpu_ready_ns": 1_000,
                            "gpu_end_ns": 1_000 + round((true_us + zcta_shift_us) * 1e3)})
            for _ in range(events.ITERS):
                got.append({"kind": kind, "bytes": nbytes, "ideal": True,
                            "e": (_Event(0.0), _Event(true_us + 2.6)),
                            "i": (_Event(0.0), _Event(true_us + events_ideal_shift_us)),
                            "c": (_Event(0.0), _Event(2.6))})
                if stamps_ideal:
                    c, slots = two_stamps()
                    got.append({"kind": kind, "bytes": nbytes, "ideal_stamps": True,
                                "e": (_Event(0.0), _Event(true_us + 4.0)),
                                "si": stamps(50_000, 50_000 + round(true_us * 1e3)), "c": c, "slots": slots})
    got = [events.settle(r, clock.__getitem__) for r in got]
    assert all(r["two_records_us"] == pytest.approx(4.0) for r in got if "ideal" not in r)
    (tmp_path / "acc" / "ops").mkdir(parents=True)
    pd.DataFrame(ops).to_parquet(tmp_path / "acc" / "ops" / "part-0.parquet")
    (tmp_path / "acc.json").write_text(json.dumps(got))
    return events, tmp_path / "acc.json", tmp_path / "acc"


def test_gpu_accuracy_check_passes_matching_stamps_and_fails_an_offset(tmp_path, capsys):
    """The accuracy check (tests/gpu/events.py: settle, then check-accuracy) on
    synthetic rows: zcta reading the op as the program's events do, less what two
    stamps add beyond their own interval, passes every size though the events' ideal
    reads 0.5 us off (the means are compared with the stamps' ideal); zcta 2 us short,
    as the check's old correction made every op look, fails every size; 0.5 us off
    fails the means condition alone; files without the stamps' ideal compare the
    means with the events' ideal. The last line, over every size, counts the timed ops
    within max(1 us, 2 %) against 95 %: it passes the 0.5 us offset that the sizes'
    means condition fails, and fails the 2 us one."""
    events, out, run = _accuracy_case(tmp_path / "a", 0.0)
    assert events.check_accuracy(out, run)
    text = capsys.readouterr().out
    assert text.count("ok   accuracy ") == 6 and "stamps' ideal differ" in text, text
    assert "ok   accuracy, every size: 600/600 timed; within max(1 us, 2 %): 600/600 (100.0%)" in text, text
    events, out, run = _accuracy_case(tmp_path / "b", -2.0)
    assert not events.check_accuracy(out, run)
    text = capsys.readouterr().out
    assert text.count("FAIL accuracy ") == 6 and "within max(1 us, 2 %): 0/100" in text, text
    assert "FAIL accuracy, every size: 600/600 timed; within max(1 us, 2 %): 0/600 (0.0%)" in text, text
    events, out, run = _accuracy_case(tmp_path / "c", -0.5)
    assert not events.check_accuracy(out, run)
    text = capsys.readouterr().out
    assert text.count("FAIL accuracy ") == 6 and "within max(1 us, 2 %): 0/100" not in text, text
    assert "ok   accuracy, every size: 600/600 timed; within max(1 us, 2 %): 600/600" in text, text
    events, out, run = _accuracy_case(tmp_path / "d", 0.0, events_ideal_shift_us=0.0, stamps_ideal=False)
    assert events.check_accuracy(out, run)
    text = capsys.readouterr().out
    assert text.count("ok   accuracy ") == 6 and "events' ideal differ" in text, text
    # An op the check measured that zcta did not time fails its size and the last line.
    events, out, run = _accuracy_case(tmp_path / "e", 0.0)
    f = next((run / "ops").glob("*.parquet"))
    ops = pd.read_parquet(f)
    ops.loc[0, "timing"] = "budget"
    ops.to_parquet(f)
    assert not events.check_accuracy(out, run)
    text = capsys.readouterr().out
    assert text.count("FAIL accuracy ") == 1 and "99/100 timed" in text, text
    assert "FAIL accuracy, every size: 599/600 timed" in text, text


def test_stamp_slots_go_round_the_ring_and_the_first_launch_sets_up(monkeypatch):
    """examples/nccl_bench.py's stamps, against a stand-in libcuda: slots taken before
    the first launch do not skip its set-up, the set-up keeps the ring's place, and
    each launch passes its slot's device address."""
    import ctypes

    launched = []

    class Cuda:
        def cuModuleLoadData(self, mod, ptx):
            mod._obj.value = 1
            return 0

        def cuModuleGetFunction(self, f, mod, name):
            f._obj.value = 2
            return 0

        def cuMemHostAlloc(self, host, size, flags):
            host._obj.value = 0x1000
            return 0

        def cuMemHostGetDevicePointer_v2(self, dev, host, flags):
            dev._obj.value = 0x7000_0000
            return 0

        def cuLaunchKernel(self, f, *rest):
            params = rest[-2]
            launched.append(ctypes.c_uint64.from_address(params[0]).value)
            return 0

    class Stream:
        cuda_stream = 0

    saved = dict(nb._stamper)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Cuda())
    try:
        nb._stamper.clear()
        nb._stamper["next"] = nb.STAMP_SLOTS - 2
        slots = nb._take_slots()
        assert slots == (nb.STAMP_SLOTS - 2, nb.STAMP_SLOTS - 1)
        for k in slots:
            nb.stamp(Stream(), k)
        assert launched == [0x7000_0000 + 8 * k for k in slots]
        assert nb._take_slots() == (0, 1)
        with pytest.raises(ValueError):
            nb.stamp(Stream(), nb.STAMP_SLOTS)
    finally:
        nb._stamper.clear()
        nb._stamper.update(saved)


def test_isolating_the_measuring_thread_keeps_it_off_the_others_cores(tmp_path):
    """bench/affinity.py: core siblings read from sysfs (ranges and lists), the plan
    (the lowest allowed CPU for the measuring thread, every CPU of another core for the
    rest, none when no other core is allowed), and its application in a process: the
    calling thread ends on the planned CPU and a thread started before it on the rest."""
    sys.path.insert(0, str(ROOT / "bench"))
    import affinity

    for cpu, text in ((0, "0,8"), (1, "1-2"), (3, "3\n")):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text)
    sib = lambda c: affinity.core_siblings(c, tmp_path)  # noqa: E731
    assert (sib(0), sib(1), sib(3), sib(5)) == ({0, 8}, {1, 2}, {3}, {5})
    assert affinity.plan({8, 0, 1, 2, 3}, sib) == (0, {1, 2, 3})
    assert affinity.plan({1, 2}, sib) is None
    assert affinity.plan({0, 8}, sib) is None
    assert affinity.plan({3, 5}, sib) == (3, {5})
    assert affinity.plan(set(), sib) is None

    allowed = sorted(os.sched_getaffinity(0))
    script = f"""
import json, os, sys, threading, time
sys.path.insert(0, {str(ROOT / "bench")!r})
import affinity
ready, stop, seen = threading.Event(), threading.Event(), {{}}
def other():
    seen["tid"] = threading.get_native_id()
    ready.set()
    stop.wait()
t = threading.Thread(target=other)
t.start()
ready.wait()
# sysfs of its own (no CPU shares a core) so that the plan does not depend on the box.
got = affinity.isolate_this_thread({str(tmp_path / "none")!r})
print(json.dumps({{"got": got, "me": sorted(os.sched_getaffinity(0)),
                   "other": sorted(os.sched_getaffinity(seen["tid"]))}}))
stop.set()
"""
    out = json.loads(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                    text=True).stdout)
    if len(allowed) < 2:
        assert out["got"]["isolated"] is False and out["me"] == allowed
        return
    assert out["got"]["isolated"] is True and out["got"]["threads_moved"] >= 1
    assert out["me"] == [allowed[0]]
    assert out["other"] == allowed[1:] == out["got"]["others"]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_callgrind_group_counts_the_shims_instructions_per_group(tmp_path):
    """bench/callgrind_group.sh: per send/recv group, the program alone executes some
    instructions, the shim loaded but disabled more, recording more still (the counts
    are deterministic; docs/PERFORMANCE.md keeps them per build)."""
    # The release shim where built; else the debug one the test run built (the order
    # of the counts holds for both).
    so = next((p for p in (ROOT / "target" / b / "libzcta_prof.so" for b in ("release", "debug")) if p.exists()),
              None)
    if so is None:
        pytest.skip("needs the shim built (cargo build)")
    env = dict(os.environ, FX=str(tmp_path / "fx"), N1="200", N2="1200", MODES="alone disabled nomask",
               TMPDIR=str(tmp_path))
    r = subprocess.run(["bash", str(ROOT / "bench" / "callgrind_group.sh"), str(so)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    got = dict(line.split() for line in r.stdout.splitlines()[1:])
    assert set(got) == {"alone", "disabled", "nomask"}, r.stdout
    alone, disabled, nomask = (int(got[m]) for m in ("alone", "disabled", "nomask"))
    assert 0 < alone < disabled < nomask, r.stdout


def always_on_processes(tmp_path, fields, **env):
    """Runs bench/always_on.sh with `env` and a stand-in `timeout` on PATH that starts
    no process: returns, per process it would have run in order, what `fields` (a
    shell expression over its limit and its arguments from --config on) says."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "processes"
    (fake / "timeout").write_text(
        '#!/bin/sh\nlimit=$1; shift\nwhile [ "$1" != --config ]; do shift; done\n'
        f'echo "{fields}" >> {log}\n')
    (fake / "timeout").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), **env}
    r = subprocess.run(["bash", str(ROOT / "bench" / "always_on.sh"), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return log.read_text().split("\n")[:-1]


def test_always_on_gives_torch_profiler_three_times_the_process_limit(tmp_path):
    """bench/always_on.sh: each process runs under `timeout PROC_TIMEOUT`, a
    torch.profiler process (profiler, profiler2, ...) under three times it, in the
    rotated order."""
    got = always_on_processes(tmp_path, "$2 $limit", ROUNDS="2", PROC_TIMEOUT="40",
                              CONFIGS="plain default profiler")
    assert got == ["plain 40", "default 40", "profiler 120", "default 40", "profiler 120", "plain 40"], got


def test_always_on_goes_on_from_a_later_round(tmp_path):
    """bench/always_on.sh with START_ROUND: only the rounds from it to ROUNDS run, each
    named by its number and in the rotation the whole run would give it, so that one
    run's rounds can be spread over several commands."""
    got = always_on_processes(tmp_path, "$2 $4", ROUNDS="5", START_ROUND="3", CONFIGS="plain default deep")
    assert got == ["plain 3", "default 3", "deep 3", "default 4", "deep 4", "plain 4"], got


def test_rounds_goes_on_from_earlier_json_and_stops_before_the_deadline(tmp_path):
    """bench/rounds.sh: always_on.sh one round a call from START_ROUND, with the JSON of
    earlier commands (PREV, a .tgz of json/) brought in and packed again with the new
    rounds'; no round starts that would end after DEADLINE."""
    import tarfile

    prev = tmp_path / "prev"
    (prev / "json").mkdir(parents=True)
    (prev / "json" / "plain-0.json").write_text(json.dumps({"config": "plain", "round": 0, "median": {"m": 1.0}}))
    with tarfile.open(tmp_path / "prev.tgz", "w:gz") as t:
        t.add(prev / "json", arcname="json")
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "processes"
    # A stand-in `timeout`: each process it would start writes its JSON and its name.
    (fake / "timeout").write_text(
        '#!/bin/sh\nshift\nwhile [ "$1" != --config ]; do shift; done\n'
        f'echo "$2 $4" >> {log}\n'
        'echo "{\\"config\\": \\"$2\\", \\"round\\": $4, \\"median\\": {\\"m\\": 1.0}}" > "$6/$2-$4.json"\n')
    (fake / "timeout").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(out), "PREV": str(tmp_path / "prev.tgz"),
           "START_ROUND": "1", "ROUNDS": "3", "CONFIGS": "plain default", "PER_ROUND": "1", "DEADLINE": "100"}
    r = subprocess.run(["bash", str(ROOT / "bench" / "rounds.sh"), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert log.read_text().split("\n")[:-1] == ["default 1", "plain 1", "plain 2", "default 2"], log.read_text()
    assert "next_round 3" in r.stdout, r.stdout
    with tarfile.open(out / "json.tgz") as t:
        names = sorted(n for n in t.getnames() if n.endswith(".json"))
    assert names == ["json/default-1.json", "json/default-2.json", "json/plain-0.json",
                     "json/plain-1.json", "json/plain-2.json"], names
    # A round taken to last longer than the time left does not start.
    log.unlink()
    env.update(OUT=str(tmp_path / "out2"), PER_ROUND="200")
    r = subprocess.run(["bash", str(ROOT / "bench" / "rounds.sh"), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not log.exists() and "stopped before round 1" in r.stdout and "next_round 1" in r.stdout, r.stdout


def test_gpu_report_check_says_not_measured_never_0(tmp_path, capsys):
    """tests/gpu/events.py's report check: each phase's share of the summed window, and
    "n/m" for a phase no op measured (pandas would sum its NULLs to 0); it passes at
    95 % of the window in measured phases and fails below."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    try:
        import events
    finally:
        sys.path.pop(0)

    def run(d, unresolved):
        (d / "phases").mkdir(parents=True)
        (d / "ops").mkdir()
        pd.DataFrame({"window_ns": pd.array([100, 100, None], dtype="Int64"),
                      "unresolved_ns": pd.array([0, unresolved, None], dtype="Int64"),
                      "init_ns": pd.array([10, 10, None], dtype="Int64"),
                      "queue_ns": pd.array([80, 80 - unresolved, None], dtype="Int64"),
                      "sync_ns": pd.array([None, None, None], dtype="Int64"),
                      "barrier_ns": pd.array([0, 0, None], dtype="Int64"),
                      "transfer_ns": pd.array([10, 10, None], dtype="Int64")}
                     ).to_parquet(d / "phases" / "p.parquet")
        pd.DataFrame({"timing": ["timed", "timed", "budget"],
                      "timing_level": pd.array([0, 0, 1], dtype="Int64"),
                      "gpu_end_ns": pd.array([1, 1, None], dtype="Int64")}).to_parquet(d / "ops" / "o.parquet")
        return d

    assert events.check_report(run(tmp_path / "a", 0))
    out = capsys.readouterr().out
    assert out.startswith("ok   report: 2 of 3 ops with a window; 100.0% of the summed window"), out
    assert "'sync': 'n/m'" in out and "'barrier': 0.0" in out and "'queue': 0.8" in out, out
    assert not events.check_report(run(tmp_path / "b", 20))
    assert capsys.readouterr().out.startswith("FAIL report: 2 of 3 ops with a window; 90.0%")


def test_gpu_anchor_check_wants_no_ready_time_before_its_call(tmp_path, capsys):
    """tests/gpu/events.py's anchor check: each group's ready time (one per group, of
    its ops) against the last return of its ops; earlier by more than the process
    row's claimed error fails, earlier within it passes (and is counted), and a run
    without a claimed error or a timed group fails."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    try:
        import events
    finally:
        sys.path.pop(0)

    def run(d, ready, err=2_000):
        for t in ("process", "ops", "calls"):
            (d / t).mkdir(parents=True)
        pd.DataFrame({"gpu_clock_error_ns": pd.array([err], dtype="Int64"),
                      "gpu_clock_drift_ns_per_s": pd.array([0], dtype="Int64")}).to_parquet(d / "process" / "p.parquet")
        # Two ops a group (their returns 8 and 10 us, then 18 and 20 us), one group not
        # timed.
        pd.DataFrame({"group_id": pd.array([1, 1, 2, 2, 3, 3], dtype="UInt64"),
                      "gpu_ready_ns": pd.array([ready[0]] * 2 + [ready[1]] * 2 + [None] * 2, dtype="Int64"),
                      "api_end_ns": pd.array([8_000, 10_000, 18_000, 20_000, 28_000, 30_000], dtype="Int64")}
                     ).to_parquet(d / "ops" / "o.parquet")
        pd.DataFrame({"call": ["GroupStart", "GroupEnd", "GroupEnd", "GroupEnd"],
                      "group_id": pd.array([1, 1, 2, 3], dtype="UInt64"),
                      "api_start_ns": pd.array([0, 12_000, 22_000, 32_000], dtype="Int64")}
                     ).to_parquet(d / "calls" / "c.parquet")
        return d

    # Ready 5 us after the last return, and 1 us before it (within the claimed 2 us).
    assert events.check_anchors(run(tmp_path / "a", [15_000, 19_000]))
    out = capsys.readouterr().out
    assert out.startswith("ok   anchors: claimed error 2.00 us"), out
    assert "2 groups, ready - last op's return: min -1.00" in out, out
    assert "earlier 1, by more than the claimed error 0" in out and "api_start_ns: min -3.00" in out, out
    # 3 us before the last return: a clock that lies.
    assert not events.check_anchors(run(tmp_path / "b", [15_000, 17_000]))
    assert capsys.readouterr().out.startswith("FAIL anchors: claimed error 2.00 us")
    assert not events.check_anchors(run(tmp_path / "c", [15_000, 19_000], err=None))
    assert capsys.readouterr().out.startswith("FAIL anchors: claimed error []")
