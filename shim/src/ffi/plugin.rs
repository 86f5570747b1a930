//! The NCCL profiler plugin ABI, versions 5, 6 and 7 (NCCL 2.28, 2.29-2.30, 2.31+):
//! the exported `ncclProfiler_v5`, `ncclProfiler_v6` and `ncclProfiler_v7` structs and
//! the decoding of their event descriptors into one event model ([`Start`]). NCCL
//! looks the symbols up newest first and takes the newest it knows, so one library
//! serves every version. Layouts are those of NCCL 2.28.9's `profiler_v5.h`
//! (docs/dev/nccl-profiler-v5.md), 2.29.2's `profiler_v6.h` and 2.31.2's
//! `profiler_v7.h` (docs/dev/nccl-profiler-v6-v7.md), checked below at compile time.
//! Every callback returns success: a failure here must never reach NCCL.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use crate::plugin::{self, Start};
use crate::state::protect;

type Logger = *const c_void;

/// `ncclProfiler_v5_t`, `ncclProfiler_v6_t` and `ncclProfiler_v7_t`: the same six
/// members; only the descriptor that `startEvent` receives differs (passed as an
/// untyped pointer here, decoded per version).
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
    start_event: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *const c_void) -> c_int,
    stop_event: unsafe extern "C" fn(*mut c_void) -> c_int,
    record_event_state: unsafe extern "C" fn(*mut c_void, c_int, *const StateArgs) -> c_int,
    finalize: unsafe extern "C" fn(*mut c_void) -> c_int,
}

// SAFETY: the struct is immutable after compilation; the name points to a static
// string and the rest are function pointers.
unsafe impl Sync for ProfilerV5 {}

/// `ncclProfilerEventDescr_v5_t` and `_v6_t`: header plus an 88-byte union (v6 adds
/// CE members that fit in it). v7 has the same header and a 112-byte union.
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

/// v7's descriptor: the header of [`EventDescr`] plus a 112-byte union.
#[repr(C)]
pub struct EventDescrV7 {
    ty: u64,
    parent: *mut c_void,
    rank: c_int,
    _pad: c_int,
    u: [u64; 14],
}

/// v6's `ceColl` member (v7 appends `userTag`: [`CeCollDescrV7`]).
#[repr(C)]
struct CeCollDescr {
    seq_number: u64,
    func: *const c_char,
    send_buff: *const c_void,
    recv_buff: *mut c_void,
    count: usize,
    root: c_int,
    datatype: *const c_char,
    sync_strategy: *const c_char,
    intra_batch_sync: u8,
    batch_size: u32,
    num_batches: u32,
    ce_seq_num: u32,
    stream: *mut c_void,
}

/// v7's `ceColl`.
#[repr(C)]
struct CeCollDescrV7 {
    v6: CeCollDescr,
    user_tag: u64,
}

/// `ceCollSync` (v6, v7).
#[repr(C)]
struct CeSyncDescr {
    is_complete: u8,
    n_ranks: c_int,
}

/// `ceCollBatch` (v6, v7).
#[repr(C)]
struct CeBatchDescr {
    num_ops: c_int,
    total_bytes: usize,
    use_intra_sync: u8,
}

/// v7's `collApi`.
#[repr(C)]
struct CollApiDescrV7 {
    func: *const c_char,
    count: usize,
    datatype: *const c_char,
    root: c_int,
    stream: *mut c_void,
    graph_captured: u8,
    user_tag: u64,
}

/// v7's `p2pApi`.
#[repr(C)]
struct P2pApiDescrV7 {
    func: *const c_char,
    count: usize,
    datatype: *const c_char,
    stream: *mut c_void,
    graph_captured: u8,
    user_tag: u64,
}

/// v7's `coll`: v5's plus three members.
#[repr(C)]
struct CollDescrV7 {
    v5: CollDescr,
    kernel_variant: *const c_char,
    is_sym_coll: u8,
    user_tag: u64,
}

/// v7's `p2p`: v5's plus `userTag`.
#[repr(C)]
struct P2pDescrV7 {
    v5: P2pDescr,
    user_tag: u64,
}

