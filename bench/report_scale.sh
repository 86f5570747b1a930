#!/usr/bin/env bash
# Scale of `zcta report`: writes a synthetic run of ROWS ops rows (8 ranks on 2 hosts,
# the second host's clock 3 ms ahead) with the real sink, then times the report and
# its peak memory.
# usage: bench/report_scale.sh [ROWS (default 100000000)] [DIR (default a temp dir)]
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-100000000}
dir=${2:-$(mktemp -d)}
cargo build --release --bin zcta --example gen_run
rm -rf "$dir/run"
echo "== writing $rows rows into $dir/run"
/usr/bin/time -f "generate: %e s" target/release/examples/gen_run "$dir/run" "$rows" 8 2
du -sh "$dir/run"
echo "== zcta report"
/usr/bin/time -f "report: %e s wall, %U s user, %M KiB max RSS" target/release/zcta report "$dir/run" >/dev/null
