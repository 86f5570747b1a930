//! GPU capture through CUPTI's activity API (safe side; the calls are in
//! `ffi::cupti`).
//!
//! Lifecycle: idle until the first communicator is created ([`start`]), then active
//! — each launching NCCL call marks its thread ([`begin`]), CUPTI's API callback on
//! NCCL's launch calls reads the mark ([`on_api_enter`]), buffers are flushed by the
//! writer at least every `GpuPolicy::flush_every` — until exit, or until another CUPTI
//! client (torch.profiler/Kineto) arrives: zcta then hands over its last buffers,
//! disables its kinds, leaves CUPTI's subscriber slot and records host-only from there
//! on ([`foreign_client`]).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use zcta::cupti::RawApi;
use zcta::cupti::{self as cu, DRIVER_CBIDS, RUNTIME_CBIDS};
use zcta::gpu::GpuItem;
use zcta::sink::{GpuSource, GpuStatus};

use crate::ffi::cupti;
use crate::ffi::queue::{self, Consumer, Producer};

const IDLE: u8 = 0;
const STARTING: u8 = 1;
const ACTIVE: u8 = 2;
const OFF: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(IDLE);
/// When capture started and stopped (CLOCK_REALTIME ns; 0 / MAX: not yet).
static STARTED_AT: AtomicI64 = AtomicI64::new(0);
static STOPPED_AT: AtomicI64 = AtomicI64::new(i64::MAX);
/// Another CUPTI client registered or subscribed (seen through our interposers).
static FOREIGN: AtomicBool = AtomicBool::new(false);
/// The exit-time forced flush already ran (CUDA may be torn down after it).
static FINAL_FLUSHED: AtomicBool = AtomicBool::new(false);
static WARNED: AtomicBool = AtomicBool::new(false);
static STATUS: Mutex<Option<GpuStatus>> = Mutex::new(None);
static PROXY_THREADS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// What CUPTI's API callback learned about one CUDA call, for the writer.
#[derive(Clone, Copy)]
struct CallNote {
    /// The op or group ([`zcta::gpu::ext_id`]); 0: none (a copy by a proxy thread).
    ext: u64,
    api: RawApi,
}

/// Callback → writer (the consumer is the [`CuptiSource`]'s). Bounded: when full,
/// notes are dropped and counted. The record queue (`ffi::queue`), like ops rows:
/// a note is pushed on every NCCL launch.
static NOTES: OnceLock<Producer<CallNote>> = OnceLock::new();

fn set_status(f: impl FnOnce(&mut GpuStatus)) {
    let mut g = STATUS.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(|| GpuStatus {
        cupti: "off: no communicator was created".into(),
        ..GpuStatus::default()
    }));
}

fn warn_once(msg: std::fmt::Arguments<'_>) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        zcta::warn(msg);
    }
}

/// Whether GPU capture is running (hot path).
#[inline]
pub fn active() -> bool {
    STATE.load(Ordering::Relaxed) == ACTIVE
}

/// What capture enables: the activity kinds and whether the launch callbacks are on.
/// Both are fixed for the process; `ZCTA_CUPTI_KINDS` and `ZCTA_CUPTI_CALLBACKS=0`
/// change them only to measure what each part costs (docs/dev/cupti.md): with fewer
/// kinds some GPU work goes unseen, without callbacks no activity joins an op.
struct Setup {
    kinds: Vec<u32>,
    callbacks: bool,
    /// `ZCTA_PAUSE_CUPTI=1` (a benchmark's setting): a pause switches CUPTI's launch
    /// callbacks off too, not only its kinds (see [`sync_capture`]).
    pause_cupti: bool,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let kinds = match std::env::var("ZCTA_CUPTI_KINDS") {
            Ok(v) => cu::parse_kinds(&v).unwrap_or_else(|e| {
                zcta::warn(format_args!("ZCTA_CUPTI_KINDS: {e}; using the default kinds"));
                cu::DEFAULT_KINDS.to_vec()
            }),
            Err(_) => cu::DEFAULT_KINDS.to_vec(),
        };
        let callbacks = !std::env::var("ZCTA_CUPTI_CALLBACKS").is_ok_and(|v| zcta::config::is_off(&v));
        let pause_cupti = std::env::var("ZCTA_PAUSE_CUPTI").is_ok_and(|v| v.trim() == "1");
        Setup {
            kinds,
            callbacks,
            pause_cupti,
        }
    })
}

