"""`python -m zcta_analysis plot` on bad arguments and hostile runs: exit 2 and one line
saying what is wrong (1 and one line for a bug), never a traceback; a file it skips is
named in one line and the plot still drawn."""

import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from test_analysis_bad_input import good, ops_files, rewrite, run  # noqa: F401 (fixtures)
from test_readers import ROOT, host  # noqa: F401 (fixture)

sys.path.insert(0, str(ROOT / "analysis"))
import zcta_analysis as za  # noqa: E402
from zcta_analysis.__main__ import main as cli  # noqa: E402


def test_breakdown_and_plot_of_a_run_without_measured_windows(run, tmp_path):
    """A run whose GPU side was not measured (schema 1, or GPU capture off): its phases
    have no window. Before: breakdown gave a frame without columns and plot a
    traceback (AttributeError)."""
    f = sorted((run / "phases").glob("*.parquet"))[0]
    t = pq.read_table(f)
    i = t.column_names.index("window_ns")
    rewrite(f, t.set_column(i, "window_ns", pa.nulls(t.num_rows, pa.int64())))
    b = za.breakdown(run)
    assert b.empty and {"op", "size", "engine", "count", *za.PHASES} <= set(b.columns)
    p = plot_cli(run, "-o", tmp_path / "x.png")
    assert p.returncode == 0 and (tmp_path / "x.png").exists(), p.stderr
    assert "no op with a measured end-to-end time" in p.stderr


def plot_cli(*args):
    return subprocess.run([sys.executable, "-m", "zcta_analysis", "plot", *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "analysis")}, cwd=ROOT)


def one_line_error(p, rc):
    """The command failed with `rc` and said why in its last line, without a traceback."""
    assert p.returncode == rc, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(("zcta_analysis: ", "python -m zcta_analysis plot: error: ")), p.stderr
    return last


@pytest.mark.parametrize(
    "args, says",
    [
        (["RUN"], "-o/--output"),
        (["", "-o", "OUT/x.png"], "an empty path"),
        (["RUN", "-o", ""], "an empty path"),
        (["RUN", "-o", "OUT/x.png", "--link-peak-gbps", "0"], "positive"),
        (["RUN", "-o", "OUT/x.png", "--link-peak-gbps", "-3"], "positive"),
        (["RUN", "-o", "OUT/x.png", "--link-peak-gbps", "nan"], "positive"),
        (["RUN", "-o", "OUT/x.png", "--link-peak-gbps", "inf"], "positive"),
        (["RUN", "-o", "OUT/x.png", "--link-peak-gbps", "fast"], "not a number"),
        (["RUN", "RUN", "RUN", "-o", "OUT/x.png"], "at most two runs"),
        (["OUT/missing", "-o", "OUT/x.png"], "no such run directory"),
        (["OUT/afile", "-o", "OUT/x.png"], "not a directory"),
        (["RUN", "-o", "OUT"], "is a directory"),
        (["RUN", "-o", "OUT/x.xyz"], "cannot write .xyz"),
        (["RUN", "-o", "OUT/no/such/x.png"], "no such directory"),
    ],
    ids=["no-output", "empty-run", "empty-output", "peak-0", "peak-negative", "peak-nan", "peak-inf",
         "peak-word", "three-runs", "missing-run", "run-is-a-file", "output-is-a-dir", "bad-format",
         "no-such-folder"],
)
def test_plot_cli_bad_arguments_end_in_one_line(run, tmp_path, args, says):
    """Exit 2 and one line saying what is wrong (argparse's usage first for argument
    errors); before, some were tracebacks (-o a directory) or a silent bad plot (peak 0)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "afile").write_text("x")
    args = [a.replace("RUN", str(run)).replace("OUT", str(out)) for a in args]
    p = plot_cli(*args)
    last = one_line_error(p, 2)
    assert says in last, p.stderr
    assert sorted(x.name for x in out.iterdir()) == ["afile"]  # nothing written


def test_plot_cli_on_a_run_with_a_bad_file_names_it_and_plots(run, tmp_path):
    """Before: pyarrow's ArrowTypeError traceback (exit 1)."""
    f = ops_files(run)[0]
    t = pq.read_table(f)
    rewrite(f, t.set_column(0, "op_id", t.column(0).cast(pa.string())))
    p = plot_cli(run, "-o", tmp_path / "x.png")
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert f"zcta_analysis: skipped {f}: schema version 2: column op_id has type string, expected uint64\n" in p.stderr
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_cli_output_without_a_suffix_says_the_file_it_wrote(run, tmp_path):
    """matplotlib adds `.png`: before, the command printed the name without it."""
    p = plot_cli(run, "-o", tmp_path / "plot")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(tmp_path / "plot.png") and (tmp_path / "plot.png").exists()


def test_plot_cli_on_a_run_with_its_ops_dir_looping(run, tmp_path):
    shutil.rmtree(run / "ops")
    (run / "ops").symlink_to("ops")
    shutil.rmtree(run / "phases")
    p = plot_cli(run, "-o", tmp_path / "x.png")
    last = one_line_error(p, 2)
    assert f"run `zcta phases {run}` first" in last
    assert f"zcta_analysis: skipped {run / 'ops'}: cannot be listed: Too many levels of symbolic links" in p.stderr


def test_plot_cli_unexpected_errors_are_one_line(run, tmp_path, monkeypatch, capsys):
    """A bug in the package still ends in one line (exit 1), not a traceback."""
    import zcta_analysis.__main__ as m

    def boom(*a, **k):
        raise KeyError("x")

    monkeypatch.setattr(m, "plot", boom)
    assert cli(["plot", str(run), "-o", str(tmp_path / "x.png")]) == 1
    assert capsys.readouterr().err == "zcta_analysis: internal error: KeyError: 'x'\n"
