//! Safe wrappers over the few libc calls the shim needs.

use std::sync::OnceLock;

thread_local! {
    static TID: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}
static PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Linux thread id of the calling thread, cached per thread: a system call costs
/// 0.1-0.3 us in a virtual machine, and records take it on hot paths (every profiler
/// event's stop, every NCCL call). [`after_fork_child`] clears the forking thread's
/// copy in the child.
pub fn gettid() -> i32 {
    TID.try_with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        // SAFETY: gettid has no preconditions and cannot fail.
        let v = unsafe { libc::gettid() };
        t.set(v);
        v
    })
    // SAFETY: as above (the thread is exiting: no cache).
    .unwrap_or_else(|_| unsafe { libc::gettid() })
}

/// The project's clock (`zcta::clock`: CLOCK_REALTIME, ns since the UNIX epoch). The
/// hooks take it twice per NCCL call. Where the CPU's time-stamp counter is invariant
/// (x86-64 with `constant_tsc` and `nonstop_tsc`), it is read from the counter once the
/// writer has calibrated the counter against CLOCK_REALTIME ([`calibrate_clock`]): a
/// counter read costs a few ns where `clock_gettime` costs ~35 in a VM (the H200's,
/// docs/PERFORMANCE.md); until then, and elsewhere, from `clock_gettime` (the vDSO).
#[inline]
pub fn now_ns() -> i64 {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = tsc::read() {
        return t;
    }
    realtime_ns()
}

/// [`now_ns`], read only once every load before it has completed: the time a value
/// was seen is then never earlier than when it arrived (a counter read may otherwise
/// run ahead of a load still in flight). For the clock anchors' brackets.
#[inline]
pub fn now_ns_after_loads() -> i64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: LFENCE has no operands and exists on every x86-64 processor.
    unsafe {
        std::arch::x86_64::_mm_lfence()
    };
    now_ns()
}

/// CLOCK_REALTIME from `clock_gettime`, whatever the counter does. Read straight from
/// the vDSO: through `SystemTime` and `duration_since` each read cost ~85 more
/// instructions (callgrind, docs/PERFORMANCE.md).
#[inline]
pub fn realtime_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_REALTIME always exists, so the call cannot
    // fail (and on failure `ts` stays zero rather than undefined).
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec.wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec)
}

/// Calibrates [`now_ns`]'s counter against CLOCK_REALTIME (writer thread, every round;
/// it works at most every 50 ms until its rate rests on 2 s of samples, then every
/// second).
pub fn calibrate_clock() {
    #[cfg(target_arch = "x86_64")]
    tsc::calibrate();
}

