//! NCCL's own view: the shim is also NCCL's profiler plugin (API v5, v6 and v7: the
//! descriptors are decoded per version by `ffi::plugin` into one [`Start`]).
//!
//! NCCL reports each operation's algorithm, protocol and channels (Coll/P2p events)
//! and, on proxy-driven transports, what its proxy thread did (ProxyOp/ProxyStep/
//! ProxyCtrl). Events are joined to our `ops` rows through their parents: the
//! CollApi/P2pApi event starts inside the user's interposed call, where the op's id
//! is known ([`hooks::current_op`]); Coll/P2p events name that event as parent, and
//! proxy events name the Coll/P2p event.
//!
//! Callbacks come from the application thread, NCCL's proxy thread and CUDA
//! host-callback threads, so nothing here blocks: event state lives in a fixed ring
//! of slots made of atomics. Each start takes the next slot; a handle carries the
//! slot's generation, so a handle whose slot has since been reused is recognised and
//! its event dropped (and counted) instead of being misattributed. A slot is written
//! or read whole only under its try-lock (a BUSY bit in the generation word, taken by
//! compare-and-swap, never waited for): a start skips a busy slot, a late state or
//! stop on a reused slot fails its claim. NCCL keeps handles after stopping them
//! (children arrive later) and never stops some (ProxyOps off the network transport):
//! the ring needs no freeing, so neither leaks.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering};

use crate::ffi::sys::now_ns;
use zcta::nccl::{self, CE_SYNC_STRATEGIES, PLUGIN_ALGOS, PLUGIN_FUNCS, PLUGIN_PROTOS, name_code};
use zcta::record::{
    NcclCommRecord, NcclOpEvent, NcclOpRecord, PlanEngine, PluginEvent, ProxyKind, ProxyRecord, SmallStr,
};

use crate::{ffi, hooks, state};

/// Event-type bits (v5; CE bits since v6, KernelPhase since v7).
pub mod bits {
    pub const COLL: u64 = 1 << 1;
    pub const P2P: u64 = 1 << 2;
    pub const PROXY_OP: u64 = 1 << 3;
    pub const PROXY_STEP: u64 = 1 << 4;
    pub const PROXY_CTRL: u64 = 1 << 5;
    pub const KERNEL_CH: u64 = 1 << 6;
    pub const COLL_API: u64 = 1 << 9;
    pub const P2P_API: u64 = 1 << 10;
    pub const KERNEL_LAUNCH: u64 = 1 << 11;
    pub const CE_COLL: u64 = 1 << 12;
    pub const CE_SYNC: u64 = 1 << 13;
    pub const CE_BATCH: u64 = 1 << 14;
    pub const KERNEL_PHASE: u64 = 1 << 15;
}

/// The profiler API version NCCL loaded us as (0: not loaded yet), set by the
/// version's `init` before the common one.
static ABI: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

pub fn set_abi(abi: u8) {
    ABI.store(abi, Ordering::Relaxed);
}

fn abi() -> u8 {
    ABI.load(Ordering::Relaxed)
}

/// The events we ask NCCL for (KernelCh only on request: enabling it makes NCCL start
/// a proxy thread that polls GPU timers, even on NVLink; the copy-engine events only
/// from an NCCL that loaded us as v6 or later, which knows them). `ZCTA_NCCL_MASK` (a
/// developers' setting, to measure what NCCL's events cost) replaces it; one with
/// KernelPhase gets KernelCh too, as NCCL 2.31 itself enforces at init.
pub fn activation_mask() -> i32 {
    // Cached without a lock (a fork while another thread held one would leave the
    // child waiting forever); computing it twice gives the same value.
    const UNSET: i32 = i32::MIN;
    static MASK: AtomicI32 = AtomicI32::new(UNSET);
    let m = match MASK.load(Ordering::Relaxed) {
        UNSET => {
            let m = match mask_override() {
                Some(m) if m as u64 & bits::KERNEL_PHASE != 0 => (m | bits::KERNEL_CH as i32) & i32::MAX,
                Some(m) => m & i32::MAX,
                None => default_mask() | i32::MIN,
            };
            MASK.store(m, Ordering::Relaxed);
            m
        }
        m => m,
    };
    // The sign bit marks our default mask, which grows with the version.
    if m < 0 {
        let ce = if abi() >= 6 {
            bits::CE_COLL | bits::CE_SYNC | bits::CE_BATCH
        } else {
            0
        };
        (m & i32::MAX) | ce as i32
    } else {
        m
    }
}

