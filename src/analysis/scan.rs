//! Streaming the `ops` table: one reader per process (its segment files in order, a
//! batch at a time, only the columns the analysis uses), merged by API start time so
//! that the ranks of one operation arrive close together, and joined across ranks in
//! a window of pending operations. Memory is bounded by that window (operations in
//! flight between the fastest and slowest rank), never by the run's size.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Mutex;

use arrow_array::RecordBatch;

use super::{OpView, Run, engine_name, op_key, op_name};
use crate::reader::{self, Skipped};
use crate::tables;

crate::read_view! {
    /// The columns of `ops` the analysis reads, of one batch.
    pub struct OpsRead of ops {
        host, pid, op_id, op, comm_id, comm_ptr, seq, rank, nranks, peer, bytes, sendbuff,
        recvbuff, stream, group_id, result, api_start_ns, api_end_ns, launch_ns, gpu_ready_ns,
        gpu_start_ns, gpu_end_ns, engine, timing, timing_level, gpu_source,
    }
}

/// Columns of `ops` the analysis reads.
pub const OPS_COLUMNS: &[&str] = OpsRead::COLUMNS;

crate::read_view! {
    /// The columns of `ops` that say which ops the budget drew its timed ops from.
    struct BudgetRead of ops { op, bytes, timing, timing_level, gpu_source }
}

/// [`OpView::weight`] of an op that stands for itself: 1 op, in the weights' fixed
/// point (a timed op of a budget's stratum stands for a fraction of ops more or less).
pub const ONE_OP: u64 = 1 << 10;

/// A budget's stratum: the ops of one process, one level, one op name and one size
/// bucket. The budget's hash picks 1 op in 2^level of them, and its rate limiter
/// skips some of those in a burst, so a timed op
/// stands for the stratum's ops over its timed ones, not for 2^level.
type Stratum = (u32, u64, &'static str);

/// Per stratum of one process's files: its ops the budget drew from (timed, or not
/// timed by the budget: `timing` budget, with its level) and those timed with per-op
/// GPU times. A file that cannot be read counts for nothing here (the scan names it).
fn budget_strata(files: &[PathBuf]) -> HashMap<Stratum, (u64, u64)> {
    let schema = tables::schema_of("ops").expect("ops table");
    let mut n: HashMap<Stratum, (u64, u64)> = HashMap::new();
    // Consecutive rows mostly repeat their op; counts per stratum are gathered in a
    // small list first (a process has few strata) and hashed once at the end.
    let mut last_op = (String::new(), "unknown");
    let mut seen: Vec<(Stratum, (u64, u64))> = Vec::new();
    for f in files {
        let Ok(batches) = reader::stream_file(f, &schema, BudgetRead::COLUMNS, BATCH_ROWS) else {
            continue;
        };
        for b in batches.map_while(Result::ok) {
            let Some(c) = BudgetRead::of(&b) else { continue };
            for r in 0..b.num_rows() {
                let (Some(level), Some(timing)) = (c.timing_level.get(r), c.timing.get(r)) else {
                    continue;
                };
                let timed = timing == "timed" && is_per_op_timing(c.gpu_source.get(r));
                if !(timed || timing == "budget") {
                    continue;
                }
                let bucket = super::report::size_bucket(c.bytes.get(r).unwrap_or(0));
                let v = c.op.value(r);
                if last_op.0 != v {
                    last_op = (v.to_owned(), op_name(v));
                }
                let key = (level, bucket, last_op.1);
                let i = match seen.iter().position(|(k, _)| *k == key) {
                    Some(i) => i,
                    None if seen.len() < 64 => {
                        seen.push((key, (0, 0)));
                        seen.len() - 1
                    }
                    None => {
                        let e = n.entry(key).or_default();
                        e.0 += 1;
                        e.1 += u64::from(timed);
                        continue;
                    }
                };
                let e = &mut seen[i].1;
                e.0 += 1;
                e.1 += u64::from(timed);
            }
        }
    }
    for (k, (drawn, timed)) in seen {
        let e = n.entry(k).or_default();
        e.0 += drawn;
        e.1 += timed;
    }
    n
}

/// What a timed op of a stratum with `drawn` ops, `timed` of them timed, stands for,
/// in [`ONE_OP`] units (at least one op).
fn stratum_weight(drawn: u64, timed: u64) -> u64 {
    let w = (drawn as f64 * ONE_OP as f64 / timed.max(1) as f64).round() as u64;
    w.max(ONE_OP)
}

/// Rows per batch read.
const BATCH_ROWS: usize = 64 * 1024;
/// A pending operation older than this many rows (in merge order) will not complete:
/// some rank's rows are missing. Its members are emitted as incomplete.
const EVICT_AFTER_ROWS: u64 = 2_000_000;

/// The ops files of a run, grouped per process (`<prefix>-<segment>.parquet`), each
/// group in segment order.
pub fn streams_of(files: Vec<PathBuf>) -> Vec<Vec<PathBuf>> {
    let mut by: std::collections::BTreeMap<String, Vec<PathBuf>> = Default::default();
    for f in files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let prefix = name
            .strip_suffix(".parquet")
            .and_then(|s| s.rsplit_once('-'))
            .map_or(name.clone(), |(p, _)| p.to_owned());
        by.entry(prefix).or_default().push(f);
    }
    by.into_values()
        .map(|mut v| {
            v.sort();
            v
        })
        .collect()
}