/// The largest disagreement between [`now_ns`] and CLOCK_REALTIME seen at a
/// calibration (0 while `now_ns` reads `clock_gettime`): added to the error the GPU
/// clock anchors claim.
pub fn clock_error_ns() -> i64 {
    #[cfg(target_arch = "x86_64")]
    return tsc::max_error_ns();
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// The counter's conversion to CLOCK_REALTIME: `ns = base_ns + (tsc - base_tsc) *
/// mult / 2^32`, piecewise linear and continuous. Each calibration samples the pair
/// (counter, CLOCK_REALTIME) in the narrowest of a few brackets; the next piece starts
/// where the current one is at that counter value (no jump) and its slope takes up
/// the disagreement over the next second, so the clock neither jumps nor drifts away.
/// A disagreement over 1 ms (CLOCK_REALTIME was stepped) restarts from the sample.
pub mod conv {
    /// One piece of the conversion.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Piece {
        pub base_tsc: u64,
        pub base_ns: i64,
        /// ns per tick, times 2^32.
        pub mult: u64,
    }

    /// How long the next piece takes to take up a disagreement.
    pub const SLEW_NS: i64 = 1_000_000_000;
    /// A disagreement beyond which the counter restarts from the sample.
    pub const STEP_NS: i64 = 1_000_000;

    impl Piece {
        #[inline]
        pub fn at(&self, tsc: u64) -> i64 {
            let d = tsc.wrapping_sub(self.base_tsc) as i64;
            self.base_ns + ((i128::from(d) * i128::from(self.mult)) >> 32) as i64
        }
    }

    /// ns per tick times 2^32 between two samples; `None` when the counter did not
    /// advance or ran at an implausible rate (outside 10 MHz – 20 GHz).
    pub fn rate(t0: u64, ns0: i64, t1: u64, ns1: i64) -> Option<u64> {
        let ticks = t1.checked_sub(t0)?;
        let ns = u64::try_from(ns1.checked_sub(ns0)?).ok()?;
        if ticks == 0 || ns == 0 {
            return None;
        }
        let mult = (u128::from(ns) << 32) / u128::from(ticks);
        let ghz = mult as f64 / 4_294_967_296.0;
        (0.05..=100.0)
            .contains(&ghz)
            .then(|| u64::try_from(mult).ok())
            .flatten()
    }

    /// The next piece from the current one, a sample (`tsc`, `ns`) and the long-run
    /// rate; returns it and the disagreement (sample − current piece).
    pub fn next(cur: Piece, tsc: u64, ns: i64, long_mult: u64) -> (Piece, i64) {
        let predicted = cur.at(tsc);
        let err = ns - predicted;
        if err.abs() > STEP_NS {
            return (
                Piece {
                    base_tsc: tsc,
                    base_ns: ns,
                    mult: long_mult,
                },
                err,
            );
        }
        // Ticks of the next second at the long-run rate; cover SLEW_NS + err in them.
        let ticks = (i128::from(SLEW_NS) << 32) / i128::from(long_mult.max(1));
        let mult = ((i128::from(SLEW_NS + err) << 32) / ticks.max(1)).max(1);
        (
            Piece {
                base_tsc: tsc,
                base_ns: predicted,
                mult: u64::try_from(mult).unwrap_or(long_mult),
            },
            err,
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering, fence};

    use super::conv::{self, Piece};

    /// Even: the piece below is stable; odd: being written; 0: never calibrated.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    static BASE_TSC: AtomicU64 = AtomicU64::new(0);
    static BASE_NS: AtomicI64 = AtomicI64::new(0);
    static MULT: AtomicU64 = AtomicU64::new(0);
    static MAX_ERR_NS: AtomicI64 = AtomicI64::new(0);

    #[inline]
    fn counter() -> u64 {
        // SAFETY: RDTSC exists on every x86-64 CPU and has no preconditions.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// `None` until calibrated, and while a calibration is being published.
    #[inline]
    pub fn read() -> Option<i64> {
        let s = SEQ.load(Ordering::Acquire);
        if s == 0 || s & 1 == 1 {
            return None;
        }
        let p = Piece {
            base_tsc: BASE_TSC.load(Ordering::Relaxed),
            base_ns: BASE_NS.load(Ordering::Relaxed),
            mult: MULT.load(Ordering::Relaxed),
        };
        fence(Ordering::Acquire);
        if SEQ.load(Ordering::Relaxed) != s {
            return None;
        }
        Some(p.at(counter()))
    }

    fn publish(p: Piece) {
        let s = SEQ.load(Ordering::Relaxed);
        SEQ.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        BASE_TSC.store(p.base_tsc, Ordering::Relaxed);
        BASE_NS.store(p.base_ns, Ordering::Relaxed);
        MULT.store(p.mult, Ordering::Relaxed);
        SEQ.store(s + 2, Ordering::Release);
    }

    pub fn max_error_ns() -> i64 {
        MAX_ERR_NS.load(Ordering::Relaxed)
    }

    /// Whether the counter ticks at one rate on every CPU, in every power state.
    pub(super) fn invariant() -> bool {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
                c.lines().find(|l| l.starts_with("flags")).is_some_and(|l| {
                    let has = |f: &str| l.split_whitespace().any(|w| w == f);
                    has("constant_tsc") && has("nonstop_tsc")
                })
            })
        })
    }

    struct Cal {
        first: Option<(u64, i64)>,
        cur: Option<Piece>,
        last_ns: i64,
    }

    /// How often to calibrate while the long-run rate rests on less than
    /// [`SETTLED_NS`] of samples: its error is up to the two samples' brackets (20 µs
    /// each at most) over that stretch, 8e-4 after the first 50 ms, which a second
    /// between calibrations would let grow to 0.8 ms.
    const EARLY_EVERY_NS: i64 = 50_000_000;
    /// The stretch of samples after which calibrating every second is enough (a rate
    /// error of at most 2e-5: 20 µs a second).
    const SETTLED_NS: i64 = 2_000_000_000;

    /// How long after the last calibration the next one is due, at `now`: `piece`,
    /// whether the counter is in use; `first_ns`, when the long-run rate's first
    /// sample was taken.
    pub(super) fn cadence(piece: bool, first_ns: Option<i64>, now: i64) -> i64 {
        if piece && first_ns.is_some_and(|ns| now - ns >= SETTLED_NS) {
            1_000_000_000
        } else {
            EARLY_EVERY_NS
        }
    }

    static CAL: Mutex<Cal> = Mutex::new(Cal {
        first: None,
        cur: None,
        last_ns: 0,
    });

    /// (counter, CLOCK_REALTIME) in the narrowest of three brackets, and its width.
    fn sample() -> (u64, i64, i64) {
        let mut best = (0, 0, i64::MAX);
        for _ in 0..3 {
            let a = super::realtime_ns();
            let t = counter();
            let b = super::realtime_ns();
            if b - a < best.2 {
                best = (t, a + (b - a) / 2, b - a);
            }
        }
        best
    }

    pub fn calibrate() {
        if !invariant() {
            return;
        }
        // One caller at a time (the writer); a test calling too just waits its turn.
        let Ok(mut c) = CAL.try_lock() else { return };
        let now = super::realtime_ns();
        let every = cadence(c.cur.is_some(), c.first.map(|(_, ns)| ns), now);
        if c.last_ns != 0 && now - c.last_ns < every {
            return;
        }
        c.last_ns = now;
        let (t, ns, width) = sample();
        if width > 20_000 {
            return; // preempted in the middle: try again next time
        }
        let Some((t0, ns0)) = c.first else {
            c.first = Some((t, ns));
            return;
        };
        let Some(long) = conv::rate(t0, ns0, t, ns) else {
            // The counter went back or stood still: not a clock to use.
            c.first = Some((t, ns));
            return;
        };
        let piece = match c.cur {
            None => Piece {
                base_tsc: t,
                base_ns: ns,
                mult: long,
            },
            Some(cur) => {
                let (p, err) = conv::next(cur, t, ns, long);
                let err = err.abs() + width / 2;
                if err > MAX_ERR_NS.load(Ordering::Relaxed) {
                    MAX_ERR_NS.store(err, Ordering::Relaxed);
                }
                p
            }
        };
        c.cur = Some(piece);
        publish(piece);
    }
}

