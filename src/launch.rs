//! Starting a program under the shim: where `libzcta_prof.so` is, and the environment
//! that preloads it and names the run. Shared by `zcta run` and `zcta doctor --probe`.
//! [`run_to_end`] runs `zcta run`'s command to its end, whatever signals zcta gets.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// The shim to preload: `arg` (`--shim`), `$ZCTA_SHIM`, or `libzcta_prof.so` next to
/// the running executable (a build's `target/release/`), else in `../lib/` from it (the
/// wheel's layout: `bin/zcta` and `lib/libzcta_prof.so` under the environment's prefix).
/// The path is absolute, without links where their resolved path can go in
/// `LD_PRELOAD` ([`preloadable`]), else as given. Err says what is missing or wrong
/// and how to fix it.
pub fn find_shim(arg: Option<PathBuf>) -> Result<PathBuf, String> {
    let cand = arg
        .or_else(|| std::env::var_os("ZCTA_SHIM").map(PathBuf::from))
        .or_else(|| {
            let dir = std::env::current_exe().ok()?.parent()?.to_path_buf();
            let here = dir.join("libzcta_prof.so");
            let installed = dir.join("..").join("lib").join("libzcta_prof.so");
            Some(if !here.is_file() && installed.is_file() {
                installed
            } else {
                here
            })
        });
    match cand {
        Some(p) if p.is_file() => {
            let canon = std::fs::canonicalize(&p).ok().filter(|c| preloadable(c));
            let shim = canon.unwrap_or_else(|| std::path::absolute(&p).unwrap_or(p));
            if !is_elf(&shim) {
                Err(format!(
                    "{}: not a shared library (no ELF header), so the dynamic loader would refuse \
                     to preload it and nothing would be recorded; point --shim or ZCTA_SHIM at \
                     libzcta_prof.so",
                    shim.display()
                ))
            } else if preloadable(&shim) {
                Ok(shim)
            } else {
                Err(format!(
                    "{}: LD_PRELOAD splits its list at spaces and colons, so the shim would not be \
                     loaded from this path and nothing would be recorded; point at it through a \
                     symbolic link whose path has neither (ln -s '{}' /tmp/libzcta_prof.so, then \
                     --shim /tmp/libzcta_prof.so)",
                    shim.display(),
                    shim.display()
                ))
            }
        }
        Some(p) => Err(match std::fs::metadata(&p) {
            Ok(m) => format!(
                "{}: not a file but {} (pass the path of libzcta_prof.so with --shim or ZCTA_SHIM)",
                p.display(),
                if m.is_dir() {
                    "a directory"
                } else {
                    "a special file"
                }
            ),
            Err(_) => format!(
                "{}: no such file (build it with `cargo build --release --workspace`, or pass --shim / set ZCTA_SHIM)",
                p.display()
            ),
        }),
        None => Err("cannot tell where libzcta_prof.so is: pass --shim or set ZCTA_SHIM".into()),
    }
}

/// Whether the file at `path` starts with an ELF header (what the dynamic loader needs
/// to preload it).
fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"\x7fELF"
}

/// A fresh run id: `run-<UNIX seconds>-<pid>`.
pub fn default_run_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("run-{now}-{}", std::process::id())
}

/// Whether `path` can be one entry of `LD_PRELOAD`, which the dynamic loader splits
/// at spaces and colons.
pub fn preloadable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    !path
        .as_os_str()
        .as_bytes()
        .iter()
        .any(|&b| b == b' ' || b == b':')
}

/// `LD_PRELOAD` with the shim first and the caller's own preloads kept after it.
pub fn preload_value(shim: &Path) -> OsString {
    let mut preload = shim.as_os_str().to_owned();
    if let Some(prev) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(prev);
    }
    preload
}

/// Sets what makes `cmd` (and every child it starts) record into `out/run_id`.
pub fn under_shim<'c>(cmd: &'c mut Command, shim: &Path, out: &Path, run_id: &str) -> &'c mut Command {
    cmd.env("LD_PRELOAD", preload_value(shim))
        .env("ZCTA_OUT", out)
        .env("ZCTA_RUN_ID", run_id)
}

