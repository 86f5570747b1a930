"""zcta_analysis keeps integer columns exact in pandas. Times are ns since the UNIX epoch
(~1.8e18, beyond float64's 2^53: there float64 holds multiples of 256 only) and ids are
u64 hashes, so pandas' default for an integer column holding NULLs (float64) would put a
5 us GPU duration off by up to ~5 % and make two communicators equal. The runs here are
written as zcta writes its files (every column of the table in its type, zcta's
metadata) with rows whose times differ by odd amounts and a NULL in the same column."""

import sys
import warnings

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from test_analysis_bad_input import zcta_rows
from test_readers import ROOT

sys.path.insert(0, str(ROOT / "analysis"))
import zcta_analysis as za  # noqa: E402
from zcta_analysis import _schema  # noqa: E402

# An odd time near 2026's (~1.8e18 ns since the epoch): not a multiple of 256.
T0 = 1_800_000_000_000_000_001
# Two communicators whose u64 ids differ only in the lowest bit (top bit set: beyond
# int64 too).
COMM_A, COMM_B = 0xFEDC_BA98_7654_3211, 0xFEDC_BA98_7654_3210

INTS = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


def zcta_file(path, table, rows):
    """Writes `rows` (dicts of column values) as a file zcta would have written of
    `table`: its columns (zcta_analysis._schema, held to `zcta schema` by
    test_schema_is_zcta_s) in their types and zcta's metadata. A column a row leaves out
    is NULL where nullable, else 0 (or "x", False)."""
    fill = {"string": "x", "bool": False}
    cols, fields = [], []
    for name, typ, nullable in _schema.COLUMNS[table]:
        ty = pa.type_for_alias(typ)
        default = None if nullable else fill.get(typ, 0)
        cols.append(pa.array([r.get(name, default) for r in rows], ty))
        fields.append(pa.field(name, ty, nullable=nullable))
    meta = {za.SCHEMA_VERSION_KEY: str(_schema.SCHEMA_VERSION).encode(), za.TABLE_KEY: table.encode()}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=meta)), path)


def ints(col):
    """A column's values as Python ints (None for NULL), whatever its dtype."""
    return [None if pd.isna(v) else int(v) for v in col]


# Three timed AllReduces of one rank. Row 0: ready after its launch, 5,001 ns on the
# stream. Row 1: gpu_ready_ns NULL (not timed), its other times known. Row 2: launched
# after its stream was ready, 4,999 ns from the launch.
OPS = [
    {"op_id": 1, "op": "AllReduce", "rank": 0, "nranks": 2, "comm_id": COMM_A, "seq": 0, "bytes": 1 << 20,
     "api_start_ns": T0, "api_end_ns": T0 + 3, "launch_ns": T0 + 1_001, "gpu_ready_ns": T0 + 2_001,
     "gpu_start_ns": T0 + 2_507, "gpu_end_ns": T0 + 2_001 + 5_001, "timing": "timed", "timing_level": 0,
     "gpu_source": "stamps"},
    {"op_id": 2, "op": "AllReduce", "rank": 0, "nranks": 2, "comm_id": COMM_B, "seq": 0, "bytes": 1 << 20,
     "api_start_ns": T0 + 10_001, "api_end_ns": T0 + 10_005, "launch_ns": T0 + 10_003,
     "gpu_start_ns": T0 + 10_011, "gpu_end_ns": T0 + 17_777},
    {"op_id": 3, "op": "AllReduce", "rank": 0, "nranks": 2, "comm_id": None, "seq": 1, "bytes": 1 << 20,
     "api_start_ns": T0 + 20_001, "api_end_ns": T0 + 20_009, "launch_ns": T0 + 20_503, "gpu_ready_ns": T0 + 20_007,
     "gpu_start_ns": T0 + 20_601, "gpu_end_ns": T0 + 20_503 + 4_999, "timing": "timed", "timing_level": 0,
     "gpu_source": "stamps"},
]


@pytest.fixture
def run(tmp_path):
    r = tmp_path / "exact"
    zcta_file(r / "ops" / "h-p1.parquet", "ops", OPS)
    assert zcta_rows(r) == len(OPS)  # zcta itself reads the file whole: it is zcta's
    return r


def test_load_keeps_nanosecond_times_exact(run):
    """Times near 1.8e18 that differ by odd amounts, with a NULL in the same column:
    load() and read_table() give the exact integers (NULL as pd.NA), so a duration
    subtracted in pandas is exact (5,001 ns, not a multiple of 256)."""
    for ops in (za.load(run).ops, za.read_table(run, "ops")):
        for col in ("gpu_ready_ns", "gpu_end_ns", "launch_ns", "api_start_ns", "gpu_start_ns"):
            assert ints(ops[col]) == [r.get(col) for r in OPS], col
        assert str(ops.gpu_ready_ns.dtype) == "Int64"
        assert ops.gpu_ready_ns.isna().tolist() == [False, True, False]
        d = ops.gpu_end_ns - ops.gpu_ready_ns
        assert ints(d) == [5_001, None, 4_999 + 20_503 - 20_007]
        assert ops.gpu_end_ns[0] - ops.gpu_ready_ns[0] == 5_001
    # The same through DuckDB, in SQL and in its DataFrame.
    con = za.connect(run)
    assert con.execute("select gpu_end_ns - gpu_ready_ns from ops order by op_id").fetchall() == \
        [(5_001,), (None,), (4_999 + 20_503 - 20_007,)]
    assert ints(con.execute("select gpu_ready_ns from ops order by op_id").df().gpu_ready_ns) == \
        [r.get("gpu_ready_ns") for r in OPS]


