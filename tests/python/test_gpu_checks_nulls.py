"""The GPU-only checks (tests/gpu/*.py, bench/cupti_toggle_check.py,
bench/gpu_bench_report.py) on small runs written as zcta writes its files, with a NULL
where the check needs a value. zcta_analysis reads integer columns as nullable dtypes
(`Int64`, `UInt64`, ...: NULL is pd.NA, a comparison with it pd.NA, which `.all()` skips
and `bool()` refuses): a NULL there must print FAIL, never crash the check and never let
it pass."""

import json
import subprocess
import sys

import pytest

from test_analysis_exact_ints import zcta_file
from test_readers import ROOT

T0 = 1_800_000_000_000_000_001
MIB = 1 << 20


def _lines(text, prefix):
    return [line for line in text.splitlines() if line.startswith(prefix)]


# --- tests/gpu/one_gpu.py: its parts' checks on a stand-in for the recorded run ---------


@pytest.fixture
def one_gpu(monkeypatch):
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    try:
        import one_gpu
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(one_gpu, "failed", False)
    return one_gpu


def _one_gpu_part(one_gpu, monkeypatch, tmp_path, part, process, ops, gpu, timed=()):
    """Runs one part of one_gpu.py with the job's recording replaced by `ops`, `gpu` and
    one `process` row written as zcta's files (and `timed`, the CUDA events' times)."""
    run = tmp_path / "r"
    zcta_file(run / "process" / "h-1.parquet", "process", [{"pid": 1, "cupti": "on", **process}])
    zcta_file(run / "ops" / "h-1.parquet", "ops", ops)
    zcta_file(run / "gpu" / "h-1.parquet", "gpu", gpu)
    res = tmp_path / "timed.json"
    res.write_text(json.dumps(list(timed)))
    monkeypatch.setattr(one_gpu, "record", lambda kind, shim_dir, env: (str(run), str(res)))
    shim_dir = tmp_path / "shim"  # full_detail ends with `zcta report`: a stand-in that says "sync"
    shim_dir.mkdir()
    (shim_dir / "zcta").write_text("#!/bin/sh\necho sync\n")
    (shim_dir / "zcta").chmod(0o755)
    one_gpu.PARTS[part](shim_dir, [])
    return one_gpu


COUNTERS = {"cupti_dropped": 0, "gpu_inconsistent": 0, "ops_without_gpu": 0, "records_dropped": 0,
            "gpu_clock_error_ns": 100, "ops_unsampled": 0, "ops_graph_captured": 20}


def _sends(n=4, **override):
    """`n` send/recv groups to self on the stream, 1 MiB each: 10 us on the stream."""
    rows = []
    for i in range(n):
        t = T0 + i * 1_000_000
        rows.append({"op_id": 2 * i + 1, "op": "Send", "rank": 0, "group_id": i + 1, "bytes": MIB,
                     "api_start_ns": t, "api_end_ns": t + 5_000, "launch_ns": t + 3_000,
                     "gpu_ready_ns": t + 4_000, "gpu_start_ns": t + 5_000, "gpu_end_ns": t + 14_000,
                     "engine": "sm_kernel", "kernel": "ncclDevKernel_SendRecv", "n_kernels": 1,
                     "timing": "timed", "graph_captured": False})
    rows[-1].update(override)
    return rows


def _kernels(n=4):
    return [{"group_id": i + 1, "attribution": "op", "kind": "kernel", "start_ns": T0 + i * 1_000_000 + 5_000,
             "end_ns": T0 + i * 1_000_000 + 14_000, "correlation_id": i + 1} for i in range(n)]


@pytest.mark.parametrize("column", ["cupti_dropped", "gpu_inconsistent", "ops_without_gpu", "records_dropped"])
def test_one_gpu_default_fails_a_null_process_counter(one_gpu, monkeypatch, tmp_path, capsys, column):
    _one_gpu_part(one_gpu, monkeypatch, tmp_path, "default", {**COUNTERS, column: None}, _sends(), _kernels())
    out = capsys.readouterr().out
    assert _lines(out, f"FAIL  default: process.{column} = <NA>"), out
    assert one_gpu.failed


def test_one_gpu_default_fails_a_group_whose_kernel_count_is_null(one_gpu, monkeypatch, tmp_path, capsys):
    _one_gpu_part(one_gpu, monkeypatch, tmp_path, "default", COUNTERS, _sends(n_kernels=None), _kernels())
    out = capsys.readouterr().out
    assert _lines(out, "FAIL  default: one kernel per group"), out
    # The same run with every count known passes that check.
    monkeypatch.setattr(one_gpu, "failed", False)
    _one_gpu_part(one_gpu, monkeypatch, tmp_path / "known", "default", COUNTERS, _sends(), _kernels())
    assert _lines(capsys.readouterr().out, "PASS  default: one kernel per group")


