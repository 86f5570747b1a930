//! Offline analysis of a run directory: every op's phases on every rank, joined across
//! ranks, with host clocks aligned ([`analyze`]); the report built on it lives in
//! [`report`].

pub mod clock;
pub mod diff;
pub mod export;
pub mod phases;
pub mod report;
pub mod scan;
pub mod summary;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;

use crate::reader::{self, ReadError, Skipped};
use phases::{Cuts, Phases};

/// One ops row, with what the analysis needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpView {
    /// Index into [`Run::hosts`].
    pub host: usize,
    pub pid: i32,
    pub op_id: u64,
    /// NCCL function name (`ops.op`), "unknown" for a name this zcta does not know.
    pub op: &'static str,
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
    /// `ops.gpu_ready_ns`: when the op's stream was free for it.
    pub ready: Option<i64>,
    pub gpu_start: Option<i64>,
    pub gpu_end: Option<i64>,
    /// `ops.engine`; `None`: not measured (CUPTI off).
    pub engine: Option<&'static str>,
    /// `ops.timing` (an unknown value: "other"); `None` in files written before it.
    pub timing: Option<&'static str>,
    /// How many ops this row stands for in a report's aggregates, in
    /// [`scan::ONE_OP`] units: for an op whose GPU side comes from stamps the budget
    /// chose it for, its stratum's ops the budget drew from over those it timed (one
    /// process, level, op name and size bucket: the hash picks 1 op in 2^level, the
    /// rate limiter skips some of those); one op otherwise (every op of deep mode has
    /// CUPTI's times).
    pub weight: u64,
}

impl OpView {
    /// Where the op's GPU side begins ([`phases::gpu_begin`]): its first kernel (deep
    /// mode), else when its stream was free after NCCL's launch (stamps). `None`
    /// without a GPU end too: an op whose GPU side did not end on record was not
    /// measured, whatever else its row holds (its begin must not count as a rank's
    /// arrival either).
    pub fn gpu_begin(&self) -> Option<i64> {
        self.gpu_end?;
        phases::gpu_begin(self.gpu_start, self.ready, self.launch)
    }

    /// A local op: a Send/Recv of a rank to itself, or an op on a one-rank
    /// communicator (NCCL's one-rank shortcuts). Its bytes are copied within one GPU,
    /// not over a link, and no other rank takes part.
    pub fn is_local(&self) -> bool {
        self.nranks == Some(1)
            || (matches!(self.op, "Send" | "Recv") && self.peer.is_some() && self.peer == self.rank)
    }
}

/// The op a report groups by: `ncclBcast` is `ncclBroadcast` in place, one op to a
/// user (`ops.op` keeps the API name that was called).
pub fn report_op(op: &'static str) -> &'static str {
    if op == "Bcast" { "Broadcast" } else { op }
}

/// `ops.op` as a static name.
pub fn op_name(s: &str) -> &'static str {
    crate::nccl::OpKind::from_name(s).map_or("unknown", crate::nccl::OpKind::name)
}

/// `ops.timing` as a static name ("other" for a value this zcta does not write).
pub fn timing_name(s: &str) -> &'static str {
    use crate::record::Timing::*;
    [
        Off,
        Timed(0),
        Skipped(0),
        Captured,
        PoolEmpty,
        Error,
        Streams,
        InProgress,
    ]
    .into_iter()
    .map(|t| t.name())
    .find(|n| *n == s)
    .unwrap_or("other")
}

/// `ops.engine` as a static name.
pub fn engine_name(s: &str) -> &'static str {
    use crate::gpu::Engine::*;
    [SmKernel, SymmetricKernel, CopyEngine, ProxyMemcpy, None]
        .into_iter()
        .map(|e| e.name())
        .find(|n| *n == s)
        .unwrap_or("unknown")
}

/// One process row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcView {
    pub host: usize,
    pub pid: i32,
    pub env: HashMap<String, String>,
    pub cupti: Option<String>,
    /// `process.gpu_timing`: per-op CUDA-event timing (`None` in files written before
    /// it existed).
    pub gpu_timing: Option<String>,
    /// `process.gpu_sampling` and `process.ops_unsampled` (`ZCTA_SAMPLE`).
    pub gpu_sampling: Option<String>,
    pub ops_unsampled: Option<u64>,
    /// `process.ops_graph_captured`: ops captured into a CUDA graph (GPU side not
    /// measured).
    pub ops_graph_captured: Option<u64>,
    pub profiler_plugin: Option<String>,
    /// `process.plugin_comms`: communicators NCCL initialised our profiler plugin for.
    pub plugin_comms: u64,
    /// NCCL initialised our profiler plugin for at least one communicator.
    pub plugin_active: bool,
    /// `process.records_dropped`: records not written (`None`: unknown, a killed
    /// process).
    pub records_dropped: Option<u64>,
    /// `process.nccl_version`: `ncclGetVersion` of the NCCL it used (22809 = 2.28.9).
    pub nccl_version: Option<i32>,
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

/// GPU spans of proxy-thread copies by (host, pid, op_id or group id | 1<<63).
pub type ProxyCopies = HashMap<(usize, i32, u64), Vec<(i64, i64)>>;

