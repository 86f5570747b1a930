//! What is recorded for each kind of NCCL call. Safe code: the exports in
//! `ffi::exports` turn C arguments into the plain values below and pass a closure
//! that calls the real function.
//!
//! Every hook follows one pattern: shim inactive, or re-entered from inside NCCL →
//! call the real function and return (while recording is paused, hooks keep only the
//! structure later rows depend on: [`enter`]); otherwise take the time, call the real function
//! (outside any `catch_unwind`), take the time, build and enqueue the record inside
//! [`protect`], and return the real result unchanged.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ffi::sys::now_ns;
use zcta::budget;
use zcta::hash;
use zcta::nccl::{self, CallKind, OpKind};
use zcta::record::{CallRecord, CommRecord, Event, OpRaw, OpTiming, PlanEngine, SmallStr, Timing};

use crate::comms::{self, CommState};
use crate::ffi;
use crate::gpu;
use crate::state::{self, protect};
use crate::timing;

/// What the hooks keep per thread, in one thread-local: in a shared library every
/// thread-local access is a call (`__tls_get_addr`), so a hook looks this up once and
/// passes it on ([`with_hot`]).
struct Hot {
    depth: Cell<u32>,
    /// (nesting depth, id of the outermost open group, ops recorded in it)
    group: Cell<(u32, u64, u32)>,
    /// op_id of the interposed call running on this thread (0: none). NCCL's profiler
    /// plugin starts its CollApi/P2pApi events synchronously inside that call, which
    /// is how the plugin's view is joined to ours.
    current_op: Cell<u64>,
    /// comm_id of the communicator an interposed creating call is making (0: none),
    /// for the plugin's `init`, which NCCL calls inside it when it runs on this thread.
    current_init: Cell<u64>,
    /// What NCCL's CollApi/P2pApi events said during the interposed op running on this
    /// thread: 0 none arrived, 1 not graph-captured, 2 captured into a CUDA graph.
    api_event: Cell<u8>,
    /// What NCCL's profiler events said during the launching call running on this
    /// thread: its KernelLaunch's start, and the engine its Coll/P2p/CeColl plans named.
    launch_note: Cell<(Option<i64>, PlanEngine)>,
    /// The budget's level when the open outermost group's first op was issued.
    group_level: Cell<Option<u8>>,
    /// The ops of the open outermost group with their rows, in the order issued. At
    /// the group's end the rows are completed in place and written with its
    /// ncclGroupEnd's record (which carries its ncclGroupStart's row too) in one
    /// reservation of the queue; the memory is reused by the next group.
    pending: RefCell<Vec<OpRaw>>,
    /// What the open outermost group's ops with rows add up to.
    group_ops: GroupOps,
    /// The open group's ops per sequence counter, once it is long ([`pending_ahead`]).
    ahead: RefCell<AheadIndex>,
    /// Communicators created inside the open outermost group whose records lack what
    /// NCCL says only once it ran (rank, size, device): asked at its successful end, so
    /// that the budget's key of their later ops is the same on every rank.
    made_in_group: RefCell<Vec<usize>>,
    /// The open outermost group's ncclGroupStart (entry, return) when its row is to be
    /// written: it travels in the group's end record ([`CallRecord::group_start`]).
    opened: Cell<Option<(i64, i64)>>,
    /// This thread's last communicator lookup.
    comms: comms::Cache,
    /// This thread's next op id and the end of its block ([`next_id`]).
    op_ids: Cell<(u64, u64)>,
    /// The same for group ids.
    group_ids: Cell<(u64, u64)>,
    /// Launching calls the budget weighed on this thread, not yet added to its count.
    chosen: timing::Chosen,
    /// This thread's id (gettid), 0 until first asked.
    tid: Cell<i32>,
}

thread_local! {
    static HOT: Hot = const {
        Hot {
            depth: Cell::new(0),
            group: Cell::new((0, 0, 0)),
            current_op: Cell::new(0),
            current_init: Cell::new(0),
            api_event: Cell::new(0),
            launch_note: Cell::new((None, PlanEngine::Unknown)),
            group_level: Cell::new(None),
            pending: RefCell::new(Vec::new()),
            group_ops: GroupOps::new(),
            ahead: RefCell::new(AheadIndex::new()),
            made_in_group: RefCell::new(Vec::new()),
            opened: Cell::new(None),
            comms: comms::Cache::new(),
            op_ids: Cell::new((0, 0)),
            group_ids: Cell::new((0, 0)),
            chosen: timing::Chosen::new(),
            tid: Cell::new(0),
        }
    };
}

/// Runs `body` with this thread's [`Hot`]; while the thread is exiting (its
/// thread-locals gone) calls `real` alone: the call is forwarded, not recorded.
#[inline(always)]
fn with_hot<F: FnOnce() -> i32>(real: F, body: impl FnOnce(&Hot, F) -> i32) -> i32 {
    let mut real = Some(real);
    let mut rc = None;
    let _ = HOT.try_with(|h| {
        if let Some(r) = real.take() {
            rc = Some(body(h, r));
        }
    });
    match (rc, real) {
        (Some(rc), _) => rc,
        (None, Some(r)) => r(),
        // Not reached: `real` is taken only to run `body`, which sets `rc`.
        (None, None) => nccl::NCCL_INTERNAL_ERROR,
    }
}

static NEXT_GROUP: AtomicU64 = AtomicU64::new(1);
static NEXT_OP: AtomicU64 = AtomicU64::new(1);

/// Ids a thread takes from a global counter at once: one locked add per block, not
/// per op. Ids stay unique in the process and increase on each thread.
const ID_BLOCK: u64 = 1024;

/// The next id of this thread's block in `c`, taking a new block from `global` when
/// it is used up. Never 0 (the counters start at 1).
#[inline]
fn next_id(c: &Cell<(u64, u64)>, global: &AtomicU64) -> u64 {
    let (next, end) = c.get();
    if next < end {
        c.set((next + 1, end));
        return next;
    }
    let start = global.fetch_add(ID_BLOCK, Ordering::Relaxed);
    c.set((start + 1, start + ID_BLOCK));
    start
}

/// NCCL started launching the work of the call running on this thread (KernelLaunch).
pub fn note_kernel_launch() {
    let _ = HOT.try_with(|h| {
        let (l, k) = h.launch_note.get();
        h.launch_note.set((l.or_else(|| Some(now_ns())), k));
    });
}

/// NCCL planned work (a Coll, P2p or CeColl event) during the call running on this
/// thread, to run on `engine`; of several plans the strongest wins ([`PlanEngine`]).
pub fn note_nccl_plan(engine: PlanEngine) {
    let _ = HOT.try_with(|h| {
        let (l, e) = h.launch_note.get();
        h.launch_note.set((l, e.max(engine)));
    });
}

fn reset_launch_note(h: &Hot) {
    h.launch_note.set((None, PlanEngine::Unknown));
}

/// What a launching call measured of its GPU side: `timing`, and the launch note.
fn take_op_timing(h: &Hot, timing: Timing) -> OpTiming {
    let (launch_ns, nccl_engine) = h.launch_note.replace((None, PlanEngine::Unknown));
    OpTiming {
        timing,
        launch_ns,
        nccl_engine,
    }
}

