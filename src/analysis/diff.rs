//! `zcta diff RUN_A RUN_B`: per (op, message-size bucket), how each phase and the
//! end-to-end time changed from A to B, with a 95 % bootstrap confidence interval of
//! the change in medians, sorted by the change's impact on total time; and which ops
//! changed data path. A quantity one run did not measure is `None` there (`n/m` in
//! the table, `null` in JSON), never 0, and has no change.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::Run;
use super::phases::{N_PHASES, PHASES};
use super::report::{bucket_label, size_bucket};
use crate::reader::ReadError;

/// Timed ops per group and side kept for the bootstrap ([`Reservoir`]).
const MAX_SAMPLES: usize = 20_000;
const RESAMPLES: usize = 400;

/// Change of one quantity between the runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// "total" or a phase name.
    pub what: String,
    /// Median in A (µs); `None`: not measured for any op of the group in A.
    pub median_a_us: Option<f64>,
    /// Median in B (µs); `None`: not measured in B.
    pub median_b_us: Option<f64>,
    /// 95 % bootstrap interval of `median_b - median_a` (µs); `None` unless both runs
    /// measured it.
    pub ci_us: Option<(f64, f64)>,
    /// The interval excludes 0 (false without one).
    pub significant: bool,
}

impl Change {
    /// `median_b - median_a` (µs), when both runs measured it.
    pub fn delta_us(&self) -> Option<f64> {
        Some(self.median_b_us? - self.median_a_us?)
    }
}

/// One (op, size bucket) present in both runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub op: String,
    pub bucket: u64,
    pub count_a: u64,
    pub count_b: u64,
    /// Change of the summed end-to-end time if B's ops had taken A's median:
    /// `(median_b - median_a) * count_b`, µs; `None` when either run did not measure
    /// the end-to-end time.
    pub impact_us: Option<f64>,
    /// "total" first (always), then each phase measured in A or B.
    pub changes: Vec<Change>,
    /// Dominant engine in A and in B (they differ when the path changed).
    pub engine_a: String,
    pub engine_b: String,
}

/// The comparison.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diff {
    pub rows: Vec<Row>,
    /// (op, size) present in only one run.
    pub only_a: Vec<String>,
    pub only_b: Vec<String>,
}

/// One timed op: its [total, phases...] (ns) and how many ops it stands for
/// (`OpView::weight`: its budget stratum's drawn ops over its timed ones), as `zcta
/// report` weights it.
type Sample = ([Option<i64>; N_PHASES + 1], u64);

/// A weighted sample of a group's timed ops by priority sampling (Duffield, Lund and
/// Thorup): each op gets the priority weight/u, u uniform in (0, 1], and the
/// [`MAX_SAMPLES`] highest are kept. While it holds every op, each keeps its weight;
/// once ops were left out, each kept op stands for max(weight, τ) ops, τ the highest
/// priority left out, which keeps every weighted sum (and so the weighted median's
/// cut) unbiased.
#[derive(Default)]
struct Reservoir {
    items: Vec<Sample>,
    /// Lowest priority first: (its bits, a positive f64's order), index into `items`.
    keys: std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize)>>,
    /// τ, once an op was left out.
    tau: Option<f64>,
}

impl Reservoir {
    fn push(&mut self, v: Sample, rng: &mut Rng) {
        let u = (rng.next(1 << 53) as f64 + 1.0) / (1u64 << 53) as f64;
        let q = v.1.max(1) as f64 / u;
        let key = q.to_bits();
        if self.items.len() < MAX_SAMPLES {
            self.keys.push(std::cmp::Reverse((key, self.items.len())));
            self.items.push(v);
            return;
        }
        let Some(&std::cmp::Reverse((min, at))) = self.keys.peek() else {
            return;
        };
        let out = if key > min {
            self.keys.pop();
            self.items[at] = v;
            self.keys.push(std::cmp::Reverse((key, at)));
            f64::from_bits(min)
        } else {
            q
        };
        self.tau = Some(self.tau.map_or(out, |t| t.max(out)));
    }

    /// The values of quantity `i` with the ops each stands for.
    fn values(&self, i: usize) -> Vec<(i64, f64)> {
        let w = |x: u64| {
            let x = x.max(1) as f64;
            self.tau.map_or(x, |t| x.max(t))
        };
        self.items
            .iter()
            .filter_map(|(v, x)| v[i].map(|v| (v, w(*x))))
            .collect()
    }
}