/// The small tables of a run (everything but `ops`, which is streamed by [`scan_ops`]).
#[derive(Debug, Default)]
pub struct Run {
    pub dir: PathBuf,
    pub hosts: Vec<String>,
    pub procs: Vec<ProcView>,
    pub windows: Vec<Window>,
    /// Proxy-thread copies by (host, pid, op key): op_id, or the group's id | 1<<63.
    pub proxy_copies: ProxyCopies,
    /// Network waits of NCCL's proxy steps (send: SendWait → stop; receive: RecvWait →
    /// flush/GPU wait or stop) by (host, pid, op_id).
    pub proxy_steps: ProxyCopies,
    /// Nodes per communicator as NCCL's plugin reported them.
    pub nccl_nodes: Vec<i32>,
    /// Files that could not be read, with the reason.
    pub skipped: Vec<Skipped>,
    /// Write-ahead logs not yet turned into Parquet (`zcta recover`).
    pub pending_logs: usize,
    /// (host, pid) pairs claimed by more than one process's files.
    pub shared_pids: Vec<reader::SharedPid>,
}

/// The end of the times a row of a run can hold: ns since the UNIX epoch up to 2^62
/// (the year 2116). Every `*_ns` value the analysis combines must lie in
/// `[0, MAX_TIME_NS)`: a value outside it is corrupt or foreign (the ends of i64 in a
/// damaged file), and the difference of two such times, or one less a difference,
/// would overflow. A row holding one is left out and named ([`LeftOut`]).
pub const MAX_TIME_NS: i64 = 1 << 62;

/// The end of the `ops.bytes` a call that succeeded can have moved: 2^62 bytes (4 EiB).
/// `bytes` is the size of one buffer of the call (nccl-tests' count: the larger of its
/// send and receive buffers), which no address space holds that large (today's 64-bit
/// machines address at most 2^57 bytes); a successful call's row with more is corrupt,
/// and is left out and named ([`LeftOut`]) rather than put in a size bucket. The bytes
/// of a call that returned anything else (an error, or ncclInProgress) are what its
/// caller asked for, whatever its count: they are kept.
pub const MAX_BYTES: u64 = 1 << 62;

/// The times of ops row `r` of a column view `c` (any view with the ops table's time
/// columns) that [`times_in_range`] judges: one list, so that a row is out of range by
/// the same rule in every command.
macro_rules! ops_times {
    ($c:expr, $r:expr) => {
        [
            Some($c.api_start_ns.value($r)),
            Some($c.api_end_ns.value($r)),
            $c.launch_ns.get($r),
            $c.gpu_ready_ns.get($r),
            $c.gpu_start_ns.get($r),
            $c.gpu_end_ns.get($r),
        ]
    };
}
pub(crate) use ops_times;

/// Judges ops row `r` of a column view `c` (any view with the ops table's time
/// columns, `bytes` and `result`) for `left_out` ([`LeftOut::keep_op`]): whether it is
/// kept. One rule for an ops row in every command.
macro_rules! keep_op {
    ($left_out:expr, $c:expr, $r:expr) => {
        $left_out.keep_op(
            &$crate::analysis::ops_times!($c, $r),
            $c.bytes.get($r),
            $c.result.value($r),
        )
    };
}
pub(crate) use keep_op;

/// The times of `gpu` row `r` of a column view `c` that [`times_in_range`] judges (those
/// any command uses: a proxy-thread copy's span in the phases, every row in `export`).
macro_rules! gpu_times {
    ($c:expr, $r:expr) => {
        [Some($c.start_ns.value($r)), Some($c.end_ns.value($r))]
    };
}
pub(crate) use gpu_times;

/// The times of `proxy` row `r` of a column view `c` that [`times_in_range`] judges
/// (those any command uses: an event's span in `export`, a ProxyStep's network waits in
/// the phases).
macro_rules! proxy_times {
    ($c:expr, $r:expr) => {
        [
            Some($c.start_ns.value($r)),
            $c.stop_ns.get($r),
            $c.send_wait_ns.get($r),
            $c.recv_wait_ns.get($r),
            $c.recv_flush_wait_ns.get($r),
            $c.recv_gpu_wait_ns.get($r),
        ]
    };
}
pub(crate) use proxy_times;

/// Whether every time present in `times` lies in `[0, MAX_TIME_NS)`.
pub fn times_in_range(times: &[Option<i64>]) -> bool {
    times.iter().flatten().all(|t| (0..MAX_TIME_NS).contains(t))
}

/// Whether an ops row's `bytes` can be real: below [`MAX_BYTES`], or of a call that did
/// not return ncclSuccess (`result` ≠ 0).
pub fn bytes_possible(bytes: Option<u64>, result: i32) -> bool {
    result != 0 || bytes.is_none_or(|b| b < MAX_BYTES)
}

/// The note for a file of which `rows` rows were left out for a time out of range
/// (`what`: "ops", "gpu", ...): listed with the skipped files, so the command names it
/// and exits 1.
pub fn out_of_range(path: PathBuf, rows: u64, what: &str) -> Skipped {
    Skipped {
        path,
        reason: format!(
            "{} left out: a time outside 1970..2116 (not in [0, 2^62) ns since the epoch: a corrupt or foreign value); its other rows were used",
            plural(rows, &format!("{what} row"), &format!("{what} rows"))
        ),
    }
}

