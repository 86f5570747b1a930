//! Records produced on the hot path. All are `Copy` and heap-free: building one and
//! pushing it into the bounded queue must not allocate. Per-process constants (pid,
//! host) are not repeated here; the writer adds them (see [`crate::tables::Ctx`]).
//!
//! `Option` fields are written as SQL NULL: NULL means "not known", never 0.

use crate::nccl::{CallKind, OpKind};

/// One NCCL data-moving operation (row of `ops`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpRecord {
    /// Process-wide id of this call; joins the profiler plugin's view (`nccl_ops`).
    pub op_id: u64,
    pub op: OpKind,
    pub comm_id: Option<u64>,
    /// Address of the `ncclComm_t` (distinguishes communicators inside a process).
    pub comm_ptr: u64,
    pub rank: Option<i32>,
    pub nranks: Option<i32>,
    /// Collectives: index of this collective on the communicator (same on every rank).
    /// Send/Recv: index of this op among this rank's sends to (receives from) `peer`.
    /// NULL when NCCL rejected the call.
    pub seq: Option<u64>,
    /// Index of this op among all ops this rank issued on the communicator (NULL when
    /// the communicator is unknown, e.g. a NULL comm).
    pub call_seq: Option<u64>,
    pub count: u64,
    pub dtype: i32,
    /// Message size as nccl-tests counts it; `None` from the shim, whose hot path
    /// leaves it to the writer ([`OpRecord::with_bytes`]); NULL in the row only for
    /// an unknown dtype (or a collective whose communicator size is unknown).
    pub bytes: Option<u64>,
    pub peer: Option<i32>,
    pub root: Option<i32>,
    pub redop: Option<i32>,
    pub sendbuff: u64,
    pub recvbuff: u64,
    pub stream: u64,
    pub device: Option<i32>,
    pub group_id: Option<u64>,
    pub api_start_ns: i64,
    pub api_end_ns: i64,
    pub result: i32,
    pub tid: i32,
    /// The call that launches this op's GPU work (its own, or its group's outermost
    /// ncclGroupEnd) was marked for GPU capture: CUPTI was capturing and, with
    /// `ZCTA_SAMPLE`, the call started in a window. Not a column: the writer's join
    /// uses it to tell an unsampled op from one whose GPU side did not arrive.
    pub gpu_marked: bool,
    /// The call was made on a stream capturing a CUDA graph, as NCCL's profiler events
    /// (CollApi/P2pApi `graphCaptured`) said; `None` when none arrived (zcta's plugin not
    /// loaded, NCCL asked for no events, or a call NCCL rejected before them).
    pub graph_captured: Option<bool>,
    /// The GPU side the hot path measured itself (CUDA events, NCCL's launch event).
    pub timing: OpTiming,
}

impl OpRecord {
    /// This record with `bytes` derived from its kind, count, dtype and communicator
    /// size where it is not set ([`OpKind::message_bytes`]).
    #[inline]
    pub fn with_bytes(&self) -> Self {
        Self {
            bytes: self
                .bytes
                .or_else(|| self.op.message_bytes(self.count, self.dtype, self.nranks)),
            ..*self
        }
    }

    /// An op `op_id` of kind `op` with nothing else known: optional fields empty, the
    /// rest zero (result ncclSuccess). Tests, benches and synthetic runs start from it
    /// (`OpRecord { bytes: Some(4), ..OpRecord::blank(1, OpKind::AllReduce) }`); the
    /// shim spells every field out.
    pub fn blank(op_id: u64, op: OpKind) -> Self {
        Self {
            op_id,
            op,
            comm_id: None,
            comm_ptr: 0,
            rank: None,
            nranks: None,
            seq: None,
            call_seq: None,
            count: 0,
            dtype: 0,
            bytes: None,
            peer: None,
            root: None,
            redop: None,
            sendbuff: 0,
            recvbuff: 0,
            stream: 0,
            device: None,
            group_id: None,
            api_start_ns: 0,
            api_end_ns: 0,
            result: 0,
            tid: 0,
            gpu_marked: false,
            graph_captured: None,
            timing: OpTiming::default(),
        }
    }
}

/// Whether an op's launch was timed with CUDA events, and why not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Timing {
    /// Not asked: the op launches no GPU work of its own (inside a group, before its
    /// ncclGroupEnd), or timing is off in this process (`process.gpu_timing` says why).
    #[default]
    Off,
    /// Events recorded around the launching call at budget level `k`: the op stands
    /// for 2^k ops ([`crate::budget`]).
    Timed(u8),
    /// Not timed by the budget at level `k`: not selected at that level, or selected
    /// while its rate limiter had no room ([`crate::budget::has_room`]).
    Skipped(u8),
    /// Its stream was being captured into a CUDA graph: no event is recorded there.
    Captured,
    /// No event pair was free (the writer had not returned enough yet).
    PoolEmpty,
    /// The driver refused a call (an unusual stream, an error), or the call failed.
    Error,
    /// Its group's ops ran on more than one stream.
    Streams,
    /// The call returned `ncclInProgress` (a non-blocking communicator): NCCL launches
    /// its work after the call returns, which events around the call cannot time.
    InProgress,
}

