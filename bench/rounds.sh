#!/usr/bin/env bash
# bench/always_on.sh one round a call, until ROUNDS rounds have run or the next one
# would end after DEADLINE seconds, so that a run fits a machine lent for minutes a
# command: a round is taken to last as long as the longest so far (PER_ROUND seconds
# before the first). The rounds of one run spread over several commands: PREV (a
# .tgz holding json/, or a json/ directory) brings the earlier commands' JSON in, and
# START_ROUND says where the rotation goes on.
#   bash bench/rounds.sh [SHIM_DIR (default .carry)]
# Env: DEADLINE (540), PER_ROUND (120), ROUNDS (5), START_ROUND (0), PREV, KEEP_RUNS=1
# (keep the run directories; they are removed after the report by default), and all
# that always_on.sh reads (CONFIGS, MEASURES, AB, AB_FINE, PIN, ...). Writes under
# $OUT/rounds (json/, runs/, always_on.log, roundN.txt), $OUT/json.tgz and
# $OUT/report.txt, and prints "next_round N" and the report's tables last.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
shim=${1:-$root/.carry}
: "${OUT:?OUT: the directory to write under}"
t0=$(date +%s)
deadline=${DEADLINE:-540}
per=${PER_ROUND:-120}
o=$OUT/rounds
mkdir -p "$o/json"
if [ -n "${PREV:-}" ]; then
  if [ -d "$PREV" ]; then
    cp "$PREV"/*.json "$o/json/" || { echo "rounds.sh: no JSON in $PREV" >&2; exit 2; }
  else
    tar xzf "$PREV" -C "$o" json || { echo "rounds.sh: $PREV holds no json/" >&2; exit 2; }
  fi
  echo "earlier rounds: $(ls "$o/json" | wc -l) JSON files from $PREV"
fi
r=${START_ROUND:-0}
while [ "$r" -lt "${ROUNDS:-5}" ]; do
  el=$(($(date +%s) - t0))
  if [ $((el + per)) -gt "$deadline" ]; then
    echo "stopped before round $r at $el s (a round takes up to $per s; DEADLINE $deadline)"
    break
  fi
  rs=$(date +%s)
  OUT=$o START_ROUND=$r ROUNDS=$((r + 1)) bash "$root/bench/always_on.sh" "$shim" >"$o/round$r.txt" 2>&1 ||
    echo "round $r: always_on.sh exited with $? (see $o/round$r.txt)"
  took=$(($(date +%s) - rs))
  [ "$took" -gt "$per" ] && per=$took
  echo "round $r done at $(($(date +%s) - t0)) s ($took s)"
  r=$((r + 1))
done
echo "next_round $r"
tar czf "$OUT/json.tgz" -C "$o" json
python3 "$root/bench/always_on_report.py" "$o/json" "$o/runs" >"$OUT/report.txt" 2>&1
[ "${KEEP_RUNS:-0}" = 1 ] || rm -rf "$o/runs"
cat "$OUT/report.txt"
