//! The NCCL profiler plugin ABI, version 5 (NCCL 2.28): the exported
//! `ncclProfiler_v5` struct and the decoding of event descriptors. Layouts are those
//! of NCCL 2.28.9's `profiler_v5.h` (docs/dev/nccl-profiler-v5.md), checked below at
//! compile time. Every callback returns success: a failure here must never reach NCCL.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use crate::plugin::{self, Start};
use crate::state::protect;

type Logger = *const c_void;

/// `ncclProfiler_v5_t`.
#[repr(C)]
pub struct ProfilerV5 {
    name: *const c_char,
    init: unsafe extern "C" fn(
        *mut *mut c_void,
        u64,
        *mut c_int,
        *const c_char,
        c_int,
        c_int,
        c_int,
        Logger,
    ) -> c_int,
    start_event: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *const EventDescr) -> c_int,
    stop_event: unsafe extern "C" fn(*mut c_void) -> c_int,
    record_event_state: unsafe extern "C" fn(*mut c_void, c_int, *const StateArgs) -> c_int,
    finalize: unsafe extern "C" fn(*mut c_void) -> c_int,
}

// SAFETY: the struct is immutable after compilation; the name points to a static
// string and the rest are function pointers.
unsafe impl Sync for ProfilerV5 {}

/// `ncclProfilerEventDescr_v5_t`: header plus an 88-byte union.
#[repr(C)]
pub struct EventDescr {
    ty: u64,
    parent: *mut c_void,
    rank: c_int,
    _pad: c_int,
    u: [u64; 11],
}

/// The `coll` member of the union.
#[repr(C)]
struct CollDescr {
    seq_number: u64,
    func: *const c_char,
    send_buff: *const c_void,
    recv_buff: *mut c_void,
    count: usize,
    root: c_int,
    datatype: *const c_char,
    n_channels: u8,
    n_warps: u8,
    algo: *const c_char,
    proto: *const c_char,
    parent_group: *mut c_void,
}

/// The `p2p` member.
#[repr(C)]
struct P2pDescr {
    func: *const c_char,
    buff: *mut c_void,
    datatype: *const c_char,
    count: usize,
    peer: c_int,
    n_channels: u8,
    parent_group: *mut c_void,
}

/// The `proxyOp` member.
#[repr(C)]
struct ProxyOpDescr {
    pid: c_int,
    channel_id: u8,
    peer: c_int,
    n_steps: c_int,
    chunk_size: c_int,
    is_send: c_int,
}

/// The `kernelCh` member.
#[repr(C)]
struct KernelChDescr {
    channel_id: u8,
    p_timer: u64,
}

/// `ncclProfilerEventStateArgs_v5_t` (8-byte union).
#[repr(C)]
pub struct StateArgs {
    value: u64,
}

// Layout checks against NCCL 2.28.9's profiler_v5.h (offsets within the descriptor
// are the union offset 24 plus the member's own).
const _: () = {
    assert!(size_of::<ProfilerV5>() == 48);
    assert!(size_of::<EventDescr>() == 112);
    assert!(offset_of!(EventDescr, parent) == 8);
    assert!(offset_of!(EventDescr, rank) == 16);
    assert!(offset_of!(EventDescr, u) == 24);
    assert!(size_of::<CollDescr>() == 88);
    assert!(offset_of!(CollDescr, root) + 24 == 64);
    assert!(offset_of!(CollDescr, datatype) + 24 == 72);
    assert!(offset_of!(CollDescr, n_channels) + 24 == 80);
    assert!(offset_of!(CollDescr, n_warps) + 24 == 81);
    assert!(offset_of!(CollDescr, algo) + 24 == 88);
    assert!(offset_of!(CollDescr, proto) + 24 == 96);
    assert!(offset_of!(CollDescr, parent_group) + 24 == 104);
    assert!(offset_of!(P2pDescr, count) + 24 == 48);
    assert!(offset_of!(P2pDescr, peer) + 24 == 56);
    assert!(offset_of!(P2pDescr, n_channels) + 24 == 60);
    assert!(offset_of!(P2pDescr, parent_group) + 24 == 64);
    assert!(size_of::<ProxyOpDescr>() == 24);
    assert!(offset_of!(ProxyOpDescr, channel_id) + 24 == 28);
    assert!(offset_of!(ProxyOpDescr, peer) + 24 == 32);
    assert!(offset_of!(ProxyOpDescr, is_send) + 24 == 44);
    assert!(offset_of!(KernelChDescr, p_timer) + 24 == 32);
    assert!(size_of::<StateArgs>() == 8);
};

