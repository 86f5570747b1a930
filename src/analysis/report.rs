//! `zcta report`: per (op, message size, engine) where the time went, the path mix,
//! and findings with their evidence and fix.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::phases::PHASES;
use super::{Analysis, Run};

/// nccl-tests' bus-bandwidth factor for `op` on `n` ranks.
pub fn busbw_factor(op: &str, n: i32) -> f64 {
    let n = f64::from(n.max(1));
    match op {
        "AllReduce" => 2.0 * (n - 1.0) / n,
        "AllGather" | "ReduceScatter" | "AlltoAll" | "Gather" | "Scatter" => (n - 1.0) / n,
        _ => 1.0, // Broadcast, Bcast, Reduce, Send, Recv
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
    pub shares: [Option<f64>; 7],
    pub gpu_median_us: Option<f64>,
    pub algbw_gbs: Option<f64>,
    pub busbw_gbs: Option<f64>,
    pub busbw_pct_peak: Option<f64>,
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
    /// Human notes: skipped files, pending logs, clocks.
    pub notes: Vec<String>,
}

fn pct(v: &mut [i64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    Some(v[i] as f64 / 1e3)
}

const CE_CAPABLE: [&str; 4] = ["AlltoAll", "AllGather", "Gather", "Scatter"];

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

/// Builds the report; `link_peak_gbs` is the per-direction link bandwidth busbw is
/// compared with.
pub fn build(run: &Run, a: &Analysis, link_peak_gbs: f64) -> Report {
    let mut by: BTreeMap<(String, u64, String), Vec<usize>> = BTreeMap::new();
    let mut mix: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (i, o) in run.ops.iter().enumerate() {
        if o.result != 0 {
            continue;
        }
        let engine = o.engine.clone().unwrap_or_else(|| "not measured".into());
        *mix.entry((o.op.clone(), engine.clone())).or_default() += 1;
        by.entry((o.op.clone(), size_bucket(o.bytes.unwrap_or(0)), engine))
            .or_default()
            .push(i);
    }
    let mut groups = Vec::new();
    for ((op, bucket, engine), idx) in by {
        let mut windows = Vec::new();
        let mut sums = [0i64; 7];
        let mut measured_any = [false; 7];
        let mut total = 0i64;
        let mut gpu = Vec::new();
        let mut bytes_sum = 0u64;
        let mut nranks = 1;
        for &i in &idx {
            let (o, p) = (&run.ops[i], &a.phases[i]);
            nranks = nranks.max(o.nranks.unwrap_or(1));
            if let (Some(s), Some(e)) = (o.gpu_start, o.gpu_end) {
                gpu.push(e - s);
                bytes_sum += o.bytes.unwrap_or(0);
            }
            let Some(w) = p.window else { continue };
            windows.push(w);
            total += w;
            for (k, v) in p.values().iter().enumerate() {
                if let Some(v) = v {
                    sums[k] += v;
                    measured_any[k] = true;
                }
            }
        }
        let measured = windows.len() as u64;
        let shares: [Option<f64>; 7] = std::array::from_fn(|k| {
            (measured_any[k] && total > 0 && (k != 6 || sums[6] > 0)).then(|| sums[k] as f64 / total as f64)
        });
        let n_gpu = gpu.len();
        let gpu_median_us = pct(&mut gpu, 0.5);
        // algbw from the mean message over ops with GPU times and the median duration.
        let algbw = gpu_median_us
            .filter(|&m| m > 0.0)
            .map(|m| bytes_sum as f64 / n_gpu as f64 / (m * 1e3));
        let busbw = algbw.map(|b| b * busbw_factor(&op, nranks));
        groups.push(Group {
            count: idx.len() as u64,
            measured,
            p50_us: pct(&mut windows.clone(), 0.5),
            p99_us: pct(&mut windows, 0.99),
            shares,
            gpu_median_us,
            algbw_gbs: algbw,
            busbw_gbs: busbw,
            busbw_pct_peak: busbw.map(|b| 100.0 * b / link_peak_gbs),
            op,
            bucket,
            engine,
        });
    }
    let mut report = Report {
        groups,
        mix: mix.into_iter().map(|((o, e), n)| (o, e, n)).collect(),
        findings: findings(run, a),
        link_peak_gbs,
        notes: Vec::new(),
    };
    for s in &run.skipped {
        report
            .notes
            .push(format!("skipped {}: {}", s.path.display(), s.reason));
    }
    if run.pending_logs > 0 {
        report.notes.push(format!(
            "{} write-ahead logs pending (a process was killed or still runs): run `zcta recover` first for its rows",
            run.pending_logs
        ));
    }
    if a.incomplete > 0 {
        report.notes.push(format!(
            "{} operations lack some rank's data (files missing, or no GPU times there): their barrier and transfer are not measured",
            a.incomplete
        ));
    }
    for (h, c) in run.hosts.iter().zip(&a.clocks) {
        if run.hosts.len() > 1 {
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

fn findings(run: &Run, a: &Analysis) -> Vec<Finding> {
    let mut out = Vec::new();
    let cupti_off: Vec<&str> = run
        .procs
        .iter()
        .filter_map(|p| p.cupti.as_deref())
        .filter(|c| !c.starts_with("on"))
        .collect();
    if !cupti_off.is_empty() {
        out.push(Finding {
            title: "GPU side not measured in some processes".into(),
            evidence: format!(
                "process.cupti: {}",
                cupti_off.iter().copied().collect::<HashSet<_>>().into_iter().collect::<Vec<_>>().join("; ")
            ),
            fix: "queue, barrier, transfer and memcpy need CUPTI: unset ZCTA_CUPTI=0, make libcupti findable (ZCTA_CUPTI_LIB), or run without torch.profiler/Nsight".into(),
        });
    }
    // The copy-engine path was asked for but not taken.
    let ce = env_is(run, "NCCL_CTA_POLICY", "2");
    if !ce.is_empty() {
        let mut reasons: BTreeMap<&str, u64> = BTreeMap::new();
        let mut fell_back = 0u64;
        let mut took = 0u64;
        let multi_node = run.nccl_nodes.iter().any(|&n| n > 1);
        for o in run
            .ops
            .iter()
            .filter(|o| o.result == 0 && CE_CAPABLE.contains(&o.op.as_str()))
        {
            match o.engine.as_deref() {
                Some("copy_engine") => took += 1,
                Some("sm_kernel" | "symmetric_kernel") => {
                    fell_back += 1;
                    let in_window = |p: u64| {
                        p == 0
                            || run.windows.iter().any(|w| {
                                w.host == o.host
                                    && w.pid == o.pid
                                    && w.comm_ptr == o.comm_ptr
                                    && w.flags & 1 != 0
                                    && p >= w.buff
                                    && p < w.buff + w.size
                            })
                    };
                    let why = if multi_node {
                        "more than one node (the copy engine path is single-node)"
                    } else if o.stream == 0 {
                        "issued on the legacy default stream"
                    } else if !(in_window(o.sendbuff) && in_window(o.recvbuff)) {
                        "buffers not in a window registered with NCCL_WIN_COLL_SYMMETRIC"
                    } else {
                        "not knowable from the run (NCCL_DEBUG=INFO says whether 'Init CE' ran)"
                    };
                    *reasons.entry(why).or_default() += 1;
                }
                _ => {}
            }
        }
        if fell_back > 0 {
            let r: Vec<String> = reasons.iter().map(|(w, n)| format!("{n} × {w}")).collect();
            out.push(Finding {
                title: format!(
                    "copy-engine path requested (NCCL_CTA_POLICY=2) but {fell_back} of {} capable ops ran on SM kernels",
                    fell_back + took
                ),
                evidence: format!("{}; why: {}", pids(&ce), r.join("; ")),
                fix: "allocate both buffers from NCCL's allocator (torch.cuda.MemPool(backend.mem_allocator)), register them with ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC), and issue on a non-default stream (docs/dev/cupti.md; shared/REFERENCE.md recipe)".into(),
            });
        }
        let other: u64 = run
            .ops
            .iter()
            .filter(|o| {
                o.result == 0 && !CE_CAPABLE.contains(&o.op.as_str()) && o.op != "Send" && o.op != "Recv"
            })
            .count() as u64;
        if other > 0 {
            out.push(Finding {
                title: format!("{other} ops are not copy-engine capable in NCCL 2.28"),
                evidence: "NCCL_CTA_POLICY=2 applies to AllGather, AlltoAll, Gather and Scatter only; AllReduce and ReduceScatter on symmetric buffers use symmetric kernels".into(),
                fix: "nothing to fix; expect SM or symmetric kernels for these".into(),
            });
        }
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
    let proxy = run
        .ops
        .iter()
        .filter(|o| o.engine.as_deref() == Some("proxy_memcpy"))
        .count();
    if proxy > 0 {
        let copies: usize = run.proxy_copies.values().map(Vec::len).sum();
        out.push(Finding {
            title: format!("{proxy} ops moved data with proxy-thread copies"),
            evidence: format!("{copies} cudaMemcpyAsync copies issued by NCCL's proxy thread (gpu.attribution = proxy_window)"),
            fix: "usually NCCL_P2P_USE_CUDA_MEMCPY / NCCL_SHM_USE_CUDA_MEMCPY; SM kernels over NVLink are faster at every size measured (docs/dev/cupti.md)".into(),
        });
    }
    for s in &a.stragglers {
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
                fix: "look at what rank does between collectives (data loading, uneven work, CPU contention, a slower GPU or link)".into(),
            });
        }
    }
    out
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.prec$}"))
}

/// The report as a terminal table.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<14} {:>9} {:<16} {:>7} {:>10} {:>10} {:>6} {:>6} {:>7} {:>8} {:>6} {:>5} {:>6} {:>8} {:>6}",
        "op",
        "size",
        "engine",
        "count",
        "p50 us",
        "p99 us",
        "init",
        "queue",
        "barrier",
        "transfer",
        "memcpy",
        "proxy",
        "unres",
        "busbw",
        "%peak"
    );
    for g in &r.groups {
        let share = |k: usize| g.shares[k].map_or("n/m".to_string(), |v| format!("{:.0}%", v * 100.0));
        let _ = writeln!(
            s,
            "{:<14} {:>9} {:<16} {:>7} {:>10} {:>10} {:>6} {:>6} {:>7} {:>8} {:>6} {:>5} {:>6} {:>8} {:>6}",
            g.op,
            size_label(g.bucket),
            g.engine,
            g.count,
            fmt_opt(g.p50_us, 1),
            fmt_opt(g.p99_us, 1),
            share(0),
            share(1),
            share(2),
            share(3),
            share(4),
            share(5),
            share(6),
            fmt_opt(g.busbw_gbs, 1),
            fmt_opt(g.busbw_pct_peak, 0),
        );
    }
    let _ = writeln!(
        s,
        "\n(phase shares of the summed window api_start..gpu_end; n/m = not measured; busbw in GB/s, %peak of {:.0} GB/s per direction, --link-peak-gbps)",
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
            "busbw_pct_peak": g.busbw_pct_peak,
        })).collect::<Vec<_>>(),
        "mix": r.mix.iter().map(|(o, e, n)| json!({"op": o, "engine": e, "count": n})).collect::<Vec<_>>(),
        "findings": r.findings.iter().map(|f| json!({"title": f.title, "evidence": f.evidence, "fix": f.fix})).collect::<Vec<_>>(),
        "notes": r.notes,
    })
}

/// The main table as CSV (one row per group; empty cells: not measured).
pub fn render_csv(r: &Report) -> String {
    let mut s = String::from("op,size_bucket_bytes,engine,count,measured,p50_us,p99_us");
    for p in PHASES {
        let _ = write!(s, ",share_{p}");
    }
    s.push_str(",gpu_median_us,algbw_gbs,busbw_gbs,busbw_pct_peak\n");
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
            ",{},{},{},{}",
            f(g.gpu_median_us),
            f(g.algbw_gbs),
            f(g.busbw_gbs),
            f(g.busbw_pct_peak)
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
        assert_eq!(busbw_factor("AllReduce", 8), 1.75);
        assert_eq!(busbw_factor("AlltoAll", 2), 0.5);
        assert_eq!(busbw_factor("Broadcast", 8), 1.0);
    }
}
