//! GPU capture through CUPTI's activity API (safe side; the calls are in
//! `ffi::cupti`).
//!
//! Lifecycle: idle until the first communicator is created ([`start`]), then active
//! — external ids pushed around launching calls, buffers flushed by the writer at
//! least every `GpuPolicy::flush_every` — until exit, or until another CUPTI client
//! (torch.profiler/Kineto, Nsight) arrives: zcta then hands over its last buffers,
//! disables its kinds, and records host-only from there on ([`foreign_client`]).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use zcta::cupti::{self as cu, DRIVER_CBIDS, ENABLED_KINDS, EXTERNAL_KIND, RUNTIME_CBIDS};
use zcta::gpu::GpuItem;
use zcta::sink::{GpuSource, GpuStatus};

use crate::ffi::cupti;

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

/// Pushes the external id of a launching call; returns whether it must be popped.
#[inline]
pub fn push(ext: u64) -> bool {
    active() && cupti::push(EXTERNAL_KIND, ext)
}

/// Pops what [`push`] pushed.
#[inline]
pub fn pop(pushed: bool) {
    if pushed {
        cupti::pop(EXTERNAL_KIND);
    }
}

/// Starts capture (once, at the first communicator creation). `enabled`: ZCTA_CUPTI.
pub fn start(enabled: bool) {
    if STATE
        .compare_exchange(IDLE, STARTING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let outcome = try_start(enabled);
    match outcome {
        Ok(()) => {
            // A client that arrived while we were starting wins.
            if FOREIGN.load(Ordering::Acquire) {
                stop_for_foreign("a CUPTI client registered while zcta was starting");
            } else {
                STARTED_AT.store(zcta::clock::now_ns(), Ordering::Release);
                STATE.store(ACTIVE, Ordering::Release);
            }
        }
        Err(why) => {
            STATE.store(OFF, Ordering::Release);
            set_status(|s| s.cupti = format!("off: {why}"));
        }
    }
}

fn try_start(enabled: bool) -> Result<(), String> {
    if !enabled {
        return Err("ZCTA_CUPTI=0".into());
    }
    if FOREIGN.load(Ordering::Acquire) {
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
    if let Some(e) = cupti::other_subscriber() {
        let why = format!("another CUPTI client holds CUPTI (Nsight, a debugger, a profiler): {e}");
        warn_once(format_args!("{why}; recording host-side only (GPU columns NULL)"));
        return Err(why);
    }
    let now = zcta::clock::now_ns();
    let ts = cupti::timestamp().ok_or("cuptiGetTimestamp failed")? as i64;
    let offset = ts.wrapping_sub(now);
    if offset.unsigned_abs() > 1_000_000_000 {
        let why = format!(
            "CUPTI's clock is not CLOCK_REALTIME (offset {offset} ns: another tool installed a timestamp callback)"
        );
        warn_once(format_args!("{why}; recording host-side only"));
        return Err(why);
    }
    let traced = cupti::start(&ENABLED_KINDS, &DRIVER_CBIDS, &RUNTIME_CBIDS).inspect_err(|e| {
        warn_once(format_args!("cannot start CUPTI: {e}; recording host-side only"));
    })?;
    crate::ffi::process::register_gpu_atexit();
    set_status(|s| {
        s.cupti = if traced {
            "on".into()
        } else {
            "on (no per-call API records: launch_ns NULL, proxy copies not attributed)".into()
        };
        s.clock = Some("CLOCK_REALTIME".into());
        s.clock_offset_ns = Some(offset);
    });
    Ok(())
}

fn stop_for_foreign(what: &str) {
    // Our buffers go to our callback before the newcomer's replaces it.
    cupti::flush(true);
    cupti::stop(&ENABLED_KINDS, &DRIVER_CBIDS, &RUNTIME_CBIDS);
    STATE.store(OFF, Ordering::Release);
    let when = zcta::clock::now_ns();
    STOPPED_AT.store(when, Ordering::Release);
    set_status(|s| s.cupti = format!("stopped: {what} at {when} ns; GPU columns NULL from then on"));
    warn_once(format_args!(
        "{what}: zcta hands CUPTI over and records host-side only from now on"
    ));
}

/// Another library called a CUPTI registration entry point (`what`).
pub fn foreign_client(what: &str) {
    let _ = std::panic::catch_unwind(|| {
        if FOREIGN.swap(true, Ordering::AcqRel) {
            return;
        }
        if STATE
            .compare_exchange(ACTIVE, OFF, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            stop_for_foreign(&format!(
                "another CUPTI client called {what} (torch.profiler/Kineto?)"
            ));
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

thread_local! {
    static PROXY_NOTED: Cell<bool> = const { Cell::new(false) };
}

/// Called on NCCL's proxy threads (from profiler-plugin proxy events): remembers the
/// thread so copies it issues can be attributed.
#[inline]
pub fn note_proxy_thread() {
    if PROXY_NOTED.try_with(|c| c.replace(true)).unwrap_or(true) {
        return;
    }
    PROXY_THREADS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(cupti::cupti_thread_id());
}

/// The writer's view of CUPTI.
pub struct CuptiSource {
    names: HashMap<u64, Arc<str>>,
    proxy_seen: usize,
}

impl CuptiSource {
    pub fn new() -> Self {
        Self {
            names: HashMap::new(),
            proxy_seen: 0,
        }
    }

    fn drain(&mut self, out: &mut Vec<GpuItem>) {
        {
            let t = PROXY_THREADS.lock().unwrap_or_else(|p| p.into_inner());
            for &id in &t[self.proxy_seen..] {
                out.push(GpuItem::ProxyThread(id));
            }
            self.proxy_seen = t.len();
        }
        let names = &mut self.names;
        cupti::drain(&mut |bytes| {
            let Some(raw) = cu::decode(bytes) else { return };
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
        if flush && active() {
            cupti::flush(false);
        }
        self.drain(out);
    }

    fn finish(&mut self, out: &mut Vec<GpuItem>) {
        exit_flush();
        self.drain(out);
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
        s
    }
}
