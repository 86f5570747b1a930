"""The tables of bench/always_on.sh: for zcta's runs how many ops were timed and at
which budget level; the in-process A/B (median ratio, and ratio of the fastest
blocks; and pooled over every block pair of every process, with a bootstrap
interval); the fine A/B (single items, recording switched at every item); per measure and configuration the median over rounds, and the ratio to
plain paired by round (median [min, max] over rounds), of the recording blocks and of
the off blocks.

    python3 bench/always_on_report.py JSON_DIR [RUNS_DIR]
"""

import json
import random
import statistics
import sys
from pathlib import Path


BASE = ["plain", "default", "deep", "all", "tiny", "half", "events0", "off", "nomask", "noplugin", "disabled", "profiler"]
# A configuration with a trailing digit N ran another build (always_on.sh's SHIMN).
CONFIGS = [c for b in BASE for c in [b] + [b + str(d) for d in range(2, 10)]]


def load(d, key="median"):
    runs = {}
    for f in sorted(Path(d).glob("*.json")):
        j = json.loads(f.read_text())
        if key in j:
            runs.setdefault(j["config"], {})[j["round"]] = j[key]
    return runs


def ab_table(d, key="ab", title="in-process A/B (recording / paused, same process)"):
    """In-process A/B: per measure and configuration, the median over rounds of each
    process's median ratio recording / paused (`key` ab: of the blocks' means;
    ab_pairs: the median over block pairs; ab_fastest: of its fastest blocks),
    [min, max] over rounds."""
    ab = load(d, key)
    if not ab:
        return ""
    per = {c: {} for c in ab}
    for c, rounds in ab.items():
        for r in rounds.values():
            for m, v in r.items():
                per[c].setdefault(m, []).append(v)

    def cell(v):
        return f"**{statistics.median(v):.3f}×** [{min(v):.3f}, {max(v):.3f}]"

    return config_table(title, per, cell)


def config_table(title, per, cell):
    """A table of measures (rows) by configuration (columns, in CONFIGS' order) under
    `title`: `per[config][measure]`, written by `cell`; "—" where a configuration has
    none of a measure."""
    configs = [c for c in CONFIGS if c in per]
    measures = sorted({m for c in per.values() for m in c})
    lines = [title, "| measure | " + " | ".join(configs) + " |", "|---" * (len(configs) + 1) + "|"]
    for m in measures:
        cells = [cell(per[c][m]) if per[c].get(m) else "—" for c in configs]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def block_pairs(blocks, col=1):
    """Recording / paused of each block pair in one process's block log (`ab_blocks`:
    [recording?, seconds per item, seconds issuing per item or null] in the order run,
    each pair's two blocks next to each other, either side first), of column `col`
    (1: the whole item, 2: its issuing); pairs of one side, or whose paused block has
    no positive time there, are passed over."""
    out = []
    for a, b in zip(blocks[0::2], blocks[1::2]):
        if a[0] == b[0]:
            continue
        on, off = (a, b) if a[0] else (b, a)
        if on[col] is not None and off[col] is not None and off[col] > 0:
            out.append(on[col] / off[col])
    return out


