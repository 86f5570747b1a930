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

/// Whether timing that cost `cost_ns` since `since_ns` is over a `budget` share of the
/// time until `now_ns` by more than `burst_ns`: the hot path then raises the level at
/// once, rather than run a burst of ops at a quiet stretch's level until the next
/// evaluation.
pub fn over(cost_ns: u64, since_ns: i64, now_ns: i64, budget: f64, burst_ns: u64) -> bool {
    if since_ns == 0 || budget.is_infinite() {
        return false;
    }
    cost_ns as f64 > budget * (now_ns - since_ns).max(0) as f64 + burst_ns as f64
}

/// How many levels to go up when [`over`]: as many as halve the cost since `since_ns`
/// under its budget share (at least one), so that a burst after a quiet stretch
/// reaches its level in one step instead of paying `burst_ns` once per level.
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
    fn a_burst_over_the_budget_is_caught_within_a_few_ops() {
        // 12 µs ops costing 4.6 µs each to time, from a quiet start: at a 1 % budget
        // with 50 µs of slack, the 12th timed op is over.
        let (mut cost, mut t) = (0u64, 1_000i64);
        let mut n = 0;
        while !over(cost, 1_000, t, 0.01, 50_000) {
            cost += 4_600;
            t += 12_000;
            n += 1;
        }
        assert_eq!(n, 12);
        // From there one step reaches a level whose cost is under the budget: 4.6 µs
        // per 12 µs op is 38 % of wall time, 1 op in 64 is 0.6 %.
        let up = raise_by(cost, 1_000, t, 0.01);
        assert_eq!(up, 6);
        assert!(4_600.0 / 12_000.0 / f64::from(1u32 << up) <= 0.01);
        assert_eq!(raise_by(0, 1_000, 2_000, 0.01), 1, "at least one");
        assert_eq!(raise_by(u64::MAX, 1_000, 1_000, 1e-9), MAX_LEVEL);
        assert!(!over(u64::MAX, 0, 1, 0.01, 0), "not started");
        assert!(!over(u64::MAX, 1, 2, f64::INFINITY, 0), "every op");
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
