//! `ops`: one row per NCCL data-moving call (collective or point-to-point) per rank.

use crate::nccl::OpKind;
use crate::rows::OpRow;

crate::define_table! {
    /// One row per NCCL operation call on one rank.
    pub struct OpsTable, OpsBuilder: "ops", row = OpRow;
    op_id: U64, required, delta, "id of this call, unique within the process (host, pid) and increasing in call order on each thread (each thread takes its ids in blocks: across threads they are not in call order); joins `nccl_ops.op_id` and `proxy.op_id`" => |r, c| Some(r.op_id);
    op: Utf8, required, default, "NCCL function without the `nccl` prefix: AllReduce, Broadcast, Bcast, Reduce, AllGather, ReduceScatter, AlltoAll, Gather, Scatter, Send, Recv" => |r, c| Some(r.op.name());
    rank: I32, nullable, default, "rank of this process in the communicator (NULL: communicator unknown, e.g. a NULL comm)" => |r, c| r.rank;
    nranks: I32, nullable, default, "number of ranks in the communicator" => |r, c| r.nranks;
    comm_id: U64, nullable, default, "communicator id, identical on every rank of the communicator (hash of its ncclUniqueId(s); derived from the parent for split/shrunk ones); joins `comms`" => |r, c| r.comm_id;
    comm_ptr: U64, required, default, "address of the ncclComm_t in this process" => |r, c| Some(r.comm_ptr);
    seq: U64, nullable, delta, "collectives: 0-based index of this collective on the communicator, identical on every rank, so (comm_id, seq) joins one collective across ranks. Send/Recv: index among this rank's sends to (receives from) `peer` on the communicator, so a Send joins its Recv on (comm_id, seq, rank=Recv.peer, peer=Recv.rank). NULL when NCCL rejected the call, or when its group was not run (ncclGroupSimulateEnd, or a failed ncclGroupEnd)" => |r, c| r.seq;
    call_seq: U64, nullable, delta, "0-based index of this call among all calls on the communicator by this rank (local issue order); NULL when the communicator is unknown (e.g. a NULL comm)" => |r, c| r.call_seq;
    count: U64, required, default, "the count argument, in elements (sendcount for AllGather, recvcount for ReduceScatter, per-peer count for AlltoAll)" => |r, c| Some(r.count);
    dtype: I32, required, default, "ncclDataType_t code (0 int8, 1 uint8, 2 int32, 3 uint32, 4 int64, 5 uint64, 6 float16, 7 float32, 8 float64, 9 bfloat16, 10 float8e4m3, 11 float8e5m2)" => |r, c| Some(r.dtype);
    bytes: U64, nullable, default, "message size in bytes as nccl-tests counts it: count×size for AllReduce/Broadcast/Bcast/Reduce/Send/Recv; count×nranks×size for AllGather, ReduceScatter, AlltoAll, Gather, Scatter. NULL for an unknown dtype" => |r, c| r.bytes;
    peer: I32, nullable, default, "Send/Recv: the peer rank" => |r, c| r.peer;
    root: I32, nullable, default, "Broadcast/Bcast/Reduce/Gather/Scatter: the root rank" => |r, c| r.root;
    redop: I32, nullable, default, "AllReduce/Reduce/ReduceScatter: ncclRedOp_t (0 sum, 1 prod, 2 max, 3 min, 4 avg, ≥5 user-created)" => |r, c| r.redop;
    sendbuff: U64, required, default, "send buffer address (0 for Recv)" => |r, c| Some(r.sendbuff);
    recvbuff: U64, required, default, "receive buffer address (0 for Send; Bcast: the single buffer)" => |r, c| Some(r.recvbuff);
    stream: U64, required, default, "cudaStream_t address (0: the legacy default stream)" => |r, c| Some(r.stream);
    device: I32, nullable, default, "CUDA device of the communicator (ncclCommCuDevice)" => |r, c| r.device;
    group_id: U64, nullable, delta, "id shared by the ops issued between one outermost ncclGroupStart/ncclGroupEnd on this thread; NULL outside groups; joins `calls.group_id`" => |r, c| r.group_id;
    api_start_ns: I64, required, delta, "entry into the NCCL call, ns since the UNIX epoch (CLOCK_REALTIME; read through the CPU's time-stamp counter where it is invariant: docs/phases.md, Clocks)" => |r, c| Some(r.api_start_ns);
    api_end_ns: I64, required, delta, "return from the NCCL call, same clock" => |r, c| Some(r.api_end_ns);
    result: I32, required, default, "ncclResult_t returned to the caller (0 success, 4 invalid argument, 5 invalid usage, 7 in progress, ...)" => |r, c| Some(r.result);
    graph_captured: Bool, nullable, default, "the call was made on a stream capturing a CUDA graph (NCCL's CollApi/P2pApi profiler event said so, or the timing's capture check of the launching call's stream, `cuStreamIsCapturing`, made for a call the budget selected, before anything is recorded there): its GPU work runs at each launch of the graph, which zcta does not join to ops, so its GPU columns are NULL (not measured). NULL when neither said (NCCL's events did not reach zcta — its profiler plugin not loaded, the op not selected by the budget, NCCL's events off: ZCTA_SAMPLE outside a window, or a collective on a one-rank communicator, which NCCL runs without events — and the check not made: timing off, or the launching call not selected by the budget, which then touches neither its stream nor the driver)" => |r, c| r.graph_captured;
    timing: Utf8, nullable, default, "whether the op's GPU side was timed with zcta's GPU stamps on its stream (the default GPU capture, docs/phases.md): timed; budget (not timed by the budget, ZCTA_BUDGET: not selected at its level, timing_level, or selected while the budget's rate limiter had no room, in a burst; its stream's capture was not asked, so graph_captured says it only where NCCL's events did); graph_capture (selected by the budget, and its stream was being captured into a CUDA graph: nothing is launched there); pool_empty (no free slot pair); error (the call failed, or the driver refused a call); streams (its group's ops ran on several streams); in_progress (the call returned ncclInProgress, a non-blocking communicator: NCCL launches the work after the call returns, which stamps around the call cannot time); off (timing off in the process, process.gpu_timing says why; or its group was closed by ncclGroupSimulateEnd, which launches nothing). NULL in files written before it existed" => |r, c| Some(r.timing.timing.name());
    timing_level: U32, nullable, default, "the budget's level when the op was timed or skipped: a rank times the ops whose key hash has its lowest timing_level bits zero, 1 in 2^timing_level, the same ops on every rank at a level, and every op of a sparser level at denser ones (so a timed op stands for 2^timing_level ops); NULL when not asked" => |r, c| r.timing.timing.level().map(u32::from);
    launch_ns: I64, nullable, delta, "entry into NCCL's launch of the op's GPU work, CLOCK_REALTIME: NCCL's KernelLaunch profiler event (default), or CUPTI's record of the launching CUDA call (deep mode: cuLaunchKernelEx; cudaMemcpyBatchAsync on the copy-engine path); NULL when neither reported it (no profiler plugin, a one-rank shortcut that launches nothing, GPU side not measured)" => |r, c| r.gpu.as_ref().and_then(|g| g.launch_ns);
    gpu_ready_ns: I64, nullable, delta, "when the op's stream was free for it: the GPU time (%globaltimer) of zcta's stamp launched on the op's stream at the entry of its launching call (everything ahead of it on that stream, and what the stream was made to wait for, was done); before launch_ns when the stream was idle. On CLOCK_REALTIME through anchors (process.gpu_clock_error_ns). NULL when not timed (timing)" => |r, c| r.gpu.as_ref().and_then(|g| g.gpu_ready_ns);
    gpu_start_ns: I64, nullable, delta, "deep mode: start of the op's NCCL kernels (without a kernel, its DtoD/PtoP copies), from CUPTI's records; ops of one group share the group's. NULL in the default mode (stamps do not see a kernel start), or when not measured" => |r, c| r.gpu.as_ref().and_then(|g| g.gpu_start_ns);
    gpu_end_ns: I64, nullable, delta, "when the op's stream was done with it: the GPU time of zcta's stamp launched on its stream after its launching call returned (deep mode without that stamp: the end of its kernels or copies); same clock" => |r, c| r.gpu.as_ref().and_then(|g| g.gpu_end_ns);
    engine: Utf8, nullable, default, "what moved the bytes: sm_kernel, symmetric_kernel (ncclSymk kernels), copy_engine (no kernel; copy-engine DtoD/PtoP copies), proxy_memcpy (kernels plus copies issued by NCCL's proxy thread), none (deep mode: nothing attributed by the time the row was written: a failed call, an empty group, or GPU work that ended more than ZCTA_GPU_HOLD_MS later). How it was known: gpu_source. In the default mode it is NCCL's word, from its profiler events during the launching call: sm_kernel from a Coll or P2p plan, copy_engine from a CeColl (profiler API v6, NCCL 2.29+), symmetric_kernel from a Coll with isSymColl (v7, NCCL 2.31+); NULL there otherwise (unknown: e.g. the copy-engine path on NCCL 2.28, proxy_memcpy, which only deep mode tells). NULL too when not measured — not timed (timing), CUPTI off in deep mode (process.cupti says why), called outside ZCTA_SAMPLE's windows, or captured into a CUDA graph (graph_captured)" => |r, c| r.gpu.as_ref().and_then(|g| g.engine.column());
    gpu_source: Utf8, nullable, default, "how the GPU columns were measured: events (zcta's two GPU stamps on the op's stream, a one-thread %globaltimer kernel; CUDA events in files written before stamps replaced them; engine from NCCL's profiler events: Coll/P2p, CeColl, isSymColl) or cupti (deep mode: CUPTI's kernel and copy records, with the stamps' ready and end when timed too); NULL when not measured" => |r, c| r.gpu.as_ref().map(|g| g.source.name());
    kernel: Utf8, nullable, default, "deep mode: first NCCL kernel of the op (demangled name)" => |r, c| r.gpu.as_ref().and_then(|g| g.kernel.as_deref());
    n_kernels: U32, nullable, default, "deep mode: NCCL kernels attributed to the op (its group's, for a grouped op); NULL when not measured (as engine) and in the default mode" => |r, c| r.gpu.as_ref().filter(|g| g.source == crate::gpu::GpuSourceKind::Cupti).map(|g| g.n_kernels);
    n_memcpy: U32, nullable, default, "deep mode: copies attributed to it (copy-engine, proxy and communicator-setup copies); NULL when not measured and in the default mode" => |r, c| r.gpu.as_ref().filter(|g| g.source == crate::gpu::GpuSourceKind::Cupti).map(|g| g.n_memcpy);
    memcpy_bytes: U64, nullable, default, "deep mode: bytes of those copies; NULL when not measured and in the default mode" => |r, c| r.gpu.as_ref().filter(|g| g.source == crate::gpu::GpuSourceKind::Cupti).map(|g| g.memcpy_bytes);
    pid: I32, required, default, "process id" => |r, c| Some(c.pid);
    tid: I32, required, default, "Linux thread id (gettid) of the calling thread" => |r, c| Some(r.tid);
    host: Utf8, required, default, "host name" => |r, c| Some(&*c.host);
}

impl OpsTable {
    /// Decodes the `op` column value.
    pub fn parse_op(s: &str) -> Option<OpKind> {
        OpKind::from_name(s)
    }
}
