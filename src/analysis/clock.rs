//! Host clock offsets, estimated from the data. Ranks on one host share CLOCK_REALTIME;
//! across hosts it is only as good as NTP/PTP. A collective completes on all its ranks
//! within a few µs (the last rank's data arrives, then everybody finishes), so for
//! each pair of hosts the median difference of their ranks' `gpu_end_ns` over shared
//! collectives estimates the offset, and the spread of those differences its
//! uncertainty.

/// One host's clock relative to the reference host (the first one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostClock {
    /// This host's clock minus the reference's: `t_ref = t_host - offset_ns`.
    pub offset_ns: i64,
    /// Median absolute deviation of the per-collective differences (ns), plus the
    /// reference's own, when the offset was chained through another host.
    pub uncertainty_ns: i64,
    /// Collectives the estimate used.
    pub samples: usize,
}

fn median(v: &mut [i64]) -> i64 {
    super::median(v).expect("a pair of hosts has at least one difference")
}

/// Per pair of hosts, the differences of their earliest completion over shared
/// collectives (a bounded reservoir sample of them).
#[derive(Debug, Default)]
pub struct PairSamples {
    pairs: std::collections::HashMap<(usize, usize), (u64, Vec<i64>)>,
    rng: u64,
}

/// Differences kept per pair of hosts.
const KEEP: usize = 100_000;

impl PairSamples {
    /// One collective: `(host, gpu_end_ns)` of each of its ranks.
    pub fn add(&mut self, ends: impl Iterator<Item = (usize, i64)>) {
        let mut first: Vec<(usize, i64)> = Vec::new();
        for (h, e) in ends {
            match first.iter_mut().find(|x| x.0 == h) {
                Some(x) => x.1 = x.1.min(e),
                None => first.push((h, e)),
            }
        }
        first.sort_unstable();
        for (i, &(h1, e1)) in first.iter().enumerate() {
            for &(h2, e2) in &first[i + 1..] {
                // Times from a corrupt file may lie the whole i64 range apart.
                let Some(d) = e2.checked_sub(e1) else {
                    continue;
                };
                let (seen, v) = self.pairs.entry((h1, h2)).or_default();
                *seen += 1;
                if v.len() < KEEP {
                    v.push(d);
                } else {
                    // Reservoir sampling, deterministic.
                    self.rng = self
                        .rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let j = (self.rng >> 11) % *seen;
                    if (j as usize) < KEEP {
                        v[j as usize] = d;
                    }
                }
            }
        }
    }

    /// Each host's clock (`None`: no collective links it to the reference, host 0).
    pub fn estimate(&self, hosts: usize) -> Vec<Option<HostClock>> {
        let mut out: Vec<Option<HostClock>> = vec![None; hosts];
        if hosts == 0 {
            return out;
        }
        out[0] = Some(HostClock {
            offset_ns: 0,
            uncertainty_ns: 0,
            samples: 0,
        });
        // Breadth-first from the reference through hosts that share collectives.
        let mut frontier = vec![0usize];
        while let Some(known) = frontier.pop() {
            let base = out[known].expect("known host");
            let unknown: Vec<usize> = (0..hosts).filter(|&h| out[h].is_none()).collect();
            for h in unknown {
                let (key, sign) = if known < h {
                    ((known, h), 1)
                } else {
                    ((h, known), -1)
                };
                let Some((seen, d)) = self.pairs.get(&key) else {
                    continue;
                };
                // Checked: differences from a corrupt file may be the ends of i64, and
                // offsets chained through several hosts add up; a host whose offset
                // would overflow stays unknown.
                let mut d: Vec<i64> = d.iter().filter_map(|x| x.checked_mul(sign)).collect();
                if d.is_empty() {
                    continue;
                }
                let m = median(&mut d);
                let mut dev: Vec<i64> = d
                    .iter()
                    .map(|x| i64::try_from(x.abs_diff(m)).unwrap_or(i64::MAX))
                    .collect();
                let mad = median(&mut dev);
                let Some(offset_ns) = base.offset_ns.checked_add(m) else {
                    continue;
                };
                out[h] = Some(HostClock {
                    offset_ns,
                    uncertainty_ns: base.uncertainty_ns.saturating_add(mad),
                    samples: *seen as usize,
                });
                frontier.push(h);
            }
        }
        out
    }
}

/// `ends`: per collective seen on several hosts, `(host index, gpu_end_ns)` of each
/// rank. Returns each host's clock (`None`: no collective links it to the reference).
pub fn estimate(ends: &[Vec<(usize, i64)>], hosts: usize) -> Vec<Option<HostClock>> {
    let mut p = PairSamples::default();
    for c in ends {
        p.add(c.iter().copied());
    }
    p.estimate(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three hosts with skewed clocks: host 1 runs 5 ms ahead, host 2 3 ms behind;
    /// completions jitter by up to ±2 µs. Host 3 shares nothing.
    #[test]
    fn recovers_skewed_clocks() {
        let truth = [0i64, 5_000_000, -3_000_000];
        let mut rng = 12345u64;
        let mut jitter = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((rng >> 33) % 4001) as i64 - 2000
        };
        let mut ends = Vec::new();
        for k in 0..200i64 {
            let t = 1_000_000_000 + k * 100_000;
            // Host 2 only ever meets host 1: its offset is chained through host 1.
            let c = if k % 2 == 0 {
                vec![(0, t + truth[0] + jitter()), (1, t + truth[1] + jitter())]
            } else {
                vec![
                    (1, t + truth[1] + jitter()),
                    (2, t + truth[2] + jitter()),
                    (2, t + truth[2] + 50_000),
                ]
            };
            ends.push(c);
        }
        let est = estimate(&ends, 4);
        for h in 0..3 {
            let c = est[h].unwrap();
            assert!(
                (c.offset_ns - truth[h]).abs() <= 2_000 + c.uncertainty_ns,
                "{h}: {c:?}"
            );
            assert!(c.uncertainty_ns <= 4_000, "{h}: {c:?}");
        }
        assert_eq!(est[2].unwrap().samples, 100);
        assert_eq!(est[3], None);
    }

    /// Completion times at the ends of i64 (a corrupt file) overflow nothing: their
    /// difference is left out, and a host whose offset chained through another would
    /// overflow stays unknown.
    #[test]
    fn extreme_times_overflow_nothing() {
        let est = estimate(&[vec![(0, i64::MIN), (1, i64::MAX)]], 2);
        assert_eq!(est[1], None);
        let half = i64::MAX / 2 + 1;
        let est = estimate(&[vec![(0, 0), (1, half)], vec![(1, 0), (2, half)]], 3);
        assert_eq!(est[1].map(|c| c.offset_ns), Some(half));
        assert_eq!(est[2], None);
    }

    #[test]
    fn one_host_needs_nothing() {
        assert_eq!(estimate(&[], 1)[0].unwrap().offset_ns, 0);
        assert!(estimate(&[], 0).is_empty());
    }
}