impl Timing {
    /// The `ops.timing` value.
    pub fn name(self) -> &'static str {
        match self {
            Timing::Off => "off",
            Timing::Timed(_) => "timed",
            Timing::Skipped(_) => "budget",
            Timing::Captured => "graph_capture",
            Timing::PoolEmpty => "pool_empty",
            Timing::Error => "error",
            Timing::Streams => "streams",
            Timing::InProgress => "in_progress",
        }
    }

    /// Whether the launching call's stream was capturing a CUDA graph, as the timing
    /// checked for a call the budget selected, before recording anything on it
    /// (`None`: not checked; a call not selected touches neither stream nor driver).
    pub fn graph_capture(self) -> Option<bool> {
        match self {
            Timing::Captured => Some(true),
            Timing::Timed(_) | Timing::PoolEmpty => Some(false),
            Timing::Skipped(_) | Timing::Off | Timing::Error | Timing::Streams | Timing::InProgress => None,
        }
    }

    /// Budget level of a timed or skipped op.
    pub fn level(self) -> Option<u8> {
        match self {
            Timing::Timed(k) | Timing::Skipped(k) => Some(k),
            _ => None,
        }
    }
}

/// What the hot path measured of an op's GPU side, without CUPTI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpTiming {
    pub timing: Timing,
    /// Entry into NCCL's kernel launch for the op (its profiler plugin's KernelLaunch
    /// event, during the launching call), CLOCK_REALTIME ns.
    pub launch_ns: Option<i64>,
    /// What NCCL's profiler events said would move the op's bytes: a Coll or P2p plan
    /// (a kernel; a symmetric one when v7's Coll says isSymColl) or a v6+ CeColl (the
    /// copy engine) during the launching call.
    pub nccl_engine: PlanEngine,
}

/// The engine NCCL's profiler events named for a launching call ([`OpTiming`]).
/// When one call launches several plans, a kernel wins over a symmetric kernel, and
/// both over the copy engine (an SM kernel ran).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum PlanEngine {
    /// No Coll, P2p or CeColl event arrived.
    #[default]
    Unknown,
    /// A v6+ CeColl event: NCCL ran the collective on the copy engine.
    CopyEngine,
    /// A v7 Coll event with isSymColl set.
    SymmetricKernel,
    /// A Coll or P2p event (a kernel plan).
    SmKernel,
}

/// One NCCL control call (row of `calls`): groups, communicator lifecycle,
/// buffer registration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallRecord {
    pub call: CallKind,
    pub comm_id: Option<u64>,
    pub comm_ptr: Option<u64>,
    pub group_id: Option<u64>,
    /// GroupEnd / GroupSimulateEnd: operations recorded inside the group.
    pub n_ops: Option<u32>,
    /// Registration: buffer address.
    pub buff: Option<u64>,
    /// Registration: buffer size; CommInitAll: number of communicators created.
    pub size: Option<u64>,
    /// Registration handle / window, or the new communicator.
    pub handle: Option<u64>,
    pub flags: Option<i32>,
    pub api_start_ns: i64,
    pub api_end_ns: i64,
    pub result: i32,
    pub tid: i32,
    /// An outermost GroupEnd / GroupSimulateEnd: its group's ncclGroupStart (entry and
    /// return, ns; it returned ncclSuccess on this thread), whose `calls` row the writer
    /// writes just before this one. Not a column: one record carries both rows.
    pub group_start: Option<(i64, i64)>,
}

impl CallRecord {
    /// A call's row with only what every call has: what it was, when it ran, what it
    /// returned, on which thread.
    pub fn new(call: crate::nccl::CallKind, t0: i64, t1: i64, result: i32, tid: i32) -> Self {
        CallRecord {
            call,
            comm_id: None,
            comm_ptr: None,
            group_id: None,
            n_ops: None,
            buff: None,
            size: None,
            handle: None,
            flags: None,
            api_start_ns: t0,
            api_end_ns: t1,
            result,
            tid,
            group_start: None,
        }
    }

    /// The ncclGroupStart row folded into this GroupEnd's record ([`Self::group_start`]).
    pub fn opening_row(&self) -> Option<CallRecord> {
        let (t0, t1) = self.group_start?;
        let mut r = Self::new(
            crate::nccl::CallKind::GroupStart,
            t0,
            t1,
            crate::nccl::NCCL_SUCCESS,
            self.tid,
        );
        r.group_id = self.group_id;
        Some(r)
    }
}

