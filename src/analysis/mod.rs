//! Offline analysis of a run directory: every op's phases on every rank, joined across
//! ranks, with host clocks aligned ([`analyze`]); the report built on it lives in
//! [`report`].

pub mod clock;
pub mod diff;
pub mod phases;
pub mod report;

use std::collections::HashMap;
use std::path::Path;

use arrow_array::{Array, Int32Array, Int64Array, RecordBatch, StringArray, UInt64Array};

use crate::reader::{self, ReadError, Skipped};
use phases::{Cuts, Phases};

/// One ops row, with what the analysis needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpView {
    /// Index into [`Run::hosts`].
    pub host: usize,
    pub pid: i32,
    pub op_id: u64,
    pub op: String,
    pub comm_id: Option<u64>,
    pub comm_ptr: u64,
    pub seq: Option<u64>,
    pub rank: Option<i32>,
    pub nranks: Option<i32>,
    pub peer: Option<i32>,
    pub bytes: Option<u64>,
    pub sendbuff: u64,
    pub recvbuff: u64,
    pub stream: u64,
    pub group_id: Option<u64>,
    pub result: i32,
    pub api_start: i64,
    pub api_end: i64,
    pub launch: Option<i64>,
    pub gpu_start: Option<i64>,
    pub gpu_end: Option<i64>,
    /// `ops.engine`; `None`: not measured (CUPTI off).
    pub engine: Option<String>,
}

/// One process row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcView {
    pub host: usize,
    pub pid: i32,
    pub env: HashMap<String, String>,
    pub cupti: Option<String>,
    pub profiler_plugin: Option<String>,
}

/// A registered memory window (`ncclCommWindowRegister` that succeeded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub host: usize,
    pub pid: i32,
    pub comm_ptr: u64,
    pub buff: u64,
    pub size: u64,
    pub flags: i32,
}

/// What a run directory holds, in the analysis's terms.
#[derive(Debug, Default)]
pub struct Run {
    pub hosts: Vec<String>,
    pub ops: Vec<OpView>,
    pub procs: Vec<ProcView>,
    pub windows: Vec<Window>,
    /// Proxy-thread copies by (host, pid, op key): op_id, or the group's id | 1<<63.
    pub proxy_copies: HashMap<(usize, i32, u64), Vec<(i64, i64)>>,
    /// Nodes per communicator as NCCL's plugin reported them, by (host, pid, comm hash).
    pub nccl_nodes: Vec<i32>,
    /// Files that could not be read, with the reason.
    pub skipped: Vec<Skipped>,
    /// Write-ahead logs not yet turned into Parquet (`zcta recover`).
    pub pending_logs: usize,
}

fn col<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Option<&'a T> {
    b.column_by_name(name)?.as_any().downcast_ref::<T>()
}
fn opt_i64(a: Option<&Int64Array>, i: usize) -> Option<i64> {
    a.filter(|a| !a.is_null(i)).map(|a| a.value(i))
}
fn opt_u64(a: Option<&UInt64Array>, i: usize) -> Option<u64> {
    a.filter(|a| !a.is_null(i)).map(|a| a.value(i))
}
fn opt_i32(a: Option<&Int32Array>, i: usize) -> Option<i32> {
    a.filter(|a| !a.is_null(i)).map(|a| a.value(i))
}
fn opt_str(a: Option<&StringArray>, i: usize) -> Option<String> {
    a.filter(|a| !a.is_null(i)).map(|a| a.value(i).to_owned())
}

fn host_index(hosts: &mut Vec<String>, h: &str) -> usize {
    match hosts.iter().position(|x| x == h) {
        Some(i) => i,
        None => {
            hosts.push(h.to_owned());
            hosts.len() - 1
        }
    }
}