/// `ZCTA_NCCL_MASK`: an event mask in decimal or 0x-hex; None when unset, empty or
/// invalid. Quiet: this also runs in the constructor of processes that never record;
/// a bad value is reported once, at activation (`Config::from_env`).
pub fn mask_override() -> Option<i32> {
    let v = std::env::var("ZCTA_NCCL_MASK").ok()?;
    zcta::config::parse_mask(&v).ok()
}

fn default_mask() -> i32 {
    let mut m = bits::COLL
        | bits::P2P
        | bits::PROXY_OP
        | bits::PROXY_STEP
        | bits::PROXY_CTRL
        | bits::COLL_API
        | bits::P2P_API
        | bits::KERNEL_LAUNCH;
    if std::env::var("ZCTA_NCCL_KERNEL_CH").is_ok_and(|v| v.trim() == "1") {
        m |= bits::KERNEL_CH;
    }
    m as i32
}

/// Event start, decoded from the v5 descriptor by `ffi::plugin`.
#[derive(Clone, Copy, Debug)]
pub enum Start<'a> {
    /// Events we do not track (GroupApi, Group, NetPlugin...).
    Untracked,
    /// NCCL starts launching a plan's kernel (on the launching thread, inside the call).
    KernelLaunch,
    /// `graph_captured`: the call was made on a stream capturing a CUDA graph (v7
    /// adds a userTag after it, which the Coll/P2p/CeColl children carry too).
    CollApi {
        graph_captured: bool,
    },
    P2pApi {
        graph_captured: bool,
    },
    Coll {
        seq: u64,
        func: &'a str,
        count: u64,
        dtype: &'a str,
        n_channels: u8,
        n_warps: u8,
        algo: &'a str,
        proto: &'a str,
        /// v7 only (`None` before).
        kernel_variant: Option<&'a str>,
        is_sym_coll: Option<bool>,
        user_tag: u64,
    },
    P2p {
        func: &'a str,
        dtype: &'a str,
        count: u64,
        peer: i32,
        n_channels: u8,
        user_tag: u64,
    },
    /// v6+: a collective NCCL runs on the copy engine; its children CeSync and
    /// CeBatch are counted into it.
    CeColl {
        seq: u64,
        func: &'a str,
        count: u64,
        dtype: &'a str,
        root: i32,
        sync_strategy: &'a str,
        user_tag: u64,
    },
    CeSync,
    CeBatch {
        num_ops: i32,
        total_bytes: u64,
    },
    ProxyOp {
        pid: i32,
        channel: u8,
        peer: i32,
        n_steps: i32,
        chunk_size: i32,
        is_send: bool,
    },
    ProxyStep {
        step: i32,
    },
    ProxyCtrl,
    KernelCh {
        channel: u8,
        timer: u64,
    },
}

// Slot kinds.
const K_API: u64 = 1;
const K_COLL: u64 = 2;
const K_P2P: u64 = 3;
const K_PROXY_OP: u64 = 4;
const K_PROXY_STEP: u64 = 5;
const K_PROXY_CTRL: u64 = 6;
const K_KERNEL_CH: u64 = 7;
const K_CE_COLL: u64 = 8;

// Payload indices (meaning depends on the kind).
const P_SEQ: usize = 0; // Coll seqNumber | ProxyOp pid | ProxyStep step | ProxyCtrl appended
const P_FUNC: usize = 1; // func code | ProxyOp channel
const P_COUNT: usize = 2; // count | ProxyOp n_steps
const P_DTYPE: usize = 3; // dtype (i32 + 1, 0 = unknown) | ProxyOp chunk size
const P_CHAN: usize = 4; // n_channels | ProxyOp is_send
const P_WARPS: usize = 5; // n_warps
const P_ALGO: usize = 6; // algo code | proto code << 8 | ProxyStep trans size
const P_PEER: usize = 7; // peer (i32 + 1, 0 = none)
const NP: usize = 8;