/// Runs `cmd` and waits for it to end, however it ends; its exit status. While it
/// runs, SIGINT and SIGQUIT do not stop this process (a terminal sends them to the
/// whole process group, the command included, which decides what they mean; one sent
/// to this process alone is not passed on), and SIGTERM and SIGHUP are passed on to the
/// command, which ends as it chooses; a signal
/// this process ignored when it started stays ignored, by the command too. The
/// dispositions in place before are restored when the command has ended. One command
/// at a time per process.
pub fn run_to_end(cmd: &mut Command) -> std::io::Result<ExitStatus> {
    let ignored = signals_ignored();
    // No signal from an earlier command is pending.
    sig::watch(0);
    let mut saved = Vec::new();
    for (sig, forward) in [
        (sig::SIGINT, false),
        (sig::SIGQUIT, false),
        (sig::SIGTERM, true),
        (sig::SIGHUP, true),
    ] {
        if ignored & (1u64 << (sig - 1)) == 0 {
            saved.push((sig, sig::catch(sig, forward)));
        }
    }
    let child = cmd.spawn();
    let status = child.and_then(|mut child| {
        sig::watch(child.id());
        sig::wait_for_end(child.id());
        sig::watch(0);
        child.wait()
    });
    for (s, old) in saved {
        sig::restore(s, old);
    }
    status
}

/// The signals this process ignores (`SigIgn` of /proc/self/status: bit N-1 for signal
/// N); none when it cannot be read.
fn signals_ignored() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
            u64::from_str_radix(line.trim(), 16).ok()
        })
        .unwrap_or(0)
}

/// A write past the file-size limit (`ulimit -f`) fails with `EFBIG`, which zcta's
/// writers report and clean up after, instead of killing this process with SIGXFSZ
/// halfway through a file. Not for a process that starts a command: an ignored signal
/// stays ignored across `execve`.
pub fn file_size_limit_is_an_error() {
    sig::ignore(libc::SIGXFSZ);
}

/// While a temporary file of ours is being written (a trace that will replace a file
/// once complete), SIGINT, SIGTERM and SIGHUP remove it before they end this process
/// as they would have (`Some(path)`), so an interrupted write leaves nothing behind;
/// `None` when the file is gone or has its final name: the dispositions before are
/// back. A signal this process ignored stays ignored. One file at a time.
pub fn remove_on_interrupt(path: Option<&Path>) {
    match path {
        Some(p) => {
            let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str())) else {
                return;
            };
            sig::removing(Some(c), signals_ignored());
        }
        // Putting the dispositions back needs no list of the ignored ones.
        None => sig::removing(None, 0),
    }
}

/// The signal handling of [`run_to_end`], [`remove_on_interrupt`] and
/// [`file_size_limit_is_an_error`]: the only
/// unsafe code of this crate, the C library's `sigaction`, `signal`, `kill` and
/// `waitid` (through the `libc` crate). The handlers do no more than the C library lets
/// a handler do (`kill`, atomics, `errno` kept).
#[allow(unsafe_code)]
mod sig {
    use std::sync::atomic::{AtomicI32, Ordering::SeqCst};

