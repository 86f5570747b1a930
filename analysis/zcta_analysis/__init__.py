"""zcta-prof run directories in pandas and DuckDB.

    import zcta_analysis as za
    run = za.load("zcta-runs/<run id>")      # .ops .gpu .proxy .comms .process .phases
    con = za.connect("zcta-runs/<run id>")   # DuckDB views of the same tables
    za.breakdown(run)                        # phase shares per (op, size, engine)
    za.compare("runs/a", "runs/b")           # medians side by side

The per-op phases come from `zcta phases RUN` (the phase model lives in one place,
the zcta CLI; docs/phases.md). Files of older schema versions read with the missing
columns as NULL; leftovers of killed processes (`_*.wal`, `_*.tmp`) are skipped.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

TABLES = ("ops", "gpu", "calls", "comms", "nccl_ops", "proxy", "nccl_comms", "process", "phases")
PHASES = ("init", "queue", "sync", "barrier", "transfer", "memcpy", "proxy", "unresolved")


def _files(run: pathlib.Path, table: str) -> list[pathlib.Path]:
    d = run / table
    if not d.is_dir():
        return []
    return sorted(p for p in d.glob("*.parquet") if not p.name.startswith(("_", ".")))


def read_table(run_dir, table: str) -> pd.DataFrame:
    """One table of a run as a DataFrame (empty when the run has none). Files written
    with different schema versions are unified by column name."""
    run = pathlib.Path(run_dir)
    parts = []
    for f in _files(run, table):
        try:
            parts.append(pq.read_table(f))
        except Exception as e:  # a corrupt or truncated file: say which, keep the rest
            import warnings

            warnings.warn(f"zcta_analysis: skipped {f}: {e}")
    if not parts:
        return pd.DataFrame()
    t = pa.concat_tables(parts, promote_options="default")
    return t.to_pandas()


@dataclass
class Run:
    """The tables of one run directory."""

    path: pathlib.Path
    ops: pd.DataFrame = field(default_factory=pd.DataFrame)
    gpu: pd.DataFrame = field(default_factory=pd.DataFrame)
    proxy: pd.DataFrame = field(default_factory=pd.DataFrame)
    comms: pd.DataFrame = field(default_factory=pd.DataFrame)
    process: pd.DataFrame = field(default_factory=pd.DataFrame)
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)


def load(run_dir) -> Run:
    """Reads a run directory (see `Run`)."""
    run = pathlib.Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run directory")
    return Run(run, *(read_table(run, t) for t in ("ops", "gpu", "proxy", "comms", "process", "phases")))


def connect(run_dir):
    """An in-process DuckDB connection with one view per table the run has."""
    import duckdb

    run = pathlib.Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run directory")
    con = duckdb.connect()
    for t in TABLES:
        if _files(run, t):
            glob = str(run / t / "*.parquet").replace("'", "''")
            con.execute(f"create view {t} as select * from read_parquet('{glob}', union_by_name = true)")
    return con


def size_bucket(b: pd.Series) -> pd.Series:
    """Largest power of two ≤ bytes (the report's buckets)."""
    import numpy as np

    v = b.fillna(0).astype("float64").clip(lower=1)
    return (2 ** np.floor(np.log2(v))).astype("int64")


def stream_time_ns(ops: pd.DataFrame) -> pd.Series:
    """Each op's time on its stream (docs/phases.md), ns: from when the stream was free
    for it, or NCCL's launch if later (when known), to its GPU end — for an op timed
    with CUDA events, their elapsed time. NaN where `gpu_ready_ns` is unknown (not
    timed, or files from before it existed)."""
    if "gpu_ready_ns" not in ops:
        return pd.Series(float("nan"), index=ops.index)
    known = ops.gpu_ready_ns.notna() & ops.gpu_end_ns.notna()
    start = ops[["gpu_ready_ns", "launch_ns"]].max(axis=1, skipna=True)
    return (ops.gpu_end_ns - start).where(known)


def _all_phases(ph: pd.DataFrame) -> pd.DataFrame:
    """A copy with every phase column; a `phases` table written by an older zcta lacks
    the newer ones (`sync_ns`): not measured there."""
    ph = ph.copy()
    for p in PHASES:
        if f"{p}_ns" not in ph:
            ph[f"{p}_ns"] = pd.Series(pd.NA, index=ph.index, dtype="Int64")
    return ph


def weights(run: Run, ph: pd.DataFrame) -> pd.Series:
    """How many ops each `phases` row stands for, as in `zcta report`: 2^timing_level
    for an op the budget timed with GPU stamps (a rank times 1 op in 2^level), 1
    otherwise (deep mode's ops, and files from before the budget)."""
    ops = run.ops
    one = pd.Series(1, index=ph.index, dtype="int64")
    if ops.empty or not {"timing", "timing_level", "gpu_source"} <= set(ops.columns):
        return one
    key = ["host", "pid", "op_id"]
    o = ops[key + ["timing", "timing_level", "gpu_source"]].drop_duplicates(key)
    m = ph[key].merge(o, on=key, how="left")
    # "events": files written before GPU stamps replaced CUDA events.
    timed = (m.timing == "timed") & m.gpu_source.isin(["stamps", "events"]) & m.timing_level.notna()
    level = m.timing_level.where(timed, 0).fillna(0).astype("int64").clip(upper=32)
    return pd.Series((2**level).to_numpy(), index=ph.index, dtype="int64")


def _weighted_median(v: pd.Series, w: pd.Series) -> float:
    """The smallest value whose weight, with the smaller ones', reaches half the total."""
    order = v.to_numpy().argsort(kind="stable")
    vs, ws = v.to_numpy()[order], w.to_numpy()[order]
    cum = ws.cumsum()
    return float(vs[(cum >= cum[-1] / 2).argmax()]) if len(vs) else float("nan")


def breakdown(run: Run | str) -> pd.DataFrame:
    """Per (op, size bucket, engine): the ops they stand for (`count`: an op the budget
    timed at level k counts 2^k, as in `zcta report`; `rows`: the rows), the weighted
    median end-to-end time (µs) and each phase's weighted share of the summed window
    (NaN: not measured), from the `phases` table joined to `ops`."""
    if not isinstance(run, Run):
        run = load(run)
    ph = run.phases
    if ph.empty:
        raise ValueError(f"{run.path}: no phases table (RUN/phases/): run `zcta phases {run.path}` first")
    ph = _all_phases(ph[ph.window_ns.notna()])
    ph["w"] = weights(run, ph)
    ph["size"] = size_bucket(ph["bytes"])
    ph["engine"] = ph["engine"].fillna("not measured")
    rows = []
    for (op, size, engine), g in ph.groupby(["op", "size", "engine"]):
        total = (g.window_ns * g.w).sum()
        row = {
            "op": op,
            "size": size,
            "engine": engine,
            "count": int(g.w.sum()),
            "rows": len(g),
            "p50_us": _weighted_median(g.window_ns.astype("float64"), g.w) / 1e3,
        }
        for p in PHASES:
            col = g[f"{p}_ns"]
            row[p] = (col.astype("float64") * g.w).sum() / total if col.notna().any() and total > 0 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def compare(run_a, run_b) -> pd.DataFrame:
    """Per (op, size): median window and phases in A and B and the change (µs)."""
    a, b = (r if isinstance(r, Run) else load(r) for r in (run_a, run_b))
    out = []
    for name, r in (("a", a), ("b", b)):
        if r.phases.empty:
            raise ValueError(f"{r.path}: no phases table (RUN/phases/): run `zcta phases {r.path}` first")
        ph = _all_phases(r.phases[r.phases.window_ns.notna()])
        ph["size"] = size_bucket(ph["bytes"])
        cols = ["window_ns"] + [f"{p}_ns" for p in PHASES]
        m = ph.groupby(["op", "size"])[cols].median() / 1e3
        m.columns = [f"{c[:-3]}_{name}_us" for c in cols]
        out.append(m)
    j = out[0].join(out[1], how="inner")
    for c in ["window"] + list(PHASES):
        j[f"{c}_change_us"] = j[f"{c}_b_us"] - j[f"{c}_a_us"]
    return j.reset_index().sort_values("window_change_us", key=abs, ascending=False)