/// The note for an ops file of which `rows` rows of calls that succeeded were left out
/// for bytes no call can move ([`MAX_BYTES`]), as [`out_of_range`]'s.
pub fn bytes_out_of_range(path: PathBuf, rows: u64) -> Skipped {
    Skipped {
        path,
        reason: format!(
            "{} left out: bytes of 2^62 (4 EiB) or more on a call that succeeded (larger than any buffer: a corrupt value); its other rows were used",
            plural(rows, "ops row", "ops rows")
        ),
    }
}

/// The rows of one file left out as damaged, by why: judged row by row ([`keep`],
/// [`keep_op`]) and named once the file is read ([`name`]). Every command reading a
/// table's rows judges them through it, so that a row is left out, and its file named,
/// by the same rule everywhere.
///
/// [`keep`]: LeftOut::keep
/// [`keep_op`]: LeftOut::keep_op
/// [`name`]: LeftOut::name
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeftOut {
    /// A time out of range ([`times_in_range`]).
    pub times: u64,
    /// Ops rows only: bytes a successful call cannot have moved ([`bytes_possible`]).
    pub bytes: u64,
    /// Ops rows only: a return before the call's entry (`api_end_ns < api_start_ns`).
    pub backwards: u64,
}

impl LeftOut {
    /// Whether a row with `times` is kept (every one in range); counted if not.
    pub fn keep(&mut self, times: &[Option<i64>]) -> bool {
        let ok = times_in_range(times);
        self.times += u64::from(!ok);
        ok
    }

    /// Whether an ops row is kept: its `times` ([`ops_times`]: API entry and return
    /// first) in range and the return not before the entry, and its `bytes` possible
    /// for its `result`; counted under the first reason it fails, if not.
    pub fn keep_op(&mut self, times: &[Option<i64>], bytes: Option<u64>, result: i32) -> bool {
        if !self.keep(times) {
            return false;
        }
        if let [Some(entry), Some(ret), ..] = times
            && ret < entry
        {
            self.backwards += 1;
            return false;
        }
        let ok = bytes_possible(bytes, result);
        self.bytes += u64::from(!ok);
        ok
    }

    /// Adds to `skipped` a note per reason rows of the file at `path` (of table `what`)
    /// were left out ([`out_of_range`], [`bytes_out_of_range`]), and starts over.
    pub fn name(&mut self, path: &Path, what: &str, skipped: &mut Vec<Skipped>) {
        let LeftOut {
            times,
            bytes,
            backwards,
        } = std::mem::take(self);
        if times > 0 {
            skipped.push(out_of_range(path.to_owned(), times, what));
        }
        if backwards > 0 {
            skipped.push(Skipped {
                path: path.to_owned(),
                reason: format!(
                    "{} left out: the call's return before its entry (api_end_ns < api_start_ns: a corrupt value); its other rows were used",
                    plural(backwards, "ops row", "ops rows")
                ),
            });
        }
        if bytes > 0 {
            skipped.push(bytes_out_of_range(path.to_owned(), bytes));
        }
    }
}

/// Streams every complete file of `table` as [`reader::for_each_batch`] does (a batch
/// at a time, only `columns`; a file that breaks off part-way is named, its earlier
/// batches used), handing `f` each batch with the [`LeftOut`] of its file: the rows `f`
/// leaves out are named per file once it is read ([`LeftOut::name`]).
fn for_each_batch_judged(
    run_dir: &Path,
    table: &str,
    columns: &[&str],
    f: impl FnMut(&RecordBatch, &mut LeftOut),
) -> Result<reader::TableData, ReadError> {
    reader::for_each_batch_by_file(
        run_dir,
        table,
        columns,
        f,
        |path, mut left_out: LeftOut, skipped| left_out.name(path, table, skipped),
    )
}

/// "1 process", "2 processes": `n` with the word that fits it.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Median of `v` (the upper one of the two middle values), `None` when empty.
/// Sorts `v`.
pub fn median(v: &mut [i64]) -> Option<i64> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// Index of host name `h` in `hosts`, added when new.
pub(crate) fn intern(hosts: &mut Vec<String>, h: &str) -> usize {
    match hosts.iter().position(|x| x == h) {
        Some(i) => i,
        None => {
            hosts.push(h.to_owned());
            hosts.len() - 1
        }
    }
}

impl Run {
    fn host(&mut self, h: &str) -> usize {
        intern(&mut self.hosts, h)
    }
}

crate::read_view! {
    struct ProcessCols of process {
        host, pid, env_json, cupti, gpu_timing, gpu_sampling, ops_unsampled, ops_graph_captured,
        profiler_plugin, plugin_comms, records_dropped, nccl_version,
    }
}

crate::read_view! {
    struct CallsCols of calls { host, pid, call, result, comm_ptr, buff, size, flags }
}

crate::read_view! {
    struct GpuCols of gpu { host, pid, attribution, start_ns, end_ns, op_id, group_id }
}

crate::read_view! {
    struct ProxyCols of proxy {
        host, pid, event, op_id, start_ns, stop_ns, send_wait_ns, recv_wait_ns, recv_flush_wait_ns,
        recv_gpu_wait_ns,
    }
}

crate::read_view! {
    struct NcclCommsCols of nccl_comms { n_nodes }
}

