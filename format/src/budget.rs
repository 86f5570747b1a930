//! Which operations get their GPU side timed, under a cost budget.
//!
//! Every op keeps its host row. Timing an op with GPU stamps costs a few µs of host
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
/// cost of any stretch of wall time T reach `budget` × T plus `burst_ns` (and one op's
/// cost: the check, [`has_room`], comes before the op) at most: the generic cell rate
/// algorithm, whose one state is `tat`, the wall time by which all that was charged is
/// paid for at the budget's rate. Quiet time earns no credit beyond `burst_ns`, so a
/// burst of ops after a pause, or a loop of collectives after a training step's
/// compute, pays the budget's share as it goes, not a share of the quiet stretch
/// before it. Returns the new `tat` and whether the charge went over: the debt is kept
/// whole, so no op is timed until the budget's rate has paid it down to the burst.
pub fn charge(tat: i64, now_ns: i64, cost_ns: u64, budget: f64, burst_ns: u64) -> (i64, bool) {
    if !(budget.is_finite() && budget > 0.0) {
        return (tat, false);
    }
    let due = tat.max(now_ns).saturating_add(pay(cost_ns, budget));
    (due, due.saturating_sub(now_ns) > pay(burst_ns, budget))
}

/// Whether the rate limiter of [`charge`] has room at `now_ns` for an op the level
/// selected: its debt is within the burst. An op without room is not timed; the level
/// is the writer's ([`Controller`]), so a cluster of selected ops (the hash's, or a
/// burst after a quiet stretch) skips a few of them instead of ratcheting the level up.
pub fn has_room(tat: i64, now_ns: i64, budget: f64, burst_ns: u64) -> bool {
    !(budget.is_finite() && budget > 0.0) || tat.saturating_sub(now_ns) <= pay(burst_ns, budget)
}

/// The wall time that pays for `cost_ns` at the budget's rate.
fn pay(cost_ns: u64, budget: f64) -> i64 {
    (cost_ns as f64 / budget).min(i64::MAX as f64 / 4.0) as i64
}

/// Sets the level from what the last interval measured: how many launching ops the
/// budget chose among, over the time recording was on (the op rate: the shim leaves
/// paused time out), and what timing cost per timed op (the hot
/// path's events, NCCL's events for the op, the writer's driver calls). The level is
/// the lowest at which timing every 2^level-th op would cost at most half the budget:
/// the other half is headroom for the hash's clusters of selected ops, of which the
/// rate limiter ([`has_room`]) skips the few it has no room for. Set from the
/// measured rate rather than stepped, it comes down at the first interval after a
/// burst instead of one level per interval.
#[derive(Clone, Copy, Debug)]
pub struct Controller {
    /// Allowed share of wall time (`f64::INFINITY`: every op).
    pub budget: f64,
    pub level: u8,
    /// What timing cost and how many ops were timed, each interval's figures added to
    /// half the sums before: the cost per timed op is their ratio, and the writer's
    /// queries of an interval's last ops, charged in the next, still count for them.
    cost_ns: f64,
    timed: f64,
}

impl Controller {
    pub fn new(budget: f64) -> Self {
        Self {
            budget,
            level: 0,
            cost_ns: 0.0,
            timed: 0.0,
        }
    }

    /// Over the last `wall_ns`: timing cost `cost_ns` for `timed` ops, and `chosen`
    /// launching ops were issued. Returns the new level; with nothing chosen (a quiet
    /// interval says nothing about the op rate) or no op timed yet, the level stays.
    pub fn update(&mut self, cost_ns: u64, wall_ns: u64, chosen: u64, timed: u64) -> u8 {
        if self.budget.is_infinite() {
            self.level = 0;
            return 0;
        }
        self.cost_ns = self.cost_ns / 2.0 + cost_ns as f64;
        self.timed = self.timed / 2.0 + timed as f64;
        let per_op_ns = self.cost_ns / self.timed.max(f64::MIN_POSITIVE);
        if wall_ns == 0 || chosen == 0 || self.timed == 0.0 || per_op_ns <= 0.0 {
            return self.level;
        }
        // The share of wall time timing every op would cost, against half the budget.
        let every_op = per_op_ns * chosen as f64 / wall_ns as f64;
        let over = every_op / (self.budget / 2.0);
        self.level = if over.is_finite() && over > 1.0 {
            (over.log2().ceil() as u64).min(u64::from(MAX_LEVEL)) as u8
        } else if over.is_finite() {
            0
        } else {
            MAX_LEVEL
        };
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
        // 25 µs ops, 4 µs to time one: 16 % of wall time at level 0. One second at
        // level 0 measures it; the level is then where every 2^level-th op costs at
        // most half the 1 % (1 in 64: 0.25 %).
        assert_eq!(c.update(4_000 * 40_000, 1_000_000_000, 40_000, 40_000), 5);
        let share = |l: u8| 4_000.0 * 40_000.0 / f64::from(1u32 << l) / 1e9;
        assert!(share(c.level) <= 0.005 && share(c.level) > 0.0025, "{}", c.level);
        // The same rate measured at that level (1 op in 32 timed) keeps it.
        assert_eq!(c.update(4_000 * 1_250, 1_000_000_000, 40_000, 1_250), 5);
        // The ops slow down tenfold: down at once, not one level per interval.
        assert_eq!(c.update(4_000 * 125, 1_000_000_000, 4_000, 125), 2);
        // Nothing issued: nothing learnt, the level stays; nothing timed at a sparse
        // level: the last cost per op still holds.
        assert_eq!(c.update(0, 1_000_000_000, 0, 0), 2);
        assert_eq!(c.update(0, 1_000_000_000, 400_000, 0), 9);
        // Unlimited budget: never sparser than every op.
        let mut all = Controller::new(f64::INFINITY);
        assert_eq!(all.update(u64::MAX / 2, 1, 1, 1), 0);
    }