// Timestamp indices: ProxyOp 19; ProxyStep 8, 20, 9, 10, 11, 12; ProxyCtrl first/last.
const T_IN_PROGRESS: usize = 0;
const T_SEND_GPU: usize = 1;
const T_SEND_PEER: usize = 2;
const T_SEND_WAIT: usize = 3;
const T_RECV_WAIT: usize = 4;
const T_RECV_FLUSH: usize = 5;
const T_RECV_GPU: usize = 6;
const NT: usize = 7;
// Coll/P2p/CeColl slots have no states: their timestamp words hold v6/v7 fields.
const T_USER_TAG: usize = 0; // v7 userTag + 1 (0: before v7)
const T_VARIANT: usize = 1; // Coll: kernelVariant pointer (a static string in libnccl)
const T_SYM: usize = 2; // Coll: isSymColl + 1 (0: before v7)
const T_CE_BATCHES: usize = 3; // CeColl: CeBatch children
const T_CE_OPS: usize = 4; // CeColl: their numOps, summed
const T_CE_BYTES: usize = 5; // CeColl: their totalBytes, summed
const T_CE_SYNCS: usize = 6; // CeColl: CeSync children

const SLOTS: usize = 1 << 14;
const CTXS: usize = 1 << 10;

struct Slot {
    /// Generation of the event in the slot (0: never used). Written last at start.
    gen_: AtomicU64,
    kind: AtomicU64,
    op_id: AtomicU64,
    ctx: AtomicU64,
    rank: AtomicI32,
    start_ns: AtomicI64,
    p: [AtomicU64; NP],
    t: [AtomicI64; NT],
    ctrl_first: AtomicI32,
    ctrl_last: AtomicI32,
}

impl Slot {
    fn new() -> Self {
        Self {
            gen_: AtomicU64::new(0),
            kind: AtomicU64::new(0),
            op_id: AtomicU64::new(0),
            ctx: AtomicU64::new(0),
            rank: AtomicI32::new(0),
            start_ns: AtomicI64::new(0),
            p: std::array::from_fn(|_| AtomicU64::new(0)),
            t: std::array::from_fn(|_| AtomicI64::new(0)),
            ctrl_first: AtomicI32::new(0),
            ctrl_last: AtomicI32::new(0),
        }
    }
}

struct Ring {
    slots: Box<[Slot]>,
    next: AtomicU64,
    ctx_hash: Box<[AtomicU64]>,
    ctx_rank: Box<[AtomicI32]>,
    ctx_gen: Box<[AtomicU64]>,
    next_ctx: AtomicU64,
}

static RING: OnceLock<Ring> = OnceLock::new();

fn ring() -> &'static Ring {
    RING.get_or_init(|| Ring {
        slots: (0..SLOTS).map(|_| Slot::new()).collect(),
        next: AtomicU64::new(0),
        ctx_hash: (0..CTXS).map(|_| AtomicU64::new(0)).collect(),
        ctx_rank: (0..CTXS).map(|_| AtomicI32::new(0)).collect(),
        ctx_gen: (0..CTXS).map(|_| AtomicU64::new(0)).collect(),
        next_ctx: AtomicU64::new(0),
    })
}

/// A handle is `generation << 16 | (slot + 1)`; 0 means "no event".
fn encode(gen_: u64, idx: usize) -> usize {
    ((gen_ << 16) | (idx as u64 + 1)) as usize
}

/// Set in a slot's generation word while one thread writes or reads it whole.
const BUSY: u64 = 1 << 63;

/// The slot and generation a handle names (not checked against the slot).
fn decode(h: usize) -> Option<(&'static Slot, u64)> {
    let h = h as u64;
    let idx = (h & 0xffff).checked_sub(1)? as usize;
    Some((ring().slots.get(idx)?, h >> 16))
}

/// Takes the slot's try-lock if it still holds generation `g`.
fn claim(s: &Slot, g: u64) -> bool {
    g != 0
        && s.gen_
            .compare_exchange(g, g | BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
}

fn release(s: &Slot, g: u64) {
    s.gen_.store(g, Ordering::Release);
}

/// The slot of a handle, if it still holds that event (test helper).
#[cfg(test)]
fn lookup(h: usize) -> Option<&'static Slot> {
    let (s, g) = decode(h)?;
    (s.gen_.load(Ordering::Acquire) & !BUSY == g).then_some(s)
}

