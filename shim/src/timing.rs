//! Each operation's GPU side timed on its own stream with a pair of stamps, the default
//! GPU capture (`docs/phases.md`, "How the GPU side is measured").
//!
//! A stamp is a launch of zcta's one-thread kernel ([`cuda::stamp`]) that writes the
//! GPU's `%globaltimer` (ns) into a slot of pinned host memory. Around every interposed
//! call that launches GPU work (an ungrouped op, the outermost `ncclGroupEnd`) the hot
//! path launches one on the op's stream before calling NCCL — it runs when everything
//! ahead of the op on that stream is done: the op's `gpu_ready_ns` — and one after —
//! the op is done: `gpu_end_ns`. (CUDA events with timing did the same job at a cost
//! the program's other streams paid: docs/PERFORMANCE.md.) Slot pairs come from a pool
//! per CUDA context that a communicator's creation ([`prepare`]) or the writer thread
//! ([`Timer`]) fills; an op that finds the pool empty is not timed (counted, never
//! waited for). Nothing is launched into a stream
//! that is being captured into a CUDA graph (its capture is asked before each stamp
//! of the pair). The writer reads the slots off the hot
//! path (memory reads, no driver call) and puts their times on CLOCK_REALTIME through
//! anchors on a stream of its own, renewed every [`ANCHOR_EVERY_NS`]: the anchor
//! kernel, which writes the GPU's time once the writer releases it, between two reads
//! of the host clock ([`Clock::anchor`]). An op's ready time waits for the anchor
//! after it and is placed on the line through the two around it ([`Timer::place`]).
//!
//! What this costs grows with NCCL operations only (the program's own kernels are not
//! touched), and the budget ([`zcta::budget`]) keeps it under a share of wall time.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crossbeam_channel::{Receiver, Sender, bounded};
use zcta::budget::Controller;
use zcta::gpu::GpuItem;
use zcta::record::Timing;
use zcta::sink::TimingStatus;

use crate::ffi::cuda;
use crate::ffi::queue::{self, Consumer, Producer};
use crate::ffi::sys::now_ns;

const IDLE: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(IDLE);
static WHY_OFF: Mutex<Option<String>> = Mutex::new(None);
/// The budget's level now (1 op in 2^level is timed).
static LEVEL: AtomicU8 = AtomicU8::new(0);
/// Host ns the hot path spent timing since the writer last looked, plus the stream
/// time its stamps cost ([`GPU_NS_PER_STAMP`]).
static COST_NS: AtomicU64 = AtomicU64::new(0);
/// Since when `COST_NS` has been summed (CLOCK_REALTIME ns; 0: not yet).
static COST_SINCE_NS: AtomicI64 = AtomicI64::new(0);
/// The budget's rate limiter ([`zcta::budget::charge`]): the wall time by which all
/// that timing cost is paid for at the budget's rate.
static PAID_BY_NS: AtomicI64 = AtomicI64::new(0);
/// Cost the rate limiter allows beyond the budget's share of any stretch of time:
/// about four timed send/recv groups. An op the level selects beyond it is not timed.
const BURST_NS: u64 = 20_000;
/// Launching calls the budget chose among since the writer last looked: a stretch
/// without any (recording paused, a program between phases) says nothing about the
/// op rate, and the level is kept.
static CHOSEN: AtomicU64 = AtomicU64::new(0);
/// Ops timed since the writer last looked (the cost per timed op is `COST_NS` / this).
static TIMED: AtomicU64 = AtomicU64::new(0);

/// Stream time one stamp adds to the op's stream: a pair widened the window of CUDA
/// events around the same work by 3.46 µs on an H100 (`bench/timestamp_costs.py`,
/// docs/PERFORMANCE.md). Counted in the budget as if it were always on the critical
/// path.
const GPU_NS_PER_STAMP: u64 = 1_730;
/// What NCCL's profiler events (generated for the budget's ops only,
/// [`crate::ffi::plugin::follow_op`]) cost per op on an H200: a send/recv group to
/// itself took 1.27 µs longer with them than without (bench/always_on.sh, configs
/// `off` and `nomask`, docs/PERFORMANCE.md), 0.64 µs for each of its two ops.
pub const NCCL_EVENTS_NS_PER_OP: u64 = 640;
/// Slot pairs the writer keeps ready per context, and the most it hands out.
const POOL_READY: usize = 256;
const POOL_MAX: usize = 4096;
/// Free pairs below which the hot path wakes the writer to refill.
const POOL_LOW: usize = POOL_READY / 4;
/// Pairs made on the hot path when it meets a new context (the writer makes the rest).
const POOL_FIRST: usize = 32;
/// Anchors are renewed this often (the GPU timer drifted 4 µs/s against
/// CLOCK_REALTIME on the H200).
const ANCHOR_EVERY_NS: i64 = 500_000_000;
/// The budget is re-evaluated this often.
const BUDGET_EVERY_NS: i64 = 250_000_000;
/// The writer's rounds come as often as records arrive (every few µs under load); the
/// driver is asked at most this often — its calls take the driver's locks that the
/// program's launches take too — and sooner only when the hot path found a pool low.
const POLL_EVERY_NS: i64 = 1_000_000;
/// Set by the hot path when a pool runs low or dry: the next round refills at once.
static REFILL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// An op whose stamps have not been written this long after its call is given up.
const GIVE_UP_NS: i64 = 30_000_000_000;

/// Driver calls of the timing that failed (the writer counts the other outcomes per
/// call from the ops rows).
static ERRORS: AtomicU64 = AtomicU64::new(0);

/// An op's two slots (indexes into its context's [`Stamper`]'s slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pair {
    ready: usize,
    end: usize,
}

/// Slots of a context: a pair for each of [`POOL_MAX`] ops, then the anchors': for
/// each of [`ANCHOR_SLOTS`] its time, then their flags, then their "running" marks.
const SLOTS: usize = 2 * POOL_MAX + 3 * ANCHOR_SLOTS;
const ANCHOR_SLOTS: usize = 16;
// [`Clock::in_flight`] has a bit per anchor slot.
const _: () = assert!(ANCHOR_SLOTS <= 32);

/// A context's kernels and the slots they write.
struct Stamper {
    func: usize,
    /// The anchor kernel, where the driver gave it ([`cuda::Kernels`]).
    anchor: Option<usize>,
    slots: cuda::Slots,
}

impl Stamper {
    /// Made in the calling thread's current context.
    fn new() -> Result<Self, i32> {
        let k = cuda::kernels()?;
        Ok(Self {
            func: k.stamp,
            anchor: k.anchor,
            slots: cuda::host_slots(SLOTS)?,
        })
    }

    /// The device address of slot `i`.
    fn dev(&self, i: usize) -> u64 {
        self.slots.dev + 8 * i as u64
    }

    /// Clears slot `i` and launches a stamp into it on `stream`.
    #[inline]
    fn stamp(&self, i: usize, stream: usize) -> Result<(), i32> {
        self.slots.cells[i].store(0, Ordering::Relaxed);
        cuda::stamp(self.func, self.dev(i), stream)
    }

    /// Slot `i`'s GPU time, once its stamp ran (the GPU's timer is never 0).
    fn read(&self, i: usize) -> Option<u64> {
        Some(self.slots.cells[i].load(Ordering::Acquire)).filter(|&t| t != 0)
    }
}

