"""zcta_analysis buckets sizes as `zcta report` and `zcta diff` do.

A bucket is the largest power of two ≤ bytes, and 0 for bytes 0 or NULL
(src/analysis/report.rs `size_bucket` of `bytes.unwrap_or(0)`), on the exact u64: in
float64, 2^54 - 1 rounds up to 2^54 and 2^62 - 1 to 2^62, a bucket twice too large.
`size_bucket`, `breakdown` and `compare` give zcta's buckets for the same run, and the
plot labels them as the report's text does (`bucket_label`)."""

import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from test_analysis_bad_input import ZCTA
from test_analysis_exact_ints import zcta_file
from test_analysis_time_range import _op
from test_readers import ROOT

sys.path.insert(0, str(ROOT / "analysis"))
import zcta_analysis as za  # noqa: E402
from zcta_analysis import plot as zp  # noqa: E402

U64_MAX = (1 << 64) - 1
# Each size on both ranks of one collective; 0 and NULL share bucket 0, 2^53 and
# 2^54 - 1 bucket 2^53.
SIZES = [0, 1, 512, 1 << 53, (1 << 54) - 1, (1 << 62) - 1, None]


def _want(b):
    """report.rs `size_bucket(b.unwrap_or(0))`, on Python's exact ints."""
    return 1 << (b.bit_length() - 1) if b else 0


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("buckets") / "r"
    rows = [_op(rank, seq, 5_000 + seq, bytes=b) for seq, b in enumerate(SIZES) for rank in (0, 1)]
    for rank in (0, 1):
        zcta_file(run / "ops" / f"h-{100 + rank}.parquet", "ops", [r for r in rows if r["rank"] == rank])
    p = subprocess.run([ZCTA, "phases", run], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return run


def _zcta(*args):
    p = subprocess.run([ZCTA, *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("dtype", ["UInt64", "uint64[pyarrow]", object])
def test_size_bucket_is_exact(dtype):
    values = [0, 1, 2, 3, 512, 513, 1 << 53, (1 << 53) + 1, (1 << 54) - 1, (1 << 62) - 1, 1 << 62, U64_MAX, None]
    got = za.size_bucket(pd.Series(values, dtype=dtype, index=range(10, 10 + len(values))))
    assert str(got.dtype) == "UInt64" and list(got.index) == list(range(10, 10 + len(values)))
    assert got.tolist() == [_want(v) for v in values]


def test_size_bucket_of_plain_numpy_and_float_columns():
    """numpy integers as they are; float64 as its values are (NaN: NULL); anything that
    is no u64 is an error, not a bucket."""
    assert za.size_bucket(pd.Series([0, 3, U64_MAX], dtype="uint64")).tolist() == [0, 2, 1 << 63]
    assert za.size_bucket(pd.Series([0, 7, 1 << 40], dtype="int64")).tolist() == [0, 4, 1 << 40]
    assert za.size_bucket(pd.Series([0.0, 1.0, 1000.0, float(1 << 53), np.nan])).tolist() == [0, 1, 512, 1 << 53, 0]
    for bad in ([-1], [1.5], [float(1 << 64)], ["x"]):
        with pytest.raises(ValueError, match="size_bucket"):
            za.size_bucket(pd.Series(bad))


def test_breakdown_buckets_are_zcta_report_s(run):
    """Per (op, bucket, engine): the same groups and counts as `zcta report --format
    json`, buckets exact (2^54 - 1 in 2^53's, 2^62 - 1 in 2^61's, 0 and NULL in 0)."""
    groups = json.loads(_zcta("report", "--format", "json", run))["groups"]
    want = sorted((g["op"], g["size_bucket_bytes"], g["engine"], g["count"]) for g in groups)
    assert [(s, n) for _, s, _, n in want] == [(0, 4), (1, 2), (512, 2), (1 << 53, 4), (1 << 61, 2)]
    b = za.breakdown(run)
    assert str(b["size"].dtype) == "UInt64"
    assert sorted(zip(b.op, b["size"].tolist(), b.engine, b["count"])) == want


def test_compare_buckets_are_zcta_diff_s(run):
    rows = json.loads(_zcta("diff", "--format", "json", run, run))["rows"]
    want = sorted((r["op"], r["size_bucket_bytes"]) for r in rows)
    assert [s for _, s in want] == [0, 1, 512, 1 << 53, 1 << 61]
    c = za.compare(run, run)
    assert sorted(zip(c.op, c["size"].tolist())) == want


def test_plot_labels_buckets_as_the_report_does(run):
    """The report's text names each bucket as the plot's x axis does ("0 B" for bucket
    0, TiB above 1023 GiB); report.rs's own cases too."""
    text = _zcta("report", run)
    said = re.findall(r"^AllReduce\s+(.+?)\s+sm_kernel\s", text, re.M)
    assert [zp._bucket(s) for s in sorted(za.breakdown(run)["size"].tolist())] == said
    assert said[0] == "0 B" and said[-1] == "2097152–4194304 TiB"
    for b, label in ((1000, "1000–2000 B"), (512, "512 B–1 KiB"), (1 << 20, "1–2 MiB"), (8, "8–16 B"),
                     (1 << 39, "512 GiB–1 TiB"), (np.uint64(1 << 63), "8388608 TiB–18446744073709551615 B")):
        assert zp._bucket(b) == label, b