/// Reads the tables the analysis needs. Unreadable files are skipped and listed in
/// [`Run::skipped`]; a missing or empty run directory is an error.
pub fn load(run_dir: &Path) -> Result<Run, ReadError> {
    reader::check_run_dir(run_dir)?;
    let mut run = Run::default();
    let note = |run: &mut Run, d: &reader::TableData| {
        run.skipped.extend(d.skipped.iter().cloned());
        run.pending_logs += d.pending_logs.len();
    };
    let ops = reader::read_table(run_dir, "ops")?;
    note(&mut run, &ops);
    for b in &ops.batches {
        let host = col::<StringArray>(b, "host");
        let (Some(host), Some(pid), Some(op_id), Some(op), Some(start), Some(end)) = (
            host,
            col::<Int32Array>(b, "pid"),
            col::<UInt64Array>(b, "op_id"),
            col::<StringArray>(b, "op"),
            col::<Int64Array>(b, "api_start_ns"),
            col::<Int64Array>(b, "api_end_ns"),
        ) else {
            continue;
        };
        let u = |n| col::<UInt64Array>(b, n);
        let i = |n| col::<Int32Array>(b, n);
        let l = |n| col::<Int64Array>(b, n);
        for r in 0..b.num_rows() {
            let h = host_index(&mut run.hosts, host.value(r));
            run.ops.push(OpView {
                host: h,
                pid: pid.value(r),
                op_id: op_id.value(r),
                op: op.value(r).to_owned(),
                comm_id: opt_u64(u("comm_id"), r),
                comm_ptr: opt_u64(u("comm_ptr"), r).unwrap_or(0),
                seq: opt_u64(u("seq"), r),
                rank: opt_i32(i("rank"), r),
                nranks: opt_i32(i("nranks"), r),
                peer: opt_i32(i("peer"), r),
                bytes: opt_u64(u("bytes"), r),
                sendbuff: opt_u64(u("sendbuff"), r).unwrap_or(0),
                recvbuff: opt_u64(u("recvbuff"), r).unwrap_or(0),
                stream: opt_u64(u("stream"), r).unwrap_or(0),
                group_id: opt_u64(u("group_id"), r),
                result: opt_i32(i("result"), r).unwrap_or(0),
                api_start: start.value(r),
                api_end: end.value(r),
                launch: opt_i64(l("launch_ns"), r),
                gpu_start: opt_i64(l("gpu_start_ns"), r),
                gpu_end: opt_i64(l("gpu_end_ns"), r),
                engine: opt_str(col::<StringArray>(b, "engine"), r),
            });
        }
    }
    let procs = reader::read_table(run_dir, "process")?;
    note(&mut run, &procs);
    for b in &procs.batches {
        let (Some(host), Some(pid)) = (col::<StringArray>(b, "host"), col::<Int32Array>(b, "pid")) else {
            continue;
        };
        for r in 0..b.num_rows() {
            let env = opt_str(col::<StringArray>(b, "env_json"), r)
                .and_then(|j| serde_json::from_str::<HashMap<String, serde_json::Value>>(&j).ok())
                .map(|m| {
                    m.into_iter()
                        .map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
                        .collect()
                })
                .unwrap_or_default();
            run.procs.push(ProcView {
                host: host_index(&mut run.hosts, host.value(r)),
                pid: pid.value(r),
                env,
                cupti: opt_str(col::<StringArray>(b, "cupti"), r),
                profiler_plugin: opt_str(col::<StringArray>(b, "profiler_plugin"), r),
            });
        }
    }
    let calls = reader::read_table(run_dir, "calls")?;
    note(&mut run, &calls);
    for b in &calls.batches {
        let (Some(host), Some(pid), Some(call), Some(result)) = (
            col::<StringArray>(b, "host"),
            col::<Int32Array>(b, "pid"),
            col::<StringArray>(b, "call"),
            col::<Int32Array>(b, "result"),
        ) else {
            continue;
        };
        for r in 0..b.num_rows() {
            if call.value(r) != "CommWindowRegister" || result.value(r) != 0 {
                continue;
            }
            let (Some(comm), Some(buff), Some(size)) = (
                opt_u64(col::<UInt64Array>(b, "comm_ptr"), r),
                opt_u64(col::<UInt64Array>(b, "buff"), r),
                opt_u64(col::<UInt64Array>(b, "size"), r),
            ) else {
                continue;
            };
            run.windows.push(Window {
                host: host_index(&mut run.hosts, host.value(r)),
                pid: pid.value(r),
                comm_ptr: comm,
                buff,
                size,
                flags: opt_i32(col::<Int32Array>(b, "flags"), r).unwrap_or(0),
            });
        }
    }
    let gpu = reader::read_table(run_dir, "gpu")?;
    note(&mut run, &gpu);
    for b in &gpu.batches {
        let (Some(host), Some(pid), Some(how), Some(s), Some(e)) = (
            col::<StringArray>(b, "host"),
            col::<Int32Array>(b, "pid"),
            col::<StringArray>(b, "attribution"),
            col::<Int64Array>(b, "start_ns"),
            col::<Int64Array>(b, "end_ns"),
        ) else {
            continue;
        };
        for r in 0..b.num_rows() {
            if how.value(r) != "proxy_window" {
                continue;
            }
            let key = match (
                opt_u64(col::<UInt64Array>(b, "op_id"), r),
                opt_u64(col::<UInt64Array>(b, "group_id"), r),
            ) {
                (_, Some(g)) => crate::gpu::GROUP_BIT | g,
                (Some(op), None) => op,
                (None, None) => continue,
            };
            let h = host_index(&mut run.hosts, host.value(r));
            run.proxy_copies
                .entry((h, pid.value(r), key))
                .or_default()
                .push((s.value(r), e.value(r)));
        }
    }
    let nc = reader::read_table(run_dir, "nccl_comms")?;
    note(&mut run, &nc);
    for b in &nc.batches {
        if let Some(n) = col::<Int32Array>(b, "n_nodes") {
            run.nccl_nodes.extend((0..b.num_rows()).map(|r| n.value(r)));
        }
    }
    Ok(run)
}

