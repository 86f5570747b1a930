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

/// The project's clock (`zcta::clock`: CLOCK_REALTIME, ns since the UNIX epoch), read
/// straight from `clock_gettime` (the vDSO). The hooks take it twice per NCCL call;
/// through `SystemTime` and `duration_since` each read cost ~85 more instructions
/// (callgrind, docs/PERFORMANCE.md).
#[inline]
pub fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_REALTIME always exists, so the call cannot
    // fail (and on failure `ts` stays zero rather than undefined).
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec.wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec)
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

/// In a fork child (its only thread is the one that forked): forget the parent's ids.
pub fn after_fork_child() {
    let _ = TID.try_with(|t| t.set(0));
    PID.store(0, std::sync::atomic::Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    #[test]
    fn now_ns_reads_the_projects_clock() {
        // Same clock as zcta::clock (CLOCK_REALTIME), so the three reads are ordered; a
        // different clock (CLOCK_MONOTONIC counts from boot) would be decades off.
        let a = zcta::clock::now_ns();
        let b = super::now_ns();
        let c = zcta::clock::now_ns();
        assert!(a <= b && b <= c, "{a} {b} {c}");
    }
}