/// The rows of one `process` batch; their hosts are interned in `hosts`.
pub(crate) fn procs_of(b: &RecordBatch, hosts: &mut Vec<String>) -> Vec<ProcView> {
    let Some(v) = ProcessCols::of(b) else {
        return Vec::new();
    };
    (0..v.rows)
        .map(|r| {
            let env = v
                .env_json
                .get(r)
                .and_then(|j| serde_json::from_str::<HashMap<String, serde_json::Value>>(j).ok())
                .map(|m| {
                    m.into_iter()
                        .map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
                        .collect()
                })
                .unwrap_or_default();
            let text = |c: &crate::tables::Col<crate::tables::kind::Utf8>| c.get(r).map(str::to_owned);
            let plugin_comms = v.plugin_comms.get(r).unwrap_or(0);
            ProcView {
                host: intern(hosts, v.host.value(r)),
                pid: v.pid.value(r),
                env,
                cupti: text(&v.cupti),
                gpu_timing: text(&v.gpu_timing),
                gpu_sampling: text(&v.gpu_sampling),
                ops_unsampled: v.ops_unsampled.get(r),
                ops_graph_captured: v.ops_graph_captured.get(r),
                profiler_plugin: text(&v.profiler_plugin),
                plugin_comms,
                plugin_active: v.profiler_plugin.get(r) == Some("zcta") && plugin_comms > 0,
                records_dropped: v.records_dropped.get(r),
                nccl_version: v.nccl_version.get(r),
            }
        })
        .collect()
}

