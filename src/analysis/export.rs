//! `zcta export --perfetto`: a Chrome trace-event JSON file (opens in ui.perfetto.dev
//! and chrome://tracing). One process per rank; per rank a track of NCCL API calls
//! (ops, named with op, size and seq), a track per GPU stream (kernels and copies),
//! and the proxy thread's ProxyOp/ProxyStep events. Timestamps are µs since the
//! run's earliest event, on each host's own clock.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
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

crate::read_view! {
    struct OpsCols of ops {
        host, pid, rank, op, api_start_ns, api_end_ns, seq, bytes, result, op_id, engine, gpu_start_ns,
        gpu_end_ns, launch_ns, gpu_ready_ns,
    }
}

crate::read_view! {
    struct GpuCols of gpu { host, pid, kind, start_ns, end_ns, stream, name, copy_kind, bytes, op_id, group_id, device }
}

crate::read_view! {
    struct ProxyCols of proxy {
        host, pid, event, start_ns, stop_ns, op_id, channel, step, send_wait_ns, recv_wait_ns,
        recv_flush_wait_ns, recv_gpu_wait_ns,
    }
}

const TID_API: i64 = 1;
const TID_PROXY: i64 = 2;
const TID_GPU: i64 = 100;

/// Batches grouped by the file they were read from.
type Files = Vec<(PathBuf, Vec<RecordBatch>)>;

/// Batches, each with the rows of it that are drawn.
type Kept = Vec<(RecordBatch, Vec<usize>)>;

/// The batches of every file of `table`, each with its file, only `columns`: a file
/// whose reading breaks off gives the batches read before the damage, as every other
/// command that streams a table takes them ([`reader::for_each_batch_by_file`]). Its
/// skipped files (one broken off says how many of its rows were used) are added to
/// `skipped`; the second value is the number of its write-ahead logs still pending.
fn read_files(
    run_dir: &Path,
    table: &str,
    columns: &[&str],
    skipped: &mut Vec<Skipped>,
) -> Result<(Files, usize), ReadError> {
    let mut files = Vec::new();
    let data = reader::for_each_batch_by_file(
        run_dir,
        table,
        columns,
        |b, batches: &mut Vec<RecordBatch>| batches.push(b.clone()),
        |path, batches, _| files.push((path.to_path_buf(), batches)),
    )?;
    skipped.extend(data.skipped);
    Ok((files, data.pending_logs.len()))
}

/// The rows of `files` that `keep` keeps ([`super::LeftOut`]), as (batch, rows), for
/// the batches `view` reads; each file with rows left out is named in `skipped` (as
/// table `what`).
fn rows_kept<'a, V>(
    files: &'a [(PathBuf, Vec<RecordBatch>)],
    what: &str,
    skipped: &mut Vec<Skipped>,
    view: impl Fn(&'a RecordBatch) -> Option<V>,
    keep: impl Fn(&mut super::LeftOut, &V, usize) -> bool,
    rows: impl Fn(&V) -> usize,
) -> Kept {
    let mut out = Vec::new();
    for (path, batches) in files {
        let mut left_out = super::LeftOut::default();
        for b in batches {
            let Some(v) = view(b) else {
                continue;
            };
            let kept: Vec<usize> = (0..rows(&v)).filter(|&r| keep(&mut left_out, &v, r)).collect();
            out.push((b.clone(), kept));
        }
        left_out.name(path, what, skipped);
    }
    out
}

/// A run's trace, read and judged: the rows to draw, held in memory until
/// [`Trace::write`] writes them.
pub struct Trace {
    ops: Kept,
    gpu: Kept,
    proxy: Kept,
    /// Processes (host, pid) -> (trace pid, rank).
    procs: BTreeMap<(String, i32), (i64, Option<i32>)>,
    /// The earliest timestamp drawn.
    t0: i64,
    /// Files not read, or read with rows left out ([`super::LeftOut`]).
    pub skipped: Vec<Skipped>,
    /// Write-ahead logs of the ops table still pending (`zcta recover` turns them into
    /// rows).
    pub pending_ops_logs: usize,
}