fn lost() {
    state::note_lost();
}

/// `init`: a communicator. Returns the context handle.
pub fn init(comm_hash: u64, comm_name: Option<&str>, n_nodes: i32, nranks: i32, rank: i32) -> usize {
    let r = ring();
    let n = r.next_ctx.fetch_add(1, Ordering::Relaxed);
    let idx = (n % CTXS as u64) as usize;
    let gen_ = n / CTXS as u64 + 1;
    // A context whose entry was reused (more than CTXS communicators since) reads as
    // unknown: generation-tagged like event handles.
    r.ctx_gen[idx].store(0, Ordering::Release);
    r.ctx_hash[idx].store(comm_hash, Ordering::Relaxed);
    r.ctx_rank[idx].store(rank, Ordering::Relaxed);
    r.ctx_gen[idx].store(gen_, Ordering::Release);
    state::note_plugin_comm();
    state::emit_plugin(PluginEvent::NcclComm(NcclCommRecord {
        comm_hash,
        comm_id: hooks::current_init(),
        comm_name: comm_name.map(SmallStr::new),
        n_nodes,
        nranks,
        rank,
        init_ns: now_ns(),
        tid: ffi::sys::gettid(),
        abi: abi(),
    }));
    ((gen_ << 16) | (idx as u64 + 1)) as usize
}

fn ctx_info(ctx: usize) -> (Option<u64>, Option<i32>) {
    let ctx = ctx as u64;
    let (Some(i), g) = ((ctx & 0xffff).checked_sub(1).map(|i| i as usize), ctx >> 16) else {
        return (None, None);
    };
    let r = ring();
    if i >= CTXS || g == 0 || r.ctx_gen[i].load(Ordering::Acquire) != g {
        return (None, None);
    }
    let v = (
        r.ctx_hash[i].load(Ordering::Relaxed),
        r.ctx_rank[i].load(Ordering::Relaxed),
    );
    std::sync::atomic::fence(Ordering::Acquire);
    if r.ctx_gen[i].load(Ordering::Relaxed) != g {
        return (None, None);
    }
    (Some(v.0), Some(v.1))
}

/// (op_id, context) of a parent event, if its slot still holds it. Both are written
/// once, before the slot is published, so a seqlock-style read suffices here.
fn parent_of(parent: usize) -> (u64, u64) {
    let Some((s, g)) = decode(parent) else {
        return (0, 0);
    };
    if g == 0 || s.gen_.load(Ordering::Acquire) & !BUSY != g {
        return (0, 0);
    }
    let v = (s.op_id.load(Ordering::Relaxed), s.ctx.load(Ordering::Relaxed));
    std::sync::atomic::fence(Ordering::Acquire);
    if s.gen_.load(Ordering::Relaxed) & !BUSY != g {
        return (0, 0);
    }
    v
}

