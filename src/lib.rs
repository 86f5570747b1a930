//! zcta core: everything of zcta-prof that is safe Rust, beside the shim.
//!
//! The on-disk format — records, tables, the sink and its reader, and what the shim
//! needs to fill them (budget, clocks, CUPTI layouts, the GPU join, configuration) —
//! is the `zcta-format` crate (`format/`), which the shim links alone; its modules are
//! re-exported here under the same names. This crate adds:
//! - [`launch`]: starting a program under the shim (`zcta run`, `zcta doctor --probe`);
//! - `doctor` (feature `doctor`): which data path NCCL can take on this machine, why
//!   not the faster one, and a probe run that checks it;
//! - [`nccl_rules`]: the copy-engine rules that differ between NCCL releases, as one
//!   table (the doctor's verdicts and the report's findings follow it);
//! - [`analysis`]: the phase model, cross-rank join, `zcta report`/`diff`/`export`;
//! - [`synth`]: synthetic run directories for benchmarks and scale tests.
//!
//! `unsafe` is denied here (workspace lint) but for `launch`'s signal handling of
//! `zcta run` (`sigaction`, `kill`, `waitid`); the shim's FFI lives in `shim/src/ffi/`.

pub use zcta_format::{
    SCHEMA_VERSION, SCHEMA_VERSION_KEY, TABLE_KEY, ZCTA_VERSION, budget, clock, config, cupti, define_table,
    gpu, hash, nccl, read_view, reader, record, recover, rows, sample, sink, tables, warn, with_phase_list,
};

pub mod analysis;
#[cfg(feature = "doctor")]
pub mod doctor;
pub mod launch;
pub mod nccl_rules;
pub mod synth;
