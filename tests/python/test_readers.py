"""The run directory is readable by the tools users reach for: DuckDB and pandas,
including while leftovers of a killed process are present."""

import os
import pathlib
import shutil
import signal
import subprocess
import time

import duckdb
import pandas as pd
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"


def shim() -> pathlib.Path:
    p = pathlib.Path(os.environ.get("ZCTA_SHIM", ROOT / "target" / "debug" / "libzcta_prof.so"))
    if not p.exists():
        pytest.fail(f"{p} missing: build it with `cargo build -p zcta-shim`")
    return p


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("fixtures")
    subprocess.run(["bash", FIX / "build.sh", d], check=True)
    return d / "host"


def stand_in_cupti(host: pathlib.Path) -> str:
    """The stand-in libcupti that tests/fixtures/build.sh puts beside the host (loaded
    by the host when HOST_CUPTI names it)."""
    return str(host.parent / "cupti" / "libcupti.so.13")


def run_job(host: pathlib.Path, out: pathlib.Path, run_id: str, ranks: int = 2, iters: int = 5,
            cupti: bool = False, extra_env: dict | None = None) -> pathlib.Path:
    """`ranks` host processes of the ops scenario under the shim; `cupti`: with the
    stand-in CUPTI, so GPU columns and phases exist; `extra_env`: more settings."""
    idfile = out / "id"
    idfile.write_bytes(os.urandom(128))
    env = {**os.environ, "LD_PRELOAD": str(shim()), "ZCTA_OUT": str(out), "ZCTA_RUN_ID": run_id}
    if cupti:
        env["HOST_CUPTI"] = stand_in_cupti(host)
        env["ZCTA_GPU"] = "deep"
    env.update(extra_env or {})
    procs = [subprocess.Popen([host, "ops", str(r), str(ranks), idfile, str(iters)], env=env) for r in range(ranks)]
    assert [p.wait() for p in procs] == [0] * ranks
    return out / run_id


def schema_version():
    """SCHEMA_VERSION as format/src/lib.rs defines it."""
    import re

    src = (pathlib.Path(__file__).resolve().parents[2] / "format" / "src" / "lib.rs").read_text()
    return re.search(r"pub const SCHEMA_VERSION: u32 = (\d+);", src).group(1)


def test_duckdb_and_pandas_read_ops(host, tmp_path):
    run = run_job(host, tmp_path, "r1")
    con = duckdb.connect()
    n = con.execute(f"select count(*) from read_parquet('{run}/ops/**/*.parquet')").fetchone()[0]
    assert n == 2 * 5 * 11
    df = pd.read_parquet(run / "ops")
    assert len(df) == n
    # One collective joins across both ranks on (comm_id, seq).
    joined = con.execute(
        f"""select comm_id, seq, count(distinct rank) r, count(distinct op) o
            from read_parquet('{run}/ops/**/*.parquet') where op not in ('Send','Recv')
            group by all"""
    ).df()
    assert len(joined) == 5 * 9 and (joined.r == 2).all() and (joined.o == 1).all()
    meta = con.execute(
        f"select value from parquet_kv_metadata('{run}/ops/**/*.parquet') where key = 'zcta.schema_version'"
    ).fetchall()
    assert {bytes(v[0]).decode() for v in meta} == {schema_version()}


def test_leftovers_never_break_readers(host, tmp_path):
    run = run_job(host, tmp_path, "r2")
    # A killed process leaves its log and an unfinished Parquet file.
    idfile = tmp_path / "id"
    env = {**os.environ, "LD_PRELOAD": str(shim()), "ZCTA_OUT": str(tmp_path), "ZCTA_RUN_ID": "r2"}
    p = subprocess.Popen([host, "loop", idfile], env=env, stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"started"
    time.sleep(1.5)
    p.send_signal(signal.SIGKILL)
    p.wait()
    leftovers = list((run / "ops").glob("_*"))
    assert any(f.name.endswith(".wal") for f in leftovers), leftovers
    assert any(f.name.endswith(".parquet.tmp") for f in leftovers), leftovers
    con = duckdb.connect()
    assert con.execute(f"select count(*) from read_parquet('{run}/ops/**/*.parquet')").fetchone()[0] == 110
    assert len(pd.read_parquet(run / "ops")) == 110
    # After `zcta recover` the killed process's rows are readable too.
    zcta = pathlib.Path(os.environ.get("ZCTA_BIN", ROOT / "target" / "debug" / "zcta"))
    if not zcta.exists():
        pytest.fail(f"{zcta} missing: build it with `cargo build`")
    subprocess.run([zcta, "recover", run], check=True, capture_output=True)
    n = con.execute(f"select count(*) from read_parquet('{run}/ops/**/*.parquet')").fetchone()[0]
    assert n > 110
    assert not list((run / "ops").glob("_*"))


@pytest.mark.parametrize("codec", ["snappy", "lz4", "gzip", "zstd"])
def test_zcta_reads_parquet_that_pyarrow_rewrote(host, tmp_path, codec):
    """A run whose files were rewritten by pyarrow (its default is Snappy) still reads
    whole in `zcta summary` and `zcta report`: no file skipped as corrupt."""
    import pyarrow.parquet as pq

    run = run_job(host, tmp_path, f"rw-{codec}")
    for f in sorted((run / "ops").glob("*.parquet")):
        t = pq.read_table(f)
        assert b"zcta.schema_version" in t.schema.metadata
        f.unlink()
        pq.write_table(t, f, compression=codec)
        assert pq.ParquetFile(f).metadata.row_group(0).column(0).compression.lower().startswith(codec[:3])
    zcta = pathlib.Path(os.environ.get("ZCTA_BIN", ROOT / "target" / "debug" / "zcta"))
    s = subprocess.run([zcta, "summary", run], capture_output=True, text=True)
    assert s.returncode == 0, s.stderr
    assert "skipped" not in s.stderr, s.stderr
    assert "110 rows in 2 files" in s.stdout, s.stdout
    r = subprocess.run([zcta, "report", run, "--format", "json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "AllReduce" in r.stdout