/// `startEvent`. Returns the handle to give NCCL (0: not tracked).
pub fn start(ctx: usize, parent: usize, rank: i32, ev: Start<'_>) -> usize {
    if !crate::state::recording() {
        return 0; // paused (zcta_set_recording(0)): NCCL skips the event's children
    }
    let (kind, op_id, ctx) = match ev {
        Start::Untracked => return 0,
        Start::KernelLaunch => {
            hooks::note_kernel_launch();
            return 0;
        }
        Start::CollApi { graph_captured } | Start::P2pApi { graph_captured } => {
            hooks::note_api_event(graph_captured);
            (K_API, hooks::current_op().unwrap_or(0), ctx as u64)
        }
        Start::Coll { is_sym_coll, .. } => {
            hooks::note_nccl_plan(if is_sym_coll == Some(true) {
                PlanEngine::SymmetricKernel
            } else {
                PlanEngine::SmKernel
            });
            (K_COLL, parent_of(parent).0, ctx as u64)
        }
        Start::P2p { .. } => {
            hooks::note_nccl_plan(PlanEngine::SmKernel);
            (K_P2P, parent_of(parent).0, ctx as u64)
        }
        Start::CeColl { .. } => {
            // Its parent is the CollApi event (NCCL 2.29's args->collApiEventHandle).
            hooks::note_nccl_plan(PlanEngine::CopyEngine);
            (K_CE_COLL, parent_of(parent).0, ctx as u64)
        }
        Start::CeSync => {
            add_to_ce_coll(parent, &[(T_CE_SYNCS, 1)]);
            return 0;
        }
        Start::CeBatch { num_ops, total_bytes } => {
            add_to_ce_coll(
                parent,
                &[
                    (T_CE_BATCHES, 1),
                    (T_CE_OPS, i64::from(num_ops.max(0))),
                    (T_CE_BYTES, total_bytes as i64),
                ],
            );
            return 0;
        }
        Start::ProxyOp { pid, .. } => {
            // PXN: the op belongs to another process; its parent handle and context
            // are that process's, not ours: neither is looked up.
            if pid == ffi::sys::pid() as i32 {
                (K_PROXY_OP, parent_of(parent).0, ctx as u64)
            } else {
                (K_PROXY_OP, 0, 0)
            }
        }
        Start::ProxyStep { .. } => {
            // A step of a foreign (PXN) ProxyOp: its parent slot has no context.
            let (op_id, pctx) = parent_of(parent);
            (K_PROXY_STEP, op_id, if pctx == 0 { 0 } else { ctx as u64 })
        }
        Start::ProxyCtrl => (K_PROXY_CTRL, 0, ctx as u64),
        Start::KernelCh { .. } => (K_KERNEL_CH, parent_of(parent).0, ctx as u64),
    };
    if kind == K_PROXY_OP || kind == K_PROXY_STEP {
        // On the proxy thread: copies it issues are NCCL's.
        crate::gpu::note_proxy_thread();
    }
    let r = ring();
    // Take the next free slot; a slot busy in another thread is skipped, not waited for.
    let mut claimed = None;
    for _ in 0..4 {
        let n = r.next.fetch_add(1, Ordering::Relaxed);
        let idx = (n % SLOTS as u64) as usize;
        let s = &r.slots[idx];
        let cur = s.gen_.load(Ordering::Relaxed);
        if cur & BUSY == 0
            && s.gen_
                .compare_exchange(cur, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            // Readers that saw the old generation must see BUSY before our writes.
            std::sync::atomic::fence(Ordering::Release);
            claimed = Some((idx, n / SLOTS as u64 + 1));
            break;
        }
    }
    let Some((idx, gen_)) = claimed else {
        lost();
        return 0;
    };
    let s = &r.slots[idx];
    s.kind.store(kind, Ordering::Relaxed);
    s.op_id.store(op_id, Ordering::Relaxed);
    s.ctx.store(ctx, Ordering::Relaxed);
    s.rank.store(rank, Ordering::Relaxed);
    s.start_ns.store(now_ns(), Ordering::Relaxed);
    // API events only link children to the op: their payload is never read.
    if kind != K_API {
        for p in &s.p {
            p.store(0, Ordering::Relaxed);
        }
        for t in &s.t {
            t.store(0, Ordering::Relaxed);
        }
        s.ctrl_first.store(0, Ordering::Relaxed);
        s.ctrl_last.store(0, Ordering::Relaxed);
    }
    let set = |i: usize, v: u64| s.p[i].store(v, Ordering::Relaxed);
    match ev {
        Start::Coll {
            seq,
            func,
            count,
            dtype,
            n_channels,
            n_warps,
            algo,
            proto,
            kernel_variant,
            is_sym_coll,
            user_tag,
        } => {
            set(P_SEQ, seq);
            set(P_FUNC, u64::from(name_code(&PLUGIN_FUNCS, func)));
            set(P_COUNT, count);
            set(P_DTYPE, dtype_code(dtype));
            set(P_CHAN, u64::from(n_channels));
            set(P_WARPS, u64::from(n_warps));
            set(
                P_ALGO,
                u64::from(name_code(&PLUGIN_ALGOS, algo)) | u64::from(name_code(&PLUGIN_PROTOS, proto)) << 8,
            );
            if let Some(sym) = is_sym_coll {
                set_t(s, T_USER_TAG, user_tag.wrapping_add(1));
                set_t(s, T_SYM, u64::from(sym) + 1);
                // Only NCCL's own (NUL-terminated) string: an empty one may be ours.
                let variant = kernel_variant.filter(|v| !v.is_empty());
                set_t(s, T_VARIANT, variant.map_or(0, |v| v.as_ptr() as u64));
            }
        }
        Start::P2p {
            func,
            dtype,
            count,
            peer,
            n_channels,
            user_tag,
        } => {
            set(P_FUNC, u64::from(name_code(&PLUGIN_FUNCS, func)));
            set(P_COUNT, count);
            set(P_DTYPE, dtype_code(dtype));
            set(P_CHAN, u64::from(n_channels));
            set(P_PEER, (peer as u32 as u64) + 1);
            if abi() >= 7 {
                set_t(s, T_USER_TAG, user_tag.wrapping_add(1));
            }
        }
        Start::CeColl {
            seq,
            func,
            count,
            dtype,
            root,
            sync_strategy,
            user_tag,
        } => {
            set(P_SEQ, seq);
            set(P_FUNC, u64::from(name_code(&PLUGIN_FUNCS, func)));
            set(P_COUNT, count);
            set(P_DTYPE, dtype_code(dtype));
            set(P_ALGO, u64::from(name_code(&CE_SYNC_STRATEGIES, sync_strategy)));
            set(P_PEER, (root as u32 as u64) + 1);
            if abi() >= 7 {
                set_t(s, T_USER_TAG, user_tag.wrapping_add(1));
            }
        }
        Start::ProxyOp {
            pid,
            channel,
            peer,
            n_steps,
            chunk_size,
            is_send,
        } => {
            set(P_SEQ, pid as u32 as u64);
            set(P_FUNC, u64::from(channel));
            set(P_COUNT, n_steps as u32 as u64);
            set(P_DTYPE, chunk_size as u32 as u64);
            set(P_CHAN, u64::from(is_send));
            set(P_PEER, (peer as u32 as u64) + 1);
        }
        Start::ProxyStep { step } => set(P_SEQ, step as u32 as u64),
        Start::KernelCh { channel, timer } => {
            set(P_FUNC, u64::from(channel));
            set(P_SEQ, timer);
        }
        _ => {}
    }
    release(s, gen_);
    encode(gen_, idx)
}