def median_interval(groups, resamples=2000, seed=0):
    """The median of every value of `groups` (one list per process) pooled, and a 95 %
    bootstrap interval of it that resamples the processes and then each one's values
    (pairs within a process are not independent of each other: a process's speed
    moves them together). Seeded: the same input gives the same interval."""
    rnd = random.Random(seed)
    groups = [g for g in groups if g]
    meds = []
    for _ in range(resamples):
        pool = []
        for g in rnd.choices(groups, k=len(groups)):
            pool += rnd.choices(g, k=len(g))
        meds.append(statistics.median(pool))
    meds.sort()
    return statistics.median([x for g in groups for x in g]), meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def fine_table(d):
    """The fine A/B (`ab_fine_items`: single items, recording switched at every item):
    per measure and configuration, the median over processes of each one's median pair
    ratio recording / paused [min, max], then every pair of every process pooled: its
    median with the 95 % bootstrap interval of `median_interval` (pairs / processes);
    then what an item costs in time: the pooled median of the pairs' differences,
    recording − the other side (paused, or libnccl's own functions), beside the other
    side's median item (ns, as `ab_fine_items` holds them); where the JSON says which side
    ran first, the pooled median of the pairs that ran recording first and of those that
    ran it second (their gap is what running first does to an item, which a random order
    spreads over both sides)."""
    got = {}
    order = {}
    # (config, measure) -> (the pairs' differences on − off, the off items), pooled.
    diffs = {}
    for f in sorted(Path(d).glob("*.json")):
        j = json.loads(f.read_text())
        for m, v in j.get("ab_fine_items", {}).items():
            pairs = [(a, b) for a, b in zip(v["on"], v["off"]) if b > 0]
            if pairs:
                got.setdefault(j["config"], {}).setdefault(m, []).append([a / b for a, b in pairs])
                dd = diffs.setdefault((j["config"], m), ([], []))
                dd[0].extend(a - b for a, b in pairs)
                dd[1].extend(b for _, b in pairs)
            first = v.get("on_first")
            if first and len(first) == len(v["on"]) == len(v["off"]):
                o = order.setdefault((j["config"], m), ([], []))
                for a, b, on_first in zip(v["on"], v["off"], first):
                    if b > 0:
                        o[0 if on_first else 1].append(a / b)
    if not got:
        return ""
    # config_table hands `cell` a configuration's list for a measure: which one it is.
    keys = {id(g): (c, m) for c, ms in got.items() for m, g in ms.items()}

    def cell(g):
        key = keys.get(id(g))
        per = [statistics.median(r) for r in g]
        med, lo, hi = median_interval(g, resamples=1000)
        text = (f"**{statistics.median(per):.3f}×** [{min(per):.3f}, {max(per):.3f}]; pooled {med:.3f}× "
                f"[{lo:.3f}, {hi:.3f}] ({sum(map(len, g))} / {len(g)})")
        dd = diffs.get(key)
        if dd and dd[0]:
            text += (f"; on − off {statistics.median(dd[0]):,.0f} ns a pair, off side "
                     f"{statistics.median(dd[1]):,.0f} ns")
        o = order.get(key)
        if o and o[0] and o[1]:
            text += f"; recording first {statistics.median(o[0]):.3f}×, second {statistics.median(o[1]):.3f}×"
        return text

    return config_table("fine A/B, single items with recording switched at every item: median over processes "
                        "of each one's median pair ratio [min, max]; pooled median [95 % bootstrap interval] "
                        "(pairs / processes); the pairs' median difference and the off side's median item",
                        got, cell)


def pooled_table(d):
    """Per measure and configuration, every block pair of every process pooled: the
    median ratio recording / paused with its 95 % bootstrap interval (processes, then
    pairs within each, resampled), and how many pairs and processes."""
    pairs = {}
    for f in sorted(Path(d).glob("*.json")):
        j = json.loads(f.read_text())
        for m, blocks in j.get("ab_blocks", {}).items():
            v = block_pairs(blocks)
            if v:
                pairs.setdefault(j["config"], {}).setdefault(m, []).append(v)
    if not pairs:
        return ""

    def cell(g):
        med, lo, hi = median_interval(g)
        return f"**{med:.3f}×** [{lo:.3f}, {hi:.3f}] ({sum(map(len, g))} / {len(g)})"

    return config_table("in-process A/B, every block pair of every process pooled: median [95 % bootstrap "
                        "interval, processes then pairs resampled] (pairs / processes)", pairs, cell)


def ab_off_note(d):
    """Which blocks each loop's recording blocks were compared against: `direct`
    (paused, and the calls made to libnccl's own functions: no shim work at all) or
    `paused` (through the shim's paused path). Runs before `ab_off` was written
    compared against `paused`."""
    off = {}
    for f in sorted(Path(d).glob("*.json")):
        for m, v in json.loads(f.read_text()).get("ab_off", {}).items():
            off.setdefault(m, set()).add(v)
    if not off:
        return ""
    return "off side of the A/B: " + ", ".join(f"{m} {'/'.join(sorted(v))}" for m, v in sorted(off.items()))