/// Short fixed-capacity string for the hot path (communicator names).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SmallStr {
    len: u8,
    buf: [u8; 63],
}

impl SmallStr {
    /// Truncates at a char boundary to at most 63 bytes.
    pub fn new(s: &str) -> Self {
        let mut end = s.len().min(63);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut buf = [0u8; 63];
        buf[..end].copy_from_slice(&s.as_bytes()[..end]);
        Self { len: end as u8, buf }
    }
    pub fn as_str(&self) -> &str {
        // Built from a &str cut at a char boundary.
        std::str::from_utf8(&self.buf[..self.len as usize]).unwrap_or("")
    }
}

impl std::fmt::Debug for SmallStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// One communicator on this rank (row of `comms`), written when its creation returns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CommRecord {
    pub comm_id: u64,
    pub comm_ptr: u64,
    pub rank: Option<i32>,
    pub nranks: Option<i32>,
    pub device: Option<i32>,
    pub parent_comm_id: Option<u64>,
    pub init: CallKind,
    pub color: Option<i32>,
    pub key: Option<i32>,
    pub comm_name: Option<SmallStr>,
    pub blocking: Option<i32>,
    pub cta_policy: Option<i32>,
    pub init_start_ns: i64,
    pub init_end_ns: i64,
    pub result: i32,
    pub nccl_version: Option<i32>,
    pub tid: i32,
}

/// NCCL's own view of one operation, from its profiler plugin (row of `nccl_ops`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NcclOpRecord {
    pub op_id: Option<u64>,
    pub comm_hash: Option<u64>,
    pub rank: Option<i32>,
    /// Which event the row comes from.
    pub event: NcclOpEvent,
    /// Code in [`crate::nccl::PLUGIN_FUNCS`].
    pub func: u8,
    pub seq_number: Option<u64>,
    /// Codes in [`crate::nccl::PLUGIN_ALGOS`] / [`crate::nccl::PLUGIN_PROTOS`].
    pub algo: Option<u8>,
    pub proto: Option<u8>,
    pub n_channels: i32,
    pub n_warps: Option<i32>,
    pub peer: Option<i32>,
    pub count: u64,
    pub dtype: Option<i32>,
    pub start_ns: i64,
    pub stop_ns: Option<i64>,
    pub tid: i32,
    /// v7: the call's user profiler tag (0 = untagged); `None` before v7.
    pub user_tag: Option<u64>,
    /// v7 Coll: the kernel variant NCCL names (symmetric kernels).
    pub kernel_variant: Option<SmallStr>,
    /// v7 Coll: whether the kernel is a symmetric-memory collective.
    pub is_sym_coll: Option<bool>,
    /// CeColl: the sync strategy (code in [`crate::nccl::CE_SYNC_STRATEGIES`]).
    pub sync_strategy: Option<u8>,
    /// CeColl: its CeBatch children, the copies they launched and their bytes, and
    /// its CeSync children.
    pub ce_batches: Option<u32>,
    pub ce_batch_ops: Option<u64>,
    pub ce_batch_bytes: Option<u64>,
    pub ce_syncs: Option<u32>,
}

/// The profiler event an `nccl_ops` row comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclOpEvent {
    Coll,
    P2p,
    /// A copy-engine collective (profiler API v6+).
    CeColl,
}

impl NcclOpEvent {
    pub fn name(self) -> &'static str {
        match self {
            NcclOpEvent::Coll => "Coll",
            NcclOpEvent::P2p => "P2p",
            NcclOpEvent::CeColl => "CeColl",
        }
    }
}

/// Proxy-thread event kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyKind {
    Op,
    Step,
    Ctrl,
    /// A channel's GPU timers (only with `ZCTA_NCCL_KERNEL_CH=1`).
    KernelCh,
}

impl ProxyKind {
    pub fn name(self) -> &'static str {
        match self {
            ProxyKind::Op => "ProxyOp",
            ProxyKind::Step => "ProxyStep",
            ProxyKind::Ctrl => "ProxyCtrl",
            ProxyKind::KernelCh => "KernelCh",
        }
    }
}