/// The free slot pairs of one CUDA context.
struct Pool {
    ctx: usize,
    /// The driver's id of the context ([`cuda::ctx_id`]): after a device reset the
    /// new context may have the old one's handle, whose stamp kernel and slots are
    /// gone with it.
    id: u64,
    /// A newer context has this one's handle: its pairs still in flight are read, but
    /// no more are made and its clock is not anchored again.
    retired: std::sync::atomic::AtomicBool,
    stamper: OnceLock<Stamper>,
    /// The stamp kernel or its slots could not be made here: its ops are not timed.
    broken: std::sync::atomic::AtomicBool,
    /// Held while making (the writer and a communicator's creation may both).
    making: Mutex<()>,
    tx: Sender<Pair>,
    rx: Receiver<Pair>,
    made: AtomicU64,
}

/// A CUDA context as the timing tells it apart: its handle and the driver's id for it
/// ([`Pool::id`]).
type CtxKey = (usize, u64);

impl Pool {
    /// A pool of context `ctx` (the driver's id `id`), with no pairs and no stamper.
    fn new(ctx: usize, id: u64) -> Self {
        let (tx, rx) = bounded(POOL_MAX);
        Self {
            ctx,
            id,
            retired: std::sync::atomic::AtomicBool::new(false),
            stamper: OnceLock::new(),
            broken: std::sync::atomic::AtomicBool::new(false),
            making: Mutex::new(()),
            tx,
            rx,
            made: AtomicU64::new(0),
        }
    }

    fn key(&self) -> CtxKey {
        (self.ctx, self.id)
    }

    fn give(&self, p: Pair) {
        // Bounded to POOL_MAX pairs, which is all that are ever made: cannot fail.
        let _ = self.tx.try_send(p);
    }

    /// Hands out up to `n` more pairs, first making the context's stamp kernel and
    /// slots in the calling thread's current context, which must be `self.ctx`.
    /// Returns how many.
    fn make(&self, n: usize) -> usize {
        self.make_with(|_| n)
    }

    /// Makes sure that the pool's first `n` pairs exist, whoever began making them:
    /// the writer may hold the lock, its stamper made and its pairs not yet handed
    /// out. Returns how many this call made.
    fn make_first(&self, n: usize) -> usize {
        self.make_with(|made| n.saturating_sub(made))
    }

    /// [`Pool::make`] of `more(pairs made so far)` pairs, decided under the lock.
    fn make_with(&self, more: impl FnOnce(usize) -> usize) -> usize {
        let _one = self.making.lock().unwrap_or_else(|p| p.into_inner());
        if self.stamper.get().is_none() {
            if self.broken.load(Ordering::Relaxed) {
                return 0;
            }
            match Stamper::new() {
                Ok(s) => {
                    let _ = self.stamper.set(s);
                }
                // Not tried again: its ops count as errors (`begin`).
                Err(_) => {
                    self.broken.store(true, Ordering::Relaxed);
                    return 0;
                }
            }
        }
        let n = more(self.made.load(Ordering::Relaxed) as usize);
        for i in 0..n {
            let m = self.made.load(Ordering::Relaxed) as usize;
            if m >= POOL_MAX {
                return i;
            }
            self.made.store(m as u64 + 1, Ordering::Relaxed);
            self.give(Pair {
                ready: 2 * m,
                end: 2 * m + 1,
            });
        }
        n
    }
}

impl Pool {
    /// Launches a stamp into slot `i` on `stream`, one of this context's streams. The
    /// stamp kernel is this context's: when the calling thread has another context
    /// current (or none), this one is made current for the launch and the thread's
    /// own put back after.
    #[inline]
    fn stamp(&self, i: usize, stream: usize) -> Result<(), i32> {
        let st = self.stamper.get().ok_or(-1)?;
        let own = cuda::current_ctx();
        if own == self.ctx {
            return st.stamp(i, stream);
        }
        cuda::set_current(self.ctx)?;
        let r = st.stamp(i, stream);
        // 0: the thread had none; setting none unbinds it again.
        let _ = cuda::set_current(own);
        r
    }
}

static POOLS: Mutex<Vec<Arc<Pool>>> = Mutex::new(Vec::new());

thread_local! {
    static LAST_POOL: std::cell::RefCell<Option<Arc<Pool>>> = const { std::cell::RefCell::new(None) };
}

fn pool_for(ctx: usize) -> Option<Arc<Pool>> {
    // Id 0: the driver could not say; the context is then told by its handle alone
    // (the newest pool of that handle), so a failed query never retires a pool.
    let id = cuda::ctx_id(ctx);
    let same = |p: &Pool| p.ctx == ctx && (id == 0 || p.id == id);
    let cached = LAST_POOL
        .try_with(|c| {
            c.borrow()
                .as_ref()
                .filter(|p| same(p) && !p.retired.load(Ordering::Relaxed))
                .cloned()
        })
        .ok()
        .flatten();
    if cached.is_some() {
        return cached;
    }
    let pool = {
        let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
        match pools.iter().rev().find(|p| same(p)) {
            Some(p) => Arc::clone(p),
            None => {
                for old in pools.iter().filter(|p| p.ctx == ctx) {
                    old.retired.store(true, Ordering::Relaxed);
                }
                let p = Arc::new(Pool::new(ctx, id));
                // Never made here, on the program's thread in the middle of an op
                // (loading the stamp kernel may wait for the GPU): by the writer, or
                // at a communicator's creation ([`prepare`]).
                if !REFILL.swap(true, Ordering::Relaxed) {
                    wake_writer();
                }
                pools.push(Arc::clone(&p));
                p
            }
        }
    };
    let _ = LAST_POOL.try_with(|c| *c.borrow_mut() = Some(Arc::clone(&pool)));
    Some(pool)
}

/// After a communicator was created, on the thread that created it: makes the stamp
/// kernel, its slots and the first pairs for that thread's current context (usually
/// the communicator's device), so that its first ops need not wait for the writer.
/// Creating a communicator already costs milliseconds, and NCCL's own setup there is
/// no safer during another thread's capture; zcta's calls run in relaxed capture
/// mode, so they never invalidate one.
pub fn prepare() {
    if !on() {
        return;
    }
    let ctx = cuda::current_ctx();
    if ctx == 0 {
        return;
    }
    if let Some(p) = pool_for(ctx) {
        first_pairs(&p);
    }
}

/// [`prepare`]'s pairs: the pool's first [`POOL_FIRST`], unless made already.
fn first_pairs(p: &Pool) {
    if (p.made.load(Ordering::Relaxed) as usize) < POOL_FIRST {
        cuda::relaxed(|| p.make_first(POOL_FIRST));
    }
}

/// An op in flight: its slots and what it belongs to.
#[derive(Clone, Copy)]
struct Flight {
    /// The op ([`zcta::gpu::ext_id`]: its op_id, or its group's id).
    ext: u64,
    /// Its pool's context ([`Pool::key`]).
    ctx: CtxKey,
    /// The stream it was recorded on (its later ops complete after it).
    stream: usize,
    /// The thread whose per-thread default stream `stream` is (its handle is the same
    /// on every thread: [`PER_THREAD_STREAM`]); 0 for any other stream.
    thread: i32,
    pair: Pair,
    /// When the launching call started (picks the anchor nearest to it).
    call_ns: i64,
    /// An op to resolve; `false`: an op that will not be timed (its call failed, or
    /// its end stamp could not be launched), whose pair goes back to the pool only
    /// once its ready stamp, which may still be queued, has written its slot.
    keep: bool,
}

/// A stream as the GPU knows it: the same handle is one stream per context (the
/// legacy stream too), and the per-thread default stream is one per thread.
type Lane = (CtxKey, usize, i32);

impl Flight {
    fn lane(&self) -> Lane {
        (self.ctx, self.stream, self.thread)
    }
}

