"""analysis/zcta_analysis on a run recorded with the shim, the stand-in NCCL and the
stand-in CUPTI (so GPU columns and phases exist)."""

import importlib.util
import os
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
    from test_analysis_sql_rules import _text

    con = duckdb.connect()
    con.execute(f"set variable run = '{run}'")
    for f in sorted((ROOT / "analysis" / "sql").glob("*.sql")):
        rows = con.execute(_text(f.name)).fetchall()
        assert rows, f.name


def test_sql_files_give_a_run_zcta_wrote_the_figures_they_gave_before_their_rules(run):
    """The recipes' file and row rules (test_analysis_sql_rules) leave nothing out of a
    sound run that zcta wrote: each gives what its text before the rules gave."""
    from test_analysis_sql_rules import _before, _run, _text

    for f in sorted((ROOT / "analysis" / "sql").glob("*.sql")):
        assert _run(_text(f.name), run) == _run(_before(f.name), run), f.name


PLOTS = pathlib.Path(os.environ.get("ZCTA_PLOT_DIR", "")) if os.environ.get("ZCTA_PLOT_DIR") else None


@pytest.fixture(scope="module")
def run_b(host, tmp_path_factory):  # noqa: F811
    """A second run (more iterations) to plot against the first."""
    out = tmp_path_factory.mktemp("runs_b")
    r = run_job(host, out, "anb", ranks=2, iters=6, cupti=True)
    subprocess.run([ZCTA, "phases", r], check=True, capture_output=True)
    return r


@pytest.mark.parametrize("two", [False, True], ids=["one-run", "two-runs"])
def test_plot_cli_writes_a_png(run, run_b, tmp_path, two):
    """The PNGs as a person sees them (ZCTA_PLOT_DIR keeps them): one run, and a run
    against itself as A and B; every series distinct, the axes and panels labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zcta_analysis import plot as zp

    out = (PLOTS or tmp_path) / f"plot-{'ab' if two else 'a'}.png"
    runs = [str(run), str(run_b)] if two else [str(run)]
    figs = []
    orig = plt.Figure.savefig
    plt.Figure.savefig = lambda self, *a, **k: (figs.append(self), orig(self, *a, **k))[1]
    try:
        assert cli(["plot", *runs, "-o", str(out)]) == 0
    finally:
        plt.Figure.savefig = orig
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    (fig,) = figs
    bars, bw, *heat = fig.axes[: 2 + len(runs)]
    assert bw.get_yscale() == "log" and bw.get_xscale() == "log"
    assert any("link peak 450 GB/s" in t.get_text() for t in bw.texts)
    lines = [ln for ln in bw.get_lines() if not ln.get_label().startswith("_")]
    n_ops = len(zp.busbw_points(za.load(run).ops).op.unique())
    assert n_ops >= 5 and len(lines) == n_ops * len(runs)
    # Series are told apart by colour and marker (run B by line style and fill).
    looks = {(ln.get_color(), ln.get_marker(), ln.get_linestyle(), ln.get_markerfacecolor() == "none") for ln in lines}
    assert len(looks) == len(lines)
    assert len({(ln.get_color(), ln.get_marker()) for ln in lines}) == n_ops
    if two:
        assert "run A (ana)" in bars.get_title() and "run B (anb)" in bars.get_title()
        assert "run A" in bw.get_title() and "run B" in bw.get_title()
        assert {ln.get_label()[:2] for ln in lines} == {"A:", "B:"}
        assert heat[0].get_title().startswith("run A (ana): arrival skew")
        assert heat[1].get_title().startswith("run B (anb): arrival skew")
    else:
        assert heat[0].get_title().startswith("run ana: arrival skew")


def test_plot_without_phases_names_the_command(run, tmp_path, capsys):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("phases"))
    assert cli(["plot", str(bare), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert f"run `zcta phases {bare}` first" in err, err
    assert not (tmp_path / "x.png").exists()


def test_phase_breakdown_sql_without_phases_names_the_command(run, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("phases"))
    from test_analysis_sql_rules import _text

    con = duckdb.connect()
    con.execute(f"set variable run = '{bare}'")
    with pytest.raises(duckdb.Error, match=f"run `zcta phases {bare}` first"):
        con.execute(_text("phase_breakdown.sql"))


def _cli_line(f: pathlib.Path) -> str:
    """The DuckDB CLI line a file's header gives."""
    (line,) = [ln[3:] for ln in f.read_text().splitlines() if ln.startswith("-- duckdb ")]
    return line


def test_sql_headers_and_readme_give_one_working_cli_form():
    lines = {f.name: _cli_line(f) for f in (ROOT / "analysis" / "sql").glob("*.sql")}
    assert len(lines) == 3
    for name, line in lines.items():
        # A dot-command cannot be inside -c's SQL: it gets its own -c.
        assert line == f"""duckdb -c "SET VARIABLE run = 'zcta-runs/<run id>'" -c ".read analysis/sql/{name}\"""", line
    readme = (ROOT / "README.md").read_text()
    assert """duckdb -c "SET VARIABLE run = 'zcta-runs/<run id>'" -c ".read analysis/sql/path_mix.sql\"""" in readme
    assert "; .read" not in readme


