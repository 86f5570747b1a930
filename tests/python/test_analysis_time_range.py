"""zcta_analysis takes a run's rows as zcta does where a time is corrupt or foreign, and
gives boolean columns one dtype.

zcta leaves out of every figure an ops row with a time outside 1970..2116 (not in
[0, 2^62) ns since the epoch: src/analysis/mod.rs MAX_TIME_NS, `ops_times!`), and
`zcta export` a gpu or proxy row likewise, naming each file with the rows it left out.
zcta_analysis leaves the same rows out where it reads them (`load`, `read_table`,
`connect`), with the same words, so `breakdown`, `compare`, `stream_time_ns` and the
plots give the figures of the run without them, and nothing overflows int64 on them.
The runs are written as zcta writes its files (test_analysis_exact_ints.zcta_file)."""

import pathlib
import re
import subprocess
import sys
import warnings

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from test_analysis_bad_input import ZCTA, zcta_rows
from test_analysis_exact_ints import T0, zcta_file
from test_readers import ROOT

sys.path.insert(0, str(ROOT / "analysis"))
import zcta_analysis as za  # noqa: E402
from zcta_analysis import _schema  # noqa: E402
from zcta_analysis import plot as zp  # noqa: E402

I64_MAX = (1 << 63) - 1
COMM = 0x1234_5678_9ABC_DEF1
REASON = ("a time outside 1970..2116 (not in [0, 2^62) ns since the epoch: a corrupt or foreign "
          "value); its other rows were used")


def _op(rank, seq, dur, **over):
    """A timed AllReduce of `rank` (pid 100 + rank) on a two-rank communicator: `dur` ns
    on the stream from its ready time; rank 1 begins 7 ns after rank 0 times seq."""
    t = T0 + seq * 100_000 + rank * 7 * (seq + 1)
    row = {"op_id": seq + 1, "op": "AllReduce", "rank": rank, "nranks": 2, "comm_id": COMM, "seq": seq,
           "bytes": 1 << 20, "api_start_ns": t, "api_end_ns": t + 10, "launch_ns": t + 20,
           "gpu_ready_ns": t + 30, "gpu_start_ns": t + 40, "gpu_end_ns": t + 30 + dur, "timing": "timed",
           "timing_level": 0, "gpu_source": "stamps", "engine": "sm_kernel", "pid": 100 + rank, "host": "h"}
    row.update(over)
    return row


GOOD = [_op(rank, seq, 5_000 + 101 * seq + rank) for seq in range(6) for rank in (0, 1)]
# Rank 0's file also holds one row whose GPU end is int64's end and one whose API start
# is -1 (their other times ordinary): both out of range. Each would move a median (a
# huge and a tiny time on the stream) and add a collective to the skew panel.
BAD = [_op(0, 50, 5_000, gpu_end_ns=I64_MAX), _op(0, 51, 1, api_start_ns=-1)]
assert BAD[0]["gpu_end_ns"] == I64_MAX


def _write(run, rows):
    for rank in (0, 1):
        zcta_file(run / "ops" / f"h-{100 + rank}.parquet", "ops", [r for r in rows if r["rank"] == rank])
    subprocess.run([ZCTA, "phases", run], capture_output=True)  # exits 1 where it names a file


@pytest.fixture
def runs(tmp_path):
    """(the run with the two rows out of range, the same run without them, the file
    that holds them)."""
    bad, clean = tmp_path / "bad", tmp_path / "clean"
    _write(bad, GOOD + BAD)
    _write(clean, GOOD)
    assert za.read_table(clean, "phases").shape[0] == len(GOOD)
    return bad, clean, bad / "ops" / "h-100.parquet"


def _said(f, n=2, table="ops"):
    return f"zcta_analysis: skipped {f}: {n} {table} row{'s' if n != 1 else ''} left out: {REASON}"


