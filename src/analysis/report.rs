//! `zcta report`: per (op, message size, engine) where the time went, the path mix,
//! and findings with their evidence and fix.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use std::collections::HashMap;

use super::phases::{N_PHASES, PHASES, Phase, Phases};
use super::{OpView, Run, ScanStats, plural};
use crate::nccl::OpKind;
use crate::nccl_rules::{self, NcclRules, Rule};

/// nccl-tests' bus-bandwidth factor for `op` on `n` ranks.
pub fn busbw_factor(op: OpKind, n: i32) -> f64 {
    let n = f64::from(n.max(1));
    match op {
        OpKind::AllReduce => 2.0 * (n - 1.0) / n,
        OpKind::AllGather | OpKind::ReduceScatter | OpKind::AlltoAll | OpKind::Gather | OpKind::Scatter => {
            (n - 1.0) / n
        }
        OpKind::Broadcast | OpKind::Bcast | OpKind::Reduce | OpKind::Send | OpKind::Recv => 1.0,
    }
}

/// Largest power of two ≤ `bytes` (0 stays 0).
pub fn size_bucket(bytes: u64) -> u64 {
    if bytes == 0 {
        0
    } else {
        1 << (63 - bytes.leading_zeros())
    }
}

/// "1 MiB", "512 KiB", "8 B".
pub fn size_label(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024 && v.is_multiple_of(1024) && u < UNITS.len() - 1 {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

/// A size bucket as a range: "512 B–1 KiB", "1–2 MiB" (sizes from `b` up to, not
/// including, twice `b`); "0 B" for the empty bucket.
pub fn bucket_label(b: u64) -> String {
    if b == 0 {
        return "0 B".into();
    }
    let (lo, hi) = (size_label(b), size_label(b.saturating_mul(2)));
    match (lo.split_once(' '), hi.split_once(' ')) {
        (Some((lv, lu)), Some((_, hu))) if lu == hu => format!("{lv}–{hi}"),
        _ => format!("{lo}–{hi}"),
    }
}

/// One row of the main table.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub op: String,
    pub bucket: u64,
    /// `ops.engine`, or "not measured".
    pub engine: String,
    pub count: u64,
    /// Ops whose window was measured (GPU times present).
    pub measured: u64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Share of the summed window per phase ([`PHASES`] order); `None`: not measured
    /// for any op of the group.
    pub shares: [Option<f64>; N_PHASES],
    pub gpu_median_us: Option<f64>,
    pub algbw_gbs: Option<f64>,
    pub busbw_gbs: Option<f64>,
    pub busbw_pct_peak: Option<f64>,
    /// Local ops (a Send/Recv of a rank to itself, or an op on a one-rank
    /// communicator): copies within one GPU, not link traffic, so no busbw.
    pub local: bool,
}

/// A finding: what was seen, the evidence, the fix.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub title: String,
    pub evidence: String,
    pub fix: String,
}

/// The whole report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub groups: Vec<Group>,
    /// (op, engine, count)
    pub mix: Vec<(String, String, u64)>,
    pub findings: Vec<Finding>,
    pub link_peak_gbs: f64,
    /// Per communicator (most collectives first, at most 8): the rank that started
    /// last most often, how often, and the median wait it caused.
    pub stragglers: Vec<super::Straggler>,
    /// Human notes: skipped files, pending logs, clocks.
    pub notes: Vec<String>,
}

/// Records the processes could not write (`process.records_dropped`): every figure of
/// the report counts only the rows that were written.
fn dropped_finding(run: &Run) -> Option<Finding> {
    let dropped: Vec<(i32, u64)> = run
        .procs
        .iter()
        .filter_map(|p| p.records_dropped.filter(|&n| n > 0).map(|n| (p.pid, n)))
        .collect();
    if dropped.is_empty() {
        return None;
    }
    // In u128: the counts come from the files (a damaged one may hold any u64).
    let total: u128 = dropped.iter().map(|d| u128::from(d.1)).sum();
    let per: Vec<String> = dropped
        .iter()
        .take(8)
        .map(|(pid, n)| format!("pid {pid}: {n}"))
        .collect();
    let more = if dropped.len() > 8 {
        format!(
            " and {} more",
            plural((dropped.len() - 8) as u64, "process", "processes")
        )
    } else {
        String::new()
    };
    let unknown = run.procs.iter().filter(|p| p.records_dropped.is_none()).count();
    let unknown = if unknown > 0 {
        format!(
            "; unknown for {} killed",
            plural(unknown as u64, "process", "processes")
        )
    } else {
        String::new()
    };
    Some(Finding {
        title: format!("{total} records dropped: the counts above miss those ops and calls"),
        evidence: format!(
            "process.records_dropped: {}{more}{unknown}; ops and group calls are dropped first, communicator and registration rows only when the queue's reserve is full too",
            per.join(", ")
        ),
        fix: "the writer did not keep up with the calls (or stopped: process.write_errors, end_reason): raise ZCTA_QUEUE_CAPACITY (up to 4194304, about 448 bytes per slot), or write to a faster file system".into(),
    })
}