/// The budget's key of an op about to be issued: the same on every rank of it
/// ([`budget`]); from its op id when the communicator is not known (then only this
/// rank can tell which ops it timed).
fn op_key(kind: OpKind, st: Option<&CommState>, peer: Option<i32>, op_id: u64, seq_ahead: u64) -> u64 {
    let key = st.and_then(|st| {
        let comm_id = st.comm_id?;
        Some(match (kind, peer) {
            (OpKind::Send, Some(p)) => {
                budget::p2p_key(comm_id, st.rank()?, p, st.peek_p2p_seq(true, p) + seq_ahead)
            }
            (OpKind::Recv, Some(p)) => {
                budget::p2p_key(comm_id, p, st.rank()?, st.peek_p2p_seq(false, p) + seq_ahead)
            }
            _ => budget::coll_key(comm_id, st.peek_coll_seq() + seq_ahead),
        })
    });
    key.unwrap_or_else(|| hash::StableHasher::new().u64(op_id).finish())
}

/// NCCL started a CollApi/P2pApi event inside the interposed op on this thread
/// (`captured`: its `graphCaptured`).
pub fn note_api_event(captured: bool) {
    let _ = HOT.try_with(|h| h.api_event.set(if captured { 2 } else { 1 }));
}

/// Whether the op that just returned on this thread was captured into a CUDA graph,
/// as NCCL's API events said (`None`: none arrived); clears it for the next op.
fn take_graph_captured(h: &Hot) -> Option<bool> {
    match h.api_event.replace(0) {
        0 => None,
        v => Some(v == 2),
    }
}

/// op_id of the interposed op running on this thread, if any.
pub fn current_op() -> Option<u64> {
    HOT.try_with(|h| h.current_op.get()).ok().filter(|&v| v != 0)
}

/// comm_id being created by an interposed call on this thread, if any.
pub fn current_init() -> Option<u64> {
    HOT.try_with(|h| h.current_init.get()).ok().filter(|&v| v != 0)
}
static NEXT_LOCAL_COMM: AtomicU64 = AtomicU64::new(0);

/// Marks "inside an interposed call" on this thread for the lifecycle hooks; NCCL
/// calling its own exported API from inside a call then reaches the real function
/// without a second record. (The data-moving calls and groups mark it by hand:
/// [`enter`], [`leave`].)
struct Guard<'a>(&'a Hot);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        leave(self.0);
    }
}

/// `Some(rows)` when the shim follows this call, which it then marks on the thread
/// (undone by [`leave`]): an outermost call while the shim is active (activating it on
/// first use). `rows`: recording is not paused (`zcta_set_recording(0)`). While paused
/// the shim still keeps what later rows depend on — communicators and registrations
/// (with their rows), group nesting, and each communicator's sequence numbers — and
/// writes no rows of data-moving calls or groups.
#[inline(always)]
fn enter(h: &Hot) -> Option<bool> {
    if h.depth.get() != 0 {
        return None;
    }
    state::recorder()?;
    h.depth.set(1);
    Some(crate::control::rows_wanted())
}

/// The call [`enter`] marked returned.
#[inline(always)]
fn leave(h: &Hot) {
    h.depth.set(0);
}

/// [`enter`] for the lifecycle hooks, with a guard that calls [`leave`].
fn enter_guarded(h: &Hot) -> Option<(Guard<'_>, bool)> {
    enter(h).map(|rows| (Guard(h), rows))
}

/// In a fork child (its only thread is the one that forked): forget the parent's
/// thread id.
pub fn after_fork_child() {
    let _ = HOT.try_with(|h| h.tid.set(0));
}

/// This thread's id, read once per thread ([`after_fork_child`] clears it).
#[inline]
fn tid(h: &Hot) -> i32 {
    match h.tid.get() {
        0 => {
            let t = ffi::sys::gettid();
            h.tid.set(t);
            t
        }
        t => t,
    }
}

fn current_group(h: &Hot) -> Option<u64> {
    let (depth, id, _) = h.group.get();
    (depth > 0).then_some(id)
}

/// Arguments of a data-moving call.
#[derive(Clone, Copy, Debug)]
pub struct OpArgs {
    pub comm: usize,
    pub count: u64,
    pub dtype: i32,
    pub sendbuff: u64,
    pub recvbuff: u64,
    pub stream: u64,
    pub root: Option<i32>,
    pub peer: Option<i32>,
    pub redop: Option<i32>,
}

/// Whether NCCL may be asked about a communicator after a call returned `rc`: only
/// when the call returned ncclSuccess outside any group. Inside a group (and for a
/// non-blocking communicator) NCCL defers initialisation: the queries would return
/// zeros, or print warnings and overwrite what `ncclGetLastError` reports.
fn may_query(h: &Hot, rc: i32) -> bool {
    rc == nccl::NCCL_SUCCESS && current_group(h).is_none()
}

/// Asks NCCL what a known communicator's record lacks (non-blocking or deferred init).
#[cold]
fn query_comm(st: &CommState, ptr: usize) {
    st.fill(
        ffi::real::comm_rank(ptr),
        ffi::real::comm_count(ptr),
        ffi::real::comm_device(ptr),
    );
}

/// A communicator created where we did not see it: learned from NCCL and registered.
#[cold]
fn learn_comm(ptr: usize) -> Arc<CommState> {
    let st = Arc::new(CommState::new(
        None,
        ffi::real::comm_rank(ptr),
        ffi::real::comm_count(ptr),
        ffi::real::comm_device(ptr),
    ));
    comms::insert(ptr, Arc::clone(&st));
    st
}

/// A known communicator, borrowed from the thread's cache (no reference count
/// taken), with what its record lacks (deferred or non-blocking init) asked of NCCL
/// when `queryable`.
#[inline(always)]
fn known_comm(h: &Hot, ptr: usize, queryable: bool) -> Option<comms::CommRef<'_>> {
    let st = comms::find(ptr, &h.comms)?;
    if queryable && !st.is_complete() {
        query_comm(&st, ptr);
    }
    Some(st)
}

/// Looks up a communicator ([`known_comm`]), learning it lazily when it was created in
/// a way we could not see. NCCL is queried only when `queryable` ([`may_query`]), so a
/// bad or unready pointer is never handed to it by us first.
#[inline(always)]
fn comm_for(h: &Hot, ptr: usize, queryable: bool) -> Option<comms::CommRef<'_>> {
    match known_comm(h, ptr, queryable) {
        None if queryable => Some(comms::CommRef::Held(learn_comm(ptr))),
        known => known,
    }
}

/// The sequence number of an accepted op on its communicator (taking it).
fn next_seq(op: OpKind, peer: Option<i32>, comm: &CommState) -> u64 {
    match (op, peer) {
        (OpKind::Send, Some(p)) => comm.next_p2p_seq(true, p),
        (OpKind::Recv, Some(p)) => comm.next_p2p_seq(false, p),
        _ => comm.next_coll_seq(),
    }
}

/// An op's row, as the hot path writes it ([`OpRaw`]): what the call gave and its
/// times. Its communicator's fields, `seq`, `group_id`, the thread and the GPU side
/// are for the caller to fill ([`comm_fields`], [`GpuSide::set`]).
#[inline(always)]
fn op_raw(kind: OpKind, a: &OpArgs, op_id: u64, t0: i64, t1: i64, rc: i32) -> OpRaw {
    let (peer, b_peer) = OpRaw::opt(a.peer, OpRaw::PEER);
    let (root, b_root) = OpRaw::opt(a.root, OpRaw::ROOT);
    let (redop, b_redop) = OpRaw::opt(a.redop, OpRaw::REDOP);
    OpRaw {
        op_id,
        comm_id: 0,
        comm_ptr: a.comm as u64,
        seq: 0,
        call_seq: 0,
        count: a.count,
        // The writer derives it (`OpRecord::with_bytes`): not the hot path's work.
        bytes: 0,
        sendbuff: a.sendbuff,
        recvbuff: a.recvbuff,
        stream: a.stream,
        group_id: 0,
        api_start_ns: t0,
        api_end_ns: t1,
        launch_ns: 0,
        dtype: a.dtype,
        peer,
        root,
        redop,
        rank: 0,
        nranks: 0,
        device: 0,
        result: rc,
        tid: 0,
        present: b_peer | b_root | b_redop,
        op: kind,
        timing: Timing::Off,
        nccl_engine: PlanEngine::Unknown,
    }
}