/// One proxy-thread event from NCCL's profiler plugin (row of `proxy`). Each state
/// column holds the time the state was first entered (a state marks the *start* of a
/// wait).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProxyRecord {
    pub kind: ProxyKind,
    pub op_id: Option<u64>,
    pub comm_hash: Option<u64>,
    pub rank: Option<i32>,
    pub pid: Option<i32>,
    pub channel: Option<i32>,
    pub peer: Option<i32>,
    pub n_steps: Option<i32>,
    pub chunk_size: Option<i32>,
    pub is_send: Option<bool>,
    pub step: Option<i32>,
    pub start_ns: i64,
    pub stop_ns: Option<i64>,
    pub in_progress_ns: Option<i64>,
    pub send_gpu_wait_ns: Option<i64>,
    pub send_peer_wait_ns: Option<i64>,
    pub send_wait_ns: Option<i64>,
    pub recv_wait_ns: Option<i64>,
    pub recv_flush_wait_ns: Option<i64>,
    pub recv_gpu_wait_ns: Option<i64>,
    pub trans_size: Option<u64>,
    /// ProxyCtrl: first and last state recorded (13 Idle .. 18 AppendEnd) and when.
    pub ctrl_first_state: Option<i32>,
    pub ctrl_first_ns: Option<i64>,
    pub ctrl_last_state: Option<i32>,
    pub ctrl_last_ns: Option<i64>,
    pub appended_ops: Option<i32>,
    /// KernelCh: the GPU's `%globaltimer` at the channel's start and stop (ns).
    pub gpu_timer_start: Option<u64>,
    pub gpu_timer_stop: Option<u64>,
    pub tid: i32,
}

impl ProxyRecord {
    /// A record with every optional field NULL (not known).
    pub fn new(
        kind: ProxyKind,
        op_id: Option<u64>,
        comm_hash: Option<u64>,
        rank: Option<i32>,
        start_ns: i64,
        stop_ns: Option<i64>,
        tid: i32,
    ) -> Self {
        ProxyRecord {
            kind,
            op_id,
            comm_hash,
            rank,
            pid: None,
            channel: None,
            peer: None,
            n_steps: None,
            chunk_size: None,
            is_send: None,
            step: None,
            start_ns,
            stop_ns,
            in_progress_ns: None,
            send_gpu_wait_ns: None,
            send_peer_wait_ns: None,
            send_wait_ns: None,
            recv_wait_ns: None,
            recv_flush_wait_ns: None,
            recv_gpu_wait_ns: None,
            trans_size: None,
            ctrl_first_state: None,
            ctrl_first_ns: None,
            ctrl_last_state: None,
            ctrl_last_ns: None,
            appended_ops: None,
            gpu_timer_start: None,
            gpu_timer_stop: None,
            tid,
        }
    }
}

/// A communicator as NCCL's profiler plugin saw it (row of `nccl_comms`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NcclCommRecord {
    pub comm_hash: u64,
    /// Our comm_id, when NCCL initialised the plugin inside our interposed call.
    pub comm_id: Option<u64>,
    pub comm_name: Option<SmallStr>,
    pub n_nodes: i32,
    pub nranks: i32,
    pub rank: i32,
    pub init_ns: i64,
    pub tid: i32,
    /// The profiler API version NCCL loaded our plugin as (5, 6 or 7).
    pub abi: u8,
}

/// What travels through the shim's main bounded queue (our own records).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event {
    Op(OpRecord),
    Call(CallRecord),
    Comm(CommRecord),
}

impl Event {
    /// A communicator's or a registration's record (its `comms` row, and the `calls`
    /// rows of communicator creation, destruction and buffer or window registration):
    /// what later rows depend on, so it may use the part of the queue that op and
    /// group records leave free.
    pub fn is_lifecycle(&self) -> bool {
        match self {
            Event::Op(_) => false,
            Event::Comm(_) => true,
            Event::Call(c) => !matches!(
                c.call,
                CallKind::GroupStart | CallKind::GroupEnd | CallKind::GroupSimulateEnd
            ),
        }
    }
}

/// What travels through the second queue: NCCL's profiler-plugin events. Separate so
/// that a flood of proxy events can neither crowd out `ops` rows nor make every
/// queue slot (copied on the NCCL hot path) as large as a proxy record.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "records stay heap-free: no allocation per event"
)]
pub enum PluginEvent {
    NcclOp(NcclOpRecord),
    Proxy(ProxyRecord),
    NcclComm(NcclCommRecord),
}

impl PluginEvent {
    /// A communicator as NCCL's plugin saw it (joins NCCL's commHash to `comm_id`):
    /// may use the part of the plugin queue that op and proxy events leave free.
    pub fn is_lifecycle(&self) -> bool {
        matches!(self, PluginEvent::NcclComm(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_derived_where_the_record_has_none_and_kept_where_it_has() {
        let r = OpRecord {
            count: 1024,
            dtype: 7,
            nranks: Some(8),
            ..OpRecord::blank(1, OpKind::AllGather)
        };
        assert_eq!(r.with_bytes().bytes, Some(1024 * 8 * 4));
        assert_eq!(OpRecord { bytes: Some(5), ..r }.with_bytes().bytes, Some(5));
        assert_eq!(
            OpRecord { dtype: 99, ..r }.with_bytes().bytes,
            None,
            "unknown dtype"
        );
        assert_eq!(
            OpRecord { nranks: None, ..r }.with_bytes().bytes,
            None,
            "size unknown"
        );
    }
}