/// Per (op, bucket): ops seen, their timed ops' sample, and the engine mix.
type Samples = BTreeMap<(&'static str, u64), (u64, Reservoir, BTreeMap<&'static str, u64>)>;

fn samples(run: &mut Run) -> Result<Samples, ReadError> {
    let mut out: Samples = BTreeMap::new();
    let mut rng = Rng(0xD1FF);
    super::scan_ops(run, |o, p, _| {
        if o.result != 0 {
            return;
        }
        // Grouped as `zcta report` groups them (Bcast with Broadcast).
        let e = out
            .entry((super::report_op(o.op), size_bucket(o.bytes.unwrap_or(0))))
            .or_default();
        e.0 += 1;
        // The path mix of the ops whose path was measured: an op not timed says
        // nothing of it; one timed whose path NCCL did not name is "unknown", as in
        // the report.
        if let Some(engine) = o.engine.or(o.gpu_end.map(|_| "unknown")) {
            *e.2.entry(engine).or_default() += 1;
        }
        // Without a window no phase is measured.
        if p.window.is_some() {
            let mut v = [None; N_PHASES + 1];
            v[0] = p.window;
            v[1..].copy_from_slice(&p.values());
            e.1.push((v, o.weight), &mut rng);
        }
    })?;
    Ok(out)
}

/// Median of values each standing for `weight` ops: the first value (in ascending
/// order) whose summed weight with the smaller ones exceeds half of the total, as
/// `zcta report`'s p50 and `zcta_analysis`' medians take it (of an even count of
/// equal weights, the upper of the two middle values).
fn weighted_median(v: &mut [(i64, f64)]) -> f64 {
    v.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let half = v.iter().map(|x| x.1).sum::<f64>() / 2.0;
    let mut seen = 0.0;
    for &(x, w) in v.iter() {
        seen += w;
        if seen > half {
            return x as f64;
        }
    }
    v.last().map_or(0.0, |x| x.0 as f64)
}

/// Median of a resample by the same rule as [`weighted_median`] of unit weights (of an
/// even count, the upper middle value); a selection, not a sort (each interval takes
/// hundreds of them over up to [`MAX_SAMPLES`] values).
fn median(v: &mut [i64]) -> f64 {
    let n = v.len();
    *v.select_nth_unstable(n / 2).1 as f64
}

/// splitmix64: a fixed seed keeps reports reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// 95 % percentile-bootstrap interval of `median(b) - median(a)`, each value drawn
/// in proportion to the ops it stands for.
pub fn bootstrap_ci(a: &[(i64, f64)], b: &[(i64, f64)], seed: u64) -> (f64, f64) {
    let mut rng = Rng(seed);
    let cum = |v: &[(i64, f64)]| {
        v.iter()
            .scan(0.0, |s, x| {
                *s += x.1;
                Some(*s)
            })
            .collect::<Vec<f64>>()
    };
    let (cum_a, cum_b) = (cum(a), cum(b));
    let mut buf_a = vec![0i64; a.len()];
    let mut buf_b = vec![0i64; b.len()];
    let draw = |v: &[(i64, f64)], cum: &[f64], buf: &mut [i64], rng: &mut Rng| {
        let total = *cum.last().expect("not empty");
        for x in buf.iter_mut() {
            let r = rng.next(1 << 53) as f64 / (1u64 << 53) as f64 * total;
            *x = v[cum.partition_point(|&c| c <= r).min(v.len() - 1)].0;
        }
        median(buf)
    };
    let mut d: Vec<f64> = (0..RESAMPLES)
        .map(|_| draw(b, &cum_b, &mut buf_b, &mut rng) - draw(a, &cum_a, &mut buf_a, &mut rng))
        .collect();
    d.sort_by(f64::total_cmp);
    let lo = d[(RESAMPLES as f64 * 0.025) as usize];
    let hi = d[((RESAMPLES as f64 * 0.975) as usize).min(RESAMPLES - 1)];
    (lo, hi)
}

/// The path most of a group's measured ops took; "not measured" when none was.
fn dominant(m: &BTreeMap<&'static str, u64>) -> String {
    m.iter()
        .max_by_key(|(_, n)| **n)
        .map_or(NOT_MEASURED, |(e, _)| *e)
        .to_owned()
}

const NOT_MEASURED: &str = "not measured";

/// Whether the path changed from A to B: unknown (`None`) where either run measured
/// no path for the group.
fn path_changed(r: &Row) -> Option<bool> {
    (r.engine_a != NOT_MEASURED && r.engine_b != NOT_MEASURED).then(|| r.engine_a != r.engine_b)
}

