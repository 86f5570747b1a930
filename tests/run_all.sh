#!/usr/bin/env bash
# Every test of the project that runs without a GPU: Rust unit and integration tests
# (they drive the shim with a stand-in libnccl) and the Python reader tests.
# Needs: cargo, a C compiler, python3 with pyarrow, pandas, duckdb, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Prerequisites first, so a missing one is said before minutes of building.
for tool in cargo cc python3; do
  command -v "$tool" >/dev/null || { echo "run_all.sh: $tool not found (needs: cargo, a C compiler, python3)" >&2; exit 2; }
done
if ! missing=$(python3 - <<'PY'
import importlib.util, sys
need = ["pyarrow", "pandas", "duckdb", "pytest", "matplotlib"]
gone = [m for m in need if importlib.util.find_spec(m) is None]
print(" ".join(gone))
sys.exit(1 if gone else 0)
PY
); then
  echo "run_all.sh: missing Python packages: $missing; install them with:" >&2
  echo "  python3 -m pip install pyarrow pandas duckdb pytest matplotlib" >&2
  exit 2
fi
cargo build --workspace --all-targets
cargo test --workspace
python3 -m pytest -q tests/python