/// Fills a row's communicator fields from `st` and takes its sequence numbers: the
/// op's index among the calls on the communicator, and when `ran` (NCCL accepted the
/// op, and its group ran) its `seq`.
#[inline(always)]
fn comm_fields(r: &mut OpRaw, st: &CommState, ran: bool) {
    let (comm_id, b0) = OpRaw::opt(st.comm_id, OpRaw::COMM_ID);
    let (rank, b1) = OpRaw::opt(st.rank(), OpRaw::RANK);
    let (nranks, b2) = OpRaw::opt(st.nranks(), OpRaw::NRANKS);
    let (device, b3) = OpRaw::opt(st.device(), OpRaw::DEVICE);
    r.comm_id = comm_id;
    r.rank = rank;
    r.nranks = nranks;
    r.device = device;
    r.call_seq = st.next_call_seq();
    let mut bits = b0 | b1 | b2 | b3 | OpRaw::CALL_SEQ;
    if ran {
        let peer = (r.present & OpRaw::PEER != 0).then_some(r.peer);
        r.seq = next_seq(r.op, peer, st);
        bits |= OpRaw::SEQ;
    }
    r.present |= bits;
}

/// A launching call's GPU side, as its rows take it ([`GpuSide::set`]).
#[derive(Clone, Copy)]
struct GpuSide {
    launch_ns: i64,
    timing: Timing,
    nccl_engine: PlanEngine,
    /// `present` bits: launch_ns, gpu_marked.
    bits: u16,
    /// `graph_captured` where the op itself did not say.
    capture: u16,
}

impl GpuSide {
    fn new(t: OpTiming, marked: bool, graph_captured: Option<bool>) -> Self {
        let (launch_ns, b) = OpRaw::opt(t.launch_ns, OpRaw::LAUNCH_NS);
        Self {
            launch_ns,
            timing: t.timing,
            nccl_engine: t.nccl_engine,
            bits: b | if marked { OpRaw::GPU_MARKED } else { 0 },
            capture: OpRaw::capture_bits(graph_captured),
        }
    }

    #[inline(always)]
    fn set(&self, r: &mut OpRaw) {
        r.launch_ns = self.launch_ns;
        r.timing = self.timing;
        r.nccl_engine = self.nccl_engine;
        let mut bits = r.present | self.bits;
        if bits & OpRaw::CAPTURE_KNOWN == 0 {
            bits |= self.capture;
        }
        r.present = bits;
    }
}

/// An op kept in its group's list while recording was paused: no row (op id 0; ids
/// start at 1), only what its sequence number needs.
const NO_ROW: u64 = 0;

/// What a followed data-moving call carries from before its real call to after it.
struct OpCall {
    /// Recording is not paused: the call gets a row.
    rows: bool,
    /// Not inside a group: the call launches its own GPU work.
    launching: bool,
    op_id: u64,
    selected: bool,
    /// The timing's start (launching calls with rows only).
    begun: Option<Result<timing::Begun, Timing>>,
    marked: bool,
    t0: i64,
}

/// A collective or point-to-point call. The real call is made here, between the two
/// halves of the hook, so that it stays in the export's own code.
#[inline(always)]
pub fn op(kind: OpKind, a: &OpArgs, real: impl FnOnce() -> i32) -> i32 {
    with_hot(real, |h, real| {
        let Some(c) = op_before(h, kind, a) else {
            return real();
        };
        let rc = real();
        op_after(h, kind, a, c, rc);
        rc
    })
}

/// Before a data-moving call: `None` when the shim does not follow it; otherwise the
/// call is marked on the thread, its op id taken, the budget's choice made and its
/// timing begun. One body for every data-moving export (not generic over the call).
#[inline(never)]
fn op_before(h: &Hot, kind: OpKind, a: &OpArgs) -> Option<OpCall> {
    let rows = enter(h)?;
    if !rows {
        return Some(OpCall {
            rows,
            launching: false,
            op_id: 0,
            selected: false,
            begun: None,
            marked: false,
            t0: 0,
        });
    }
    let op_id = next_id(&h.op_ids, &NEXT_OP);
    h.current_op.set(op_id);
    // Inside a group the launch happens in ncclGroupEnd, which pushes the group's id
    // and is timed instead.
    let launching = current_group(h).is_none();
    // The budget's choice: a selected op is timed (when it launches) and NCCL
    // generates its profiler events; the others have their host row only.
    let pick = if timing::on() {
        protect(|| {
            pick_op(
                h,
                kind,
                a,
                comms::find(a.comm, &h.comms).as_deref(),
                op_id,
                launching,
            )
        })
    } else {
        None
    };
    if let Some(p) = pick {
        ffi::plugin::follow_op(p.selected);
    }
    let begun = launching.then(|| match pick {
        Some(p) => protect(|| timing::begin(a.stream, p, &h.chosen)).unwrap_or(Err(Timing::Error)),
        None if timing::on() => Err(Timing::Error),
        None => Err(Timing::Off),
    });
    let t0 = now_ns();
    let marked = launching && gpu::begin(op_id, t0);
    // What NCCL's API events say about this call only (an event that arrived outside
    // an op, e.g. while recording was being resumed, must not stick to this one).
    h.api_event.set(0);
    reset_launch_note(h);
    Some(OpCall {
        rows,
        launching,
        op_id,
        selected: pick.is_some_and(|p| p.selected),
        begun,
        marked,
        t0,
    })
}

/// After a data-moving call that [`op_before`] followed, which returned `rc`: its
/// timing ended and its row written (or, inside a group, kept for the group's end).
#[inline(never)]
fn op_after(h: &Hot, kind: OpKind, a: &OpArgs, mut c: OpCall, rc: i32) {
    if !c.rows {
        protect(|| op_paused(h, kind, a, rc));
        leave(h);
        return;
    }
    let t1 = now_ns();
    // The op's CUPTI window closes before its end stamp is launched: zcta's kernel is
    // not one of the op's launches (deep mode).
    gpu::end(c.marked);
    let timing = match c.begun.take() {
        Some(Ok(b)) => protect(|| timing::end(b, rc, c.op_id)).unwrap_or(Timing::Error),
        Some(Err(why)) => why,
        None => Timing::Off,
    };
    h.current_op.set(0);
    // NCCL's API events say it for the ops the budget selected (the only ones NCCL
    // generates events for in the default mode), and so does the timing's capture check,
    // which only a selected launching call makes.
    let graph_captured = take_graph_captured(h).or(timing.graph_capture());
    protect(|| {
        if c.launching {
            let op_timing = take_op_timing(h, timing);
            emit_op(h, kind, a, &c, rc, t1, graph_captured, op_timing);
        } else {
            keep_op(h, kind, a, &c, rc, t1, graph_captured);
        }
    });
    leave(h);
}