/// Serialises the capture's state changes — the end of [`start`], [`sync_capture`],
/// [`CuptiSource::set_detail`] and a foreign client's takeover — so none of them
/// undoes another half-way.
static CTL: Mutex<()> = Mutex::new(());

fn ctl() -> std::sync::MutexGuard<'static, ()> {
    CTL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sampling detail: held by [`crate::control`]. Outside the windows CUPTI's activity
/// kinds go off; its launch callbacks stay on.
use crate::control::{DETAIL_OFF, DRAINING, FULL};
/// Whether the launch callbacks are on (changed under [`ctl`]); [`start`] turns them
/// on.
static CALLBACKS_ON: AtomicBool = AtomicBool::new(true);
/// Whether the activity kinds are on (changed under [`ctl`]); with sampling they
/// follow the windows while the callbacks stay on.
static KINDS_ON: AtomicBool = AtomicBool::new(true);
/// Switches of the kinds not yet passed to the writer, in order: (on, CLOCK_REALTIME ns
/// after the switch). Pushed under [`ctl`], so the writer learns of pauses too: what
/// CUPTI recorded before a stretch with the kinds off says nothing of the work launched
/// during it ([`zcta::streams`]). One list, not a state and a time read apart: the
/// writer must never see a switch's direction without its time (a resume read between
/// the two once hid the pause before it).
static KINDS_SWITCHES: Mutex<Vec<(bool, i64)>> = Mutex::new(Vec::new());
/// More switches than this waiting means the writer is gone: further ones are dropped.
const KINDS_SWITCHES_MAX: usize = 1 << 12;

/// With `ZCTA_SAMPLE`: marked NCCL calls still running (a closing window's drain
/// waits for them: their launch may come late, e.g. while NCCL connects).
static MARKED_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// CUPTI's clock minus CLOCK_REALTIME measured at start (`i64::MIN`: not yet).
static CLOCK_OFFSET: AtomicI64 = AtomicI64::new(i64::MIN);

/// `ZCTA_SAMPLE`'s window and period in ns (0: every op), for [`begin`].
static WINDOW_ON_NS: AtomicI64 = AtomicI64::new(0);
static WINDOW_EVERY_NS: AtomicI64 = AtomicI64::new(0);

/// Sets the sampling windows (at activation).
pub fn set_sampling(s: Option<zcta::sample::Sampling>) {
    if let Some(s) = s {
        WINDOW_ON_NS.store(s.on.as_nanos() as i64, Ordering::Relaxed);
        WINDOW_EVERY_NS.store(s.every.as_nanos() as i64, Ordering::Relaxed);
    }
}

/// Follows a pause or resume of recording (`zcta_set_recording`) or a sampling
/// window's change. Ops called while paused have no rows at all. While paused, and
/// outside a window, CUPTI's activity kinds are off (so its per-kernel cost goes) and
/// its launch callbacks stay on; with `ZCTA_PAUSE_CUPTI=1` a pause switches the
/// callbacks off too, so a paused process costs about what a plain one does — for
/// benchmarks that synchronise the GPU before they resume (`bench/gpu_ab.py`). A pause
/// asked for before capture starts is applied when it starts.
pub fn sync_capture() {
    // Checked before the lock too: a fork child (capture OFF) must not wait for a lock
    // the parent's writer thread held when it forked.
    if !active() {
        return;
    }
    let _g = ctl();
    if active() {
        apply();
    }
}

/// In the child of `fork()`: no capture (the child has no writer), no lock taken.
pub fn on_fork_child() {
    if STATE.load(Ordering::Acquire) != IDLE {
        STATE.store(OFF, Ordering::SeqCst);
    }
    MARKED_IN_FLIGHT.store(0, Ordering::Relaxed);
}

/// Makes CUPTI's kinds follow recording and the sampling window, and (with
/// `ZCTA_PAUSE_CUPTI=1`) its callbacks follow recording; caller holds [`ctl`] and
/// capture is active. Kinds go on before the callbacks and off after them.
fn apply() {
    let s = setup();
    let on = crate::control::cupti_callbacks_wanted(s.pause_cupti);
    let kinds = crate::control::cupti_kinds_wanted();
    let cb_change = CALLBACKS_ON.swap(on, Ordering::SeqCst) != on;
    let kinds_change = KINDS_ON.swap(kinds, Ordering::SeqCst) != kinds;
    // Switch times err towards "off": on is stamped after the kinds are enabled, off
    // before they are disabled, so a launch made during the switch counts as unrecorded.
    let before = crate::ffi::sys::now_ns();
    if kinds_change && kinds {
        cupti::set_kinds(&s.kinds, true);
    }
    if cb_change && s.callbacks {
        cupti::set_callbacks(&DRIVER_CBIDS, &RUNTIME_CBIDS, on);
    }
    if kinds_change && !kinds {
        cupti::set_kinds(&s.kinds, false);
    }
    if kinds_change {
        let t = if kinds { crate::ffi::sys::now_ns() } else { before };
        log_kinds_switch(kinds, t);
    }
}

