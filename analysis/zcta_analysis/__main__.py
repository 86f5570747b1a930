"""python -m zcta_analysis plot RUN [RUN2] -o out.png [--link-peak-gbps 450]

Exit status: 0 plotted; 2 bad arguments or input (a missing or unreadable run, no
phases table, an output that cannot be written), said in one line on stderr; 1 an
unexpected error, also in one line (ZCTA_ANALYSIS_TRACEBACK=1 shows the traceback).
Files of a run that are skipped, or of which rows with a time outside 1970..2116 or a
successful call's bytes of 2^62 or more are left out (as zcta leaves them out), are
named on stderr, one line each."""

import argparse
import math
import os
import sys
import warnings

from . import ZctaWarning
from .plot import plot


def _positive(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {v!r}") from None
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of GB/s, not {v!r}")
    return x


def _nonempty(v: str) -> str:
    if not v:
        raise argparse.ArgumentTypeError("an empty path")
    return v


def _show(message, category, filename, lineno, file=None, line=None, _orig=warnings.showwarning):
    """The package's own warnings as the one line they are; others as Python shows them."""
    if issubclass(category, ZctaWarning):
        print(message, file=sys.stderr)
    else:
        _orig(message, category, filename, lineno, file, line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zcta_analysis")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser(
        "plot",
        help="phase shares per (op, size) and bus bandwidth vs size; needs `zcta phases RUN` first",
    )
    p.add_argument("runs", nargs="+", type=_nonempty, help="one or two run directories (each with `zcta phases` written)")
    p.add_argument("-o", "--output", required=True, type=_nonempty)
    p.add_argument("--link-peak-gbps", type=_positive, default=450.0)
    a = ap.parse_args(argv)
    if len(a.runs) > 2:
        p.error("at most two runs")
    with warnings.catch_warnings():
        warnings.showwarning = _show
        try:
            print(plot(a.runs, a.output, a.link_peak_gbps))
        except (OSError, ValueError) as e:
            print(f"zcta_analysis: {e}", file=sys.stderr)
            return 2
        except Exception as e:  # a bug: one line all the same
            if os.environ.get("ZCTA_ANALYSIS_TRACEBACK"):
                raise
            print(f"zcta_analysis: internal error: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
