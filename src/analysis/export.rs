//! `zcta export --perfetto`: a Chrome trace-event JSON file (opens in ui.perfetto.dev
//! and chrome://tracing). One process per rank; per rank a track of NCCL API calls
//! (ops, named with op, size and seq), a track per GPU stream (kernels and copies),
//! and the proxy thread's ProxyOp/ProxyStep events. Timestamps are µs since the
//! run's earliest event, on each host's own clock.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use arrow_array::{Array, Int32Array, Int64Array, RecordBatch, StringArray, UInt32Array, UInt64Array};
use serde_json::json;

use super::report::size_label;
use crate::reader::{self, ReadError, Skipped};

/// What was exported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    pub processes: usize,
    pub events: u64,
    pub skipped: Vec<Skipped>,
}

fn col<'a, T: 'static>(b: &'a RecordBatch, n: &str) -> Option<&'a T> {
    b.column_by_name(n)?.as_any().downcast_ref()
}

const TID_API: i64 = 1;
const TID_PROXY: i64 = 2;
const TID_GPU: i64 = 100;

/// Writes the trace of `run_dir` to `out` (`out_path` names it in errors).
pub fn perfetto(run_dir: &Path, out: &mut dyn Write, out_path: &Path) -> Result<ExportStats, ReadError> {
    let ops = reader::read_table(run_dir, "ops")?;
    let gpu = reader::read_table(run_dir, "gpu")?;
    let proxy = reader::read_table(run_dir, "proxy")?;
    let mut stats = ExportStats::default();
    for t in [&ops, &gpu, &proxy] {
        stats.skipped.extend(t.skipped.iter().cloned());
    }
    // Processes (host, pid) -> (trace pid, rank); earliest timestamp.
    let mut procs: BTreeMap<(String, i32), (i64, Option<i32>)> = BTreeMap::new();
    let mut t0 = i64::MAX;
    for b in &ops.batches {
        let (Some(h), Some(p), Some(s)) = (
            col::<StringArray>(b, "host"),
            col::<Int32Array>(b, "pid"),
            col::<Int64Array>(b, "api_start_ns"),
        ) else {
            continue;
        };
        let rank = col::<Int32Array>(b, "rank");
        for r in 0..b.num_rows() {
            t0 = t0.min(s.value(r));
            let n = procs.len() as i64 + 1;
            let e = procs
                .entry((h.value(r).to_owned(), p.value(r)))
                .or_insert((n, None));
            if e.1.is_none() {
                e.1 = rank.filter(|a| !a.is_null(r)).map(|a| a.value(r));
            }
        }
    }
    let ts = |ns: i64| (ns - t0) as f64 / 1e3;
    let io = |e: std::io::Error| ReadError::Io {
        path: out_path.to_owned(),
        source: e,
    };
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")
        .map_err(io)?;
    let mut first = true;
    let mut emit = |v: serde_json::Value, out: &mut dyn Write| -> std::io::Result<()> {
        if !first {
            out.write_all(b",\n")?;
        }
        first = false;
        serde_json::to_writer(&mut *out, &v)?;
        Ok(())
    };
    for ((host, pid), (tp, rank)) in &procs {
        let name = match rank {
            Some(r) => format!("rank {r} ({host}:{pid})"),
            None => format!("{host}:{pid}"),
        };
        emit(
            json!({"ph": "M", "name": "process_name", "pid": tp, "tid": 0, "args": {"name": name}}),
            out,
        )
        .map_err(io)?;
        emit(json!({"ph": "M", "name": "process_sort_index", "pid": tp, "tid": 0, "args": {"sort_index": rank.unwrap_or(i32::MAX)}}), out).map_err(io)?;
        emit(json!({"ph": "M", "name": "thread_name", "pid": tp, "tid": TID_API, "args": {"name": "NCCL API"}}), out).map_err(io)?;
        emit(json!({"ph": "M", "name": "thread_name", "pid": tp, "tid": TID_PROXY, "args": {"name": "NCCL proxy"}}), out).map_err(io)?;
        stats.events += 4;
    }
    stats.processes = procs.len();
    let tp_of = |h: &str, p: i32| procs.get(&(h.to_owned(), p)).map(|x| x.0);
    // Ops on the API track.
    for b in &ops.batches {
        let (Some(h), Some(p), Some(op), Some(s), Some(e)) = (
            col::<StringArray>(b, "host"),
            col::<Int32Array>(b, "pid"),
            col::<StringArray>(b, "op"),
            col::<Int64Array>(b, "api_start_ns"),
            col::<Int64Array>(b, "api_end_ns"),
        ) else {
            continue;
        };
        let (seq, bytes, id, eng) = (
            col::<UInt64Array>(b, "seq"),
            col::<UInt64Array>(b, "bytes"),
            col::<UInt64Array>(b, "op_id"),
            col::<StringArray>(b, "engine"),
        );
        let (gs, ge) = (
            col::<Int64Array>(b, "gpu_start_ns"),
            col::<Int64Array>(b, "gpu_end_ns"),
        );
        for r in 0..b.num_rows() {
            let Some(tp) = tp_of(h.value(r), p.value(r)) else {
                continue;
            };
            let get = |a: Option<&UInt64Array>| a.filter(|a| !a.is_null(r)).map(|a| a.value(r));
            let geti = |a: Option<&Int64Array>| a.filter(|a| !a.is_null(r)).map(|a| a.value(r));
            let size = get(bytes).map_or(String::new(), |v| format!(" {}", size_label(v)));
            let seqs = get(seq).map_or(String::new(), |v| format!(" #{v}"));
            emit(
                json!({
                    "ph": "X", "name": format!("{}{size}{seqs}", op.value(r)), "cat": "nccl",
                    "pid": tp, "tid": TID_API, "ts": ts(s.value(r)), "dur": (e.value(r) - s.value(r)).max(0) as f64 / 1e3,
                    "args": {
                        "op_id": get(id), "seq": get(seq), "bytes": get(bytes),
                        "engine": eng.filter(|a| !a.is_null(r)).map(|a| a.value(r)),
                        "gpu_start_us": geti(gs).map(ts), "gpu_end_us": geti(ge).map(ts),
                    }
                }),
                out,
            )
            .map_err(io)?;
            stats.events += 1;
        }
    }
    // GPU work per stream.
    let mut streams: BTreeMap<(i64, u32), i64> = BTreeMap::new();
    for b in &gpu.batches {
        let (Some(h), Some(p), Some(kind), Some(s), Some(e), Some(st)) = (
            col::<StringArray>(b, "host"),
            col::<Int32Array>(b, "pid"),
            col::<StringArray>(b, "kind"),
            col::<Int64Array>(b, "start_ns"),
            col::<Int64Array>(b, "end_ns"),
            col::<UInt32Array>(b, "stream"),
        ) else {
            continue;
        };
        let (name, ck, bytes, op, grp, dev) = (
            col::<StringArray>(b, "name"),
            col::<StringArray>(b, "copy_kind"),
            col::<UInt64Array>(b, "bytes"),
            col::<UInt64Array>(b, "op_id"),
            col::<UInt64Array>(b, "group_id"),
            col::<UInt32Array>(b, "device"),
        );
        for r in 0..b.num_rows() {
            let Some(tp) = tp_of(h.value(r), p.value(r)) else {
                continue;
            };
            let tid = match streams.get(&(tp, st.value(r))) {
                Some(&t) => t,
                None => {
                    let tid = TID_GPU + streams.len() as i64;
                    streams.insert((tp, st.value(r)), tid);
                    let label = format!("GPU {} stream {}", dev.map_or(0, |d| d.value(r)), st.value(r));
                    emit(
                        json!({"ph": "M", "name": "thread_name", "pid": tp, "tid": tid, "args": {"name": label}}),
                        out,
                    )
                    .map_err(io)?;
                    stats.events += 1;
                    tid
                }
            };
            let get = |a: Option<&UInt64Array>| a.filter(|a| !a.is_null(r)).map(|a| a.value(r));
            let label = match (name.filter(|a| !a.is_null(r)), ck.filter(|a| !a.is_null(r))) {
                (Some(n), _) => n.value(r).to_owned(),
                (None, Some(c)) => format!(
                    "{} {} {}",
                    kind.value(r),
                    c.value(r),
                    get(bytes).map_or(String::new(), size_label)
                ),
                _ => kind.value(r).to_owned(),
            };
            emit(
                json!({
                    "ph": "X", "name": label, "cat": "gpu", "pid": tp, "tid": tid,
                    "ts": ts(s.value(r)), "dur": (e.value(r) - s.value(r)).max(0) as f64 / 1e3,
                    "args": {"op_id": get(op), "group_id": get(grp)}
                }),
                out,
            )
            .map_err(io)?;
            stats.events += 1;
        }
    }
    // Proxy events.
    for b in &proxy.batches {
        let (Some(h), Some(p), Some(ev), Some(s)) = (
            col::<StringArray>(b, "host"),
            col::<Int32Array>(b, "pid"),
            col::<StringArray>(b, "event"),
            col::<Int64Array>(b, "start_ns"),
        ) else {
            continue;
        };
        let (stop, op, ch, step) = (
            col::<Int64Array>(b, "stop_ns"),
            col::<UInt64Array>(b, "op_id"),
            col::<Int32Array>(b, "channel"),
            col::<Int32Array>(b, "step"),
        );
        for r in 0..b.num_rows() {
            let Some(tp) = tp_of(h.value(r), p.value(r)) else {
                continue;
            };
            let Some(e) = stop.filter(|a| !a.is_null(r)).map(|a| a.value(r)) else {
                continue;
            };
            let name = ev.value(r);
            if name != "ProxyOp" && name != "ProxyStep" {
                continue;
            }
            emit(
                json!({
                    "ph": "X", "name": name, "cat": "proxy", "pid": tp, "tid": TID_PROXY,
                    "ts": ts(s.value(r)), "dur": (e - s.value(r)).max(0) as f64 / 1e3,
                    "args": {
                        "op_id": op.filter(|a| !a.is_null(r)).map(|a| a.value(r)),
                        "channel": ch.filter(|a| !a.is_null(r)).map(|a| a.value(r)),
                        "step": step.filter(|a| !a.is_null(r)).map(|a| a.value(r)),
                    }
                }),
                out,
            )
            .map_err(io)?;
            stats.events += 1;
        }
    }
    out.write_all(b"\n]}\n").map_err(io)?;
    Ok(stats)
}
