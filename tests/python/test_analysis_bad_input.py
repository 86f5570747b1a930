"""zcta_analysis on hostile run directories: it takes the files zcta takes
(format/src/reader.rs), skips the others whole with a warning naming the file and why,
names what it cannot list (link loops), and its CLI ends in one line, not a traceback."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from test_readers import ROOT, host, run_job, schema_version  # noqa: F401 (fixture)

sys.path.insert(0, str(ROOT / "analysis"))
import zcta_analysis as za  # noqa: E402

ZCTA = ROOT / "target" / "debug" / "zcta"
OPS_ROWS = 2 * 3 * 11  # 2 ranks, 3 iterations, 11 ops each


@pytest.fixture(scope="module")
def good(host, tmp_path_factory):  # noqa: F811
    """A run with GPU columns and its phases table (stand-in CUPTI), never modified:
    each test works on its own copy."""
    out = tmp_path_factory.mktemp("bad_input")
    r = run_job(host, out, "good", ranks=2, iters=3, cupti=True)
    subprocess.run([ZCTA, "phases", r], check=True, capture_output=True)
    return r


@pytest.fixture
def run(good, tmp_path):
    r = tmp_path / "run"
    shutil.copytree(good, r)
    return r


def ops_files(run):
    return sorted((run / "ops").glob("*.parquet"))


def rewrite(path, table=None, **meta):
    """Rewrites a Parquet file as `table` (default: as it is), its key-value metadata
    updated with `meta` (bytes values; None removes the key)."""
    t = table if table is not None else pq.read_table(path)
    kv = dict(pq.read_metadata(path).metadata or {})
    kv.pop(b"ARROW:schema", None)
    for k, v in meta.items():
        k = k.replace("_", ".", 1).encode()  # zcta_table -> zcta.table
        if v is None:
            kv.pop(k, None)
        else:
            kv[k] = v
    path.unlink()
    pq.write_table(t.replace_schema_metadata(kv), path)


def load_warns(run):
    """load(run) and the text of each warning it gave."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = za.load(run)
    return r, [str(x.message) for x in w]


def connect_count(run, table="ops"):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        n = za.connect(run).execute(f"select count(*) from {table}").fetchone()[0]
    return n, [str(x.message) for x in w]


def zcta_rows(run, table="ops"):
    """Rows `zcta summary` reads of `table` (the Rust reader's word)."""
    s = subprocess.run([ZCTA, "summary", run], capture_output=True, text=True)
    m = re.search(rf"^  {table} +(\d+) rows in", s.stdout, re.M)
    assert m, (s.stdout, s.stderr)
    return int(m.group(1))


def test_schema_is_zcta_s():
    """The package's copy of every table's columns (name, type, nullable) and schema
    version is the one zcta writes (`zcta schema`, format/src/lib.rs)."""
    from zcta_analysis import _schema

    out = subprocess.run([ZCTA, "schema"], check=True, capture_output=True, text=True).stdout
    tables, cur = {}, None
    for line in out.splitlines():
        if m := re.match(r"^## `(\w+)`", line):
            cur = tables.setdefault(m.group(1), [])
        elif (m := re.match(r"^\| `(\w+)` \| (\w+) \| (yes|no) \|", line)) and cur is not None:
            cur.append((m.group(1), m.group(2), m.group(3) == "yes"))
    assert {t: list(c) for t, c in _schema.COLUMNS.items()} == tables
    assert str(_schema.SCHEMA_VERSION) == schema_version()
    assert set(za.TABLES) == set(tables)


@pytest.mark.parametrize("other", ["process", "comms", "calls"])
def test_a_file_of_another_table_is_skipped_and_named(run, other):
    """A `process`/`comms`/`calls` file copied into ops/ (its zcta.table says so) is
    not read as ops: skipped with a warning naming it and its table; zcta agrees."""
    src = sorted((run / other).glob("*.parquet"))[0]
    stray = run / "ops" / f"stray-{other}.parquet"
    shutil.copy(src, stray)
    r, msgs = load_warns(run)
    assert len(r.ops) == OPS_ROWS
    assert any(str(stray) in m and f"'{other}'" in m and "zcta.table" in m for m in msgs), msgs
    assert stray in [p for p, _ in r.skipped]
    n, msgs = connect_count(run)
    assert n == OPS_ROWS and any(str(stray) in m for m in msgs), msgs
    assert zcta_rows(run) == OPS_ROWS