/// The row of an op outside any group: it takes its sequence numbers now, and goes
/// to the queue.
#[allow(clippy::too_many_arguments)]
fn emit_op(
    h: &Hot,
    kind: OpKind,
    a: &OpArgs,
    c: &OpCall,
    rc: i32,
    t1: i64,
    graph_captured: Option<bool>,
    timing: OpTiming,
) {
    let mut r = op_raw(kind, a, c.op_id, c.t0, t1, rc);
    r.tid = tid(h);
    if let Some(st) = comm_for(h, a.comm, may_query(h, rc)) {
        comm_fields(&mut r, &st, nccl::accepted(rc));
    }
    GpuSide::new(timing, c.marked, graph_captured).set(&mut r);
    state::emit_with(1, |_| Event::Op(r));
}

/// An op inside a group, kept in its group's list: its communicator's fields and
/// sequence numbers are taken at the group's end ([`flush_group`]), in the order the
/// ops were issued (NCCL's rule that threads take turns on a communicator keeps any
/// other op of it from coming between).
fn keep_op(h: &Hot, kind: OpKind, a: &OpArgs, c: &OpCall, rc: i32, t1: i64, graph_captured: Option<bool>) {
    let mut r = op_raw(kind, a, c.op_id, c.t0, t1, rc);
    r.present |= OpRaw::capture_bits(graph_captured);
    // Busy only if NCCL called back into a hook that keeps an op from inside one (it
    // does not): then the op is not kept.
    let Ok(mut p) = h.pending.try_borrow_mut() else {
        return;
    };
    p.push(r);
    let (d, id, n) = h.group.get();
    h.group.set((d, id, n.saturating_add(1)));
    h.group_ops.note(a.stream, c.selected);
}

/// A data-moving call while recording is paused: no row, but it takes its sequence
/// numbers (at its group's end when grouped), so `seq` stays the op's index on the
/// communicator and agrees across ranks that paused at different ops.
#[cold]
fn op_paused(h: &Hot, kind: OpKind, a: &OpArgs, rc: i32) {
    if current_group(h).is_some() {
        if let Ok(mut p) = h.pending.try_borrow_mut() {
            p.push(op_raw(kind, a, NO_ROW, 0, 0, rc));
        }
        return;
    }
    if let Some(st) = comm_for(h, a.comm, may_query(h, rc)) {
        st.next_call_seq();
        if nccl::accepted(rc) {
            let _ = next_seq(kind, a.peer, &st);
        }
    }
}

/// Writes the rows of a closed outermost group `group_id` ([`Hot::pending`]) with its
/// closing call's row `end`, in one reservation of the queue: its ops' rows only when
/// `rows` (its ncclGroupEnd, which launches them, was called while recording). Every
/// op takes its index among its communicator's calls, and its `seq` when the group
/// really ran and NCCL accepted it; `gpu`: what its ncclGroupEnd measured, shared by
/// its ops. `end_rc`: what the ncclGroupEnd that closed it returned (`None` for
/// ncclGroupSimulateEnd, which runs nothing): the group ran when NCCL accepted it, and
/// on ncclSuccess NCCL has initialised its communicators (one created inside the group
/// included) and may be asked what their records lack ([`complete_comms`]).
fn flush_group(
    h: &Hot,
    group_id: u64,
    end_rc: Option<i32>,
    rows: bool,
    gpu: GpuSide,
    end: Option<CallRecord>,
) {
    // Busy only if NCCL called back into a hook from inside one (it does not): then
    // the group's end row alone is written.
    let Ok(mut ops) = h.pending.try_borrow_mut() else {
        if let Some(r) = end {
            state::emit(Event::Call(r));
        }
        return;
    };
    h.group_ops.clear();
    let ran = end_rc.is_some_and(nccl::accepted);
    // Only where some communicator may be incomplete (one made inside a group or
    // non-blocking) are its ops' communicators looked at first.
    if end_rc == Some(nccl::NCCL_SUCCESS) && comms::maybe_incomplete() {
        complete_comms(h, &ops);
    }
    if h.made_in_group.try_borrow().is_ok_and(|m| !m.is_empty()) {
        complete_made(h, end_rc == Some(nccl::NCCL_SUCCESS));
    }
    let tid = tid(h);
    let mut n = 0;
    for r in ops.iter_mut() {
        let ok = ran && nccl::accepted(r.result);
        if let Some(st) = known_comm(h, r.comm_ptr as usize, false) {
            comm_fields(r, &st, ok);
        }
        if rows && r.op_id != NO_ROW {
            r.group_id = group_id;
            r.present |= OpRaw::GROUP_ID;
            r.tid = tid;
            gpu.set(r);
            n += 1;
        }
    }
    // The rows go from the list straight into the queue.
    let recs = ops.iter().filter(|r| rows && r.op_id != NO_ROW);
    let mut end = end;
    emit_in_batches(recs, n, &mut end, &mut Queue);
    // The next group reuses the list's memory (no allocation per group).
    ops.clear();
}

/// After a group's end returned ncclSuccess: NCCL has initialised the communicators
/// of its ops (one created inside the group included), so what a known one's record
/// lacks is asked now, for the ops NCCL accepted ([`known_comm`]). Unlike
/// [`comm_for`], a pointer that is not known is not handed to NCCL to learn it: it may
/// be a communicator destroyed inside the group (its record is gone with it).
#[cold]
#[inline(never)]
fn complete_comms(h: &Hot, ops: &[OpRaw]) {
    for r in ops.iter().filter(|r| nccl::accepted(r.result)) {
        let _ = known_comm(h, r.comm_ptr as usize, true);
    }
}

/// At the end of the outermost group: the communicators created inside it are asked
/// what their records lack when it ran (`ran`: its ncclGroupEnd returned ncclSuccess,
/// so NCCL has initialised them), and forgotten either way. One destroyed inside the
/// group is no longer known and is not handed to NCCL ([`known_comm`]).
#[cold]
fn complete_made(h: &Hot, ran: bool) {
    let Ok(mut made) = h.made_in_group.try_borrow_mut() else {
        return;
    };
    if ran {
        for &ptr in made.iter() {
            let _ = known_comm(h, ptr, true);
        }
    }
    made.clear();
}

/// The most records a group writes with one reservation of the queue (a quarter of
/// the smallest queue `ZCTA_QUEUE_CAPACITY` allows, so a batch always fits an empty
/// queue with its reserve kept).
const BATCH_MAX: usize = 256;

/// Where a group's records go: one reservation per call, `make` called `k` times
/// when they went in and not at all when they were dropped (then false).
trait Emit {
    fn emit_with(&mut self, k: usize, make: impl FnMut(usize) -> Event) -> bool;
}

/// The recorder's queue ([`state::emit_with`]).
struct Queue;

impl Emit for Queue {
    #[inline(always)]
    fn emit_with(&mut self, k: usize, make: impl FnMut(usize) -> Event) -> bool {
        state::emit_with(k, make)
    }
}

/// Writes a group's `n` op rows `recs`, then its end record, in order: a group larger
/// than a share of the queue goes in pieces of at most [`BATCH_MAX`], each one
/// reservation. A piece the queue drops (counted there) passes over its records, so
/// that the next piece carries the records after them and the end record stays last.
#[inline(always)]
fn emit_in_batches<'a>(
    mut recs: impl Iterator<Item = &'a OpRaw>,
    n: usize,
    end: &mut Option<CallRecord>,
    out: &mut impl Emit,
) {
    let mut left = n + usize::from(end.is_some());
    while left > 0 {
        let k = left.min(BATCH_MAX);
        // Called exactly `k` times when the piece goes in: rows, then the end record.
        // Nothing in it can panic; the last arm is not reached (it would write the end
        // row again).
        let sent = out.emit_with(k, |_| match recs.next() {
            Some(r) => Event::Op(*r),
            None => Event::Call(
                end.take()
                    .unwrap_or_else(|| CallRecord::new(CallKind::GroupEnd, 0, 0, 0, 0)),
            ),
        });
        if !sent {
            for _ in 0..k {
                if recs.next().is_none() {
                    *end = None;
                }
            }
        }
        left -= k;
    }
}

