#!/usr/bin/env bash
# Builds the zcta-prof wheel into target/wheels/: the release shim first (the wheel
# carries it from target/wheel-data/data/lib/, installed to <prefix>/lib/), then the
# CLI and the Python package with maturin. Needs cargo, a C compiler and `pip install maturin`.
#   bash packaging/build-wheel.sh [extra maturin build arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p zcta-shim
mkdir -p target/wheel-data/data/lib
cp target/release/libzcta_prof.so target/wheel-data/data/lib/
maturin build --release -o target/wheels "$@"
ls target/wheels/zcta_prof-*.whl
