//! Process-level hooks: the constructor (only registers the fork handler), the exit
//! hook registered at activation, an `_exit` interposer so that `os._exit`-style
//! exits (multiprocessing fork children, frameworks that skip atexit) still close
//! their files, and `execve`, `execv`, `execvp` and `execvpe` interposers, so that a
//! process that replaces itself (`os.execv`) closes them too.

use std::ffi::{c_char, c_int, c_void};
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicPtr, Ordering};

use zcta::sink::EndReason;

use crate::state;

static REAL_EXIT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_EXECVE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_EXECV: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_EXECVP: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_EXECVPE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

// SAFETY (of running before main): the constructor only calls pthread_atfork, dlsym,
// fstat and getcwd, all safe to call during library initialisation; it starts no
// thread, opens no file and allocates nothing that could deadlock a dlopen caller.
#[ctor::ctor(unsafe)]
fn zcta_constructor() {
    // SAFETY: `after_fork_child` is an extern "C" fn that cannot unwind.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_child));
    }
    // Resolved now: `_exit` and the exec family may later run in a vfork child, where
    // taking the loader lock could deadlock.
    for (slot, name) in [
        (&REAL_EXIT, c"_exit"),
        (&REAL_EXECVE, c"execve"),
        (&REAL_EXECV, c"execv"),
        (&REAL_EXECVP, c"execvp"),
        (&REAL_EXECVPE, c"execvpe"),
    ] {
        // SAFETY: RTLD_NEXT lookup with a NUL-terminated name.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        slot.store(p, Ordering::Relaxed);
    }
    super::sys::note_start_dir();
    super::sys::note_stderr();
    zcta::set_warn_writer(super::sys::write_stderr);
    offer_profiler_plugin();
}

/// What `NCCL_PROFILER_PLUGIN` was made to be: see `process.profiler_plugin`.
static PLUGIN_MODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `process.profiler_plugin` for this process.
pub fn plugin_mode() -> String {
    PLUGIN_MODE
        .get()
        .cloned()
        .unwrap_or_else(|| "off: not set up".into())
}

/// Points `NCCL_PROFILER_PLUGIN` at this library, so NCCL loads it as its profiler
/// plugin too, unless the user chose a plugin (NCCL loads only one: theirs wins) or
/// turned ours off. NCCL reads the variable when the first communicator is created,
/// long after this constructor. Runs before `main`, while the process is still
/// single-threaded (for an LD_PRELOADed library), so `setenv` is safe here.
fn offer_profiler_plugin() {
    let off = |v: Option<String>| v.is_some_and(|v| zcta::config::is_off(&v));
    let mode = if off(std::env::var("ZCTA_ENABLE").ok()) {
        "off: ZCTA_ENABLE=0".to_string()
    } else if off(std::env::var("ZCTA_NCCL_PLUGIN").ok()) {
        "off: ZCTA_NCCL_PLUGIN=0".to_string()
    } else if let Some(user) = std::env::var_os("NCCL_PROFILER_PLUGIN") {
        // Set, even empty, is the user's choice (empty: NCCL's default plugin search).
        let user = user.to_string_lossy().into_owned();
        match own_path() {
            Some(own) if same_file(&own, &user) => "zcta".to_string(),
            _ => format!("user: {user}"),
        }
    } else if let Some(conf) = conf_sets_plugin() {
        format!("user: NCCL_PROFILER_PLUGIN in {conf}")
    } else {
        match own_path().and_then(|p| std::ffi::CString::new(p).ok()) {
            Some(path) => {
                // SAFETY: both strings are NUL-terminated; see the function's docs for
                // why calling setenv here is sound.
                unsafe { libc::setenv(c"NCCL_PROFILER_PLUGIN".as_ptr(), path.as_ptr(), 0) };
                "zcta".to_string()
            }
            None => "off: own path unknown".to_string(),
        }
    };
    let mode = match (mode == "zcta").then(crate::plugin::mask_override).flatten() {
        Some(m) => format!("zcta (developer setting: event mask {m:#x})"),
        None => mode,
    };
    let _ = PLUGIN_MODE.set(mode);
}

fn own_path() -> Option<String> {
    super::real::own_path()
}

