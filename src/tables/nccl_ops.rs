//! `nccl_ops`: NCCL's own view of each operation, from its profiler plugin: the
//! algorithm, protocol and channels it chose.

use crate::nccl::{PLUGIN_ALGOS, PLUGIN_FUNCS, PLUGIN_PROTOS, code_name};
use crate::record::NcclOpRecord;

crate::define_table! {
    /// One row per Coll or P2p event of NCCL's profiler plugin.
    pub struct NcclOpsTable, NcclOpsBuilder: "nccl_ops", row = NcclOpRecord;
    op_id: U64, nullable, delta, "the ops row this event belongs to (`ops.op_id`, same host and pid); NULL when it could not be joined (e.g. the plugin event came from a thread outside our call)" => |r, c| r.op_id;
    comm_hash: U64, nullable, default, "NCCL's commHash of the communicator (joins `nccl_comms`)" => |r, c| r.comm_hash;
    rank: I32, nullable, default, "rank in the communicator" => |r, c| r.rank;
    event: Utf8, required, default, "Coll (a collective) or P2p (one Send/Recv; AlltoAll, Gather and Scatter appear as several)" => |r, c| Some(if r.coll { "Coll" } else { "P2p" });
    func: Utf8, nullable, default, "function as NCCL names it: AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, Send, Recv, ..." => |r, c| code_name(&PLUGIN_FUNCS, r.func);
    seq_number: U64, nullable, delta, "Coll: NCCL's per-communicator, per-function counter (same on every rank)" => |r, c| r.seq_number;
    algo: Utf8, nullable, default, "Coll: algorithm NCCL chose (RING, TREE, NVLS, NVLS_TREE, COLLNET_DIRECT, COLLNET_CHAIN, PAT)" => |r, c| r.algo.and_then(|a| code_name(&PLUGIN_ALGOS, a));
    proto: Utf8, nullable, default, "Coll: protocol (LL, LL128, SIMPLE)" => |r, c| r.proto.and_then(|p| code_name(&PLUGIN_PROTOS, p));
    n_channels: I32, required, default, "channels (CTAs) NCCL used" => |r, c| Some(r.n_channels);
    n_warps: I32, nullable, default, "Coll: warps per channel" => |r, c| r.n_warps;
    peer: I32, nullable, default, "P2p: peer rank" => |r, c| r.peer;
    count: U64, required, default, "count as NCCL reports it (for AllGather and Broadcast NCCL converts it to bytes)" => |r, c| Some(r.count);
    dtype: I32, nullable, default, "ncclDataType_t code of the datatype NCCL reports" => |r, c| r.dtype;
    start_ns: I64, required, delta, "plugin start of the event (the launch of its plan), ns since the UNIX epoch (CLOCK_REALTIME)" => |r, c| Some(r.start_ns);
    stop_ns: I64, nullable, delta, "plugin stop: the op was enqueued (not completed), same clock; rows are written at the stop" => |r, c| r.stop_ns;
    pid: I32, required, default, "process id" => |r, c| Some(c.pid);
    tid: I32, required, default, "Linux thread id that stopped the event (the launching thread, or a CUDA host-callback thread)" => |r, c| Some(r.tid);
    host: Utf8, required, default, "host name" => |r, c| Some(&*c.host);
}
