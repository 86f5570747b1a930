//! The exported NCCL API: one line per function. Each export resolves the real
//! function ([`RealFn`]), and hands a closure that calls it with the arguments
//! unchanged to the hook that records it. Adding a function: one more line.
//!
//! Signatures are NCCL 2.28's (`nccl.h`); enums cross the ABI as `c_int`.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{CStr, c_int, c_void};

use zcta::hash;
use zcta::nccl::{CallKind, OpKind};
use zcta::record::SmallStr;

use super::real::{self, RealFn};
use crate::hooks::{self, ConfigView, IdRule, InitArgs, OpArgs, RegArgs};

type Comm = *mut c_void;
type Stream = *mut c_void;

/// `ncclUniqueId`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    pub internal: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<NcclUniqueId>() == 128);

const fn cstr(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("not NUL-terminated"),
    }
}

macro_rules! nccl_export {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* ) => |$real:ident| $hook:expr; )*) => {$(
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            static REAL: RealFn = RealFn::new(
                cstr(concat!("p", stringify!($name), "\0")),
                cstr(concat!(stringify!($name), "\0")),
            );
            type F = unsafe extern "C" fn($($ty),*) -> c_int;
            // Resolved before the hook runs, so that the hook's call of it is a direct
            // call in this function's own code.
            let Some(p) = REAL.get() else {
                return real::missing(&REAL);
            };
            // SAFETY: REAL is the real NCCL function of the same name, whose C
            // signature is F.
            let f = unsafe { std::mem::transmute::<*mut c_void, F>(p) };
            // SAFETY: the caller's arguments, passed unchanged.
            let $real = move || -> c_int { unsafe { f($($arg),*) } };
            $hook
        }
    )*};
}

fn args(
    comm: Comm,
    count: usize,
    dtype: c_int,
    send: *const c_void,
    recv: *const c_void,
    stream: Stream,
) -> OpArgs {
    OpArgs {
        comm: comm as usize,
        count: count as u64,
        dtype,
        sendbuff: send as u64,
        recvbuff: recv as u64,
        stream: stream as u64,
        root: None,
        peer: None,
        redop: None,
    }
}

impl OpArgs {
    fn root(mut self, r: c_int) -> Self {
        self.root = Some(r);
        self
    }
    fn peer(mut self, p: c_int) -> Self {
        self.peer = Some(p);
        self
    }
    fn redop(mut self, o: c_int) -> Self {
        self.redop = Some(o);
        self
    }
}

const NULL: *const c_void = std::ptr::null();