def test_a_file_whose_zcta_table_is_another_is_skipped_even_when_its_columns_fit(run):
    f = ops_files(run)[0]
    rewrite(f, zcta_table=b"nccl_ops")
    r, msgs = load_warns(run)
    assert len(r.ops) == OPS_ROWS - pq.read_metadata(f).num_rows
    assert any(str(f) in m and "'nccl_ops'" in m for m in msgs), msgs


@pytest.mark.parametrize(
    "version, why",
    [(b"3", "newer than this zcta_analysis's 2"), (b"999", "newer"), (b"two", "bad schema version"),
     (b"\xff\xfe", "bad schema version"), (None, "not written by zcta")],
    ids=["next", "far", "word", "not-utf8", "none"],
)
def test_a_file_of_a_newer_or_unknown_schema_version_is_skipped(run, version, why):
    f = ops_files(run)[0]
    rows = pq.read_metadata(f).num_rows
    rewrite(f, zcta_schema_version=version)
    r, msgs = load_warns(run)
    assert len(r.ops) == OPS_ROWS - rows
    assert any(str(f) in m and why in m for m in msgs), msgs
    n, _ = connect_count(run)
    assert n == OPS_ROWS - rows


def test_an_older_schema_version_reads_with_its_missing_columns_null(run):
    """Version 1 (no GPU columns) is upgraded as zcta does: the columns it lacks are
    NULL, with their types, and every known column is there."""
    f = ops_files(run)[0]
    t = pq.read_table(f)
    gone = ["launch_ns", "gpu_ready_ns", "gpu_start_ns", "gpu_end_ns", "engine", "timing", "timing_level"]
    rewrite(f, t.drop_columns(gone), zcta_schema_version=b"1")
    r, msgs = load_warns(run)
    assert not [m for m in msgs if "skipped" in m], msgs
    assert len(r.ops) == OPS_ROWS
    assert list(r.ops.columns) == [c for c, _, _ in za._schema.COLUMNS["ops"]]
    assert r.ops.gpu_end_ns.isna().sum() == t.num_rows


@pytest.mark.parametrize(
    "column, make",
    [("op_id", lambda c: c.cast(pa.string())), ("op", lambda c: c.dictionary_encode()),
     ("api_start_ns", lambda c: c.cast(pa.float64(), safe=False)), ("rank", lambda c: c.cast(pa.int64()))],
    ids=["uint64-as-string", "dictionary", "int64-as-float", "nullable-int32-as-int64"],
)
def test_a_column_of_another_type_skips_the_file_naming_it_and_the_column(run, column, make):
    """Before: pyarrow's ArrowTypeError from the concatenation, naming neither."""
    f = ops_files(run)[0]
    t = pq.read_table(f)
    i = t.column_names.index(column)
    rewrite(f, t.set_column(i, column, make(t.column(i))))
    r, msgs = load_warns(run)
    assert len(r.ops) == OPS_ROWS - t.num_rows
    assert any(str(f) in m and f"column {column} has type" in m for m in msgs), msgs
    n, msgs = connect_count(run)
    assert n == OPS_ROWS - t.num_rows and any(str(f) in m for m in msgs), msgs
    assert zcta_rows(run) == OPS_ROWS - t.num_rows


def test_a_required_column_missing_or_null_skips_the_file(run):
    a, b = ops_files(run)
    ta, tb = pq.read_table(a), pq.read_table(b)
    rewrite(a, ta.drop_columns(["op"]))
    i = tb.column_names.index("op")
    rewrite(b, tb.set_column(i, "op", pa.array([None] * tb.num_rows, pa.string())))
    r, msgs = load_warns(run)
    assert r.ops.empty
    assert any(str(a) in m and "required column op is missing" in m for m in msgs), msgs
    assert any(str(b) in m and "required column op holds NULLs" in m for m in msgs), msgs
    n, _ = connect_count(run, "phases")  # ops has no view; the others still do
    assert n == OPS_ROWS