/// This process's id, cached (glibc's `getpid` is a system call).
pub fn pid() -> u32 {
    match PID.load(std::sync::atomic::Ordering::Relaxed) {
        0 => {
            let p = std::process::id();
            PID.store(p, std::sync::atomic::Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// In a fork child (its only thread is the one that forked): forget the parent's ids,
/// and let go of the parent's locked logs ([`release_parent_locks`]).
pub fn after_fork_child() {
    let _ = TID.try_with(|t| t.set(0));
    PID.store(0, std::sync::atomic::Ordering::Relaxed);
    release_parent_locks();
}

/// A `flock` lock belongs to the open file, which a fork child shares: while a child
/// lived on (a data-loader worker), a killed parent's logs would stay locked, and
/// `zcta recover` would leave them alone. The child points each of those numbers at
/// `/dev/null` instead (the number stays taken: the parent's writer objects the child
/// inherited still name it, and are never used here). Only async-signal-safe calls.
fn release_parent_locks() {
    let mut null = -1;
    zcta::files::locked_fds(|fd, dev, ino| {
        // A number the program took over (it closed ours) is its own: left alone.
        if fd_id(fd) != Some((dev, ino)) {
            return;
        }
        if null < 0 {
            // SAFETY: a NUL-terminated path; the result is checked.
            null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        }
        if null >= 0 {
            // SAFETY: both descriptors are open; dup3 replaces `fd` atomically.
            unsafe { libc::dup3(null, fd, libc::O_CLOEXEC) };
        }
    });
    if null >= 0 {
        // SAFETY: the descriptor opened above.
        unsafe { libc::close(null) };
    }
    zcta::files::forget_locked_fds();
}

/// Stack left below the caller on this thread: 0 when the caller runs on another
/// stack than the thread's own (a coroutine's, a signal's), None when it cannot be
/// told.
#[inline(never)]
pub fn stack_room() -> Option<usize> {
    let here = 0u8;
    let sp = std::ptr::addr_of!(here) as usize;
    let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
    let (mut base, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: pthread_getattr_np initialises `attr` on success; it is read and then
    // destroyed only then; getstack writes the two locals.
    unsafe {
        if libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) != 0 {
            return None;
        }
        let rc = libc::pthread_attr_getstack(attr.as_ptr(), &mut base, &mut size);
        libc::pthread_attr_destroy(attr.as_mut_ptr());
        if rc != 0 {
            return None;
        }
    }
    // The stack grows down from base + size to base.
    Some(sp.checked_sub(base as usize).filter(|&r| r <= size).unwrap_or(0))
}

/// Address space left under the process's `RLIMIT_AS` (`ulimit -v`, a batch
/// system's `h_vmem`), or None when it has no such limit (or it cannot be read).
pub fn address_space_room() -> Option<u64> {
    let mut lim = std::mem::MaybeUninit::<libc::rlimit>::uninit();
    // SAFETY: getrlimit writes the struct on success; read only then.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, lim.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: initialised by the successful getrlimit.
    let cur = unsafe { lim.assume_init() }.rlim_cur;
    if cur == libc::RLIM_INFINITY {
        return None;
    }
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    Some(cur.saturating_sub(pages.saturating_mul(page)))
}

/// Device and inode of descriptor 2 when the library was loaded (both 0: it was not
/// open, and zcta says nothing on it).
static STDERR_ID: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

fn fd_id(fd: i32) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes the struct on success; read only then.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: initialised by the successful fstat.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

/// Notes what descriptor 2 is (the constructor, before the program can change it).
pub fn note_stderr() {
    use std::sync::atomic::Ordering;
    if let Some((dev, ino)) = fd_id(2) {
        STDERR_ID[0].store(dev, Ordering::Relaxed);
        STDERR_ID[1].store(ino, Ordering::Relaxed);
    }
}

/// Writes a `zcta:` line on the program's stderr, without changing what the program
/// sees:
/// - only while descriptor 2 is the file it was when the library was loaded: a
///   program that closed it and opened a file of its own, which took the number, never
///   finds our line in that file;
/// - with SIGPIPE blocked on this thread, and one that the write raised taken back, so
///   that a closed pipe (a log collector gone, `| head`) never kills the program for
///   our sake; a SIGPIPE pending before is left as it was.
pub fn write_stderr(line: &str) {
    use std::sync::atomic::Ordering;
    let want = (
        STDERR_ID[0].load(Ordering::Relaxed),
        STDERR_ID[1].load(Ordering::Relaxed),
    );
    if want == (0, 0) || fd_id(2) != Some(want) {
        return;
    }
    let mut pipe = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut pending = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: the sets are initialised by sigemptyset/sigaddset, pthread_sigmask and
    // sigpending before they are read; write is given the line's own bytes.
    unsafe {
        libc::sigemptyset(pipe.as_mut_ptr());
        libc::sigaddset(pipe.as_mut_ptr(), libc::SIGPIPE);
        if libc::pthread_sigmask(libc::SIG_BLOCK, pipe.as_ptr(), old.as_mut_ptr()) != 0 {
            return;
        }
        let was_pending = libc::sigpending(pending.as_mut_ptr()) == 0
            && libc::sigismember(pending.as_ptr(), libc::SIGPIPE) == 1;
        let mut rest = line.as_bytes();
        let mut broke = false;
        while !rest.is_empty() {
            let n = libc::write(2, rest.as_ptr().cast(), rest.len());
            if n < 0 {
                let e = std::io::Error::last_os_error().raw_os_error();
                if e == Some(libc::EINTR) {
                    continue;
                }
                broke = e == Some(libc::EPIPE);
                break;
            }
            rest = &rest[n as usize..];
        }
        if broke && !was_pending {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(pipe.as_ptr(), std::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut());
    }
}

/// Host name (cached; empty if unavailable).
pub fn hostname() -> String {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: buf is valid for buf.len() bytes; gethostname NUL-terminates on
        // success when the name fits (we pass len-1 to keep a terminator).
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
        if rc != 0 {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    })
    .clone()
}

/// Blocks every signal in the calling thread (used by the writer thread).
pub fn block_all_signals() {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigfillset initialises the set; pthread_sigmask only reads it.
    unsafe {
        libc::sigfillset(set.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut());
    }
}

/// Claims `len` bytes of disk for `file` from `offset` without changing its size
/// (`fallocate(FALLOC_FL_KEEP_SIZE)`): later writes into them cannot fail for want
/// of room. Whether the disk was claimed (not on a full disk; never again once the
/// file system said it cannot).
pub fn reserve_space(file: &std::fs::File, offset: u64, len: u64) -> bool {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return false;
    }
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return false;
    };
    // SAFETY: a valid open file descriptor (borrowed for the call); no memory passed.
    if unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, off, len) } == 0 {
        return true;
    }
    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
        UNSUPPORTED.store(true, Ordering::Relaxed);
    }
    false
}