def test_one_gpu_default_takes_a_null_clock_error_as_none(one_gpu, monkeypatch, tmp_path, capsys):
    _one_gpu_part(one_gpu, monkeypatch, tmp_path, "default", {**COUNTERS, "gpu_clock_error_ns": None},
                  _sends(), _kernels())
    out = capsys.readouterr().out
    assert _lines(out, "PASS  default: gpu_ready_ns <= gpu_start_ns + the anchors' error (0 ns) everywhere"), out


def test_one_gpu_default_fails_a_timed_op_whose_bytes_are_null(one_gpu, monkeypatch, tmp_path, capsys):
    _one_gpu_part(one_gpu, monkeypatch, tmp_path, "default", COUNTERS, _sends(bytes=None), _kernels(),
                  timed=[("same:1MiB", 10_000.0)])
    out = capsys.readouterr().out
    assert _lines(out, "FAIL  timed op order: same:1MiB matched a <NA>-byte op"), out
    # Known bytes: the op is compared with its events (10 us on the stream, as they say).
    _one_gpu_part(one_gpu, monkeypatch, tmp_path / "known", "default", COUNTERS, _sends(), _kernels(),
                  timed=[("same:1MiB", 10_000.0)])
    out = capsys.readouterr().out
    assert not _lines(out, "FAIL  timed op order") and "within 5 %/5 us: 100%" in out, out


@pytest.mark.parametrize("column, line", [
    ("ops_unsampled", "FAIL  sampled: ops_unsampled <NA> within [4, 4]"),
    ("ops_without_gpu", "FAIL  sampled: every sampled op has its GPU side (ops_without_gpu <NA>)"),
    ("gpu_inconsistent", "FAIL  sampled: gpu_inconsistent <NA>"),
])
def test_one_gpu_sampled_fails_a_null_process_counter(one_gpu, monkeypatch, tmp_path, capsys, column, line):
    # Two of four groups outside the windows: their Send and Recv have no GPU side.
    ops = _sends()
    for o in ops[:2]:
        for c in ("gpu_ready_ns", "gpu_start_ns", "gpu_end_ns", "engine", "kernel", "n_kernels", "timing"):
            o[c] = None
    ops += [{**o, "op_id": o["op_id"] + 1, "op": "Recv"} for o in ops[:2]]
    _one_gpu_part(one_gpu, monkeypatch, tmp_path, "sampled", {**COUNTERS, "ops_unsampled": 4, column: None},
                  ops, _kernels())
    out = capsys.readouterr().out
    assert _lines(out, line), out
    assert one_gpu.failed


@pytest.mark.parametrize("which", ["eager", "captured"])
def test_one_gpu_graph_fails_a_null_graph_captured(one_gpu, monkeypatch, tmp_path, capsys, which):
    """graph_captured is pandas' nullable boolean: a NULL on an eager or a captured
    group's op must fail its check (.all() alone skips it)."""
    ops = []
    null_at = 0 if which == "eager" else 25
    for i in range(30):  # 20 eager groups' Send and Recv, then 10 captured groups'
        eager = i < 20
        ops += [{"op_id": 2 * i + k + 1, "op": op, "rank": 0, "api_start_ns": T0 + 2 * i + k,
                 "graph_captured": None if i == null_at else not eager,
                 "engine": "sm_kernel" if eager else None}
                for k, op in enumerate(("Send", "Recv"))]
    _one_gpu_part(one_gpu, monkeypatch, tmp_path, "graph", COUNTERS, ops,
                  [{"attribution": "graph_launch", "kind": "kernel", "graph_id": 7}])
    out = capsys.readouterr().out
    line = "FAIL  graph: eager groups" if which == "eager" else "FAIL  graph: captured groups"
    assert _lines(out, line), out
    assert one_gpu.failed