fn call_record(h: &Hot, call: CallKind, t0: i64, t1: i64, rc: i32) -> CallRecord {
    CallRecord::new(call, t0, t1, rc, tid(h))
}

/// What the open outermost group's ops with rows add up to, kept as they are issued
/// (its end reads them without walking its list): their stream, and how many the
/// budget selected.
struct GroupOps {
    /// 0: no op yet; 1: all on `stream`; 2: several streams.
    streams: Cell<(u8, u64)>,
    selected: Cell<u64>,
}

impl GroupOps {
    const fn new() -> Self {
        Self {
            streams: Cell::new((0, 0)),
            selected: Cell::new(0),
        }
    }

    fn note(&self, stream: u64, selected: bool) {
        let next = match self.streams.get() {
            (0, _) => (1, stream),
            (1, s) if s == stream => (1, s),
            (_, s) => (2, s),
        };
        self.streams.set(next);
        self.selected.set(self.selected.get() + u64::from(selected));
    }

    fn clear(&self) {
        self.streams.set((0, 0));
        self.selected.set(0);
    }

    /// The one stream of the group's ops with rows: `None` without such ops;
    /// `Some(Err(Streams))` when they used several.
    fn stream(&self) -> Option<Result<u64, Timing>> {
        match self.streams.get() {
            (0, _) => None,
            (1, s) => Some(Ok(s)),
            _ => Some(Err(Timing::Streams)),
        }
    }
}

/// The budget's choice for an op about to be issued: for a launching call at the
/// level now; inside a group at the level its first op saw, with the sequence numbers
/// its ops will take (so that the rank of each op's peer, whose group holds the same
/// op, selects it too).
fn pick_op(
    h: &Hot,
    kind: OpKind,
    a: &OpArgs,
    st: Option<&CommState>,
    op_id: u64,
    launching: bool,
) -> timing::Pick {
    let level = if launching {
        timing::level()
    } else {
        group_level(h)
    };
    // Level 0 selects every op: no key to compute. A selected op is timed only when
    // the budget's rate limiter has room for it (the writer sets the level).
    let selected = (level == 0 || {
        let ahead = if launching {
            0
        } else {
            pending_ahead(h, kind, a.comm, a.peer)
        };
        budget::selected(op_key(kind, st, a.peer, op_id, ahead), level)
    }) && timing::has_room();
    timing::Pick {
        level,
        selected,
        extra_ns: if selected {
            timing::NCCL_EVENTS_NS_PER_OP
        } else {
            0
        },
    }
}

/// Ops of the open group ahead of one about to be issued that will take a sequence
/// number of the same counter (communicator, and peer and direction for Send/Recv)
/// at the group's end: those NCCL accepted, with rows or kept while recording was
/// paused ([`flush_group`] numbers both). Up to [`AHEAD_WALK_MAX`] ops the group's list
/// is walked; past that the counts come from [`Hot::ahead`], brought up to date with
/// the ops added since it was last asked, so that a group of n ops costs O(n), not
/// O(n²) (an all_to_all of uneven splits over a thousand ranks is a group of two
/// thousand sends and receives).
fn pending_ahead(h: &Hot, kind: OpKind, comm: usize, peer: Option<i32>) -> u64 {
    let Ok(p) = h.pending.try_borrow() else {
        return 0;
    };
    if p.len() <= AHEAD_WALK_MAX {
        return ahead_on_counter(&p, kind, comm, peer);
    }
    let Ok(mut index) = h.ahead.try_borrow_mut() else {
        return ahead_on_counter(&p, kind, comm, peer);
    };
    index.count(current_group(h).unwrap_or(0), &p, counter(kind, comm, peer))
}

/// Groups up to this many ops have [`pending_ahead`] walk their list.
const AHEAD_WALK_MAX: usize = 32;

/// The sequence counter an op takes its number from: (communicator, and for Send/Recv
/// the direction and peer; every collective shares one).
type Counter = (usize, OpKind, Option<i32>);

fn counter(op: OpKind, comm: usize, peer: Option<i32>) -> Counter {
    match op {
        OpKind::Send | OpKind::Recv => (comm, op, peer),
        _ => (comm, OpKind::AllReduce, None),
    }
}

/// The counter of an op in the group's list, when NCCL accepted it (else it takes no
/// sequence number).
fn pending_counter(x: &OpRaw) -> Option<Counter> {
    nccl::accepted(x.result).then(|| {
        counter(
            x.op,
            x.comm_ptr as usize,
            (x.present & OpRaw::PEER != 0).then_some(x.peer),
        )
    })
}

fn ahead_on_counter(pending: &[OpRaw], kind: OpKind, comm: usize, peer: Option<i32>) -> u64 {
    let me = counter(kind, comm, peer);
    pending.iter().filter(|x| pending_counter(x) == Some(me)).count() as u64
}

/// The open group's accepted ops per sequence counter, for long groups
/// ([`pending_ahead`]): which group it counts (its id), and how many of its list's ops
/// it has counted. The memory is reused by the next long group.
struct AheadIndex {
    group: u64,
    counted: usize,
    per_counter: HashMap<Counter, u64, BuildHasherDefault<comms::PeerHasher>>,
}

impl AheadIndex {
    const fn new() -> Self {
        Self {
            group: 0,
            counted: 0,
            per_counter: HashMap::with_hasher(BuildHasherDefault::new()),
        }
    }

    /// How many ops of group `group`'s list `pending` take a number of `me`, counting
    /// the ops added since the last call (all of them for another group).
    fn count(&mut self, group: u64, pending: &[OpRaw], me: Counter) -> u64 {
        if self.group != group || self.counted > pending.len() {
            self.group = group;
            self.counted = 0;
            self.per_counter.clear();
        }
        for x in &pending[self.counted..] {
            if let Some(c) = pending_counter(x) {
                *self.per_counter.entry(c).or_insert(0) += 1;
            }
        }
        self.counted = pending.len();
        self.per_counter.get(&me).copied().unwrap_or(0)
    }
}

/// The level the open group's ops are selected at: the one its first op saw.
fn group_level(h: &Hot) -> u8 {
    h.group_level.get().unwrap_or_else(|| {
        let l = timing::level();
        h.group_level.set(Some(l));
        l
    })
}

/// The open group's choice at its end: selected when any of its ops was; what NCCL's
/// events for those ops cost goes to the budget with the group's events.
fn group_pick(h: &Hot) -> timing::Pick {
    let level = h.group_level.replace(None).unwrap_or_else(timing::level);
    let n = h.group_ops.selected.get();
    timing::Pick {
        level,
        selected: n > 0,
        extra_ns: n * timing::NCCL_EVENTS_NS_PER_OP,
    }
}

/// `ncclGroupStart`.
#[inline(always)]
pub fn group_start(real: impl FnOnce() -> i32) -> i32 {
    with_hot(real, |h, real| {
        let Some(rows) = enter(h) else { return real() };
        // While paused no row of the group's calls is written: no clock to read.
        let t0 = if rows { now_ns() } else { 0 };
        let rc = real();
        group_start_after(h, rows, t0, rc);
        rc
    })
}

