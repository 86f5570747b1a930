//! `zcta summary`: rows per table; per process what it could not write, whether
//! NCCL's profiler plugin and the GPU side ran; per op what NCCL reported of it and
//! what its GPU side measured; calls, bytes and errors per rank and op. Every table
//! is read a batch at a time (memory: one batch, the (host, pid, op_id) of the ops
//! NCCL reported, and the aggregates); files are used whole or skipped whole, with
//! the reasons [`reader::read_table`] gives.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use super::{ProcView, median};
use crate::reader::{self, ReadError, SharedPid, Skipped};
use crate::tables::ALL_TABLES;

/// One table's files.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableCount {
    pub table: &'static str,
    pub rows: usize,
    /// Files read.
    pub files: usize,
    pub skipped: Vec<Skipped>,
    /// Write-ahead logs not yet turned into Parquet.
    pub pending_logs: usize,
}

/// Where reading stopped, and why.
#[derive(Debug)]
pub struct Stopped {
    /// The table being read; `None`: looking for processes that share a (host, pid).
    pub table: Option<&'static str>,
    pub error: ReadError,
}

/// Of one op's rows: how many NCCL's profiler plugin reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NcclCover {
    pub ops: u64,
    /// Rows with a `nccl_ops` row.
    pub with_view: u64,
    /// Rows without one that the budget did not select (`ops.timing = budget`).
    pub not_selected: u64,
}

/// Of one op's rows: what the GPU side measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSide {
    pub ops: u64,
    /// Rows with a GPU begin and end.
    pub measured: u64,
    /// Rows per `ops.engine` ("not measured" for NULL).
    pub engines: BTreeMap<String, u64>,
    /// Median of gpu_end − GPU begin, ns.
    pub median_ns: Option<i64>,
    /// Median of gpu_start − launch (deep mode), ns.
    pub launch_to_kernel_ns: Option<i64>,
}

/// Of one (rank, op): calls, their bytes, and how many failed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    pub calls: u64,
    /// In u128: a call's `bytes` may be near 2^64 (a call NCCL refused, with a huge count),
    /// and the sum stays exact.
    pub bytes: u128,
    pub errors: u64,
}

/// What `zcta summary` says of a run.
#[derive(Debug, Default)]
pub struct Summary {
    /// In [`ALL_TABLES`] order, up to the one where reading stopped.
    pub tables: Vec<TableCount>,
    /// Reading stopped; what follows [`Summary::tables`] is then empty.
    pub stopped: Option<Stopped>,
    pub shared_pids: Vec<SharedPid>,
    pub processes: Vec<ProcView>,
    /// Per op name (as `ops.op` has it).
    pub nccl_cover: BTreeMap<String, NcclCover>,
    /// NCCL's Coll choices: (func, algo, proto, channels) -> events.
    pub nccl_mix: BTreeMap<(String, String, String, i32), u64>,
    /// Per op name.
    pub gpu: BTreeMap<String, GpuSide>,
    /// Per (rank, op name).
    pub calls: BTreeMap<(Option<i32>, String), Calls>,
}

crate::read_view! {
    struct NcclOpsCols of nccl_ops { host, pid, op_id, func, algo, proto, n_channels }
}

crate::read_view! {
    struct OpsCols of ops {
        host, pid, op_id, op, rank, bytes, result, timing, engine, api_start_ns, api_end_ns,
        launch_ns, gpu_ready_ns, gpu_start_ns, gpu_end_ns,
    }
}

/// What one `nccl_ops` file adds.
#[derive(Default)]
struct NcclOpsAcc {
    /// (host index, pid, op_id) of every op reported.
    seen: HashSet<(usize, i32, u64)>,
    mix: BTreeMap<(String, String, String, i32), u64>,
}

/// What one `ops` file adds; the GPU durations are kept until the medians are taken.
#[derive(Default)]
struct OpsAcc {
    cover: BTreeMap<String, NcclCover>,
    gpu: BTreeMap<String, (GpuSide, Vec<i64>, Vec<i64>)>,
    calls: BTreeMap<(Option<i32>, String), Calls>,
    /// Rows left out as damaged ([`super::LeftOut`]).
    left_out: super::LeftOut,
}

impl OpsAcc {
    fn merge(&mut self, o: OpsAcc) {
        for (k, c) in o.cover {
            let e = self.cover.entry(k).or_default();
            e.ops += c.ops;
            e.with_view += c.with_view;
            e.not_selected += c.not_selected;
        }
        for (k, (g, dur, queue)) in o.gpu {
            let e = self.gpu.entry(k).or_default();
            e.0.ops += g.ops;
            e.0.measured += g.measured;
            for (eng, n) in g.engines {
                *e.0.engines.entry(eng).or_default() += n;
            }
            e.1.extend(dur);
            e.2.extend(queue);
        }
        for (k, c) in o.calls {
            let e = self.calls.entry(k).or_default();
            e.calls += c.calls;
            e.bytes = e.bytes.saturating_add(c.bytes);
            e.errors += c.errors;
        }
    }

