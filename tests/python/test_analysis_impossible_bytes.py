"""zcta_analysis leaves out the ops rows zcta leaves out for their bytes, and names them
as zcta does.

An ops row of a call that succeeded (`result` 0) with `bytes` of 2^62 (4 EiB) or more,
larger than any buffer, is corrupt: zcta leaves it out of every figure and names its
file (src/analysis/mod.rs `MAX_BYTES`, `bytes_possible`, `bytes_out_of_range`); a
refused call's bytes are what its caller asked for, and are kept. A row with a time out
of range too is counted with the times alone (`LeftOut::keep_op`), and a file with rows
left out for both is named twice, times first (`LeftOut::name`). zcta_analysis's
`load`, `read_table`, `connect` and the helpers that take a frame read otherwise
(`stream_time_ns`, `busbw_points`) leave the same rows out, with the same words."""

import re
import subprocess
import sys
import warnings

import pandas as pd
import pytest

from test_analysis_bad_input import ZCTA
from test_analysis_exact_ints import zcta_file
from test_analysis_time_range import GOOD, REASON, _op
from test_readers import ROOT

sys.path.insert(0, str(ROOT / "analysis"))
import zcta_analysis as za  # noqa: E402
from zcta_analysis import plot as zp  # noqa: E402

U64_MAX = (1 << 64) - 1
BYTES = ("bytes of 2^62 (4 EiB) or more on a call that succeeded (larger than any buffer: a corrupt "
         "value); its other rows were used")

# Rank 0's damaged rows: two successful calls of 2^64 - 1 and 2^62 bytes (left out for
# their bytes), and one of 2^64 - 1 bytes with an API start before 1970 (left out, and
# counted, for its time alone).
OUT = [_op(0, 50, 5_000, bytes=U64_MAX), _op(0, 51, 5_000, bytes=1 << 62),
       _op(0, 52, 5_000, bytes=U64_MAX, api_start_ns=-1)]
# Kept: a successful call of 2^62 - 1 bytes, refused calls (result != 0) of 2^64 - 1
# and 2^62 bytes, and a successful call whose bytes are NULL (not known).
KEPT = [_op(0, 60, 5_000, bytes=(1 << 62) - 1), _op(0, 61, 5_000, bytes=U64_MAX, result=5),
        _op(0, 62, 5_000, bytes=1 << 62, result=-1), _op(0, 63, 5_000, bytes=None)]


def _write(run, rows, name="h-100.parquet"):
    """The two ranks' ops files (rank 0's named `name`); that of rank 0."""
    zcta_file(run / "ops" / name, "ops", [r for r in rows if r["rank"] == 0])
    zcta_file(run / "ops" / "h-101.parquet", "ops", [r for r in rows if r["rank"] == 1])
    return run / "ops" / name


def _notes(f):
    """The notes for rank 0's file, in zcta's order: the time, then the bytes."""
    return [(f, f"1 ops row left out: {REASON}"), (f, f"2 ops rows left out: {BYTES}")]


def _warned(fn, *args):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(x.message) for x in w if issubclass(x.category, za.ZctaWarning)]


def _said(notes):
    return [f"zcta_analysis: skipped {p}: {why}" for p, why in notes]


def _zcta_notes(*args):
    """`zcta ARGS`' notes on stderr of files with rows left out, in its order (`report`
    repeats them in its text)."""
    p = subprocess.run([ZCTA, *map(str, args)], capture_output=True, text=True)
    return re.findall(r"^zcta: skipped (\S+): (\d+ \w+ rows? left out: .*)$", p.stderr, re.M)


def _key(ops):
    return sorted(zip(ops["rank"].tolist(), ops.seq.tolist()))


