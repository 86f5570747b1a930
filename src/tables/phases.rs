//! `phases`: one row per op and rank with its phases (docs/phases.md), written by
//! `zcta phases RUN` from the other tables; not written by the shim.

use crate::analysis::OpView;
use crate::analysis::phases::Phases;

/// One op with its phases, and the host name it ran on.
#[derive(Clone, Debug)]
pub struct PhaseRow {
    pub host: std::sync::Arc<str>,
    pub op: OpView,
    pub phases: Phases,
}

crate::define_table! {
    /// One row per op and rank: its phases.
    pub struct PhasesTable, PhasesBuilder: "phases", row = PhaseRow;
    host: Utf8, required, default, "host name" => |r, c| Some(&*r.host);
    pid: I32, required, default, "process id" => |r, c| Some(r.op.pid);
    op_id: U64, required, default, "joins ops.op_id (with host, pid)" => |r, c| Some(r.op.op_id);
    op: Utf8, required, default, "NCCL function (ops.op)" => |r, c| Some(r.op.op);
    rank: I32, nullable, default, "rank in the communicator" => |r, c| r.op.rank;
    comm_id: U64, nullable, default, "communicator id (ops.comm_id)" => |r, c| r.op.comm_id;
    seq: U64, nullable, default, "ops.seq" => |r, c| r.op.seq;
    bytes: U64, nullable, default, "nccl-tests bytes (ops.bytes)" => |r, c| r.op.bytes;
    engine: Utf8, nullable, default, "ops.engine (NULL: not measured: CUPTI off or the op not sampled)" => |r, c| r.op.engine;
    window_ns: I64, nullable, default, "gpu_end_ns - api_start_ns; NULL without GPU times (then every phase is NULL)" => |r, c| r.phases.window;
    init_ns: I64, nullable, default, "API entry to the first launch call; NULL: not measured" => |r, c| r.phases.init;
    queue_ns: I64, nullable, default, "launch call to the stream being free for the op (ops.gpu_ready_ns): waiting behind earlier work; NULL: not measured" => |r, c| r.phases.queue;
    sync_ns: I64, nullable, default, "stream free (ops.gpu_ready_ns) to GPU start: NCCL's stream synchronisation and the kernel's launch on the GPU (copy engine: its flag waits too); NULL: not measured" => |r, c| r.phases.sync;
    barrier_ns: I64, nullable, default, "own GPU start to the last rank's GPU start (host clocks aligned); NULL: not every rank's data" => |r, c| r.phases.barrier;
    transfer_ns: I64, nullable, default, "GPU time after the barrier not in memcpy or proxy; NULL: not measured" => |r, c| r.phases.transfer;
    memcpy_ns: I64, nullable, default, "proxy-thread copies after the barrier; NULL: not measured" => |r, c| r.phases.memcpy;
    proxy_ns: I64, nullable, default, "ProxyStep network waits after the barrier (not counted in memcpy); NULL: no profiler plugin" => |r, c| r.phases.proxy;
    unresolved_ns: I64, required, default, "window time of phases that could not be told apart (window = sum of the measured phases + this)" => |r, c| Some(r.phases.unresolved);
}
