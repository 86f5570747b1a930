//! `phases`: one row per op and rank with its phases (docs/phases.md), written by
//! `zcta phases RUN` from the other tables; not written by the shim.

use crate::analysis::OpView;
use crate::analysis::phases::{Phase, Phases};

/// One op with its phases, and the host name it ran on.
#[derive(Clone, Debug)]
pub struct PhaseRow {
    pub host: std::sync::Arc<str>,
    pub op: OpView,
    pub phases: Phases,
}

/// The table, its phase columns expanded from the phase list.
macro_rules! phases_table {
    ($( [$V:ident, $f:ident, $col:ident, $header:literal, $width:literal, $null:ident, $doc:literal] )*) => {
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
            $( $col: I64, $null, default, $doc => |r, c| r.phases.get(Phase::$V); )*
        }
    };
}

crate::with_phase_list!(phases_table);