/// Timed ops a run needs in a group for an interval of the change of its median: with
/// fewer, a bootstrap of one or two values gives an interval of no width, which would
/// call any difference significant.
const MIN_FOR_INTERVAL: usize = 5;

/// Compares run B with run A (each scanned once).
pub fn diff(ra: &mut Run, rb: &mut Run) -> Result<Diff, ReadError> {
    let sa = samples(ra)?;
    let sb = samples(rb)?;
    let mut out = Diff::default();
    for (k, (na, va, ma)) in &sa {
        let Some((nb, vb, mb)) = sb.get(k) else {
            out.only_a.push(format!("{} {}", k.0, bucket_label(k.1)));
            continue;
        };
        let mut changes = Vec::new();
        for (i, what) in std::iter::once("total").chain(PHASES).enumerate() {
            let a = va.values(i);
            let b = vb.values(i);
            // A phase measured in neither run is left out (the total never is); so is
            // an unresolved time that is 0 wherever measured.
            let neither = a.is_empty() && b.is_empty() && what != "total";
            if neither || (what == "unresolved" && a.iter().chain(&b).all(|x| x.0 == 0)) {
                continue;
            }
            let med = |v: &[(i64, f64)]| (!v.is_empty()).then(|| weighted_median(&mut v.to_vec()) / 1e3);
            let ci = (a.len() >= MIN_FOR_INTERVAL && b.len() >= MIN_FOR_INTERVAL).then(|| {
                let ci = bootstrap_ci(&a, &b, 0x5EED ^ i as u64);
                (ci.0 / 1e3, ci.1 / 1e3)
            });
            changes.push(Change {
                what: what.into(),
                median_a_us: med(&a),
                median_b_us: med(&b),
                ci_us: ci,
                significant: ci.is_some_and(|ci| ci.0 > 0.0 || ci.1 < 0.0),
            });
        }
        let impact_us = changes
            .first()
            .filter(|c| c.what == "total")
            .and_then(Change::delta_us)
            .map(|d| d * *nb as f64);
        out.rows.push(Row {
            op: k.0.to_owned(),
            bucket: k.1,
            count_a: *na,
            count_b: *nb,
            impact_us,
            changes,
            engine_a: dominant(ma),
            engine_b: dominant(mb),
        });
    }
    for k in sb.keys() {
        if !sa.contains_key(k) {
            out.only_b.push(format!("{} {}", k.0, bucket_label(k.1)));
        }
    }
    // Rows without an impact (not measured in a run) last.
    let key = |r: &Row| r.impact_us.map_or(-1.0, f64::abs);
    out.rows.sort_by(|x, y| key(y).total_cmp(&key(x)));
    Ok(out)
}

/// Terminal rendering.
pub fn render_text(d: &Diff) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<14} {:>13} {:>7} {:>7} {:>12}  {:<10} {:>10} {:>10} {:>24}  path",
        "op", "size bucket", "n A", "n B", "impact ms", "", "A us", "B us", "B-A us (95% CI)"
    );
    let us = |v: Option<f64>| v.map_or_else(|| "n/m".to_string(), |v| format!("{v:.1}"));
    for r in &d.rows {
        let path = match path_changed(r) {
            Some(true) => format!("CHANGED {} -> {}", r.engine_a, r.engine_b),
            Some(false) => r.engine_a.clone(),
            None if r.engine_a == r.engine_b => r.engine_a.clone(),
            None => format!("{} -> {} (not compared)", r.engine_a, r.engine_b),
        };
        for (i, c) in r.changes.iter().enumerate() {
            let head = if i == 0 {
                format!(
                    "{:<14} {:>13} {:>7} {:>7} {:>12}",
                    r.op,
                    bucket_label(r.bucket),
                    r.count_a,
                    r.count_b,
                    r.impact_us
                        .map_or_else(|| "n/m".to_string(), |v| format!("{:.3}", v / 1e3))
                )
            } else {
                format!("{:<14} {:>13} {:>7} {:>7} {:>12}", "", "", "", "", "")
            };
            let change = match (c.delta_us(), c.ci_us) {
                (Some(delta), Some(ci)) => {
                    let mark = if c.significant { "*" } else { " " };
                    format!("{delta:>+9.1} [{:+.1}, {:+.1}]{mark}", ci.0, ci.1)
                }
                (Some(delta), None) => format!("{delta:>+9.1} (too few)"),
                _ => format!("{:>9}", "n/m"),
            };
            let _ = writeln!(
                s,
                "{head}  {:<10} {:>10} {:>10} {change}  {}",
                c.what,
                us(c.median_a_us),
                us(c.median_b_us),
                if i == 0 { path.as_str() } else { "" }
            );
        }
    }
    let _ = writeln!(
        s,
        "\n(medians; * = the 95 % bootstrap interval of the change excludes 0, given for {MIN_FOR_INTERVAL} or more timed ops in each run (\"too few\" below that: no interval, never significant); impact = change of the median end-to-end time × ops in B; sorted by |impact|; n/m = not measured in that run, so no change; path: the one most measured ops took, CHANGED where both runs measured one and they differ)"
    );
    for o in &d.only_a {
        let _ = writeln!(s, "only in A: {o}");
    }
    for o in &d.only_b {
        let _ = writeln!(s, "only in B: {o}");
    }
    s
}