/// Adds to `hosts` the host of each process whose ops `streams` hold (a process's rows
/// all name its host; the first readable row of its first file says it): the run's
/// hosts when its other tables (process, calls, gpu, proxy) are missing, as after a
/// crash, so that several hosts still get their clocks aligned. A file that cannot be
/// read is passed over here; the scan names it.
pub fn hosts_of(streams: &[Vec<PathBuf>], hosts: &mut Vec<String>) {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    let schema = tables::schema_of("ops").expect("ops table");
    for files in streams {
        let first: Option<String> = files.iter().find_map(|f| {
            let mut batches = reader::stream_file(f, &schema, &["host"], 1).ok()?;
            let b = batches.find_map(|b| b.ok().filter(|b| b.num_rows() > 0))?;
            let col = b.column_by_name("host")?.as_string_opt::<i32>()?;
            col.is_valid(0).then(|| col.value(0).to_string())
        });
        if let Some(h) = first {
            super::intern(hosts, &h);
        }
    }
}

type Batches = Box<dyn Iterator<Item = Result<RecordBatch, String>> + Send>;

/// One process's rows, in file order.
struct Stream {
    files: VecDeque<PathBuf>,
    cur: Option<(PathBuf, Batches)>,
    batch: Option<OpsRead>,
    row: usize,
    /// Interned host name of the current batch's host column values (cache).
    last_host: Option<(String, usize)>,
    /// Last op and engine names seen (consecutive rows mostly repeat them).
    last_op: (String, &'static str),
    last_engine: (String, &'static str),
    /// Rows of the current file left out as damaged ([`super::LeftOut`]).
    left_out: super::LeftOut,
    /// Rows of the current file read so far (said when the file breaks off).
    used: usize,
    /// Each budget stratum's weight ([`stratum_weight`]), counted over all of this
    /// process's files before its first row is taken (on its reader thread).
    strata: Option<HashMap<Stratum, u64>>,
    /// All of this process's files, for the strata.
    all_files: Vec<PathBuf>,
}

/// A fast hasher for the join's integer keys (SipHash showed up at 8 % of a scan).
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl std::hash::Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// HashMap with [`IntHasher`].
pub type IntMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IntHasher>>;

impl Stream {
    fn next_batch(&mut self, skipped: &mut Vec<Skipped>) -> bool {
        let schema = tables::schema_of("ops").expect("ops table");
        loop {
            if let Some((path, it)) = &mut self.cur {
                match it.next() {
                    Some(Ok(b)) => {
                        if b.num_rows() == 0 {
                            continue;
                        }
                        // Aligned to the projection: every column is there.
                        let Some(cols) = OpsRead::of(&b) else { continue };
                        self.used += b.num_rows();
                        self.batch = Some(cols);
                        self.row = 0;
                        return true;
                    }
                    Some(Err(reason)) => {
                        skipped.push(Skipped {
                            path: path.clone(),
                            reason: reader::broken_after(&reason, self.used),
                        });
                        self.end_file(skipped);
                    }
                    None => self.end_file(skipped),
                }
            }
            let Some(path) = self.files.pop_front() else {
                return false;
            };
            match reader::stream_file(&path, &schema, OPS_COLUMNS, BATCH_ROWS) {
                Ok(it) => self.cur = Some((path, Box::new(it))),
                Err(reason) => skipped.push(Skipped { path, reason }),
            }
        }
    }

    /// Leaves the current file, naming the rows of it that were left out.
    fn end_file(&mut self, skipped: &mut Vec<Skipped>) {
        if let Some((path, _)) = self.cur.take() {
            // Named, and counted afresh for the next file.
            self.left_out.name(&path, "ops", skipped);
        }
        self.used = 0;
    }

    /// API start of the next row (loading the next batch when needed). Damaged rows
    /// (a time out of range, impossible bytes: [`super::LeftOut::keep_op`]) are passed
    /// over (and counted).
    fn peek_time(&mut self, skipped: &mut Vec<Skipped>) -> Option<i64> {
        loop {
            if let Some(c) = &self.batch
                && self.row < c.rows
            {
                let r = self.row;
                if super::keep_op!(self.left_out, c, r) {
                    return Some(c.api_start_ns.value(r));
                }
                self.row += 1;
                continue;
            }
            if !self.next_batch(skipped) {
                return None;
            }
        }
    }

    fn take(&mut self, hosts: &Mutex<Vec<String>>) -> OpView {
        if self.strata.is_none() {
            let counts = budget_strata(&self.all_files);
            self.strata = Some(
                counts
                    .into_iter()
                    .map(|(k, (drawn, timed))| (k, stratum_weight(drawn, timed)))
                    .collect(),
            );
        }
        let c = self.batch.as_ref().expect("peeked");
        let r = self.row;
        self.row += 1;
        let host_name = c.host.value(r);
        let host = match &self.last_host {
            Some((n, i)) if n == host_name => *i,
            _ => {
                let i = super::intern(&mut hosts.lock().unwrap_or_else(|p| p.into_inner()), host_name);
                self.last_host = Some((host_name.to_owned(), i));
                i
            }
        };
        let timing = c.timing.get(r).map(super::timing_name);
        let op = {
            let v = c.op.value(r);
            if self.last_op.0 != v {
                self.last_op = (v.to_owned(), op_name(v));
            }
            self.last_op.1
        };
        OpView {
            host,
            pid: c.pid.value(r),
            op_id: c.op_id.value(r),
            op,
            comm_id: c.comm_id.get(r),
            comm_ptr: c.comm_ptr.value(r),
            seq: c.seq.get(r),
            rank: c.rank.get(r),
            nranks: c.nranks.get(r),
            peer: c.peer.get(r),
            bytes: c.bytes.get(r),
            sendbuff: c.sendbuff.value(r),
            recvbuff: c.recvbuff.value(r),
            stream: c.stream.value(r),
            group_id: c.group_id.get(r),
            result: c.result.value(r),
            api_start: c.api_start_ns.value(r),
            api_end: c.api_end_ns.value(r),
            launch: c.launch_ns.get(r),
            gpu_start: c.gpu_start_ns.get(r),
            gpu_end: c.gpu_end_ns.get(r),
            ready: c.gpu_ready_ns.get(r),
            engine: c.engine.get(r).map(|v| {
                if self.last_engine.0 != v {
                    self.last_engine = (v.to_owned(), engine_name(v));
                }
                self.last_engine.1
            }),
            timing,
            weight: match c.timing_level.get(r) {
                Some(l) if timing == Some("timed") && is_per_op_timing(c.gpu_source.get(r)) => {
                    let bucket = super::report::size_bucket(c.bytes.get(r).unwrap_or(0));
                    let strata = self.strata.as_ref().expect("counted above");
                    // Counted from the same rows; a file that broke off between the
                    // two reads: 2^level, what the hash alone gives.
                    strata
                        .get(&(l, bucket, op))
                        .copied()
                        .unwrap_or(ONE_OP << l.min(32))
                }
                _ => ONE_OP,
            },
        }
    }
}

struct Pending {
    members: Vec<OpView>,
    born: u64,
}

/// Whether an op's GPU columns came from the default per-op timing, whose budget
/// weights it: `stamps`, or `events` in files written before GPU stamps replaced
/// CUDA events.
fn is_per_op_timing(source: Option<&str>) -> bool {
    matches!(source, Some("stamps" | "events"))
}

fn complete(p: &Pending, collective: bool) -> bool {
    if collective {
        p.members.len() >= p.members[0].nranks.unwrap_or(1).max(1) as usize
    } else {
        p.members.iter().any(|o| o.op == "Send") && p.members.iter().any(|o| o.op == "Recv")
    }
}

/// Rows handed from a reader thread to the join at a time.
const CHUNK: usize = 4096;
/// Above this many processes, files are read on the joining thread (no thread each).
const MAX_READER_THREADS: usize = 64;

enum Msg {
    Rows(Vec<OpView>),
    Skipped(Skipped),
}

/// A process's rows as the join sees them: read here, or by a reader thread.
enum Feed {
    Local(Box<Stream>),
    Remote {
        rx: crossbeam_channel::Receiver<Msg>,
        rows: std::vec::IntoIter<OpView>,
    },
}

impl Feed {
    fn peek_time(&mut self, skipped: &mut Vec<Skipped>) -> Option<i64> {
        match self {
            Feed::Local(s) => s.peek_time(skipped),
            Feed::Remote { rx, rows } => loop {
                if let Some(o) = rows.as_slice().first() {
                    return Some(o.api_start);
                }
                match rx.recv() {
                    Ok(Msg::Rows(v)) => *rows = v.into_iter(),
                    Ok(Msg::Skipped(s)) => skipped.push(s),
                    Err(_) => return None,
                }
            },
        }
    }

    fn take(&mut self, hosts: &Mutex<Vec<String>>) -> OpView {
        match self {
            Feed::Local(s) => s.take(hosts),
            Feed::Remote { rows, .. } => rows.next().expect("peeked"),
        }
    }
}

fn stream_of(files: Vec<PathBuf>) -> Stream {
    Stream {
        files: files.clone().into(),
        cur: None,
        batch: None,
        row: 0,
        last_host: None,
        last_op: (String::new(), "unknown"),
        last_engine: (String::new(), "unknown"),
        left_out: super::LeftOut::default(),
        used: 0,
        strata: None,
        all_files: files,
    }
}

/// A reader thread: decodes one process's files into row chunks.
fn produce(mut s: Stream, hosts: &Mutex<Vec<String>>, tx: crossbeam_channel::Sender<Msg>) {
    let mut skipped = Vec::new();
    let mut chunk = Vec::with_capacity(CHUNK);
    while s.peek_time(&mut skipped).is_some() {
        for sk in skipped.drain(..) {
            if tx.send(Msg::Skipped(sk)).is_err() {
                return;
            }
        }
        chunk.push(s.take(hosts));
        if chunk.len() == CHUNK
            && tx
                .send(Msg::Rows(std::mem::replace(
                    &mut chunk,
                    Vec::with_capacity(CHUNK),
                )))
                .is_err()
        {
            return;
        }
    }
    for sk in skipped {
        let _ = tx.send(Msg::Skipped(sk));
    }
    if !chunk.is_empty() {
        let _ = tx.send(Msg::Rows(chunk));
    }
}

/// Streams the ops rows of `files` (one list per process; the first `max_rows` in
/// API-start order) and hands each operation to `on_group` once (with the host-name
/// table `OpView::host` indexes): all its ranks' rows with `complete = true`, or whatever rows
/// exist with `complete = false` (missing ranks, or an op that joins nothing).
pub fn join(
    files: Vec<Vec<PathBuf>>,
    run: &mut Run,
    skipped: &mut Vec<Skipped>,
    max_rows: u64,
    on_group: impl FnMut(&[OpView], bool, &Mutex<Vec<String>>),
) {
    let hosts = Mutex::new(std::mem::take(&mut run.hosts));
    let threaded = files.len() > 1 && files.len() <= MAX_READER_THREADS;
    std::thread::scope(|sc| {
        let feeds: Vec<Feed> = files
            .into_iter()
            .map(|f| {
                let s = stream_of(f);
                if threaded {
                    let (tx, rx) = crossbeam_channel::bounded(4);
                    let hosts = &hosts;
                    sc.spawn(move || produce(s, hosts, tx));
                    Feed::Remote {
                        rx,
                        rows: Vec::new().into_iter(),
                    }
                } else {
                    Feed::Local(Box::new(s))
                }
            })
            .collect();
        merge(feeds, &hosts, skipped, max_rows, on_group);
    });
    run.hosts = hosts.into_inner().unwrap_or_else(|p| p.into_inner());
}

fn merge(
    mut streams: Vec<Feed>,
    hosts: &Mutex<Vec<String>>,
    skipped: &mut Vec<Skipped>,
    max_rows: u64,
    mut on_group: impl FnMut(&[OpView], bool, &Mutex<Vec<String>>),
) {
    let mut heap = BinaryHeap::new();
    for (i, s) in streams.iter_mut().enumerate() {
        if let Some(t) = s.peek_time(skipped) {
            heap.push(Reverse((t, i)));
        }
    }
    let mut pending: IntMap<(u64, u64, i32, i32), Pending> = IntMap::default();
    let mut fifo: VecDeque<(u64, (u64, u64, i32, i32))> = VecDeque::new();
    let mut n: u64 = 0;
    while let Some(Reverse((_, i))) = heap.pop() {
        if n >= max_rows {
            return;
        }
        let o = streams[i].take(hosts);
        if let Some(t) = streams[i].peek_time(skipped) {
            heap.push(Reverse((t, i)));
        }
        n += 1;
        match op_key(&o) {
            None => on_group(std::slice::from_ref(&o), false, hosts),
            Some(k) => {
                let want = if k.2 == -1 {
                    o.nranks.unwrap_or(1).clamp(1, 64) as usize
                } else {
                    2
                };
                let p = pending.entry(k).or_insert_with(|| {
                    fifo.push_back((n, k));
                    Pending {
                        members: Vec::with_capacity(want),
                        born: n,
                    }
                });
                p.members.push(o);
                if complete(p, k.2 == -1) {
                    let p = pending.remove(&k).expect("present");
                    on_group(&p.members, true, hosts);
                }
            }
        }
        if n.is_multiple_of(65_536) {
            while let Some(&(born, k)) = fifo.front() {
                if born + EVICT_AFTER_ROWS > n {
                    break;
                }
                fifo.pop_front();
                if pending.get(&k).is_some_and(|p| p.born == born) {
                    let p = pending.remove(&k).expect("present");
                    on_group(&p.members, false, hosts);
                }
            }
            // Entries completed long ago leave stale FIFO slots; keep the FIFO small.
            if fifo.len() > 4 * pending.len() + 65_536 {
                fifo.retain(|(born, k)| pending.get(k).is_some_and(|p| p.born == *born));
            }
        }
    }
    let mut rest: Vec<Pending> = pending.into_values().collect();
    rest.sort_by_key(|p| p.born);
    for p in rest {
        on_group(&p.members, false, hosts);
    }
}
