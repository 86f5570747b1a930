//! Lifecycle of the recorder.
//!
//! Nothing happens at load time but registering a fork handler. The first NCCL call
//! activates recording: reads the configuration, chooses the run directory, starts
//! the writer thread and registers the exit hook. Processes that never call NCCL
//! therefore print nothing and write nothing. After `fork()` the child is disabled
//! (its copy of the queue has no writer); after `exec` the image starts fresh.
//!
//! Any internal failure (a panic in our code, a failed activation) turns recording
//! off; calls keep being forwarded untouched.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use zcta::config::{self, Config, ProcFacts};
use zcta::record::{Event, PluginEvent};
use zcta::sink::{self, EndReason, ProcessInfo, Writer, WriterControl};
use zcta::tables::{Ctx, ProcessRow};

use crate::ffi;
use crate::ffi::queue::{self, Producer};

const UNINIT: u8 = 0;
const ACTIVATING: u8 = 1;
const ACTIVE: u8 = 2;
const DISABLED: u8 = 3;
const FINISHED: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static RECORDER: OnceLock<Recorder> = OnceLock::new();
static PANIC_REPORTED: AtomicBool = AtomicBool::new(false);

/// The producer side of the queue to the writer thread.
pub struct Recorder {
    tx: Producer<Event>,
    ptx: Producer<PluginEvent>,
    ctl: Arc<WriterControl>,
    owner_pid: u32,
    exit_timeout: Duration,
    writer_thread: Option<std::thread::ThreadId>,
    plugin_comms: Arc<std::sync::atomic::AtomicU64>,
    /// Why CUPTI stays off (`None`: ZCTA_GPU=deep, CUPTI capture starts with the
    /// first communicator).
    pub cupti_off: Option<&'static str>,
    /// ZCTA_GPU is not off: per-op event timing starts with the first communicator.
    pub events: bool,
    /// ZCTA_BUDGET as a share of wall time.
    pub budget: f64,
    /// Events mode: NCCL's profiler events follow the budget (deep mode takes them
    /// for every op).
    pub follow_nccl: bool,
}

/// The recorder, if recording is on. Activates it on first use.
#[inline]
pub fn recorder() -> Option<&'static Recorder> {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => RECORDER.get(),
        UNINIT | ACTIVATING => activate_once(),
        DISABLED => {
            // Recording stopped early (internal error): still count what is lost.
            if let Some(r) = RECORDER.get() {
                r.ctl.dropped.fetch_add(1, Ordering::Relaxed);
            }
            None
        }
        _ => None,
    }
}

/// One thread activates; threads making their first NCCL call at the same moment
/// wait for it (activation takes well under a millisecond) so none of their calls,
/// communicator creations in particular, go unrecorded.
#[cold]
fn activate_once() -> Option<&'static Recorder> {
    if STATE
        .compare_exchange(UNINIT, ACTIVATING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        let next = match activate_on_own_stack() {
            Ok(Some(r)) => {
                // Only this thread ever sets it (guarded by the state transition).
                let _ = RECORDER.set(r);
                ACTIVE
            }
            Ok(None) => DISABLED,
            Err(_) => {
                report_panic();
                DISABLED
            }
        };
        // A panic report may already have moved the state on; only leave ACTIVATING.
        let _ = STATE.compare_exchange(ACTIVATING, next, Ordering::AcqRel, Ordering::Acquire);
    } else {
        while STATE.load(Ordering::Acquire) == ACTIVATING {
            std::thread::yield_now();
        }
    }
    match STATE.load(Ordering::Acquire) {
        ACTIVE => RECORDER.get(),
        _ => None,
    }
}

/// Stack of the thread that activates: activation (the tables' writers, Arrow schemas,
/// Parquet settings) takes tens of KiB, more than the smallest stack a program may give
/// the thread of its first NCCL call (16 KiB is enough for the calls themselves).
const ACTIVATION_STACK: usize = 1 << 20;

/// Address space recording takes at most, beyond what the process holds before its
/// first NCCL call, at the default settings: below this much room under `RLIMIT_AS`
/// the shim stays off rather than make the program's own allocations fail.
const ADDRESS_SPACE_NEEDED: u64 = 256 << 20;

/// Stack below which activation moves to a thread of its own.
const ACTIVATION_ROOM: usize = 256 << 10;

