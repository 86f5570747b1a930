"""The README's commands work as written: every shell, SQL and Python snippet of
README.md and examples/README.md that makes sense without a GPU runs here against
stand-in runs (tests/fixtures: the stand-in NCCL and CUDA driver under the shim).

How a snippet is read:
- fenced blocks tagged `sh`, `bash`, `sql` or `python`; other blocks are text;
- a block whose first line says `needs a GPU` (`# needs a GPU …`, `-- needs a GPU …`)
  is not run, and a shell line ending in `# needs a GPU …` neither: the README shows
  the reader the same words; a block whose first line says `checked by
  tests/wheel.sh` is run by that script (it builds and installs the wheel);
- `<run id>`, `<run A>`, `<run B>` and `RUN` name stand-in runs in `zcta-runs/` of a
  scratch directory the snippets run in, which also holds the repository's
  `analysis/` and `examples/`; `target/release/` is the build the tests
  use (ZCTA_BIN_DIR, default target/debug); `zcta` is on PATH;
- `cargo build` lines are what the test run itself built, and are not repeated;
- `./demo.sh` and `./tests/run_all.sh` are the README's two commands: CI runs them
  itself (run_all.sh is what runs this file).
Each runnable shell line must exit 0.
"""

import os
import pathlib
import re
import shutil
import subprocess

import duckdb
import pandas as pd
import pytest

from test_readers import ROOT, host, run_job, shim  # noqa: F401 (fixture)

DOCS = [ROOT / "README.md", ROOT / "examples" / "README.md"]
BIN = pathlib.Path(os.environ.get("ZCTA_BIN_DIR", ROOT / "target" / "debug"))
GPU = "needs a GPU"
WHEEL = "checked by tests/wheel.sh"
SKIP_LINES = ("cargo build", "./demo.sh", "./tests/run_all.sh")


def blocks(path):
    """(language, first line number, text) of each fenced block of `path`."""
    out, lang, start, buf = [], None, 0, []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"^```(\w*)\s*$", line)
        if m and lang is None:
            lang, start, buf = m.group(1) or "text", i + 1, []
        elif line.startswith("```") and lang is not None:
            out.append((lang, start, "\n".join(buf)))
            lang = None
        elif lang is not None:
            buf.append(line)
    return out


def runnable():
    for doc in DOCS:
        for lang, line, text in blocks(doc):
            if lang not in ("sh", "bash", "sql", "python"):
                continue
            first = text.strip().splitlines()[0] if text.strip() else ""
            skip = []
            if GPU in first:
                skip = [pytest.mark.skip(reason=f"marked '{GPU}'")]
            elif WHEEL in first:
                skip = [pytest.mark.skip(reason="tests/wheel.sh runs it (CI runs that)")]
            yield pytest.param(doc, lang, line, text, id=f"{doc.relative_to(ROOT)}:{line}", marks=skip)


@pytest.fixture(scope="module")
def work(host, tmp_path_factory):  # noqa: F811
    """A scratch directory with zcta-runs/{A,B}: two stand-in runs of two ranks, with
    the stand-in CUDA driver (GPU columns from CUDA events) and their phases tables."""
    d = tmp_path_factory.mktemp("readme")
    runs = d / "zcta-runs"
    runs.mkdir()
    cuda = str(host.parent / "cuda" / "libcuda.so.1")
    for rid in ("A", "B"):
        r = run_job(host, runs, rid, ranks=2, iters=5, extra_env={"HOST_CUDA": cuda, "ZCTA_BUDGET": "all"})
        subprocess.run([BIN / "zcta", "phases", r], check=True, capture_output=True)
    (runs / "id").unlink(missing_ok=True)
    # The README's paths are relative to the repository's root.
    for name in ("analysis", "examples"):
        (d / name).symlink_to(ROOT / name)
    return d


def substitute(text, work):
    text = text.replace("<run id>", "A").replace("<run A>", "A").replace("<run B>", "B")
    text = re.sub(r"\bRUN\b", "A", text)
    text = text.replace("$PWD/target/release/", f"{BIN}/").replace("target/release/", f"{BIN}/")
    return text


def shell_lines(text):
    """Logical lines (backslash continuations joined), comments and skipped ones out."""
    joined, cur = [], ""
    for raw in text.splitlines():
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        joined.append(cur + raw)
        cur = ""
    for line in joined:
        s = line.strip()
        if not s or s.startswith("#") or s.startswith(SKIP_LINES):
            continue
        if re.search(r"#\s*" + GPU, s):
            continue
        yield s


@pytest.mark.parametrize("doc,lang,line,text", list(runnable()))
def test_snippet(doc, lang, line, text, work):
    text = substitute(text, work)
    where = f"{doc.relative_to(ROOT)}:{line}"
    if lang == "sql":
        con = duckdb.connect()
        cwd = os.getcwd()
        os.chdir(work)
        try:
            for stmt in text.split(";"):
                code = "\n".join(ln for ln in stmt.splitlines() if not ln.strip().startswith("--"))
                if code.strip():
                    assert con.execute(stmt).fetchall() is not None, where
        finally:
            os.chdir(cwd)
        return
    if lang == "python":
        cwd = os.getcwd()
        os.chdir(work)
        try:
            exec(compile(text, where, "exec"), {"pd": pd, "__name__": "__readme__"})
        finally:
            os.chdir(cwd)
        return
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("LD_PRELOAD", None)
    ran = 0
    if all(ln.strip().startswith(SKIP_LINES) or not ln.strip() for ln in text.splitlines()):
        pytest.skip("the README's two commands: CI runs them itself")
    for cmd in shell_lines(text):
        if cmd.startswith("export LD_PRELOAD="):
            # The rest of a block that preloads the shim is the program to profile:
            # what follows is marked when it needs a GPU.
            env["LD_PRELOAD"] = str(shim())
            continue
        if cmd.split()[0] == "duckdb" and shutil.which("duckdb", path=env["PATH"]) is None:
            pytest.fail(f"{where}: `{cmd}` needs the DuckDB CLI, which is not installed here")
        r = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{where}: `{cmd}` exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        ran += 1
    assert ran > 0, f"{where}: nothing in the block ran (mark it '{GPU}' if it needs one)"


def test_every_doc_has_snippets_that_run():
    """The collection itself: a renamed fence or a doc that moved must not make the
    test pass by finding nothing."""
    ids = [p.id for p in runnable() if not p.marks]
    assert any(i.startswith("README.md") for i in ids), ids
    assert len(ids) >= 4, ids
