"""Plots of one or two runs (matplotlib): stacked phase shares per (op, size) side by
side per run, bus bandwidth against message size with the link peak drawn, and the
per-rank arrival skew of the busiest communicator (first run)."""

from __future__ import annotations

import pathlib

from . import PHASES, breakdown, load

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


def _label(b: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return f"{b // f} {unit}"
    return f"{b} B"


def plot(runs: list[str], out: str, link_peak_gbps: float = 450.0) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = [load(r) for r in runs]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(12, 13))
    tables = [breakdown(r) for r in loaded]
    keys = sorted({(o, s) for t in tables for o, s in zip(t.op, t["size"])})
    width = 0.8 / len(tables)
    for i, (r, t) in enumerate(zip(loaded, tables)):
        agg = t.groupby(["op", "size"])[list(PHASES)].mean()
        bottom = [0.0] * len(keys)
        for p in PHASES:
            vals = [float(agg.loc[k, p]) if k in agg.index and agg.loc[k, p] == agg.loc[k, p] else 0.0 for k in keys]
            xs = [j + i * width for j in range(len(keys))]
            ax1.bar(xs, vals, width, bottom=bottom, color=COLORS[p], label=p if i == 0 else None, edgecolor="black", linewidth=0.3)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax1.set_xticks([j + width * (len(tables) - 1) / 2 for j in range(len(keys))])
    ax1.set_xticklabels([f"{o}\n{_label(s)}" for o, s in keys], fontsize=7)
    ax1.set_ylabel("share of end-to-end time")
    ax1.set_title(
        "where the time went"
        + ("" if len(runs) == 1 else f" (left bar A = {pathlib.Path(runs[0]).name}, right bar B = {pathlib.Path(runs[1]).name})"),
        fontsize=9,
    )
    ax1.legend(ncol=7, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    names = "AB"
    for ri, r in enumerate(loaded):
        ops = r.ops
        if ops.empty or "gpu_end_ns" not in ops:
            continue
        g = ops[ops.gpu_end_ns.notna() & ops.bytes.notna()].copy()
        if g.empty:
            continue
        g["dur"] = g.gpu_end_ns - g.gpu_start_ns
        for op, d in g.groupby("op"):
            f = BUSBW.get(op, lambda n: 1.0)
            m = d.groupby("bytes").agg(dur=("dur", "median"), n=("nranks", "max"))
            bw = [b / t * f(n) for b, t, n in zip(m.index, m.dur, m.n.fillna(1)) if t > 0]
            tag = f"{names[ri]}: " if len(loaded) > 1 else ""
            style = "-" if ri == 0 else "--"
            ax2.plot(list(m.index[: len(bw)]), bw, style, marker="o", label=f"{tag}{op}")
    ax2.axhline(link_peak_gbps, color="black", linestyle="--", linewidth=1, label=f"link peak {link_peak_gbps:.0f} GB/s")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("message size (bytes, nccl-tests convention)")
    ax2.set_ylabel("bus bandwidth (GB/s)")
    ax2.legend(fontsize=7, ncol=3)
    skew_heatmap(loaded[0], ax3, fig)
    fig.tight_layout()
    path = pathlib.Path(out)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def skew_heatmap(r, ax, fig) -> None:
    """Rank × collective: how late each rank's GPU started after the first rank (µs),
    for the communicator with the most collectives (one host's clock)."""
    ops = r.ops
    if ops.empty or "gpu_start_ns" not in ops:
        ax.set_axis_off()
        return
    c = ops[~ops.op.isin(["Send", "Recv"]) & ops.seq.notna() & ops.gpu_start_ns.notna() & ops.comm_id.notna()]
    if c.empty:
        ax.set_axis_off()
        return
    comm = c.comm_id.value_counts().idxmax()
    c = c[c.comm_id == comm]
    m = c.pivot_table(index="rank", columns="seq", values="gpu_start_ns", aggfunc="min")
    m = (m - m.min(axis=0)) / 1e3
    import numpy as np

    vmax = float(np.nanpercentile(m.values, 99)) or None  # one outlier must not hide the rest
    im = ax.imshow(m.values, aspect="auto", interpolation="nearest", cmap="magma", vmin=0, vmax=vmax)
    ax.set_yticks(range(len(m.index)))
    ax.set_yticklabels([str(int(x)) for x in m.index])
    ax.set_xlabel("collective (seq)")
    ax.set_ylabel("rank")
    ax.set_title(
        f"arrival skew on communicator {int(comm):016x}: GPU start after the first rank (us, colour scale to the 99th percentile)",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax)
