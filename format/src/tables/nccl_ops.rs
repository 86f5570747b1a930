//! `nccl_ops`: NCCL's own view of each operation, from its profiler plugin: the
//! algorithm, protocol and channels it chose.

use crate::nccl::{CE_SYNC_STRATEGIES, PLUGIN_ALGOS, PLUGIN_FUNCS, PLUGIN_PROTOS, code_name};
use crate::record::NcclOpRecord;

crate::define_table! {
    /// One row per Coll, P2p or CeColl event of NCCL's profiler plugin.
    pub struct NcclOpsTable, NcclOpsBuilder: "nccl_ops", row = NcclOpRecord;
    op_id: U64, nullable, delta, "the ops row this event belongs to (`ops.op_id`, same host and pid); NULL when it could not be joined (e.g. the plugin event came from a thread outside our call)" => |r, c| r.op_id;
    comm_hash: U64, nullable, default, "NCCL's commHash of the communicator (joins `nccl_comms`)" => |r, c| r.comm_hash;
    rank: I32, nullable, default, "rank in the communicator" => |r, c| r.rank;
    event: Utf8, required, default, "Coll (a collective run by a kernel), P2p (one Send/Recv; AlltoAll, Gather and Scatter appear as several) or CeColl (a collective NCCL ran on the copy engine, profiler API v6+: NCCL 2.29+ for AllGather, AlltoAll, Gather and Scatter on symmetric-registered buffers within one node)" => |r, c| Some(r.event.name());
    func: Utf8, nullable, default, "function as NCCL names it: AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, Send, Recv, ..." => |r, c| code_name(&PLUGIN_FUNCS, r.func);
    seq_number: U64, nullable, delta, "Coll: NCCL's per-communicator, per-function counter (same on every rank); CeColl: the communicator's copy-engine sequence counter" => |r, c| r.seq_number;
    algo: Utf8, nullable, default, "Coll: algorithm NCCL chose (RING, TREE, NVLS, NVLS_TREE, COLLNET_DIRECT, COLLNET_CHAIN, PAT)" => |r, c| r.algo.and_then(|a| code_name(&PLUGIN_ALGOS, a));
    proto: Utf8, nullable, default, "Coll: protocol (LL, LL128, SIMPLE)" => |r, c| r.proto.and_then(|p| code_name(&PLUGIN_PROTOS, p));
    n_channels: I32, required, default, "channels (CTAs) NCCL used; 0 for CeColl (no kernel)" => |r, c| Some(r.n_channels);
    n_warps: I32, nullable, default, "Coll: warps per channel" => |r, c| r.n_warps;
    peer: I32, nullable, default, "P2p: peer rank" => |r, c| r.peer;
    count: U64, required, default, "count as NCCL reports it (for AllGather and Broadcast NCCL converts it to bytes)" => |r, c| Some(r.count);
    dtype: I32, nullable, default, "ncclDataType_t code of the datatype NCCL reports" => |r, c| r.dtype;
    start_ns: I64, required, delta, "plugin start of the event (the launch of its plan), ns since the UNIX epoch (CLOCK_REALTIME)" => |r, c| Some(r.start_ns);
    stop_ns: I64, nullable, delta, "plugin stop: the op was enqueued (not completed), same clock; rows are written at the stop" => |r, c| r.stop_ns;
    pid: I32, required, default, "process id" => |r, c| Some(c.pid);
    tid: I32, required, default, "Linux thread id that stopped the event (the launching thread, or a CUDA host-callback thread)" => |r, c| Some(r.tid);
    host: Utf8, required, default, "host name" => |r, c| Some(&*c.host);
    user_tag: U64, nullable, default, "profiler API v7 (NCCL 2.31+): the user profiler tag of the call (ncclCollConfig_t's userProfilerTag; 0 = untagged); NULL before v7 and for CeColl" => |r, c| r.user_tag;
    kernel_variant: Utf8, nullable, default, "v7 Coll: the symmetric kernel variant NCCL ran (e.g. AGxLL_R; for those NCCL reports the variant's suffix as algo and an empty proto); NULL otherwise" => |r, c| r.kernel_variant.as_ref().map(|s| s.as_str());
    is_sym_coll: Bool, nullable, default, "v7 Coll: the kernel is a symmetric-memory collective (ops.engine symmetric_kernel); NULL before v7" => |r, c| r.is_sym_coll;
    sync_strategy: Utf8, nullable, default, "CeColl: how the ranks synchronise around the copies: MC (multicast memory flags) or UC (unicast)" => |r, c| r.sync_strategy.and_then(|s| code_name(&CE_SYNC_STRATEGIES, s));
    ce_batches: U32, nullable, default, "CeColl: its CeBatch events (batches of copies NCCL launched on the copy engine)" => |r, c| r.ce_batches;
    ce_batch_ops: U64, nullable, default, "CeColl: copies in those batches (CeBatch numOps, summed)" => |r, c| r.ce_batch_ops;
    ce_batch_bytes: U64, nullable, default, "CeColl: bytes those copies move (CeBatch totalBytes, summed)" => |r, c| r.ce_batch_bytes;
    ce_syncs: U32, nullable, default, "CeColl: its CeSync events (rank synchronisations around the copies)" => |r, c| r.ce_syncs;
}