/// Reads the small tables (process, calls, gpu proxy copies, proxy steps, nccl_comms).
/// Unreadable files are skipped and listed in [`Run::skipped`], and so are the gpu and
/// proxy files with rows left out for a time out of range ([`LeftOut`]); a missing or
/// empty run directory is an error.
pub fn load(run_dir: &Path) -> Result<Run, ReadError> {
    reader::check_run_dir(run_dir)?;
    let mut run = Run {
        dir: run_dir.to_owned(),
        shared_pids: reader::shared_pids(run_dir)?,
        ..Run::default()
    };
    let note = |run: &mut Run, d: &reader::TableData| {
        run.skipped.extend(d.skipped.iter().cloned());
        run.pending_logs += d.pending_logs.len();
    };
    let procs = reader::read_table(run_dir, "process")?;
    note(&mut run, &procs);
    for b in &procs.batches {
        run.procs.extend(procs_of(b, &mut run.hosts));
    }
    let calls = reader::read_table(run_dir, "calls")?;
    note(&mut run, &calls);
    for v in calls.batches.iter().filter_map(CallsCols::of) {
        for r in 0..v.rows {
            if v.call.value(r) != "CommWindowRegister" || v.result.value(r) != 0 {
                continue;
            }
            let (Some(comm), Some(buff), Some(size)) = (v.comm_ptr.get(r), v.buff.get(r), v.size.get(r))
            else {
                continue;
            };
            let host = run.host(v.host.value(r));
            run.windows.push(Window {
                host,
                pid: v.pid.value(r),
                comm_ptr: comm,
                buff,
                size,
                flags: v.flags.get(r).unwrap_or(0),
            });
        }
    }
    // The gpu and proxy tables can be as long as ops: streamed, only what is kept.
    // Every row is judged (not only those used), so that a file is named with the
    // same rows left out as `zcta export` names.
    let mut copies = ProxyCopies::default();
    let mut hosts = std::mem::take(&mut run.hosts);
    let gpu = for_each_batch_judged(run_dir, "gpu", GpuCols::COLUMNS, |b, left_out| {
        let Some(v) = GpuCols::of(b) else { return };
        for r in 0..v.rows {
            if !left_out.keep(&gpu_times!(v, r)) || v.attribution.value(r) != "proxy_window" {
                continue;
            }
            let key = match (v.op_id.get(r), v.group_id.get(r)) {
                (_, Some(g)) => crate::gpu::GROUP_BIT | g,
                (Some(op), None) => op,
                (None, None) => continue,
            };
            let h = intern(&mut hosts, v.host.value(r));
            copies
                .entry((h, v.pid.value(r), key))
                .or_default()
                .push((v.start_ns.value(r), v.end_ns.value(r)));
        }
    })?;
    let mut steps = ProxyCopies::default();
    let px = for_each_batch_judged(run_dir, "proxy", ProxyCols::COLUMNS, |b, left_out| {
        let Some(v) = ProxyCols::of(b) else { return };
        for r in 0..v.rows {
            if !left_out.keep(&proxy_times!(v, r)) || v.event.value(r) != "ProxyStep" {
                continue;
            }
            let Some(op) = v.op_id.get(r) else {
                continue;
            };
            let stop = v.stop_ns.get(r);
            let mut spans = Vec::new();
            if let (Some(s), Some(e)) = (v.send_wait_ns.get(r), stop) {
                spans.push((s, e));
            }
            if let Some(s) = v.recv_wait_ns.get(r)
                && let Some(e) = v.recv_flush_wait_ns.get(r).or(v.recv_gpu_wait_ns.get(r)).or(stop)
            {
                spans.push((s, e));
            }
            if spans.is_empty() {
                continue;
            }
            let h = intern(&mut hosts, v.host.value(r));
            steps.entry((h, v.pid.value(r), op)).or_default().extend(spans);
        }
    })?;
    run.hosts = hosts;
    run.proxy_copies = copies;
    run.proxy_steps = steps;
    note(&mut run, &gpu);
    note(&mut run, &px);
    let nc = reader::read_table(run_dir, "nccl_comms")?;
    note(&mut run, &nc);
    for v in nc.batches.iter().filter_map(NcclCommsCols::of) {
        run.nccl_nodes.extend((0..v.rows).map(|r| v.n_nodes.value(r)));
    }
    // The logs of the tables read neither here nor by the ops scan count as pending
    // too: `zcta recover` turns every one of them into Parquet.
    for t in crate::tables::ALL_TABLES {
        if !["process", "calls", "gpu", "proxy", "nccl_comms", "ops"].contains(&t) {
            run.pending_logs += reader::list_files(run_dir, t).map_or(0, |l| l.logs.len());
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

/// What a scan found besides the per-op phases.
#[derive(Debug, Default)]
pub struct ScanStats {
    /// Parallel to `Run::hosts`.
    pub clocks: Vec<Option<clock::HostClock>>,
    pub stragglers: Vec<Straggler>,
    /// Collectives/pairs without a barrier: some rank's rows are not in the run
    /// directory, or some rank has no GPU start.
    pub incomplete: u64,
    /// Of those, the ones whose ranks' rows were all there with GPU times on some ranks
    /// only (under `ZCTA_SAMPLE`: the ranks' hosts called it in different windows).
    pub gpu_on_some_ranks: u64,
    /// Collectives/pairs with every rank's rows and GPU times on none: not timed
    /// (`ops.timing` of their first row says why; "unknown": files from before the
    /// column), not lacking data; how many per reason.
    pub not_timed_why: std::collections::BTreeMap<&'static str, u64>,
    /// Local operations ([`OpView::is_local`]) with GPU times on none of their rows:
    /// neither lacking a rank nor necessarily skipped by the budget (a one-rank
    /// shortcut may launch no GPU work).
    pub local_without_gpu: u64,
    /// Median over collectives seen on every rank of the spread of their calls' start
    /// (latest − earliest `api_start_ns`, host clocks aligned), ns: how far apart the
    /// ranks' hosts ran. `None` without such collectives.
    pub host_spread_ns: Option<i64>,
}

impl ScanStats {
    /// Collectives/pairs with every rank's rows and GPU times on none
    /// ([`ScanStats::not_timed_why`], whatever the reason).
    pub fn not_timed(&self) -> u64 {
        self.not_timed_why.values().sum()
    }
}

/// Rows read to estimate host clocks (the first ones in time order; one offset per
/// host for the whole run: drift during the run is not modelled).
const CLOCK_ROWS: u64 = 4_000_000;

/// Streams every ops row of the run through the phase model: `visit` gets each op
/// with its phases (see docs/phases.md). Memory stays bounded by the operations in
/// flight across ranks, not by the run's size (two passes when several hosts need
/// their clocks aligned). Files that cannot be read are added to `run.skipped`.
pub fn scan_ops(
    run: &mut Run,
    mut visit: impl FnMut(&OpView, &Phases, &str),
) -> Result<ScanStats, ReadError> {
    let listing = reader::list_files(&run.dir, "ops")?;
    run.pending_logs += listing.logs.len();
    run.skipped.extend(listing.skipped);
    let streams = scan::streams_of(listing.parquet);
    if run.hosts.len() < 2 {
        // The other tables name no second host (or are missing): the ops files may.
        scan::hosts_of(&streams, &mut run.hosts);
    }
    let several_hosts = run.hosts.len() > 1;
    // Pass 1: host clocks (only when there is more than one host), from the first
    // CLOCK_ROWS rows.
    let mut clocks: Vec<Option<clock::HostClock>> = vec![None; run.hosts.len().max(1)];
    if several_hosts {
        let mut pairs = clock::PairSamples::default();
        let mut skipped = Vec::new();
        scan::join(
            streams.clone(),
            run,
            &mut skipped,
            CLOCK_ROWS,
            |members, complete, _| {
                if complete && members.len() > 1 && members[0].peer.is_none() {
                    pairs.add(members.iter().filter_map(|o| o.gpu_end.map(|e| (o.host, e))));
                }
            },
        );
        clocks = pairs.estimate(run.hosts.len());
    } else if !run.hosts.is_empty() || clocks.is_empty() {
        clocks = vec![
            Some(clock::HostClock {
                offset_ns: 0,
                uncertainty_ns: 0,
                samples: 0
            });
            run.hosts.len().max(1)
        ];
    }
    // Pass 2: phases.
    let mut stats = ScanStats::default();
    type PerComm = (u64, HashMap<i32, (u64, Vec<i64>)>);
    let mut straggle: HashMap<u64, PerComm> = HashMap::new();
    let mut host_spread: Vec<i64> = Vec::new();
    let mut skipped = Vec::new();
    let mut hosts_seen = run.hosts.len();
    let copies = std::mem::take(&mut run.proxy_copies);
    let steps = std::mem::take(&mut run.proxy_steps);
    let plugin: std::collections::HashSet<(usize, i32)> = run
        .procs
        .iter()
        .filter(|p| p.plugin_active)
        .map(|p| (p.host, p.pid))
        .collect();
    let mut names: Vec<std::sync::Arc<str>> = Vec::new();
    scan::join(
        streams,
        run,
        &mut skipped,
        u64::MAX,
        |members, complete, hosts| {
            if members.iter().any(|o| o.host >= names.len()) {
                let h = hosts.lock().unwrap_or_else(|p| p.into_inner());
                names = h.iter().map(|n| std::sync::Arc::from(n.as_str())).collect();
            }
            hosts_seen = hosts_seen.max(members.iter().map(|o| o.host + 1).max().unwrap_or(0));
            let offset = |h: usize| clocks.get(h).copied().flatten().map(|c| c.offset_ns);
            let mut last: Option<i64> = None;
            let grouped = complete || members.len() > 1 || op_key(&members[0]).is_some();
            if complete && members.len() > 1 && members[0].peer.is_none() && host_spread.len() < 100_000 {
                // Checked: a host's clock offset is a difference of its times, chained
                // through other hosts' (times themselves are in range: scan.rs).
                let calls: Vec<i64> = members
                    .iter()
                    .filter_map(|o| o.api_start.checked_sub(offset(o.host)?))
                    .collect();
                if calls.len() == members.len() {
                    let (lo, hi) = (calls.iter().min(), calls.iter().max());
                    if let (Some(lo), Some(hi)) = (lo, hi)
                        && let Some(spread) = hi.checked_sub(*lo)
                    {
                        host_spread.push(spread);
                    }
                }
            }
            let mut timed_nowhere = false;
            // Every rank of a local op is here: no rank can be missing.
            let local = members.iter().all(OpView::is_local);
            if complete {
                let starts: Vec<(i64, i32)> = members
                    .iter()
                    .filter_map(|o| Some((o.gpu_begin()?.checked_sub(offset(o.host)?)?, o.rank?)))
                    .collect();
                if !starts.is_empty() && starts.len() < members.len() && !local {
                    stats.gpu_on_some_ranks += 1;
                }
                timed_nowhere = starts.is_empty();
                // A local op's barrier is known once one row has GPU times: a rank's
                // Send to itself and its Recv may be carried by one copy, timed on one
                // of them only.
                if starts.len() == members.len() || (local && !starts.is_empty()) {
                    let (latest, last_rank) = starts.iter().copied().max().expect("non-empty");
                    let earliest = starts.iter().map(|s| s.0).min().expect("non-empty");
                    last = Some(latest);
                    if members[0].peer.is_none() && members.len() > 1 {
                        let e = straggle.entry(members[0].comm_id.unwrap_or(0)).or_default();
                        e.0 += 1;
                        if latest > earliest {
                            let r = e.1.entry(last_rank).or_default();
                            r.0 += 1;
                            if r.1.len() < 100_000
                                && let Some(wait) = latest.checked_sub(earliest)
                            {
                                r.1.push(wait);
                            }
                        }
                    }
                }
            }
            if grouped && last.is_none() {
                if local {
                    if members.iter().all(|o| o.gpu_begin().is_none()) {
                        stats.local_without_gpu += 1;
                    }
                } else if timed_nowhere {
                    let why = members.first().and_then(|o| o.timing).unwrap_or("unknown");
                    *stats.not_timed_why.entry(why).or_default() += 1;
                } else {
                    stats.incomplete += 1;
                }
            }
            for o in members {
                let last_start = last.and_then(|l| l.checked_add(offset(o.host)?));
                let p = phases_of(
                    o,
                    last_start,
                    &copies,
                    plugin.contains(&(o.host, o.pid)).then_some(&steps),
                );
                let host = names.get(o.host).map_or("", |n| &**n);
                visit(o, &p, host);
            }
        },
    );
    run.proxy_copies = copies;
    run.proxy_steps = steps;
    run.skipped.extend(skipped);
    let mut stragglers: Vec<Straggler> = straggle
        .into_iter()
        .map(|(comm_id, (n, by))| {
            let mut last: Vec<(i32, u64, i64)> = by
                .into_iter()
                .map(|(r, (c, mut w))| {
                    // A rank is here only once it was last with a wait: w has one.
                    (r, c, median(&mut w).unwrap_or(0))
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
    stats.stragglers = stragglers;
    stats.host_spread_ns = median(&mut host_spread);
    clocks.resize(hosts_seen.max(run.hosts.len()), None);
    stats.clocks = clocks;
    Ok(stats)
}

/// Key of one operation across ranks: collectives by (comm_id, seq); a Send and its
/// Recv by (comm_id, seq, sender, receiver).
pub(crate) fn op_key(o: &OpView) -> Option<(u64, u64, i32, i32)> {
    let (comm, seq, rank) = (o.comm_id?, o.seq?, o.rank?);
    if o.result != 0 {
        return None;
    }
    match o.op {
        "Send" => Some((comm, seq, rank, o.peer?)),
        "Recv" => Some((comm, seq, o.peer?, rank)),
        _ => Some((comm, seq, -1, -1)),
    }
}

/// `steps`: the proxy steps, when the op's process ran the profiler plugin.
fn phases_of(
    o: &OpView,
    last_start: Option<i64>,
    copies: &ProxyCopies,
    steps: Option<&ProxyCopies>,
) -> Phases {
    let mut cuts = Cuts {
        api_start: o.api_start,
        // Timed with stamps and no launch reported (a call that launched nothing,
        // NCCL's events off): NCCL's host work is the whole call.
        launch: o.launch.or_else(|| o.gpu_start.is_none().then_some(o.api_end)),
        ready: o.ready,
        gpu_start: o.gpu_start,
        gpu_end: o.gpu_end,
        last_start,
        memcpy: None,
        proxy: None,
    };
    // Copies and proxy steps are measured over what follows the barrier.
    let rest = phases::gpu_cuts(&cuts).and_then(|(_, b, e)| Some((b?, e)));
    let covered = |spans: Option<&Vec<(i64, i64)>>, (b, e): (i64, i64)| {
        spans.map_or(0, |v| phases::covered(&mut v.clone(), b, e))
    };
    cuts.memcpy = match o.engine {
        None => None,
        Some("copy_engine") => Some(0), // the copies are the transfer
        Some(_) => {
            let key = o.group_id.map_or(o.op_id, |g| crate::gpu::GROUP_BIT | g);
            Some(rest.map_or(0, |r| covered(copies.get(&(o.host, o.pid, key)), r)))
        }
    };
    cuts.proxy = match (o.gpu_begin(), o.gpu_end, steps) {
        (Some(_), Some(_), Some(steps)) => {
            Some(rest.map_or(0, |r| covered(steps.get(&(o.host, o.pid, o.op_id)), r)))
        }
        _ => None,
    };
    phases::split(&cuts)
}

/// Writes the `phases` table of the run (`RUN/phases/`), replacing an earlier one.
/// Returns the rows written.
///
/// Nothing the user may own is lost: the table is written in a staging directory of
/// its own first (`RUN/.zcta-phases-<pid>/`); with no ops rows to write it is an
/// error and `RUN/phases` is not touched. An earlier `RUN/phases` is replaced only
/// when it is a plain directory holding nothing but files of zcta's phases table
/// ([`is_own_phases_file`]); a link, a file, or a directory with anything else in it
/// is an error naming it, and stays as it was.
pub fn write_phases(run: &mut Run) -> Result<u64, WritePhasesError> {
    let dir = run.dir.join("phases");
    // Refused before any work, and again before the swap (it may change meanwhile).
    check_replaceable(&dir)?;
    let staging = run.dir.join(format!(".zcta-phases-{}", std::process::id()));
    // Ours only if this call made it (a leftover of a killed run with the same pid
    // is not removed: it is named).
    std::fs::create_dir(&staging).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => WritePhasesError::Leftover(staging.clone()),
        _ => WritePhasesError::Io(staging.clone(), e),
    })?;
    let written = write_phases_into(run, &staging);
    let fresh = staging.join("phases");
    let result = match written {
        Ok(0) => Err(WritePhasesError::NoOps),
        Ok(n) => check_replaceable(&dir)
            .and_then(|had_old| swap_in(&fresh, &dir, had_old, &staging))
            .map(|()| n),
        Err(e) => Err(e),
    };
    remove_own_phases_files(&fresh);
    let _ = std::fs::remove_dir(&fresh);
    let _ = std::fs::remove_dir(&staging);
    result
}

/// The rows of the run's `phases` table, written under `base/phases/`.
fn write_phases_into(run: &mut Run, base: &std::path::Path) -> Result<u64, WritePhasesError> {
    let ctx = crate::tables::Ctx {
        pid: 0,
        host: "".into(),
    };
    let mut w = crate::sink::DatasetWriter::<crate::tables::PhasesTable>::new(
        base,
        "phases",
        crate::sink::SinkPolicy::default(),
    );
    let mut err = None;
    let mut host: std::sync::Arc<str> = "".into();
    let mut n = 0u64;
    scan_ops(run, |o, p, h| {
        if err.is_some() {
            return;
        }
        if &*host != h {
            host = h.into();
        }
        let row = crate::tables::phases::PhaseRow {
            host: host.clone(),
            pid: o.pid,
            op_id: o.op_id,
            op: o.op,
            rank: o.rank,
            comm_id: o.comm_id,
            seq: o.seq,
            bytes: o.bytes,
            engine: o.engine,
            window: p.window,
            phases: phases::Phase::ALL.map(|ph| p.get(ph)),
        };
        match w.append(&row, &ctx) {
            Ok(()) => n += 1,
            Err(e) => err = Some(e),
        }
    })
    .map_err(WritePhasesError::Read)?;
    if let Some(e) = err {
        return Err(WritePhasesError::Write(e));
    }
    w.close().map_err(WritePhasesError::Write)?;
    // A Parquet file that could not be written (a full disk) leaves its rows in a log
    // only: not a table to replace the earlier one with.
    if w.logs_kept() {
        return Err(match w.take_notice() {
            Some(e) => WritePhasesError::Write(e),
            None => WritePhasesError::Incomplete(base.join("phases")),
        });
    }
    Ok(n)
}

/// Whether `name` is one of the files zcta's phases table is made of: its Parquet
/// files (`phases-NNNNN.parquet`, whose footer must also say table `phases`), and the
/// write-ahead logs and temporary files beside them (`_phases-NNNNN.wal`: an Arrow
/// stream of the phases table's columns; `_phases-NNNNN.parquet.tmp`: a complete
/// Parquet file of table `phases`). A file that only has such a name is not proven
/// zcta's, and is neither replaced nor removed.
fn is_own_phases_file(path: &std::path::Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let segment = |s: &str| s.len() >= 5 && s.bytes().all(|b| b.is_ascii_digit());
    let regular = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file());
    if !regular {
        return false;
    }
    if let Some(n) = name.strip_prefix("_phases-") {
        if n.strip_suffix(".wal").is_some_and(segment) {
            return is_phases_log(path);
        }
        return n.strip_suffix(".parquet.tmp").is_some_and(segment)
            && crate::reader::parquet_table(path).as_deref() == Some("phases");
    }
    name.strip_prefix("phases-")
        .and_then(|n| n.strip_suffix(".parquet"))
        .is_some_and(segment)
        && crate::reader::parquet_table(path).as_deref() == Some("phases")
}

/// Whether the regular file at `path` is an Arrow stream whose schema has the phases
/// table's columns (how zcta's writer logs a phases segment).
fn is_phases_log(path: &std::path::Path) -> bool {
    match (
        crate::recover::log_schema(path),
        crate::tables::schema_of("phases"),
    ) {
        (Some(got), Some(want)) => got.fields() == want.fields(),
        _ => false,
    }
}

/// `Ok(false)`: no `dir` yet; `Ok(true)`: a directory holding only files of zcta's
/// phases table; otherwise the error that says why it is not replaced.
fn check_replaceable(dir: &std::path::Path) -> Result<bool, WritePhasesError> {
    let not = |why: String| WritePhasesError::NotOurs(dir.to_owned(), why);
    let m = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(WritePhasesError::Io(dir.to_owned(), e)),
    };
    if m.file_type().is_symlink() {
        return Err(not("it is a symbolic link".into()));
    }
    if !m.is_dir() {
        return Err(not("it is not a directory".into()));
    }
    for e in std::fs::read_dir(dir).map_err(|e| WritePhasesError::Io(dir.to_owned(), e))? {
        let p = e.map_err(|e| WritePhasesError::Io(dir.to_owned(), e))?.path();
        if !is_own_phases_file(&p) {
            return Err(not(format!(
                "it holds {}, which is not a file of a phases table this zcta wrote (another \
                 program's, damaged, or of a newer zcta)",
                p.display()
            )));
        }
    }
    Ok(true)
}

/// Puts the freshly written table `fresh` at `dir`, removing the earlier table
/// (`had_old`: there is one) once the new one is in place: only its files that are
/// still zcta's phases files.
fn swap_in(
    fresh: &std::path::Path,
    dir: &std::path::Path,
    had_old: bool,
    staging: &std::path::Path,
) -> Result<(), WritePhasesError> {
    let io = |p: &std::path::Path| {
        let p = p.to_owned();
        move |e| WritePhasesError::Io(p, e)
    };
    if !had_old {
        return std::fs::rename(fresh, dir).map_err(io(dir));
    }
    let retired = staging.join("earlier");
    std::fs::rename(dir, &retired).map_err(io(dir))?;
    if let Err(e) = std::fs::rename(fresh, dir) {
        // Put the earlier table back where it was.
        let _ = std::fs::rename(&retired, dir);
        return Err(io(dir)(e));
    }
    // Only what is (still) zcta's goes: a file put in the directory while this ran
    // stays, and the error says where it is now.
    let kept = remove_own_phases_files(&retired);
    if !kept.is_empty() {
        return Err(WritePhasesError::Moved {
            dir: dir.to_owned(),
            kept,
        });
    }
    std::fs::remove_dir(&retired).map_err(io(&retired))
}

/// Removes the files of zcta's phases table in `dir` ([`is_own_phases_file`]);
/// returns the other entries, which stay.
fn remove_own_phases_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut others = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if is_own_phases_file(&e.path()) {
                let _ = std::fs::remove_file(e.path());
            } else {
                others.push(e.path());
            }
        }
    }
    others
}

