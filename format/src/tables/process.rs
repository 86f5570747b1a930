//! `process`: one row per recording process: versions, environment, clock, how it
//! ended and what was lost.

crate::define_table! {
    /// One row per process that recorded anything.
    pub struct ProcessTable, ProcessBuilder: "process", row = ProcessRow;
    run_id: Utf8, required, default, "run id (the run directory's name)" => |r, c| Some(r.run_id.as_str());
    run_id_source: Utf8, required, default, "where the run id came from: ZCTA_RUN_ID, TORCHELASTIC_RUN_ID, torchrun-parent, SLURM, PMIX_NAMESPACE, multiprocessing-parent, time" => |r, c| Some(r.run_id_source.as_str());
    host: Utf8, required, default, "host name" => |r, c| Some(&*c.host);
    pid: I32, required, default, "process id" => |r, c| Some(c.pid);
    ppid: I32, required, default, "parent process id" => |r, c| Some(r.ppid);
    rank_env: I32, nullable, default, "global rank from the launcher's environment (RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, PMI_RANK, PMIX_RANK)" => |r, c| r.rank_env;
    exe: Utf8, nullable, default, "executable path" => |r, c| r.exe.as_deref();
    cmdline: Utf8, nullable, default, "command line, arguments separated by spaces" => |r, c| r.cmdline.as_deref();
    zcta_version: Utf8, required, default, "zcta-prof version" => |r, c| Some(r.zcta_version.as_str());
    schema_version: U32, required, default, "schema version of the files written" => |r, c| Some(r.schema_version);
    nccl_version: I32, nullable, default, "ncclGetVersion of the forwarded-to library (22809 = 2.28.9)" => |r, c| r.nccl_version;
    nccl_lib: Utf8, nullable, default, "path of the libnccl the calls were forwarded to" => |r, c| r.nccl_lib.as_deref();
    clock: Utf8, required, default, "clock of every *_ns column: CLOCK_REALTIME (ns since the UNIX epoch)" => |r, c| Some(r.clock.as_str());
    start_ns: I64, required, default, "activation time (first NCCL call)" => |r, c| Some(r.start_ns);
    end_ns: I64, nullable, default, "time the writer finished; NULL when the process died before (row recovered from the log)" => |r, c| r.end_ns;
    end_reason: Utf8, required, default, "exit (atexit ran), _exit (os._exit-style), exec (the process replaced itself through execve, execv, execvp or execvpe), error (a table could not be written, e.g. a full disk, or the shim hit an internal error and stopped recording; see write_errors), or killed (the process ended without either, e.g. SIGKILL; row restored by `zcta recover`)" => |r, c| Some(r.end_reason.as_str());
    env_json: Utf8, required, default, "JSON object of the NCCL_*, ZCTA_*, TORCH_NCCL_*, TORCHELASTIC_*, SLURM_*, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_MAX_CONNECTIONS, LD_PRELOAD and launcher variables (RANK, LOCAL_RANK, WORLD_SIZE, …, PMIX_NAMESPACE) at activation" => |r, c| Some(r.env_json.as_str());
    ops_rows: U64, required, default, "ops rows this process wrote (for a killed process: the rows recovered)" => |r, c| Some(r.ops_rows);
    calls_rows: U64, required, default, "calls rows, likewise" => |r, c| Some(r.calls_rows);
    comms_rows: U64, required, default, "comms rows, likewise" => |r, c| Some(r.comms_rows);
    records_dropped: U64, nullable, default, "records not written because the queue was full, the writer failed, or recording stopped after an internal error (never silently: each one is counted here); NULL for a killed process (unknown)" => |r, c| r.records_dropped;
    profiler_plugin: Utf8, required, default, "NCCL profiler plugin: zcta (the shim set NCCL_PROFILER_PLUGIN to itself; `zcta (developer setting: event mask 0x…)` under ZCTA_NCCL_MASK), user:<value> (the user's plugin was left in place: no NCCL view), `off: ZCTA_NCCL_PLUGIN=0`" => |r, c| Some(r.profiler_plugin.as_str());
    plugin_comms: U64, required, default, "communicators for which NCCL initialised our plugin (0 with profiler_plugin = zcta: NCCL did not load it)" => |r, c| Some(r.plugin_comms);
    profiler_abi: Utf8, nullable, default, "profiler plugin API version NCCL loaded the plugin as (the newest it knows of the shim's three): v5 (NCCL 2.28: Coll/P2p, proxy events), v6 (2.29-2.30: also copy-engine collectives, CeColl), v7 (2.31+: also user tags, kernel variants, symmetric kernels); the last communicator's when several differ; NULL when NCCL did not load it (plugin_comms = 0) and in files written before it existed" => |r, c| r.profiler_abi.as_deref();
    cupti: Utf8, required, default, "GPU capture: on (CUPTI activity records joined to ops; `on (developer settings: …)` when ZCTA_CUPTI_KINDS or ZCTA_CUPTI_CALLBACKS changed what is captured), off: <why> (ZCTA_CUPTI=0, libcupti not found, no communicator created, another CUPTI client such as torch.profiler or Nsight was active, CUPTI error …), or stopped: <why> (capture ended early; rows after that have NULL GPU columns)" => |r, c| Some(r.cupti.as_str());
    cupti_lib: Utf8, nullable, default, "path of the libcupti used (the copy already loaded in the process when there was one)" => |r, c| r.cupti_lib.as_deref();
    cupti_version: U32, nullable, default, "cuptiGetVersion (CUPTI API version, e.g. 130001)" => |r, c| r.cupti_version;
    gpu_clock: Utf8, nullable, default, "clock of GPU timestamps: CLOCK_REALTIME when cuptiGetTimestamp agreed with it at start (offset in gpu_clock_offset_ns); NULL when CUPTI was off" => |r, c| r.gpu_clock.as_deref();
    gpu_clock_offset_ns: I64, nullable, default, "cuptiGetTimestamp minus CLOCK_REALTIME measured at start (ns)" => |r, c| r.gpu_clock_offset_ns;
    gpu_rows: U64, nullable, default, "gpu rows written; NULL when CUPTI was off" => |r, c| r.gpu_rows;
    cupti_dropped: U64, nullable, default, "activity records CUPTI dropped (cuptiActivityGetNumDroppedRecords, plus buffers refused when zcta's buffer memory was at its limit); NULL when CUPTI was off" => |r, c| r.cupti_dropped;
    gpu_foreign: U64, nullable, default, "GPU activities seen that were not NCCL's (the program's own kernels and copies; dropped)" => |r, c| r.gpu_foreign;
    ops_without_gpu: U64, nullable, default, "ops written with engine none: no GPU activity had arrived for them when their row was written" => |r, c| r.ops_without_gpu;
    gpu_inconsistent: U64, nullable, default, "GPU activities dropped because they started more than 1 ms before the CUDA call their correlation id names (a wrong correlation; seen when CUPTI was switched off and on under load, see docs/dev/cupti.md); NULL when CUPTI was off" => |r, c| r.gpu_inconsistent;
    gpu_sampling: Utf8, nullable, default, "ZCTA_SAMPLE's windows, e.g. `1000 ms of every 10000 ms (windows aligned to CLOCK_REALTIME)`: only ops called in them have their GPU side joined (NCCL's events run from 50 ms before a window until its work is done, so ops called then may have nccl_ops/proxy rows too); NULL: every op (the default)" => |r, c| r.gpu_sampling.as_deref();
    ops_unsampled: U64, nullable, default, "ops written with their GPU columns NULL (not measured) because CUPTI's capture was off for them: called outside the sampling windows, or CUPTI's kinds went off during their call or before their work launched (a call that outlived its window, or that a pause or CUPTI's hand-over to another client overtook; what was recorded of it stays in `gpu` with its op_id); NULL with CUPTI off" => |r, c| r.ops_unsampled;
    ops_graph_captured: U64, nullable, default, "ops captured into a CUDA graph (ops.graph_captured), written with their GPU columns NULL (not measured); the NCCL kernels of the graph's launches are gpu rows with attribution graph_launch and no op. NULL with CUPTI and timing off" => |r, c| r.ops_graph_captured;
    gpu_timing: Utf8, nullable, default, "per-op GPU timing with GPU stamps (the default GPU capture; CUDA events in files written before stamps replaced them): `on (GPU stamps, budget 1% of wall time, level now k)`, `on (GPU stamps, every op: ZCTA_BUDGET=all)`, or off: <why> (ZCTA_GPU=off, no CUDA driver in the process, no communicator created); NULL in files written before it existed" => |r, c| r.gpu_timing.as_deref();
    ops_timed: U64, nullable, default, "launching calls (ungrouped ops and outermost ncclGroupEnds) timed with a pair of GPU stamps, counted from the ops rows written (a group once), so it agrees with ops.timing; NULL with timing off" => |r, c| r.ops_timed;
    timing_captured: U64, nullable, default, "launching calls the budget selected that were not timed because their stream was being captured into a CUDA graph (nothing is recorded into a capturing stream; a call not selected is not asked)" => |r, c| r.timing_captured;
    timing_pool_empty: U64, nullable, default, "launching calls not timed because no slot pair was free (counted, never waited for)" => |r, c| r.timing_pool_empty;
    timing_errors: U64, nullable, default, "driver calls of the timing that failed (the op is then not timed)" => |r, c| r.timing_errors;
    ops_timing_lost: U64, nullable, default, "timed launching calls whose event times never reached the writer (the GPU did not finish them within the hold, or the process ended first)" => |r, c| r.ops_timing_lost;
    gpu_clock_error_ns: I64, nullable, default, "largest error of a GPU time put on CLOCK_REALTIME: its clock anchor's (half the host-time bracket around the anchor's GPU time, from releasing zcta's anchor kernel to seeing its time; where the driver gave no anchor kernel or no try of it answered, from launching a stamp to seeing it written; plus the host clock's largest disagreement with CLOCK_REALTIME). A ready time waits for the anchor after it and is placed on the line through the two around it: off by at most the larger of their errors; its end keeps the op's GPU duration, off by the drift over it too. A time that did not wait (a hold, ZCTA_GPU_HOLD_MS, under 200 ms, with which times are placed as soon as they are read; a wait of half the hold that ran out; the process ending when that anchor did not answer) is placed from the anchor nearest its call: off by that anchor's error and the most drift two consecutive anchors allow (their disagreement plus both their errors, over the GPU timer's time between them) over its distance from it on that timer. NULL when no GPU time was placed, and where times were placed from a clock's only anchor (its later anchors, the end's included, did not answer): their drift was not measured, so no bound is known (gpu_clock_drift_ns_per_s is NULL too)" => |r, c| r.gpu_clock_error_ns;
    gpu_clock_drift_ns_per_s: I64, nullable, default, "largest disagreement between the GPU's timer and CLOCK_REALTIME from one anchor to the next, beyond the anchors' errors, in ns per second (anchors are renewed every 0.5 s, sooner for an op waiting for one, and once more at the end; gpu_clock_error_ns holds the most drift the anchors allow where it matters); NULL when no two anchors were compared" => |r, c| r.gpu_clock_drift_ns_per_s;
    write_errors: Utf8, nullable, default, "first write error, with the path; then `rows not written: TABLE N, ...` (rows each table lost, counted in records_dropped) and `rows left in write-ahead logs for `zcta recover`: TABLE, ...` (tables whose Parquet file could not be written)" => |r, c| r.write_errors.as_deref();
}

