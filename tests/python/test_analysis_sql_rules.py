"""The DuckDB recipes in analysis/sql/ take a run's files and rows as zcta_analysis
takes them, so a damaged file cannot put a 2^64-byte op or a time from 1677 into their
figures.

Rows (of the tables each recipe reads): an ops row with a time outside [0, 2^62) ns in
one of zcta_analysis.TIME_COLUMNS["ops"], or of a call that succeeded (`result` 0) with
`bytes` of 2^62 or more (MAX_BYTES), is left out; the recipes' `where` is
zcta_analysis._rules_sql's text. Files: one whose footer gives no schema version, a bad
one or a newer one than zcta_analysis knows, or another table (`zcta.table`), is not
read. The runs are written as zcta writes its files (test_analysis_exact_ints.zcta_file);
each run with damage has a twin without it, which zcta_analysis reads to the same rows,
and every recipe must give the twin's figures on it. On a clean run each recipe gives
what it gave before it applied the rules (its text at BEFORE)."""

import shutil
import subprocess
import sys
import warnings

import duckdb
import pyarrow.parquet as pq
import pytest

from test_analysis_exact_ints import zcta_file
from test_analysis_time_range import COMM, _op
from test_readers import ROOT

sys.path.insert(0, str(ROOT / "analysis"))
import zcta_analysis as za  # noqa: E402
from zcta_analysis import _schema  # noqa: E402

SQL = ROOT / "analysis" / "sql"
RECIPES = ("path_mix.sql", "phase_breakdown.sql", "stragglers.sql")
OPS_RECIPES = ("path_mix.sql", "stragglers.sql")
# The recipes' last commit before they applied the rules: their text there is what a
# clean run's figures must not change from.
BEFORE = "57c69121eeb7196b45663dd34ef6ceb32f24e72b"

I64_MIN, I64_MAX, U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
NEWER = str(_schema.SCHEMA_VERSION + 1).encode()
KEEP = object()  # _file: the metadata key as zcta writes it


def _file(path, table, rows, version=KEEP, table_key=KEEP, drop=()):
    """`rows` as a file zcta writes of `table` (zcta_file), then with its
    `zcta.schema_version` / `zcta.table` replaced (None: removed) and the columns `drop`
    left out (a file of an older zcta)."""
    zcta_file(path, table, rows)
    if version is KEEP and table_key is KEEP and not drop:
        return
    t = pq.read_table(path).drop_columns(list(drop))
    meta = dict(t.schema.metadata)
    for key, value in ((za.SCHEMA_VERSION_KEY, version), (za.TABLE_KEY, table_key)):
        if value is None:
            meta.pop(key)
        elif value is not KEEP:
            meta[key] = value
    pq.write_table(t.replace_schema_metadata(meta), path)


def _pair(seq, op="AllReduce", **over):
    """Both ranks' rows of one collective (rank 1 starts later: the straggler)."""
    return [_op(0, seq, 5_000, op=op, **over), _op(1, seq, 5_000, op=op, **over)]


