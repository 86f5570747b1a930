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
    /// The GPU side the hot path measured itself (GPU stamps, NCCL's launch event).
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

/// An op's row as the shim's hot path writes it into the queue: the facts of an
/// [`OpRecord`] as plain integers, each optional one marked present by a bit of
/// `present` rather than by an `Option`'s tag, so that building or copying one is a
/// few wide stores. The writer expands it ([`OpRaw::record`]); the two convert into
/// each other without loss.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpRaw {
    pub op_id: u64,
    pub comm_id: u64,
    pub comm_ptr: u64,
    pub seq: u64,
    pub call_seq: u64,
    pub count: u64,
    pub bytes: u64,
    pub sendbuff: u64,
    pub recvbuff: u64,
    pub stream: u64,
    pub group_id: u64,
    pub api_start_ns: i64,
    pub api_end_ns: i64,
    pub launch_ns: i64,
    pub dtype: i32,
    pub peer: i32,
    pub root: i32,
    pub redop: i32,
    pub rank: i32,
    pub nranks: i32,
    pub device: i32,
    pub result: i32,
    pub tid: i32,
    /// Which optional fields hold a value ([`OpRaw::COMM_ID`] and the rest), and the
    /// two flags ([`OpRaw::GPU_MARKED`], [`OpRaw::GRAPH_CAPTURED`]).
    pub present: u16,
    pub op: OpKind,
    pub timing: Timing,
    pub nccl_engine: PlanEngine,
}

impl OpRaw {
    pub const COMM_ID: u16 = 1;
    pub const SEQ: u16 = 1 << 1;
    pub const CALL_SEQ: u16 = 1 << 2;
    pub const BYTES: u16 = 1 << 3;
    pub const PEER: u16 = 1 << 4;
    pub const ROOT: u16 = 1 << 5;
    pub const REDOP: u16 = 1 << 6;
    pub const RANK: u16 = 1 << 7;
    pub const NRANKS: u16 = 1 << 8;
    pub const DEVICE: u16 = 1 << 9;
    pub const GROUP_ID: u16 = 1 << 10;
    pub const LAUNCH_NS: u16 = 1 << 11;
    /// `graph_captured` is known; its value is [`OpRaw::GRAPH_CAPTURED`].
    pub const CAPTURE_KNOWN: u16 = 1 << 12;
    pub const GRAPH_CAPTURED: u16 = 1 << 13;
    pub const GPU_MARKED: u16 = 1 << 14;

    /// The bit of `present` for `v`, and its value or zero.
    #[inline(always)]
    pub fn opt<T: Default>(v: Option<T>, bit: u16) -> (T, u16) {
        match v {
            Some(v) => (v, bit),
            None => (T::default(), 0),
        }
    }

    #[inline(always)]
    fn get<T: Copy>(&self, v: T, bit: u16) -> Option<T> {
        (self.present & bit != 0).then_some(v)
    }

    /// `graph_captured` as the bits of `present` hold it.
    #[inline(always)]
    pub fn capture_bits(v: Option<bool>) -> u16 {
        match v {
            None => 0,
            Some(false) => Self::CAPTURE_KNOWN,
            Some(true) => Self::CAPTURE_KNOWN | Self::GRAPH_CAPTURED,
        }
    }

    /// The row this stands for.
    pub fn record(&self) -> OpRecord {
        OpRecord {
            op_id: self.op_id,
            op: self.op,
            comm_id: self.get(self.comm_id, Self::COMM_ID),
            comm_ptr: self.comm_ptr,
            rank: self.get(self.rank, Self::RANK),
            nranks: self.get(self.nranks, Self::NRANKS),
            seq: self.get(self.seq, Self::SEQ),
            call_seq: self.get(self.call_seq, Self::CALL_SEQ),
            count: self.count,
            dtype: self.dtype,
            bytes: self.get(self.bytes, Self::BYTES),
            peer: self.get(self.peer, Self::PEER),
            root: self.get(self.root, Self::ROOT),
            redop: self.get(self.redop, Self::REDOP),
            sendbuff: self.sendbuff,
            recvbuff: self.recvbuff,
            stream: self.stream,
            device: self.get(self.device, Self::DEVICE),
            group_id: self.get(self.group_id, Self::GROUP_ID),
            api_start_ns: self.api_start_ns,
            api_end_ns: self.api_end_ns,
            result: self.result,
            tid: self.tid,
            gpu_marked: self.present & Self::GPU_MARKED != 0,
            graph_captured: self.get(self.present & Self::GRAPH_CAPTURED != 0, Self::CAPTURE_KNOWN),
            timing: OpTiming {
                timing: self.timing,
                launch_ns: self.get(self.launch_ns, Self::LAUNCH_NS),
                nccl_engine: self.nccl_engine,
            },
        }
    }
}