#[inline(never)]
fn group_start_after(h: &Hot, rows: bool, t0: i64, rc: i32) {
    let t1 = if rows { now_ns() } else { 0 };
    protect(|| {
        let (d, id, n) = h.group.get();
        let id = if rc != nccl::NCCL_SUCCESS {
            (d > 0).then_some(id)
        } else if d == 0 {
            h.group_level.set(None);
            h.opened.set(None);
            // Nothing of an earlier group whose end was not followed (the shim
            // stopped inside it) goes out with this one.
            if let Ok(mut p) = h.pending.try_borrow_mut() {
                p.clear();
            }
            h.group_ops.clear();
            let id = next_id(&h.group_ids, &NEXT_GROUP);
            h.group.set((1, id, 0));
            Some(id)
        } else {
            h.group.set((d + 1, id, n));
            Some(id)
        };
        if rows {
            if rc == nccl::NCCL_SUCCESS && d == 0 {
                // The outermost group's row waits for the group's end (its ops wait
                // too), and travels in the end's record.
                h.opened.set(Some((t0, t1)));
            } else {
                let mut r = call_record(h, CallKind::GroupStart, t0, t1, rc);
                r.group_id = id;
                state::emit(Event::Call(r));
            }
        }
    });
    leave(h);
}

/// What a followed `ncclGroupEnd` carries from before its real call to after it.
struct GroupEndCall {
    rows: bool,
    /// The id of the group it closes when it is the outermost.
    outermost: Option<u64>,
    begun: Option<Result<timing::Begun, Timing>>,
    marked: bool,
    t0: i64,
}

/// `ncclGroupEnd` and `ncclGroupSimulateEnd` (both close the innermost group).
#[inline(always)]
pub fn group_end(kind: CallKind, real: impl FnOnce() -> i32) -> i32 {
    with_hot(real, |h, real| {
        let Some(c) = group_end_before(h, kind) else {
            return real();
        };
        let rc = real();
        group_end_after(h, kind, c, rc);
        rc
    })
}

#[inline(never)]
fn group_end_before(h: &Hot, kind: CallKind) -> Option<GroupEndCall> {
    let rows = enter(h)?;
    // The outermost ncclGroupEnd launches the group's work: tag it with the group.
    let outermost = {
        let (d, id, _) = h.group.get();
        (d == 1).then_some(id)
    };
    // ncclGroupSimulateEnd launches nothing: nothing to time.
    let begun = match (rows, outermost) {
        (true, Some(_)) if kind == CallKind::GroupEnd && timing::on() => protect(|| {
            let pick = group_pick(h);
            // NCCL reads the live mask, not its tasks' copies, for the events it starts
            // at the launch (v6's copy-engine events): they follow the group's choice.
            ffi::plugin::follow_op(pick.selected);
            h.group_ops
                .stream()
                .map(|s| s.and_then(|s| timing::begin(s, pick, &h.chosen)))
        })
        .unwrap_or(Some(Err(Timing::Error))),
        _ => None,
    };
    // While paused only the opening ncclGroupStart's row can be written, with its
    // own times: no clock to read.
    let t0 = if rows { now_ns() } else { 0 };
    let marked = rows && outermost.is_some_and(|id| gpu::begin(zcta::gpu::ext_id(0, Some(id)), t0));
    reset_launch_note(h);
    Some(GroupEndCall {
        rows,
        outermost,
        begun,
        marked,
        t0,
    })
}

#[inline(never)]
fn group_end_after(h: &Hot, kind: CallKind, c: GroupEndCall, rc: i32) {
    let t1 = if c.rows { now_ns() } else { 0 };
    // As in `op_after`: the window closes before the end stamp.
    gpu::end(c.marked);
    let timing = match (c.begun, c.outermost) {
        (Some(Ok(b)), id) => {
            let ext = id.map_or(0, |id| zcta::gpu::ext_id(0, Some(id)));
            protect(|| timing::end(b, rc, ext)).unwrap_or(Timing::Error)
        }
        (Some(Err(why)), _) => why,
        (None, _) => Timing::Off,
    };
    let group_timing = take_op_timing(h, timing);
    protect(|| {
        let (d, id, n) = h.group.get();
        let (id, n_ops) = match d {
            0 => (None, None),
            1 => {
                h.group.set((0, 0, 0));
                (Some(id), Some(n))
            }
            _ => {
                h.group.set((d - 1, id, n));
                (Some(id), None)
            }
        };
        // Closing the outermost group: its ncclGroupStart's row goes with this one's
        // (alone when this call is not recorded).
        let mut r = call_record(h, kind, c.t0, t1, rc);
        r.group_id = id;
        r.n_ops = n_ops;
        r.group_start = n_ops.and_then(|_| h.opened.take());
        let end = if c.rows { Some(r) } else { r.opening_row() };
        match (n_ops, id) {
            (Some(_), Some(id)) => flush_group(
                h,
                id,
                (kind == CallKind::GroupEnd).then_some(rc),
                c.rows,
                GpuSide::new(group_timing, c.marked, group_timing.timing.graph_capture()),
                end,
            ),
            _ => {
                if let Some(r) = end {
                    state::emit(Event::Call(r));
                }
            }
        }
    });
    leave(h);
}

/// What `ncclConfig_t` said (fields read by `ffi` after checking `config->size`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ConfigView {
    pub blocking: Option<i32>,
    pub cta_policy: Option<i32>,
    pub name: Option<SmallStr>,
}

/// How the new communicator's comm_id is derived.
#[derive(Clone, Copy, Debug)]
pub enum IdRule {
    /// Hash of the ncclUniqueId(s), computed by the caller.
    Unique(u64),
    /// `ncclCommSplit` of the parent at `parent` with this colour.
    Split { parent: usize, color: i32 },
    /// `ncclCommShrink` of the parent at `parent`, with its shrinkFlags.
    Shrink { parent: usize, flags: i32 },
    /// `ncclCommInitAll`: one communicator, all ranks in this process.
    All,
}

/// A communicator-creating call.
#[derive(Clone, Copy, Debug)]
pub struct InitArgs {
    pub kind: CallKind,
    pub rule: IdRule,
    pub rank: Option<i32>,
    pub nranks: Option<i32>,
    pub key: Option<i32>,
    pub config: ConfigView,
}

/// A communicator-creating call. `created(rc)` reads back the new communicator(s)
/// after the real call, with the device each was given when known from the
/// arguments (`ncclCommInitAll`'s devlist).
pub fn comm_init(
    a: InitArgs,
    real: impl FnOnce() -> i32,
    created: impl FnOnce() -> Vec<(usize, Option<i32>)>,
) -> i32 {
    with_hot(real, |h, real| comm_init_in(h, a, real, created))
}