/// Errors of [`write_phases`].
#[derive(Debug, thiserror::Error)]
pub enum WritePhasesError {
    /// Reading the run failed.
    #[error(transparent)]
    Read(#[from] crate::reader::ReadError),
    /// Writing the table failed (before anything was replaced).
    #[error("{0}; nothing was changed")]
    Write(crate::sink::SinkError),
    /// A file system call failed.
    #[error("{0}: {1}")]
    Io(std::path::PathBuf, std::io::Error),
    /// No ops rows to write a table of (nothing was changed).
    #[error("no ops rows to write phases of; nothing was changed")]
    NoOps,
    /// The path where the table goes holds something zcta did not write.
    #[error("{0} is not replaced: {1}; move it away and run again")]
    NotOurs(std::path::PathBuf, String),
    /// The staging directory exists: left by a `zcta phases` that was killed (or one
    /// running now with the same pid in another pid namespace).
    #[error(
        "{0} exists: a `zcta phases` of the same process id left it (killed?) or is running; \
         remove it if none runs, and run again"
    )]
    Leftover(std::path::PathBuf),
    /// The new table's Parquet file could not be written; its rows are in a log only.
    #[error("{0}: the table could not be written completely; the earlier one is kept")]
    Incomplete(std::path::PathBuf),
    /// Files appeared in the earlier table's directory while the new one was written:
    /// the new table is in place, and they were kept where the earlier table went.
    #[error(
        "the new table is in {}, but files that appeared there meanwhile were not removed; \
         they are now at: {}",
        dir.display(),
        kept.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    Moved {
        dir: std::path::PathBuf,
        kept: Vec<std::path::PathBuf>,
    },
}
