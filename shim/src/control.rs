//! What the shim captures, decided in one place.
//!
//! Every input that changes what is captured is held here, except the recorder's
//! lifecycle (in `state`, with the recorder) and CUPTI's own state (in `gpu`, with
//! CUPTI). Every output is derived from the inputs by one function here, and every
//! change of an input calls [`changed`] (or, where no lock may be taken,
//! [`nccl_changed`]), which re-derives and applies the outputs; no module resyncs
//! another's state by hand.
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
//! | the mask per op in events mode: the budget's ops only | [`follow_budget`] | `ffi::plugin::follow_op` (hot path) |
//! | CUPTI's activity kinds | [`cupti_kinds_wanted`] | `gpu::sync_capture` (under its lock) |
//! | CUPTI's launch callbacks | [`cupti_callbacks_wanted`] | `gpu::sync_capture` |
//! | rows for data-moving calls | [`rows_wanted`] | the hooks (hot path) |

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

static PAUSED: AtomicBool = AtomicBool::new(false);

/// Sampling detail ([`zcta::sample::Detail`]) as the writer's sampler sets it; full
/// without `ZCTA_SAMPLE`.
pub const FULL: u8 = 0;
pub const DRAINING: u8 = 1;
pub const DETAIL_OFF: u8 = 2;
static DETAIL: AtomicU8 = AtomicU8::new(FULL);

static FOLLOW: AtomicBool = AtomicBool::new(false);

/// Pauses (`true`) or resumes recording; returns whether it was paused.
pub fn set_paused(paused: bool) -> bool {
    let was = PAUSED.swap(paused, Ordering::SeqCst);
    if was != paused {
        changed();
    } else {
        nccl_changed();
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

/// The sampler's step. Opening a window, NCCL's events go on (through a draining
/// step) before calls are marked, so a marked call always has them; closing, marking
/// stops first.
pub fn set_detail(code: u8) {
    if code == FULL && DETAIL.load(Ordering::SeqCst) == DETAIL_OFF {
        DETAIL.store(DRAINING, Ordering::SeqCst);
        changed();
    }
    DETAIL.store(code, Ordering::SeqCst);
    changed();
}

/// From the start of timing on (events mode, finite budget), NCCL's events are asked
/// for the budget's ops only.
pub fn set_follow(on: bool) {
    FOLLOW.store(on, Ordering::SeqCst);
    nccl_changed();
}

/// Whether NCCL's events follow the budget, op by op (hot path).
#[inline]
pub fn follow_budget() -> bool {
    FOLLOW.load(Ordering::Relaxed)
}

/// Whether NCCL should generate our profiler events now: the recorder is active (not
/// activating, stopped by an internal error, in a fork child or finished), recording
/// is not paused, and no sampling window is closed.
pub fn nccl_events_wanted() -> bool {
    crate::state::active() && !PAUSED.load(Ordering::SeqCst) && DETAIL.load(Ordering::SeqCst) != DETAIL_OFF
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

/// An input changed: re-derive and apply every output. Takes CUPTI's lock: not from
/// a fork child before `gpu::on_fork_child` (which makes the capture skip it) nor from
/// a panic handler (use [`nccl_changed`]).
pub fn changed() {
    crate::gpu::sync_capture();
    nccl_changed();
}

/// An input changed where no lock may be taken: re-derive and apply NCCL's mask only
/// (atomics only; CUPTI follows at the next [`changed`]).
pub fn nccl_changed() {
    crate::ffi::plugin::sync_nccl_events();
}