def issue_table(d):
    """Where a training step's cost lies: per configuration, the median over block
    pairs of recording / paused of the step's whole time and of the part spent issuing
    its work (`ab_blocks`, runs since the bench kept it), median [min, max] over the
    processes. A cost in the whole time that the issuing does not share lies on the
    GPU (or in the synchronize)."""
    got = {}
    for f in sorted(Path(d).glob("*.json")):
        j = json.loads(f.read_text())
        blocks = j.get("ab_blocks", {}).get("train_step_ms")
        if not blocks or any(len(b) < 3 or b[2] is None for b in blocks):
            continue
        whole, issue = block_pairs(blocks, 1), block_pairs(blocks, 2)
        if whole and issue:
            e = got.setdefault(j["config"], ([], []))
            e[0].append(statistics.median(whole))
            e[1].append(statistics.median(issue))
    if not got:
        return ""
    cell = lambda v: f"**{statistics.median(v):.3f}×** [{min(v):.3f}, {max(v):.3f}]"  # noqa: E731
    lines = ["training step, median over block pairs of recording / paused: whole step, and its issuing",
             "| configuration | whole step | issuing |", "|---|---|---|"]
    for c in [c for c in CONFIGS if c in got]:
        lines.append(f"| {c} | {cell(got[c][0])} | {cell(got[c][1])} |")
    return "\n".join(lines)


def off_blocks(d):
    """Per configuration and round, each measure's off blocks (libnccl's own functions
    or the paused path, `ab_off`) as one figure: the median over repetitions of their
    means (`paused` in the JSON). Plain's off blocks run the same work as its others."""
    runs = {}
    for c, rounds in load(d, "paused").items():
        runs[c] = {r: {m: statistics.median(v) for m, v in per.items() if v} for r, per in rounds.items()}
    return runs


def table(runs, title="whole processes against plain in the same round: recording blocks, "
                      "median over rounds, and median [min, max] over rounds of the ratio to plain"):
    """Per measure and configuration the median over rounds and the ratio to plain
    paired by round. With `off_blocks` the off sides: a difference there is no cost the
    in-process ratios can see (it falls on both of their sides), or the rounds' noise."""
    configs = [c for c in CONFIGS if c in runs]
    measures = sorted({m for c in runs.values() for r in c.values() for m in r})
    lines = [title, "| measure | " + " | ".join(configs) + " |", "|---" * (len(configs) + 1) + "|"]
    for m in measures:
        cells = []
        base = runs.get("plain", {})
        for c in configs:
            vals = {r: v[m] for r, v in runs[c].items() if m in v}
            if not vals:
                cells.append("—")
                continue
            med = statistics.median(vals.values())
            if c == "plain" or not base:
                cells.append(f"{med:.2f} (n={len(vals)})")
                continue
            ratios = [vals[r] / base[r][m] for r in vals if r in base and m in base[r]]
            if not ratios:
                cells.append(f"{med:.2f}")
                continue
            cells.append(f"{med:.2f}: **{statistics.median(ratios):.3f}×** [{min(ratios):.3f}, {max(ratios):.3f}]")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timing(runs_dir):
    try:
        import pyarrow.dataset as ds
    except ImportError:
        return ""
    out = []
    for d in sorted(Path(runs_dir).glob("*")):
        files = list((d / "process").glob("*.parquet"))
        ops = list((d / "ops").glob("*.parquet"))
        if not files or not ops:
            continue
        p = ds.dataset(files).to_table().to_pylist()[0]
        o = ds.dataset(ops).to_table(columns=["timing", "timing_level"]).to_pandas()
        levels = o["timing_level"].dropna().astype(int)
        nops = list((d / "nccl_ops").glob("*.parquet"))
        n_nccl = ds.dataset(nops).count_rows() if nops else 0
        out.append(f"{d.name}: {len(o)} ops, {n_nccl} NCCL events, timing {dict(o['timing'].value_counts())}, "
                   f"levels {sorted(set(levels))}, gpu_timing={p.get('gpu_timing')!r}, "
                   f"clock error {p.get('gpu_clock_error_ns')} ns, drift {p.get('gpu_clock_drift_ns_per_s')} ns/s")
    return "\n".join(out)


if __name__ == "__main__":
    runs = load(sys.argv[1])
    if len(sys.argv) > 2:
        print(timing(sys.argv[2]))
    print(ab_table(sys.argv[1]))
    print(ab_table(sys.argv[1], "ab_pairs", "in-process A/B, median over block pairs of recording / paused"))
    print(ab_table(sys.argv[1], "ab_fastest", "in-process A/B, fastest block of each side"))
    print(pooled_table(sys.argv[1]))
    print(fine_table(sys.argv[1]))
    print(ab_off_note(sys.argv[1]))
    print(issue_table(sys.argv[1]))
    print(table(runs))
    print(table(off_blocks(sys.argv[1]), "whole processes against plain in the same round: off blocks "
                "(libnccl's own functions or the paused path), the same statistics"))
