//! Records produced on the hot path. All are `Copy` and heap-free: building one and
//! pushing it into the bounded queue must not allocate. Per-process constants (pid,
//! host) are not repeated here; the writer adds them (see [`crate::tables::Ctx`]).
//!
//! `Option` fields are written as SQL NULL: NULL means "not known", never 0.

use crate::nccl::{CallKind, OpKind};

/// One NCCL data-moving operation (row of `ops`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpRecord {
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

/// Everything that travels through the shim's bounded queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event {
    Op(OpRecord),
    Call(CallRecord),
    Comm(CommRecord),
}