def _warned(fn, *args):
    """fn(*args) and the text of each ZctaWarning it gave."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(x.message) for x in w if issubclass(x.category, za.ZctaWarning)]


def _quiet(fn, *args):
    out, said = _warned(fn, *args)
    assert not said, said
    return out


def test_readers_leave_the_rows_out_and_name_the_file(runs):
    """load, read_table and connect give the run's other rows, the same as the run
    without those two, and name the file with its count, as Run.skipped lists it."""
    bad, clean, f = runs
    r, said = _warned(za.load, bad)
    assert said == [_said(f)]
    assert (f, f"2 ops rows left out: {REASON}") in r.skipped
    want = _quiet(za.load, clean).ops
    pd.testing.assert_frame_equal(r.ops, want)
    assert r.ops.api_start_ns.min() >= 0 and r.ops.gpu_end_ns.max() < 1 << 62
    ops, said = _warned(za.read_table, bad, "ops")
    assert said == [_said(f)]
    pd.testing.assert_frame_equal(ops, want)
    con, said = _warned(za.connect, bad)
    assert said == [_said(f)]
    q = "select op_id, rank, api_start_ns, gpu_end_ns from ops order by rank, op_id"
    assert con.execute(q).fetchall() == _quiet(za.connect, clean).execute(q).fetchall()


def test_helpers_give_the_figures_of_the_run_without_the_rows(runs):
    """stream_time_ns, busbw_points, the skew panel, breakdown and compare of the run
    equal those of the run without the two rows; each that reads the run names the
    file once with the count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bad, clean, f = runs
    run, said = _warned(za.load, bad)
    assert said == [_said(f)]
    ref = _quiet(za.load, clean)
    st = _quiet(za.stream_time_ns, run.ops)
    assert st.tolist() == _quiet(za.stream_time_ns, ref.ops).tolist()
    assert st.notna().all() and st.max() < 10_000
    pd.testing.assert_frame_equal(_quiet(zp.busbw_points, run.ops), _quiet(zp.busbw_points, ref.ops))
    panels = []
    for r in (run, ref):
        fig, ax = plt.subplots()
        try:
            _quiet(zp.skew_heatmap, r, ax, fig)
            panels.append((ax.get_title(), ax.images[0].get_array().tolist()))
        finally:
            plt.close(fig)
    assert panels[0] == panels[1] and "(its 6 collectives)" in panels[0][0], panels
    b, said = _warned(za.breakdown, bad)
    assert said == [_said(f)]
    pd.testing.assert_frame_equal(b, _quiet(za.breakdown, clean))
    assert b["count"].tolist() == [len(GOOD)]
    c, said = _warned(za.compare, bad, clean)
    assert said == [_said(f)]
    pd.testing.assert_frame_equal(c, _quiet(za.compare, clean, clean))
    # The figures themselves: the clean run's (12 ops; medians of its times).
    assert (c.window_change_us == 0).all()


def test_stream_time_ns_of_a_frame_built_otherwise(runs):
    """A frame that holds such rows (read past zcta_analysis): their time on the stream
    is NaN, with a warning of how many; the others' as without them, no overflow."""
    bad, clean, _ = runs
    raw = pd.read_parquet(bad / "ops" / "h-100.parquet", dtype_backend="numpy_nullable")
    got, said = _warned(za.stream_time_ns, raw)
    assert said == ["zcta_analysis: stream_time_ns: 2 ops rows left out: " + REASON]
    out = raw.api_start_ns.lt(0) | raw.gpu_end_ns.eq(I64_MAX)
    assert got[out.to_numpy()].isna().all()
    want = _quiet(za.stream_time_ns, _quiet(za.read_table, clean, "ops").query("rank == 0"))
    assert got[~out.to_numpy()].tolist() == want.tolist()
    pts, said = _warned(zp.busbw_points, raw)
    assert said == ["zcta_analysis: busbw_points: 2 ops rows left out: " + REASON]
    assert pts.busbw.tolist() == _quiet(zp.busbw_points, _quiet(za.load, clean).ops.query("rank == 0")).busbw.tolist()


def _zcta_says(*args):
    """`zcta ARGS`' notes of files with rows left out: {path: (count, table, reason)}."""
    p = subprocess.run([ZCTA, *map(str, args)], capture_output=True, text=True)
    notes = {}
    for m in re.finditer(r"skipped (\S+): (\d+) (\w+) rows? left out: (.*)$", p.stdout + p.stderr, re.M):
        notes[pathlib.Path(m.group(1))] = (int(m.group(2)), m.group(3), m.group(4))
    return notes


