//! zcta-prof's on-disk format and the safe parts the shim is built from:
//!
//! - [`record`]: the fixed-size records the shim produces on the hot path;
//! - [`tables`]: one module per output table (row struct + Arrow schema + builder,
//!   and typed read views of its columns);
//! - [`sink`]: the writer side — a crash-safe Parquet dataset writer (WAL + rolling
//!   segments) and the writer loop that drains the shim's bounded queue;
//! - [`reader`]: reading a run directory back, tolerating leftovers;
//! - [`recover`]: turning the write-ahead logs of a killed process into Parquet;
//! - [`cupti`]: CUPTI activity record layouts and their safe decoder;
//! - [`gpu`]: joining GPU activities to ops (external correlation, proxy rule);
//! - [`rows`]: the rows of the `ops` and `gpu` tables that the join makes;
//! - [`streams`]: stream readiness from CUPTI's event and stream-wait records;
//! - [`budget`]: which ops get their GPU side timed, under a cost budget;
//! - [`config`]: settings read from the environment, run-id derivation;
//! - [`sample`]: sampled detail windows (`ZCTA_SAMPLE`);
//! - [`clock`], [`hash`], [`nccl`]: the project's clock, stable ids, NCCL's names.
//!
//! `unsafe` is denied here (workspace lint); the only FFI lives in `shim/src/ffi/`.

pub mod budget;
pub mod clock;
pub mod config;
pub mod cupti;
pub mod files;
pub mod gpu;
pub mod hash;
pub mod nccl;
pub mod reader;
pub mod record;
pub mod recover;
pub mod rows;
pub mod sample;
pub mod sink;
pub mod tables;

/// Where [`warn`]'s lines go instead of stderr ([`set_warn_writer`]).
static WARN_WRITER: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Sends [`warn`]'s lines (each ending in a newline) to `f`: the shim's, which writes
/// them so that the host program sees no change (a closed pipe, a reused descriptor).
pub fn set_warn_writer(f: fn(&str)) {
    let _ = WARN_WRITER.set(f);
}

/// Prints one `zcta: ...` line on stderr. Never panics (unlike `eprintln!`, which
/// does when stderr is a closed pipe): code running inside the host process must not.
pub fn warn(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    match WARN_WRITER.get() {
        Some(f) => f(&format!("zcta: {args}\n")),
        None => {
            let _ = writeln!(std::io::stderr(), "zcta: {args}");
        }
    }
}

/// Version of the on-disk layout (tables, columns, units). Stored in every Parquet
/// file's key-value metadata under [`SCHEMA_VERSION_KEY`]. Bump on any incompatible
/// change and teach [`reader`] about the old one.
/// History: 1 — first release; 2 — `gpu` table, GPU columns in `ops`, CUPTI columns
/// in `process` (files of version 1 read with those columns NULL). Nullable columns
/// added since (`ops.gpu_ready_ns`, `phases.sync_ns`, `process.gpu_sampling`,
/// `process.profiler_abi`, the v6/v7 columns of `nccl_ops`, …) read
/// as NULL from older files and are ignored by older readers, so they keep version 2.
pub const SCHEMA_VERSION: u32 = 2;
/// Parquet key-value metadata key holding [`SCHEMA_VERSION`].
pub const SCHEMA_VERSION_KEY: &str = "zcta.schema_version";
/// Parquet key-value metadata key holding the table name.
pub const TABLE_KEY: &str = "zcta.table";
/// Version of this crate, written to the `process` table.
pub const ZCTA_VERSION: &str = env!("CARGO_PKG_VERSION");