/// Who made the others wait, per communicator.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Straggler {
    pub comm_id: u64,
    /// Collectives seen on every rank with GPU times.
    pub collectives: u64,
    /// (rank, times it started last, median of how long the first rank waited for it, ns)
    pub last: Vec<(i32, u64, i64)>,
}

/// Everything derived from a [`Run`].
#[derive(Debug, Default)]
pub struct Analysis {
    /// Parallel to `Run::ops`.
    pub phases: Vec<Phases>,
    /// Parallel to `Run::hosts`.
    pub clocks: Vec<Option<clock::HostClock>>,
    pub stragglers: Vec<Straggler>,
    /// Collectives/pairs whose ranks were not all in the run directory.
    pub incomplete: u64,
}

/// Key of one operation across ranks: collectives by (comm_id, seq); a Send and its
/// Recv by (comm_id, seq, sender, receiver).
fn op_key(o: &OpView) -> Option<(u64, u64, i32, i32)> {
    let (comm, seq, rank) = (o.comm_id?, o.seq?, o.rank?);
    if o.result != 0 {
        return None;
    }
    match o.op.as_str() {
        "Send" => Some((comm, seq, rank, o.peer?)),
        "Recv" => Some((comm, seq, o.peer?, rank)),
        _ => Some((comm, seq, -1, -1)),
    }
}

