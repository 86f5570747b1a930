"""python -m zcta_analysis plot RUN [RUN2] -o out.png [--link-peak-gbps 450]"""

import argparse
import sys

from .plot import plot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zcta_analysis")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser(
        "plot",
        help="phase shares per (op, size) and bus bandwidth vs size; needs `zcta phases RUN` first",
    )
    p.add_argument("runs", nargs="+", help="one or two run directories (each with `zcta phases` written)")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--link-peak-gbps", type=float, default=450.0)
    a = ap.parse_args(argv)
    if len(a.runs) > 2:
        ap.error("at most two runs")
    try:
        print(plot(a.runs, a.output, a.link_peak_gbps))
    except (FileNotFoundError, ValueError) as e:
        print(f"zcta_analysis: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