    pub use libc::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};

    /// The command's pid while it runs (0: none, or not started yet).
    static CHILD: AtomicI32 = AtomicI32::new(0);
    /// The last signal to pass on; kept for one that comes before the pid is known.
    static PENDING: AtomicI32 = AtomicI32::new(0);

    extern "C" fn pass_on(s: i32) {
        PENDING.store(s, SeqCst);
        let pid = CHILD.load(SeqCst);
        if pid > 0 {
            // SAFETY: kill is async-signal-safe; errno is put back as it was.
            unsafe {
                let errno = *libc::__errno_location();
                libc::kill(pid, s);
                *libc::__errno_location() = errno;
            }
        }
    }

    /// SIGINT and SIGQUIT: held. A terminal sends them to the whole process group, the
    /// command included; so do job schedulers and `timeout`, which signal every process
    /// (passing one on would give the command a second one, which may cut short what
    /// the first began, a Python program's cleanup after KeyboardInterrupt).
    extern "C" fn hold(_: i32, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

    extern "C" fn pass_on_info(s: i32, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        pass_on(s);
    }

    /// Catches `s` (passing it on to the command, or holding it, [`hold`]); the
    /// disposition it replaces (None: it could not be caught). A caught signal is the
    /// default again in the command (`execve`).
    pub fn catch(s: i32, forward: bool) -> Option<libc::sigaction> {
        install(s, if forward { pass_on_info } else { hold })
    }

    type Handler = extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void);

    /// Makes `handler` the disposition of `s` (restarting interrupted calls); the one
    /// it replaces (None: `s` could not be caught).
    fn install(s: i32, handler: Handler) -> Option<libc::sigaction> {
        // SAFETY: both structs are plain data, zeroed then filled; every handler given
        // here does only what a signal handler may; the old disposition is read only on
        // success.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as libc::sighandler_t;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            (libc::sigaction(s, &act, &mut old) == 0).then_some(old)
        }
    }

    /// The temporary file [`removing`] names (a leaked C string; null: none).
    static DOOMED: std::sync::atomic::AtomicPtr<libc::c_char> =
        std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    /// The dispositions [`removing`] replaced, to put back.
    static SAVED: std::sync::Mutex<Vec<(i32, Option<libc::sigaction>)>> = std::sync::Mutex::new(Vec::new());

    /// Removes the file [`DOOMED`] names, then ends the process by `s` as the default
    /// disposition would (only what a handler may do: `unlink`, `signal`, `raise`).
    extern "C" fn remove_and_end(s: i32, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        let p = DOOMED.swap(std::ptr::null_mut(), SeqCst);
        // SAFETY: `p` is null or a C string leaked by `removing`, never freed while set;
        // unlink, signal and raise are async-signal-safe.
        unsafe {
            if !p.is_null() {
                libc::unlink(p);
            }
            libc::signal(s, libc::SIG_DFL);
            libc::raise(s);
        }
    }

    /// Catches SIGINT, SIGTERM and SIGHUP (those not in `ignored`, bit N-1 for signal
    /// N) to remove `file` first ([`remove_and_end`]); `None`: puts the dispositions
    /// back and forgets the file.
    pub fn removing(file: Option<std::ffi::CString>, ignored: u64) {
        let mut saved = SAVED.lock().unwrap_or_else(|p| p.into_inner());
        let old = DOOMED.swap(
            file.map_or(std::ptr::null_mut(), std::ffi::CString::into_raw),
            SeqCst,
        );
        if !old.is_null() {
            // SAFETY: made by CString::into_raw above, in an earlier call; no handler
            // holds it any more (swapped out).
            drop(unsafe { std::ffi::CString::from_raw(old) });
        }
        if DOOMED.load(SeqCst).is_null() {
            for (s, old) in saved.drain(..) {
                restore(s, old);
            }
            return;
        }
        if !saved.is_empty() {
            return;
        }
        for s in [SIGINT, SIGTERM, SIGHUP] {
            if ignored & (1u64 << (s - 1)) != 0 {
                continue;
            }
            saved.push((s, install(s, remove_and_end)));
        }
    }

    /// Ignores `s`.
    pub fn ignore(s: i32) {
        // SAFETY: SIG_IGN is a valid disposition for any catchable signal.
        unsafe { libc::signal(s, libc::SIG_IGN) };
    }

    /// Puts back the disposition `old` that [`catch`] returned.
    pub fn restore(s: i32, old: Option<libc::sigaction>) {
        if let Some(old) = old {
            // SAFETY: `old` is the disposition sigaction gave for `s`.
            unsafe { libc::sigaction(s, &old, std::ptr::null_mut()) };
        }
    }

    /// Signals passed on go to `pid` from now on (0: to nobody); one that came before
    /// goes now.
    pub fn watch(pid: u32) {
        let pid = i32::try_from(pid).unwrap_or(0);
        CHILD.store(pid, SeqCst);
        let s = PENDING.swap(0, SeqCst);
        if pid > 0 && s != 0 {
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(pid, s) };
        }
    }

    /// Returns when the child `pid` has ended, leaving it to be reaped (so its pid is
    /// not given to another process while signals may still be passed on to it).
    pub fn wait_for_end(pid: u32) {
        let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
        loop {
            // SAFETY: `info` is a siginfo_t for waitid to fill.
            let r =
                unsafe { libc::waitid(libc::P_PID, pid, info.as_mut_ptr(), libc::WEXITED | libc::WNOWAIT) };
            if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return;
            }
        }
    }
}