/// The bytes free to an unprivileged writer on the file system holding `file`
/// (`fstatvfs`: available blocks times the fragment size); `None` when it cannot say.
pub fn disk_room(file: &std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: a valid open file descriptor (borrowed for the call) and a buffer of
    // the struct's size.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstatvfs filled it.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The working directory when the library was loaded ([`note_start_dir`]), which a
/// relative `ZCTA_OUT` (and the default `zcta-runs`) means: a process may change
/// directory after it started (Hydra does, before the training code runs), and every
/// file it writes must land where it was started. Written once, by the constructor's
/// call of [`note_start_dir`], and read only after [`START_DIR_LEN`] publishes it.
struct StartDir(std::cell::UnsafeCell<[u8; START_DIR_MAX]>);
// SAFETY: written only by the first call of `note_start_dir` (the constructor's),
// before `START_DIR_LEN` is published with Release; then only read.
unsafe impl Sync for StartDir {}
const START_DIR_MAX: usize = 4096;
static START_DIR: StartDir = StartDir(std::cell::UnsafeCell::new([0; START_DIR_MAX]));
static START_DIR_LEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Notes the working directory (constructor; no allocation). Only the first call
/// writes: the buffer is never written while it may be read.
pub fn note_start_dir() {
    static CALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if CALLED.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let buf = START_DIR.0.get().cast::<libc::c_char>();
    // SAFETY: a buffer of START_DIR_MAX bytes that nothing else touches yet; getcwd
    // NUL-terminates what it writes, or fails and returns NULL.
    if unsafe { libc::getcwd(buf, START_DIR_MAX) }.is_null() {
        return;
    }
    // SAFETY: NUL-terminated by getcwd within the buffer.
    let len = unsafe { libc::strlen(buf) };
    START_DIR_LEN.store(len, std::sync::atomic::Ordering::Release);
}

/// The working directory when the library was loaded, if it could be read.
pub fn start_dir() -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let len = START_DIR_LEN.load(std::sync::atomic::Ordering::Acquire);
    if len == 0 {
        return None;
    }
    // SAFETY: published by `note_start_dir` after the bytes were written; never
    // written again.
    let all: &[u8; START_DIR_MAX] = unsafe { &*START_DIR.0.get() };
    let bytes = &all[..len.min(START_DIR_MAX)];
    Some(std::ffi::OsStr::from_bytes(bytes).into())
}