/// The symbol NCCL looks up in the library named by `NCCL_PROFILER_PLUGIN`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v5: ProfilerV5 = ProfilerV5 {
    name: c"zcta-prof".as_ptr(),
    init,
    start_event,
    stop_event,
    record_event_state,
    finalize,
};

/// # Safety
/// `p` is NULL or a NUL-terminated string (NCCL passes static literals).
unsafe fn str_at<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        return "";
    }
    // SAFETY: see the function's contract.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    _log: Logger,
) -> c_int {
    // SAFETY: NCCL passes a valid C string or NULL.
    let name = unsafe { (!comm_name.is_null()).then(|| str_at(comm_name)) };
    let handle = protect(|| {
        // Only the copy that interposes NCCL records: a process that inherited
        // NCCL_PROFILER_PLUGIN without LD_PRELOAD (or preloads another copy) gets a
        // plugin that asks for no events. A communicator created while recording is
        // paused is taken too (NCCL's mask stays 0 until it resumes): declining it
        // would lose its events for good.
        if !super::exports::interposing() || crate::state::recorder().is_none() {
            return 0;
        }
        plugin::init(comm_id, name, n_nodes, nranks, rank)
    })
    .unwrap_or(0);
    if handle != 0 && !mask.is_null() {
        if super::real::in_forwarded_nccl(mask.cast_const().cast()) {
            NCCL_MASK.store(mask, Ordering::SeqCst);
            sync_nccl_events();
        } else {
            // Another copy of NCCL (which might be unloaded later): asked for our
            // events once, never written to again.
            // SAFETY: NCCL passes the address of its global activation mask.
            unsafe { mask.write(plugin::activation_mask()) };
        }
    }
    if !ctx.is_null() {
        // SAFETY: NCCL passes the address of the communicator's context slot.
        unsafe { ctx.write(handle as *mut c_void) };
    }
    0
}

/// NCCL's global event mask (`ncclProfilerEventMask`, whose address `init` is given),
/// when it belongs to the libnccl we forward to.
static NCCL_MASK: AtomicPtr<c_int> = AtomicPtr::new(std::ptr::null_mut());

/// Makes NCCL's event mask match the recording state: our events while recording,
/// none while paused or after an internal error. NCCL reads the mask atomically at
/// every API call, so when paused it skips its profiler work altogether instead of
/// calling us to decline each event. Called after every change of that state, from
/// any thread: each caller re-reads the state after its store and stores again if it
/// changed meanwhile, so the last store always matches the last state (all SeqCst).
pub fn sync_nccl_events() {
    for _ in 0..8 {
        let p = NCCL_MASK.load(Ordering::SeqCst);
        if p.is_null() {
            return;
        }
        let want = wanted_mask();
        // SAFETY: p is the libnccl's global `int ncclProfilerEventMask` (checked at
        // init to lie in the library we forward to, which stays mapped: the shim
        // holds a handle to it and never closes it); 4-aligned. NCCL 2.28.9 only
        // reads it, atomically (`__atomic_load_n`, src/plugin/profiler.cc:218);
        // later NCCL versions also adjust it plainly inside their own init, right
        // after our `init` returns, which a pause from another thread at that very
        // moment could race with (one lost update; the next pause or resume fixes it).
        unsafe { AtomicI32::from_ptr(p) }.store(want, Ordering::SeqCst);
        if wanted_mask() == want {
            return;
        }
    }
}

/// Before the real call of an op (hot path): asks NCCL for its events when the budget
/// `selected` the op, and for none otherwise. NCCL 2.28.9 reads the global mask when
/// an op is enqueued (`ncclProfilerStartGroupApiEvent`, at every task append) and keeps
/// that snapshot in the task: its API, KernelLaunch, Coll/P2p and proxy events follow
/// it. The mask is one int per process, so with threads that issue ops concurrently an
/// op can take another thread's choice (then it has NCCL's events without being timed,
/// or is timed without them); nothing else depends on it.
#[inline]
pub fn follow_op(selected: bool) {
    if !crate::control::follow_budget() {
        return;
    }
    let p = NCCL_MASK.load(Ordering::Relaxed);
    if p.is_null() {
        return;
    }
    let want = if selected { wanted_mask() } else { 0 };
    // SAFETY: as in `sync_nccl_events`.
    let m = unsafe { AtomicI32::from_ptr(p) };
    if m.load(Ordering::Relaxed) != want {
        m.store(want, Ordering::SeqCst);
        // A pause from another thread between our read of the state and the store
        // must not leave the events on.
        if want != 0 && wanted_mask() == 0 {
            m.store(0, Ordering::SeqCst);
        }
    }
}