def test_zcta_names_the_same_file_and_count(runs):
    """`zcta summary` and `zcta report` name the same file with the same count and
    words as zcta_analysis; summary's row count of the table still counts the rows
    (the file holds them), as `process.ops_rows` would."""
    bad, _, f = runs
    want = {f: (2, "ops", REASON)}
    assert _zcta_says("summary", bad) == want
    assert _zcta_says("report", bad) == want
    assert zcta_rows(bad) == len(GOOD) + len(BAD)
    assert len(_warned(za.load, bad)[0].ops) == len(GOOD)


def test_gpu_and_proxy_rows_as_zcta_export_leaves_them_out(tmp_path):
    """A gpu row ending at int64's end and a proxy row starting before 1970: left out
    of load's tables, each file named with its count as `zcta export` names it."""
    run = tmp_path / "r"
    zcta_file(run / "ops" / "h-100.parquet", "ops", [r for r in GOOD if r["rank"] == 0])
    gpu = [{"op_id": 1, "attribution": "op", "kind": "kernel", "start_ns": T0 + k, "end_ns": T0 + 1_000 + k,
            "correlation_id": k, "pid": 100, "host": "h"} for k in range(3)]
    gpu[1]["end_ns"] = I64_MAX
    zcta_file(run / "gpu" / "h-100.parquet", "gpu", gpu)
    proxy = [{"event": "ProxyOp", "op_id": 1, "start_ns": T0 + k, "stop_ns": T0 + 500 + k, "pid": 100,
              "host": "h"} for k in range(3)]
    proxy[2]["start_ns"] = -5
    zcta_file(run / "proxy" / "h-100.parquet", "proxy", proxy)
    r, said = _warned(za.load, run)
    gf, pf = run / "gpu" / "h-100.parquet", run / "proxy" / "h-100.parquet"
    assert sorted(said) == sorted([_said(gf, 1, "gpu"), _said(pf, 1, "proxy")])
    assert r.gpu.end_ns.tolist() == [T0 + 1_000, T0 + 1_002]
    assert r.proxy.start_ns.tolist() == [T0, T0 + 1]
    assert _zcta_says("export", "--perfetto", "-o", tmp_path / "t.json", run) == {
        gf: (1, "gpu", REASON), pf: (1, "proxy", REASON)}
    con, said = _warned(za.connect, run)
    assert sorted(said) == sorted([_said(gf, 1, "gpu"), _said(pf, 1, "proxy")])
    assert con.execute("select count(*) from gpu").fetchone()[0] == 2
    assert con.execute("select count(*) from proxy").fetchone()[0] == 2


def test_plot_cli_names_the_file(runs, tmp_path):
    """`python -m zcta_analysis plot` draws the run and names the file on stderr."""
    bad, _, f = runs
    from test_analysis_plot_cli import plot_cli

    p = plot_cli(bad, "-o", tmp_path / "o.png")
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == [_said(f)], p.stderr


# --- boolean columns ---------------------------------------------------------------

BOOLS = [(t, name) for t, cols in _schema.COLUMNS.items() for name, typ, _ in cols if typ == "bool"]


@pytest.mark.parametrize("nulls", [False, True])
def test_boolean_columns_are_pandas_boolean_with_or_without_nulls(tmp_path, nulls):
    """Every boolean column (graph_captured, is_sym_coll, is_send, and one a newer zcta
    might add) is pandas' `boolean`, whether or not it holds a NULL (pd.NA there): not
    `object` in one run and `bool` in another."""
    assert ("ops", "graph_captured") in BOOLS and len(BOOLS) >= 3
    values = [True, None if nulls else False, False]
    run = tmp_path / "r"
    for table in {t for t, _ in BOOLS}:
        rows = [{name: v for t, name in BOOLS if t == table} for v in values]
        if table == "ops":
            for i, r in enumerate(rows):
                r.update(op_id=i + 1, api_start_ns=T0 + i, api_end_ns=T0 + i + 1)
        f = run / table / "h-1.parquet"
        zcta_file(f, table, rows)
        if table == "ops":  # a column zcta does not know yet, kept as read
            t = pq.read_table(f)
            pq.write_table(t.append_column("newer_flag", pa.array(values, pa.bool_())), f)
    for table, name in BOOLS:
        for df in [_quiet(za.read_table, run, table)] + ([getattr(_quiet(za.load, run), table)]
                                                          if table in ("ops", "gpu", "proxy") else []):
            assert str(df[name].dtype) == "boolean", (table, name, df[name].dtype)
            assert df[name].isna().tolist() == [False, nulls, False]
            assert df[name].fillna(False).tolist() == [True, False, False]
    ops = _quiet(za.load, run).ops
    assert str(ops.newer_flag.dtype) == "boolean"
    # NA semantics: a comparison with a NULL is NA, which counts as neither.
    assert int((ops.graph_captured == False).sum()) == (1 if nulls else 2)  # noqa: E712
    assert not ops.graph_captured.all() and ops.graph_captured.any()
    # The helpers take such a frame without a warning (pandas' included).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert za.stream_time_ns(ops).isna().all()
        assert zp.busbw_points(ops).empty