/// The default parent of run directories, when `ZCTA_OUT` is unset or empty.
pub const DEFAULT_OUT: &str = "zcta-runs";

/// Where the run's directories go: `ZCTA_OUT` as the bytes it holds (a path need not
/// be UTF-8), else [`DEFAULT_OUT`]; a relative one is taken from the directory the
/// program was started in ([`start_dir`]), or the current one when that is not known.
pub fn out_dir() -> std::path::PathBuf {
    let out = std::env::var_os("ZCTA_OUT")
        .filter(|v| !v.is_empty())
        .map_or_else(|| std::path::PathBuf::from(DEFAULT_OUT), std::path::PathBuf::from);
    if out.is_absolute() {
        return out;
    }
    match start_dir().or_else(|| std::env::current_dir().ok()) {
        Some(d) => d.join(out),
        None => out,
    }
}

#[cfg(test)]
mod tests {
    use super::conv::{self, Piece};

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn calibrations_come_every_50_ms_until_the_rate_rests_on_2_s_of_samples() {
        use super::tsc::cadence;
        const MS: i64 = 1_000_000;
        assert_eq!(cadence(false, None, 0), 50 * MS, "no sample yet");
        assert_eq!(cadence(false, Some(0), 5_000 * MS), 50 * MS, "no piece yet");
        assert_eq!(cadence(true, Some(0), 1_999 * MS), 50 * MS);
        assert_eq!(cadence(true, Some(0), 2_000 * MS), 1_000 * MS);
    }

