//! `nccl_comms`: communicators as NCCL's profiler plugin saw them (its `init` calls).

use crate::record::NcclCommRecord;

crate::define_table! {
    /// One row per plugin `init` (one per communicator per rank).
    pub struct NcclCommsTable, NcclCommsBuilder: "nccl_comms", row = NcclCommRecord;
    comm_hash: U64, required, default, "NCCL's commHash (same on every rank of the communicator)" => |r, c| Some(r.comm_hash);
    comm_id: U64, nullable, default, "our comm_id (`comms.comm_id`) when NCCL called init inside the interposed creating call; NULL when it ran on another thread (non-blocking or grouped init)" => |r, c| r.comm_id;
    comm_name: Utf8, nullable, default, "commName NCCL passed (first 63 bytes)" => |r, c| r.comm_name.as_ref().map(|s| s.as_str());
    n_nodes: I32, required, default, "nodes in the communicator" => |r, c| Some(r.n_nodes);
    nranks: I32, required, default, "ranks" => |r, c| Some(r.nranks);
    rank: I32, required, default, "this rank" => |r, c| Some(r.rank);
    init_ns: I64, required, default, "time of the plugin init call, ns since the UNIX epoch (CLOCK_REALTIME)" => |r, c| Some(r.init_ns);
    pid: I32, required, default, "process id" => |r, c| Some(c.pid);
    tid: I32, required, default, "Linux thread id NCCL called init on" => |r, c| Some(r.tid);
    profiler_abi: Utf8, nullable, default, "profiler plugin API version NCCL loaded the plugin as: v5 (NCCL 2.28), v6 (2.29-2.30), v7 (2.31+); NULL in files written before it existed" => |r, c| crate::nccl::profiler_abi_name(r.abi);
    host: Utf8, required, default, "host name" => |r, c| Some(&*c.host);
}