fn env_is(run: &Run, key: &str, val: &str) -> Vec<i32> {
    run.procs
        .iter()
        .filter(|p| p.env.get(key).is_some_and(|v| v.trim() == val))
        .map(|p| p.pid)
        .collect()
}

fn pids(v: &[i32]) -> String {
    let s: Vec<String> = v.iter().take(8).map(|p| p.to_string()).collect();
    let more = if v.len() > 8 {
        format!(" and {} more", v.len() - 8)
    } else {
        String::new()
    };
    format!("pid {}{more}", s.join(", "))
}

/// Quantiles of a stream of weighted ns values (a value stands for `weight` ops):
/// exact up to 100,000 values, then a log histogram with 1 % wide buckets (±0.5 %
/// error), so memory stays bounded.
#[derive(Clone, Debug, Default)]
pub struct Quant {
    exact: Vec<(i64, u64)>,
    zero: u64,
    hist: Vec<u64>,
    /// Values pushed, and their summed weight.
    n: u64,
    weight: u64,
}

const EXACT_MAX: usize = 100_000;

fn bucket_of(v: i64) -> usize {
    ((v.max(1) as f64).ln() / 1.01f64.ln()) as usize
}

impl Quant {
    pub fn push(&mut self, v: i64) {
        self.push_weighted(v, 1);
    }
    /// `v` for `w` ops.
    pub fn push_weighted(&mut self, v: i64, w: u64) {
        let w = w.max(1);
        self.n += 1;
        self.weight = self.weight.saturating_add(w);
        if self.hist.is_empty() && self.exact.len() < EXACT_MAX {
            self.exact.push((v, w));
            return;
        }
        if self.hist.is_empty() {
            for (x, xw) in std::mem::take(&mut self.exact) {
                self.add_hist(x, xw);
            }
        }
        self.add_hist(v, w);
    }
    fn add_hist(&mut self, v: i64, w: u64) {
        if v <= 0 {
            self.zero = self.zero.saturating_add(w);
            return;
        }
        let i = bucket_of(v);
        if self.hist.len() <= i {
            self.hist.resize(i + 1, 0);
        }
        self.hist[i] = self.hist[i].saturating_add(w);
    }
    /// The `q` quantile (ns) of the ops the values stand for; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((self.weight - 1) as f64 * q).round() as u64;
        if self.hist.is_empty() {
            let mut v = self.exact.clone();
            v.sort_unstable();
            let mut seen: u64 = 0;
            for (x, w) in v {
                seen = seen.saturating_add(w);
                if seen > rank {
                    return Some(x as f64);
                }
            }
            return None;
        }
        if rank < self.zero {
            return Some(0.0);
        }
        let mut seen = self.zero;
        for (i, &c) in self.hist.iter().enumerate() {
            seen = seen.saturating_add(c);
            if seen > rank {
                return Some(1.01f64.powf(i as f64 + 0.5));
            }
        }
        None
    }
    /// Values pushed.
    pub fn len(&self) -> u64 {
        self.n
    }
    /// The ops they stand for.
    pub fn weight(&self) -> u64 {
        self.weight
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// One group's aggregates. The sums are wide enough not to overflow: a window is at
/// most 2^53 ns ([`super::phases::MAX_WINDOW_NS`]) and stands for at most 2^32 ops, a
/// message under 2^62 bytes ([`super::MAX_BYTES`]: a scan leaves out a successful
/// call's row with more, so its size bucket is at most 2^61).
#[derive(Default)]
struct Acc {
    count: u64,
    sums: [i128; N_PHASES],
    any: [bool; N_PHASES],
    total: i128,
    windows: Quant,
    gpu: Quant,
    bytes_gpu: u128,
    /// nccl-tests' bus-bandwidth factor of each op with a GPU time, by its own
    /// communicator's size, summed with the ops' weights: a group mixes communicators
    /// (TP of 2 beside DP of 8), and its factor is their weighted mean.
    factor_sum: f64,
}

const CE_CAPABLE: [&str; 4] = ["AlltoAll", "AllGather", "Gather", "Scatter"];

/// Builds a [`Report`] from the ops a scan hands it.
pub struct Builder {
    link_peak_gbs: f64,
    groups: BTreeMap<(&'static str, u64, &'static str, bool), Acc>,
    mix: BTreeMap<(&'static str, &'static str), u64>,
    ce_requested: bool,
    multi_node: bool,
    /// The copy-engine rules of the NCCL the run used (its processes' `nccl_version`;
    /// 2.28.9's when none says).
    rules: NcclRules,
    ce_took: u64,
    ce_fell_back: u64,
    /// Ops with GPU times, and how many of them know when their stream was free.
    gpu_timed: u64,
    ready_known: u64,
    ce_reasons: BTreeMap<&'static str, u64>,
    not_ce_capable: u64,
    proxy_ops: u64,
    /// Registered symmetric windows by (host, pid, comm_ptr): (start, end).
    windows: HashMap<(usize, i32, u64), Vec<(u64, u64)>>,
}

impl Builder {
    pub fn new(run: &Run, link_peak_gbs: f64) -> Self {
        let mut windows: HashMap<(usize, i32, u64), Vec<(u64, u64)>> = HashMap::new();
        for w in run.windows.iter().filter(|w| w.flags & 1 != 0) {
            windows
                .entry((w.host, w.pid, w.comm_ptr))
                .or_default()
                .push((w.buff, w.buff.saturating_add(w.size)));
        }
        Self {
            link_peak_gbs,
            groups: BTreeMap::new(),
            mix: BTreeMap::new(),
            ce_requested: !env_is(run, "NCCL_CTA_POLICY", "2").is_empty(),
            multi_node: run.nccl_nodes.iter().any(|&n| n > 1),
            rules: run
                .procs
                .iter()
                .find_map(|p| p.nccl_version)
                .and_then(nccl_rules::from_version_code)
                .map_or_else(NcclRules::without_nccl, |v| NcclRules::of(v, None)),
            ce_took: 0,
            ce_fell_back: 0,
            gpu_timed: 0,
            ready_known: 0,
            ce_reasons: BTreeMap::new(),
            not_ce_capable: 0,
            proxy_ops: 0,
            windows,
        }
    }

    /// One op with its phases.
    pub fn add(&mut self, o: &OpView, p: &Phases) {
        if o.result != 0 {
            return;
        }
        // Timed with stamps, NCCL's events said nothing of the path: unknown.
        let engine = o.engine.unwrap_or(if o.gpu_end.is_some() {
            "unknown"
        } else {
            "not measured"
        });
        *self.mix.entry((super::report_op(o.op), engine)).or_default() += 1;
        if o.gpu_start.is_some() {
            self.gpu_timed += 1;
            self.ready_known += u64::from(o.ready.is_some());
        }
        let g = self
            .groups
            .entry((
                super::report_op(o.op),
                size_bucket(o.bytes.unwrap_or(0)),
                engine,
                o.is_local(),
            ))
            .or_default();
        g.count += 1;
        // A timed op stands for its budget stratum's ops (OpView::weight).
        let weight = o.weight.max(1);
        // The op's GPU time: its kernels' span (deep mode), else its time on its stream
        // from when the stream was free after the launch (stamps).
        let span = match (o.gpu_start, o.gpu_end) {
            // Checked: times from a corrupt file may lie the whole i64 range apart.
            (Some(s), Some(e)) => e.checked_sub(s),
            (None, Some(e)) => o.gpu_begin().and_then(|b| e.checked_sub(b)),
            _ => None,
        };
        if let Some(d) = span.filter(|&d| d >= 0) {
            g.gpu.push_weighted(d, weight);
            g.bytes_gpu = g
                .bytes_gpu
                .saturating_add(u128::from(o.bytes.unwrap_or(0)) * u128::from(weight));
            // An op name this zcta does not know moves its bytes once, as a Broadcast.
            let factor = OpKind::from_name(o.op).map_or(1.0, |k| busbw_factor(k, o.nranks.unwrap_or(1)));
            g.factor_sum += factor * weight as f64;
        }
        if let Some(w) = p.window {
            // In i128: a sum of many windows each standing for up to 2^32 ops.
            let k_w = i128::from(weight);
            g.windows.push_weighted(w, weight);
            g.total = g.total.saturating_add(i128::from(w) * k_w);
            for (k, v) in p.values().iter().enumerate() {
                if let Some(v) = v {
                    g.sums[k] = g.sums[k].saturating_add(i128::from(*v) * k_w);
                    g.any[k] = true;
                }
            }
        }
        if o.engine == Some("proxy_memcpy") {
            self.proxy_ops += 1;
        }
        if !self.ce_requested {
            return;
        }
        if !CE_CAPABLE.contains(&o.op) {
            if o.op != "Send" && o.op != "Recv" {
                self.not_ce_capable += 1;
            }
            return;
        }
        match o.engine {
            Some("copy_engine") => self.ce_took += 1,
            Some("sm_kernel" | "symmetric_kernel") => {
                let wins = self.windows.get(&(o.host, o.pid, o.comm_ptr));
                let in_window =
                    |p: u64| p == 0 || wins.is_some_and(|w| w.iter().any(|&(a, b)| p >= a && p < b));
                // Every condition that is not met, not just the first.
                let mut known = false;
                // From 2.30 more nodes are no bar by themselves (one NVLink domain, or
                // the hierarchical copy engine), and from 2.29 only the receive buffer
                // needs a window on one node (docs/doctor.md, "NCCL versions").
                let one_node = self.rules.has(Rule::OneNode);
                let windows_ok = if self.rules.has(Rule::RecvWindow) && !self.multi_node {
                    in_window(o.recvbuff)
                } else {
                    in_window(o.sendbuff) && in_window(o.recvbuff)
                };
                for (missing, why) in [
                    (
                        self.multi_node && one_node,
                        "more than one node (the copy engine path is single-node before NCCL 2.30)",
                    ),
                    (o.stream == 0, "issued on the legacy default stream"),
                    (
                        !windows_ok,
                        "buffers not in a window registered with NCCL_WIN_COLL_SYMMETRIC",
                    ),
                ] {
                    if missing {
                        known = true;
                        *self.ce_reasons.entry(why).or_default() += 1;
                    }
                }
                if !known {
                    *self
                        .ce_reasons
                        .entry("not knowable from the run (NCCL_DEBUG=INFO says whether 'Init CE' ran)")
                        .or_default() += 1;
                }
                self.ce_fell_back += 1;
            }
            _ => {}
        }
    }

    /// The report, once every op was added.
    pub fn finish(self, run: &Run, stats: &ScanStats) -> Report {
        let mut groups = Vec::new();
        for ((op, bucket, engine, local), g) in &self.groups {
            let shares: [Option<f64>; N_PHASES] = std::array::from_fn(|k| {
                // Unresolved is measured wherever the window is: 0 is 0 %, not n/m.
                (g.any[k] && g.total > 0).then(|| g.sums[k] as f64 / g.total as f64)
            });
            let gpu_median_us = g.gpu.quantile(0.5).map(|v| v / 1e3);
            let algbw = gpu_median_us
                .filter(|&m| m > 0.0)
                .map(|m| g.bytes_gpu as f64 / g.gpu.weight() as f64 / (m * 1e3));
            // A local copy is not link traffic: no bus bandwidth against the link's peak.
            let factor = g.factor_sum / g.gpu.weight().max(1) as f64;
            let busbw = algbw.filter(|_| !local).map(|b| b * factor);
            groups.push(Group {
                op: (*op).into(),
                bucket: *bucket,
                engine: (*engine).into(),
                count: g.count,
                measured: g.windows.len(),
                p50_us: g.windows.quantile(0.5).map(|v| v / 1e3),
                p99_us: g.windows.quantile(0.99).map(|v| v / 1e3),
                shares,
                gpu_median_us,
                algbw_gbs: algbw,
                busbw_gbs: busbw,
                busbw_pct_peak: busbw.map(|b| 100.0 * b / self.link_peak_gbs),
                local: *local,
            });
        }
        let mut report = Report {
            groups,
            mix: self
                .mix
                .iter()
                .map(|((o, e), n)| ((*o).into(), (*e).into(), *n))
                .collect(),
            findings: self.findings(run, stats),
            link_peak_gbs: self.link_peak_gbs,
            stragglers: stats.stragglers.iter().take(8).cloned().collect(),
            notes: Vec::new(),
        };
        for s in &run.skipped {
            report
                .notes
                .push(format!("skipped {}: {}", s.path.display(), s.reason));
        }
        for s in &run.shared_pids {
            report.notes.push(s.to_string());
        }
        if run.pending_logs > 0 {
            report.notes.push(format!(
                "{} pending (a process was killed or still runs): run `zcta recover` first for their rows",
                plural(run.pending_logs as u64, "write-ahead log", "write-ahead logs")
            ));
        }
        if stats.not_timed() > 0 {
            let why = |t: &str| match t {
                "budget" => {
                    "not selected by the budget, ZCTA_BUDGET: each rank selects 1 op in 2^timing_level, the same ops on every rank, and its rate limiter skips some in a burst"
                }
                "pool_empty" => "no free slot pair for its stamps",
                "off" => {
                    "timing off in the process (process.gpu_timing says why) or a group that launched nothing"
                }
                "graph_capture" => "captured into a CUDA graph: nothing is recorded into a capturing stream",
                "error" => "the call failed or the driver refused a call",
                "streams" => "its group's ops ran on several streams",
                "in_progress" => "a non-blocking communicator's call returned ncclInProgress",
                _ => "files from before ops.timing, or a value this zcta does not know",
            };
            let causes: Vec<String> = stats
                .not_timed_why
                .iter()
                .map(|(t, n)| format!("{n} {t}: {}", why(t)))
                .collect();
            report.notes.push(format!(
                "{} not timed on any rank (ops.timing of their first row: {}); phase shares and durations above are those of the timed operations",
                plural(stats.not_timed(), "operation was", "operations were"),
                causes.join("; ")
            ));
        }
        if stats.incomplete > 0 {
            let mut note = format!(
                "{} some rank's data (files missing, or GPU times on some ranks only): their barrier and transfer are not measured",
                plural(stats.incomplete, "operation lacks", "operations lack")
            );
            if stats.gpu_on_some_ranks > 0 {
                note.push_str(&format!(
                    "; {} of them have every rank's rows but GPU times on only some ranks (ranks at different budget levels: a denser rank timed what a sparser one did not; a rank's rate limiter skipped what another timed; in deep mode under ZCTA_SAMPLE, the ranks' hosts called them in different windows; docs/phases.md)",
                    stats.gpu_on_some_ranks
                ));
            }
            report.notes.push(note);
        }
        if stats.local_without_gpu > 0 {
            report.notes.push(format!(
                "{} no GPU times (a one-rank shortcut that launched no GPU work, or not timed: ops.timing); local ops (a rank's Send/Recv to itself, one-rank communicators) wait for no other rank",
                plural(stats.local_without_gpu, "local operation has", "local operations have")
            ));
        }
        if run.hosts.len() > 1 {
            for (h, c) in run.hosts.iter().zip(&stats.clocks) {
                report.notes.push(match c {
                    Some(c) => format!(
                        "host {h}: clock offset {:+.1} us ± {:.1} us ({} collectives)",
                        c.offset_ns as f64 / 1e3,
                        c.uncertainty_ns as f64 / 1e3,
                        c.samples
                    ),
                    None => {
                        format!("host {h}: no collective shared with the others: its clock offset is unknown")
                    }
                });
            }
        }
        report
    }

    fn findings(&self, run: &Run, stats: &ScanStats) -> Vec<Finding> {
        let mut out = Vec::new();
        if let Some(f) = dropped_finding(run) {
            out.push(f);
        }
        // A process has a GPU side when its CUDA-event timing or (deep mode, or files
        // from before the timing existed) CUPTI was on.
        let gpu_off: std::collections::BTreeSet<String> = run
            .procs
            .iter()
            .filter(|p| {
                let timing = p.gpu_timing.as_deref().is_some_and(|t| t.starts_with("on"));
                let cupti = p.cupti.as_deref().is_some_and(|c| c.starts_with("on"));
                !timing && !cupti
            })
            .map(|p| match (&p.gpu_timing, &p.cupti) {
                (Some(t), _) => format!("process.gpu_timing: {t}"),
                (None, Some(c)) => format!("process.cupti: {c}"),
                (None, None) => "no GPU status".into(),
            })
            .collect();
        if !gpu_off.is_empty() {
            out.push(Finding {
                title: "GPU side not measured in some processes".into(),
                evidence: gpu_off.into_iter().collect::<Vec<_>>().join("; "),
                fix: "queue, barrier and transfer need the GPU side: unset ZCTA_GPU=off, and run the program's CUDA work in the process (the CUDA driver must be loaded when the first communicator is created)".into(),
            });
        }
        let sampled: std::collections::BTreeSet<&str> = run
            .procs
            .iter()
            .filter_map(|p| p.gpu_sampling.as_deref())
            .collect();
        if !sampled.is_empty() {
            let outside: u128 = run
                .procs
                .iter()
                .filter_map(|p| p.ops_unsampled.map(u128::from))
                .sum();
            let apart = match (stats.host_spread_ns, stats.gpu_on_some_ranks) {
                (Some(s), n) if n > 0 => format!(
                    "; the ranks' hosts called each collective a median {:.1} ms apart, so {n} operations were sampled on only some of their ranks (no barrier for them)",
                    s as f64 / 1e6
                ),
                _ => String::new(),
            };
            out.push(Finding {
                title: "GPU side and NCCL's view sampled (ZCTA_SAMPLE)".into(),
                evidence: format!(
                    "process.gpu_sampling: {}; {outside} ops not captured (called outside the windows, or overtaken by a capture switch: process.ops_unsampled) have their queue, sync, transfer, barrier and engine not measured{apart}",
                    sampled.into_iter().collect::<Vec<_>>().join("; ")
                ),
                fix: "phases and paths above come from the ops in the windows; for every op, run without ZCTA_SAMPLE (costs more on small ops: docs/dev/cupti-measurements.md)".into(),
            });
        }
        if self.gpu_timed > 0 && self.ready_known == 0 {
            out.push(Finding {
                title: "Queue and sync not split: when each op's stream was free is not recorded".into(),
                evidence: format!(
                    "none of the {} ops with GPU times has ops.gpu_ready_ns: it comes from the stamps zcta launches on an op's stream around an op it times, and none of these ops was timed with them (their GPU times are CUPTI's kernel spans, deep mode), so the time from launch to the first kernel is not split into queue (work ahead on the stream) and sync (NCCL's stream waits and launch)",
                    self.gpu_timed
                ),
                fix: "process.gpu_timing says why no op was timed with stamps; with them on, ZCTA_BUDGET=all times every op (its cost: docs/PERFORMANCE.md)".into(),
            });
        }
        let captured: u128 = run
            .procs
            .iter()
            .filter_map(|p| p.ops_graph_captured.map(u128::from))
            .sum();
        if captured > 0 {
            out.push(Finding {
                title: "Ops captured into CUDA graphs: GPU side not measured".into(),
                evidence: format!(
                    "{captured} ops were called on a stream capturing a CUDA graph (process.ops_graph_captured, ops.graph_captured); their GPU work runs at each launch of the graph, which zcta does not join to ops, so their queue, sync, transfer, barrier and engine are not measured"
                ),
                fix: "host phases are measured; for the GPU side, profile a run with the graph's collectives called eagerly (e.g. without CUDA graphs / torch.compile's reduce-overhead mode)".into(),
            });
        }
        let fell_back = self.ce_fell_back;
        if fell_back > 0 {
            let r: Vec<String> = self
                .ce_reasons
                .iter()
                .map(|(w, n)| format!("{n} × {w}"))
                .collect();
            out.push(Finding {
                title: format!(
                    "copy-engine path requested (NCCL_CTA_POLICY=2) but {fell_back} of {} capable ops ran on SM kernels",
                    fell_back + self.ce_took
                ),
                evidence: format!(
                    "{}; conditions not met (an op can miss several): {}",
                    pids(&env_is(run, "NCCL_CTA_POLICY", "2")),
                    r.join("; ")
                ),
                fix: "allocate both buffers from NCCL's allocator (torch.cuda.MemPool(backend.mem_allocator)), register them with ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC), and issue on a non-default stream (docs/dev/cupti.md; docs/doctor.md, the copy-engine conditions)".into(),
            });
        }
        if self.not_ce_capable > 0 {
            out.push(Finding {
                title: format!("{} ops are not copy-engine capable in NCCL 2.28", self.not_ce_capable),
                evidence: "NCCL_CTA_POLICY=2 applies to AllGather, AlltoAll, Gather and Scatter only; AllReduce and ReduceScatter on symmetric buffers use symmetric kernels".into(),
                fix: "nothing to fix; expect SM or symmetric kernels for these".into(),
            });
        }
        for (key, what, fix) in [
            (
                "NCCL_P2P_DISABLE",
                "P2P disabled: intra-node data goes through shared memory or the network",
                "unset NCCL_P2P_DISABLE",
            ),
            (
                "NCCL_SHM_DISABLE",
                "SHM disabled: without P2P, intra-node data goes through the network transport",
                "unset NCCL_SHM_DISABLE",
            ),
            (
                "NCCL_P2P_USE_CUDA_MEMCPY",
                "P2P through the proxy thread's cudaMemcpy instead of SM kernels",
                "unset NCCL_P2P_USE_CUDA_MEMCPY",
            ),
            (
                "NCCL_SHM_USE_CUDA_MEMCPY",
                "SHM through the proxy thread's cudaMemcpy",
                "unset NCCL_SHM_USE_CUDA_MEMCPY",
            ),
        ] {
            let p = env_is(run, key, "1");
            if !p.is_empty() {
                out.push(Finding {
                    title: format!("{key}=1 forces a slower path: {what}"),
                    evidence: pids(&p),
                    fix: fix.into(),
                });
            }
        }
        if self.proxy_ops > 0 {
            let copies: usize = run.proxy_copies.values().map(Vec::len).sum();
            out.push(Finding {
                title: format!("{} ops moved data with proxy-thread copies", self.proxy_ops),
                evidence: format!("{copies} cudaMemcpyAsync copies issued by NCCL's proxy thread (gpu.attribution = proxy_window)"),
                fix: "usually NCCL_P2P_USE_CUDA_MEMCPY / NCCL_SHM_USE_CUDA_MEMCPY; SM kernels over NVLink are faster at every size measured (docs/dev/cupti.md)".into(),
            });
        }
        for s in &stats.stragglers {
            let Some(&(rank, n, wait)) = s.last.first() else {
                continue;
            };
            if s.collectives >= 10 && n * 2 > s.collectives && wait > 20_000 {
                out.push(Finding {
                    title: format!("rank {rank} arrives last on communicator {:016x}", s.comm_id),
                    evidence: format!(
                        "last in {n} of {} collectives; the first rank then waits {:.1} us (median)",
                        s.collectives,
                        wait as f64 / 1e3
                    ),
                    fix: format!("look at what rank {rank} does between collectives (data loading, uneven work, CPU contention, a slower GPU or link)"),
                });
            }
        }
        out
    }
}

/// Scans the run and builds its report.
pub fn build(run: &mut Run, link_peak_gbs: f64) -> Result<Report, crate::reader::ReadError> {
    let mut b = Builder::new(run, link_peak_gbs);
    let stats = super::scan_ops(run, |o, p, _| b.add(o, p))?;
    Ok(b.finish(run, &stats))
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.prec$}"))
}

