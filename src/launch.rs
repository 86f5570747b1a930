//! Starting a program under the shim: where `libzcta_prof.so` is, and the environment
//! that preloads it and names the run. Shared by `zcta run` and `zcta doctor --probe`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The shim to preload: `arg` (`--shim`), `$ZCTA_SHIM`, or `libzcta_prof.so` next to
/// the running executable (a build's `target/release/`), else in `../lib/` from it (the
/// wheel's layout: `bin/zcta` and `lib/libzcta_prof.so` under the environment's prefix).
/// Err says what is missing and how to fix it.
pub fn find_shim(arg: Option<PathBuf>) -> Result<PathBuf, String> {
    let cand = arg
        .or_else(|| std::env::var_os("ZCTA_SHIM").map(PathBuf::from))
        .or_else(|| {
            let dir = std::env::current_exe().ok()?.parent()?.to_path_buf();
            let here = dir.join("libzcta_prof.so");
            let installed = dir.join("..").join("lib").join("libzcta_prof.so");
            Some(if !here.is_file() && installed.is_file() {
                installed
            } else {
                here
            })
        });
    match cand {
        Some(p) if p.is_file() => Ok(std::fs::canonicalize(&p).unwrap_or(p)),
        Some(p) => Err(format!(
            "{}: no such file (build it with `cargo build --release --workspace`, or pass --shim / set ZCTA_SHIM)",
            p.display()
        )),
        None => Err("cannot tell where libzcta_prof.so is: pass --shim or set ZCTA_SHIM".into()),
    }
}

/// A fresh run id: `run-<UNIX seconds>-<pid>`.
pub fn default_run_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("run-{now}-{}", std::process::id())
}

/// `LD_PRELOAD` with the shim first and the caller's own preloads kept after it.
pub fn preload_value(shim: &Path) -> OsString {
    let mut preload = shim.as_os_str().to_owned();
    if let Some(prev) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(prev);
    }
    preload
}

/// Sets what makes `cmd` (and every child it starts) record into `out/run_id`.
pub fn under_shim<'c>(cmd: &'c mut Command, shim: &Path, out: &Path, run_id: &str) -> &'c mut Command {
    cmd.env("LD_PRELOAD", preload_value(shim))
        .env("ZCTA_OUT", out)
        .env("ZCTA_RUN_ID", run_id)
}
