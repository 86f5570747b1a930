//! `calls`: one row per NCCL control call — groups, communicator lifecycle and
//! buffer registration — per rank.

use crate::record::CallRecord;

crate::define_table! {
    /// One row per NCCL control call.
    pub struct CallsTable, CallsBuilder: "calls", row = CallRecord;
    call: Utf8, required, default, "NCCL function without the `nccl` prefix: GroupStart, GroupEnd, GroupSimulateEnd, CommInitRank, CommInitRankConfig, CommInitRankScalable, CommInitAll, CommSplit, CommShrink, CommFinalize, CommDestroy, CommAbort, CommRegister, CommDeregister, CommWindowRegister, CommWindowDeregister" => |r, c| Some(r.call.name());
    comm_id: U64, nullable, default, "communicator the call acts on (for init/split/shrink: the communicator created; NULL when none was)" => |r, c| r.comm_id;
    comm_ptr: U64, nullable, default, "address of that ncclComm_t" => |r, c| r.comm_ptr;
    group_id: U64, nullable, delta, "GroupStart/GroupEnd/GroupSimulateEnd: the id of the outermost group the call opens, closes or is nested in (see `ops.group_id`); NULL where no group was open (a GroupEnd without a GroupStart, a refused outermost GroupStart); the outermost GroupStart's row is written when its group closes, with the group's ops (a process that ends inside a group writes neither)" => |r, c| r.group_id;
    n_ops: U32, nullable, default, "GroupEnd/GroupSimulateEnd: number of ops recorded in the group" => |r, c| r.n_ops;
    buff: U64, nullable, default, "registration: buffer address" => |r, c| r.buff;
    size: U64, nullable, default, "registration: buffer size in bytes; CommInitAll: number of devices" => |r, c| r.size;
    handle: U64, nullable, default, "registration handle or ncclWindow_t (register and deregister rows share it)" => |r, c| r.handle;
    flags: I32, nullable, default, "CommWindowRegister: winFlags (1 = NCCL_WIN_COLL_SYMMETRIC); CommShrink: shrinkFlags; CommSplit: colour" => |r, c| r.flags;
    api_start_ns: I64, required, delta, "entry into the call, ns since the UNIX epoch (CLOCK_REALTIME)" => |r, c| Some(r.api_start_ns);
    api_end_ns: I64, required, delta, "return from the call, same clock" => |r, c| Some(r.api_end_ns);
    result: I32, required, default, "ncclResult_t returned to the caller" => |r, c| Some(r.result);
    pid: I32, required, default, "process id" => |r, c| Some(c.pid);
    tid: I32, required, default, "Linux thread id of the caller" => |r, c| Some(r.tid);
    host: Utf8, required, default, "host name" => |r, c| Some(&*c.host);
}