/// JSON rendering.
pub fn render_json(d: &Diff) -> Value {
    json!({
        "rows": d.rows.iter().map(|r| json!({
            "op": r.op, "size_bucket_bytes": r.bucket, "count_a": r.count_a, "count_b": r.count_b,
            "impact_us": r.impact_us, "engine_a": r.engine_a, "engine_b": r.engine_b,
            "path_changed": path_changed(r),
            "changes": r.changes.iter().map(|c| json!({
                "what": c.what, "median_a_us": c.median_a_us, "median_b_us": c.median_b_us,
                "ci95_us": c.ci_us.map(|ci| [ci.0, ci.1]),
                // Unknown (null) when a run did not measure it.
                "significant": c.ci_us.map(|_| c.significant),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "only_a": d.only_a,
        "only_b": d.only_b,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_finds_a_real_shift_and_not_noise() {
        let a: Vec<(i64, f64)> = (0..500).map(|i| (100_000 + (i * 7919 % 1000), 1.0)).collect();
        let b: Vec<(i64, f64)> = a.iter().map(|x| (x.0 + 5_000, 1.0)).collect();
        let (lo, hi) = bootstrap_ci(&a, &b, 1);
        assert!(lo > 3_000.0 && hi < 7_000.0, "{lo} {hi}");
        let (lo, hi) = bootstrap_ci(&a, &a, 1);
        assert!(lo <= 0.0 && hi >= 0.0, "{lo} {hi}");
    }

    /// A timed op stands for its stratum's ops, in `diff` as in `report`: one slow op
    /// of weight 8 against three fast ones of weight 1 is the median.
    #[test]
    fn weights_count_in_the_median_and_the_interval() {
        let mut v = vec![(1_000, 1.0), (1_000, 1.0), (1_000, 1.0), (50_000, 8.0)];
        assert_eq!(weighted_median(&mut v), 50_000.0);
        let mut u = vec![(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0)];
        assert_eq!(weighted_median(&mut u), 3.0);
        let mut odd = vec![(1, 1.0), (2, 1.0), (3, 1.0)];
        assert_eq!(weighted_median(&mut odd), 2.0);
        // 30 fast ops and 10 slow ones, the slow ones timed at level 3 in A.
        let mut a = vec![(1_000, 1.0); 30];
        a.extend([(50_000, 8.0); 10]);
        let mut b = vec![(1_000, 1.0); 30];
        b.extend([(50_000, 1.0); 10]);
        let (lo, hi) = bootstrap_ci(&a, &b, 7);
        assert!(hi < 0.0, "b's median is lower: {lo} {hi}");
    }

    /// More timed ops than the sample holds, at two levels: the sample's weighted
    /// median is the group's (50,000 ops of weight 1 near 100 ns, 5,000 of weight 16
    /// near 200 ns: the weighted median lies among the heavy ones).
    #[test]
    fn a_full_sample_keeps_the_weighted_median() {
        let mut r = Reservoir::default();
        let mut rng = Rng(3);
        for i in 0..55_000i64 {
            let (v, w) = if i % 11 == 0 {
                (200 + i % 10, 16)
            } else {
                (100 + i % 10, 1)
            };
            let mut s = [None; N_PHASES + 1];
            s[0] = Some(v);
            r.push((s, w), &mut rng);
        }
        assert!(r.tau.is_some());
        let m = weighted_median(&mut r.values(0));
        assert!((195.0..=210.0).contains(&m), "{m}");
    }
}