fn comm_init_in(
    h: &Hot,
    a: InitArgs,
    real: impl FnOnce() -> i32,
    created: impl FnOnce() -> Vec<(usize, Option<i32>)>,
) -> i32 {
    // Recorded while paused too: later ops refer to the communicator. GPU capture
    // starts with the first one either way (a pause holds once it starts).
    let Some((g, _)) = enter_guarded(h) else {
        return real();
    };
    if let Some(r) = state::recorder() {
        let on = r.cupti_off;
        protect(|| gpu::start(on));
    }
    // Derivation indices are taken before the call, on every rank, success or not,
    // so that all ranks of the parent agree (a split or shrink is collective over the
    // parent). A creation from a unique id counts only once NCCL accepted it, per rank
    // (one process may hold several ranks of one communicator).
    let unique_rank = a.rank.unwrap_or(-1);
    let pre = protect(|| match a.rule {
        IdRule::Unique(id) => (Some(unique_comm_id(id, unique_rank)), None),
        IdRule::Split { parent, color } => {
            let p = comms::get(parent, &h.comms);
            let pid = p.as_ref().and_then(|p| p.comm_id);
            let id = match (&p, pid) {
                (Some(p), Some(pid)) => {
                    hash::comm_id_derived(pid, "split", p.next_split_index(), i64::from(color))
                }
                _ => local_comm_id(),
            };
            (Some(id), pid)
        }
        IdRule::Shrink { parent, .. } => {
            let p = comms::get(parent, &h.comms);
            let pid = p.as_ref().and_then(|p| p.comm_id);
            let id = match (&p, pid) {
                (Some(p), Some(pid)) => hash::comm_id_derived(pid, "shrink", p.next_shrink_index(), 0),
                _ => local_comm_id(),
            };
            (Some(id), pid)
        }
        IdRule::All => (Some(local_comm_id()), None),
    });
    let init_id = pre.and_then(|p| p.0).unwrap_or(0);
    h.current_init.set(init_id);
    let t0 = now_ns();
    let rc = real();
    let t1 = now_ns();
    h.current_init.set(0);
    // After the call: creating the communicator initialised CUDA, so the driver is
    // mapped by now even in a program that had not used CUDA before.
    if let Some(r) = state::recorder() {
        let (events, budget, follow) = (r.events, r.budget, r.follow_nccl);
        protect(|| crate::timing::start(events, budget, follow));
        protect(crate::timing::prepare);
        // NCCL's mask follows the budget from here on.
        ffi::plugin::sync_nccl_events();
    }
    protect(|| {
        let (comm_id, parent_id) = pre.unwrap_or((None, None));
        let ok = nccl::accepted(rc);
        if let (IdRule::Unique(id), true) = (a.rule, ok) {
            note_unique_creation(id, unique_rank);
        }
        let made = if ok { created() } else { Vec::new() };
        let version = ffi::real::library_info().version;
        let mut first_ptr = None;
        let many = made.len() > 1;
        let query = may_query(h, rc);
        for (i, (ptr, dev_hint)) in made.iter().copied().enumerate() {
            if ptr == 0 {
                continue;
            }
            first_ptr.get_or_insert(ptr);
            let Some(comm_id) = comm_id else { continue };
            let rank = if many {
                Some(i as i32)
            } else {
                a.rank
                    .or_else(|| query.then(|| ffi::real::comm_rank(ptr)).flatten())
            };
            let nranks = a
                .nranks
                .or_else(|| query.then(|| ffi::real::comm_count(ptr)).flatten());
            let device = query.then(|| ffi::real::comm_device(ptr)).flatten().or(dev_hint);
            let st = Arc::new(CommState::new(Some(comm_id), rank, nranks, device));
            comms::insert(ptr, Arc::clone(&st));
            if !st.is_complete()
                && current_group(h).is_some()
                && let Ok(mut m) = h.made_in_group.try_borrow_mut()
            {
                m.push(ptr);
            }
            let (color, key) = match a.rule {
                IdRule::Split { color, .. } => (Some(color), a.key),
                _ => (None, None),
            };
            state::emit(Event::Comm(CommRecord {
                comm_id,
                comm_ptr: ptr as u64,
                rank: st.rank(),
                nranks: st.nranks(),
                device: st.device(),
                parent_comm_id: parent_id,
                init: a.kind,
                color,
                key,
                comm_name: a.config.name,
                blocking: a.config.blocking,
                cta_policy: a.config.cta_policy,
                init_start_ns: t0,
                init_end_ns: t1,
                result: rc,
                nccl_version: version,
                tid: tid(h),
            }));
        }
        let mut r = call_record(h, a.kind, t0, t1, rc);
        r.comm_id = if first_ptr.is_some() { comm_id } else { None };
        r.comm_ptr = first_ptr.map(|p| p as u64);
        r.group_id = current_group(h);
        match a.rule {
            IdRule::Split { color, .. } => r.flags = Some(color),
            IdRule::Shrink { flags, .. } => r.flags = Some(flags),
            _ => {}
        }
        if let IdRule::All = a.rule {
            r.size = Some(made.len() as u64);
        }
        state::emit(Event::Call(r));
    });
    drop(g);
    rc
}

/// The same ncclUniqueId can create several communicators: `NCCL_COMM_ID` makes
/// `ncclGetUniqueId` return a fixed id, and programs re-create communicators from a
/// saved id. The n-th communicator a rank creates from one id gets a distinct
/// comm_id; creation is collective and ordered, so n agrees on every rank. Counted per
/// rank (one process may create several ranks of one communicator, NCCL's "multiple
/// devices per thread") and only for creations NCCL accepted (a call it refused on
/// one rank made nothing there).
static UNIQUE_SEEN: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<(u64, i32), u64>>> =
    std::sync::LazyLock::new(Default::default);

/// The comm_id of the next communicator `rank` creates from unique id `h`.
fn unique_comm_id(h: u64, rank: i32) -> u64 {
    let seen = UNIQUE_SEEN.lock().unwrap_or_else(|p| p.into_inner());
    match seen.get(&(h, rank)).copied().unwrap_or(0) {
        0 => h,
        n => hash::StableHasher::new().u64(h).u64(n).finish(),
    }
}

/// `rank` created a communicator from unique id `h` ([`unique_comm_id`]).
fn note_unique_creation(h: u64, rank: i32) {
    let mut seen = UNIQUE_SEEN.lock().unwrap_or_else(|p| p.into_inner());
    *seen.entry((h, rank)).or_insert(0) += 1;
}

/// An id for a communicator only this process can name (no unique id, or a parent
/// we never saw created).
fn local_comm_id() -> u64 {
    hash::StableHasher::new()
        .bytes(b"local")
        .bytes(ffi::sys::hostname().as_bytes())
        .u64(u64::from(std::process::id()))
        .u64(NEXT_LOCAL_COMM.fetch_add(1, Ordering::Relaxed))
        .finish()
}

/// `ncclCommFinalize`, `ncclCommDestroy`, `ncclCommAbort`.
pub fn comm_end(kind: CallKind, comm: usize, real: impl FnOnce() -> i32) -> i32 {
    with_hot(real, |h, real| comm_end_in(h, kind, comm, real))
}

fn comm_end_in(h: &Hot, kind: CallKind, comm: usize, real: impl FnOnce() -> i32) -> i32 {
    // Recorded while paused too, like the creation.
    let Some((g, _)) = enter_guarded(h) else {
        return real();
    };
    let st = protect(|| comms::get(comm, &h.comms)).flatten();
    let t0 = now_ns();
    let rc = real();
    let t1 = now_ns();
    protect(|| {
        if matches!(kind, CallKind::CommDestroy | CallKind::CommAbort)
            && nccl::accepted(rc)
            && let Some(st) = &st
        {
            comms::remove(comm, st);
        }
        let mut r = call_record(h, kind, t0, t1, rc);
        r.comm_id = st.and_then(|s| s.comm_id);
        r.comm_ptr = Some(comm as u64);
        r.group_id = current_group(h);
        state::emit(Event::Call(r));
    });
    drop(g);
    rc
}

/// Buffer (de)registration and window (de)registration.
pub struct RegArgs {
    pub kind: CallKind,
    pub comm: usize,
    pub buff: Option<u64>,
    pub size: Option<u64>,
    pub flags: Option<i32>,
    /// Handle passed in (deregistration).
    pub handle: Option<u64>,
}