/// `CU_STREAM_PER_THREAD`: the calling thread's default stream, whichever thread.
const PER_THREAD_STREAM: usize = 2;

static FLIGHTS: OnceLock<Producer<Flight>> = OnceLock::new();

/// Timing starts with the first communicator created while the process has a CUDA
/// driver (usually the first: the driver is loaded by then), when the configuration
/// asks for it.
pub fn start(enabled: bool, budget: f64, follow_nccl: bool) {
    if STATE.load(Ordering::Acquire) != IDLE {
        return;
    }
    let why = if !enabled {
        Some("ZCTA_GPU=off".to_string())
    } else if !cuda::init() {
        // Asked again at the next communicator: a program may load CUDA after its
        // first one (the first CUDA call maps the driver). Until then: off, and why.
        *WHY_OFF.lock().unwrap_or_else(|p| p.into_inner()) =
            Some("no CUDA driver in the process (libcuda.so.1 not loaded)".to_string());
        return;
    } else if FLIGHTS.get().is_none() {
        Some("no writer".to_string())
    } else {
        None
    };
    match why {
        Some(w) => {
            *WHY_OFF.lock().unwrap_or_else(|p| p.into_inner()) = Some(w);
            STATE.store(OFF, Ordering::Release);
        }
        None => {
            *WHY_OFF.lock().unwrap_or_else(|p| p.into_inner()) = None;
            BUDGET_BITS.store(budget.to_bits(), Ordering::Relaxed);
            // The budget's first interval starts here, with the first op it may time.
            COST_SINCE_NS.store(now_ns(), Ordering::Relaxed);
            STATE.store(ON, Ordering::Release);
            // Every op selected anyway under ZCTA_BUDGET=all.
            crate::control::set_follow(follow_nccl && budget.is_finite());
        }
    }
}

static BUDGET_BITS: AtomicU64 = AtomicU64::new(0);

/// The writer's control, to wake it (to refill the slot pools); set at activation.
static WRITER: std::sync::OnceLock<std::sync::Arc<zcta::sink::WriterControl>> = std::sync::OnceLock::new();

/// Where [`wake_writer`] reaches the writer (the recorder's activation).
pub fn set_writer(ctl: std::sync::Arc<zcta::sink::WriterControl>) {
    let _ = WRITER.set(ctl);
}

/// Asks the writer to run a round now.
fn wake_writer() {
    if let Some(c) = WRITER.get() {
        c.wake();
    }
}

/// In a fork child: the parent's stamps and pools mean nothing there.
pub fn on_fork_child() {
    if STATE.load(Ordering::Acquire) == ON {
        STATE.store(OFF, Ordering::SeqCst);
    }
}

/// Whether ops are being timed (hot path).
#[inline]
pub fn on() -> bool {
    STATE.load(Ordering::Relaxed) == ON
}

/// The budget's level now: 1 op in 2^level is selected (hot path).
#[inline]
pub fn level() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

/// What the budget decided for a launching call: its `level` (the one its op keys
/// were tested at), whether it is `selected` (any of its ops), and what else its
/// selection costs beyond its events (NCCL's events for its selected ops).
#[derive(Clone, Copy, Debug)]
pub struct Pick {
    pub level: u8,
    pub selected: bool,
    pub extra_ns: u64,
}

/// A thread's count of the launching calls the budget weighed ([`begin`]), added to
/// the process's count every [`CHOSEN_BATCH`] calls: one locked add per batch instead
/// of per call. A thread holds back at most 7 calls, where the level leaves 0 only
/// at about a thousand calls a second (timing each at ~6 µs would cost more than half
/// of a 1 % budget): a few hundred in each of the writer's 250 ms rounds.
pub struct Chosen(std::cell::Cell<u32>);

/// Calls a thread counts before adding them to the process's count ([`Chosen`]).
const CHOSEN_BATCH: u32 = 8;

impl Chosen {
    pub const fn new() -> Self {
        Self(std::cell::Cell::new(0))
    }

    #[inline]
    fn add(&self) {
        self.add_to(&CHOSEN);
    }

    #[inline]
    fn add_to(&self, total: &AtomicU64) {
        let n = self.0.get() + 1;
        if n >= CHOSEN_BATCH {
            total.fetch_add(u64::from(n), Ordering::Relaxed);
            self.0.set(0);
        } else {
            self.0.set(n);
        }
    }
}

/// The stamp launched before an op's launching call; handed to [`end`].
pub struct Begun {
    pool: Arc<Pool>,
    pair: Pair,
    stream: usize,
    level: u8,
    cost_ns: u64,
    call_ns: i64,
}

/// Before the launching call on `stream`: launches the op's ready stamp, unless the
/// stream is capturing, the budget did not select the call (`pick`), or no slot pair
/// is free. `Err` says why the op is not timed (hot path). The call is counted in the
/// calling thread's `chosen`.
#[inline]
pub fn begin(stream: u64, pick: Pick, chosen: &Chosen) -> Result<Begun, Timing> {
    if !on() {
        return Err(Timing::Off);
    }
    let stream = stream as usize;
    let level = pick.level;
    chosen.add();
    // A call the budget did not select touches neither the stream nor the driver: its
    // capture is not asked (`graph_captured` is then what NCCL's events said, if any).
    if !pick.selected {
        return Err(Timing::Skipped(level));
    }
    let t0 = now_ns();
    match cuda::capturing(stream) {
        Ok(false) => {}
        Ok(true) => return Err(Timing::Captured),
        Err(_) => {
            ERRORS.fetch_add(1, Ordering::Relaxed);
            return Err(Timing::Error);
        }
    }
    let Some(pool) = cuda::stream_ctx(stream).ok().and_then(pool_for) else {
        ERRORS.fetch_add(1, Ordering::Relaxed);
        return Err(Timing::Error);
    };
    if pool.broken.load(Ordering::Relaxed) {
        ERRORS.fetch_add(1, Ordering::Relaxed);
        return Err(Timing::Error);
    }
    let Ok(pair) = pool.rx.try_recv() else {
        if !REFILL.swap(true, Ordering::Relaxed) {
            wake_writer();
        }
        return Err(Timing::PoolEmpty);
    };
    if pool.rx.len() <= POOL_LOW && !REFILL.swap(true, Ordering::Relaxed) {
        // Running low (or only the first pairs made): the writer refills at once,
        // woken once until it has.
        wake_writer();
    }
    // A pair is handed out only once its context's stamper exists.
    if pool.stamp(pair.ready, stream).is_err() {
        pool.give(pair);
        ERRORS.fetch_add(1, Ordering::Relaxed);
        return Err(Timing::Error);
    }
    Ok(Begun {
        pool,
        pair,
        stream,
        level,
        cost_ns: (now_ns() - t0).max(0) as u64 + pick.extra_ns,
        call_ns: t0,
    })
}