def test_a_column_zcta_does_not_know_is_kept(run):
    """A newer zcta's extra column (same schema version) is not lost."""
    f = ops_files(run)[0]
    t = pq.read_table(f)
    rewrite(f, t.append_column("new_col", pa.array(range(t.num_rows), pa.int64())))
    r, msgs = load_warns(run)
    assert len(r.ops) == OPS_ROWS and r.ops.new_col.notna().sum() == t.num_rows
    assert not [m for m in msgs if "skipped" in m], msgs


def test_an_ops_directory_that_links_to_itself_is_named(run):
    """Before: 0 ops rows and not a word. The other tables are still read."""
    shutil.rmtree(run / "ops")
    (run / "ops").symlink_to("ops")
    r, msgs = load_warns(run)
    assert r.ops.empty and len(r.phases) == OPS_ROWS
    assert any(str(run / "ops") in m and "symbolic links" in m for m in msgs), msgs
    n, msgs = connect_count(run, "phases")
    assert n == OPS_ROWS and any(str(run / "ops") in m for m in msgs), msgs


def test_an_ops_path_that_is_a_file_or_a_dangling_link_is_named(run):
    shutil.rmtree(run / "ops")
    (run / "ops").write_text("x")
    _, msgs = load_warns(run)
    assert any(str(run / "ops") in m and "not a directory" in m for m in msgs), msgs
    (run / "ops").unlink()
    (run / "ops").symlink_to(run / "gone")
    _, msgs = load_warns(run)
    assert any(str(run / "ops") in m and "cannot be followed" in m for m in msgs), msgs


def test_links_and_odd_entries_inside_a_table_are_named_and_the_rest_read(run):
    """A file link loop, a link to a directory (a link to `.` would read every file
    twice), a dangling link and a FIFO, each named like a table file: each named with
    why, nothing blocks, and the good files are read once, as zcta reads them."""
    ops = run / "ops"
    (ops / "loop.parquet").symlink_to("loop.parquet")
    (ops / "again.parquet").symlink_to(".")
    (ops / "dangling.parquet").symlink_to(run / "nowhere.parquet")
    os.mkfifo(ops / "fifo-00000.parquet")
    r, msgs = load_warns(run)
    assert len(r.ops) == OPS_ROWS
    for name, why in [("loop.parquet", "cannot be followed"), ("again.parquet", "a directory: not followed"),
                      ("dangling.parquet", "cannot be followed"), ("fifo-00000.parquet", "a FIFO: not opened")]:
        assert any(str(ops / name) in m and why in m for m in msgs), (name, msgs)
    assert {p.name for p, _ in r.skipped} == {"loop.parquet", "again.parquet", "dangling.parquet", "fifo-00000.parquet"}
    n, _ = connect_count(run)
    assert n == OPS_ROWS
    assert zcta_rows(run) == OPS_ROWS


def test_sub_directories_and_links_to_files_are_read_as_zcta_reads_them(run):
    """zcta reads a table's sub-directories (`key=value/` partitions) and links to
    regular files; before, load saw only the top level (rows lost without a word)."""
    a, b = ops_files(run)
    (run / "ops" / "part=1").mkdir()
    a.rename(run / "ops" / "part=1" / a.name)
    elsewhere = run.parent / "elsewhere.parquet"
    b.rename(elsewhere)
    b.symlink_to(elsewhere)
    r, msgs = load_warns(run)
    assert len(r.ops) == OPS_ROWS, msgs
    assert connect_count(run)[0] == OPS_ROWS
    assert zcta_rows(run) == OPS_ROWS