def _phases(rows):
    """The phases rows `zcta phases` writes for ops `rows` (window and shares made up)."""
    out = []
    for r in rows:
        w = r["gpu_end_ns"] - r["api_start_ns"]
        out.append({k: r.get(k) for k in ("host", "pid", "op_id", "op", "rank", "comm_id", "seq", "bytes", "engine")}
                   | {"window_ns": w, "init_ns": w // 4, "queue_ns": w // 8, "transfer_ns": w // 2,
                      "unresolved_ns": w - w // 4 - w // 8 - w // 2})
    return out


# Rank 0's rows that zcta_analysis leaves out: one per time column it judges (the
# values an int64 can hold beyond 1970..2116: before 1970, 1677, 2^62, int64's end),
# then a successful call of 2^64 - 1 bytes and one of 2^62. Each would add an op to
# path_mix.sql and a straggler to stragglers.sql (rank 1's row of the same collective
# is sound, and in both runs).
DAMAGED = [
    _op(0, 50, 5_000, api_start_ns=-1),
    _op(0, 51, 5_000, api_end_ns=I64_MAX),
    _op(0, 52, 5_000, launch_ns=1 << 62),
    _op(0, 53, 5_000, gpu_ready_ns=I64_MIN),
    _op(0, 54, 5_000, gpu_start_ns=I64_MAX),
    _op(0, 55, 5_000, gpu_end_ns=I64_MIN),
    _op(0, 56, 5_000, bytes=U64_MAX),
    _op(0, 57, 5_000, bytes=1 << 62),
]
# Rows zcta_analysis keeps at the rules' edges: 2^62 - 1 bytes, a refused call's 2^64 - 1
# and 2^62 bytes (what its caller asked for), unknown bytes, an unknown ready time, the
# last time in range.
EDGES = [
    _op(0, 60, 5_000, bytes=(1 << 62) - 1),
    _op(0, 61, 5_000, bytes=U64_MAX, result=5),
    _op(0, 62, 5_000, bytes=1 << 62, result=-1),
    _op(0, 63, 5_000, bytes=None),
    _op(0, 64, 5_000, gpu_ready_ns=None),
    _op(0, 65, 5_000, gpu_end_ns=(1 << 62) - 1),
]
# Sound rows: AllReduces, an AllGather whose engine is not measured, Sends, refused
# calls, a collective of no known communicator, one whose last GPU start two ranks
# share, the edges and rank 1's rows of the collectives of rank 0's damaged rows.
TIE = _op(2, 10, 5_000)["gpu_start_ns"]
GOOD = ([_op(rank, seq, 5_000 + 101 * seq + rank) for seq in range(6) for rank in (0, 1)]
        + _pair(6, op="AllGather", engine=None) + _pair(7, op="Send", peer=1) + _pair(8, result=3)
        + _pair(9, comm_id=None)
        + [_op(0, 10, 5_000, gpu_start_ns=TIE + 90), _op(1, 10, 5_000, gpu_start_ns=TIE + 90), _op(2, 10, 5_000)]
        + EDGES + [_op(1, seq, 5_000) for seq in range(50, 66)])
GPU_COLUMNS = ("launch_ns", "gpu_ready_ns", "gpu_start_ns", "gpu_end_ns", "engine", "gpu_source", "kernel",
               "n_kernels", "n_memcpy", "memcpy_bytes", "timing", "timing_level")


def _write(run, damaged):
    """A run with (damaged) or without the rows and files zcta_analysis leaves out."""
    for rank in (0, 1, 2):
        rows = [r for r in GOOD if r["rank"] == rank] + (DAMAGED if damaged and rank == 0 else [])
        _file(run / "ops" / f"h-{100 + rank}.parquet", "ops", rows)
    # Kept: a schema-1 file (no GPU columns: NULL), a version written "+2" (read as 2).
    _file(run / "ops" / "old-200.parquet", "ops", _pair(80, op="Broadcast", pid=200), version=b"1",
          drop=GPU_COLUMNS)
    _file(run / "ops" / "plus-201.parquet", "ops", _pair(81, op="ReduceScatter", pid=201),
          version=b"+" + str(_schema.SCHEMA_VERSION).encode())
    _file(run / "phases" / "h.parquet", "phases", _phases([r for r in GOOD if r["seq"] < 10]))
    if not damaged:
        return
    # Files not read, of sound rows that would change every figure: one more
    # collective (ops), with its phases (phases).
    late = _pair(70)
    bad_files = {
        "newer": {"version": NEWER},
        "far": {"version": b"4294967298"},  # beyond u32: a bad version
        "word": {"version": b"two"},
        "notutf8": {"version": b"\xff\xfe"},
        "spaced": {"version": b" 1"},
        "none": {"version": None},
        "nccl": {"table_key": b"nccl_ops"},
    }
    for i, (name, meta) in enumerate(bad_files.items()):
        rows = [dict(r, pid=300 + i) for r in late]
        _file(run / "ops" / f"{name}-{300 + i}.parquet", "ops", rows, **meta)
        _file(run / "phases" / f"{name}-{300 + i}.parquet", "phases", _phases(rows), **meta)
    # Other tables' files copied into ops/ and phases/ (their zcta.table says so).
    _file(run / "phases" / "ops-400.parquet", "ops", [dict(r, pid=400) for r in late])
    _file(run / "ops" / "phases-401.parquet", "phases", _phases([dict(r, pid=401) for r in late]))
    _file(run / "ops" / "process-402.parquet", "process",
          [{"host": "h", "pid": 402, "schema_version": _schema.SCHEMA_VERSION}])
    _file(run / "ops" / "gpu-403.parquet", "gpu", [{"start_ns": -1, "end_ns": 5, "bytes": U64_MAX, "pid": 403}])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the run with damaged rows and files, its twin without them)."""
    d = tmp_path_factory.mktemp("sql_rules")
    bad, clean = d / "bad", d / "clean"
    _write(bad, damaged=True)
    _write(clean, damaged=False)
    return bad, clean


def _text(name, base=SQL):
    """A recipe's SQL as the DuckDB CLI runs it from the repository's root: its
    `.read FILE` lines (the shared views/zcta_ops.sql and views/zcta_files.sql)
    replaced by that file's text, read the same way."""
    lines = (base / name).read_text().splitlines(keepends=True)
    return "".join(_text(line.split()[1], ROOT) if line.startswith(".read ") else line for line in lines)


def _run(text, run):
    """A recipe's rows, as the README runs it (the variable, then the file)."""
    con = duckdb.connect()
    con.execute(f"set variable run = '{run}'")
    return sorted(con.execute(text).fetchall(), key=repr)


def _before(name):
    r = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:analysis/sql/{name}"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"the recipes' text before the rules is not in this checkout: {r.stderr.strip()}")
    return r.stdout


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", za.ZctaWarning)
        return fn(*args)


def _keys(df):
    return sorted(zip(df["pid"].tolist(), df["op_id"].tolist()))


def test_the_twins_differ_by_what_zcta_analysis_leaves_out(runs):
    """zcta_analysis reads the damaged run to the clean one's rows, and says why."""
    bad, clean = runs
    b, c = _quiet(za.load, bad), _quiet(za.load, clean)
    assert len(c.ops) == len(GOOD) + 4 and len(c.phases) == len([r for r in GOOD if r["seq"] < 10])
    for t in ("ops", "phases"):
        assert _keys(getattr(b, t)) == _keys(getattr(c, t)), t
    assert not c.skipped
    said = sorted((str(p.relative_to(bad)), why.split(" (")[0].split(":")[0]) for p, why in b.skipped)
    files = {"far-301": "bad schema version '4294967298'", "newer-300": "written with schema version "
             f"{NEWER.decode()}, newer than this zcta_analysis's {_schema.SCHEMA_VERSION}; upgrade zcta_analysis",
             "none-305": "no zcta.schema_version in the file metadata", "notutf8-303": "bad schema version b'\\xff\\xfe'",
             "spaced-304": "bad schema version ' 1'", "word-302": "bad schema version 'two'",
             "nccl-306": "a file of table 'nccl_ops'"}
    assert said == sorted(
        [(f"{t}/{f}.parquet", why) for t in ("ops", "phases") for f, why in files.items()]
        + [(f"ops/{f}.parquet", f"a file of table '{t}'") for f, t in (("gpu-403", "gpu"), ("phases-401", "phases"),
                                                                      ("process-402", "process"))]
        + [("phases/ops-400.parquet", "a file of table 'ops'"),
           ("ops/h-100.parquet", "6 ops rows left out"), ("ops/h-100.parquet", "2 ops rows left out")])


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_leaves_out_the_rows_and_files_zcta_analysis_leaves_out(runs, name):
    """Every recipe gives the figures of the run without its damaged rows and files; the
    recipe as it was (BEFORE) did not (the damage shows in every one)."""
    bad, clean = runs
    text = _text(name)
    want = _run(text, clean)
    assert want
    assert _run(text, bad) == want
    old = _before(name)
    assert _run(old, bad) != _run(old, clean)


@pytest.mark.parametrize("name", RECIPES)
def test_a_clean_run_gives_the_figures_it_gave_before(runs, name):
    _, clean = runs
    assert _run(_text(name), clean) == _run(_before(name), clean)


@pytest.mark.parametrize("name", OPS_RECIPES)
def test_the_ops_recipes_rows_left_out_are_each_rules(runs, name):
    """Each damaged row alone changes the figures (no rule is covered by another)."""
    _, clean = runs
    text = _text(name)
    want = _run(text, clean)
    for row in DAMAGED:
        one = clean.parent / f"one-{name}-{row['seq']}"
        shutil.copytree(clean, one)
        _file(one / "ops" / "h-100.parquet", "ops", [r for r in GOOD if r["rank"] == 0] + [row])
        assert _quiet(za.read_table, one, "ops").shape[0] == len(GOOD) + 4, row
        assert _run(text, one) == want, row["seq"]
        assert _run(_before(name), one) != want, row["seq"]


def test_the_ops_recipes_rules_are_zcta_analysis_s_text():
    """The rules are one text: zcta_analysis._rules_sql's over every column it judges
    (whitespace aside), as `connect` applies it, in the view both ops recipes read
    (views/zcta_ops.sql); the phases table has none."""
    times, size = za._rules_sql("ops", za.TIME_COLUMNS["ops"] + ("bytes", "result"))
    want = f"({times}) and ({size})"
    assert want in " ".join((SQL / "views" / "zcta_ops.sql").read_text().split())
    for name in OPS_RECIPES:
        assert ".read analysis/sql/views/zcta_ops.sql\n" in (SQL / name).read_text(), name
    assert za._rules_sql("phases", [c for c, _, _ in _schema.COLUMNS["phases"]]) == ("true", "true")


def test_the_recipes_run_where_no_file_has_the_later_gpu_columns(tmp_path):
    """Files of a schema-2 zcta from before `launch_ns`, `gpu_ready_ns` and the timing
    columns existed: the rules read those as NULL (in range) and the figures are as
    before."""
    run = tmp_path / "early"
    later = ("launch_ns", "gpu_ready_ns", "timing", "timing_level", "gpu_source")
    for rank in (0, 1, 2):
        _file(run / "ops" / f"h-{100 + rank}.parquet", "ops", [r for r in GOOD if r["rank"] == rank], drop=later)
    _file(run / "phases" / "h.parquet", "phases", _phases([r for r in GOOD if r["seq"] < 10]))
    for name in RECIPES:
        got = _run(_text(name), run)
        assert got and got == _run(_before(name), run), name


@pytest.mark.skipif(shutil.which("duckdb") is None, reason="no duckdb CLI (pip install duckdb-cli)")
@pytest.mark.parametrize("name", RECIPES)
def test_the_duckdb_cli_leaves_them_out_too(runs, name):
    """The README's command, as written, in the DuckDB CLI (its own DuckDB version)."""
    out = []
    for run in runs:
        line = f"""duckdb -c "SET VARIABLE run = '{run}'" -c ".read analysis/sql/{name}\""""
        r = subprocess.run(line, shell=True, cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0 and not r.stderr and "│" in r.stdout, (name, r.stdout, r.stderr)
        out.append(sorted(r.stdout.splitlines()))  # rows whose sort keys tie come in either order
    assert out[0] == out[1], name