/// v7's `kernelPhase` (never asked for by default; decoded for completeness).
#[repr(C)]
struct KernelPhaseDescr {
    channel_id: u8,
    phase_id: u8,
    phase_name: *const c_char,
    p_timer: u64,
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
    // NCCL 2.29.2's profiler_v6.h: the descriptor keeps v5's size; ceColl fills the union.
    assert!(size_of::<CeCollDescr>() == 88);
    assert!(offset_of!(CeCollDescr, count) + 24 == 56);
    assert!(offset_of!(CeCollDescr, root) + 24 == 64);
    assert!(offset_of!(CeCollDescr, datatype) + 24 == 72);
    assert!(offset_of!(CeCollDescr, sync_strategy) + 24 == 80);
    assert!(offset_of!(CeCollDescr, intra_batch_sync) + 24 == 88);
    assert!(offset_of!(CeCollDescr, batch_size) + 24 == 92);
    assert!(offset_of!(CeCollDescr, num_batches) + 24 == 96);
    assert!(offset_of!(CeCollDescr, ce_seq_num) + 24 == 100);
    assert!(offset_of!(CeCollDescr, stream) + 24 == 104);
    assert!(offset_of!(CeSyncDescr, n_ranks) + 24 == 28);
    assert!(size_of::<CeSyncDescr>() == 8);
    assert!(offset_of!(CeBatchDescr, total_bytes) + 24 == 32);
    assert!(offset_of!(CeBatchDescr, use_intra_sync) + 24 == 40);
    assert!(size_of::<CeBatchDescr>() == 24);
    // NCCL 2.31.2's profiler_v7.h: the union grows to 112 bytes (coll).
    assert!(size_of::<EventDescrV7>() == 136);
    assert!(offset_of!(EventDescrV7, u) == 24);
    assert!(offset_of!(CollApiDescrV7, graph_captured) + 24 == 24 + COLL_API_GRAPH_CAPTURED);
    assert!(offset_of!(CollApiDescrV7, user_tag) + 24 == 72);
    assert!(offset_of!(P2pApiDescrV7, graph_captured) + 24 == 24 + P2P_API_GRAPH_CAPTURED);
    assert!(offset_of!(P2pApiDescrV7, user_tag) + 24 == 64);
    assert!(offset_of!(CollDescrV7, kernel_variant) + 24 == 112);
    assert!(offset_of!(CollDescrV7, is_sym_coll) + 24 == 120);
    assert!(offset_of!(CollDescrV7, user_tag) + 24 == 128);
    assert!(size_of::<CollDescrV7>() == 112);
    assert!(offset_of!(P2pDescrV7, user_tag) + 24 == 72);
    assert!(offset_of!(CeCollDescrV7, user_tag) + 24 == 112);
    assert!(size_of::<CeCollDescrV7>() == 96);
    assert!(offset_of!(KernelPhaseDescr, phase_id) + 24 == 25);
    assert!(offset_of!(KernelPhaseDescr, phase_name) + 24 == 32);
    assert!(offset_of!(KernelPhaseDescr, p_timer) + 24 == 40);
};

/// The symbols NCCL looks up in the library named by `NCCL_PROFILER_PLUGIN`, newest
/// first (`ncclProfiler_v7`, then `_v6`, `_v5`, ...); it takes the newest it knows.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v5: ProfilerV5 = exports::<5>();

/// See [`ncclProfiler_v5`].
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v6: ProfilerV5 = exports::<6>();

/// See [`ncclProfiler_v5`].
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v7: ProfilerV5 = exports::<7>();

/// The function table of version `V` (the three share its layout).
const fn exports<const V: u8>() -> ProfilerV5 {
    ProfilerV5 {
        name: c"zcta-prof".as_ptr(),
        init: init_abi::<V>,
        start_event: start_event::<V>,
        stop_event,
        record_event_state,
        finalize,
    }
}

/// `init` of the version NCCL loaded: notes which one before the common `init`.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn init_abi<const ABI: u8>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: Logger,
) -> c_int {
    plugin::set_abi(ABI);
    // SAFETY: the arguments are NCCL's, passed on unchanged.
    unsafe { init(ctx, comm_id, mask, comm_name, n_nodes, nranks, rank, log) }
}

/// The string at `addr`, the address of a non-empty `&str` that [`decode`] handed out
/// (its `as_ptr`, which is NCCL's own NUL-terminated pointer: an empty one may be our
/// literal and is never stored): NCCL's static literals (v7's kernelVariant comes from
/// a static table of the kernel names), valid while libnccl is loaded, which it is
/// while it calls us.
pub fn nccl_static_str(addr: u64) -> &'static str {
    if addr == 0 {
        return "";
    }
    // SAFETY: see above: a NUL-terminated static string of libnccl.
    unsafe { str_at(addr as *const c_char) }
}

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
    if crate::control::nccl_events_wanted(crate::state::active()) {
        plugin::activation_mask()
    } else {
        0
    }
}

