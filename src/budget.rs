//! Which operations get their GPU side timed, under a cost budget.
//!
//! Every op keeps its host row. Timing an op with CUDA events costs a few µs of host
//! and stream time (docs/PERFORMANCE.md, "What one timed op costs"), so when ops come
//! so fast that timing each would cost more than the budget (a share of the process's
//! wall time, `ZCTA_BUDGET`, default 1 %), a rank times only the ops whose key hash
//! has its lowest `level` bits zero: 1 op in 2^level. The key of an op is the same on
//! every rank of it (a collective's `(comm_id, seq)`, a Send's and its Recv's
//! `(comm_id, sender, receiver, seq)`), and the sets are nested (an op timed at level
//! k+1 is timed at level k), so every op the sparsest rank timed was timed on every
//! denser rank and its barrier across ranks stays measurable. Each rank picks its own
//! level from its own measured cost ([`Controller`]).

/// Highest level: 1 op in 65,536 (beyond that the op rate is absurd).
pub const MAX_LEVEL: u8 = 16;

/// splitmix64's finaliser: every input bit moves every output bit. The keys are
/// computed on the hot path of every op once the level is above 0, so they mix a few
/// words rather than hash bytes; stable across builds and hosts like `comm_id`.
const fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Key of a collective: its communicator and index on it.
pub fn coll_key(comm_id: u64, seq: u64) -> u64 {
    mix(mix(comm_id ^ 0x636f_6c6c) ^ seq)
}

/// Key of a Send and of the Recv it matches: the same on both ranks.
pub fn p2p_key(comm_id: u64, sender: i32, receiver: i32, seq: u64) -> u64 {
    let ranks = (u64::from(sender as u32) << 32) | u64::from(receiver as u32);
    mix(mix(mix(comm_id ^ 0x0070_3270) ^ ranks) ^ seq)
}

/// Whether an op with this key is timed at `level`.
#[inline]
pub fn selected(key: u64, level: u8) -> bool {
    level == 0 || key & ((1u64 << level.min(63)) - 1) == 0
}

/// The share of wall time timing may cost, parsed from `ZCTA_BUDGET`: a percentage
/// (`1%`, `0.5%`) or `all` (time every op). `None`: malformed.
pub fn parse_budget(v: &str) -> Option<f64> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("all") {
        return Some(f64::INFINITY);
    }
    let pct: f64 = v.strip_suffix('%').unwrap_or(v).trim().parse().ok()?;
    (pct > 0.0 && pct <= 100.0).then_some(pct / 100.0)
}

/// Charges `cost_ns` of timing, spent at `now_ns`, to a rate limiter that lets the
/// cost of any stretch of wall time T reach `budget` × T plus `burst_ns` at most: the
/// generic cell rate algorithm, whose one state is `tat`, the wall time by which all
/// that was charged is paid for at the budget's rate. Quiet time earns no credit
/// beyond `burst_ns`, so a burst of ops after a pause, or a loop of collectives after
/// a training step's compute, pays the budget's share as it goes, not a share of the
/// quiet stretch before it. Returns the new `tat` and whether the charge went over:
/// then the caller times fewer ops, and `tat` keeps only the `burst_ns` of debt (the
/// next charge is over again only if the fewer ops still cost too much).
pub fn charge(tat: i64, now_ns: i64, cost_ns: u64, budget: f64, burst_ns: u64) -> (i64, bool) {
    if !(budget.is_finite() && budget > 0.0) {
        return (tat, false);
    }
    let pay = |ns: u64| (ns as f64 / budget).min(i64::MAX as f64 / 4.0) as i64;
    let tolerance = pay(burst_ns);
    let due = tat.max(now_ns).saturating_add(pay(cost_ns));
    if due.saturating_sub(now_ns) > tolerance {
        (now_ns.saturating_add(tolerance), true)
    } else {
        (due, false)
    }
}

