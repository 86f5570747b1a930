//! `phases`: one row per op and rank with its phases (docs/phases.md), written by
//! `zcta phases RUN` from the other tables; not written by the shim.

/// The phase list, in window order: the one definition the `phases` table's columns
/// and, in the `zcta` crate, the analysis's `Phases` fields, `Phase` names and the
/// report's headers all expand from (`analysis/` Python and SQL are checked against it by a test). Per phase:
/// variant, `Phases` field, `phases` column, report header and its width, whether
/// the column is nullable (`unresolved` is always measured), the column's doc.
/// Hands the list to the macro `$m`.
#[doc(hidden)]
#[macro_export]
macro_rules! with_phase_list {
    ($m:ident) => {
        $m! {
            [Init, init, init_ns, "init", 6, nullable, "API entry to the first launch call; NULL: not measured"]
            [Queue, queue, queue_ns, "queue", 6, nullable, "launch call to the stream being free for the op (ops.gpu_ready_ns): waiting behind earlier work; NULL: not measured"]
            [Sync, sync, sync_ns, "sync", 6, nullable, "stream free (ops.gpu_ready_ns) to GPU start: NCCL's stream synchronisation and the kernel's launch on the GPU (copy engine: its flag waits too); NULL: not measured"]
            [Barrier, barrier, barrier_ns, "barrier", 7, nullable, "own GPU start to the last rank's GPU start (host clocks aligned); NULL: not every rank's data"]
            [Transfer, transfer, transfer_ns, "transfer", 8, nullable, "GPU time after the barrier not in memcpy or proxy; NULL: not measured"]
            [Memcpy, memcpy, memcpy_ns, "memcpy", 6, nullable, "proxy-thread copies after the barrier; NULL: not measured"]
            [Proxy, proxy, proxy_ns, "proxy", 5, nullable, "ProxyStep network waits after the barrier (not counted in memcpy); NULL: no profiler plugin, or the barrier not measured (not every rank's data)"]
            [Unresolved, unresolved, unresolved_ns, "unres", 6, required, "window time of phases that could not be told apart (window = sum of the measured phases + this)"]
        }
    };
}

/// One op with its phases, and the host name it ran on.
#[derive(Clone, Debug)]
pub struct PhaseRow {
    pub host: std::sync::Arc<str>,
    pub pid: i32,
    pub op_id: u64,
    /// NCCL function name (`ops.op`).
    pub op: &'static str,
    pub rank: Option<i32>,
    pub comm_id: Option<u64>,
    pub seq: Option<u64>,
    pub bytes: Option<u64>,
    /// `ops.engine`.
    pub engine: Option<&'static str>,
    /// `gpu_end_ns - api_start_ns`; `None` without GPU times.
    pub window: Option<i64>,
    /// Each phase's value, in the list's order (`None`: not measured).
    pub phases: [Option<i64>; N_PHASE_COLUMNS],
}

/// The table, its phase columns expanded from the phase list.
macro_rules! phases_table {
    ($( [$V:ident, $f:ident, $col:ident, $header:literal, $width:literal, $null:ident, $doc:literal] )*) => {
        /// Position of each phase in [`PhaseRow::phases`].
        #[allow(dead_code)]
        #[derive(Clone, Copy)]
        enum At {
            $( $V, )*
        }

        /// Phase columns of the table (the list's length).
        pub const N_PHASE_COLUMNS: usize = [$( stringify!($f) ),*].len();

        crate::define_table! {
            /// One row per op and rank: its phases.
            pub struct PhasesTable, PhasesBuilder: "phases", row = PhaseRow;
            host: Utf8, required, default, "host name" => |r, c| Some(&*r.host);
            pid: I32, required, default, "process id" => |r, c| Some(r.pid);
            op_id: U64, required, default, "joins ops.op_id (with host, pid)" => |r, c| Some(r.op_id);
            op: Utf8, required, default, "NCCL function (ops.op)" => |r, c| Some(r.op);
            rank: I32, nullable, default, "rank in the communicator" => |r, c| r.rank;
            comm_id: U64, nullable, default, "communicator id (ops.comm_id)" => |r, c| r.comm_id;
            seq: U64, nullable, default, "ops.seq" => |r, c| r.seq;
            bytes: U64, nullable, default, "nccl-tests bytes (ops.bytes)" => |r, c| r.bytes;
            engine: Utf8, nullable, default, "ops.engine (NULL: not known: the op not timed, timed with stamps where NCCL's events did not name the path, or in deep mode CUPTI off or the op not sampled; ops.engine says when)" => |r, c| r.engine;
            window_ns: I64, nullable, default, "gpu_end_ns - api_start_ns; NULL without GPU times (then every phase is NULL)" => |r, c| r.window;
            $( $col: I64, $null, default, $doc => |r, c| r.phases[At::$V as usize]; )*
        }
    };
}

crate::with_phase_list!(phases_table);