fn wanted_mask() -> i32 {
    if crate::control::nccl_events_wanted() {
        plugin::activation_mask()
    } else {
        0
    }
}

/// Offsets in the union of `collApi.graphCaptured` and `p2pApi.graphCaptured` (`bool`;
/// 64 and 56 from the descriptor's start: docs/dev/nccl-profiler-v5.md).
const COLL_API_GRAPH_CAPTURED: usize = 64 - 24;
const P2P_API_GRAPH_CAPTURED: usize = 56 - 24;

/// Decodes a descriptor.
///
/// # Safety
/// `d` points to a valid v5 descriptor whose strings are static.
unsafe fn decode<'a>(d: &'a EventDescr) -> Start<'a> {
    let u = d.u.as_ptr().cast::<u8>();
    // SAFETY (all arms): the union member read matches the event type NCCL set, and
    // the union is 88 bytes, 8-aligned, as large as every member.
    unsafe {
        match d.ty {
            t if t == plugin::bits::COLL_API => Start::CollApi {
                graph_captured: *u.add(COLL_API_GRAPH_CAPTURED) != 0,
            },
            t if t == plugin::bits::P2P_API => Start::P2pApi {
                graph_captured: *u.add(P2P_API_GRAPH_CAPTURED) != 0,
            },
            t if t == plugin::bits::COLL => {
                let c = &*u.cast::<CollDescr>();
                Start::Coll {
                    seq: c.seq_number,
                    func: str_at(c.func),
                    count: c.count as u64,
                    dtype: str_at(c.datatype),
                    n_channels: c.n_channels,
                    n_warps: c.n_warps,
                    algo: str_at(c.algo),
                    proto: str_at(c.proto),
                }
            }
            t if t == plugin::bits::P2P => {
                let p = &*u.cast::<P2pDescr>();
                Start::P2p {
                    func: str_at(p.func),
                    dtype: str_at(p.datatype),
                    count: p.count as u64,
                    peer: p.peer,
                    n_channels: p.n_channels,
                }
            }
            t if t == plugin::bits::PROXY_OP => {
                let p = &*u.cast::<ProxyOpDescr>();
                Start::ProxyOp {
                    pid: p.pid,
                    channel: p.channel_id,
                    peer: p.peer,
                    n_steps: p.n_steps,
                    chunk_size: p.chunk_size,
                    is_send: p.is_send != 0,
                }
            }
            t if t == plugin::bits::PROXY_STEP => Start::ProxyStep {
                step: *u.cast::<c_int>(),
            },
            t if t == plugin::bits::PROXY_CTRL => Start::ProxyCtrl,
            t if t == plugin::bits::KERNEL_LAUNCH => Start::KernelLaunch,
            t if t == plugin::bits::KERNEL_CH => {
                let k = &*u.cast::<KernelChDescr>();
                Start::KernelCh {
                    channel: k.channel_id,
                    timer: k.p_timer,
                }
            }
            _ => Start::Untracked,
        }
    }
}

unsafe extern "C" fn start_event(ctx: *mut c_void, handle: *mut *mut c_void, d: *const EventDescr) -> c_int {
    let h = if d.is_null() {
        0
    } else {
        // SAFETY: NCCL passes a valid descriptor for the duration of the call.
        let d = unsafe { &*d };
        // SAFETY: as above.
        let ev = unsafe { decode(d) };
        protect(|| plugin::start(ctx as usize, d.parent as usize, d.rank, ev)).unwrap_or(0)
    };
    if !handle.is_null() {
        // SAFETY: NCCL passes the address where it keeps the event handle.
        unsafe { handle.write(h as *mut c_void) };
    }
    0
}

unsafe extern "C" fn stop_event(handle: *mut c_void) -> c_int {
    protect(|| plugin::stop(handle as usize));
    0
}

unsafe extern "C" fn record_event_state(handle: *mut c_void, state: c_int, args: *const StateArgs) -> c_int {
    // SAFETY: args is NULL or points to the 8-byte union.
    let arg = if args.is_null() {
        0
    } else {
        unsafe { (*args).value }
    };
    // appendedProxyOps is an int in the low 4 bytes.
    let arg = if state == 18 { u64::from(arg as u32) } else { arg };
    protect(|| plugin::record_state(handle as usize, state, arg));
    0
}

/// Nothing to release: a context is an index into a fixed, generation-tagged table
/// whose entries are reused when new communicators arrive.
unsafe extern "C" fn finalize(_ctx: *mut c_void) -> c_int {
    0
}