/// The report as a terminal table.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "{:<14} {:>13} {:<16} {:>7} {:>10} {:>10}",
        "op", "size bucket", "engine", "count", "p50 us", "p99 us"
    );
    for p in Phase::ALL {
        let (header, w) = p.header();
        let _ = write!(s, " {header:>w$}");
    }
    let _ = writeln!(s, " {:>8} {:>6}", "busbw", "%peak");
    for g in &r.groups {
        let _ = write!(
            s,
            "{:<14} {:>13} {:<16} {:>7} {:>10} {:>10}",
            g.op,
            bucket_label(g.bucket),
            g.engine,
            g.count,
            fmt_opt(g.p50_us, 1),
            fmt_opt(g.p99_us, 1),
        );
        for (p, v) in Phase::ALL.into_iter().zip(g.shares) {
            let share = v.map_or("n/m".to_string(), |v| format!("{:.0}%", v * 100.0));
            let _ = write!(s, " {share:>w$}", w = p.header().1);
        }
        let _ = writeln!(
            s,
            " {:>8} {:>6}",
            if g.local {
                "local".into()
            } else {
                fmt_opt(g.busbw_gbs, 1)
            },
            fmt_opt(g.busbw_pct_peak, 0),
        );
    }
    let _ = writeln!(
        s,
        "\n(size bucket: nccl-tests bytes from the first size up to, not including, the second;\n phases: shares of the summed window api_start..gpu_end, unres = unresolved (time not split into phases, docs/phases.md), n/m = not measured;\n busbw in GB/s, %peak of {:.0} GB/s per direction (--link-peak-gbps); local = a rank's Send/Recv to itself or a one-rank communicator: a copy within one GPU, no busbw)",
        r.link_peak_gbs
    );
    let _ = writeln!(s, "\npath mix");
    let mut cur = String::new();
    for (op, engine, n) in &r.mix {
        if *op != cur {
            let _ = write!(s, "{}  {op:<14}", if cur.is_empty() { "" } else { "\n" });
            cur = op.clone();
        }
        let _ = write!(s, " {engine} {n}");
    }
    let _ = writeln!(s);
    if !r.stragglers.is_empty() {
        let _ = writeln!(s, "\nwho arrives last (per communicator)");
        for st in &r.stragglers {
            match st.last.first() {
                Some(&(rank, n, wait)) => {
                    let _ = writeln!(
                        s,
                        "  {:016x}  {} collectives: rank {rank} last in {n} ({:.0}%), first rank waits {:.1} us (median)",
                        st.comm_id,
                        st.collectives,
                        100.0 * n as f64 / st.collectives.max(1) as f64,
                        wait as f64 / 1e3
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "  {:016x}  {} collectives: all ranks start together",
                        st.comm_id, st.collectives
                    );
                }
            }
        }
    }
    if r.findings.is_empty() {
        let _ = writeln!(s, "\nfindings: none");
    } else {
        let _ = writeln!(s, "\nfindings");
        for (i, f) in r.findings.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {}. {}\n     evidence: {}\n     fix: {}",
                i + 1,
                f.title,
                f.evidence,
                f.fix
            );
        }
    }
    for n in &r.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