/// Computes every op's phases (see docs/phases.md).
pub fn analyze(run: &Run) -> Analysis {
    let mut groups: HashMap<(u64, u64, i32, i32), Vec<usize>> = HashMap::new();
    for (i, o) in run.ops.iter().enumerate() {
        if let Some(k) = op_key(o) {
            groups.entry(k).or_default().push(i);
        }
    }
    // Host clocks from collectives that span several hosts.
    let ends: Vec<Vec<(usize, i64)>> = groups
        .iter()
        .filter(|(k, _)| k.2 == -1)
        .filter_map(|(_, v)| {
            let e: Vec<(usize, i64)> = v
                .iter()
                .filter_map(|&i| run.ops[i].gpu_end.map(|e| (run.ops[i].host, e)))
                .collect();
            (e.iter().any(|x| x.0 != e[0].0)).then_some(e)
        })
        .collect();
    let clocks = clock::estimate(&ends, run.hosts.len());
    let offset = |h: usize| clocks.get(h).copied().flatten().map(|c| c.offset_ns);

    let mut last_start: Vec<Option<i64>> = vec![None; run.ops.len()];
    let mut incomplete = 0u64;
    // comm_id -> (complete collectives, rank -> (times last, waits it caused))
    type PerComm = (u64, HashMap<i32, (u64, Vec<i64>)>);
    let mut straggle: HashMap<u64, PerComm> = HashMap::new();
    for (k, members) in &groups {
        let o0 = &run.ops[members[0]];
        // A collective needs every rank; a Send needs its Recv (a rank may send to
        // itself: then both are on one rank).
        let complete = if k.2 == -1 {
            let mut ranks: Vec<i32> = members.iter().filter_map(|&i| run.ops[i].rank).collect();
            ranks.sort_unstable();
            ranks.dedup();
            ranks.len() >= o0.nranks.unwrap_or(0).max(1) as usize
        } else {
            members.iter().any(|&i| run.ops[i].op == "Send")
                && members.iter().any(|&i| run.ops[i].op == "Recv")
        };
        let want = if k.2 == -1 {
            o0.nranks.unwrap_or(0).max(1) as usize
        } else {
            2
        };
        // (start on the reference clock, rank) of every member with GPU times.
        let starts: Vec<(i64, i32)> = members
            .iter()
            .filter_map(|&i| {
                let o = &run.ops[i];
                Some((o.gpu_start? - offset(o.host)?, o.rank?))
            })
            .collect();
        if !complete || starts.len() < members.len() {
            incomplete += 1;
            continue;
        }
        let (latest, last_rank) = starts.iter().copied().max().expect("non-empty");
        let earliest = starts.iter().map(|s| s.0).min().expect("non-empty");
        for &i in members {
            let o = &run.ops[i];
            last_start[i] = offset(o.host).map(|off| latest + off);
        }
        if k.2 == -1 && want > 1 {
            let e = straggle.entry(k.0).or_default();
            e.0 += 1;
            // A tie makes nobody wait: nobody was last.
            if latest > earliest {
                let r = e.1.entry(last_rank).or_default();
                r.0 += 1;
                r.1.push(latest - earliest);
            }
        }
    }
    let phases = run
        .ops
        .iter()
        .zip(&last_start)
        .map(|(o, &last)| {
            let memcpy = match (o.engine.as_deref(), o.gpu_start, o.gpu_end) {
                (None, ..) => None,
                (Some("copy_engine"), ..) => Some(0), // the copies are the transfer
                (Some(_), Some(s), Some(e)) => {
                    let b = last.map_or(s, |l| l.clamp(s, e.max(s)));
                    let key = o.group_id.map_or(o.op_id, |g| crate::gpu::GROUP_BIT | g);
                    let mut spans = run
                        .proxy_copies
                        .get(&(o.host, o.pid, key))
                        .cloned()
                        .unwrap_or_default();
                    Some(phases::covered(&mut spans, b, e))
                }
                (Some(_), ..) => Some(0),
            };
            phases::split(&Cuts {
                api_start: o.api_start,
                launch: o.launch,
                gpu_start: o.gpu_start,
                gpu_end: o.gpu_end,
                last_start: last,
                memcpy,
            })
        })
        .collect();
    let mut stragglers: Vec<Straggler> = straggle
        .into_iter()
        .map(|(comm_id, (n, by))| {
            let mut last: Vec<(i32, u64, i64)> = by
                .into_iter()
                .map(|(r, (c, mut w))| {
                    w.sort_unstable();
                    (r, c, w[w.len() / 2])
                })
                .collect();
            last.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            Straggler {
                comm_id,
                collectives: n,
                last,
            }
        })
        .collect();
    stragglers.sort_by_key(|s| std::cmp::Reverse(s.collectives));
    Analysis {
        phases,
        clocks,
        stragglers,
        incomplete,
    }
}
