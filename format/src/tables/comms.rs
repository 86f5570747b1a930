//! `comms`: one row per communicator per rank, written when its creation returns.

use crate::record::CommRecord;

crate::define_table! {
    /// One row per communicator per rank.
    pub struct CommsTable, CommsBuilder: "comms", row = CommRecord;
    comm_id: U64, required, default, "communicator id, identical on every rank (see `ops.comm_id`)" => |r, c| Some(r.comm_id);
    comm_ptr: U64, required, default, "address of the ncclComm_t in this process" => |r, c| Some(r.comm_ptr);
    rank: I32, nullable, default, "this process's rank in it; NULL when the creating call did not say it and NCCL could not be asked then (a split or shrink inside a group, or of a non-blocking communicator: NCCL initialises it later); its ops rows carry it" => |r, c| r.rank;
    nranks: I32, nullable, default, "number of ranks; NULL as rank is" => |r, c| r.nranks;
    device: I32, nullable, default, "CUDA device (ncclCommCuDevice)" => |r, c| r.device;
    parent_comm_id: U64, nullable, default, "CommSplit/CommShrink: the parent communicator" => |r, c| r.parent_comm_id;
    init: Utf8, required, default, "creating function: CommInitRank, CommInitRankConfig, CommInitRankScalable, CommInitAll, CommSplit, CommShrink" => |r, c| Some(r.init.name());
    color: I32, nullable, default, "CommSplit: colour" => |r, c| r.color;
    key: I32, nullable, default, "CommSplit: key" => |r, c| r.key;
    comm_name: Utf8, nullable, default, "ncclConfig_t.commName when given (first 63 bytes)" => |r, c| r.comm_name.as_ref().map(|s| s.as_str());
    blocking: I32, nullable, default, "ncclConfig_t.blocking when set" => |r, c| r.blocking;
    cta_policy: I32, nullable, default, "ncclConfig_t.CTAPolicy when set (2 = NCCL_CTA_POLICY_ZERO)" => |r, c| r.cta_policy;
    init_start_ns: I64, required, default, "entry into the creating call, ns since the UNIX epoch (CLOCK_REALTIME)" => |r, c| Some(r.init_start_ns);
    init_end_ns: I64, required, default, "return from it, same clock; init duration = init_end_ns - init_start_ns" => |r, c| Some(r.init_end_ns);
    result: I32, required, default, "ncclResult_t of the creating call" => |r, c| Some(r.result);
    nccl_version: I32, nullable, default, "ncclGetVersion of the library the call was forwarded to (e.g. 22809)" => |r, c| r.nccl_version;
    pid: I32, required, default, "process id" => |r, c| Some(c.pid);
    tid: I32, required, default, "Linux thread id of the caller" => |r, c| Some(r.tid);
    host: Utf8, required, default, "host name" => |r, c| Some(&*c.host);
}