/// Same file (device and inode), whatever the path strings.
fn same_file(a: &str, b: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

/// NCCL also takes its variables from `NCCL_CONF_FILE`, `~/.nccl.conf` and
/// `/etc/nccl.conf` (without overriding the environment): a plugin chosen there is
/// the user's too. Returns the file that sets it. Every preloaded process asks, most
/// of which never call NCCL, so only a regular file is read
/// ([`zcta::config::conf_file_text`]).
fn conf_sets_plugin() -> Option<String> {
    let home = std::env::var("HOME").ok().map(|h| format!("{h}/.nccl.conf"));
    [
        std::env::var("NCCL_CONF_FILE").ok(),
        home,
        Some("/etc/nccl.conf".to_string()),
    ]
    .into_iter()
    .flatten()
    .find(|path| {
        zcta::config::conf_file_text(std::path::Path::new(path)).is_some_and(|text| {
            text.lines().any(|l| {
                l.trim_start()
                    .strip_prefix("NCCL_PROFILER_PLUGIN")
                    .is_some_and(|r| r.trim_start().starts_with('='))
            })
        })
    })
}

extern "C" fn after_fork_child() {
    super::sys::after_fork_child();
    crate::hooks::after_fork_child();
    state::on_fork_child();
}

extern "C" fn at_exit() {
    let _ = catch_unwind(|| state::on_exit(EndReason::Exit));
}

/// Registers the exit hook (once, at activation).
pub fn register_atexit() {
    // SAFETY: at_exit is an extern "C" fn with no arguments that cannot unwind.
    unsafe {
        libc::atexit(at_exit);
    }
}

extern "C" fn gpu_at_exit() {
    let _ = catch_unwind(crate::gpu::exit_flush);
}

/// Registers the GPU capture's exit flush. Called when capture starts, after CUDA
/// initialised, so it runs before CUDA's own exit handlers (atexit is LIFO).
pub fn register_gpu_atexit() {
    // SAFETY: gpu_at_exit is an extern "C" fn with no arguments that cannot unwind.
    unsafe {
        libc::atexit(gpu_at_exit);
    }
}

/// `zcta_set_recording(on)`: 0 pauses recording (NCCL calls are still forwarded,
/// nothing is recorded, CUPTI's activity kinds are off), non-zero resumes. Returns
/// 1 if recording was on before the call, 0 if it was paused, -1 on an internal
/// error. For programs and benchmarks: `ctypes.CDLL(None).zcta_set_recording(0)`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn zcta_set_recording(on: c_int) -> c_int {
    catch_unwind(|| state::set_recording(on != 0)).map_or(-1, c_int::from)
}

/// `_exit(2)` interposer: closes our files (bounded wait) when this process owns the
/// writer, then exits exactly as the real `_exit` would.
///
/// # Safety
/// Same contract as libc's `_exit`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    close_files_before(EndReason::UnderscoreExit);
    let p = REAL_EXIT.load(Ordering::Relaxed);
    if !p.is_null() {
        // SAFETY: p is libc's `_exit`, resolved in the constructor.
        let f: unsafe extern "C" fn(c_int) -> ! =
            unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> !>(p) };
        // SAFETY: forwarding the caller's argument unchanged.
        unsafe { f(status) }
    }
    // SAFETY: exit_group never returns.
    unsafe {
        libc::syscall(libc::SYS_exit_group, status);
    }
    #[allow(clippy::empty_loop)]
    loop {}
}

/// Before the process ends (`_exit`) or replaces itself (the exec family): closes our
/// files (bounded wait) when this process owns the writer. A fork or vfork child
/// (another pid) goes straight on. Should an exec then fail, the process goes on
/// unrecorded.
fn close_files_before(reason: EndReason) {
    if state::owns_writer(std::process::id()) {
        let _ = catch_unwind(|| state::on_exit(reason));
    }
}

type ExecFn = unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type ExecNoEnvFn = unsafe extern "C" fn(*const c_char, *const *const c_char) -> c_int;

/// The real function in `slot`, or None (then the call fails with ENOSYS: libc
/// without it).
fn real_fn(slot: &AtomicPtr<c_void>) -> Option<*mut c_void> {
    let p = slot.load(Ordering::Relaxed);
    if p.is_null() {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return None;
    }
    Some(p)
}

/// `execve(2)` interposer ([`close_files_before`], then libc's).
///
/// # Safety
/// Same contract as libc's `execve`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    close_files_before(EndReason::Exec);
    let Some(p) = real_fn(&REAL_EXECVE) else { return -1 };
    // SAFETY: p is libc's `execve`, resolved in the constructor; arguments unchanged.
    unsafe { std::mem::transmute::<*mut c_void, ExecFn>(p)(path, argv, envp) }
}

/// `execvpe(3)` interposer ([`close_files_before`], then libc's).
///
/// # Safety
/// Same contract as libc's `execvpe`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    close_files_before(EndReason::Exec);
    let Some(p) = real_fn(&REAL_EXECVPE) else {
        return -1;
    };
    // SAFETY: p is libc's `execvpe`, resolved in the constructor; arguments unchanged.
    unsafe { std::mem::transmute::<*mut c_void, ExecFn>(p)(file, argv, envp) }
}

/// `execv(3)` interposer ([`close_files_before`], then libc's).
///
/// # Safety
/// Same contract as libc's `execv`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    close_files_before(EndReason::Exec);
    let Some(p) = real_fn(&REAL_EXECV) else { return -1 };
    // SAFETY: p is libc's `execv`, resolved in the constructor; arguments unchanged.
    unsafe { std::mem::transmute::<*mut c_void, ExecNoEnvFn>(p)(path, argv) }
}

/// `execvp(3)` interposer ([`close_files_before`], then libc's).
///
/// # Safety
/// Same contract as libc's `execvp`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    close_files_before(EndReason::Exec);
    let Some(p) = real_fn(&REAL_EXECVP) else { return -1 };
    // SAFETY: p is libc's `execvp`, resolved in the constructor; arguments unchanged.
    unsafe { std::mem::transmute::<*mut c_void, ExecNoEnvFn>(p)(file, argv) }
}
