"""analysis/zcta_analysis on a run recorded with the shim, the stand-in NCCL and the
stand-in CUPTI (so GPU columns and phases exist)."""

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import duckdb
import pytest

from test_readers import FIX, ROOT, host, run_job  # noqa: F401 (fixture)

sys.path.insert(0, str(ROOT / "analysis"))
import zcta_analysis as za  # noqa: E402
from zcta_analysis.__main__ import main as cli  # noqa: E402

ZCTA = ROOT / "target" / "debug" / "zcta"


@pytest.fixture(scope="module")
def run(host, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("runs")
    r = run_job(host, out, "ana", ranks=2, iters=3, cupti=True)
    subprocess.run([ZCTA, "phases", r], check=True, capture_output=True)
    (r / "ops" / "_leftover.wal").write_bytes(b"not a parquet file")
    return r


def test_load_and_duckdb_agree(run):
    r = za.load(run)
    assert len(r.ops) == 2 * 3 * 11
    assert len(r.phases) == len(r.ops)
    assert len(r.process) == 2 and (r.process.cupti == "on").all()
    con = za.connect(run)
    for t, df in (("ops", r.ops), ("gpu", r.gpu), ("process", r.process), ("phases", r.phases)):
        assert con.execute(f"select count(*) from {t}").fetchone()[0] == len(df), t


def test_breakdown_shares_add_up(run):
    b = za.breakdown(run)
    assert set(b.op) >= {"AllReduce", "AlltoAll", "Send", "Recv"}
    shares = b[list(za.PHASES)].fillna(0).sum(axis=1)
    assert ((shares - 1).abs() < 1e-9).all()
    assert (b.engine == "sm_kernel").all()


def test_breakdown_of_a_phases_table_from_an_older_zcta(run):
    r = za.load(run)
    r.phases = r.phases.drop(columns=["sync_ns"])  # written before the sync phase
    b = za.breakdown(r)
    assert b["sync"].isna().all()
    assert not za.compare(r, r).empty


def test_compare_a_run_with_itself(run):
    c = za.compare(run, run)
    assert (c.window_change_us == 0).all()


def test_sql_files_run_in_duckdb(run):
    con = duckdb.connect()
    con.execute(f"set variable run = '{run}'")
    for f in sorted((ROOT / "analysis" / "sql").glob("*.sql")):
        rows = con.execute(f.read_text()).fetchall()
        assert rows, f.name


def test_plot_cli_writes_a_png(run, tmp_path):
    out = tmp_path / "p.png"
    assert cli(["plot", str(run), str(run), "-o", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        za.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="zcta phases"):
        za.breakdown(tmp_path / "empty")
    assert cli(["plot", str(tmp_path / "empty"), "-o", str(tmp_path / "x.png")]) == 2


def test_older_schema_files_read_with_nulls(run, tmp_path):
    """A run holding a schema-1 ops file (before GPU capture: no GPU columns) next to
    current ones: load() and connect() read both; the old rows' GPU columns are NULL."""
    import shutil

    import pyarrow.parquet as pq

    mixed = tmp_path / "mixed"
    shutil.copytree(run, mixed)
    cur = sorted((mixed / "ops").glob("*.parquet"))[0]
    t = pq.read_table(cur)
    gpu_cols = ["launch_ns", "gpu_start_ns", "gpu_end_ns", "engine", "kernel", "n_kernels", "n_memcpy", "memcpy_bytes"]
    old = t.drop_columns([c for c in gpu_cols if c in t.column_names])
    meta = {k: v for k, v in (t.schema.metadata or {}).items()}
    meta[b"zcta.schema_version"] = b"1"
    pq.write_table(old.replace_schema_metadata(meta), mixed / "ops" / "oldhost-p1.parquet")
    r = za.load(mixed)
    assert len(r.ops) == 2 * 3 * 11 + old.num_rows
    assert r.ops.gpu_start_ns.isna().sum() == old.num_rows
    assert r.ops.engine.isna().sum() == old.num_rows
    con = za.connect(mixed)
    assert con.execute("select count(*) from ops where engine is null").fetchone()[0] == old.num_rows


@pytest.mark.skipif(importlib.util.find_spec("flit_core") is None, reason="flit_core not installed (pip install flit_core)")
def test_installing_the_package_leaves_nothing_in_the_checkout(tmp_path):
    """`pip install ./analysis` builds from the checkout itself: the build backend must
    not write build/ or *.egg-info there (built here from a copy, without network)."""
    src = tmp_path / "analysis"
    shutil.copytree(ROOT / "analysis", src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "whl"), str(src)],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "whl").glob("zcta_analysis-*.whl"))
    after = sorted(p.relative_to(src) for p in src.rglob("*") if "__pycache__" not in p.parts)
    assert after == before