/// Notes a switch of the kinds for the writer ([`KINDS_SWITCHES`]).
fn log_kinds_switch(on: bool, t: i64) {
    let mut log = KINDS_SWITCHES.lock().unwrap_or_else(|p| p.into_inner());
    if log.len() < KINDS_SWITCHES_MAX {
        log.push((on, t));
    }
}

/// Passes the switches noted since the last call to the writer, in order.
fn take_kinds_switches(out: &mut Vec<GpuItem>) {
    let mut log = KINDS_SWITCHES.lock().unwrap_or_else(|p| p.into_inner());
    out.extend(log.drain(..).map(|(on, t)| GpuItem::Kinds { on, t }));
}

thread_local! {
    /// The op or group whose NCCL call is running on this thread (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
    static IS_PROXY: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as running the NCCL call of `ext`, which started at `t`
/// (CLOCK_REALTIME ns), when capture is on and, with `ZCTA_SAMPLE`, `t` lies in a
/// window (hot path); returns whether [`end`] must clear it.
#[inline]
pub fn begin(ext: u64, t: i64) -> bool {
    if !active() || crate::control::detail() != FULL {
        return false;
    }
    let every = WINDOW_EVERY_NS.load(Ordering::Relaxed);
    if every == 0 {
        return CURRENT.try_with(|c| c.set(ext)).is_ok();
    }
    if !zcta::sample::in_window(t, WINDOW_ON_NS.load(Ordering::Relaxed), every) {
        return false;
    }
    // Counted before the window's state is read again (both SeqCst): either the
    // writer's drain sees this call, or this call sees the window closing.
    MARKED_IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    if crate::control::detail() == FULL && CURRENT.try_with(|c| c.set(ext)).is_ok() {
        return true;
    }
    MARKED_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    false
}

/// Clears what [`begin`] set.
#[inline]
pub fn end(marked: bool) {
    if marked {
        let _ = CURRENT.try_with(|c| c.set(0));
        if WINDOW_EVERY_NS.load(Ordering::Relaxed) != 0 {
            MARKED_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// CUPTI's callback on entry to one of the traced CUDA calls, on the calling thread.
pub fn on_api_enter(driver: bool, cbid: u32, correlation_id: u32) {
    let ext = CURRENT.try_with(Cell::get).unwrap_or(0);
    let proxy = ext == 0 && IS_PROXY.try_with(Cell::get).unwrap_or(false);
    if ext == 0 && !proxy {
        return; // the program's own call
    }
    let note = CallNote {
        ext,
        api: RawApi {
            driver,
            cbid,
            start_ns: crate::ffi::sys::now_ns(),
            end_ns: 0,
            thread: cupti::cupti_thread_id(),
            correlation_id,
        },
    };
    if NOTES.get().is_none_or(|q| q.try_push(note).is_err()) {
        cupti::DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Starts capture (once, at the first communicator creation). `off`: why the
/// configuration leaves CUPTI off (`None`: deep mode).
pub fn start(off: Option<&'static str>) {
    if STATE
        .compare_exchange(IDLE, STARTING, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    // Held while starting: a client that registers meanwhile waits in
    // [`foreign_client`] until capture is up, then takes it over whole (its
    // registration must not come before ours, which would replace it).
    let _g = ctl();
    let outcome = try_start(off);
    match outcome {
        Ok(()) => {
            // A client that arrived while we were starting wins.
            if FOREIGN.load(Ordering::SeqCst) {
                let now = crate::ffi::sys::now_ns();
                stop_for_foreign("a CUPTI client registered while zcta was starting", now);
            } else {
                STARTED_AT.store(crate::ffi::sys::now_ns(), Ordering::Release);
                STATE.store(ACTIVE, Ordering::Release);
                // Paused before the first communicator.
                apply();
            }
        }
        Err(why) => {
            STATE.store(OFF, Ordering::Release);
            set_status(|s| s.cupti = format!("off: {why}"));
        }
    }
}

fn try_start(off: Option<&'static str>) -> Result<(), String> {
    if let Some(why) = off {
        return Err(why.into());
    }
    if FOREIGN.load(Ordering::SeqCst) {
        let why = "another CUPTI client (torch.profiler/Kineto or similar) was already active";
        warn_once(format_args!("{why}; recording host-side only (GPU columns NULL)"));
        return Err(why.into());
    }
    let (path, version) = match cupti::init() {
        Ok(v) => v,
        Err(e) => {
            // A GPU process without CUPTI deserves a word; a CPU-only one does not.
            if !crate::ffi::real::mapped_libs("libcuda.so").is_empty() {
                warn_once(format_args!("{e}; recording host-side only (GPU columns NULL)"));
            }
            return Err(e);
        }
    };
    set_status(|s| {
        s.lib = Some(path.clone());
        s.version = Some(version);
    });
    if version < 130000 {
        let why = format!("CUPTI API version {version} is older than 13.0 (its record layouts differ)");
        warn_once(format_args!("{why}; recording host-side only"));
        return Err(why);
    }
    // The first call initialises CUPTI's timer (it took ~0.5–0.8 ms on the GPU
    // machine); the second, bracketed by two clock reads, gives the offset.
    let _ = cupti::timestamp();
    let before = crate::ffi::sys::now_ns();
    let ts = cupti::timestamp().ok_or("cuptiGetTimestamp failed")? as i64;
    let after = crate::ffi::sys::now_ns();
    let offset = ts.wrapping_sub(before + (after - before) / 2);
    if offset.unsigned_abs() > 1_000_000_000 {
        let why = format!(
            "CUPTI's clock is not CLOCK_REALTIME (offset {offset} ns: another tool installed a timestamp callback)"
        );
        warn_once(format_args!("{why}; recording host-side only"));
        return Err(why);
    }
    let s = setup();
    let (driver, runtime): (&[u32], &[u32]) = if s.callbacks {
        (&DRIVER_CBIDS, &RUNTIME_CBIDS)
    } else {
        (&[], &[])
    };
    if let Err(e) = cupti::subscribe(driver, runtime) {
        let why = format!("another CUPTI client holds CUPTI (Nsight, a debugger, a profiler): {e}");
        warn_once(format_args!("{why}; recording host-side only (GPU columns NULL)"));
        return Err(why);
    }
    if let Err(e) = cupti::start(&s.kinds) {
        cupti::unsubscribe();
        warn_once(format_args!("cannot start CUPTI: {e}; recording host-side only"));
        return Err(e);
    }
    crate::ffi::process::register_gpu_atexit();
    set_status(|s| {
        let st = setup();
        s.cupti = if st.kinds == cu::DEFAULT_KINDS && st.callbacks {
            "on".into()
        } else {
            format!(
                "on (developer settings: kinds {}, launch callbacks {})",
                cu::kind_names(&st.kinds),
                if st.callbacks { "on" } else { "off" }
            )
        };
        s.clock = Some("CLOCK_REALTIME".into());
        s.clock_offset_ns = Some(offset);
    });
    CLOCK_OFFSET.store(offset, Ordering::Release);
    Ok(())
}

/// `when`: stamped before capture started going off, so an op called during the hand-over
/// counts as not captured, and one whose work launched after it as cut short.
fn stop_for_foreign(what: &str, when: i64) {
    STOPPED_AT.store(when, Ordering::Release);
    log_kinds_switch(false, when);
    // Our buffers go to our callback before the newcomer's replaces it.
    cupti::flush(true);
    cupti::stop(&setup().kinds);
    STATE.store(OFF, Ordering::Release);
    set_status(|s| s.cupti = format!("stopped: {what} at {when} ns; GPU columns NULL from then on"));
    warn_once(format_args!(
        "{what}: zcta hands CUPTI over and records host-side only from now on"
    ));
}

/// Another library called a CUPTI registration entry point (`what`).
pub fn foreign_client(what: &str) {
    let _ = std::panic::catch_unwind(|| {
        if FOREIGN.swap(true, Ordering::SeqCst) {
            return;
        }
        // Nothing to hand over when capture is off for good, or not started (a start
        // after this sees FOREIGN: SeqCst both sides). Checked before the lock: a fork
        // child (capture OFF) must not wait for a lock its parent's writer held at the
        // fork. A start under way holds the lock: this waits for it, then stops it.
        if matches!(STATE.load(Ordering::SeqCst), OFF | IDLE) {
            return;
        }
        let when = crate::ffi::sys::now_ns();
        let _g = ctl();
        if STATE
            .compare_exchange(ACTIVE, OFF, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            stop_for_foreign(
                &format!("another CUPTI client called {what} (torch.profiler/Kineto?)"),
                when,
            );
        }
    });
}

/// At exit, while CUDA is still alive (registered after CUDA initialised, so it runs
/// before CUDA's own exit handlers): hand over every buffer.
pub fn exit_flush() {
    if active() && !FINAL_FLUSHED.swap(true, Ordering::AcqRel) {
        cupti::flush(true);
    }
}

/// Called on NCCL's proxy threads from profiler-plugin proxy events: remembers the
/// thread, so copies it issues can be attributed (by the kernel-window rule: the op
/// the plugin last started a proxy event for is not the one being copied — NCCL
/// starts the proxy ops of many ops before progressing them).
#[inline]
pub fn note_proxy_thread() {
    if IS_PROXY.try_with(|c| c.replace(true)).unwrap_or(true) {
        return;
    }
    PROXY_THREADS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(cupti::cupti_thread_id());
}

/// At exit, how long the writer waits for timed ops still on the GPU.
const FINISH_WAIT_NS: i64 = 200_000_000;

/// The writer's view of the GPU: CUPTI (deep mode) and the per-op events.
pub struct CuptiSource {
    /// Per-op CUDA-event timing (the default GPU side).
    timer: crate::timing::Timer,
    notes: Consumer<CallNote>,
    names: HashMap<u64, Arc<str>>,
    proxy_seen: usize,
    offset_sent: bool,
    /// `ZCTA_CUPTI_DEBUG=1`: what arrived, printed at exit (a developer's aid).
    debug: Option<Debug>,
}

#[derive(Default)]
struct Debug {
    kinds: std::collections::BTreeMap<u32, u64>,
    ext_kinds: std::collections::BTreeMap<u32, u64>,
    samples: Vec<String>,
}

impl Debug {
    fn note(&mut self, raw: &cu::Raw, kind: u32) {
        *self.kinds.entry(kind).or_default() += 1;
        if let cu::Raw::ExtCorr { external_kind, .. } = raw {
            *self.ext_kinds.entry(*external_kind).or_default() += 1;
        }
        if self.samples.len() < 4 {
            self.samples.push(format!("{raw:?}"));
        }
    }
}

impl CuptiSource {
    /// The writer's side of capture; made once per process, with the recorder.
    /// `hold`: how long the writer holds an op's row for its GPU side. `None` when
    /// there is no memory for its queues.
    pub fn new(hold: std::time::Duration) -> Option<Self> {
        let hold_ns = i64::try_from(hold.as_nanos()).unwrap_or(i64::MAX);
        let timer = crate::timing::Timer::new(hold_ns)?;
        let (tx, rx) = queue::bounded(1 << 16)?;
        // Only the first source's queue is fed (there is one recorder per process).
        let _ = NOTES.set(tx);
        Some(Self {
            timer,
            notes: rx,
            names: HashMap::new(),
            proxy_seen: 0,
            offset_sent: false,
            debug: std::env::var("ZCTA_CUPTI_DEBUG")
                .is_ok_and(|v| v == "1")
                .then(Debug::default),
        })
    }

    fn drain(&mut self, out: &mut Vec<GpuItem>) {
        if !self.offset_sent {
            let o = CLOCK_OFFSET.load(Ordering::Acquire);
            if o != i64::MIN {
                out.push(GpuItem::ClockOffset(o));
                self.offset_sent = true;
            }
        }
        take_kinds_switches(out);
        {
            let t = PROXY_THREADS.lock().unwrap_or_else(|p| p.into_inner());
            for &id in &t[self.proxy_seen..] {
                out.push(GpuItem::ProxyThread(id));
            }
            self.proxy_seen = t.len();
        }
        while let Some(n) = self.notes.try_pop() {
            if n.ext != 0 {
                out.push(GpuItem::ExtCorr {
                    external_id: n.ext,
                    correlation_id: n.api.correlation_id,
                });
            }
            out.push(GpuItem::Api(n.api));
        }
        let names = &mut self.names;
        let debug = &mut self.debug;
        cupti::drain(&mut |bytes| {
            let Some(raw) = cu::decode(bytes) else { return };
            if let Some(d) = debug.as_mut() {
                d.note(&raw, cu::record_kind(bytes).unwrap_or(0));
            }
            let item = GpuItem::from_raw(raw, |ptr| {
                Some(
                    names
                        .entry(ptr)
                        .or_insert_with(|| {
                            let full = cupti::name_at(ptr).unwrap_or_default();
                            Arc::from(cu::short_kernel_name(&full))
                        })
                        .clone(),
                )
            });
            if let Some(it) = item {
                out.push(it);
            }
        });
    }
}

impl GpuSource for CuptiSource {
    fn poll(&mut self, flush: bool, out: &mut Vec<GpuItem>) {
        // Every writer round (it works once a second at most).
        crate::ffi::sys::calibrate_clock();
        // Not after the final flush at exit: a writer still running when the exit
        // stopped waiting for it (ZCTA_EXIT_TIMEOUT_MS) must not call into CUDA while
        // CUDA's exit handlers tear it down.
        if flush && active() && !FINAL_FLUSHED.load(Ordering::Acquire) {
            cupti::flush(false);
        }
        self.drain(out);
        self.timer.poll(out);
    }

    fn finish(&mut self, out: &mut Vec<GpuItem>) {
        exit_flush();
        self.drain(out);
        self.timer.finish(FINISH_WAIT_NS, out);
        if let Some(d) = &self.debug {
            zcta::warn(format_args!(
                "CUPTI debug: records by kind {:?}, external correlations by kind {:?}",
                d.kinds, d.ext_kinds
            ));
            for s in &d.samples {
                zcta::warn(format_args!("CUPTI debug: {s}"));
            }
        }
    }

    fn set_detail(&mut self, detail: zcta::sample::Detail) {
        use zcta::sample::Detail;
        let code = match detail {
            Detail::Full => FULL,
            Detail::Draining => DRAINING,
            Detail::Off => DETAIL_OFF,
        };
        crate::control::set_detail(code, || {
            sync_capture();
            crate::ffi::plugin::sync_nccl_events();
        });
    }

    fn marked_in_flight(&self) -> usize {
        MARKED_IN_FLIGHT.load(Ordering::SeqCst)
    }

    fn captured(&self, t_ns: i64) -> bool {
        let start = STARTED_AT.load(Ordering::Acquire);
        start != 0 && start <= t_ns && t_ns < STOPPED_AT.load(Ordering::Acquire)
    }

    fn status(&self) -> GpuStatus {
        let mut s = STATUS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| GpuStatus {
                cupti: "off: no communicator was created".into(),
                ..GpuStatus::default()
            });
        if s.cupti.starts_with("on") || s.cupti.starts_with("stopped") {
            s.dropped = Some(cupti::DROPPED.load(Ordering::Relaxed));
        }
        s.timing = Some(self.timer.status());
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switches(items: &[GpuItem]) -> Vec<(bool, i64)> {
        items
            .iter()
            .map(|it| match it {
                GpuItem::Kinds { on, t } => (*on, *t),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// The writer drains while switches happen: it gets every switch once, in order,
    /// each with its own time (a pause is never lost behind the resume after it). With
    /// no writer draining, the list stops growing at its cap. (One test: the list is a
    /// process-wide static.)
    #[test]
    fn the_writer_gets_every_kinds_switch_in_order_with_its_time() {
        // Fewer switches than the cap: on a loaded machine the drainer may not run at
        // all while they are made, and none may be lost for that.
        let n = KINDS_SWITCHES_MAX as i64 - 1;
        let switcher = std::thread::spawn(move || {
            for t in 1..=n {
                // Alternating off/on, as apply() switches them; t stands for the time.
                log_kinds_switch(t % 2 == 0, t);
            }
        });
        let mut got = Vec::new();
        let mut drains = 0;
        while !switcher.is_finished() {
            take_kinds_switches(&mut got);
            drains += 1;
        }
        switcher.join().unwrap();
        take_kinds_switches(&mut got);
        let seen = switches(&got);
        let want: Vec<(bool, i64)> = (1..=n).map(|t| (t % 2 == 0, t)).collect();
        assert_eq!(seen.len(), want.len(), "after {drains} drains");
        assert!(seen == want, "switches out of order or with another's time");

        for t in 0..n + 10 {
            log_kinds_switch(t % 2 == 1, t);
        }
        let mut got = Vec::new();
        take_kinds_switches(&mut got);
        assert_eq!(got.len(), KINDS_SWITCHES_MAX);
        assert_eq!(
            switches(&got).last(),
            Some(&(true, KINDS_SWITCHES_MAX as i64 - 1))
        );
    }
}
