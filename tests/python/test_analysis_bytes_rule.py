"""zcta_analysis's bytes rule is one rule in each of its forms.

An ops row of a call that succeeded (`result` 0) with `bytes` of 2^62 or more is left
out (src/analysis/mod.rs `bytes_possible`); NULL bytes are no size (kept). zcta's
`result` is required, never NULL; zcta_analysis judges a NULL `result` as a success in
every form: the pyarrow one `load`, `read_table` and `connect`'s in-memory files apply
(`_kept`), the SQL of `connect`'s views (`_rules_sql`) and the pandas one of the helpers
that take a frame (`stream_time_ns`, `busbw_points`, the skew panel). Each is fed the
same rows here and keeps the same ones, and where the rows are a file zcta reads,
zcta leaves out as many."""

import re
import subprocess
import sys
import warnings

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from test_analysis_bad_input import ZCTA
from test_analysis_exact_ints import zcta_file
from test_analysis_time_range import GOOD, _op
from test_readers import ROOT

sys.path.insert(0, str(ROOT / "analysis"))
import zcta_analysis as za  # noqa: E402
from zcta_analysis import _schema  # noqa: E402

U64_MAX = (1 << 64) - 1
BYTES = [1 << 20, (1 << 62) - 1, 1 << 62, U64_MAX, None]
# Rank 0's rows: every result (success, a refusal, NULL) with every size, seq 100 on.
ROWS = [_op(0, 100 + i, 5_000, result=res, bytes=b)
        for i, (res, b) in enumerate((res, b) for res in (0, 5, None) for b in BYTES)]


def _kept_by_rule(rows):
    """The seqs `bytes_possible` keeps, a NULL result judged as 0."""
    return sorted(r["seq"] for r in rows
                  if (r["result"] or 0) != 0 or r["bytes"] is None or r["bytes"] < 1 << 62)


def _table(rows, table="ops"):
    """The rows as zcta's columns and types (`result` nullable: it may hold NULL)."""
    cols, fields = [], []
    for name, typ, nullable in _schema.COLUMNS[table]:
        ty = pa.type_for_alias(typ)
        default = None if nullable else {"string": "x", "bool": False}.get(typ, 0)
        cols.append(pa.array([r.get(name, default) for r in rows], ty))
        fields.append(pa.field(name, ty))
    meta = {za.SCHEMA_VERSION_KEY: str(_schema.SCHEMA_VERSION).encode(), za.TABLE_KEY: table.encode()}
    return pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=meta))


def _frame(rows):
    """The rows as a frame built by hand: every integer column of Python ints and
    None (object), as exact as the values."""
    t = _table(rows)
    return pd.DataFrame({n: pd.Series(t.column(n).to_pylist(), dtype=object) for n in t.column_names})


def _warned(fn, *args):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(x.message) for x in w if issubclass(x.category, za.ZctaWarning)]


def _left_out(said):
    """The count of rows a warning says were left out for their bytes (0: none said)."""
    n = [int(m) for s in said for m in re.findall(r"(\d+) ops rows? left out: bytes", s)]
    assert len(n) <= 1, said
    return sum(n)


def _by_helpers(frame):
    """The seqs the pandas form keeps, through stream_time_ns (NaN: left out; every row
    is timed), and the count it names."""
    st, said = _warned(za.stream_time_ns, frame)
    return sorted(frame.seq[st.notna().to_numpy()].tolist()), _left_out(said)


def test_every_form_keeps_the_same_rows_null_result_too(tmp_path):
    """pyarrow (`_kept`), SQL (`_rules_sql` over the same table in DuckDB, and
    `connect`'s view over a file whose footer does not tell of the NULLs) and pandas
    (the helpers on a hand-built frame) keep the rows `bytes_possible` keeps, a NULL
    result judged as a success, and count the same rows left out."""
    import duckdb

    want = _kept_by_rule(ROWS)
    assert len(want) == len(ROWS) - 4  # 2^62 and 2^64 - 1, of a success and of a NULL result
    t = _table(ROWS)

    kept, times, size = za._kept(t, "ops")
    assert (sorted(kept.column("seq").to_pylist()), times, size) == (want, 0, 4)

    rules = " and ".join(f"({r})" for r in za._rules_sql("ops", t.column_names))
    con = duckdb.connect()
    con.register("t", t)
    assert [s for (s,) in con.execute(f"select seq from t where {rules} order by seq").fetchall()] == want

    run = tmp_path / "r"
    f = run / "ops" / "h-100.parquet"
    f.parent.mkdir(parents=True)
    pq.write_table(t, f, write_statistics=False)
    con, said = _warned(za.connect, run)
    assert _left_out(said) == 4
    assert [s for (s,) in con.execute("select seq from ops order by seq").fetchall()] == want

    assert _by_helpers(_frame(ROWS)) == (want, 4)
    keep, said = _warned(za._ops_kept, _frame(ROWS), "x")
    assert sorted(r["seq"] for r, k in zip(ROWS, keep) if k) == want and _left_out(said) == 4


@pytest.mark.parametrize("dtypes", ["object", "numpy_nullable", "pyarrow"])
def test_pandas_form_judges_a_null_result_whatever_the_dtype(dtypes):
    """A NULL result counts as a success in a frame of objects, of pandas' nullable
    dtypes and of pyarrow's."""
    frame = _frame(ROWS)
    if dtypes != "object":
        frame = _table(ROWS).to_pandas(types_mapper=pd.ArrowDtype if dtypes == "pyarrow" else za._PANDAS_DTYPES.get)
    assert _by_helpers(frame) == (_kept_by_rule(ROWS), 4)


def test_readers_helpers_and_zcta_keep_the_same_rows(tmp_path):
    """Rows zcta reads (no NULL result: zcta skips such a file, and `load` does too):
    load, read_table, connect and the helpers on frames read past zcta_analysis keep
    the same rows, and name as many left out as zcta does."""
    rows = [r for r in ROWS if r["result"] is not None]
    run = tmp_path / "r"
    f = run / "ops" / "h-100.parquet"
    zcta_file(f, "ops", [r for r in GOOD if r["rank"] == 0] + rows)
    zcta_file(run / "ops" / "h-101.parquet", "ops", [r for r in GOOD if r["rank"] == 1])
    want = _kept_by_rule(rows)
    mine = lambda seqs: sorted(s for s in seqs if s >= 100)  # noqa: E731

    r, said = _warned(za.load, run)
    assert mine(r.ops.seq.tolist()) == want and _left_out(said) == 2
    ops, said = _warned(za.read_table, run, "ops")
    assert mine(ops.seq.tolist()) == want and _left_out(said) == 2
    con, said = _warned(za.connect, run)
    assert mine(s for (s,) in con.execute("select seq from ops").fetchall()) == want and _left_out(said) == 2
    for frame in (pd.read_parquet(f, dtype_backend="numpy_nullable"), _frame(rows)):
        seqs, n = _by_helpers(frame)
        assert (mine(seqs), n) == (want, 2)

    p = subprocess.run([ZCTA, "summary", run], capture_output=True, text=True)
    assert re.findall(r"^zcta: skipped (\S+): (\d+) ops rows? left out: bytes", p.stderr, re.M) == [(str(f), "2")]

    t = _table([r for r in GOOD if r["rank"] == 0] + ROWS)
    pq.write_table(t, f)  # a NULL result, and the footer says so: the file is skipped
    r, said = _warned(za.load, run)
    assert (f, "required column result holds NULLs") in r.skipped and set(r.ops["rank"]) == {1}
