#!/usr/bin/env bash
# Every test of the project that runs without a GPU: Rust unit and integration tests
# (they drive the shim with a stand-in libnccl) and the Python reader tests.
# Needs: cargo, a C compiler, python3 with pyarrow, pandas, duckdb, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --all-targets
cargo test --workspace
python3 -m pytest -q tests/python
