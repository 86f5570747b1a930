//! Writes a synthetic run directory for scale tests of `zcta report`:
//! `cargo run --release --example gen_run -- DIR ROWS [RANKS] [HOSTS]`.
//! ROWS ops rows in total over RANKS ranks (default 8) on HOSTS hosts (default 2, the
//! second one's clock 3 ms ahead): collectives of 5 sizes with GPU times, rank 5 late.
//! Every rank is written by its own thread with the real sink.

use std::path::PathBuf;

use zcta::gpu::{Engine, OpGpu, OpRow};
use zcta::nccl::OpKind;
use zcta::record::OpRecord;
use zcta::sink::{DatasetWriter, SinkPolicy, write_process_file};
use zcta::tables::{Ctx, OpsTable, ProcessRow};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 3 {
        eprintln!("usage: gen_run DIR ROWS [RANKS] [HOSTS]");
        std::process::exit(2);
    }
    let dir = PathBuf::from(&a[1]);
    let rows: u64 = a[2].parse().expect("ROWS");
    let ranks: i32 = a.get(3).map_or(8, |s| s.parse().expect("RANKS"));
    let hosts: i32 = a.get(4).map_or(2, |s| s.parse().expect("HOSTS"));
    let per_rank = rows / ranks as u64;
    let kinds = [
        OpKind::AllReduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::AlltoAll,
        OpKind::Broadcast,
    ];
    std::thread::scope(|s| {
        for r in 0..ranks {
            let dir = dir.clone();
            s.spawn(move || {
                let host_idx = r * hosts / ranks;
                let host = format!("host{host_idx}");
                let skew = i64::from(host_idx) * 3_000_000;
                let pid = 1000 + r;
                let prefix = format!("{host}-r{r}-p{pid}");
                let ctx = Ctx {
                    pid,
                    host: host.clone().into(),
                };
                let mut w = DatasetWriter::<OpsTable>::new(&dir, &prefix, SinkPolicy::default());
                for k in 0..per_rank {
                    let t0 = 1_700_000_000_000_000_000i64 + k as i64 * 1_000_000;
                    let size = 1u64 << (10 + (k % 5) * 4);
                    let late = if r == 5 { 30_000 } else { i64::from(r) * 100 };
                    let start = t0 + 20_000 + late;
                    let end = t0 + 60_000 + (size / 200) as i64;
                    let row = OpRow {
                        rec: OpRecord {
                            op_id: k + 1,
                            op: kinds[(k % 5) as usize],
                            comm_id: Some(0xABC),
                            comm_ptr: 0x1000,
                            rank: Some(r),
                            nranks: Some(ranks),
                            seq: Some(k),
                            call_seq: Some(k),
                            count: size / 4,
                            dtype: 7,
                            bytes: Some(size),
                            peer: None,
                            root: None,
                            redop: None,
                            sendbuff: 0x7000_0000,
                            recvbuff: 0x8000_0000,
                            stream: 0x55,
                            device: Some(r % 8),
                            group_id: None,
                            api_start_ns: t0 + skew,
                            api_end_ns: t0 + skew + 8_000,
                            result: 0,
                            tid: pid,
                        },
                        gpu: Some(OpGpu {
                            launch_ns: Some(t0 + skew + 5_000),
                            gpu_start_ns: Some(start + skew),
                            gpu_end_ns: Some(end + skew),
                            engine: Engine::SmKernel,
                            kernel: None,
                            n_kernels: 1,
                            n_memcpy: 0,
                            memcpy_bytes: 0,
                        }),
                    };
                    w.append(&row, &ctx).expect("append");
                }
                w.close().expect("close");
                let row = ProcessRow {
                    run_id: "scale".into(),
                    run_id_source: "ZCTA_RUN_ID".into(),
                    zcta_version: "gen_run".into(),
                    schema_version: zcta::SCHEMA_VERSION,
                    clock: "CLOCK_REALTIME".into(),
                    end_reason: "exit".into(),
                    env_json: "{}".into(),
                    profiler_plugin: "zcta".into(),
                    plugin_comms: 1,
                    cupti: "on".into(),
                    ..ProcessRow::default()
                };
                write_process_file(&dir, &prefix, &row, &ctx).expect("process row");
            });
        }
    });
}
