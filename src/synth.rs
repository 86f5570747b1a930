//! Synthetic run directories for benchmarks and scale tests of the analysis
//! (`examples/gen_run.rs`, `bench/criterion/report.rs`), written with the real sink.

use std::path::Path;

use crate::gpu::{Engine, OpGpu, OpRow};
use crate::nccl::OpKind;
use crate::record::OpRecord;
use crate::sink::{DatasetWriter, SinkError, SinkPolicy, write_process_file};
use crate::tables::{Ctx, OpsTable, ProcessRow};

/// Writes `rows` ops rows in total over `ranks` ranks on `hosts` hosts (the second
/// host's clock 3 ms ahead) into `dir`: collectives of 5 kinds, each with its own size
/// (1 KiB … 64 MiB), with GPU times, 1 ms apart, rank 5's GPU work starting 30 µs
/// late. Every rank is written by its own thread. `ranks` and `hosts` are at least 1.
pub fn write_run(dir: &Path, rows: u64, ranks: i32, hosts: i32) -> Result<(), SinkError> {
    let (ranks, hosts) = (ranks.max(1), hosts.max(1));
    let per_rank = rows / ranks as u64;
    let kinds = [
        OpKind::AllReduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::AlltoAll,
        OpKind::Broadcast,
    ];
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..ranks)
            .map(|r| {
                s.spawn(move || -> Result<(), SinkError> {
                    let host_idx = r * hosts / ranks;
                    let host = format!("host{host_idx}");
                    let skew = i64::from(host_idx) * 3_000_000;
                    let pid = 1000 + r;
                    let prefix = format!("{host}-r{r}-p{pid}");
                    let ctx = Ctx {
                        pid,
                        host: host.clone().into(),
                    };
                    let mut w = DatasetWriter::<OpsTable>::new(dir, &prefix, SinkPolicy::default());
                    for k in 0..per_rank {
                        let t0 = 1_700_000_000_000_000_000i64 + k as i64 * 1_000_000;
                        let size = 1u64 << (10 + (k % 5) * 4);
                        let late = if r == 5 { 30_000 } else { i64::from(r) * 100 };
                        let start = t0 + 20_000 + late;
                        let end = t0 + 60_000 + (size / 200) as i64;
                        let row = OpRow {
                            rec: OpRecord {
                                comm_id: Some(0xABC),
                                comm_ptr: 0x1000,
                                rank: Some(r),
                                nranks: Some(ranks),
                                seq: Some(k),
                                call_seq: Some(k),
                                count: size / 4,
                                dtype: 7,
                                bytes: Some(size),
                                sendbuff: 0x7000_0000,
                                recvbuff: 0x8000_0000,
                                stream: 0x55,
                                device: Some(r % 8),
                                api_start_ns: t0 + skew,
                                api_end_ns: t0 + skew + 8_000,
                                tid: pid,
                                gpu_marked: true,
                                graph_captured: Some(false),
                                ..OpRecord::blank(k + 1, kinds[(k % 5) as usize])
                            },
                            gpu: Some(OpGpu {
                                launch_ns: Some(t0 + skew + 5_000),
                                gpu_ready_ns: Some(start + skew - 5_000),
                                gpu_start_ns: Some(start + skew),
                                gpu_end_ns: Some(end + skew),
                                engine: Engine::SmKernel,
                                kernel: None,
                                n_kernels: 1,
                                n_memcpy: 0,
                                memcpy_bytes: 0,
                                source: crate::gpu::GpuSourceKind::Cupti,
                            }),
                        };
                        w.append(&row, &ctx)?;
                    }
                    w.close()?;
                    let row = ProcessRow {
                        run_id: "scale".into(),
                        run_id_source: "ZCTA_RUN_ID".into(),
                        zcta_version: "gen_run".into(),
                        schema_version: crate::SCHEMA_VERSION,
                        clock: "CLOCK_REALTIME".into(),
                        end_reason: "exit".into(),
                        env_json: "{}".into(),
                        profiler_plugin: "zcta".into(),
                        plugin_comms: 1,
                        cupti: "on".into(),
                        ..ProcessRow::default()
                    };
                    write_process_file(dir, &prefix, &row, &ctx)
                })
            })
            .collect();
        writers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}
