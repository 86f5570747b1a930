//! `zcta report` throughput: ops rows per second through the whole analysis (streamed
//! read of every rank's files, cross-rank join, phases, percentiles, findings), on a
//! synthetic run written with the real sink (`zcta::synth`: 8 ranks on 2 hosts).
//! Run: `cargo bench --bench report` (ROWS=N to change the run's size, default 1 M).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use zcta::analysis::{self, report};

fn bench(c: &mut Criterion) {
    let rows: u64 = std::env::var("ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("temp dir");
    zcta::synth::write_run(dir.path(), rows, 8, 2).expect("synthetic run");
    let mut g = c.benchmark_group("report");
    g.sample_size(10);
    g.measurement_time(std::time::Duration::from_secs(15));
    g.throughput(Throughput::Elements(rows));
    g.bench_function(format!("{rows} ops rows, 8 ranks, 2 hosts"), |b| {
        b.iter(|| {
            let mut run = analysis::load(dir.path()).expect("load");
            let r = report::build(&mut run, 450.0).expect("report");
            assert!(!r.groups.is_empty());
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