/// Offsets in the union of `collApi.graphCaptured` and `p2pApi.graphCaptured` (`bool`;
/// 64 and 56 from the descriptor's start: docs/dev/nccl-profiler-v5.md).
const COLL_API_GRAPH_CAPTURED: usize = 64 - 24;
const P2P_API_GRAPH_CAPTURED: usize = 56 - 24;

/// Decodes a descriptor of version `abi` (5, 6 or 7).
///
/// # Safety
/// `d` points to a valid descriptor of that version (a v5/v6 [`EventDescr`] or a v7
/// [`EventDescrV7`]) whose strings are static.
unsafe fn decode<'a>(d: *const EventDescr, abi: u8) -> Start<'a> {
    // SAFETY: every version starts with the same 24-byte header.
    let ty = unsafe { (*d).ty };
    let u = d.cast::<u8>().wrapping_add(offset_of!(EventDescr, u));
    let v7 = abi >= 7;
    // SAFETY (all arms): the union member read matches the event type NCCL set, and
    // belongs to the version NCCL loaded: v5 and v6 unions are 88 bytes, v7's 112,
    // 8-aligned, as large as every member of that version.
    unsafe {
        match ty {
            // v7 appends userTag to both API members; graphCaptured stays put.
            t if t == plugin::bits::COLL_API => Start::CollApi {
                graph_captured: *u.add(COLL_API_GRAPH_CAPTURED) != 0,
            },
            t if t == plugin::bits::P2P_API => Start::P2pApi {
                graph_captured: *u.add(P2P_API_GRAPH_CAPTURED) != 0,
            },
            t if t == plugin::bits::COLL => {
                let c = &*u.cast::<CollDescr>();
                let (kernel_variant, is_sym_coll, user_tag) = if v7 {
                    let x = &*u.cast::<CollDescrV7>();
                    (
                        (!x.kernel_variant.is_null()).then(|| str_at(x.kernel_variant)),
                        Some(x.is_sym_coll != 0),
                        x.user_tag,
                    )
                } else {
                    (None, None, 0)
                };
                Start::Coll {
                    seq: c.seq_number,
                    func: str_at(c.func),
                    count: c.count as u64,
                    dtype: str_at(c.datatype),
                    n_channels: c.n_channels,
                    n_warps: c.n_warps,
                    algo: str_at(c.algo),
                    proto: str_at(c.proto),
                    kernel_variant,
                    is_sym_coll,
                    user_tag,
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
                    user_tag: if v7 { (*u.cast::<P2pDescrV7>()).user_tag } else { 0 },
                }
            }
            t if t == plugin::bits::CE_COLL && abi >= 6 => {
                let c = &*u.cast::<CeCollDescr>();
                Start::CeColl {
                    seq: c.seq_number,
                    func: str_at(c.func),
                    count: c.count as u64,
                    dtype: str_at(c.datatype),
                    root: c.root,
                    sync_strategy: str_at(c.sync_strategy),
                    user_tag: if v7 {
                        (*u.cast::<CeCollDescrV7>()).user_tag
                    } else {
                        0
                    },
                }
            }
            t if t == plugin::bits::CE_SYNC && abi >= 6 => Start::CeSync,
            t if t == plugin::bits::CE_BATCH && abi >= 6 => {
                let b = &*u.cast::<CeBatchDescr>();
                Start::CeBatch {
                    num_ops: b.num_ops,
                    total_bytes: b.total_bytes as u64,
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

unsafe extern "C" fn start_event<const ABI: u8>(
    ctx: *mut c_void,
    handle: *mut *mut c_void,
    d: *const c_void,
) -> c_int {
    let h = if d.is_null() {
        0
    } else {
        let d = d.cast::<EventDescr>();
        // SAFETY: NCCL passes a valid descriptor of the version it loaded (this
        // function's ABI) for the duration of the call.
        let ev = unsafe { decode(d, ABI) };
        // SAFETY: as above; the header is the same in every version.
        let (parent, rank) = unsafe { ((*d).parent as usize, (*d).rank) };
        protect(|| plugin::start(ctx as usize, parent, rank, ev)).unwrap_or(0)
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