@pytest.mark.skipif(shutil.which("duckdb") is None, reason="no duckdb CLI (pip install duckdb-cli)")
def test_sql_headers_run_in_the_duckdb_cli(run, tmp_path):
    """Each file's header line, as written, in the DuckDB CLI (from the repository root)."""
    for f in sorted((ROOT / "analysis" / "sql").glob("*.sql")):
        line = _cli_line(f).replace("zcta-runs/<run id>", str(run))
        r = subprocess.run(line, shell=True, cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0 and not r.stderr, (f.name, r.stderr)
        assert "│" in r.stdout and "Error" not in r.stdout, (f.name, r.stdout)
    bare = tmp_path / "bare"
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("phases"))
    line = _cli_line(ROOT / "analysis" / "sql" / "phase_breakdown.sql").replace("zcta-runs/<run id>", str(bare))
    r = subprocess.run(line, shell=True, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and f"run `zcta phases {bare}` first" in r.stdout + r.stderr, r


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


@pytest.mark.parametrize("source", ["stamps", "events"])
def test_breakdown_weights_the_ops_the_budget_timed(source):
    # Two AllReduces of one bucket: one timed with GPU stamps at level 3, of the 8 ops
    # the hash chose it among (it stands for 8 ops), one with CUPTI's times (deep mode:
    # itself only). Files written before stamps replaced CUDA events say "events".
    import pandas as pd

    key = {"host": ["h", "h"], "pid": [1, 1], "op_id": [1, 2]}
    skipped = 7
    ops = pd.DataFrame({"host": ["h"] * (2 + skipped), "pid": [1] * (2 + skipped), "op_id": range(1, 3 + skipped),
                        "op": ["AllReduce"] * (2 + skipped), "bytes": [1024] * (2 + skipped),
                        "timing": ["timed", "timed"] + ["budget"] * skipped,
                        "timing_level": [3, 0] + [3] * skipped,
                        "gpu_source": [source, "cupti"] + [None] * skipped})
    ph = pd.DataFrame({**key, "op": ["AllReduce"] * 2, "bytes": [1024, 1024], "engine": ["sm_kernel"] * 2,
                       "window_ns": [100, 1000], "init_ns": [50, 0], "transfer_ns": [50, 1000]})
    for p in za.PHASES:
        if f"{p}_ns" not in ph:
            ph[f"{p}_ns"] = 0
    b = za.breakdown(za.Run(pathlib.Path("."), ops=ops, phases=ph)).iloc[0]
    assert (b["count"], b["rows"]) == (9, 2)
    assert b["p50_us"] == 0.1
    assert abs(b["init"] - 8 * 50 / (8 * 100 + 1000)) < 1e-12
    assert abs(b["init"] + b["transfer"] - 1) < 1e-12


def test_weights_count_the_ops_the_rate_limiter_skipped():
    # One process at level 0: 2 ops timed of 8 drawn (the rate limiter skipped 6 the
    # hash selected) stand for 4 each; at level 2, 1 of 4: 4 too (not 2^level's 1 and
    # 4); an op of another process or size is a stratum of its own; a row not timed
    # counts for itself.
    import pandas as pd

    rows = ([("h", 1, 0, 1024, "timed")] * 2 + [("h", 1, 0, 1024, "budget")] * 6
            + [("h", 1, 2, 1024, "timed")] + [("h", 1, 2, 1024, "budget")] * 3
            + [("h", 2, 0, 1024, "timed")] + [("h", 1, 0, 1 << 20, "timed")] + [("h", 1, 0, 1 << 20, "budget")] * 2)
    ops = pd.DataFrame(rows, columns=["host", "pid", "timing_level", "bytes", "timing"])
    ops["op_id"] = range(len(ops))
    ops["op"] = "AllReduce"
    ops["gpu_source"] = ops.timing.map({"timed": "stamps"})
    ops["timing_level"] = ops.timing_level.astype("Int64")
    ph = ops[["host", "pid", "op_id"]].copy()
    w = list(za.weights(za.Run(pathlib.Path("."), ops=ops, phases=ph), ph))
    assert w == [4.0, 4.0] + [1.0] * 6 + [4.0] + [1.0] * 3 + [1.0, 3.0, 1.0, 1.0], w


def test_compare_weights_and_groups_as_breakdown_and_the_report_do():
    # Bcast and Broadcast are one group; a timed op counts for its stratum (here 1 of
    # 4 drawn at level 2 stands for 4); the median is the upper middle of an even count,
    # as `zcta report`'s p50: compare's medians are breakdown's.
    import pandas as pd

    rows = [(1, "Bcast", "timed", 0, 100), (2, "Broadcast", "timed", 0, 200), (3, "Broadcast", "timed", 2, 900)]
    rows += [(4 + k, "Broadcast", "budget", 2, None) for k in range(3)]
    ops = pd.DataFrame(rows, columns=["op_id", "op", "timing", "timing_level", "window_ns"])
    ops["host"], ops["pid"], ops["bytes"] = "h", 1, 4096
    ops["gpu_source"] = ops.timing.map({"timed": "stamps"})
    ops["timing_level"] = ops.timing_level.astype("Int64")
    ph = ops[ops.timing == "timed"][["host", "pid", "op_id", "op", "bytes", "window_ns"]].copy()
    ph["engine"] = "sm_kernel"
    ph["window_ns"] = ph.window_ns.astype("Int64")
    ph["transfer_ns"] = ph.window_ns
    ph = za._all_phases(ph)
    run = za.Run(pathlib.Path("."), ops=ops, phases=ph)
    b = za.breakdown(run)
    assert list(b.op) == ["Broadcast"] and b["count"].iloc[0] == 6, b
    assert b.p50_us.iloc[0] == 0.9
    c = za.compare(run, run)
    assert list(c.op) == ["Broadcast"] and c.window_a_us.iloc[0] == 0.9 and c.window_change_us.iloc[0] == 0, c
    # Two ops of equal weight: the upper one.
    assert za._weighted_median(pd.Series([1.0, 2.0]), pd.Series([1.0, 1.0])) == 2.0