def test_every_integer_column_is_a_nullable_integer_dtype(run):
    """Each integer column of the schema is pandas' nullable dtype of its own width and
    sign (Int64, UInt64, Int32, UInt32), with or without NULLs in it."""
    ops = za.load(run).ops
    for name, typ, _ in _schema.COLUMNS["ops"]:
        if typ in INTS:
            want = typ.capitalize() if typ.startswith("int") else "UInt" + typ[4:]  # int32 Int32, uint64 UInt64
            assert str(ops[name].dtype) == want, (name, typ, ops[name].dtype)


def test_u64_ids_that_differ_in_the_lowest_bit_stay_distinct(run):
    """Two comm_ids that differ only in the lowest bit, and a NULL: two communicators,
    each its own value, not one float."""
    ops = za.load(run).ops
    assert str(ops.comm_id.dtype) == "UInt64"
    assert ints(ops.comm_id) == [COMM_A, COMM_B, None]
    assert ops.comm_id[0] != ops.comm_id[1]
    assert ops.comm_id.nunique() == 2
    assert sorted(ops.groupby("comm_id").op_id.first().tolist()) == [1, 2]
    # A comparison with the NULL one is pd.NA (nullable dtypes), not False.
    assert ops.comm_id.eq(COMM_A).fillna(False).tolist() == [True, False, False]
    assert ops.comm_id.eq(COMM_B).fillna(False).tolist() == [False, True, False]


def test_stream_time_ns_is_exact(run):
    """stream_time_ns: gpu_end_ns - max(gpu_ready_ns, launch_ns) subtracted on the
    exact integers: 5,001 ns (ready after launch) and 4,999 ns (launched after ready);
    NaN where gpu_ready_ns is NULL."""
    got = za.stream_time_ns(za.load(run).ops)
    assert got.dtype == "float64"
    assert got[0] == 5_001 and got[2] == 4_999
    assert pd.isna(got[1])


def test_busbw_points_use_the_exact_duration(run):
    """busbw_points: the median of each op's exact time on its stream (the kernels'
    span, 17,777 - 10,011 ns, where gpu_ready_ns is NULL), bytes over it, AllReduce's
    factor 2(n-1)/n = 1 for two ranks."""
    from zcta_analysis import plot as zp

    pts = zp.busbw_points(za.load(run).ops)
    assert pts.bytes.tolist() == [1 << 20]
    dur = sorted([5_001, 17_777 - 10_011, 4_999])[1]  # the median of three
    assert pts.busbw.tolist() == [(1 << 20) / dur]


def test_skew_heatmap_keeps_communicators_and_offsets_exact(tmp_path):
    """The arrival skew panel: communicator A (3 collectives on 2 ranks) and B (its id
    one bit apart, 2 collectives) stay two communicators, A is drawn, and rank 1's
    offsets are the exact odd nanoseconds it began after rank 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zcta_analysis import plot as zp

    late = [1_001, 3, 2_049]  # ns rank 1 began after rank 0, per collective of A
    rows, op_id = [], 0
    for comm, n in ((COMM_A, 3), (COMM_B, 2)):
        for seq in range(n):
            for rank in (0, 1):
                op_id += 1
                begin = T0 + 100_000 * seq + (late[seq] if rank == 1 and comm == COMM_A else 0)
                rows.append({"op_id": op_id, "op": "AllReduce", "rank": rank, "nranks": 2, "comm_id": comm,
                             "seq": seq, "bytes": 8, "api_start_ns": begin - 50, "api_end_ns": begin - 40,
                             "launch_ns": begin - 45, "gpu_ready_ns": begin, "gpu_end_ns": begin + 1_001})
    rows.append({"op_id": op_id + 1, "op": "AllReduce", "rank": 0, "nranks": 2, "comm_id": None, "seq": 0,
                 "api_start_ns": T0, "api_end_ns": T0 + 1})  # a NULL comm_id and gpu times
    zcta_file(tmp_path / "skew" / "ops" / "h-p1.parquet", "ops", rows)
    fig, ax = plt.subplots()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no pandas warning on the nullable dtypes either
            zp.skew_heatmap(za.load(tmp_path / "skew"), ax, fig)
        assert f"communicator {COMM_A:016x} (its 3 collectives)" in ax.get_title(), ax.get_title()
        m = ax.images[0].get_array()
        assert m.tolist() == [[0.0, 0.0, 0.0], [l / 1e3 for l in late]]
    finally:
        plt.close(fig)
