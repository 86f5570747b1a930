#!/usr/bin/env bash
# The wheel as a user gets it: built by packaging/build-wheel.sh, installed into a fresh
# virtual environment (its dependencies from the system's site-packages, nothing
# downloaded), then `zcta`, `zcta run` (which must find the shim inside the environment)
# and `zcta_analysis` used from there on a stand-in job (tests/fixtures). Exits non-zero
# on the first failure. Needs cargo, a C compiler, python3 with pyarrow, pandas,
# duckdb, matplotlib, and maturin.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash packaging/build-wheel.sh >/dev/null
whl=$(ls -t target/wheels/zcta_prof-*.whl | head -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-index --no-deps "$whl"
echo "wheel: $(basename "$whl")"
zcta=$work/venv/bin/zcta
test -x "$zcta"
test -f "$work/venv/lib/libzcta_prof.so"
"$zcta" --help | head -1
# A stand-in job of two ranks, run through the installed CLI (no --shim, no ZCTA_SHIM).
fx=$work/fx
bash tests/fixtures/build.sh "$fx" >/dev/null
head -c 128 /dev/urandom >"$fx/id"
cd "$work"
env -u ZCTA_SHIM "$zcta" run --out "$work/runs" --run-id w -- bash -c \
  "for r in 0 1; do HOST_CUDA=$fx/cuda/libcuda.so.1 '$fx/host' ops \$r 2 '$fx/id' 5 >/dev/null & done; wait" \
  >"$work/run.txt" 2>&1 || { cat "$work/run.txt"; exit 1; }
rows=$("$work/venv/bin/python" -c "import pandas as pd; print(len(pd.read_parquet('$work/runs/w/ops')))")
echo "zcta run: $rows ops rows"
test "$rows" -eq $((2 * 5 * 11))
"$zcta" phases "$work/runs/w" >/dev/null
"$work/venv/bin/python" -m zcta_analysis plot "$work/runs/w" -o "$work/plot.png"
test -s "$work/plot.png"
"$work/venv/bin/python" -c "import zcta_analysis as za; b = za.breakdown('$work/runs/w'); print('zcta_analysis:', len(b), 'breakdown rows')"
echo "ok wheel"
