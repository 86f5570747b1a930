//! Writer throughput: rows/s through the crash-safe sink (IPC log + Parquet), on one
//! core, with a torch-like op stream. Also prints bytes per ops row on disk. Two
//! groups: the host side only (`Writer::handle`, no GPU capture), and the same ops
//! with their GPU side filled in (the ops table's writer, as after the GPU join).
//! Run: `cargo bench --bench writer`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use zcta::gpu::{Engine, OpGpu, OpRow};
use zcta::nccl::OpKind;
use zcta::record::{Event, OpRaw, OpRecord};
use zcta::sink::{DatasetWriter, ProcessInfo, SinkPolicy, Writer};
use zcta::tables::{Ctx, OpsTable, ProcessRow};

/// A stream resembling a training step loop: a few op kinds and sizes, one
/// communicator, increasing timestamps with jitter, Send/Recv in groups.
fn workload(n: usize) -> Vec<Event> {
    let kinds = [
        OpKind::AllReduce,
        OpKind::AlltoAll,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::Send,
        OpKind::Recv,
    ];
    let sizes = [262_144u64, 1 << 20, 4 << 20, 8 << 20];
    let mut t = 1_764_477_823_000_000_000i64;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let op = kinds[i % kinds.len()];
            let start = t;
            t += 20_000 + (x % 15_000) as i64;
            let dur = 5_000 + (x >> 20) as i64 % 4_000;
            Event::Op(OpRaw::from(&OpRecord {
                comm_id: Some(0x1234_5678_9abc_def0),
                comm_ptr: 0x5555_0000_1000,
                rank: Some(3),
                nranks: Some(8),
                seq: Some(i as u64 / 2),
                call_seq: Some(i as u64),
                count: sizes[(x as usize >> 3) % sizes.len()] / 4,
                dtype: 7,
                bytes: Some(sizes[(x as usize >> 3) % sizes.len()]),
                peer: op.is_p2p().then_some(((i / 6) % 8) as i32),
                redop: (op == OpKind::AllReduce).then_some(0),
                sendbuff: 0x7f00_0000_0000 + (i as u64 % 64) * 4096,
                recvbuff: 0x7f10_0000_0000 + (i as u64 % 64) * 4096,
                stream: 0x5555_0000_2000,
                device: Some(3),
                group_id: op.is_p2p().then_some(i as u64 / 6),
                api_start_ns: start,
                api_end_ns: start + dur,
                tid: 4242,
                gpu_marked: true,
                graph_captured: Some(false),
                ..OpRecord::blank(i as u64 + 1, op)
            }))
        })
        .collect()
}

/// The same ops with a GPU side: launched 3–6 µs into the call, started on the GPU
/// 5–15 µs after the launch, running ~5 µs plus 1 µs per 200 KiB, each with jitter.
fn with_gpu(events: &[Event]) -> Vec<OpRow> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    events
        .iter()
        .filter_map(|e| match e {
            Event::Op(rec) => Some(rec.record()),
            _ => None,
        })
        .map(|rec| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let launch = rec.api_start_ns + 3_000 + (x % 3_000) as i64;
            let start = launch + 5_000 + ((x >> 16) % 10_000) as i64;
            let dur = 5_000 + (rec.bytes.unwrap_or(0) / 204_800) as i64 * 1_000 + ((x >> 32) % 2_000) as i64;
            OpRow {
                rec,
                gpu: Some(OpGpu {
                    launch_ns: Some(launch),
                    gpu_ready_ns: None,
                    gpu_start_ns: Some(start),
                    gpu_end_ns: Some(start + dur),
                    engine: Engine::SmKernel,
                    kernel: None,
                    n_kernels: 1,
                    n_memcpy: 0,
                    memcpy_bytes: 0,
                    source: zcta::gpu::GpuSourceKind::Cupti,
                }),
            }
        })
        .collect()
}

fn write_ops(dir: &std::path::Path, rows: &[OpRow], ctx: &Ctx) {
    let mut w = DatasetWriter::<OpsTable>::new(dir, "bench-p1", SinkPolicy::default());
    for r in rows {
        w.append(black_box(r), ctx).unwrap();
    }
    w.close().unwrap();
}

/// Prints the bytes of the run's ops table per row.
fn print_ops_bytes(run: &std::path::Path, what: &str, rows: usize) {
    let bytes: u64 = std::fs::read_dir(run.join("ops"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    eprintln!(
        "ops bytes on disk{what}: {bytes} for {rows} rows = {:.2} bytes/row",
        bytes as f64 / rows as f64
    );
}

fn info(dir: &std::path::Path) -> ProcessInfo {
    ProcessInfo {
        run_dir: dir.to_owned(),
        prefix: "bench-p1".into(),
        ctx: Ctx {
            pid: 1,
            host: Arc::from("bench-host"),
        },
        row: ProcessRow {
            run_id: "bench".into(),
            ..ProcessRow::default()
        },
    }
}

fn bench_writer(c: &mut Criterion) {
    const N: usize = 1_000_000;
    let events = workload(N);
    // Bytes per row on disk, once.
    {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::new(info(dir.path()), SinkPolicy::default());
        w.start().unwrap();
        for e in &events {
            w.handle(e).unwrap();
        }
        w.finish("exit", 0).unwrap();
        print_ops_bytes(dir.path(), "", N);
    }
    let mut g = c.benchmark_group("writer");
    g.throughput(Throughput::Elements(N as u64));
    g.sample_size(10);
    g.bench_function("ops_rows_1M", |b| {
        b.iter_with_large_drop(|| {
            let dir = tempfile::tempdir().unwrap();
            let mut w = Writer::new(info(dir.path()), SinkPolicy::default());
            w.start().unwrap();
            for e in &events {
                w.handle(black_box(e)).unwrap();
            }
            w.finish("exit", 0).unwrap();
            dir
        })
    });
    g.finish();

    let rows = with_gpu(&events);
    let ctx = info(std::path::Path::new("")).ctx;
    {
        let dir = tempfile::tempdir().unwrap();
        write_ops(dir.path(), &rows, &ctx);
        print_ops_bytes(dir.path(), " with the GPU side", rows.len());
    }
    let mut g = c.benchmark_group("writer");
    g.throughput(Throughput::Elements(rows.len() as u64));
    g.sample_size(10);
    g.bench_function("ops_rows_1M_with_gpu_side", |b| {
        b.iter_with_large_drop(|| {
            let dir = tempfile::tempdir().unwrap();
            write_ops(dir.path(), &rows, &ctx);
            dir
        })
    });
    g.finish();
}

criterion_group!(benches, bench_writer);
criterion_main!(benches);