/// How many levels to go up when a [`charge`] went over: as many as halve the cost
/// since `since_ns` (the last change of level) under its budget share, at least one,
/// so that a steady stream of ops reaches its level in one step instead of paying
/// `burst_ns` once per level.
pub fn raise_by(cost_ns: u64, since_ns: i64, now_ns: i64, budget: f64) -> u8 {
    let allowed = budget * (now_ns - since_ns).max(1) as f64;
    let ratio = cost_ns as f64 / allowed.max(1.0);
    if ratio.is_finite() && ratio > 1.0 {
        (ratio.log2().ceil() as u64).clamp(1, u64::from(MAX_LEVEL)) as u8
    } else {
        1
    }
}

/// Picks the level from the cost measured over the last interval.
#[derive(Clone, Copy, Debug)]
pub struct Controller {
    /// Allowed share of wall time (`f64::INFINITY`: every op).
    pub budget: f64,
    pub level: u8,
}

impl Controller {
    pub fn new(budget: f64) -> Self {
        Self { budget, level: 0 }
    }

    /// `cost_ns`: what timing cost over the last `wall_ns`, at the current level.
    /// Goes up by as many levels as halve the cost under the budget; down one level
    /// when doubling the cost would still leave it under half the budget.
    pub fn update(&mut self, cost_ns: u64, wall_ns: u64) -> u8 {
        if wall_ns == 0 || self.budget.is_infinite() {
            return self.level;
        }
        let share = cost_ns as f64 / wall_ns as f64;
        if share > self.budget {
            let up = (share / self.budget).log2().ceil().max(1.0) as u8;
            self.level = self.level.saturating_add(up).min(MAX_LEVEL);
        } else if self.level > 0 && share * 2.0 < self.budget / 2.0 {
            self.level -= 1;
        }
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_send_and_its_recv_have_one_key() {
        // Rank 0 sends its 5th message to rank 3; rank 3 receives it from rank 0.
        let send = p2p_key(7, 0, 3, 5);
        let recv = p2p_key(7, 0, 3, 5);
        assert_eq!(send, recv);
        assert_ne!(send, p2p_key(7, 3, 0, 5), "the other direction is another op");
        assert_ne!(coll_key(7, 5), coll_key(7, 6));
    }

    proptest! {
        /// Nested sets: an op timed at a sparser level is timed at every denser one,
        /// so whatever the sparsest rank timed, every rank timed.
        #[test]
        fn what_a_sparser_rank_times_every_denser_rank_times(
            comm in any::<u64>(), seq in any::<u64>(), lo in 0u8..=MAX_LEVEL, hi in 0u8..=MAX_LEVEL,
        ) {
            let (dense, sparse) = (lo.min(hi), lo.max(hi));
            let k = coll_key(comm, seq);
            if selected(k, sparse) {
                prop_assert!(selected(k, dense));
            }
        }
    }

    #[test]
    fn a_level_times_about_one_op_in_two_to_the_level() {
        for level in [0u8, 1, 3, 6] {
            let n = 1u64 << 16;
            let hit = (0..n).filter(|&s| selected(coll_key(42, s), level)).count() as f64;
            let want = n as f64 / f64::from(1u32 << level);
            assert!(
                (hit - want).abs() < want * 0.1 + 3.0,
                "level {level}: {hit} of {n}"
            );
        }
    }

    #[test]
    fn the_controller_keeps_the_cost_under_the_budget() {
        let mut c = Controller::new(0.01);
        // 25 µs ops, 4 µs to time one: 16 % of wall time at level 0.
        let cost_at = |level: u8| (4_000.0 * 40_000.0 / f64::from(1u32 << level)) as u64;
        for _ in 0..4 {
            let l = c.level;
            c.update(cost_at(l), 1_000_000_000);
        }
        let share = cost_at(c.level) as f64 / 1e9;
        assert!(share <= 0.01, "level {} costs {share}", c.level);
        assert!(share > 0.0025, "level {} wastes the budget ({share})", c.level);
        // The ops slow down: it comes back down, one level at a time.
        let before = c.level;
        c.update(0, 1_000_000_000);
        assert_eq!(c.level, before - 1);
        // Unlimited budget: never sparser than every op.
        let mut all = Controller::new(f64::INFINITY);
        assert_eq!(all.update(u64::MAX / 2, 1), 0);
    }

    #[test]
    fn a_burst_after_a_quiet_stretch_is_caught_within_a_few_ops() {
        // 12 µs ops costing 4.6 µs each to time, one second after the last charge: at a
        // 1 % budget with 20 µs of burst, the quiet second earns nothing and the 5th
        // timed op is over.
        let (mut tat, mut t) = (1_000i64, 1_000_000_000i64);
        let mut n = 0;
        loop {
            n += 1;
            let (next, over) = charge(tat, t, 4_600, 0.01, 20_000);
            tat = next;
            if over {
                break;
            }
            t += 12_000;
        }
        assert_eq!(n, 5);
        // Only the burst is kept as debt: the next op is over again.
        assert_eq!(tat, t + 2_000_000);
        assert!(charge(tat, t + 12_000, 4_600, 0.01, 20_000).1);
        // From there one step reaches a level whose cost is under the budget: 4.6 µs
        // per 12 µs op is 38 % of wall time, 1 op in 64 is 0.6 %.
        let up = raise_by(4_600 * 5, 1_000_000_000, t + 12_000, 0.01);
        assert_eq!(up, 6);
        assert!(4_600.0 / 12_000.0 / f64::from(1u32 << up) <= 0.01);
        assert_eq!(raise_by(0, 1_000, 2_000, 0.01), 1, "at least one");
        assert_eq!(raise_by(u64::MAX, 1_000, 1_000, 1e-9), MAX_LEVEL);
        assert_eq!(charge(5, 1, u64::MAX, f64::INFINITY, 0), (5, false), "every op");
    }

    #[test]
    fn a_stream_under_the_budget_is_never_over() {
        // 100 ns of timing every 20 µs is 0.5 % of wall time.
        let mut tat = 0;
        for i in 0..100_000i64 {
            let (next, over) = charge(tat, 1_000 + i * 20_000, 100, 0.01, 20_000);
            assert!(!over, "charge {i}");
            tat = next;
        }
    }

    proptest! {
        /// Between any two charges that were not over, nor any between them, the cost
        /// charged is at most the budget's share of the time between them plus the
        /// burst (and a ns of rounding per charge).
        #[test]
        fn what_is_charged_stays_within_the_budget_and_the_burst(
            ops in proptest::collection::vec((0i64..50_000, 0u64..20_000), 1..60),
            budget in 0.001f64..0.5,
        ) {
            let burst = 20_000u64;
            let (mut tat, mut t) = (0i64, 1_000_000i64);
            let mut seen: Vec<(i64, u64, bool)> = Vec::new();
            for (gap, cost) in ops {
                t += gap;
                let (next, over) = charge(tat, t, cost, budget, burst);
                tat = next;
                seen.push((t, cost, over));
            }
            for i in 0..seen.len() {
                let mut sum = 0u64;
                for j in i..seen.len() {
                    if seen[j].2 {
                        break;
                    }
                    sum += seen[j].1;
                    let allowed = budget * (seen[j].0 - seen[i].0) as f64 + burst as f64;
                    prop_assert!(
                        sum as f64 <= allowed + budget * (j - i + 1) as f64 + 1.0,
                        "charges {i}..={j}: {sum} > {allowed}"
                    );
                }
            }
        }
    }

    #[test]
    fn budgets_parse_as_percentages() {
        assert_eq!(parse_budget("1%"), Some(0.01));
        assert_eq!(parse_budget(" 0.5 % "), Some(0.005));
        assert_eq!(parse_budget("2"), Some(0.02));
        assert_eq!(parse_budget("all"), Some(f64::INFINITY));
        for bad in ["0", "-1%", "101%", "lots", ""] {
            assert_eq!(parse_budget(bad), None, "{bad}");
        }
    }
}