fn set_t(s: &Slot, i: usize, v: u64) {
    s.t[i].store(v as i64, Ordering::Relaxed);
}

/// Counts a CeSync/CeBatch child into its CeColl parent's slot (NCCL starts and
/// stops the children inside the parent, on the same thread).
fn add_to_ce_coll(parent: usize, adds: &[(usize, i64)]) {
    let Some((s, g)) = decode(parent) else { return };
    if !claim(s, g) {
        return;
    }
    if s.kind.load(Ordering::Relaxed) == K_CE_COLL {
        for &(i, v) in adds {
            s.t[i].fetch_add(v, Ordering::Relaxed);
        }
    }
    release(s, g);
}

fn dtype_code(name: &str) -> u64 {
    nccl::dtype_from_plugin_name(name).map_or(0, |d| d as u64 + 1)
}

/// `recordEventState`. `arg`: transSize (states 9, 11) or appendedProxyOps (18).
pub fn record_state(h: usize, state: i32, arg: u64) {
    // A state for an event whose slot is gone or busy is dropped; the event itself is
    // counted as lost once, at its stop.
    let Some((s, g)) = decode(h) else { return };
    if !claim(s, g) {
        return;
    }
    record_claimed(s, state, arg);
    release(s, g);
}

fn record_claimed(s: &Slot, state: i32, arg: u64) {
    let now = now_ns();
    let first = |i: usize| {
        let _ = s.t[i].compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    };
    match state {
        19 => first(T_IN_PROGRESS),
        8 => first(T_SEND_GPU),
        20 => first(T_SEND_PEER),
        9 => {
            first(T_SEND_WAIT);
            s.p[P_ALGO].store(arg, Ordering::Relaxed);
        }
        10 => first(T_RECV_WAIT),
        11 => {
            first(T_RECV_FLUSH);
            s.p[P_ALGO].store(arg, Ordering::Relaxed);
        }
        12 => first(T_RECV_GPU),
        13..=18 => {
            if s.ctrl_first
                .compare_exchange(0, state, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                s.t[T_IN_PROGRESS].store(now, Ordering::Relaxed);
            }
            s.ctrl_last.store(state, Ordering::Relaxed);
            s.t[T_SEND_GPU].store(now, Ordering::Relaxed);
            if state == 18 {
                s.p[P_SEQ].store(arg, Ordering::Relaxed);
            }
        }
        22 => {
            // KernelChStop: GPU stop timer.
            s.p[P_COUNT].store(arg, Ordering::Relaxed);
        }
        _ => {}
    }
}