/// [`activate`] on the calling thread when it has [`ACTIVATION_ROOM`] of stack left
/// (the main thread, and threads of the usual 2-8 MiB), else on a thread of its own
/// ([`ACTIVATION_STACK`]), which the caller waits for; inline again when no thread can
/// be started. Not a thread for every activation: one started from inside `dlopen`
/// (an NCCL call in a library's constructor) would wait on the loader's lock, which the
/// waiting caller holds, to set up its thread-locals.
fn activate_on_own_stack() -> std::thread::Result<Option<Recorder>> {
    if ffi::sys::stack_room().is_none_or(|r| r >= ACTIVATION_ROOM) {
        return catch_unwind(activate);
    }
    let spawned = std::thread::Builder::new()
        .name("zcta-start".into())
        .stack_size(ACTIVATION_STACK)
        .spawn(|| {
            // A program's signal handler never runs on our thread.
            ffi::sys::block_all_signals();
            catch_unwind(activate)
        });
    match spawned {
        Ok(h) => h.join().unwrap_or_else(Err),
        Err(_) => catch_unwind(activate),
    }
}

/// A setting's value; one that is not UTF-8 is read lossily (its other bytes become
/// U+FFFD, which a run id turns into `_` with a warning and a number or switch
/// rejects with one), never taken as unset.
fn env_var(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

fn activate() -> Option<Recorder> {
    let cfg = Config::from_env(&env_var);
    if !cfg.enabled {
        return None;
    }
    for w in &cfg.warnings {
        zcta::warn(format_args!("{w}"));
    }
    let pid = std::process::id();
    let ppid = std::os::unix::process::parent_id() as i32;
    let host = ffi::sys::hostname();
    let cmdline = std::fs::read("/proc/self/cmdline").ok().map(|b| {
        String::from_utf8_lossy(&b)
            .trim_end_matches('\0')
            .replace('\0', " ")
    });
    let facts = ProcFacts {
        pid: pid as i32,
        ppid,
        parent_start: parent_start_ticks(ppid),
        host: host.clone(),
        now_ns: zcta::clock::now_ns(),
        mp_child: cmdline
            .as_deref()
            .is_some_and(|c| c.contains("--multiprocessing-fork")),
    };
    let run = config::derive_run_id(&env_var, &facts);
    if let Some(w) = &run.warning {
        zcta::warn(format_args!("{w}"));
    }
    let rank_env = config::rank_from_env(&env_var);
    let nccl = ffi::real::library_info();
    let row = ProcessRow {
        run_id: run.id.clone(),
        run_id_source: run.source.as_str().into(),
        ppid,
        rank_env,
        exe: std::fs::read_link("/proc/self/exe")
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
        cmdline,
        zcta_version: zcta::ZCTA_VERSION.into(),
        schema_version: zcta::SCHEMA_VERSION,
        nccl_version: nccl.version,
        nccl_lib: nccl.path,
        clock: zcta::clock::CLOCK_NAME.into(),
        start_ns: facts.now_ns,
        end_ns: None,
        end_reason: "running".into(),
        env_json: env_json(),
        profiler_plugin: ffi::process::plugin_mode(),
        cupti: "unknown: the process did not reach its end".into(),
        ..ProcessRow::default()
    };
    let info = ProcessInfo {
        run_dir: ffi::sys::out_dir().join(&run.id),
        prefix: sink::file_prefix(&host, rank_env, pid as i32, &sink::process_token()),
        ctx: Ctx {
            pid: pid as i32,
            host: host.into(),
        },
        row,
    };
    if let Some(room) = ffi::sys::address_space_room()
        && room < ADDRESS_SPACE_NEEDED
    {
        zcta::warn(format_args!(
            "the address-space limit (RLIMIT_AS, ulimit -v) leaves {} MiB, less than the {} MiB \
             recording may take; recording disabled, NCCL calls continue unchanged",
            room >> 20,
            ADDRESS_SPACE_NEEDED >> 20
        ));
        return None;
    }
    // Plugin records are larger (up to 344 B): half as many slots keeps the memory
    // preallocated for them close to the main queue's.
    let plugin_capacity = (cfg.queue_capacity / 2).max(1024);
    let (Some((tx, rx)), Some((ptx, prx)), Some(source)) = (
        queue::bounded_reserving(cfg.queue_capacity, cfg.queue_capacity / RESERVE_SHARE),
        queue::bounded_reserving(plugin_capacity, plugin_capacity / RESERVE_SHARE),
        crate::gpu::CuptiSource::new(cfg.gpu.hold),
    ) else {
        zcta::warn(format_args!(
            "no memory for the record queues; recording disabled, NCCL calls continue unchanged"
        ));
        return None;
    };
    let ctl = WriterControl::new();
    crate::timing::set_writer(Arc::clone(&ctl));
    let policy = zcta::sink::SinkPolicy {
        reserve: Some(ffi::sys::reserve_space),
        room: Some(ffi::sys::disk_room),
        ..cfg.policy
    };
    let mut writer = Writer::new(info, policy);
    crate::gpu::set_sampling(cfg.gpu.sampling);
    writer.set_gpu_source(Box::new(source), cfg.gpu);
    let plugin_comms = Arc::clone(&writer.plugin_comms);
    let ctl2 = Arc::clone(&ctl);
    let spawned = std::thread::Builder::new()
        .name("zcta-writer".into())
        .spawn(move || {
            // Signals are for the program's threads: a handler (which might call _exit)
            // must never run on the writer, which would then wait for itself.
            ffi::sys::block_all_signals();
            if catch_unwind(AssertUnwindSafe(|| {
                sink::run_writer(rx, prx, writer, Arc::clone(&ctl2))
            }))
            .is_err()
            {
                report_panic();
                ctl2.failed.store(true, Ordering::Release);
                ctl2.mark_done();
            }
        });
    let handle = match spawned {
        Ok(h) => h,
        Err(e) => {
            zcta::warn(format_args!(
                "cannot start the writer thread ({e}); recording disabled"
            ));
            return None;
        }
    };
    ctl.set_thread(handle.thread().clone());
    ffi::process::register_atexit();
    Some(Recorder {
        tx,
        ptx,
        ctl,
        owner_pid: pid,
        exit_timeout: cfg.exit_timeout,
        writer_thread: Some(handle.thread().id()),
        plugin_comms,
        cupti_off: match cfg.gpu_mode {
            zcta::config::GpuMode::Stamps => Some("CUPTI is used in deep mode only (ZCTA_GPU=deep)"),
            zcta::config::GpuMode::Off => Some("ZCTA_GPU=off"),
            zcta::config::GpuMode::Deep if !cfg.cupti => Some("ZCTA_CUPTI=0"),
            zcta::config::GpuMode::Deep => None,
        },
        events: cfg.gpu_mode != zcta::config::GpuMode::Off,
        budget: cfg.budget,
        follow_nccl: cfg.gpu_mode == zcta::config::GpuMode::Stamps,
    })
}

/// Start time (field 22 of /proc/PID/stat) of a process, in clock ticks since boot.
fn parent_start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields restart after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn env_json() -> String {
    config::env_json(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned()))),
    )
}