    #[test]
    fn a_burst_after_a_quiet_stretch_is_caught_within_a_few_ops() {
        // 12 µs ops costing 4.6 µs each to time, one second after the last charge: at a
        // 1 % budget with 20 µs of burst, the quiet second earns nothing; the 5th timed
        // op is over, and the limiter has no room for the next.
        let (mut tat, mut t) = (1_000i64, 1_000_000_000i64);
        let mut n = 0;
        loop {
            assert!(has_room(tat, t, 0.01, 20_000), "op {n}");
            n += 1;
            let (next, over) = charge(tat, t, 4_600, 0.01, 20_000);
            tat = next;
            if over {
                break;
            }
            t += 12_000;
        }
        assert_eq!(n, 5);
        // The whole debt is kept: 5 × 460 µs of wall time pay for the 23 µs.
        assert_eq!(tat, 1_000_000_000 + 5 * 460_000);
        assert!(!has_room(tat, t + 12_000, 0.01, 20_000));
        // Room again once the budget's rate has paid it down to the burst.
        assert!(has_room(tat, tat - 2_000_000, 0.01, 20_000));
        assert!(!has_room(tat, tat - 2_000_001, 0.01, 20_000));
        assert!(has_room(i64::MAX, 0, f64::INFINITY, 0), "every op");
        assert_eq!(charge(5, 1, u64::MAX, f64::INFINITY, 0), (5, false), "every op");
    }

    /// The shim's two rules together (shim/src/timing.rs): the writer's [`Controller`]
    /// sets the level every 250 ms, and an op the level selects is timed only when the
    /// limiter has room. A steady stream of 12 µs ops costing 4.6 µs each to time, plus
    /// the writer's 2 µs a timed op every millisecond (55 % of wall time at level 0),
    /// settles at level 7 (1 op in 128: 0.43 %, under half the 1 % budget) after the
    /// first interval and stays there; the limiter skips a few ops of the hash's
    /// clusters; what is paid stays within the budget plus the burst.
    #[test]
    fn the_level_settles_where_the_rate_fits_half_the_budget() {
        let (mut tat, mut level, mut timed, mut skipped) = (0i64, 0u8, 0u64, 0u64);
        let mut ctl = Controller::new(0.01);
        let (mut cost, mut since) = (0u64, 0i64);
        let (mut polled, mut unpolled) = (0i64, 0u64);
        let (mut chosen, mut timed_now) = (0u64, 0u64);
        let mut settled = Vec::new();
        let step = 12_000i64;
        for i in 0..1_000_000u64 {
            let t = i as i64 * step;
            if t - since >= 250_000_000 {
                level = ctl.update(cost, (t - since) as u64, chosen, timed_now);
                (cost, since, chosen, timed_now) = (0, t, 0, 0);
            }
            chosen += 1;
            // The writer, every millisecond: 2 µs of driver calls per op timed since.
            if t - polled >= 1_000_000 && unpolled > 0 {
                let c = 2_000 * unpolled;
                cost += c;
                tat = charge(tat, t, c, 0.01, 20_000).0;
                (polled, unpolled) = (t, 0);
            }
            if t > 300_000_000 {
                settled.push(level);
            }
            if !selected(mix(i), level) {
                continue;
            }
            if !has_room(tat, t, 0.01, 20_000) {
                skipped += 1;
                continue;
            }
            timed += 1;
            timed_now += 1;
            unpolled += 1;
            cost += 4_600;
            tat = charge(tat, t, 4_600, 0.01, 20_000).0;
        }
        assert!(
            settled.iter().all(|&l| l == 7),
            "levels {:?}",
            (settled.iter().min(), settled.iter().max())
        );
        let paid = timed as f64 * 6_600.0;
        let allowed = 0.01 * 1_000_000.0 * step as f64 + 20_000.0;
        assert!(paid <= allowed, "{paid} > {allowed}");
        // Level 7 times ~7,800 ops over these 12 s; the limiter skips few of them.
        assert!(timed > 7_000, "{timed} timed, {skipped} skipped");
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
