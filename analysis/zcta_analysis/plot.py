"""Plots of one or two runs (matplotlib): stacked phase shares per (op, size) side by
side per run, bus bandwidth against message size on log axes with the link peak
drawn, and per run the per-rank arrival skew of its busiest communicator."""

from __future__ import annotations

import pathlib

from . import PHASES, _ints, _ops_kept, _stream_start, _warn, breakdown, load, stream_time_ns

BUSBW = {"AllReduce": lambda n: 2 * (n - 1) / n}
for _op in ("AllGather", "ReduceScatter", "AlltoAll", "Gather", "Scatter"):
    BUSBW[_op] = lambda n: (n - 1) / n
COLORS = {
    "init": "#8dd3c7",
    "queue": "#d9d9d9",
    "sync": "#b3de69",
    "barrier": "#fb8072",
    "transfer": "#80b1d3",
    "memcpy": "#fdb462",
    "proxy": "#bebada",
    "unresolved": "#ffffb3",
}
# One colour and marker per op (20 colours, 10 markers: distinct for 20 ops and more);
# run B draws the same op with the same colour, a dashed line and hollow markers.
MARKERS = "osD^vP*Xh<"
RUN_NAMES = "AB"


def _label(b: int) -> str:
    """A size as the report writes it (src/analysis/report.rs `size_label`): "1 MiB",
    "512 KiB", "8 B"."""
    b, unit = int(b), "B"
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or b % 1024:
            break
        b, unit = b // 1024, u
    return f"{b} {unit}"


def _bucket(b: int) -> str:
    """A size bucket as the report writes it (src/analysis/report.rs `bucket_label`): from
    b up to 2b; "0 B" for the bucket of bytes 0 or NULL."""
    b = int(b)  # a numpy uint64 would wrap at 2 * 2^63
    if b == 0:
        return "0 B"
    lo, hi = _label(b), _label(min(2 * b, (1 << 64) - 1))
    if lo.split()[1] == hi.split()[1]:
        return f"{lo.split()[0]}–{hi}"
    return f"{lo}–{hi}"


def _run_tag(i: int, runs: list[str]) -> str:
    name = pathlib.Path(runs[i]).name
    return f"run {RUN_NAMES[i]} ({name})" if len(runs) > 1 else f"run {name}"


def _true(cond):
    """A condition as plain bools, NULL (pd.NA, from a nullable column) as False."""
    return cond.fillna(False).astype(bool)


def _local(ops):
    """Local ops: a Send/Recv of a rank to itself, or a one-rank communicator (copies
    within one GPU, not link traffic)."""
    self_p2p = ops.op.isin(["Send", "Recv"]) & ops.peer.notna() & _true(ops.peer == ops["rank"])
    return _true(self_p2p | _true(ops.nranks == 1))


def busbw_points(ops):
    """Per (op, bytes): median bus bandwidth (GB/s, nccl-tests' factors) over the ops'
    time on their stream; local ops and failed calls are left out, and rows with a
    time outside 1970..2116 or a successful call's bytes of 2^62 or more (as zcta
    does; `load` has left them out already). The frame should hold exact integers
    (read with this package, or `pd.read_parquet(..., dtype_backend="numpy_nullable")`
    or `"pyarrow"`): in float64, bytes of 2^62 - 1 round to 2^62 and the row is left
    out."""
    import pandas as pd

    if ops.empty or "gpu_end_ns" not in ops:
        return pd.DataFrame(columns=["op", "bytes", "busbw"])
    ok = _ops_kept(ops, "busbw_points")
    g = ops[ok & _true(ops.result == 0) & ops.bytes.notna() & ~_local(ops)].copy()
    dur = stream_time_ns(g)
    if "gpu_start_ns" in g:  # deep mode without gpu_ready_ns: the kernels' span
        # Subtracted on the exact integers, then float64 (NaN: not measured).
        dur = dur.fillna((_ints(g.gpu_end_ns) - _ints(g.gpu_start_ns)).astype("float64"))
    g["dur"] = dur
    g = g[g.dur > 0]
    rows = []
    for (op, b), d in g.groupby(["op", "bytes"]):
        n = d.nranks.max()
        f = BUSBW.get(op, lambda n: 1.0)(n if pd.notna(n) and n > 0 else 1)
        rows.append({"op": op, "bytes": int(b), "busbw": b / d.dur.median() * f})
    return pd.DataFrame(rows, columns=["op", "bytes", "busbw"])