impl Recorder {
    fn is_writer_thread(&self) -> bool {
        self.writer_thread == Some(std::thread::current().id())
    }

    /// Hands a record to the writer. Never blocks: when the queue is full the record
    /// is dropped and counted. Op and group records leave the last
    /// [`RESERVE_SHARE`]th of the queue to communicator and registration records,
    /// which are therefore kept through a burst of ops the writer cannot keep up with.
    #[inline]
    pub fn emit(&self, ev: Event) {
        let lifecycle = ev.is_lifecycle();
        self.send(&self.tx, ev, lifecycle);
    }

    /// Hands `n` records to the writer with one reservation of the queue (a group's
    /// op and group records: they leave the reserve), built by `make(i)` straight into
    /// the queue, in order; all dropped and counted when they do not all fit (then
    /// `make` is not called, and this returns false). `make` must not panic
    /// ([`Producer::try_push_with`]).
    #[inline]
    pub fn emit_with(&self, n: usize, make: impl FnMut(usize) -> Event) -> bool {
        self.send_with(&self.tx, n, make, false)
    }

    #[inline]
    fn send<T: Copy + Send>(&self, tx: &Producer<T>, ev: T, lifecycle: bool) {
        self.send_all(tx, std::slice::from_ref(&ev), lifecycle);
    }

    /// Pushes `evs` with one reservation (`lifecycle`: they may use the reserve); all
    /// dropped and counted when they do not all fit.
    #[inline(always)]
    fn send_all<T: Copy + Send>(&self, tx: &Producer<T>, evs: &[T], lifecycle: bool) {
        // `i < evs.len()` for every index asked: the indexing cannot panic.
        self.send_with(tx, evs.len(), |i| evs[i], lifecycle);
    }

    /// Pushes the `n` records `make` builds with one reservation ([`send_all`](Self::send_all));
    /// whether they went in.
    #[inline(always)]
    fn send_with<T: Copy + Send>(
        &self,
        tx: &Producer<T>,
        n: usize,
        make: impl FnMut(usize) -> T,
        lifecycle: bool,
    ) -> bool {
        if self.ctl.failed.load(Ordering::Relaxed) {
            self.ctl.dropped.fetch_add(n as u64, Ordering::Relaxed);
            return false;
        }
        match tx.try_push_with(n, !lifecycle, make) {
            Ok(pos) => {
                // The queue's length reads the writer's position too (a cache line it
                // keeps writing): look at it only when a push passes a 64th position.
                if (pos & 63) + n > 63 && tx.len().is_some_and(|l| l >= tx.capacity() / 2) {
                    self.ctl.wake();
                }
                true
            }
            Err(()) => {
                self.ctl.dropped.fetch_add(n as u64, Ordering::Relaxed);
                self.ctl.wake();
                false
            }
        }
    }
}