/// The report as JSON.
pub fn render_json(r: &Report) -> Value {
    json!({
        "link_peak_gbs": r.link_peak_gbs,
        "phases": PHASES,
        "groups": r.groups.iter().map(|g| json!({
            "op": g.op, "size_bucket_bytes": g.bucket, "engine": g.engine,
            "count": g.count, "measured": g.measured,
            "p50_us": g.p50_us, "p99_us": g.p99_us,
            "shares": PHASES.iter().zip(g.shares).map(|(p, v)| (p.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "gpu_median_us": g.gpu_median_us, "algbw_gbs": g.algbw_gbs, "busbw_gbs": g.busbw_gbs,
            "busbw_pct_peak": g.busbw_pct_peak, "local": g.local,
        })).collect::<Vec<_>>(),
        "mix": r.mix.iter().map(|(o, e, n)| json!({"op": o, "engine": e, "count": n})).collect::<Vec<_>>(),
        "findings": r.findings.iter().map(|f| json!({"title": f.title, "evidence": f.evidence, "fix": f.fix})).collect::<Vec<_>>(),
        "stragglers": r.stragglers.iter().map(|st| json!({
            "comm_id": st.comm_id, "collectives": st.collectives,
            "last": st.last.iter().map(|(rank, n, wait)| json!({"rank": rank, "times_last": n, "median_wait_us": *wait as f64 / 1e3})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "notes": r.notes,
    })
}

/// The main table as CSV (one row per group; empty cells: not measured).
pub fn render_csv(r: &Report) -> String {
    let mut s = String::from("op,size_bucket_bytes,engine,count,measured,p50_us,p99_us");
    for p in PHASES {
        let _ = write!(s, ",share_{p}");
    }
    s.push_str(",gpu_median_us,algbw_gbs,busbw_gbs,busbw_pct_peak,local\n");
    let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
    for g in &r.groups {
        let _ = write!(
            s,
            "{},{},{},{},{},{},{}",
            g.op,
            g.bucket,
            g.engine,
            g.count,
            g.measured,
            f(g.p50_us),
            f(g.p99_us)
        );
        for v in g.shares {
            let _ = write!(s, ",{}", f(v));
        }
        let _ = writeln!(
            s,
            ",{},{},{},{},{}",
            f(g.gpu_median_us),
            f(g.algbw_gbs),
            f(g.busbw_gbs),
            f(g.busbw_pct_peak),
            g.local
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_factors() {
        assert_eq!(size_bucket(0), 0);
        assert_eq!(size_bucket(1), 1);
        assert_eq!(size_bucket(3 << 20), 2 << 20);
        assert_eq!(size_label(1 << 20), "1 MiB");
        assert_eq!(size_label(8), "8 B");
        assert_eq!(size_label(3000), "3000 B");
        // A 1000-byte op's bucket says it is a range.
        assert_eq!(bucket_label(size_bucket(1000)), "512 B–1 KiB");
        assert_eq!(bucket_label(1 << 20), "1–2 MiB");
        assert_eq!(bucket_label(8), "8–16 B");
        assert_eq!(bucket_label(0), "0 B");
        assert_eq!(busbw_factor(OpKind::AllReduce, 8), 1.75);
        assert_eq!(busbw_factor(OpKind::AlltoAll, 2), 0.5);
        assert_eq!(busbw_factor(OpKind::Broadcast, 8), 1.0);
    }
}