impl Trace {
    /// Reads the ops, gpu and proxy tables of `run_dir`. Rows the other commands leave
    /// out too ([`super::LeftOut`]: a time out of range, an ops row's impossible bytes)
    /// are left out, and their files listed in [`Trace::skipped`].
    pub fn read(run_dir: &Path) -> Result<Trace, ReadError> {
        let mut skipped = Vec::new();
        let (ops, pending_ops_logs) = read_files(run_dir, "ops", OpsCols::COLUMNS, &mut skipped)?;
        let (gpu, _) = read_files(run_dir, "gpu", GpuCols::COLUMNS, &mut skipped)?;
        let (proxy, _) = read_files(run_dir, "proxy", ProxyCols::COLUMNS, &mut skipped)?;
        // Some times judged are not drawn (launch, ready, a step's waits), but a row is
        // left out by the same rule everywhere.
        let ops = rows_kept(
            &ops,
            "ops",
            &mut skipped,
            OpsCols::of,
            |l, v, r| super::keep_op!(l, v, r),
            |v| v.rows,
        );
        let gpu = rows_kept(
            &gpu,
            "gpu",
            &mut skipped,
            GpuCols::of,
            |l, v, r| l.keep(&super::gpu_times!(v, r)),
            |v| v.rows,
        );
        let proxy = rows_kept(
            &proxy,
            "proxy",
            &mut skipped,
            ProxyCols::of,
            |l, v, r| l.keep(&super::proxy_times!(v, r)),
            |v| v.rows,
        );
        let mut procs: BTreeMap<(String, i32), (i64, Option<i32>)> = BTreeMap::new();
        let mut t0 = i64::MAX;
        for (b, rows) in &ops {
            let Some(v) = OpsCols::of(b) else {
                continue;
            };
            for &r in rows {
                t0 = t0.min(v.api_start_ns.value(r));
                let n = procs.len() as i64 + 1;
                let e = procs
                    .entry((v.host.value(r).to_owned(), v.pid.value(r)))
                    .or_insert((n, None));
                if e.1.is_none() {
                    e.1 = v.rank.get(r);
                }
            }
        }
        Ok(Trace {
            ops,
            gpu,
            proxy,
            procs,
            t0,
            skipped,
            pending_ops_logs,
        })
    }

    /// The processes drawn: those with an ops row kept (0: nothing to draw).
    pub fn processes(&self) -> usize {
        self.procs.len()
    }