@pytest.mark.parametrize("column", ["ops_graph_captured", "ops_without_gpu"])
def test_one_gpu_graph_fails_a_null_process_counter(one_gpu, monkeypatch, tmp_path, capsys, column):
    ops = []
    for i in range(30):  # 20 eager groups' Send and Recv, then 10 captured groups'
        eager = i < 20
        ops += [{"op_id": 2 * i + k + 1, "op": op, "rank": 0, "api_start_ns": T0 + 2 * i + k,
                 "graph_captured": not eager, "engine": "sm_kernel" if eager else None}
                for k, op in enumerate(("Send", "Recv"))]
    process = {**COUNTERS, column: None}
    _one_gpu_part(one_gpu, monkeypatch, tmp_path, "graph", process, ops,
                  [{"attribution": "graph_launch", "kind": "kernel", "graph_id": 7}])
    out = capsys.readouterr().out
    want = {"ops_graph_captured": "<NA>", "ops_without_gpu": "20"}[column]
    assert _lines(out, f"FAIL  graph: process.ops_graph_captured {want}"), out
    assert one_gpu.failed


# --- tests/gpu/verify_gpu.py, verify_plugin.py, verify_smoke.py: scripts on a run ------


def _script(path, *args):
    r = subprocess.run([sys.executable, str(ROOT / path), *map(str, args)], capture_output=True, text=True,
                       timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def _verify_gpu_run(tmp_path, process2, ops, timed=(), **process):
    """Two ranks' process rows (both with `process`, the second's other columns from
    `process2`), `ops`, and the ranks' result files of paths_job.py."""
    run, res = tmp_path / "r", tmp_path / "res"
    base = {"cupti": "on", "cupti_dropped": 0, "gpu_inconsistent": 0, "gpu_clock": "CLOCK_REALTIME",
            "ops_without_gpu": 0, "ops_unsampled": 0, **process}
    zcta_file(run / "process" / "h-1.parquet", "process", [{**base, "pid": 1}, {**base, "pid": 2, **process2}])
    zcta_file(run / "ops" / "h-1.parquet", "ops", ops)
    res.mkdir()
    for r in (0, 1):
        (res / f"rank{r}.json").write_text(json.dumps(
            {"profiler_nccl_kernels": None, "bytes_timed": 16 * MIB, "timed": list(timed)}))
    return run, res


def _coll(op, rank, seq, engine="sm_kernel", **kw):
    t = T0 + seq * 1_000_000 + rank * 1_001
    return {"op_id": 100 * rank + seq + 1, "op": op, "rank": rank, "comm_id": 5, "seq": seq, "bytes": MIB,
            "api_start_ns": t, "api_end_ns": t + 3_000, "launch_ns": t + 2_000, "gpu_ready_ns": t + 2_500,
            "gpu_start_ns": t + 3_000, "gpu_end_ns": t + 13_000, "engine": engine, "n_kernels": 1,
            "kernel": f"ncclDevKernel_{op}_Sum_f32", **kw}


def test_verify_gpu_fails_null_process_counters(tmp_path):
    ops = [_coll("AllReduce", r, s) for r in (0, 1) for s in range(3)]
    run, res = _verify_gpu_run(tmp_path, {"cupti_dropped": None, "gpu_inconsistent": None}, ops)
    out = _script("tests/gpu/verify_gpu.py", "default", run, res).stdout
    assert _lines(out, "FAIL  pid 2 CUPTI records dropped: <NA>"), out
    assert _lines(out, "FAIL  pid 2 GPU records dropped for a correlation to a later call: <NA>"), out
    assert _lines(out, "PASS  pid 1 CUPTI records dropped: 0"), out


def test_verify_gpu_ce_fails_a_copy_engine_op_whose_kernel_count_is_null(tmp_path):
    ops = [_coll(op, r, s, engine="copy_engine", n_kernels=0, n_memcpy=2, kernel=None)
           for r in (0, 1) for s, op in enumerate(("AlltoAll", "AllGather"))]
    ops[-1]["n_kernels"] = None
    # A timed op whose readiness and kernel start are unknown: compared, not a crash.
    timed = [_coll("AllReduce", r, 9, bytes=16 * MIB, gpu_ready_ns=None, gpu_start_ns=None) for r in (0, 1)]
    run, res = _verify_gpu_run(tmp_path, {}, ops + timed, timed=[("AllReduce", 10_000.0)])
    r = _script("tests/gpu/verify_gpu.py", "ce", run, res)
    assert _lines(r.stdout, "FAIL  ce: copy-engine ops launch no kernel and at least 2 copies"), r.stdout
    assert _lines(r.stdout, "FAIL  gpu_ready_ns known for 0 of 2 timed ops"), r.stdout
    assert r.returncode == 1


def test_verify_gpu_sampled_fails_a_null_ops_without_gpu(tmp_path):
    ops = [_coll("AllReduce", r, s) for r in (0, 1) for s in range(3)]
    ops += [_coll("AllReduce", r, 3, engine=None, gpu_ready_ns=None, gpu_start_ns=None, gpu_end_ns=None,
                  n_kernels=None) for r in (0, 1)]
    for o in ops:
        o["api_start_ns"] -= o["api_start_ns"] % 250_000_000  # in the window
    run, res = _verify_gpu_run(tmp_path, {"ops_without_gpu": None, "ops_unsampled": 2}, ops,
                               gpu_sampling="50 ms of every 250 ms")
    r = _script("tests/gpu/verify_gpu.py", "default", run, res)
    assert _lines(r.stdout, "FAIL  no sampled op without its GPU side"), r.stdout
    assert _lines(r.stdout, "PASS  process.ops_unsampled 2 = ops with engine NULL 2"), r.stdout


def _plugin_run(tmp_path, ops, proxy):
    run = tmp_path / "r"
    zcta_file(run / "process" / "h-1.parquet", "process", [{"pid": 1, "profiler_plugin": "zcta", "plugin_comms": 1}])
    zcta_file(run / "ops" / "h-1.parquet", "ops", ops)
    zcta_file(run / "proxy" / "h-1.parquet", "proxy", proxy)
    zcta_file(run / "nccl_comms" / "h-1.parquet", "nccl_comms", [{"comm_hash": 9, "comm_id": 5, "pid": 1}])
    zcta_file(run / "nccl_ops" / "h-1.parquet", "nccl_ops",
              [{"event": "Coll", "op_id": o["op_id"], "host": "h", "pid": 1, "algo": "Ring", "proto": "LL",
                "start_ns": T0} for o in ops if o["op"] == "AllReduce"])
    return run


def test_verify_plugin_net_counts_a_send_with_a_null_peer_and_fails_a_step_without_end(tmp_path):
    """A Send/Recv is left out as a copy to oneself only where its peer is its own rank;
    a NULL peer crosses the network as before (NaN == rank was False). A ProxyStep with
    its end NULL has no non-zero time."""
    ops = [{"op_id": 1, "op": "AllReduce", "rank": 0, "host": "h", "pid": 1},
           {"op_id": 2, "op": "Send", "rank": 0, "peer": None, "host": "h", "pid": 1},
           {"op_id": 3, "op": "Send", "rank": 0, "peer": 0, "host": "h", "pid": 1}]
    proxy = [{"event": ev, "op_id": 1, "host": "h", "pid": 1, "start_ns": T0, "stop_ns": stop,
              "send_wait_ns": 5} for ev, stop in (("ProxyOp", T0 + 10), ("ProxyStep", T0 + 10), ("ProxyStep", None))]
    r = _script("tests/gpu/verify_plugin.py", "net", _plugin_run(tmp_path, ops, proxy))
    assert _lines(r.stdout, "FAIL  plugin/net: every op that crosses the network has ProxyOp rows: "
                            "1 of 2 (1 self Send/Recv excluded)"), r.stdout
    assert _lines(r.stdout, "FAIL  plugin/net: step times are non-zero and states recorded"), r.stdout
    assert r.returncode == 1


def test_verify_plugin_kernelch_fails_a_null_gpu_timer(tmp_path):
    ops = [{"op_id": i, "op": "AllReduce", "rank": 0, "host": "h", "pid": 1} for i in (1, 2)]
    proxy = [{"event": "KernelCh", "op_id": i, "host": "h", "pid": 1, "start_ns": T0, "gpu_timer_start": 1_000,
              "gpu_timer_stop": 3_000 if i == 1 else None} for i in (1, 2)]
    r = _script("tests/gpu/verify_plugin.py", "kernelch", _plugin_run(tmp_path, ops, proxy))
    assert _lines(r.stdout, "FAIL  plugin/kernelch: KernelCh rows with GPU timers for every collective"), r.stdout
    assert "GPU channel time p50 2.0 us" in r.stdout, r.stdout
    assert r.returncode == 1


def test_verify_smoke_fails_null_drops_and_null_bytes(tmp_path):
    run, plain, shim = tmp_path / "r", tmp_path / "plain", tmp_path / "shim"
    exp = {op: {"bytes": MIB, "calls": 1} for op in ("AllReduce", "AlltoAll", "AllGather", "ReduceScatter",
                                                      "Broadcast")}
    for d in (plain, shim):
        d.mkdir()
        for r in (0, 1):
            (d / f"rank{r}.json").write_text(json.dumps(
                {"rank": r, "digest": "ab" * 16, "elapsed_s": 1.0, "steps": 1,
                 "expect": {**exp, "a2a_unequal": {"send_bytes": [], "recv_bytes": []}}}))
    zcta_file(run / "process" / "h-1.parquet", "process", [
        {"pid": 1, "end_reason": "exit", "records_dropped": 0},
        {"pid": 2, "end_reason": "exit", "records_dropped": None}])
    ops = [{"op_id": 10 * r + s, "op": op, "rank": r, "comm_id": 5, "seq": s, "bytes": MIB,
            "api_start_ns": T0, "api_end_ns": T0 + 1}
           for r in (0, 1) for s, op in enumerate(exp)]
    # One send/recv pair between the ranks, its bytes NULL on both sides.
    ops += [{"op_id": 90 + r, "op": op, "rank": r, "peer": 1 - r, "comm_id": 5, "seq": 9, "bytes": None,
             "group_id": 1, "api_start_ns": T0, "api_end_ns": T0 + 1} for r, op in ((0, "Send"), (1, "Recv"))]
    zcta_file(run / "ops" / "h-1.parquet", "ops", ops)
    zcta_file(run / "comms" / "h-1.parquet", "comms", [{"comm_id": 5, "rank": r} for r in (0, 1)])
    r = _script("tests/gpu/verify_smoke.py", run, plain, shim)
    assert _lines(r.stdout, "FAIL  every process ended cleanly"), r.stdout
    assert _lines(r.stdout, "FAIL  every Send joins its Recv on (comm_id, seq, rank<->peer) with equal bytes"), r.stdout
    assert _lines(r.stdout, "PASS  collectives join across ranks"), r.stdout
    assert r.returncode == 1


# --- bench/cupti_toggle_check.py and bench/gpu_bench_report.py --------------------------


def test_cupti_toggle_check_fails_a_null_gpu_inconsistent(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import cupti_toggle_check
    finally:
        sys.path.pop(0)
    for inconsistent, want in ((0, True), (None, False)):
        run = tmp_path / str(inconsistent)
        zcta_file(run / "process" / "h-1.parquet", "process", [{"pid": 1, "gpu_inconsistent": inconsistent}])
        zcta_file(run / "ops" / "h-1.parquet", "ops", [{"op_id": 1, "op": "Send", "bytes": 64 * MIB, "group_id": 1,
                                                        "engine": "sm_kernel"}])
        zcta_file(run / "gpu" / "h-1.parquet", "gpu", [{"group_id": 1, "kind": "kernel", "start_ns": T0,
                                                        "end_ns": T0 + 50_000, "correlation_id": 1}])
        assert bool(cupti_toggle_check.verdict(run, "pause", "0")) is want
        out = capsys.readouterr().out
        assert ("dropped as naming a later call <NA>" if inconsistent is None
                else "dropped as naming a later call     0") in out, out


def test_gpu_bench_report_accuracy_with_null_ready_and_start(tmp_path):
    """The accuracy table takes the kernel span where gpu_ready_ns is NULL (a float
    fill, no warning of mixing an integer fill into floats), and a NULL gpu_start_ns
    leaves the kernel span unknown, not the report broken."""
    runs, res = tmp_path / "runs", tmp_path / "work" / "res"
    res.mkdir(parents=True)
    ops = []
    for i in range(6):  # 3 warm-up calls, then 3 timed: 10 us on the stream each
        t = T0 + i * 1_000_000
        ops.append({"op_id": i + 1, "op": "AllReduce", "rank": 0, "bytes": MIB, "api_start_ns": t,
                    "api_end_ns": t + 1_000, "launch_ns": t + 500, "gpu_ready_ns": t + 1_000,
                    "gpu_start_ns": t + 2_000, "gpu_end_ns": t + 11_000, "engine": "sm_kernel"})
    ops[4]["gpu_ready_ns"] = None  # the kernel span: 9 us
    ops[5]["gpu_start_ns"] = None
    zcta_file(runs / "zcta-0" / "ops" / "h-1.parquet", "ops", ops)
    (res / "zcta-0.json").write_text(json.dumps(
        {"config": "zcta", "round": 0, "world": 2, "medians": {}, "accuracy_start_ns": T0 - 1,
         "accuracy": [{"op": "AllReduce", "bytes": MIB, "event_us": [11.0, 10.0, 11.0], "loop_us": 50.0}]}))
    r = _script("bench/gpu_bench_report.py", tmp_path / "work", runs)
    assert r.returncode == 0, r.stderr
    assert "fill value" not in r.stderr, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("| AllReduce |"))
    # zcta 10, 9, 10 us against events 11, 10, 11: -1 us each.
    assert row.startswith("| AllReduce | 1 MiB | sm_kernel | 11.0 | 10.0 | -1.0 | -1.0..-1.0 |"), row