/// The `process` row (built by the writer, not on the hot path).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessRow {
    pub run_id: String,
    pub run_id_source: String,
    pub ppid: i32,
    pub rank_env: Option<i32>,
    pub exe: Option<String>,
    pub cmdline: Option<String>,
    pub zcta_version: String,
    pub schema_version: u32,
    pub nccl_version: Option<i32>,
    pub nccl_lib: Option<String>,
    pub clock: String,
    pub start_ns: i64,
    pub end_ns: Option<i64>,
    pub end_reason: String,
    pub env_json: String,
    pub ops_rows: u64,
    pub calls_rows: u64,
    pub comms_rows: u64,
    pub records_dropped: Option<u64>,
    pub write_errors: Option<String>,
    pub cupti: String,
    pub cupti_lib: Option<String>,
    pub cupti_version: Option<u32>,
    pub gpu_clock: Option<String>,
    pub gpu_clock_offset_ns: Option<i64>,
    pub gpu_rows: Option<u64>,
    pub cupti_dropped: Option<u64>,
    pub gpu_foreign: Option<u64>,
    pub ops_without_gpu: Option<u64>,
    pub gpu_inconsistent: Option<u64>,
    pub gpu_sampling: Option<String>,
    pub ops_unsampled: Option<u64>,
    pub ops_graph_captured: Option<u64>,
    pub gpu_timing: Option<String>,
    pub ops_timed: Option<u64>,
    pub timing_captured: Option<u64>,
    pub timing_pool_empty: Option<u64>,
    pub timing_errors: Option<u64>,
    pub ops_timing_lost: Option<u64>,
    pub gpu_clock_error_ns: Option<i64>,
    pub gpu_clock_drift_ns_per_s: Option<i64>,
    pub profiler_plugin: String,
    pub plugin_comms: u64,
    pub profiler_abi: Option<String>,
}