fn ts(v: i64) -> Option<i64> {
    (v != 0).then_some(v)
}

/// `stopEvent`: emits the finished event's row.
pub fn stop(h: usize) {
    let Some((s, g)) = decode(h) else { return };
    if !claim(s, g) {
        lost();
        return;
    }
    let ev = read_claimed(s);
    release(s, g);
    if let Some(ev) = ev {
        state::emit_plugin(ev);
    }
}

/// The row of a stopped event, read while its slot is claimed.
fn read_claimed(s: &Slot) -> Option<PluginEvent> {
    let stop_ns = now_ns();
    let p = |i: usize| s.p[i].load(Ordering::Relaxed);
    let t = |i: usize| ts(s.t[i].load(Ordering::Relaxed));
    let op_id = Some(s.op_id.load(Ordering::Relaxed)).filter(|&v| v != 0);
    let (comm_hash, ctx_rank) = ctx_info(s.ctx.load(Ordering::Relaxed) as usize);
    let kind = s.kind.load(Ordering::Relaxed);
    // The context's rank; else the descriptor's, which NCCL leaves unset (0) for
    // ProxyCtrl and KernelCh: NULL for those.
    let rank = ctx_rank.or_else(|| {
        matches!(kind, K_COLL | K_P2P | K_CE_COLL | K_PROXY_OP | K_PROXY_STEP)
            .then(|| s.rank.load(Ordering::Relaxed))
    });
    let tv = |i: usize| s.t[i].load(Ordering::Relaxed) as u64;
    let start_ns = s.start_ns.load(Ordering::Relaxed);
    let ev = match kind {
        K_COLL | K_P2P => {
            let coll = kind == K_COLL;
            let algo = p(P_ALGO);
            let sym = tv(T_SYM).checked_sub(1).map(|v| v != 0);
            let variant = match tv(T_VARIANT) {
                0 => None,
                // The kernelVariant pointer NCCL passed at start.
                v => Some(SmallStr::new(ffi::plugin::nccl_static_str(v))),
            };
            PluginEvent::NcclOp(NcclOpRecord {
                op_id,
                comm_hash,
                rank,
                event: if coll { NcclOpEvent::Coll } else { NcclOpEvent::P2p },
                func: p(P_FUNC) as u8,
                seq_number: coll.then(|| p(P_SEQ)),
                algo: coll.then_some((algo & 0xff) as u8).filter(|&a| a != u8::MAX),
                proto: coll
                    .then_some(((algo >> 8) & 0xff) as u8)
                    .filter(|&a| a != u8::MAX),
                n_channels: p(P_CHAN) as i32,
                n_warps: coll.then(|| p(P_WARPS) as i32),
                peer: p(P_PEER).checked_sub(1).map(|v| v as u32 as i32),
                count: p(P_COUNT),
                dtype: p(P_DTYPE).checked_sub(1).map(|v| v as i32),
                start_ns,
                stop_ns: Some(stop_ns),
                tid: ffi::sys::gettid(),
                user_tag: tv(T_USER_TAG).checked_sub(1),
                kernel_variant: variant,
                is_sym_coll: sym,
                sync_strategy: None,
                ce_batches: None,
                ce_batch_ops: None,
                ce_batch_bytes: None,
                ce_syncs: None,
            })
        }
        K_CE_COLL => PluginEvent::NcclOp(NcclOpRecord {
            op_id,
            comm_hash,
            rank,
            event: NcclOpEvent::CeColl,
            func: p(P_FUNC) as u8,
            seq_number: Some(p(P_SEQ)),
            algo: None,
            proto: None,
            n_channels: 0,
            n_warps: None,
            peer: None,
            count: p(P_COUNT),
            dtype: p(P_DTYPE).checked_sub(1).map(|v| v as i32),
            start_ns,
            stop_ns: Some(stop_ns),
            tid: ffi::sys::gettid(),
            user_tag: tv(T_USER_TAG).checked_sub(1),
            kernel_variant: None,
            is_sym_coll: None,
            sync_strategy: Some(p(P_ALGO) as u8).filter(|&v| v != u8::MAX),
            ce_batches: Some(tv(T_CE_BATCHES) as u32),
            ce_batch_ops: Some(tv(T_CE_OPS)),
            ce_batch_bytes: Some(tv(T_CE_BYTES)),
            ce_syncs: Some(tv(T_CE_SYNCS) as u32),
        }),
        K_PROXY_OP | K_PROXY_STEP | K_PROXY_CTRL | K_KERNEL_CH => {
            let proxy_kind = match kind {
                K_PROXY_OP => ProxyKind::Op,
                K_PROXY_STEP => ProxyKind::Step,
                K_KERNEL_CH => ProxyKind::KernelCh,
                _ => ProxyKind::Ctrl,
            };
            let mut r = ProxyRecord::new(
                proxy_kind,
                op_id,
                comm_hash,
                rank,
                start_ns,
                Some(stop_ns),
                ffi::sys::gettid(),
            );
            match proxy_kind {
                ProxyKind::Op => {
                    r.pid = Some(p(P_SEQ) as u32 as i32);
                    r.channel = Some(p(P_FUNC) as i32);
                    r.n_steps = Some(p(P_COUNT) as u32 as i32);
                    r.chunk_size = Some(p(P_DTYPE) as u32 as i32);
                    r.is_send = Some(p(P_CHAN) != 0);
                    r.peer = p(P_PEER).checked_sub(1).map(|v| v as u32 as i32);
                    r.in_progress_ns = t(T_IN_PROGRESS);
                }
                ProxyKind::Step => {
                    r.step = Some(p(P_SEQ) as u32 as i32);
                    r.send_gpu_wait_ns = t(T_SEND_GPU);
                    r.send_peer_wait_ns = t(T_SEND_PEER);
                    r.send_wait_ns = t(T_SEND_WAIT);
                    r.recv_wait_ns = t(T_RECV_WAIT);
                    r.recv_flush_wait_ns = t(T_RECV_FLUSH);
                    r.recv_gpu_wait_ns = t(T_RECV_GPU);
                    r.trans_size = Some(p(P_ALGO)).filter(|&v| v != 0);
                }
                ProxyKind::KernelCh => {
                    r.channel = Some(p(P_FUNC) as i32);
                    r.gpu_timer_start = Some(p(P_SEQ)).filter(|&v| v != 0);
                    r.gpu_timer_stop = Some(p(P_COUNT)).filter(|&v| v != 0);
                }
                ProxyKind::Ctrl => {
                    let first = s.ctrl_first.load(Ordering::Relaxed);
                    if first != 0 {
                        r.ctrl_first_state = Some(first);
                        r.ctrl_first_ns = t(T_IN_PROGRESS);
                        r.ctrl_last_state = Some(s.ctrl_last.load(Ordering::Relaxed));
                        r.ctrl_last_ns = t(T_SEND_GPU);
                    }
                    if s.ctrl_last.load(Ordering::Relaxed) == 18 {
                        r.appended_ops = Some(p(P_SEQ) as u32 as i32);
                    }
                }
            }
            PluginEvent::Proxy(r)
        }
        _ => return None, // API events: links only, no rows
    };
    Some(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_detect_reuse() {
        let h = start(0, 0, 0, Start::ProxyStep { step: 3 });
        assert!(lookup(h).is_some());
        for _ in 0..SLOTS {
            start(0, 0, 0, Start::ProxyCtrl);
        }
        assert!(
            lookup(h).is_none(),
            "slot reused: the old handle must not resolve"
        );
        assert!(lookup(0).is_none());
    }
}
