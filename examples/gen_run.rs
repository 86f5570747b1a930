//! Writes a synthetic run directory for scale tests of `zcta report`:
//! `cargo run --release --example gen_run -- DIR ROWS [RANKS] [HOSTS]`.
//! ROWS ops rows in total over RANKS ranks (default 8) on HOSTS hosts (default 2, the
//! second one's clock 3 ms ahead): see `zcta::synth::write_run`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().collect();
    let parsed = (|| {
        let dir = PathBuf::from(a.get(1)?);
        let rows: u64 = a.get(2)?.parse().ok()?;
        let ranks: i32 = a.get(3).map_or(Some(8), |s| s.parse().ok())?;
        let hosts: i32 = a.get(4).map_or(Some(2), |s| s.parse().ok())?;
        Some((dir, rows, ranks, hosts))
    })();
    let Some((dir, rows, ranks, hosts)) = parsed else {
        eprintln!("usage: gen_run DIR ROWS [RANKS] [HOSTS]");
        return ExitCode::from(2);
    };
    match zcta::synth::write_run(&dir, rows, ranks, hosts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen_run: {e}");
            ExitCode::FAILURE
        }
    }
}