impl From<&OpRecord> for OpRaw {
    fn from(r: &OpRecord) -> Self {
        let (comm_id, b0) = Self::opt(r.comm_id, Self::COMM_ID);
        let (seq, b1) = Self::opt(r.seq, Self::SEQ);
        let (call_seq, b2) = Self::opt(r.call_seq, Self::CALL_SEQ);
        let (bytes, b3) = Self::opt(r.bytes, Self::BYTES);
        let (peer, b4) = Self::opt(r.peer, Self::PEER);
        let (root, b5) = Self::opt(r.root, Self::ROOT);
        let (redop, b6) = Self::opt(r.redop, Self::REDOP);
        let (rank, b7) = Self::opt(r.rank, Self::RANK);
        let (nranks, b8) = Self::opt(r.nranks, Self::NRANKS);
        let (device, b9) = Self::opt(r.device, Self::DEVICE);
        let (group_id, b10) = Self::opt(r.group_id, Self::GROUP_ID);
        let (launch_ns, b11) = Self::opt(r.timing.launch_ns, Self::LAUNCH_NS);
        let marked = if r.gpu_marked { Self::GPU_MARKED } else { 0 };
        OpRaw {
            op_id: r.op_id,
            comm_id,
            comm_ptr: r.comm_ptr,
            seq,
            call_seq,
            count: r.count,
            bytes,
            sendbuff: r.sendbuff,
            recvbuff: r.recvbuff,
            stream: r.stream,
            group_id,
            api_start_ns: r.api_start_ns,
            api_end_ns: r.api_end_ns,
            launch_ns,
            dtype: r.dtype,
            peer,
            root,
            redop,
            rank,
            nranks,
            device,
            result: r.result,
            tid: r.tid,
            present: b0
                | b1
                | b2
                | b3
                | b4
                | b5
                | b6
                | b7
                | b8
                | b9
                | b10
                | b11
                | marked
                | Self::capture_bits(r.graph_captured),
            op: r.op,
            timing: r.timing.timing,
            nccl_engine: r.timing.nccl_engine,
        }
    }
}

/// Whether an op's launch was timed with GPU stamps, and why not.
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
    /// The driver refused a call (an unusual stream, an error), the call failed, or
    /// the stream began capturing during the call (no end stamp launched).
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
    Op(OpRaw),
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

    use proptest::prelude::*;

    fn timing() -> impl Strategy<Value = Timing> {
        prop_oneof![
            Just(Timing::Off),
            any::<u8>().prop_map(Timing::Timed),
            any::<u8>().prop_map(Timing::Skipped),
            Just(Timing::Captured),
            Just(Timing::PoolEmpty),
            Just(Timing::Error),
            Just(Timing::Streams),
            Just(Timing::InProgress),
        ]
    }

    fn engine() -> impl Strategy<Value = PlanEngine> {
        prop_oneof![
            Just(PlanEngine::Unknown),
            Just(PlanEngine::CopyEngine),
            Just(PlanEngine::SymmetricKernel),
            Just(PlanEngine::SmKernel),
        ]
    }

    prop_compose! {
        fn record()(
            ids in any::<(u64, Option<u64>, u64, Option<u64>, Option<u64>, u64)>(),
            bufs in any::<(Option<u64>, u64, u64, u64, Option<u64>)>(),
            ints in any::<(Option<i32>, Option<i32>, i32, Option<i32>, Option<i32>, Option<i32>, Option<i32>)>(),
            times in any::<(i64, i64, i32, i32, bool, Option<bool>, Option<i64>)>(),
            op in 0..OpKind::ALL.len(),
            timing in timing(),
            nccl_engine in engine(),
        ) -> OpRecord {
            OpRecord {
                op_id: ids.0,
                op: OpKind::ALL[op],
                comm_id: ids.1,
                comm_ptr: ids.2,
                seq: ids.3,
                call_seq: ids.4,
                count: ids.5,
                bytes: bufs.0,
                sendbuff: bufs.1,
                recvbuff: bufs.2,
                stream: bufs.3,
                group_id: bufs.4,
                rank: ints.0,
                nranks: ints.1,
                dtype: ints.2,
                peer: ints.3,
                root: ints.4,
                redop: ints.5,
                device: ints.6,
                api_start_ns: times.0,
                api_end_ns: times.1,
                result: times.2,
                tid: times.3,
                gpu_marked: times.4,
                graph_captured: times.5,
                timing: OpTiming { timing, launch_ns: times.6, nccl_engine },
            }
        }
    }

    proptest! {
        /// The hot path's form of a row stands for exactly the row: every field, every
        /// absent value and both flags come back.
        #[test]
        fn a_row_and_its_raw_form_convert_into_each_other_without_loss(r in record()) {
            prop_assert_eq!(OpRaw::from(&r).record(), r);
        }
    }
}