/// Share of each queue kept for lifecycle records: capacity / this.
pub const RESERVE_SHARE: usize = 8;

/// Counts a record that could not be made (e.g. a plugin event whose slot was reused).
pub fn note_lost() {
    if let Some(r) = RECORDER.get() {
        r.ctl.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// NCCL initialised our profiler plugin for one more communicator.
pub fn note_plugin_comm() {
    if let Some(r) = RECORDER.get() {
        r.plugin_comms.fetch_add(1, Ordering::Relaxed);
    }
}

/// Records a profiler-plugin event if recording is on (its own queue).
#[inline]
pub fn emit_plugin(ev: PluginEvent) {
    if let Some(r) = recorder() {
        let lifecycle = ev.is_lifecycle();
        r.send(&r.ptx, ev, lifecycle);
    }
}

/// Records the `n` records `make` builds, in one reservation ([`Recorder::emit_with`]);
/// whether they went in (false too while nothing is recorded).
#[inline]
pub fn emit_with(n: usize, make: impl FnMut(usize) -> Event) -> bool {
    recorder().is_some_and(|r| r.emit_with(n, make))
}

/// Records `ev` if recording is on.
#[inline]
pub fn emit(ev: Event) {
    if let Some(r) = recorder() {
        r.emit(ev);
    }
}

/// Whether calls are being recorded (activates on first use).
#[inline]
pub fn recording() -> bool {
    !crate::control::paused() && recorder().is_some()
}

/// Whether the recorder is active (not activating, stopped or finished). No side
/// effects ([`crate::control::nccl_events_wanted`]).
pub fn active() -> bool {
    STATE.load(Ordering::SeqCst) == ACTIVE
}

/// Pauses (`on = false`) or resumes recording; returns whether it was on.
pub fn set_recording(on: bool) -> bool {
    let was_paused = crate::control::set_paused(!on, ffi::sys::now_ns());
    if was_paused == on {
        apply_capture();
    } else {
        ffi::plugin::sync_nccl_events();
    }
    !was_paused
}

/// Applies what `control` derives from its inputs, after one changed: CUPTI's capture
/// (under its lock: not from a fork child before `gpu::on_fork_child`, nor from a panic
/// handler) and NCCL's event mask.
pub fn apply_capture() {
    crate::gpu::sync_capture();
    ffi::plugin::sync_nccl_events();
}

/// In the child of `fork()`. A child of a recording process stops recording: its
/// copy of the queue has no writer thread. A child forked before its parent's first
/// NCCL call has no recorder state at all and activates on its own first call, like
/// a fresh process (the `multiprocessing` fork pattern: a parent without NCCL forks
/// one worker per GPU).
pub fn on_fork_child() {
    crate::gpu::on_fork_child();
    crate::timing::on_fork_child();
    if STATE.load(Ordering::Acquire) != UNINIT {
        STATE.store(DISABLED, Ordering::SeqCst);
        // The child's copy of NCCL's event mask: no events (atomics only, no lock).
        ffi::plugin::sync_nccl_events();
    }
}

/// At exit (`atexit`) or `_exit`: stop producing, let the writer drain and close
/// every file, waiting a bounded time. Only the process that started the writer
/// does this (never a fork or vfork child).
pub fn on_exit(reason: EndReason) {
    let Some(r) = RECORDER.get() else { return };
    if std::process::id() != r.owner_pid {
        return;
    }
    let prev = STATE.swap(FINISHED, Ordering::AcqRel);
    if prev == FINISHED || r.is_writer_thread() {
        return;
    }
    r.ctl.stop_and_wait(reason, r.exit_timeout);
}

/// Whether this process owns an active writer (for the `_exit` hook's fast path).
pub fn owns_writer(pid: u32) -> bool {
    matches!(RECORDER.get(), Some(r) if r.owner_pid == pid) && STATE.load(Ordering::Acquire) != FINISHED
}

/// Called when our code panicked: recording stops for good, calls keep flowing.
pub fn report_panic() {
    if let Some(r) = RECORDER.get() {
        r.ctl.internal_error.store(true, Ordering::Release);
    }
    for from in [ACTIVE, ACTIVATING, UNINIT] {
        let _ = STATE.compare_exchange(from, DISABLED, Ordering::SeqCst, Ordering::SeqCst);
    }
    // No lock here: the panic may have happened while one was held.
    ffi::plugin::sync_nccl_events();
    if !PANIC_REPORTED.swap(true, Ordering::AcqRel) {
        zcta::warn(format_args!(
            "internal error; recording disabled, NCCL calls continue unchanged"
        ));
    }
}

/// Runs our own logic, turning a panic into "recording disabled".
#[inline]
pub fn protect<R>(f: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(_) => {
            report_panic();
            None
        }
    }
}
