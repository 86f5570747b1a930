"""Writer lag: how long after an op ends on the GPU its ops row is durable.

    python bench/wal_lag.py RUN_DIR OUT.json STOP_FILE

Polls RUN_DIR/ops/_*.wal (the write-ahead logs, Arrow IPC streams, flushed to the
kernel: what survives a SIGKILL) every 50 ms until STOP_FILE exists. Each row seen for
the first time is durable "now" (CLOCK_REALTIME, the clock of every *_ns column);
its lag is now - gpu_end_ns. The poll period bounds the error (+0..50 ms). Rows that
reach only the final Parquet file at exit are never seen in a log and not counted.
Runs as its own process, so it takes nothing from the measured job's Python.
"""

import glob
import json
import os
import sys
import time

import pyarrow as pa

run, out, stop = sys.argv[1], sys.argv[2], sys.argv[3]
seen = {}  # wal path -> rows already counted
lags, no_gpu = [], 0
while not os.path.exists(stop):
    for wal in glob.glob(os.path.join(run, "ops", "_*.wal")):
        try:
            with open(wal, "rb") as f:
                data = f.read()
        except OSError:
            continue  # closed and renamed between glob and open
        now = time.time_ns()
        rows = []
        try:
            reader = pa.ipc.open_stream(pa.py_buffer(data))
            while True:
                rows.extend(reader.read_next_batch().column("gpu_end_ns").to_pylist())
        except (StopIteration, pa.ArrowInvalid, OSError, EOFError):
            pass  # end of stream, or a batch still being written (torn tail)
        for g in rows[seen.get(wal, 0):]:
            if g is None:
                no_gpu += 1
            else:
                lags.append((now - g) / 1e6)
        seen[wal] = max(seen.get(wal, 0), len(rows))
    time.sleep(0.05)
lags.sort()


def q(p):
    return lags[min(len(lags) - 1, int(p * len(lags)))] if lags else None


with open(out, "w") as f:
    json.dump({"rows": len(lags), "rows_without_gpu_end": no_gpu, "p50_ms": q(0.5), "p99_ms": q(0.99),
               "max_ms": lags[-1] if lags else None, "poll_ms": 50}, f)