/// After the launching call, which returned `rc`: launches the end stamp and hands
/// the pair to the writer (hot path). `ext` names the op or group.
#[inline]
pub fn end(b: Begun, rc: i32, ext: u64) -> Timing {
    let t0 = now_ns();
    let f = Flight {
        ext,
        ctx: b.pool.key(),
        stream: b.stream,
        thread: if b.stream == PER_THREAD_STREAM {
            crate::ffi::sys::gettid()
        } else {
            0
        },
        pair: b.pair,
        call_ns: b.call_ns,
        keep: true,
    };
    // The ready stamp is queued on the stream: the pair is not free until it wrote
    // (a later op reusing the pair would read it). When the flight queue is full the
    // pair is not given back at all: the pool is one pair short. What the stamps
    // launched for an op that will not be timed cost is charged too.
    let retire = |mut f: Flight| {
        f.keep = false;
        if let Some(q) = FLIGHTS.get() {
            let _ = q.try_push(f);
        }
        let now = now_ns();
        charge(b.cost_ns + (now - t0).max(0) as u64 + GPU_NS_PER_STAMP, now);
    };
    // A failed call launched nothing to time; an in-progress one (a non-blocking
    // communicator) launches later, after this call returned.
    if rc != zcta::nccl::NCCL_SUCCESS {
        retire(f);
        return if rc == zcta::nccl::NCCL_IN_PROGRESS {
            Timing::InProgress
        } else {
            Timing::Error
        };
    }
    // The stream may have begun capturing during the call (the program's other thread
    // began a capture on it): then nothing more is launched into it, and the op, which
    // may or may not be in the graph, is not timed.
    if cuda::capturing(b.stream) != Ok(false) || b.pool.stamp(b.pair.end, b.stream).is_err() {
        retire(f);
        ERRORS.fetch_add(1, Ordering::Relaxed);
        return Timing::Error;
    }
    let pushed = FLIGHTS.get().is_some_and(|q| q.try_push(f).is_ok());
    let now = now_ns();
    charge(b.cost_ns + (now - t0).max(0) as u64 + 2 * GPU_NS_PER_STAMP, now);
    if !pushed {
        // Both stamps may still write: the pair is not given back (as above).
        return Timing::PoolEmpty;
    }
    TIMED.fetch_add(1, Ordering::Relaxed);
    Timing::Timed(b.level)
}

/// Charges what timing cost (`spent` ns, by the hot path for an op or by the writer
/// for the ops it polled) to the budget's rate limiter, which [`has_room`] reads.
#[inline]
fn charge(spent: u64, now: i64) {
    COST_NS.fetch_add(spent, Ordering::Relaxed);
    let budget = f64::from_bits(BUDGET_BITS.load(Ordering::Relaxed));
    let mut paid_by = PAID_BY_NS.load(Ordering::Relaxed);
    loop {
        let (next, _) = zcta::budget::charge(paid_by, now, spent, budget, BURST_NS);
        match PAID_BY_NS.compare_exchange_weak(paid_by, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break,
            Err(v) => paid_by = v,
        }
    }
}

/// Whether the budget's rate limiter has room now for an op the level selected
/// ([`zcta::budget::has_room`]; hot path, only for selected ops).
#[inline]
pub fn has_room() -> bool {
    let budget = f64::from_bits(BUDGET_BITS.load(Ordering::Relaxed));
    zcta::budget::has_room(PAID_BY_NS.load(Ordering::Relaxed), now_ns(), budget, BURST_NS)
}

/// An anchor: a GPU time (`gpu_ns`, of one of our stamps) that was `host_ns` ±
/// `err_ns` on CLOCK_REALTIME.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    gpu_ns: u64,
    host_ns: i64,
    err_ns: i64,
}

impl Anchor {
    /// GPU time `gpu` on CLOCK_REALTIME.
    fn host(&self, gpu: u64) -> i64 {
        self.host_ns.wrapping_add(gpu.wrapping_sub(self.gpu_ns) as i64)
    }

    /// How far GPU time `gpu` is from this anchor, in ns either way.
    fn distance(&self, gpu: u64) -> u64 {
        (gpu.wrapping_sub(self.gpu_ns) as i64).unsigned_abs()
    }

    /// GPU time `gpu`, which lies between this anchor and the later anchor `b`, on
    /// CLOCK_REALTIME: on the line through the two (the timer's drift taken as steady
    /// between them), within the larger of their errors. `None` when `gpu` is not
    /// between them or they do not both move forward.
    fn between(&self, b: &Anchor, gpu: u64) -> Option<i64> {
        let span_gpu = b.gpu_ns.wrapping_sub(self.gpu_ns) as i64;
        let span_host = b.host_ns.wrapping_sub(self.host_ns);
        let into = gpu.wrapping_sub(self.gpu_ns) as i64;
        if span_gpu <= 0 || span_host <= 0 || !(0..=span_gpu).contains(&into) {
            return None;
        }
        // Rounded to the nearest ns (both spans are positive).
        let moved = (2 * i128::from(into) * i128::from(span_host) + i128::from(span_gpu))
            / (2 * i128::from(span_gpu));
        Some(self.host_ns.wrapping_add(moved as i64))
    }
}

/// Where a GPU time was put on CLOCK_REALTIME, and what its error is made of.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Placed {
    /// Between two anchors: within the larger of their errors.
    Between { err_ns: i64 },
    /// From one anchor, `dist_ns` away from it: its error, and the drift over that
    /// distance ([`Timer::error_bound_ns`]).
    From { err_ns: i64, dist_ns: u64 },
}

/// What consecutive anchors of the clocks said of the GPU timer's drift against the
/// host clock, in ns per s. Between two anchors the timer and the host clock disagree
/// by `off` more than at the first, each anchor within its own error: the drift lies
/// between `(off - e1 - e2) / span` (seen: what the errors cannot explain, per host
/// second) and `(off + e1 + e2) / span` (the most the anchors allow, per second of the
/// GPU's timer, over which distances from an anchor are measured).
#[derive(Default)]
struct Drift {
    seen_ns_per_s: i64,
    bound_ns_per_s: f64,
    /// Whether two anchors of a clock were ever compared.
    measured: bool,
    /// Anchors taken, of any clock.
    pushes: u64,
}

impl Drift {
    /// Adds anchor `a` to `clock`, comparing it with the one before.
    fn push(&mut self, clock: &mut Clock, a: Anchor) {
        if let Some(prev) = clock.anchors.back().copied() {
            let span_s = ((a.host_ns - prev.host_ns) as f64 / 1e9).max(1e-3);
            // The bound is applied to distances on the GPU's timer
            // ([`Timer::error_bound_ns`]): per second of it (a timer running slow
            // covers fewer of its own seconds than of the host's).
            let span_gpu_s = ((a.gpu_ns.wrapping_sub(prev.gpu_ns) as i64) as f64 / 1e9).max(1e-3);
            let off = a.host_ns.wrapping_sub(prev.host(a.gpu_ns)).unsigned_abs() as f64;
            let errs = prev.err_ns.saturating_add(a.err_ns) as f64;
            self.seen_ns_per_s = self.seen_ns_per_s.max(((off - errs).max(0.0) / span_s) as i64);
            self.bound_ns_per_s = self.bound_ns_per_s.max((off + errs) / span_gpu_s);
            self.measured = true;
        }
        self.pushes += 1;
        clock.anchors.push_back(a);
        if clock.anchors.len() > ANCHORS_KEPT {
            clock.anchors.pop_front();
        }
    }
}

/// One context's clock anchors, newest last.
#[derive(Default)]
struct Clock {
    stream: usize,
    anchors: VecDeque<Anchor>,
    /// Anchor tries so far (they take the anchors' slots in turn).
    tries: usize,
    /// Anchor slots whose kernel or stamp was launched and whose time was not seen:
    /// given up on, it may still write there (bit `i` for slot `i`).
    in_flight: u32,
    last_try_ns: i64,
    broken: bool,
}

const ANCHORS_KEPT: usize = 4;
/// Tries per anchor (the narrowest bracket is kept) and the longest spin on one.
const ANCHOR_TRIES: usize = 3;
const ANCHOR_SPIN_NS: i64 = 2_000_000;