nccl_export! {
    fn ncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::AllReduce, &args(comm, count, datatype, sendbuff, recvbuff, stream).redop(op), real);
    fn ncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::Broadcast, &args(comm, count, datatype, sendbuff, recvbuff, stream).root(root), real);
    fn ncclBcast(buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::Bcast, &args(comm, count, datatype, buff, buff, stream).root(root), real);
    fn ncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::Reduce, &args(comm, count, datatype, sendbuff, recvbuff, stream).redop(op).root(root), real);
    fn ncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::AllGather, &args(comm, sendcount, datatype, sendbuff, recvbuff, stream), real);
    fn ncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::ReduceScatter, &args(comm, recvcount, datatype, sendbuff, recvbuff, stream).redop(op), real);
    fn ncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::AlltoAll, &args(comm, count, datatype, sendbuff, recvbuff, stream), real);
    fn ncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::Gather, &args(comm, count, datatype, sendbuff, recvbuff, stream).root(root), real);
    fn ncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::Scatter, &args(comm, count, datatype, sendbuff, recvbuff, stream).root(root), real);
    // NCCL 2.31+: each collective with a trailing per-call `ncclCollConfig_t` (CTA
    // policy, algorithm, profiler tag), passed on untouched; recorded as the plain one.
    fn ncclAllReduceConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: Comm, stream: Stream, config: *const c_void) => |real| hooks::op(OpKind::AllReduce, &args(comm, count, datatype, sendbuff, recvbuff, stream).redop(op), real);
    fn ncclBroadcastConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: Comm, stream: Stream, config: *const c_void) => |real| hooks::op(OpKind::Broadcast, &args(comm, count, datatype, sendbuff, recvbuff, stream).root(root), real);
    fn ncclReduceConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int, comm: Comm, stream: Stream, config: *const c_void) => |real| hooks::op(OpKind::Reduce, &args(comm, count, datatype, sendbuff, recvbuff, stream).redop(op).root(root), real);
    fn ncclAllGatherConfig(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: Comm, stream: Stream, config: *const c_void) => |real| hooks::op(OpKind::AllGather, &args(comm, sendcount, datatype, sendbuff, recvbuff, stream), real);
    fn ncclReduceScatterConfig(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int, comm: Comm, stream: Stream, config: *const c_void) => |real| hooks::op(OpKind::ReduceScatter, &args(comm, recvcount, datatype, sendbuff, recvbuff, stream).redop(op), real);
    fn ncclAlltoAllConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: Comm, stream: Stream, config: *const c_void) => |real| hooks::op(OpKind::AlltoAll, &args(comm, count, datatype, sendbuff, recvbuff, stream), real);
    fn ncclGatherConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: Comm, stream: Stream, config: *const c_void) => |real| hooks::op(OpKind::Gather, &args(comm, count, datatype, sendbuff, recvbuff, stream).root(root), real);
    fn ncclScatterConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: Comm, stream: Stream, config: *const c_void) => |real| hooks::op(OpKind::Scatter, &args(comm, count, datatype, sendbuff, recvbuff, stream).root(root), real);
    fn ncclSend(sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::Send, &args(comm, count, datatype, sendbuff, NULL, stream).peer(peer), real);
    fn ncclRecv(recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: Comm, stream: Stream) => |real| hooks::op(OpKind::Recv, &args(comm, count, datatype, NULL, recvbuff, stream).peer(peer), real);
    fn ncclGroupStart() => |real| hooks::group_start(real);
    fn ncclGroupEnd() => |real| hooks::group_end(CallKind::GroupEnd, real);
    fn ncclGroupSimulateEnd(sim_info: *mut c_void) => |real| hooks::group_end(CallKind::GroupSimulateEnd, real);
    fn ncclCommInitRank(comm: *mut Comm, nranks: c_int, comm_id: NcclUniqueId, rank: c_int) => |real| hooks::comm_init(init(CallKind::CommInitRank, unique(&[comm_id]), Some(rank), Some(nranks), None, NULL), real, || unsafe { created(comm, 1, std::ptr::null()) });
    fn ncclCommInitRankConfig(comm: *mut Comm, nranks: c_int, comm_id: NcclUniqueId, rank: c_int, config: *mut c_void) => |real| hooks::comm_init(init(CallKind::CommInitRankConfig, unique(&[comm_id]), Some(rank), Some(nranks), None, config), real, || unsafe { created(comm, 1, std::ptr::null()) });
    fn ncclCommInitRankScalable(newcomm: *mut Comm, nranks: c_int, myrank: c_int, n_id: c_int, comm_ids: *mut NcclUniqueId, config: *mut c_void) => |real| hooks::comm_init(init(CallKind::CommInitRankScalable, unique(unsafe { ids(comm_ids, n_id) }), Some(myrank), Some(nranks), None, config), real, || unsafe { created(newcomm, 1, std::ptr::null()) });
    fn ncclCommInitAll(comm: *mut Comm, ndev: c_int, devlist: *const c_int) => |real| hooks::comm_init(init(CallKind::CommInitAll, IdRule::All, None, Some(ndev), None, NULL), real, || unsafe { created(comm, ndev, devlist) });
    fn ncclCommSplit(comm: Comm, color: c_int, key: c_int, newcomm: *mut Comm, config: *mut c_void) => |real| hooks::comm_init(init(CallKind::CommSplit, IdRule::Split { parent: comm as usize, color }, None, None, Some(key), config), real, || unsafe { created(newcomm, 1, std::ptr::null()) });
    fn ncclCommShrink(comm: Comm, exclude_ranks: *mut c_int, exclude_count: c_int, newcomm: *mut Comm, config: *mut c_void, shrink_flags: c_int) => |real| hooks::comm_init(init(CallKind::CommShrink, IdRule::Shrink { parent: comm as usize, flags: shrink_flags }, None, None, None, config), real, || unsafe { created(newcomm, 1, std::ptr::null()) });
    fn ncclCommFinalize(comm: Comm) => |real| hooks::comm_end(CallKind::CommFinalize, comm as usize, real);
    fn ncclCommDestroy(comm: Comm) => |real| hooks::comm_end(CallKind::CommDestroy, comm as usize, real);
    fn ncclCommAbort(comm: Comm) => |real| hooks::comm_end(CallKind::CommAbort, comm as usize, real);
    fn ncclCommRegister(comm: Comm, buff: *mut c_void, size: usize, handle: *mut *mut c_void) => |real| hooks::registration(reg(CallKind::CommRegister, comm, buff, size, None), real, || unsafe { out_ptr(handle) });
    fn ncclCommDeregister(comm: Comm, handle: *mut c_void) => |real| hooks::registration(dereg(CallKind::CommDeregister, comm, handle), real, || None);
    fn ncclCommWindowRegister(comm: Comm, buff: *mut c_void, size: usize, win: *mut *mut c_void, win_flags: c_int) => |real| hooks::registration(reg(CallKind::CommWindowRegister, comm, buff, size, Some(win_flags)), real, || unsafe { out_ptr(win) });
    fn ncclCommWindowDeregister(comm: Comm, win: *mut c_void) => |real| hooks::registration(dereg(CallKind::CommWindowDeregister, comm, win), real, || None);
}

