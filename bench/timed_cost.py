"""What a timed op costs the program's thread, from a run's own rows: for the
outermost groups of one process (e.g. bench/always_on.py's send/recv loop), the host
time of groups zcta timed against those it did not, and of the group right after
each, whose launch may pay for the timed one. Compares with what the budget charges
(docs/PERFORMANCE.md, "What one timed op costs").

    python3 bench/timed_cost.py RUN_DIR
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from zcta_analysis import read_table  # noqa: E402


def table(run, name, cols):
    """The rows of one table, as dicts with None for NULL."""
    df = read_table(run, name)[cols]
    return df.astype(object).where(df.notna(), None).to_dict("records")


def main(run):
    calls = table(run, "calls", ["call", "group_id", "api_start_ns", "api_end_ns", "pid"])
    ops = table(run, "ops", ["group_id", "timing", "pid"])
    timing = {}
    for o in ops:
        if o["group_id"] is not None:
            timing[(o["pid"], o["group_id"])] = o["timing"]
    starts, ends = {}, {}
    for c in calls:
        key = (c["pid"], c["group_id"])
        if c["group_id"] is None:
            continue
        if c["call"] == "GroupStart":
            starts.setdefault(key, c["api_start_ns"])
        elif c["call"] == "GroupEnd":
            ends[key] = (c["api_start_ns"], c["api_end_ns"])
    groups = sorted(
        (starts[k], ends[k][0], ends[k][1], timing.get(k)) for k in ends if k in starts and timing.get(k)
    )
    rows = {}
    for i, (s, e0, e1, t) in enumerate(groups):
        rows.setdefault(("span", t), []).append(e1 - s)
        rows.setdefault(("group_end", t), []).append(e1 - e0)
        if i + 1 < len(groups):
            nxt = groups[i + 1]
            rows.setdefault(("next_span", t), []).append(nxt[2] - nxt[0])
            rows.setdefault(("gap_to_next", t), []).append(nxt[0] - e1)
    print(f"{len(groups)} groups; timing: " + ", ".join(
        f"{t} {sum(1 for g in groups if g[3] == t)}" for t in sorted({g[3] for g in groups})))
    print("| measure (ns, median) | " + " | ".join(sorted({t for _, t in rows})) + " |")
    ts = sorted({t for _, t in rows})
    print("|---" * (len(ts) + 1) + "|")
    for m in ["span", "group_end", "next_span", "gap_to_next"]:
        cells = []
        for t in ts:
            v = rows.get((m, t))
            cells.append(f"{statistics.median(v):.0f} (n={len(v)})" if v else "-")
        print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