def _output(out, fig_type) -> tuple[pathlib.Path, str]:
    """Where the figure goes and in what format, checked before any work: a name
    without a suffix gets `.png` (as matplotlib would add it: the path returned is the
    file written); a suffix matplotlib cannot write, a directory, or a folder that does
    not exist is a ValueError."""
    path = pathlib.Path(out)
    if path.is_dir():
        raise ValueError(f"{out}: is a directory (-o names the image file to write)")
    fmt = path.suffix[1:].lower()
    if not fmt:
        fmt, path = "png", path.with_name(path.name + ".png")
    supported = fig_type().canvas.get_supported_filetypes()
    if fmt not in supported:
        raise ValueError(f"{out}: cannot write .{fmt} images (formats: {', '.join(sorted(supported))})")
    parent = path.parent
    if not parent.is_dir():
        raise ValueError(f"{out}: no such directory {parent}")
    return path, fmt


def plot(runs: list[str], out: str, link_peak_gbps: float = 450.0) -> pathlib.Path:
    """Draws `runs` (one or two run directories) to `out`; returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.figure
    import matplotlib.pyplot as plt

    if not (link_peak_gbps > 0 and link_peak_gbps != float("inf")):
        raise ValueError(f"link peak {link_peak_gbps} GB/s: must be a positive number")
    path, fmt = _output(out, matplotlib.figure.Figure)
    loaded = [load(r) for r in runs]
    tables = [breakdown(r) for r in loaded]  # says which `zcta phases` is missing
    for r, t in zip(loaded, tables):
        if t.empty:
            _warn(f"{r.path}: no op with a measured end-to-end time (phases.window_ns is NULL in every row: "
                  "the GPU side was not measured): no phase bars for it")
    n = len(loaded)
    fig, axes = plt.subplots(2 + n, 1, figsize=(13, 6 + 4.5 * (1 + n)), gridspec_kw={"height_ratios": [1.2, 1.3] + [0.8] * n})
    ax1, ax2 = axes[0], axes[1]
    keys = sorted({(o, s) for t in tables for o, s in zip(t.op, t["size"])})
    width = 0.8 / n
    for i, t in enumerate(tables):
        agg = t.groupby(["op", "size"])[list(PHASES)].mean()
        bottom = [0.0] * len(keys)
        for p in PHASES:
            vals = [float(agg.loc[k, p]) if k in agg.index and agg.loc[k, p] == agg.loc[k, p] else 0.0 for k in keys]
            xs = [j + i * width for j in range(len(keys))]
            ax1.bar(xs, vals, width, bottom=bottom, color=COLORS[p], label=p if i == 0 else None,
                    edgecolor="black", linewidth=0.3, hatch="//" if i == 1 else None)
            bottom = [b + v for b, v in zip(bottom, vals)]
        if n > 1:
            for j, k in enumerate(keys):
                if k in agg.index:
                    ax1.text(j + i * width, 1.01, RUN_NAMES[i], ha="center", va="bottom", fontsize=6)
    ax1.set_xticks([j + width * (n - 1) / 2 for j in range(len(keys))])
    ax1.set_xticklabels([f"{o}\n{_bucket(s)}" for o, s in keys], fontsize=7, rotation=30, ha="right", rotation_mode="anchor")
    ax1.set_ylim(0, 1.08)
    ax1.set_ylabel("share of end-to-end time")
    title = "Where each op's end-to-end time (API call to GPU end) went, per op and size bucket"
    if n > 1:
        title += f"\nleft bar: {_run_tag(0, runs)}; right bar (hatched): {_run_tag(1, runs)}"
    else:
        title += f" — {_run_tag(0, runs)}"
    ax1.set_title(title, fontsize=9)
    ax1.legend(ncol=8, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), title="phase", title_fontsize=7)

    ops_all = sorted({op for r in loaded for op in busbw_points(r.ops).op})
    cmap = plt.get_cmap("tab20")
    style = {op: (cmap(k % 20), MARKERS[k % len(MARKERS)]) for k, op in enumerate(ops_all)}
    for ri, r in enumerate(loaded):
        pts = busbw_points(r.ops)
        for op, d in pts.groupby("op"):
            color, marker = style[op]
            d = d.sort_values("bytes")
            tag = f"{RUN_NAMES[ri]}: " if n > 1 else ""
            # B's hollow markers are larger: a ring around A's point where they agree.
            ax2.plot(d.bytes, d.busbw, "-" if ri == 0 else "--", marker=marker, color=color,
                     markerfacecolor=color if ri == 0 else "none", markersize=6 if ri == 0 else 11,
                     markeredgewidth=1.5, label=f"{tag}{op}")
    ax2.axhline(link_peak_gbps, color="black", linestyle=":", linewidth=1.5)
    ax2.text(0.005, link_peak_gbps, f" link peak {link_peak_gbps:.0f} GB/s (--link-peak-gbps)",
             transform=ax2.get_yaxis_transform(), va="bottom", fontsize=8)
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_ylim(top=link_peak_gbps * 2.5)
    ax2.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: _label(int(v)) if v >= 1 else ""))
    ax2.set_xlabel("message size (bytes, nccl-tests convention)")
    ax2.set_ylabel("bus bandwidth (GB/s, log scale)")
    bw_title = "Bus bandwidth per op against message size (median over ranks and calls; local copies left out)"
    if n > 1:
        bw_title += f"\nsolid, filled: {_run_tag(0, runs)}; dashed, hollow: {_run_tag(1, runs)}"
    ax2.set_title(bw_title, fontsize=9)
    if ops_all:
        ax2.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), title="op", title_fontsize=7)
    for ri, r in enumerate(loaded):
        skew_heatmap(r, axes[2 + ri], fig, _run_tag(ri, runs))
    fig.tight_layout()
    fig.savefig(path, dpi=110, format=fmt)
    plt.close(fig)
    return path


def skew_heatmap(r, ax, fig, run_tag: str = "") -> None:
    """Rank × collective: how late each rank's GPU started after the first rank (µs),
    for the communicator with the most collectives (one host's clock). Rows with a
    time outside 1970..2116, or a successful call's bytes of 2^62 or more, are left out
    (`load` has left them out already). A `Run` built by hand should hold exact integers
    in `ops` (read with this package, or `pd.read_parquet(...,
    dtype_backend="numpy_nullable")` or `"pyarrow"`): in float64, bytes of 2^62 - 1 round
    to 2^62 and the row is left out."""
    prefix = f"{run_tag}: " if run_tag else ""
    ops = r.ops
    ops = ops[_ops_kept(ops, "skew_heatmap")]
    begin = None
    if not ops.empty and "gpu_start_ns" in ops:
        begin = _ints(ops.gpu_start_ns)
        if "gpu_ready_ns" in ops:  # when the stream was free (CUDA events), else the kernel
            begin = begin.fillna(_stream_start(ops))
    if begin is None:
        c = ops.iloc[0:0]
    else:
        ops = ops.assign(begin=begin)
        c = ops[~ops.op.isin(["Send", "Recv"]) & ops.seq.notna() & ops.begin.notna() & ops.comm_id.notna() & _true(ops.nranks > 1)]
    if c.empty:
        ax.set_axis_off()
        ax.set_title(f"{prefix}no collective with GPU times on several ranks: no arrival skew to show", fontsize=9)
        return
    comm = c.comm_id.value_counts().idxmax()
    c = c[c.comm_id == comm]
    m = c.pivot_table(index="rank", columns="seq", values="begin", aggfunc="min")
    # Subtracted on the exact integer times, then µs as float64 (NaN: no begin).
    m = (m - m.min(axis=0)).astype("float64") / 1e3
    import numpy as np

    vmax = float(np.nanpercentile(m.values, 99)) or None  # one outlier must not hide the rest
    im = ax.imshow(m.values, aspect="auto", interpolation="nearest", cmap="magma", vmin=0, vmax=vmax)
    ax.set_yticks(range(len(m.index)))
    ax.set_yticklabels([str(int(x)) for x in m.index])
    ax.set_xlabel("collective (seq)")
    ax.set_ylabel("rank")
    ax.set_title(
        f"{prefix}arrival skew on communicator {int(comm):016x} (its {m.shape[1]} collectives)\n"
        "how long after the first rank each rank's GPU began, µs (colour scale to the 99th percentile)",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, label="µs after the first rank")
