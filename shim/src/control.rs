//! What the shim captures, decided in one place.
//!
//! Every input that changes what is captured is held here, except the recorder's
//! lifecycle (in `state`, with the recorder: passed in where an output needs it) and
//! CUPTI's own state (in `gpu`, with CUPTI). Every output is derived from the inputs by
//! one function here. This module calls nothing outside itself: whoever changes an
//! input then has the outputs applied (`state::apply_capture`, or where no lock may be
//! taken `ffi::plugin::sync_nccl_events` alone; [`set_detail`] takes its applier), which
//! re-derive them from here; no module resyncs another's state by hand.
//!
//! | input | set by |
//! |---|---|
//! | lifecycle: activating, active, disabled (internal error, fork child), finished | `state` |
//! | paused (`zcta_set_recording(0)`) | [`set_paused`] |
//! | sampling detail (`ZCTA_SAMPLE`'s windows: full, draining, off) | [`set_detail`], by the writer's sampler |
//! | NCCL's events follow the budget (events mode, timing on, finite budget) | [`set_follow`], by `timing::start` |
//! | CUPTI capture on, and whether another CUPTI client took over | `gpu` |
//!
//! | output | derived by | applied by |
//! |---|---|---|
//! | NCCL's event mask: our events, or none | [`nccl_events_wanted`] | `ffi::plugin::sync_nccl_events` (lock-free) |
//! | the mask per op in the default (stamps) mode: the budget's ops only | [`follow_budget`] | `ffi::plugin::follow_op` (hot path) |
//! | CUPTI's activity kinds | [`cupti_kinds_wanted`] | `gpu::sync_capture` (under its lock) |
//! | CUPTI's launch callbacks | [`cupti_callbacks_wanted`] | `gpu::sync_capture` |
//! | rows for data-moving calls | [`rows_wanted`] | the hooks (hot path) |

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};

static PAUSED: AtomicBool = AtomicBool::new(false);
static PAUSE_CLOCK: PauseClock = PauseClock::new();

/// How long recording was paused: the budget's controller measures the op rate over
/// the time ops could be timed, so a program that pauses recording for half of each
/// interval does not get a level fit for half its rate (and twice the cost while it
/// records).
struct PauseClock {
    /// When the pause now going on began (0: not paused).
    since_ns: AtomicI64,
    /// Paused time of pauses that ended since the last [`PauseClock::take`].
    ended_ns: AtomicU64,
}

impl PauseClock {
    const fn new() -> Self {
        Self {
            since_ns: AtomicI64::new(0),
            ended_ns: AtomicU64::new(0),
        }
    }

    fn note(&self, paused: bool, now: i64) {
        if paused {
            self.since_ns.store(now.max(1), Ordering::Relaxed);
        } else {
            let since = self.since_ns.swap(0, Ordering::Relaxed);
            if since != 0 {
                self.ended_ns
                    .fetch_add((now - since).max(0) as u64, Ordering::Relaxed);
            }
        }
    }

    /// Paused time since the last call, up to `now` (a pause going on counts up to
    /// `now`, and from `now` at the next call).
    fn take(&self, now: i64) -> u64 {
        let mut t = self.ended_ns.swap(0, Ordering::Relaxed);
        let since = self.since_ns.load(Ordering::Relaxed);
        if since != 0
            && self
                .since_ns
                .compare_exchange(since, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            t += (now - since).max(0) as u64;
        }
        t
    }
}

/// Time recording was paused since the last call (the budget's writer-side step).
pub fn take_paused_ns(now: i64) -> u64 {
    PAUSE_CLOCK.take(now)
}

/// Sampling detail ([`zcta::sample::Detail`]) as the writer's sampler sets it; full
/// without `ZCTA_SAMPLE`.
pub const FULL: u8 = 0;
pub const DRAINING: u8 = 1;
pub const DETAIL_OFF: u8 = 2;
static DETAIL: AtomicU8 = AtomicU8::new(FULL);

static FOLLOW: AtomicBool = AtomicBool::new(false);

/// Pauses (`true`) or resumes recording, at `now`; returns whether it was paused.
pub fn set_paused(paused: bool, now: i64) -> bool {
    let was = PAUSED.swap(paused, Ordering::SeqCst);
    if was != paused {
        PAUSE_CLOCK.note(paused, now);
    }
    was
}

/// Whether recording is paused (hot path).
#[inline]
pub fn paused() -> bool {
    PAUSED.load(Ordering::Relaxed)
}

/// The sampling detail now (hot path: Relaxed).
#[inline]
pub fn detail() -> u8 {
    DETAIL.load(Ordering::Relaxed)
}

/// The sampler's step; `apply` applies the outputs after each change. Opening a
/// window, NCCL's events go on (through a draining step) before calls are marked, so a
/// marked call always has them; closing, marking stops first.
pub fn set_detail(code: u8, apply: impl Fn()) {
    if code == FULL && DETAIL.load(Ordering::SeqCst) == DETAIL_OFF {
        DETAIL.store(DRAINING, Ordering::SeqCst);
        apply();
    }
    DETAIL.store(code, Ordering::SeqCst);
    apply();
}

/// From the start of timing on (events mode, finite budget), NCCL's events are asked
/// for the budget's ops only.
pub fn set_follow(on: bool) {
    FOLLOW.store(on, Ordering::SeqCst);
}

/// Whether NCCL's events follow the budget, op by op (hot path).
#[inline]
pub fn follow_budget() -> bool {
    FOLLOW.load(Ordering::Relaxed)
}

/// Whether NCCL should generate our profiler events now: the recorder is `active`
/// (not activating, stopped by an internal error, in a fork child or finished: the
/// lifecycle's input), recording is not paused, and no sampling window is closed.
pub fn nccl_events_wanted(active: bool) -> bool {
    active && !PAUSED.load(Ordering::SeqCst) && DETAIL.load(Ordering::SeqCst) != DETAIL_OFF
}

/// Whether CUPTI's activity kinds should be on: not paused, no window closed.
pub fn cupti_kinds_wanted() -> bool {
    !PAUSED.load(Ordering::SeqCst) && DETAIL.load(Ordering::SeqCst) != DETAIL_OFF
}

/// Whether CUPTI's launch callbacks should be on: always, except while paused with
/// `ZCTA_PAUSE_CUPTI=1` (`pause_cupti`). Switched off and on under load, they left
/// CUPTI's kernel records with the correlation id of other calls (docs/dev/cupti.md,
/// "Switching CUPTI"), so sampling leaves them on.
pub fn cupti_callbacks_wanted(pause_cupti: bool) -> bool {
    !(pause_cupti && PAUSED.load(Ordering::SeqCst))
}

/// Whether data-moving calls get rows (hot path; the hooks keep sequence numbers and
/// group structure either way).
#[inline]
pub fn rows_wanted() -> bool {
    !paused()
}

#[cfg(test)]
mod tests {
    use super::PauseClock;

    #[test]
    fn the_pause_clock_counts_paused_time_once() {
        let c = PauseClock::new();
        assert_eq!(c.take(100), 0, "never paused");
        c.note(true, 1_000);
        c.note(false, 1_400);
        c.note(true, 2_000);
        assert_eq!(c.take(2_500), 400 + 500, "an ended pause and one going on");
        assert_eq!(c.take(3_000), 500, "the pause going on, from the last call");
        c.note(false, 3_200);
        assert_eq!(c.take(9_000), 200);
        assert_eq!(c.take(10_000), 0, "recording since");
    }
}
