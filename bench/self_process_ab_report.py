"""The table of bench/gpu_self_process_ab.sh from its log: per setting and item, the
median over rounds of each process's median, and the ratio to the plain process of the
same round, median [min, max] over rounds.

    python3 bench/self_process_ab_report.py LOG

LOG lines come from bench/gpu_self_ab.py --always-on --tag SETTING:ROUND, e.g.
"default:3         send/recv to self, 8 B              on    12.345 us".
"""

import re
import statistics
import sys

LINE = re.compile(r"(\S+):(\d+)\s+(.+?)\s+(?:on|plain)\s+([\d.]+) us$")


def table(lines):
    rows = {}
    for line in lines:
        m = LINE.match(line.strip())
        if m:
            rows.setdefault(m[1], {}).setdefault(m[3], {})[int(m[2])] = float(m[4])
    plain = rows.get("plain", {})
    out = [f"{'setting':22} {'item':30} {'median us':>10}  ratio to plain, median [min, max] (rounds)"]
    for s, items in rows.items():
        for item, by_round in items.items():
            med = statistics.median(by_round.values())
            ratios = [v / plain[item][r] for r, v in sorted(by_round.items()) if r in plain.get(item, {})]
            rat = ""
            if ratios and s != "plain":
                rat = f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] ({len(ratios)})"
            out.append(f"{s:22} {item:30} {med:10.3f}  {rat}")
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print("\n".join(table(f)))