/// Whether this copy's exports are the ones the process resolves `ncclAllReduce` to
/// (true when LD_PRELOADed; false when NCCL merely dlopened us as its plugin).
pub fn interposing() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        // The main program's handle searches the global scope (where LD_PRELOAD puts
        // us), not the local scope of a library that NCCL dlopened (RTLD_DEFAULT from
        // inside a library would find our own symbol either way).
        // SAFETY: dlopen(NULL) returns the main program's handle; dlsym with a
        // NUL-terminated name.
        let p = unsafe {
            let main = libc::dlopen(std::ptr::null(), libc::RTLD_LAZY);
            if main.is_null() {
                return false;
            }
            libc::dlsym(main, c"ncclAllReduce".as_ptr())
        };
        // Not `p == ncclAllReduce` alone: that address, taken in our code, is found
        // through the global scope too, where a program linked against libnccl has
        // libnccl's. Where the program itself holds the answer (a non-PIE program that
        // takes the function's address gets it at a stub of its own, which dlsym
        // returns), the comparison is all there is to go by: our own reference then
        // resolves to that stub too.
        !p.is_null()
            && (real::in_own_object(p)
                || (real::in_main_program(p) && std::ptr::eq(p.cast_const(), ncclAllReduce as *const c_void)))
    })
}

fn unique(ids: &[NcclUniqueId]) -> IdRule {
    IdRule::Unique(hash::comm_id_from_unique_ids(ids.iter().map(|i| &i.internal[..])))
}

/// The `n` unique ids at `p` (empty when NCCL would reject the arguments).
///
/// # Safety
/// `p` must be NULL or point to `n` ids, as NCCL itself requires.
unsafe fn ids<'a>(p: *const NcclUniqueId, n: c_int) -> &'a [NcclUniqueId] {
    if p.is_null() || n <= 0 || n > 1 << 20 {
        return &[];
    }
    // SAFETY: caller's contract.
    unsafe { std::slice::from_raw_parts(p, n as usize) }
}