/// `ncclCommRegister` & co. `handle_out` reads the handle written by a registration.
pub fn registration(a: RegArgs, real: impl FnOnce() -> i32, handle_out: impl FnOnce() -> Option<u64>) -> i32 {
    with_hot(real, |h, real| registration_in(h, a, real, handle_out))
}

fn registration_in(
    h: &Hot,
    a: RegArgs,
    real: impl FnOnce() -> i32,
    handle_out: impl FnOnce() -> Option<u64>,
) -> i32 {
    // Recorded while paused too: how the communicator's buffers are set up decides
    // the data paths of later ops.
    let Some((g, _)) = enter_guarded(h) else {
        return real();
    };
    let t0 = now_ns();
    let rc = real();
    let t1 = now_ns();
    protect(|| {
        let comm_id = comm_for(h, a.comm, nccl::accepted(rc)).and_then(|s| s.comm_id);
        let mut r = call_record(h, a.kind, t0, t1, rc);
        r.comm_id = comm_id;
        r.comm_ptr = Some(a.comm as u64);
        r.buff = a.buff;
        r.size = a.size;
        r.flags = a.flags;
        r.handle = if nccl::accepted(rc) {
            a.handle.or_else(handle_out)
        } else {
            a.handle
        };
        r.group_id = current_group(h);
        state::emit(Event::Call(r));
    });
    drop(g);
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_thread_blocks_are_unique_nonzero_and_increase_on_each_thread() {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let per_thread: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let c = Cell::new((0, 0));
                        (0..3 * ID_BLOCK + 5)
                            .map(|_| next_id(&c, &NEXT))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = per_thread.iter().flatten().copied().collect();
        for ids in &per_thread {
            assert!(ids.windows(2).all(|w| w[0] < w[1]));
        }
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert!(all[0] >= 1);
    }

    /// An op's arguments on communicator `comm` (to or from `peer`).
    fn args(comm: usize, peer: Option<i32>) -> OpArgs {
        OpArgs {
            comm,
            count: 1,
            dtype: 7,
            sendbuff: 0,
            recvbuff: 0,
            stream: 0,
            root: None,
            peer,
            redop: None,
        }
    }

    /// A group written in pieces: a piece the queue drops loses its own records only;
    /// the pieces after it carry theirs, and the end record stays last (lost only
    /// with the last piece).
    #[test]
    fn a_dropped_piece_of_a_group_loses_only_its_own_records() {
        struct Lossy {
            drop: Vec<usize>,
            calls: usize,
            got: Vec<Option<u64>>,
        }
        impl Emit for Lossy {
            fn emit_with(&mut self, k: usize, mut make: impl FnMut(usize) -> Event) -> bool {
                self.calls += 1;
                if self.drop.contains(&(self.calls - 1)) {
                    return false;
                }
                for i in 0..k {
                    self.got.push(match make(i) {
                        Event::Op(r) => Some(r.op_id),
                        _ => None,
                    });
                }
                true
            }
        }
        let rows: Vec<OpRaw> = (1..=600)
            .map(|id| op_raw(OpKind::AllReduce, &args(1, None), id, 0, 0, nccl::NCCL_SUCCESS))
            .collect();
        let end = || Some(CallRecord::new(CallKind::GroupEnd, 1, 2, 0, 0));
        let write = |drop: Vec<usize>| {
            let mut out = Lossy {
                drop,
                calls: 0,
                got: Vec::new(),
            };
            emit_in_batches(rows.iter(), rows.len(), &mut end(), &mut out);
            assert_eq!(out.calls, 3, "601 records in pieces of {BATCH_MAX}");
            out.got
        };
        let ids = |r: std::ops::RangeInclusive<u64>| r.map(Some).collect::<Vec<_>>();
        let mut all = ids(1..=600);
        all.push(None);
        assert_eq!(write(vec![]), all);
        let mut middle = ids(1..=256);
        middle.extend(ids(513..=600));
        middle.push(None);
        assert_eq!(write(vec![1]), middle);
        let mut first = ids(257..=600);
        first.push(None);
        assert_eq!(write(vec![0]), first);
        assert_eq!(write(vec![2]), ids(1..=512));
    }

    /// The sequence number an op of an open group will take is what its counter stands
    /// at plus the ops ahead of it that will take one: the ops kept while recording was
    /// paused count (they are numbered at the group's end too), ops NCCL refused do
    /// not, nor do ops of other counters. A rank that paused inside the group then
    /// keys the op as a rank that did not.
    #[test]
    fn ops_ahead_in_a_group_count_paused_ones_and_not_refused_ones() {
        let ok = nccl::NCCL_SUCCESS;
        // ncclInvalidArgument.
        let refused = 4;
        let pending = [
            op_raw(OpKind::AllReduce, &args(1, None), 5, 0, 0, ok),
            op_raw(OpKind::AllReduce, &args(1, None), NO_ROW, 0, 0, ok),
            op_raw(OpKind::Broadcast, &args(1, None), 6, 0, 0, refused),
            op_raw(OpKind::Reduce, &args(1, None), 10, 0, 0, refused),
            op_raw(OpKind::AllReduce, &args(2, None), 7, 0, 0, ok),
            op_raw(OpKind::Send, &args(1, Some(3)), NO_ROW, 0, 0, ok),
            op_raw(OpKind::Send, &args(1, Some(4)), 8, 0, 0, ok),
            op_raw(OpKind::Recv, &args(1, Some(3)), 9, 0, 0, ok),
        ];
        assert_eq!(ahead_on_counter(&pending, OpKind::ReduceScatter, 1, None), 2);
        assert_eq!(ahead_on_counter(&pending, OpKind::AllReduce, 2, None), 1);
        assert_eq!(ahead_on_counter(&pending, OpKind::Send, 1, Some(3)), 1);
        assert_eq!(ahead_on_counter(&pending, OpKind::Recv, 1, Some(3)), 1);
        assert_eq!(ahead_on_counter(&pending, OpKind::Recv, 1, Some(4)), 0);
    }

    #[test]
    fn a_long_groups_counts_per_counter_agree_with_walking_its_list() {
        // A deterministic mix: two communicators, collectives and sends/receives to
        // five peers (and none), some refused; the list grows op by op as in a group,
        // and each op asks before it is added, as `pick_op` does.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let kinds = [OpKind::AllReduce, OpKind::AllGather, OpKind::Send, OpKind::Recv];
        let mut index = AheadIndex::new();
        for group in [7, 8] {
            let mut pending = Vec::new();
            for id in 1..=400u64 {
                let kind = kinds[next(4) as usize];
                let comm = 1 + next(2) as usize;
                let peer = matches!(kind, OpKind::Send | OpKind::Recv).then(|| next(5) as i32);
                let rc = if next(10) == 0 { 4 } else { nccl::NCCL_SUCCESS };
                let want = ahead_on_counter(&pending, kind, comm, peer);
                assert_eq!(
                    index.count(group, &pending, counter(kind, comm, peer)),
                    want,
                    "group {group}, op {id}"
                );
                pending.push(op_raw(kind, &args(comm, peer), id, 0, 0, rc));
            }
            // Asked again with a shorter list of the same group (it was cleared and
            // refilled): counted afresh.
            let me = counter(OpKind::Send, 1, Some(2));
            assert_eq!(
                index.count(group, &pending[..10], me),
                ahead_on_counter(&pending[..10], OpKind::Send, 1, Some(2))
            );
        }
    }
}