# --- a proxy step's network waits ----------------------------------------------------

# The proxy times every zcta command judges (src/analysis/mod.rs `proxy_times!`): start,
# stop and a step's four network waits the phases read. The table's other times (its
# `in_progress_ns`, `send_gpu_wait_ns`, `send_peer_wait_ns`, `ctrl_*_ns`) no command
# reads, and no row is left out for them.
WAITS = ("send_wait_ns", "recv_wait_ns", "recv_flush_wait_ns", "recv_gpu_wait_ns")


def _step(k, **over):
    """ProxyStep `k` of op 1 of rank 0 (pid 100): its waits in range."""
    row = {"event": "ProxyStep", "op_id": 1, "channel": 0, "step": k, "start_ns": T0 + 1_000 * k,
           "stop_ns": T0 + 1_000 * k + 900, "pid": 100, "host": "h"}
    row.update({w: T0 + 1_000 * k + 100 + i for i, w in enumerate(WAITS)})
    row.update(over)
    return row


# One step per network wait out of range (below 1970, int64's end, 2^62 itself, far
# below), then the kept ones: waits NULL (not measured), a wait at 2^62 - 1, and times
# zcta judges in no command out of range.
STEPS_OUT = [_step(0, send_wait_ns=-1), _step(1, recv_wait_ns=I64_MAX),
             _step(2, recv_flush_wait_ns=1 << 62), _step(3, recv_gpu_wait_ns=-(1 << 63))]
STEPS_KEPT = [_step(4, **{w: None for w in WAITS}), _step(5, recv_wait_ns=(1 << 62) - 1),
              _step(6, in_progress_ns=-1, send_gpu_wait_ns=I64_MAX, send_peer_wait_ns=-1, ctrl_first_ns=-1)]


@pytest.mark.parametrize("name", ["h-100.parquet", "h-[100].parquet"])
def test_proxy_network_waits_out_of_range_are_left_out_as_zcta_does(tmp_path, name):
    """A ProxyStep with a network wait out of range is left out of load, read_table and
    connect (by name and, for a name DuckDB would glob, in memory), its file named with
    the count `zcta report` and `zcta export` give; one with another time out of range
    that zcta does not judge is kept, as zcta keeps it."""
    run = tmp_path / "r"
    zcta_file(run / "ops" / "h-100.parquet", "ops", [r for r in GOOD if r["rank"] == 0])
    f = run / "proxy" / name
    zcta_file(f, "proxy", STEPS_OUT + STEPS_KEPT)
    want = [r["step"] for r in STEPS_KEPT]
    r, said = _warned(za.load, run)
    assert said == [_said(f, 4, "proxy")]
    assert r.skipped == [(f, f"4 proxy rows left out: {REASON}")]
    assert r.proxy.step.tolist() == want
    assert r.proxy.recv_wait_ns.tolist()[1] == (1 << 62) - 1 and r.proxy.send_gpu_wait_ns.tolist()[2] == I64_MAX
    proxy, said = _warned(za.read_table, run, "proxy")
    assert said == [_said(f, 4, "proxy")]
    pd.testing.assert_frame_equal(proxy, r.proxy)
    con, said = _warned(za.connect, run)
    assert said == [_said(f, 4, "proxy")]
    assert [s for s, in con.execute("select step from proxy order by step").fetchall()] == want
    notes = {f: (4, "proxy", REASON)}
    assert _zcta_says("report", run) == notes
    assert _zcta_says("export", "--perfetto", "-o", tmp_path / "t.json", run) == notes