    /// Writes the trace to `out`; the number of events written.
    pub fn write(&self, out: &mut dyn Write) -> std::io::Result<u64> {
        let procs = &self.procs;
        let t0 = self.t0;
        let mut events = 0u64;
        // Every time is in range, and t0 one of them (when there is a process to draw).
        let ts = |ns: i64| (ns - t0) as f64 / 1e3;
        out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
        let mut first = true;
        let mut emit = |v: serde_json::Value, out: &mut dyn Write| -> std::io::Result<()> {
            if !first {
                out.write_all(b",\n")?;
            }
            first = false;
            serde_json::to_writer(&mut *out, &v)?;
            Ok(())
        };
        for ((host, pid), (tp, rank)) in procs {
            let name = match rank {
                Some(r) => format!("rank {r} ({host}:{pid})"),
                None => format!("{host}:{pid}"),
            };
            emit(
                json!({"ph": "M", "name": "process_name", "pid": tp, "tid": 0, "args": {"name": name}}),
                out,
            )?;
            emit(
                json!({"ph": "M", "name": "process_sort_index", "pid": tp, "tid": 0, "args": {"sort_index": rank.unwrap_or(i32::MAX)}}),
                out,
            )?;
            emit(
                json!({"ph": "M", "name": "thread_name", "pid": tp, "tid": TID_API, "args": {"name": "NCCL API"}}),
                out,
            )?;
            emit(
                json!({"ph": "M", "name": "thread_name", "pid": tp, "tid": TID_PROXY, "args": {"name": "NCCL proxy"}}),
                out,
            )?;
            events += 4;
        }
        let tp_of = |h: &str, p: i32| procs.get(&(h.to_owned(), p)).map(|x| x.0);
        // Ops on the API track.
        for (b, rows) in &self.ops {
            let Some(v) = OpsCols::of(b) else {
                continue;
            };
            for &r in rows {
                let Some(tp) = tp_of(v.host.value(r), v.pid.value(r)) else {
                    continue;
                };
                let (s, e) = (v.api_start_ns.value(r), v.api_end_ns.value(r));
                let size = v
                    .bytes
                    .get(r)
                    .map_or(String::new(), |b| format!(" {}", size_label(b)));
                let seqs = v.seq.get(r).map_or(String::new(), |q| format!(" #{q}"));
                emit(
                    json!({
                        "ph": "X", "name": format!("{}{size}{seqs}", v.op.value(r)), "cat": "nccl",
                        "pid": tp, "tid": TID_API, "ts": ts(s), "dur": (e - s).max(0) as f64 / 1e3,
                        "args": {
                            "op_id": v.op_id.get(r), "seq": v.seq.get(r), "bytes": v.bytes.get(r),
                            "engine": v.engine.get(r),
                            "gpu_start_us": v.gpu_start_ns.get(r).map(ts), "gpu_end_us": v.gpu_end_ns.get(r).map(ts),
                        }
                    }),
                    out,
                )?;
                events += 1;
            }
        }
        // GPU work per stream.
        let mut streams: BTreeMap<(i64, u32), i64> = BTreeMap::new();
        for (b, rows) in &self.gpu {
            let Some(v) = GpuCols::of(b) else {
                continue;
            };
            for &r in rows {
                let Some(tp) = tp_of(v.host.value(r), v.pid.value(r)) else {
                    continue;
                };
                let st = v.stream.value(r);
                let tid = match streams.get(&(tp, st)) {
                    Some(&t) => t,
                    None => {
                        let tid = TID_GPU + streams.len() as i64;
                        streams.insert((tp, st), tid);
                        let label = format!("GPU {} stream {st}", v.device.value(r));
                        emit(
                            json!({"ph": "M", "name": "thread_name", "pid": tp, "tid": tid, "args": {"name": label}}),
                            out,
                        )?;
                        events += 1;
                        tid
                    }
                };
                let kind = v.kind.value(r);
                let label = match (v.name.get(r), v.copy_kind.get(r)) {
                    (Some(n), _) => n.to_owned(),
                    (None, Some(c)) => {
                        format!("{kind} {c} {}", v.bytes.get(r).map_or(String::new(), size_label))
                    }
                    _ => kind.to_owned(),
                };
                let (s, e) = (v.start_ns.value(r), v.end_ns.value(r));
                emit(
                    json!({
                        "ph": "X", "name": label, "cat": "gpu", "pid": tp, "tid": tid,
                        "ts": ts(s), "dur": (e - s).max(0) as f64 / 1e3,
                        "args": {"op_id": v.op_id.get(r), "group_id": v.group_id.get(r)}
                    }),
                    out,
                )?;
                events += 1;
            }
        }
        // Proxy events.
        for (b, rows) in &self.proxy {
            let Some(v) = ProxyCols::of(b) else {
                continue;
            };
            for &r in rows {
                let Some(tp) = tp_of(v.host.value(r), v.pid.value(r)) else {
                    continue;
                };
                let Some(e) = v.stop_ns.get(r) else {
                    continue;
                };
                let name = v.event.value(r);
                if name != "ProxyOp" && name != "ProxyStep" {
                    continue;
                }
                let s = v.start_ns.value(r);
                emit(
                    json!({
                        "ph": "X", "name": name, "cat": "proxy", "pid": tp, "tid": TID_PROXY,
                        "ts": ts(s), "dur": (e - s).max(0) as f64 / 1e3,
                        "args": {
                            "op_id": v.op_id.get(r),
                            "channel": v.channel.get(r),
                            "step": v.step.get(r),
                        }
                    }),
                    out,
                )?;
                events += 1;
            }
        }
        out.write_all(b"\n]}\n")?;
        Ok(events)
    }
}

/// Writes the trace of `run_dir` to `out` (`out_path` names it in errors): [`Trace::read`]
/// then [`Trace::write`].
pub fn perfetto(run_dir: &Path, out: &mut dyn Write, out_path: &Path) -> Result<ExportStats, ReadError> {
    let trace = Trace::read(run_dir)?;
    let events = trace.write(out).map_err(|err| ReadError::Io {
        path: out_path.to_owned(),
        err,
    })?;
    Ok(ExportStats {
        processes: trace.processes(),
        events,
        skipped: trace.skipped,
    })
}
