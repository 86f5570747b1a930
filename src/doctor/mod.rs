//! `zcta doctor`: from facts read on this machine, which data path each NCCL
//! collective family can take here, why not the faster one, and how to fix it; with
//! `--probe`, a tiny real 2-GPU run under the shim that checks the prediction.
//!
//! - [`facts`]: the [`Facts`] value and how it is read (a filesystem root, an
//!   environment map, NVML and Python behind traits — tests inject all four);
//! - [`env`]: NCCL's variables as NCCL itself reads them (environment, then
//!   `NCCL_CONF_FILE` or `~/.nccl.conf`, then `/etc/nccl.conf`; `strtoll`);
//! - [`nvml`]: the real NVML source (`nvml-wrapper`, loaded at run time);
//! - [`crate::nccl_rules`]: the copy-engine rules that differ between NCCL releases, one
//!   table with each rule's versions and source line;
//! - [`rules`]: the rules, one small function each with its citation, in tables;
//! - [`verdict`]: runs those tables from facts to a [`Report`] (paths, conditions, fixes);
//! - [`render`]: the human table and the JSON document;
//! - [`probe`]: the probe run and its comparison with the prediction.
//!
//! No NCCL, CUDA or CUPTI library is ever loaded into this process: versions are read
//! from files, and only `--probe` runs NCCL (in child processes).

pub mod env;
pub mod facts;
pub mod model;
pub mod nvml;
pub mod probe;
pub mod render;
pub mod rules;
pub mod verdict;

use std::path::PathBuf;
use std::time::Duration;

pub use facts::Facts;
pub use verdict::{EXIT_PROBE, EXIT_REQUEST_IMPOSSIBLE, Report, verdicts};

/// The interpreter to ask: `arg`, `$ZCTA_PYTHON`, else `python3`.
pub fn python_interpreter(arg: Option<String>) -> String {
    arg.filter(|s| !s.is_empty())
        .or_else(|| std::env::var("ZCTA_PYTHON").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "python3".into())
}

/// Reads the facts of this machine (root `/`, this process's environment, the real
/// NVML and Python).
pub fn gather_here(python: &str, nodes: Option<u32>) -> Facts {
    let env: std::collections::BTreeMap<String, String> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .collect();
    let root = PathBuf::from("/");
    let home = facts::home_dir(&root, &env);
    let py = facts::RealPython {
        interpreter: python.to_owned(),
        timeout: Duration::from_secs(20),
    };
    facts::gather(&facts::System {
        root,
        env,
        home,
        nvml: &nvml::RealNvml,
        python: &py,
        nodes,
    })
}

/// The exit statuses, as `zcta doctor --help` prints them (docs/doctor.md too).
pub const EXIT_CODES_HELP: &str = "\
Exit status:
  0  the report was printed; every path the environment asks for can be taken here
     (and --probe, when given, saw what was predicted)
  2  bad arguments, or the doctor itself failed (e.g. an unreadable input file)
  3  a setting asks for a path that cannot be taken here: NCCL_CTA_POLICY=2 with a
     machine condition of the copy engine missing (more than one node where the NCCL
     loaded has no copy engine across them, no CUDA P2P, cuMem off, NCCL < 2.28,
     driver < CUDA 12.5, no GPU), an NCCL_CTA_POLICY value
     NCCL ignores, or NCCL_P2P_USE_CUDA_MEMCPY / NCCL_SHM_USE_CUDA_MEMCPY where that
     transport is not used; 3 wins over 4
  4  --probe could not run (no torch, fewer than 2 GPUs, no shim, timeout, job
     failed), could not tell (GPU capture off), or saw another path than predicted";