/// Spins until `seen` gives a value, for at most [`ANCHOR_SPIN_NS`] after `since`;
/// past its first 10 µs it lets other threads run between looks (the GPU answers in
/// a few µs; a driver that stands in for the GPU with a thread on the same CPUs
/// needs them).
fn wait_until(since: i64, mut seen: impl FnMut() -> Option<u64>) -> Option<u64> {
    loop {
        if let Some(v) = seen() {
            return Some(v);
        }
        let waited = now_ns() - since;
        if waited > ANCHOR_SPIN_NS {
            return None;
        }
        if waited > 10_000 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

impl Clock {
    /// The best of [`ANCHOR_TRIES`] anchors made on our own stream (the narrowest
    /// bracket), with the anchor kernel where there is one ([`Clock::gated`]); with a
    /// stamp ([`Clock::stamped`]) where there is none, and in a round where no try of
    /// the anchor kernel answered (a writer held past the kernel's wait on a loaded
    /// host: a wider bracket, rather than no anchor). Caller made `ctx` current.
    fn anchor(&mut self, now: i64, st: &Stamper) -> Option<Anchor> {
        self.last_try_ns = now;
        if self.stream == 0 {
            self.stream = cuda::stream_create().ok()?;
        }
        let gated = st
            .anchor
            .and_then(|func| self.tries_with(st, |i, stream| Self::gated(st, func, i, stream)));
        gated.or_else(|| self.tries_with(st, |i, stream| Self::stamped(st, i, stream)))
    }

    /// The best anchor of [`ANCHOR_TRIES`] tries of `make` (anchor slot, stream). The
    /// anchors' slots are taken in turn, and one whose last kernel or stamp has not
    /// written its time yet (given up on, it may still write) is passed over.
    fn tries_with(
        &mut self,
        st: &Stamper,
        mut make: impl FnMut(usize, usize) -> Result<Option<(u64, i64, i64)>, i32>,
    ) -> Option<Anchor> {
        let mut best: Option<Anchor> = None;
        for _ in 0..ANCHOR_TRIES {
            let i = self.tries % ANCHOR_SLOTS;
            self.tries += 1;
            let bit = 1u32 << i;
            if self.in_flight & bit != 0 {
                if st.read(2 * POOL_MAX + i).is_none() {
                    continue;
                }
                self.in_flight &= !bit;
            }
            let got = match make(i, self.stream) {
                Ok(got) => got,
                Err(_) => break,
            };
            let Some((gpu_ns, t0, t1)) = got else {
                self.in_flight |= bit;
                continue;
            };
            let a = Anchor {
                gpu_ns,
                host_ns: t0 + (t1 - t0) / 2,
                // The bracket, and how far the host clock was seen from CLOCK_REALTIME.
                err_ns: (t1 - t0 + 1) / 2 + crate::ffi::sys::clock_error_ns(),
            };
            if best.is_none_or(|b| a.err_ns < b.err_ns) {
                best = Some(a);
            }
        }
        best
    }

    /// An anchor from the anchor kernel in anchor slot `i`: launched, seen running,
    /// then released by the flag between two reads of the host clock, `t0` before the
    /// flag is set and `t1` after its time is seen: `Ok(Some((gpu_ns, t0, t1)))`;
    /// `Ok(None)` when it did not run or answer within [`ANCHOR_SPIN_NS`] (its flag is
    /// set anyway, so that it ends as soon as it runs); `Err` when it could not be
    /// launched.
    fn gated(st: &Stamper, func: usize, i: usize, stream: usize) -> Result<Option<(u64, i64, i64)>, i32> {
        let base = 2 * POOL_MAX;
        let (time, flag, running) = (base + i, base + ANCHOR_SLOTS + i, base + 2 * ANCHOR_SLOTS + i);
        for c in [time, flag, running] {
            st.slots.cells[c].store(0, Ordering::Relaxed);
        }
        cuda::anchor(func, st.dev(time), st.dev(flag), st.dev(running), stream)?;
        let release = || st.slots.cells[flag].store(1, Ordering::Release);
        let launched = now_ns();
        if wait_until(launched, || st.read(running)).is_none() {
            release();
            return Ok(None);
        }
        let t0 = now_ns();
        release();
        let Some(gpu_ns) = wait_until(t0, || st.read(time)) else {
            return Ok(None);
        };
        let t1 = crate::ffi::sys::now_ns_after_loads();
        // 1: the kernel gave up waiting (this thread was held past its 1 ms).
        Ok((gpu_ns != 1).then_some((gpu_ns, t0, t1)))
    }

    /// An anchor from a stamp in anchor slot `i`, launched between two reads of the
    /// host clock and spun on until it is seen written (the bracket holds its launch).
    fn stamped(st: &Stamper, i: usize, stream: usize) -> Result<Option<(u64, i64, i64)>, i32> {
        let slot = 2 * POOL_MAX + i;
        let t0 = now_ns();
        st.stamp(slot, stream)?;
        Ok(
            wait_until(t0, || st.read(slot))
                .map(|gpu_ns| (gpu_ns, t0, crate::ffi::sys::now_ns_after_loads())),
        )
    }

    fn nearest(&self, t: i64) -> Option<Anchor> {
        self.anchors
            .iter()
            .copied()
            .min_by_key(|a| (a.host_ns - t).unsigned_abs())
    }

    /// GPU time `gpu` between two consecutive anchors, placed on the line through
    /// them ([`Anchor::between`]).
    fn between(&self, gpu: u64) -> Option<(i64, Placed)> {
        self.anchors
            .iter()
            .zip(self.anchors.iter().skip(1))
            .find_map(|(a, b)| {
                let host = a.between(b, gpu)?;
                Some((
                    host,
                    Placed::Between {
                        err_ns: a.err_ns.max(b.err_ns),
                    },
                ))
            })
    }

    /// GPU time `gpu` from the anchor nearest to the call at `call_ns` (no later
    /// anchor came in time).
    fn by_nearest(&self, call_ns: i64, gpu: u64) -> Option<(i64, Placed)> {
        let a = self.nearest(call_ns)?;
        Some((
            a.host(gpu),
            Placed::From {
                err_ns: a.err_ns,
                dist_ns: a.distance(gpu),
            },
        ))
    }

    /// Whether GPU time `gpu` is before the oldest anchor kept.
    fn before_oldest(&self, gpu: u64) -> bool {
        self.anchors
            .front()
            .is_some_and(|a| (gpu.wrapping_sub(a.gpu_ns) as i64) < 0)
    }

    /// Whether the newest anchor was taken after GPU time `gpu` (a time not between
    /// two anchors yet will be once the next one is taken).
    fn passed(&self, gpu: u64) -> bool {
        self.anchors
            .back()
            .is_some_and(|b| gpu.wrapping_sub(b.gpu_ns) as i64 <= 0)
    }
}

/// An op whose stamps were read (its pair is back in its pool), waiting for the anchor
/// after its times so that they are placed between two anchors ([`Timer::place`]).
#[derive(Clone, Copy)]
struct Read {
    ext: u64,
    ctx: CtxKey,
    call_ns: i64,
    ready: u64,
    end: u64,
}

/// The writer's side: fills the pools, anchors the clocks, reads the slots and turns
/// them into [`GpuItem::Timed`]; sets the budget's level.
pub struct Timer {
    flights: Consumer<Flight>,
    pending: VecDeque<Flight>,
    clocks: HashMap<CtxKey, Clock>,
    relaxed: bool,
    ctl: Option<Controller>,
    last_budget_ns: i64,
    /// When the driver was last asked ([`POLL_EVERY_NS`]).
    last_poll_ns: i64,
    /// Ops read, waiting for the anchor after their times ([`Timer::place`]).
    read: VecDeque<Read>,
    /// How many ops at the front of `read` were looked at with the anchors there were
    /// when [`Drift::pushes`] was `scanned_at`; the earliest time one of them is late
    /// (waited its wait, or [`GIVE_UP_NS`] without an anchor to place it), and when and
    /// for which context one of them first wants an early anchor.
    scanned: usize,
    scanned_at: u64,
    next_late_ns: i64,
    next_due: Option<(i64, CtxKey)>,
    /// How long an op waits for that anchor after its call: half of how long the
    /// writer holds an op's row for its GPU side (`ZCTA_GPU_HOLD_MS`), so that its
    /// times still arrive in time when they are placed from one anchor instead; 0
    /// (no wait) under [`MIN_WAIT_NS`].
    wait_ns: i64,
    /// Largest error of the anchors around a ready time placed between two (`None`:
    /// none was).
    between_err_ns: Option<i64>,
    /// Longest op (end − ready, on the GPU's timer) whose ready time was placed between
    /// two anchors: its end is off by the drift over it too.
    max_span_ns: u64,
    /// Largest error of an anchor that placed a GPU time alone (`None`: none did).
    from_one_err_ns: Option<i64>,
    /// What consecutive anchors said of the GPU timer's drift.
    drift: Drift,
    /// Farthest a GPU time placed from one anchor was from it: the drift since the
    /// anchor grows its error with it ([`Timer::status`]).
    max_dist_ns: u64,
    lost: u64,
}

/// The shortest wait for the anchor after an op ([`Timer::wait_ns`]): with a hold
/// (`ZCTA_GPU_HOLD_MS`) under twice this, times are placed from the nearest anchor as
/// soon as they are read, rather than raced against the hold by anchors taken every
/// few milliseconds.
const MIN_WAIT_NS: i64 = 100_000_000;

/// Anchors taken early for ops waiting for one ([`Timer::poll`]) are at least this
/// far apart: with a short `ZCTA_GPU_HOLD_MS`, ops that cannot wait are placed from
/// one anchor rather than anchors taken hundreds of times a second.
const EARLY_ANCHOR_GAP_NS: i64 = 20_000_000;

impl Timer {
    /// Made once per process, with the recorder (before timing can start); `hold_ns`:
    /// how long the writer holds an op's row for its GPU side.
    /// `None` when there is no memory for its queue.
    pub fn new(hold_ns: i64) -> Option<Self> {
        let (tx, rx) = queue::bounded(POOL_MAX)?;
        let _ = FLIGHTS.set(tx);
        Some(Self {
            flights: rx,
            pending: VecDeque::new(),
            clocks: HashMap::new(),
            relaxed: false,
            ctl: None,
            last_budget_ns: 0,
            last_poll_ns: 0,
            read: VecDeque::new(),
            scanned: 0,
            scanned_at: 0,
            next_late_ns: i64::MAX,
            next_due: None,
            wait_ns: if hold_ns / 2 >= MIN_WAIT_NS {
                hold_ns / 2
            } else {
                0
            },
            between_err_ns: None,
            max_span_ns: 0,
            from_one_err_ns: None,
            drift: Drift::default(),
            max_dist_ns: 0,
            lost: 0,
        })
    }

    /// One round (writer thread): refill the pools, renew stale anchors, resolve the
    /// ops whose stamps were written, re-evaluate the budget.
    pub fn poll(&mut self, out: &mut Vec<GpuItem>) {
        if STATE.load(Ordering::Acquire) != ON {
            return;
        }
        if !self.relaxed {
            // This thread's driver calls must never count as unsafe calls during
            // another thread's global-mode capture.
            cuda::relax_capture_mode();
            self.relaxed = true;
        }
        while let Some(f) = self.flights.try_pop() {
            self.pending.push_back(f);
        }
        let now = now_ns();
        let refill = REFILL.swap(false, Ordering::Relaxed);
        if now - self.last_poll_ns < POLL_EVERY_NS && !refill {
            return;
        }
        self.last_poll_ns = now;
        let due = self.anchor_due(now);
        let pools: Vec<Arc<Pool>> = POOLS.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for p in &pools {
            if p.retired.load(Ordering::Relaxed) {
                continue;
            }
            let clock = self.clocks.entry(p.key()).or_default();
            if clock.broken {
                continue;
            }
            let low = p.rx.len() < POOL_READY && (p.made.load(Ordering::Relaxed) as usize) < POOL_MAX;
            let stale = (clock
                .anchors
                .back()
                .is_none_or(|a| now - a.host_ns >= ANCHOR_EVERY_NS)
                && now - clock.last_try_ns >= ANCHOR_EVERY_NS / 10)
                || (due == Some(p.key()) && now - clock.last_try_ns >= EARLY_ANCHOR_GAP_NS);
            if !(low || stale) {
                continue;
            }
            if cuda::set_current(p.ctx).is_err() {
                clock.broken = true;
                continue;
            }
            if low {
                p.make(POOL_READY - p.rx.len());
            }
            if stale
                && let Some(st) = p.stamper.get()
                && let Some(a) = clock.anchor(now, st)
            {
                self.drift.push(clock, a);
            }
        }
        // What reading the timed ops' slots cost this thread counts in the budget.
        if !self.pending.is_empty() || !self.read.is_empty() {
            // A fresh time: the anchors above may have taken milliseconds, and an op's
            // wait must end before the writer's hold of its row does.
            let t0 = now_ns();
            self.resolve(t0);
            self.place(t0, out, false);
            let t1 = now_ns();
            charge((t1 - t0).max(0) as u64, t1);
        }
        self.budget(now);
    }

    /// The context whose next anchor is taken now rather than when it is due: that of
    /// the op read whose ready time no anchor has passed yet and whose wait
    /// ([`Timer::wait_ns`]) ends first, once half of it is over (the other half leaves
    /// room for a writer held up on a loaded machine, or an anchor that failed once).
    fn anchor_due(&self, now: i64) -> Option<CtxKey> {
        self.next_due.filter(|&(t, _)| now >= t).map(|(_, ctx)| ctx)
    }

    /// Puts the times of the ops read on CLOCK_REALTIME: between the anchors around
    /// each ready time once the anchor after it is taken; from the anchor nearest to the
    /// call once the op has waited [`Timer::wait_ns`], or when `last`. An op is looked at
    /// again only when an anchor was taken or its wait ran out, so a round costs the
    /// ops read since the last one, not all that wait.
    fn place(&mut self, now: i64, out: &mut Vec<GpuItem>, last: bool) {
        let full = last || self.drift.pushes != self.scanned_at || now >= self.next_late_ns;
        let start = if full {
            0
        } else {
            self.scanned.min(self.read.len())
        };
        if start == self.read.len() {
            return;
        }
        let mut read = std::mem::take(&mut self.read);
        let (mut next_late, mut next_due) = if full {
            (i64::MAX, None)
        } else {
            (self.next_late_ns, self.next_due)
        };
        let mut i = 0;
        read.retain(|r| {
            i += 1;
            if i <= start {
                return true;
            }
            let Some(again) = self.place_one(r, now, last, out) else {
                return false;
            };
            next_late = next_late.min(again);
            if self.clocks.get(&r.ctx).is_some_and(|c| !c.passed(r.ready)) {
                let due = r.call_ns + self.wait_ns / 2;
                if next_due.is_none_or(|(d, _)| due < d) {
                    next_due = Some((due, r.ctx));
                }
            }
            true
        });
        self.read = read;
        self.scanned = self.read.len();
        self.scanned_at = self.drift.pushes;
        self.next_late_ns = next_late;
        self.next_due = next_due;
    }

    /// [`Timer::place`] for one op: `None` when it is done with (written, or given up),
    /// else when it is late (its wait over, or [`GIVE_UP_NS`] once it is) and must be
    /// looked at again.
    fn place_one(&mut self, r: &Read, now: i64, last: bool, out: &mut Vec<GpuItem>) -> Option<i64> {
        let Some(clock) = self.clocks.get(&r.ctx) else {
            self.lost += 1;
            return None;
        };
        // A ready time before the clock's oldest anchor (an op run before the clock was
        // first anchored) will never lie between two: no wait for it.
        let late = last || now - r.call_ns >= self.wait_ns || clock.before_oldest(r.ready);
        // The ready time is placed; the end keeps its distance from it on the GPU's
        // timer (the op's duration as CUDA events measure it), so within the drift
        // over that duration of where the ready time lies.
        let span = r.end.wrapping_sub(r.ready) as i64;
        let placed = clock
            .between(r.ready)
            .or_else(|| late.then(|| clock.by_nearest(r.call_ns, r.ready)).flatten());
        let Some((ready_ns, placed)) = placed else {
            // Not placed from one anchor when late: its clock has none (not reached: an
            // op is read only once its clock has one); given up like an op whose clock
            // never had one.
            if late && (last || now - r.call_ns >= GIVE_UP_NS) {
                self.lost += 1;
                return None;
            }
            let wait = if late { GIVE_UP_NS } else { self.wait_ns };
            return Some(r.call_ns.saturating_add(wait));
        };
        match placed {
            Placed::Between { err_ns } => {
                self.between_err_ns = self.between_err_ns.max(Some(err_ns));
                self.max_span_ns = self.max_span_ns.max(span.unsigned_abs());
            }
            Placed::From { err_ns, dist_ns } => {
                self.from_one_err_ns = self.from_one_err_ns.max(Some(err_ns));
                // The end is at most its span farther from the anchor.
                let end_dist = dist_ns.saturating_add(span.unsigned_abs());
                self.max_dist_ns = self.max_dist_ns.max(end_dist);
            }
        }
        out.push(GpuItem::Timed {
            ext: r.ext,
            ready_ns,
            end_ns: ready_ns.wrapping_add(span),
        });
        None
    }

    /// Reads the slots of the ops in flight whose stamps were written, gives their pairs
    /// back and keeps their times for [`Timer::place`].
    fn resolve(&mut self, now: i64) {
        let pools: Vec<Arc<Pool>> = POOLS.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // Streams with an op not done yet: their later ops were launched after it and
        // are not read now, so slots are read no more than needed; the ops of other
        // streams are (a stream far behind must not hold them back). Every op
        // kept goes to the back, so the order is kept.
        let mut behind: Vec<Lane> = Vec::new();
        let n = self.pending.len();
        for _ in 0..n {
            let Some(f) = self.pending.pop_front() else { break };
            if behind.contains(&f.lane()) {
                self.pending.push_back(f);
                continue;
            }
            // A flight's pair came from its context's pool, made with its stamper.
            let Some((pool, st)) = pools
                .iter()
                .find(|p| p.key() == f.ctx)
                .and_then(|p| Some((p, p.stamper.get()?)))
            else {
                self.lost += u64::from(f.keep);
                continue;
            };
            // A retired pool's context is gone (a device reset gave its handle to a
            // new one): a stamp of it not written yet never will be, and must not hold
            // back the later ops of its stream.
            let waiting = !pool.retired.load(Ordering::Relaxed) && now - f.call_ns < GIVE_UP_NS;
            if !f.keep {
                // An op not timed: its pair is free once its ready stamp wrote.
                if st.read(f.pair.ready).is_some() {
                    pool.give(f.pair);
                } else if waiting {
                    behind.push(f.lane());
                    self.pending.push_back(f);
                }
                continue;
            }
            // The end stamp runs after the ready one (same stream): both are written.
            let (Some(ready), Some(end)) = (st.read(f.pair.ready), st.read(f.pair.end)) else {
                if waiting {
                    behind.push(f.lane());
                    self.pending.push_back(f);
                } else {
                    // Not given back: a stamp still queued on a stuck stream may write
                    // its slots later.
                    self.lost += 1;
                }
                continue;
            };
            // Read once its clock has an anchor: until then its pair stays taken, so
            // that a clock never anchored runs its pool dry (ops not timed, counted)
            // rather than piling up times it cannot place.
            if self.clocks.get(&f.ctx).is_none_or(|c| c.anchors.is_empty()) {
                if now - f.call_ns < GIVE_UP_NS {
                    self.pending.push_back(f);
                } else {
                    self.lost += 1;
                    pool.give(f.pair);
                }
                continue;
            }
            pool.give(f.pair);
            self.read.push_back(Read {
                ext: f.ext,
                ctx: f.ctx,
                call_ns: f.call_ns,
                ready,
                end,
            });
        }
    }

    fn budget(&mut self, now: i64) {
        let ctl = self
            .ctl
            .get_or_insert_with(|| Controller::new(f64::from_bits(BUDGET_BITS.load(Ordering::Relaxed))));
        if self.last_budget_ns == 0 {
            self.last_budget_ns = now;
            return;
        }
        if now - self.last_budget_ns < BUDGET_EVERY_NS {
            return;
        }
        self.last_budget_ns = now;
        let since = COST_SINCE_NS.swap(now, Ordering::Relaxed);
        let cost = COST_NS.swap(0, Ordering::Relaxed);
        let chosen = CHOSEN.swap(0, Ordering::Relaxed);
        let timed = TIMED.swap(0, Ordering::Relaxed);
        // The rate of the ops that could be timed: over the time recording was on.
        let paused = crate::control::take_paused_ns(now);
        let wall = ((now - since).max(1) as u64).saturating_sub(paused).max(1);
        LEVEL.store(ctl.update(cost, wall, chosen, timed), Ordering::Relaxed);
    }

    /// At the end: gives the GPU up to `wait_ns` to finish what is pending.
    pub fn finish(&mut self, wait_ns: i64, out: &mut Vec<GpuItem>) {
        let until = now_ns() + wait_ns;
        loop {
            self.last_poll_ns = 0;
            self.poll(out);
            if self.pending.is_empty() || now_ns() >= until {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.lost += self.pending.iter().filter(|f| f.keep).count() as u64;
        self.pending.clear();
        // The ops read are placed between anchors once one is taken after them.
        self.close_anchors();
        self.place(now_ns(), out, true);
    }

    /// At the end, a clock gets one more anchor where an op read waits for it (its
    /// times are then placed between two anchors), and where it has only one, made
    /// before the last renewal was due (a run shorter than [`ANCHOR_EVERY_NS`]), so
    /// that its drift is measured and bounds the times placed by the first.
    fn close_anchors(&mut self) {
        if STATE.load(Ordering::Acquire) != ON {
            return;
        }
        let now = now_ns();
        let pools: Vec<Arc<Pool>> = POOLS.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for p in &pools {
            let Some(clock) = self.clocks.get_mut(&p.key()) else {
                continue;
            };
            let lone = clock.anchors.len() == 1
                && clock.anchors.back().is_some_and(|a| now - a.host_ns >= 1_000_000);
            let key = p.key();
            let waited = self.read.iter().any(|r| r.ctx == key && !clock.passed(r.ready));
            if !(lone || waited) || clock.broken || p.retired.load(Ordering::Relaxed) {
                continue;
            }
            if cuda::set_current(p.ctx).is_err() {
                clock.broken = true;
                continue;
            }
            if let Some(st) = p.stamper.get()
                && let Some(a) = clock.anchor(now, st)
            {
                self.drift.push(clock, a);
            }
        }
    }

    /// The error of any GPU time written: for one placed between two anchors the larger
    /// of their errors; for one placed from a single anchor its error and the most
    /// drift the anchors allow over the farthest such a time was from its anchor.
    /// `None` (not known) where times were placed from one anchor while no two anchors
    /// were ever compared: their drift was not measured.
    fn error_bound_ns(&self) -> Option<i64> {
        if self.from_one_err_ns.is_some() && !self.drift.measured {
            return None;
        }
        let drift_over = |d: u64| (self.drift.bound_ns_per_s * d as f64 / 1e9).ceil() as i64;
        let between = self
            .between_err_ns
            .map(|e| e.saturating_add(drift_over(self.max_span_ns)));
        let from_one = self
            .from_one_err_ns
            .map(|e| e.saturating_add(drift_over(self.max_dist_ns)));
        between.max(from_one)
    }

    /// Whether a GPU time was placed.
    fn placed(&self) -> bool {
        self.between_err_ns.is_some() || self.from_one_err_ns.is_some()
    }

    /// For the `process` row.
    pub fn status(&self) -> TimingStatus {
        let state = match STATE.load(Ordering::Acquire) {
            ON => {
                let b = f64::from_bits(BUDGET_BITS.load(Ordering::Relaxed));
                if b.is_infinite() {
                    "on (GPU stamps, every op: ZCTA_BUDGET=all)".to_string()
                } else {
                    format!(
                        "on (GPU stamps, budget {}% of wall time, level now {})",
                        b * 100.0,
                        LEVEL.load(Ordering::Relaxed)
                    )
                }
            }
            IDLE => match WHY_OFF.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                Some(why) => format!("off: {why}"),
                None => "off: no communicator was created".to_string(),
            },
            _ => format!(
                "off: {}",
                WHY_OFF
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
                    .unwrap_or_else(|| "fork child".into())
            ),
        };
        let on = state.starts_with("on");
        TimingStatus {
            state,
            on,
            errors: on.then(|| ERRORS.load(Ordering::Relaxed)),
            lost: on.then_some(self.lost),
            clock_error_ns: on.then(|| self.error_bound_ns()).flatten(),
            // Not measured is not 0: a clock whose second anchor (at the latest, at the
            // end) did not answer has one.
            drift_ns_per_s: (on && self.placed() && self.drift.measured).then_some(self.drift.seen_ns_per_s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_communicators_first_pairs_are_made_even_where_the_writer_made_the_stamper() {
        // The writer, woken when the pool was made, may have made the stamper and not
        // yet handed out its pairs: the communicator's creation still leaves its first
        // pairs in the pool, and makes none twice.
        let p = Pool::new(0x1000, 1);
        let cells: &'static [AtomicU64] = Vec::from_iter((0..SLOTS).map(|_| AtomicU64::new(0))).leak();
        let st = Stamper {
            func: 0,
            anchor: None,
            slots: cuda::Slots { cells, dev: 0 },
        };
        assert!(p.stamper.set(st).is_ok());
        first_pairs(&p);
        assert_eq!(p.rx.len(), POOL_FIRST);
        first_pairs(&p);
        assert_eq!(p.made.load(Ordering::Relaxed), POOL_FIRST as u64);
        assert_eq!(p.make_first(POOL_FIRST), 0);
        assert_eq!(p.make(POOL_READY - p.rx.len()), POOL_READY - POOL_FIRST);
        assert_eq!(p.make_first(POOL_FIRST), 0);
        assert_eq!(p.rx.len(), POOL_READY);
        let mut seen = std::collections::HashSet::new();
        while let Ok(pair) = p.rx.try_recv() {
            assert_eq!(pair.end, pair.ready + 1);
            assert!(seen.insert(pair.ready), "{pair:?} handed out twice");
        }
    }

    #[test]
    fn a_thread_adds_its_chosen_calls_in_batches_and_loses_none() {
        let total = AtomicU64::new(0);
        let c = Chosen::new();
        for _ in 0..CHOSEN_BATCH - 1 {
            c.add_to(&total);
        }
        assert_eq!(total.load(Ordering::Relaxed), 0);
        c.add_to(&total);
        assert_eq!(total.load(Ordering::Relaxed), u64::from(CHOSEN_BATCH));
        for _ in 0..10 * CHOSEN_BATCH {
            c.add_to(&total);
        }
        assert_eq!(total.load(Ordering::Relaxed), u64::from(11 * CHOSEN_BATCH));
    }

    /// A GPU timer running 2 % fast against the host clock, offset far from it.
    fn truth(gpu: u64) -> i64 {
        1_700_000_000_000_000_000 + ((gpu - 5_000_000_000) as f64 / 1.02) as i64
    }

    fn anchor(gpu: u64, off: i64, err: i64) -> Anchor {
        Anchor {
            gpu_ns: gpu,
            host_ns: truth(gpu) + off,
            err_ns: err,
        }
    }

    #[test]
    fn a_time_between_two_anchors_lies_within_the_larger_of_their_errors() {
        // Three anchors 0.5 s apart, each off by up to its error; the timer drifts 2 %.
        let mut clock = Clock::default();
        let mut drift = Drift::default();
        for (g, off, err) in [
            (5_000_000_000, 900, 1_000),
            (5_510_000_000, -1_400, 1_500),
            (6_020_000_000, 200, 300),
        ] {
            drift.push(&mut clock, anchor(g, off, err));
        }
        for g in (5_000_000_000..=6_020_000_000u64).step_by(7_919_111) {
            let (host, placed) = clock.between(g).unwrap();
            let Placed::Between { err_ns } = placed else {
                panic!("{placed:?}")
            };
            let err = (host - truth(g)).abs();
            assert!(err <= err_ns, "{g}: {err} ns off, claimed {err_ns}");
            // From one anchor the same time may be off by ~2 % of its distance.
            let (one, _) = clock.by_nearest(truth(g), g).unwrap();
            assert!((one - truth(g)).abs() <= 5_200_000, "{g}");
            assert!(clock.passed(g));
        }
        // Outside the anchors: not between any two.
        assert!(clock.between(4_999_999_999).is_none());
        assert!(clock.between(6_020_000_001).is_none());
        assert!(!clock.passed(6_020_000_001));
        let (_, p) = clock.by_nearest(truth(6_100_000_000), 6_100_000_000).unwrap();
        assert_eq!(
            p,
            Placed::From {
                err_ns: 300,
                dist_ns: 80_000_000
            }
        );
    }

    #[test]
    fn anchors_that_do_not_both_move_forward_place_nothing_between_them() {
        let a = anchor(5_000_000_000, 0, 100);
        let mut b = anchor(5_500_000_000, 0, 100);
        assert!(a.between(&b, 5_200_000_000).is_some());
        assert!(b.between(&a, 5_200_000_000).is_none());
        b.host_ns = a.host_ns;
        assert!(a.between(&b, 5_200_000_000).is_none());
        // The timer wrapped between them: still forward.
        let a = Anchor {
            gpu_ns: u64::MAX - 10,
            host_ns: 1_000,
            err_ns: 1,
        };
        let b = Anchor {
            gpu_ns: 89,
            host_ns: 1_100,
            err_ns: 1,
        };
        assert_eq!(a.between(&b, 39), Some(1_050));
    }
}