    fn add(&mut self, v: &OpsCols, hosts: &HashMap<String, usize>, seen: &HashSet<(usize, i32, u64)>) {
        for i in 0..v.rows {
            if !super::keep_op!(self.left_out, v, i) {
                continue;
            }
            let (start, launch) = (v.gpu_start_ns.get(i), v.launch_ns.get(i));
            let (ready, end) = (v.gpu_ready_ns.get(i), v.gpu_end_ns.get(i));
            let op = v.op.value(i);
            let e = self.cover.entry(op.to_owned()).or_default();
            e.ops += 1;
            let with = hosts
                .get(v.host.value(i))
                .is_some_and(|&h| seen.contains(&(h, v.pid.value(i), v.op_id.value(i))));
            e.with_view += u64::from(with);
            e.not_selected += u64::from(!with && v.timing.get(i) == Some("budget"));

            let (g, dur, queue) = self.gpu.entry(op.to_owned()).or_default();
            g.ops += 1;
            let eng = v.engine.get(i).unwrap_or("not measured");
            *g.engines.entry(eng.to_owned()).or_default() += 1;
            // As the report takes it: not measured where the GPU end precedes the call.
            // The times are in range: their differences do not overflow.
            let api_start = v.api_start_ns.value(i);
            if let Some((b, end)) = super::phases::gpu_span(api_start, start, ready, launch, end) {
                g.measured += 1;
                dur.push(end - b);
            }
            if let (Some(s), Some(l)) = (start, launch) {
                queue.push(s - l);
            }

            let c = self.calls.entry((v.rank.get(i), op.to_owned())).or_default();
            c.calls += 1;
            c.bytes = c.bytes.saturating_add(u128::from(v.bytes.get(i).unwrap_or(0)));
            c.errors += u64::from(v.result.value(i) != 0);
        }
    }
}

/// Reads the run directory `run` for `zcta summary`. A missing run directory is an
/// error; a table that cannot be listed stops the reading there ([`Summary::stopped`]).
pub fn summarize(run: &Path) -> Result<Summary, ReadError> {
    reader::check_run_dir(run)?;
    let mut s = Summary::default();
    // Host names as small integers: the key of every op NCCL reported holds one.
    let mut hosts: HashMap<String, usize> = HashMap::new();
    // Those of the processes (not shown).
    let mut host_names = Vec::new();
    // NCCL's view first: what the ops rows are joined with. Its count is listed in
    // table order below, and so is its error, if any (earlier tables' come first).
    let mut nccl = Some(reader::fold_table(
        run,
        "nccl_ops",
        NcclOpsAcc::default,
        |a, b| {
            let Some(v) = NcclOpsCols::of(b) else { return };
            for i in 0..v.rows {
                if !v.op_id.is_null(i) {
                    let host = v.host.value(i);
                    let h = match hosts.get(host) {
                        Some(&h) => h,
                        None => {
                            let h = hosts.len();
                            hosts.insert(host.to_owned(), h);
                            h
                        }
                    };
                    a.seen.insert((h, v.pid.value(i), v.op_id.value(i)));
                }
                if !v.algo.is_null(i) {
                    let k = (
                        v.func.value(i).to_owned(),
                        v.algo.value(i).to_owned(),
                        v.proto.value(i).to_owned(),
                        v.n_channels.value(i),
                    );
                    *a.mix.entry(k).or_default() += 1;
                }
            }
        },
    ));
    let mut seen = HashSet::new();
    if let Some(Ok((_, files))) = &mut nccl {
        for (_, f) in files {
            seen.extend(std::mem::take(&mut f.seen));
            for (k, n) in std::mem::take(&mut f.mix) {
                *s.nccl_mix.entry(k).or_default() += n;
            }
        }
    }
    let mut ops = OpsAcc::default();
    for t in ALL_TABLES {
        let read = match t {
            "nccl_ops" => nccl.take().expect("read once").map(|(d, f)| (d, rows(&f))),
            "ops" => reader::fold_table(run, t, OpsAcc::default, |a, b| {
                if let Some(v) = OpsCols::of(b) {
                    a.add(&v, &hosts, &seen);
                }
            })
            .map(|(mut d, f)| {
                let n = rows(&f);
                // `f` holds the files read, in the order of `d.files`.
                for (path, (_, mut a)) in d.files.iter().zip(f) {
                    a.left_out.name(path, "ops", &mut d.skipped);
                    ops.merge(a);
                }
                (d, n)
            }),
            "process" => reader::fold_table(run, t, Vec::new, |a: &mut Vec<ProcView>, b| {
                a.extend(super::procs_of(b, &mut host_names));
            })
            .map(|(d, f)| {
                let n = rows(&f);
                s.processes = f.into_iter().flat_map(|(_, p)| p).collect();
                (d, n)
            }),
            _ => reader::fold_table(run, t, || (), |_, _| ()).map(|(d, f)| (d, rows(&f))),
        };
        match read {
            Ok((d, n)) => s.tables.push(TableCount {
                table: t,
                rows: n,
                files: d.files.len(),
                skipped: d.skipped,
                pending_logs: d.pending_logs.len(),
            }),
            Err(error) => {
                s.stopped = Some(Stopped {
                    table: Some(t),
                    error,
                });
                return Ok(stopped(s));
            }
        }
    }
    match reader::shared_pids(run) {
        Ok(p) => s.shared_pids = p,
        Err(error) => {
            s.stopped = Some(Stopped { table: None, error });
            return Ok(stopped(s));
        }
    }
    s.nccl_cover = ops.cover;
    s.gpu = ops
        .gpu
        .into_iter()
        .map(|(op, (mut g, mut dur, mut queue))| {
            g.median_ns = median(&mut dur);
            g.launch_to_kernel_ns = median(&mut queue);
            (op, g)
        })
        .collect();
    s.calls = ops.calls;
    Ok(s)
}

fn rows<A>(files: &[(usize, A)]) -> usize {
    files.iter().map(|f| f.0).sum()
}

/// `s` with only what is known up to where reading stopped.
fn stopped(s: Summary) -> Summary {
    Summary {
        tables: s.tables,
        stopped: s.stopped,
        ..Summary::default()
    }
}