@pytest.mark.parametrize("name", ["h-100.parquet", "h-[100].parquet"])
def test_readers_leave_out_a_successful_calls_impossible_bytes(tmp_path, name):
    """load, read_table and connect (by name, and in memory for a name DuckDB would
    glob) give every row but the three, each reason named with its count as zcta
    names it (`zcta summary`, `report`, `export`); a refused call's bytes, 2^62 - 1
    bytes and NULL bytes are kept, exact."""
    run = tmp_path / "r"
    f = _write(run, GOOD + OUT + KEPT)
    want = sorted((r["rank"], r["seq"]) for r in GOOD + KEPT)
    r, said = _warned(za.load, run)
    assert said == _said(_notes(f))
    assert r.skipped == _notes(f)
    assert _key(r.ops) == want
    assert str(r.ops.bytes.dtype) == "UInt64"
    got = dict(zip(r.ops.seq.tolist(), r.ops.bytes.tolist()))
    assert got[60] == (1 << 62) - 1 and got[61] == U64_MAX and got[62] == 1 << 62 and got[63] is pd.NA
    ops, said = _warned(za.read_table, run, "ops")
    assert said == _said(_notes(f))
    pd.testing.assert_frame_equal(ops, r.ops)
    con, said = _warned(za.connect, run)
    assert said == _said(_notes(f))
    rows = con.execute("select rank, seq, bytes from ops order by rank, seq").fetchall()
    assert [(a, b) for a, b, _ in rows] == want
    assert {s: b for _, s, b in rows}[61] == U64_MAX
    zcta = [(str(f), why) for _, why in _notes(f)]
    for args in (["summary", run], ["report", run], ["export", "--perfetto", "-o", tmp_path / "t.json", run]):
        assert _zcta_notes(*args) == zcta, args


def test_only_times_out_of_range_is_one_note(tmp_path):
    """A file whose only row with impossible bytes has a time out of range too is
    named once, for the time, by zcta_analysis as by zcta."""
    run = tmp_path / "r"
    f = _write(run, GOOD + OUT[2:])
    note = [(f, f"1 ops row left out: {REASON}")]
    r, said = _warned(za.load, run)
    assert r.skipped == note and said == _said(note)
    assert _warned(za.connect, run)[1] == _said(note)
    assert _zcta_notes("report", run) == [(str(f), note[0][1])]


def test_helpers_leave_them_out_of_a_frame_read_otherwise(tmp_path):
    """A frame read past zcta_analysis holds the rows: stream_time_ns gives them NaN
    and busbw_points no point (no 2^64 - 1 byte bandwidth), each naming the count per
    reason; the others' figures are those of the frame `load` gives."""
    run = tmp_path / "r"
    f = _write(run, GOOD + OUT + KEPT)
    raw = pd.read_parquet(f, dtype_backend="numpy_nullable")
    assert raw.bytes.max() == U64_MAX
    said = ["1 ops row left out: " + REASON, "2 ops rows left out: " + BYTES]
    got, w = _warned(za.stream_time_ns, raw)
    assert w == [f"zcta_analysis: stream_time_ns: {s}" for s in said]
    out = raw.seq.isin([r["seq"] for r in OUT]).to_numpy()
    assert got[out].isna().all() and got[~out].notna().all()
    ops = _warned(za.load, run)[0].ops.query("rank == 0")
    assert got[~out].tolist() == _warned(za.stream_time_ns, ops)[0].tolist()
    pts, w = _warned(zp.busbw_points, raw)
    assert w == [f"zcta_analysis: busbw_points: {s}" for s in said]
    assert pts.bytes.max() < 1 << 62
    pd.testing.assert_frame_equal(pts, _warned(zp.busbw_points, ops)[0])


def test_a_run_without_them_is_not_named(tmp_path):
    """Refused calls of any size and successful ones below 2^62 bytes: nothing named,
    every row read (the footer's statistics rule them out for connect, or its count
    finds none)."""
    run = tmp_path / "r"
    _write(run, GOOD + KEPT)
    r, said = _warned(za.load, run)
    assert said == [] and r.skipped == [] and len(r.ops) == len(GOOD + KEPT)
    con, said = _warned(za.connect, run)
    assert said == [] and con.execute("select count(*) from ops").fetchone()[0] == len(GOOD + KEPT)
    assert _zcta_notes("report", run) == []