    #[test]
    fn now_ns_reads_the_projects_clock() {
        // Same clock as zcta::clock (CLOCK_REALTIME): before calibration the three reads
        // are ordered; after it (where the counter is used) within a few µs. A different
        // clock (CLOCK_MONOTONIC counts from boot) would be decades off.
        let a = zcta::clock::now_ns();
        let b = super::now_ns();
        let c = zcta::clock::now_ns();
        assert!(a - 50_000 <= b && b <= c + 50_000, "{a} {b} {c}");
        for _ in 0..3 {
            super::calibrate_clock();
            std::thread::sleep(std::time::Duration::from_millis(60));
        }
        super::calibrate_clock();
        for _ in 0..1000 {
            let a = zcta::clock::now_ns();
            let b = super::now_ns();
            let c = zcta::clock::now_ns();
            assert!(a - 50_000 <= b && b <= c + 50_000, "{a} {b} {c}");
        }
        assert!(super::clock_error_ns() < 50_000, "{}", super::clock_error_ns());
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            super::tsc::read().is_some(),
            super::tsc::invariant(),
            "calibrated where the counter is invariant"
        );
    }

    #[test]
    fn the_conversion_is_continuous_and_takes_up_drift() {
        // A 3 GHz counter; CLOCK_REALTIME runs 20 ppm faster than the first estimate.
        let ghz = 3.0;
        let mult = conv::rate(0, 0, 3_000_000_000, 1_000_000_000).unwrap();
        assert_eq!(mult, (1u64 << 32) / 3);
        let ns_at = |t: u64| (t as f64 / ghz * (1.0 + 20e-6)) as i64;
        let mut p = Piece {
            base_tsc: 0,
            base_ns: 0,
            mult,
        };
        let mut t = 0u64;
        let mut last_err = i64::MAX;
        for _ in 0..6 {
            t += 3_000_000_000;
            let before = p.at(t);
            // The long-run rate, from the first sample on (as the writer measures it).
            let long = conv::rate(0, 0, t, ns_at(t)).unwrap();
            let (n, err) = conv::next(p, t, ns_at(t), long);
            // No jump where one piece ends and the next begins.
            assert_eq!(n.at(t), before);
            assert!(err.abs() <= last_err.max(21_000), "{err}");
            last_err = err.abs();
            p = n;
        }
        // After a few seconds the disagreement is taken up to within a µs.
        let t2 = t + 3_000_000_000;
        assert!((p.at(t2) - ns_at(t2)).abs() < 1_000, "{}", p.at(t2) - ns_at(t2));
        // A step of CLOCK_REALTIME restarts from the sample.
        let long = conv::rate(0, 0, t2, ns_at(t2)).unwrap();
        let (n, err) = conv::next(p, t2, ns_at(t2) + 5_000_000, long);
        assert_eq!((n.base_ns, n.base_tsc), (ns_at(t2) + 5_000_000, t2));
        assert!(err > conv::STEP_NS);
        // A counter that went back, stood still or ran absurdly is refused.
        assert_eq!(conv::rate(10, 0, 5, 1), None);
        assert_eq!(conv::rate(10, 0, 10, 1), None);
        assert_eq!(conv::rate(0, 0, 1, 1_000_000_000), None);
    }
}