def test_copies_are_read_once_as_zcta_reads_them(run):
    """A copy below the table's directory under its name, one re-written by another
    tool under its name, and one beside it under another name (the same bytes): zcta
    reads each file's rows once and names the others; so do load and connect (before,
    they read every copy: rows counted twice)."""
    a = ops_files(run)[0]
    for d in ("backup", "resaved"):
        (run / "ops" / d).mkdir()
        shutil.copy(a, run / "ops" / d / a.name)
    rewrite(run / "ops" / "resaved" / a.name)
    shutil.copy(a, run / "ops" / "a-backup.parquet")
    r, msgs = load_warns(run)
    n, cmsgs = connect_count(run)
    assert len(r.ops) == n == zcta_rows(run) == OPS_ROWS, msgs
    for name in ("backup/", "resaved/", "a-backup.parquet"):
        assert any(name in m for m in msgs) and any(name in m for m in cmsgs), (name, msgs)


def test_a_file_name_that_is_not_utf8_is_read(run):
    """A host name in another encoding: zcta reads the file; before, pyarrow could not
    encode its name and load skipped it (and connect failed)."""
    f = ops_files(run)[0]
    odd = pathlib.Path(os.fsdecode(os.fsencode(run / "ops") + b"/h\xff\xfe-p1-00000.parquet"))
    f.rename(odd)
    r, msgs = load_warns(run)
    assert len(r.ops) == OPS_ROWS and not [m for m in msgs if "skipped" in m], msgs
    assert connect_count(run)[0] == OPS_ROWS


def test_connect_skips_what_load_skips(run):
    """Before: one truncated file made connect raise (DuckDB's error, for the whole
    view), and a file of another table was read into the view."""
    ops = run / "ops"
    (ops / "trunc-00000.parquet").write_bytes(ops_files(run)[0].read_bytes()[:1000])
    shutil.copy(sorted((run / "process").glob("*.parquet"))[0], ops / "proc-00000.parquet")
    r, load_msgs = load_warns(run)
    n, msgs = connect_count(run)
    assert n == len(r.ops) == OPS_ROWS
    for name in ("trunc-00000.parquet", "proc-00000.parquet"):
        assert any(name in m for m in msgs) and any(name in m for m in load_msgs), (msgs, load_msgs)


def test_connect_in_a_run_whose_name_has_glob_characters(good, tmp_path):
    """DuckDB expands `[...]`, `*` and `?` in a path: before, connect on `exp[1]` read
    the files of a neighbouring run `exp1` (or none)."""
    shutil.copytree(good, tmp_path / "exp[1]")
    shutil.copytree(good, tmp_path / "exp1")
    for f in ops_files(tmp_path / "exp1"):
        f.unlink()
    (tmp_path / "exp1" / "ops" / "x.parquet").write_bytes(b"")
    n, msgs = connect_count(tmp_path / "exp[1]")
    assert n == OPS_ROWS, msgs
    weird = tmp_path / "exp[1]" / "ops" / "*.parquet"
    shutil.copy(ops_files(tmp_path / "exp[1]")[0], weird)
    rewrite(weird)  # its rows in other bytes: not a copy zcta reads once
    n, _ = connect_count(tmp_path / "exp[1]")
    assert n == OPS_ROWS + pq.read_metadata(weird).num_rows


def test_pending_write_ahead_logs_are_named(run):
    """Rows of a killed (or running) process are still in its log: say so and how to
    get them (`zcta recover`), as zcta summary does."""
    (run / "ops" / "_h-p1-u00000000-00000.wal").write_bytes(b"log")
    r, msgs = load_warns(run)
    assert len(r.ops) == OPS_ROWS
    assert any("1 write-ahead log pending" in m and f"zcta recover {run}" in m for m in msgs), msgs


def test_the_same_bad_run_loaded_twice_warns_twice(run):
    """Python shows a warning once per place by default: a second load of the same bad
    run (a notebook cell run again) would say nothing."""
    (run / "ops" / "bad-00000.parquet").write_bytes(b"junk")
    code = "import sys, zcta_analysis as za; za.load(sys.argv[1]); za.load(sys.argv[1])"
    p = subprocess.run([sys.executable, "-c", code, run], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "analysis")})
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("ZctaWarning: zcta_analysis: skipped") == 2, p.stderr
    assert p.stderr.count("bad-00000.parquet: not a readable Parquet file") == 2, p.stderr
    assert p.stderr.startswith("<string>:1: ZctaWarning"), p.stderr  # the user's line, not the package's