fn init(
    kind: CallKind,
    rule: IdRule,
    rank: Option<c_int>,
    nranks: Option<c_int>,
    key: Option<c_int>,
    config: *const c_void,
) -> InitArgs {
    // SAFETY: config is NULL or an ncclConfig_t the caller passes to NCCL.
    let config = unsafe { config_view(config) };
    InitArgs {
        kind,
        rule,
        rank,
        nranks,
        key,
        config,
    }
}

const CONFIG_MAGIC: u32 = 0xcafe_beef;
const UNDEF_INT: c_int = c_int::MIN;

/// Reads the fields of an `ncclConfig_t` we record, checking its magic and size.
/// Layout (NCCL 2.28): size@0 (size_t), magic@8, version@12, blocking@16, ...,
/// commName@48 (const char*), collnetEnable@56, CTAPolicy@60.
///
/// # Safety
/// `cfg` must be NULL or point to an initialised ncclConfig_t of at least `size` bytes.
unsafe fn config_view(cfg: *const c_void) -> ConfigView {
    if cfg.is_null() {
        return ConfigView::default();
    }
    let base = cfg.cast::<u8>();
    // SAFETY: every ncclConfig_t starts with size_t size, unsigned magic.
    let (size, magic) = unsafe {
        (
            base.cast::<usize>().read_unaligned(),
            base.add(8).cast::<u32>().read_unaligned(),
        )
    };
    if magic != CONFIG_MAGIC {
        return ConfigView::default();
    }
    let int_at = |off: usize| -> Option<c_int> {
        // SAFETY: off + 4 <= size, the struct's own declared size.
        (off + 4 <= size)
            .then(|| unsafe { base.add(off).cast::<c_int>().read_unaligned() })
            .filter(|&v| v != UNDEF_INT)
    };
    let name = (56 <= size)
        .then(|| {
            // SAFETY: offset 48 holds `const char* commName`, within `size`.
            let p = unsafe { base.add(48).cast::<*const std::ffi::c_char>().read_unaligned() };
            // SAFETY: commName is NULL or a C string, per NCCL's contract.
            unsafe { real::c_str(p) }
        })
        .flatten()
        .map(|s| SmallStr::new(&s));
    ConfigView {
        blocking: int_at(16),
        cta_policy: int_at(60),
        name,
    }
}

/// Communicators written by a creating call: `n` at `p`, with devlist hints.
///
/// # Safety
/// Called only after NCCL accepted the call, so `p` holds `n` communicators.
unsafe fn created(p: *const Comm, n: c_int, devlist: *const c_int) -> Vec<(usize, Option<i32>)> {
    if p.is_null() || n <= 0 {
        return Vec::new();
    }
    (0..n as usize)
        .map(|i| {
            // SAFETY: see the function's contract.
            let c = unsafe { *p.add(i) } as usize;
            // SAFETY: devlist, when given, has ndev entries (NCCL's contract).
            let dev = if devlist.is_null() {
                Some(i as i32)
            } else {
                Some(unsafe { *devlist.add(i) })
            };
            (c, if n > 1 { dev } else { None })
        })
        .collect()
}

/// A handle written by a registration call.
///
/// # Safety
/// Called only after NCCL accepted the call, which wrote `*p`.
unsafe fn out_ptr(p: *const *mut c_void) -> Option<u64> {
    // SAFETY: see the function's contract.
    (!p.is_null()).then(|| unsafe { *p } as u64)
}

fn reg(kind: CallKind, comm: Comm, buff: *mut c_void, size: usize, flags: Option<c_int>) -> RegArgs {
    RegArgs {
        kind,
        comm: comm as usize,
        buff: Some(buff as u64),
        size: Some(size as u64),
        flags,
        handle: None,
    }
}

fn dereg(kind: CallKind, comm: Comm, handle: *mut c_void) -> RegArgs {
    RegArgs {
        kind,
        comm: comm as usize,
        buff: None,
        size: None,
        flags: None,
        handle: Some(handle as u64),
    }
}
