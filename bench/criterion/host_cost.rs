//! Host-side cost of the shim per interposed NCCL call, under criterion: the C host of
//! `tests/fixtures/` calls `ncclAllReduce` on the no-op stand-in libnccl, plain and
//! with `libzcta_prof.so` preloaded. Two groups:
//! - back to back (`host bench N`, the loop timed whole; the queue is made large
//!   enough to keep every record, since the writer cannot keep up with ~4 M calls/s);
//! - one call every 5 µs (`host bench N 5000`: each call timed on its own, the
//!   program busy in between), the rate of a real program, with the default queue.
//!   Here the record's queue slot was last touched by the writer thread on another
//!   core; this is the figure to quote.
//!
//! Each sample is one host process timing N calls itself (ns per call, start-up and
//! warm-up excluded); criterion's `iter_custom` takes that (times the sample's
//! iteration count) as the sample's time. The difference of plain and shim is what the
//! shim adds. Needs a C compiler and the release shim:
//! `cargo build --release -p zcta-shim && cargo bench --bench host_cost`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};

/// Calls per host process at least: a short loop would mostly time the writer
/// thread's start-up competing for the core, not the steady per-call cost.
const MIN_CALLS: u64 = 2_000_000;
/// Calls per process at least when paced (5 µs apart: 1 s).
const MIN_PACED: u64 = 200_000;

/// `gap_ns`: None for back to back, else the pause between calls.
fn calls(host: &Path, n: u64, gap_ns: Option<u64>, shim: Option<&Path>, out: &Path) -> Duration {
    let mut c = Command::new(host);
    c.arg("bench");
    match gap_ns {
        None => c.arg(n.max(MIN_CALLS).to_string()),
        Some(g) => c.arg(n.max(MIN_PACED).to_string()).arg(g.to_string()),
    };
    if let Some(s) = shim {
        c.env("LD_PRELOAD", s).env("ZCTA_OUT", out);
        if gap_ns.is_none() {
            c.env("ZCTA_QUEUE_CAPACITY", "4194304");
        }
    }
    let o = c.output().expect("run the host");
    assert!(o.status.success(), "host bench failed: {o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    let ns: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("ns_per_call "))
        .and_then(|v| v.trim().parse().ok())
        .expect("ns_per_call in the host's output");
    Duration::from_nanos((ns * n as f64) as u64)
}

fn bench(c: &mut Criterion) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let shim = target.join("release/libzcta_prof.so");
    assert!(
        shim.exists(),
        "{} missing: cargo build --release -p zcta-shim first",
        shim.display()
    );
    let fx = tempfile::tempdir().expect("temp dir");
    let ok = Command::new("bash")
        .arg(root.join("tests/fixtures/build.sh"))
        .arg(fx.path())
        .status()
        .expect("build the fixtures");
    assert!(ok.success(), "tests/fixtures/build.sh failed");
    let host = fx.path().join("host");
    let out = fx.path().join("runs");
    let mut g = c.benchmark_group("ncclAllReduce on the stand-in libnccl");
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(10));
    g.bench_function("plain", |b| b.iter_custom(|n| calls(&host, n, None, None, &out)));
    g.bench_function("under the shim", |b| {
        b.iter_custom(|n| calls(&host, n, None, Some(&shim), &out))
    });
    g.finish();
    let mut g = c.benchmark_group("ncclAllReduce every 5 us on the stand-in libnccl");
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(30));
    g.bench_function("plain", |b| {
        b.iter_custom(|n| calls(&host, n, Some(5000), None, &out))
    });
    g.bench_function("under the shim", |b| {
        b.iter_custom(|n| calls(&host, n, Some(5000), Some(&shim), &out))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
