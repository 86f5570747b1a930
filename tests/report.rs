//! `zcta report` on golden run directories written with the real sink: several hosts
//! with skewed clocks, a straggling rank, copy-engine requests that fell back, missing
//! and corrupt files.

use std::path::{Path, PathBuf};
use std::process::Command;

use zcta::gpu::{Engine, OpGpu, OpRow};
use zcta::nccl::OpKind;
use zcta::record::{NcclCommRecord, OpRecord};
use zcta::sink::{DatasetWriter, SinkPolicy, write_process_file};
use zcta::tables::{Ctx, NcclCommsTable, OpsTable, ProcessRow};

const US: i64 = 1_000;
/// Host B's clock runs 3 ms ahead of host A's.
const SKEW: i64 = 3_000 * US;

struct Rank {
    host: &'static str,
    pid: i32,
    rank: i32,
    skew: i64,
}

impl Rank {
    /// The file prefix and writer context of this rank's process.
    fn files(&self) -> (String, Ctx) {
        let prefix = format!("{}-r{}-p{}", self.host, self.rank, self.pid);
        let ctx = Ctx {
            pid: self.pid,
            host: self.host.into(),
        };
        (prefix, ctx)
    }
}

const RANKS: [Rank; 4] = [
    Rank {
        host: "hostA",
        pid: 100,
        rank: 0,
        skew: 0,
    },
    Rank {
        host: "hostA",
        pid: 101,
        rank: 1,
        skew: 0,
    },
    Rank {
        host: "hostB",
        pid: 200,
        rank: 2,
        skew: SKEW,
    },
    Rank {
        host: "hostB",
        pid: 201,
        rank: 3,
        skew: SKEW,
    },
];

fn op(r: &Rank, op_id: u64, kind: OpKind, seq: u64, bytes: u64, t: [i64; 4], stream: u64) -> OpRow {
    let s = r.skew;
    OpRow {
        rec: OpRecord {
            comm_id: Some(0xC0),
            comm_ptr: 0x1000,
            rank: Some(r.rank),
            nranks: Some(4),
            seq: Some(seq),
            call_seq: Some(seq),
            count: bytes / 4,
            dtype: 7,
            bytes: Some(bytes),
            sendbuff: 0x7000_0000,
            recvbuff: 0x8000_0000,
            stream,
            device: Some(r.rank % 2),
            api_start_ns: t[0] + s,
            api_end_ns: t[0] + s + 5 * US,
            tid: r.pid,
            gpu_marked: true,
            graph_captured: Some(false),
            ..OpRecord::blank(op_id, kind)
        },
        gpu: Some(OpGpu {
            launch_ns: Some(t[1] + s),
            // The stream is free halfway between the launch call and the kernel.
            gpu_ready_ns: Some(t[1] + s + (t[2] - t[1]) / 2),
            gpu_start_ns: Some(t[2] + s),
            gpu_end_ns: Some(t[3] + s),
            engine: Engine::SmKernel,
            kernel: None,
            n_kernels: 1,
            n_memcpy: 0,
            memcpy_bytes: 0,
            source: zcta::gpu::GpuSourceKind::Cupti,
        }),
    }
}

/// Writes a 4-rank run: 50 AllReduce of 16 MiB in which rank 3 starts 40 µs after the
/// others, then 20 AlltoAll of 1 MiB on the default stream with NCCL_CTA_POLICY=2.
fn golden(dir: &Path) {
    golden_with(dir, 0, Engine::SmKernel, 0, None);
}

/// [`golden`] with AllReduce's GPU work `slower` ns longer, AlltoAll on `a2a_engine`, and
/// rank 3's first `rank3_unmeasured` AllReduce without a GPU side (as under sampling),
/// and `nccl`: (`ncclGetVersion`, nodes) the processes and NCCL's plugin said.
fn golden_with(dir: &Path, slower: i64, a2a_engine: Engine, rank3_unmeasured: u64, nccl: Option<(i32, i32)>) {
    for (i, r) in RANKS.iter().enumerate() {
        let (prefix, ctx) = r.files();
        let mut w = DatasetWriter::<OpsTable>::new(dir, &prefix, SinkPolicy::default());
        for k in 0..50u64 {
            let t0 = 1_000_000_000_000 + k as i64 * 1_000 * US;
            let start = t0 + 10 * US + if r.rank == 3 { 40 * US } else { i as i64 * US };
            let row = op(
                r,
                k + 1,
                OpKind::AllReduce,
                k,
                16 << 20,
                [t0, t0 + 2 * US, start, t0 + 200 * US + slower],
                0x55,
            );
            let mut row = row;
            if r.rank == 3 && k < rank3_unmeasured {
                row.gpu = None;
            }
            w.append(&row, &ctx).unwrap();
        }
        for k in 0..20u64 {
            let t0 = 2_000_000_000_000 + k as i64 * 1_000 * US;
            let row = op(
                r,
                100 + k,
                OpKind::AlltoAll,
                50 + k,
                1 << 20,
                [t0, t0 + 3 * US, t0 + 20 * US, t0 + 80 * US],
                0,
            );
            let mut row = row;
            if let Some(g) = row.gpu.as_mut() {
                g.engine = a2a_engine;
            }
            w.append(&row, &ctx).unwrap();
        }
        w.close().unwrap();
        if let Some((_, nodes)) = nccl {
            let mut w = DatasetWriter::<NcclCommsTable>::new(dir, &prefix, SinkPolicy::default());
            let comm = NcclCommRecord {
                comm_hash: 0xC0,
                comm_id: Some(0xC0),
                comm_name: None,
                n_nodes: nodes,
                nranks: 4,
                rank: r.rank,
                init_ns: 1_000_000_000_000,
                tid: r.pid,
                abi: 5,
            };
            w.append(&comm, &ctx).unwrap();
            w.close().unwrap();
        }
        let row = ProcessRow {
            nccl_version: nccl.map(|n| n.0),
            env_json: r#"{"NCCL_CTA_POLICY":"2"}"#.into(),
            profiler_plugin: "zcta".into(),
            plugin_comms: 1,
            gpu_sampling: (rank3_unmeasured > 0)
                .then(|| "50 ms of every 250 ms (windows aligned to CLOCK_REALTIME)".into()),
            ..process_row("golden", "on")
        };
        write_process_file(dir, &prefix, &row, &ctx).unwrap();
    }
}

/// A process row of a finished run: `run_id`, `cupti` as given, the rest as a test
/// run's.
fn process_row(run_id: &str, cupti: &str) -> ProcessRow {
    ProcessRow {
        run_id: run_id.into(),
        run_id_source: "ZCTA_RUN_ID".into(),
        zcta_version: "test".into(),
        schema_version: zcta::SCHEMA_VERSION,
        clock: "CLOCK_REALTIME".into(),
        end_reason: "exit".into(),
        env_json: "{}".into(),
        cupti: cupti.into(),
        ..ProcessRow::default()
    }
}

/// What follows "N rows" in the note of a file with rows left out for a time out of
/// range, and for impossible bytes.
const TIME_OUT: &str = "left out: a time outside 1970..2116";
const BYTES_OUT: &str = "left out: bytes of 2^62 (4 EiB) or more on a call that succeeded";

/// Whether `err` (a command's stderr) names `file` as skipped with a note starting
/// with `what`.
fn named(err: &str, file: &Path, what: &str) -> bool {
    let head = format!("zcta: skipped {}: {what}", file.display());
    err.lines().any(|l| l.starts_with(&head))
}

fn zcta(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zcta"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs each of `cmds` on a run with damaged rows: each must exit 1 without a panic
/// and pass `check(its command, its stderr, what to print on failure)`. Their outputs,
/// in order.
fn each_names_damage(cmds: &[Vec<&str>], check: impl Fn(&str, &str, &str)) -> Vec<String> {
    cmds.iter()
        .map(|args| {
            let (code, out, err) = zcta(args);
            let what = format!("zcta {args:?} exited {code}, stderr:\n{err}");
            assert!(!err.contains("panicked at"), "{what}");
            check(args[0], &err, &what);
            assert_eq!(code, 1, "{what}");
            out
        })
        .collect()
}

fn run_dir() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("golden");
    golden(&d);
    (t, d)
}

fn json(dir: &Path) -> serde_json::Value {
    let (code, out, err) = zcta(&["report", dir.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// The report's finding whose title starts with `title`.
fn finding<'a>(j: &'a serde_json::Value, title: &str) -> &'a serde_json::Value {
    j["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["title"].as_str().unwrap().starts_with(title))
        .unwrap_or_else(|| panic!("no finding {title:?}: {j}"))
}

fn group<'a>(j: &'a serde_json::Value, op: &str) -> &'a serde_json::Value {
    groups_of(j, op)[0]
}

/// The report's groups (sizes) of `op`, in its order.
fn groups_of<'a>(j: &'a serde_json::Value, op: &str) -> Vec<&'a serde_json::Value> {
    j["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["op"] == op)
        .collect()
}

/// A run left with its ops files alone (the process, calls, gpu and proxy tables
/// lost, as after a crash before they were written) still has its hosts' clocks
/// aligned from the ops rows, so its barrier is measured: the hosts come from the ops
/// files, not only from the other tables.
#[test]
fn clocks_from_the_ops_files_alone() {
    let (_t, dir) = run_dir();
    for t in [
        "process",
        "calls",
        "gpu",
        "proxy",
        "comms",
        "nccl_ops",
        "nccl_comms",
    ] {
        let _ = std::fs::remove_dir_all(dir.join(t));
    }
    let (code, out, err) = zcta(&["report", dir.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let notes: Vec<&str> = j["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let b = notes.iter().find(|n| n.starts_with("host hostB"));
    assert!(b.is_some_and(|b| b.contains("+3000.0 us ± 0.0 us")), "{notes:?}");
    let ar = group(&j, "AllReduce");
    let shares = ar["shares"].as_object().unwrap();
    let window = 4.0 * 200.0;
    let barrier = (50.0 - 10.0) + (50.0 - 11.0) + (50.0 - 12.0) + 0.0;
    assert!(
        (shares["barrier"].as_f64().unwrap_or(f64::NAN) - barrier / window).abs() < 1e-9,
        "{shares:?}"
    );
}

#[test]
fn phases_clocks_and_stragglers_from_the_data() {
    let (_t, dir) = run_dir();
    let j = json(&dir);
    let notes: Vec<&str> = j["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    // Host B's 3 ms skew is found from the data (completions line up).
    let b = notes.iter().find(|n| n.starts_with("host hostB")).unwrap();
    assert!(b.contains("+3000.0 us ± 0.0 us"), "{notes:?}");
    let ar = group(&j, "AllReduce");
    assert_eq!(
        (ar["count"].as_u64(), ar["measured"].as_u64()),
        (Some(200), Some(200))
    );
    // Per op and rank: window 200 µs; init 2 µs; barrier = 50 µs - own start (10+i or
    // 50) ... summed: init 8, queue 8+9+10+11 .. see below; shares add up to 1.
    let shares = ar["shares"].as_object().unwrap();
    let total: f64 = shares.values().filter_map(|v| v.as_f64()).sum();
    assert!((total - 1.0).abs() < 1e-9, "{shares:?}");
    let window = 4.0 * 200.0;
    let barrier = (50.0 - 10.0) + (50.0 - 11.0) + (50.0 - 12.0) + 0.0;
    assert!(
        (shares["barrier"].as_f64().unwrap() - barrier / window).abs() < 1e-9,
        "{shares:?}"
    );
    assert!((shares["init"].as_f64().unwrap() - 8.0 / window).abs() < 1e-9);
    assert_eq!(
        shares["proxy"].as_f64(),
        Some(0.0),
        "the plugin ran and saw no proxy step"
    );
    // busbw: 16 MiB over the median GPU time, AllReduce factor 2(n-1)/n = 1.5.
    let gpu_us = ar["gpu_median_us"].as_f64().unwrap();
    let bus = ar["busbw_gbs"].as_f64().unwrap();
    assert!((bus - (16u64 << 20) as f64 / (gpu_us * 1e3) * 1.5).abs() < 1e-6);
    let titles: Vec<&str> = j["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["title"].as_str().unwrap())
        .collect();
    assert!(
        titles.iter().any(|t| t.starts_with("rank 3 arrives last")),
        "{titles:?}"
    );
    // The copy-engine request fell back because of the default stream.
    let ce = finding(&j, "copy-engine path requested");
    assert!(
        ce["title"].as_str().unwrap().contains("80 of 80 capable ops"),
        "{ce}"
    );
    assert!(
        ce["evidence"]
            .as_str()
            .unwrap()
            .contains("80 × issued on the legacy default stream"),
        "{ce}"
    );
    assert!(
        ce["evidence"]
            .as_str()
            .unwrap()
            .contains("80 × buffers not in a window"),
        "{ce}"
    );
    let st = &j["stragglers"][0];
    assert_eq!(
        (st["collectives"].as_u64(), st["last"][0]["rank"].as_i64()),
        (Some(70), Some(3))
    );
    assert_eq!(st["last"][0]["times_last"].as_u64(), Some(50));
}

/// The copy-engine finding's reasons follow the NCCL the run used: on 2.28.9 more
/// than one node is a reason by itself and both buffers need a window; from 2.30 more
/// nodes are not (one NVLink domain, the hierarchical copy engine), and from 2.29 one
/// node needs only the receive buffer in a window.
#[test]
fn copy_engine_reasons_follow_the_nccl_version() {
    let evidence = |nccl: (i32, i32)| {
        let t = tempfile::tempdir().unwrap();
        golden_with(t.path(), 0, Engine::SmKernel, 0, Some(nccl));
        let j = json(t.path());
        finding(&j, "copy-engine path requested")["evidence"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let old = evidence((22809, 2));
    assert!(old.contains("80 × more than one node"), "{old}");
    assert!(old.contains("80 × buffers not in a window"), "{old}");
    let new = evidence((23007, 2));
    assert!(!new.contains("more than one node"), "{new}");
    assert!(new.contains("80 × issued on the legacy default stream"), "{new}");
    assert!(new.contains("80 × buffers not in a window"), "{new}");
}

#[test]
fn table_output_is_stable() {
    let (_t, dir) = run_dir();
    let (code, out, err) = zcta(&["report", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let out = out.replace(dir.to_str().unwrap(), "RUN");
    // Every column is in the legend.
    assert!(
        out.contains("unres = unresolved") && out.contains("size bucket:"),
        "{out}"
    );
    insta::assert_snapshot!(out);
}

#[test]
fn csv_has_one_row_per_group() {
    let (_t, dir) = run_dir();
    let (code, out, _) = zcta(&["report", dir.to_str().unwrap(), "--format", "csv"]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("op,size_bucket_bytes,engine,count,measured,p50_us,p99_us,share_init"));
    assert_eq!(lines.len(), 3);
    assert!(lines[1].starts_with("AllReduce,16777216,sm_kernel,200,200,"));
}

#[test]
fn a_missing_rank_makes_barrier_not_measured() {
    let (_t, dir) = run_dir();
    std::fs::remove_file(dir.join("ops").join("hostB-r3-p201-00000.parquet")).unwrap();
    let j = json(&dir);
    let ar = group(&j, "AllReduce");
    assert_eq!(ar["count"].as_u64(), Some(150));
    assert!(
        ar["shares"]["barrier"].is_null() && ar["shares"]["transfer"].is_null(),
        "{ar}"
    );
    assert!(ar["shares"]["unresolved"].as_f64().unwrap() > 0.0);
    let notes = j["notes"].to_string();
    assert!(notes.contains("70 operations lack some rank's data"), "{notes}");
}

#[test]
fn gpu_times_on_some_ranks_only_are_named() {
    // As under ZCTA_SAMPLE when the ranks' hosts call an op in different windows: every
    // rank's row is there, rank 3's without a GPU side.
    let t = tempfile::tempdir().unwrap();
    golden_with(t.path(), 0, Engine::SmKernel, 10, None);
    let j = json(t.path());
    let notes = j["notes"].to_string();
    assert!(
        notes.contains("10 operations lack some rank's data")
            && notes.contains("10 of them have every rank's rows but GPU times on only some ranks"),
        "{notes}"
    );
    // The sampling finding says how far apart the hosts called them (here the hosts'
    // clocks differ by SKEW, which the report removes: 0 ms).
    let findings = j["findings"].to_string();
    assert!(
        findings.contains("called each collective a median 0.0 ms apart, so 10 operations were sampled on only some of their ranks"),
        "{findings}"
    );
    // A missing rank alone is not counted as such.
    let (_t, dir) = run_dir();
    std::fs::remove_file(dir.join("ops").join("hostB-r3-p201-00000.parquet")).unwrap();
    assert!(
        !json(&dir)["notes"]
            .to_string()
            .contains("of them have every rank's rows")
    );
}

#[test]
fn bad_input_is_named_and_the_rest_reported() {
    let (_t, dir) = run_dir();
    let bad = dir.join("ops").join("hostA-r9-p999-00000.parquet");
    std::fs::write(&bad, b"PAR1 not really parquet").unwrap();
    let (code, out, err) = zcta(&["report", dir.to_str().unwrap()]);
    assert_eq!(code, 1, "skipped files give exit 1");
    assert!(err.contains(&format!("skipped {}", bad.display())), "{err}");
    assert!(out.contains("AllReduce"), "the rest is still reported");

    let (code, _, err) = zcta(&["report", "/nonexistent/run"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/run"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let (code, _, err) = zcta(&["report", empty.path().to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(!err.is_empty());
    let (code, _, err) = zcta(&["report", dir.to_str().unwrap(), "--link-peak-gbps=-3"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a positive number"), "{err}");
}

/// A group whose ops ran on communicators of different sizes (TP of 2 beside DP of 4)
/// takes each op's bus-bandwidth factor by its own communicator: their mean, not the
/// largest communicator's for all.
#[test]
fn busbw_takes_each_ops_own_communicator_size() {
    let t = tempfile::tempdir().unwrap();
    let r = &RANKS[0];
    let (prefix, ctx) = r.files();
    let mut w = DatasetWriter::<OpsTable>::new(t.path(), &prefix, SinkPolicy::default());
    for (k, n) in [4, 4, 2, 2].into_iter().enumerate() {
        let t0 = 1_000_000_000_000 + k as i64 * 1_000 * US;
        let mut row = op(
            r,
            k as u64 + 1,
            OpKind::AllReduce,
            k as u64,
            1 << 20,
            [t0, t0 + US, t0 + 2 * US, t0 + 50 * US],
            0x55,
        );
        row.rec.nranks = Some(n);
        row.rec.comm_id = Some(0xC0 + n as u64);
        w.append(&row, &ctx).unwrap();
    }
    w.close().unwrap();
    let row = process_row("tp-dp", "on");
    write_process_file(t.path(), &prefix, &row, &ctx).unwrap();
    let j = json(t.path());
    let g = timed_group(&j, "AllReduce");
    let ratio = g["busbw_gbs"].as_f64().unwrap() / g["algbw_gbs"].as_f64().unwrap();
    // (2·3/4 + 2·3/4 + 2·1/2 + 2·1/2) / 4 = 1.25; the largest communicator's: 1.5.
    assert!((ratio - 1.25).abs() < 1e-9, "{g}");
}

/// Operations timed on no rank are counted by why (their `ops.timing`), each cause
/// said: the budget's, an empty slot pool's, timing off; not all blamed on the budget.
#[test]
fn ops_timed_nowhere_are_counted_by_their_cause() {
    use zcta::record::Timing;
    let t = tempfile::tempdir().unwrap();
    let causes = [(Timing::Skipped(3), 4), (Timing::PoolEmpty, 2), (Timing::Off, 1)];
    for r in &RANKS[..2] {
        let (prefix, ctx) = r.files();
        let mut w = DatasetWriter::<OpsTable>::new(t.path(), &prefix, SinkPolicy::default());
        let mut k = 0u64;
        for (timing, n) in causes {
            for _ in 0..n {
                let t0 = 1_000_000_000_000 + k as i64 * 1_000 * US;
                let mut row = op(
                    r,
                    k + 1,
                    OpKind::AllReduce,
                    k,
                    4096,
                    [t0, t0 + US, t0 + 2 * US, t0 + 9 * US],
                    0x55,
                );
                row.rec.nranks = Some(2);
                row.rec.timing.timing = timing;
                row.gpu = None;
                w.append(&row, &ctx).unwrap();
                k += 1;
            }
        }
        w.close().unwrap();
        let row = process_row("causes", "on");
        write_process_file(t.path(), &prefix, &row, &ctx).unwrap();
    }
    let notes = json(t.path())["notes"].to_string();
    assert!(notes.contains("7 operations were not timed on any rank (ops.timing of their first row: 4 budget: not selected by the budget"), "{notes}");
    assert!(notes.contains("; 1 off: timing off in the process"), "{notes}");
    assert!(notes.contains("; 2 pool_empty: no free slot pair"), "{notes}");
}

/// `zcta diff` compares like with like: ops it did not time cast no vote on the path
/// (a run that timed fewer of its ops did not change path), a group with fewer than 5
/// timed ops in a run gets no interval and is never significant, Bcast and Broadcast
/// are one group as in the report, and its median is the report's p50 (of an even
/// count, the upper middle value).
#[test]
fn diff_compares_the_measured_ops_alone_and_agrees_with_the_report() {
    let t = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = ["a", "b", "c", "d"].iter().map(|n| t.path().join(n)).collect();
    let six: Vec<(u8, Option<i64>)> = (1..=6).map(|k| (0, Some(10 * k))).collect();
    budget_run_of(&dirs[0], OpKind::AllReduce, &six);
    let mut b = six.clone();
    b.extend([(3, None); 30]);
    budget_run_of(&dirs[1], OpKind::AllReduce, &b);
    budget_run_of(&dirs[2], OpKind::Bcast, &[(0, Some(10))]);
    budget_run_of(&dirs[3], OpKind::Broadcast, &[(0, Some(1000))]);
    let diff = |x: &Path, y: &Path| -> serde_json::Value {
        let (code, out, err) = zcta(&[
            "diff",
            x.to_str().unwrap(),
            y.to_str().unwrap(),
            "--format",
            "json",
        ]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap()
    };
    let j = diff(&dirs[0], &dirs[1]);
    let row = &j["rows"][0];
    assert_eq!(
        (row["engine_a"].as_str(), row["engine_b"].as_str()),
        (Some("sm_kernel"), Some("sm_kernel")),
        "{row}"
    );
    assert_eq!(row["path_changed"], false, "{row}");
    let total = &row["changes"][0];
    let p50 = timed_group(&json(&dirs[0]), "AllReduce")["p50_us"]
        .as_f64()
        .unwrap();
    assert_eq!(total["median_a_us"].as_f64(), Some(p50), "{total}");
    assert!((p50 - 40.0).abs() < 1e-9, "{p50}");
    // One timed op a side: no interval, not significant; one group for both names.
    let j = diff(&dirs[2], &dirs[3]);
    assert_eq!(j["only_a"].as_array().map(Vec::len), Some(0), "{j}");
    let row = &j["rows"][0];
    assert_eq!(row["op"], "Broadcast", "{row}");
    let total = &row["changes"][0];
    assert!(
        total["ci95_us"].is_null() && total["significant"].is_null(),
        "{total}"
    );
    let (code, out, _) = zcta(&["diff", dirs[2].to_str().unwrap(), dirs[3].to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("(too few)") && !out.contains("]*"), "{out}");
    // A run that measured no path for a group: unknown, not a change.
    let untimed = t.path().join("untimed");
    budget_run_of(&untimed, OpKind::AllReduce, &[(3, None); 6]);
    let j = diff(&dirs[0], &untimed);
    assert!(j["rows"][0]["path_changed"].is_null(), "{j}");
}

#[test]
fn diff_finds_the_slower_phase_and_the_path_change() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    golden(&a);
    golden_with(&b, 50 * US, Engine::CopyEngine, 0, None);
    let (code, out, err) = zcta(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = j["rows"].as_array().unwrap();
    // Sorted by impact: AllReduce (50 µs × 200 ops) first.
    assert_eq!(rows[0]["op"], "AllReduce");
    let ch = |r: &serde_json::Value, w: &str| {
        r["changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["what"] == w)
            .cloned()
            .unwrap()
    };
    let total = ch(&rows[0], "total");
    assert_eq!(total["significant"], true);
    assert!(
        (total["median_b_us"].as_f64().unwrap() - total["median_a_us"].as_f64().unwrap() - 50.0).abs() < 1e-6
    );
    let tr = ch(&rows[0], "transfer");
    assert_eq!(tr["significant"], true, "{tr}");
    assert_eq!(ch(&rows[0], "barrier")["significant"], false);
    assert!((rows[0]["impact_us"].as_f64().unwrap() - 50.0 * 200.0).abs() < 1e-6);
    let a2a = rows.iter().find(|r| r["op"] == "AlltoAll").unwrap();
    assert_eq!(
        (a2a["engine_a"].as_str(), a2a["engine_b"].as_str()),
        (Some("sm_kernel"), Some("copy_engine"))
    );
    assert_eq!(a2a["path_changed"], true);
    assert_eq!(ch(a2a, "total")["significant"], false);

    let (code, out, _) = zcta(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("CHANGED sm_kernel -> copy_engine"), "{out}");
    let (code, _, err) = zcta(&["diff", a.to_str().unwrap(), "/nonexistent/b"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/b"), "{err}");
}

#[test]
fn one_process_alone_is_read_on_the_joining_thread() {
    let (_t, dir) = run_dir();
    for f in [
        "hostA-r1-p101-00000.parquet",
        "hostB-r2-p200-00000.parquet",
        "hostB-r3-p201-00000.parquet",
    ] {
        std::fs::remove_file(dir.join("ops").join(f)).unwrap();
    }
    let j = json(&dir);
    let ar = group(&j, "AllReduce");
    assert_eq!(ar["count"].as_u64(), Some(50));
    assert!(ar["shares"]["barrier"].is_null());
    assert!((ar["shares"]["init"].as_f64().unwrap() - 2.0 / 200.0).abs() < 1e-9);
}

/// On a proxy-driven transport the time the GPU waits on the proxy's network steps is
/// the proxy phase (memcpy first, proxy next, transfer the rest).
#[test]
fn network_waits_are_the_proxy_phase() {
    use zcta::record::{ProxyKind, ProxyRecord};
    use zcta::tables::ProxyTable;
    let (_t, dir) = run_dir();
    for r in &RANKS {
        let (prefix, ctx) = r.files();
        let mut w = DatasetWriter::<ProxyTable>::new(&dir, &prefix, SinkPolicy::default());
        for k in 0..50u64 {
            let t0 = 1_000_000_000_000 + k as i64 * 1_000 * US + r.skew;
            // A send step waiting on the network from 60 to 160 µs into the op.
            let row = ProxyRecord {
                channel: Some(0),
                step: Some(0),
                send_gpu_wait_ns: Some(t0 + 55 * US),
                send_wait_ns: Some(t0 + 60 * US),
                trans_size: Some(1 << 20),
                ..ProxyRecord::new(
                    ProxyKind::Step,
                    Some(k + 1),
                    Some(1),
                    Some(r.rank),
                    t0 + 55 * US,
                    Some(t0 + 160 * US),
                    1,
                )
            };
            w.append(&row, &ctx).unwrap();
        }
        w.close().unwrap();
    }
    let j = json(&dir);
    let sh = &group(&j, "AllReduce")["shares"];
    // After the barrier (50 µs) every rank has 150 µs of GPU time, 100 of them proxy.
    assert!(
        (sh["proxy"].as_f64().unwrap() - 4.0 * 100.0 / 800.0).abs() < 1e-9,
        "{sh}"
    );
    assert!(
        (sh["transfer"].as_f64().unwrap() - 4.0 * 50.0 / 800.0).abs() < 1e-9,
        "{sh}"
    );
}

/// Rewrites the ops files of `dir` as schema version 1 wrote them: no GPU columns.
fn to_schema_1(dir: &Path) {
    use std::sync::Arc;
    let gpu_cols = [
        "launch_ns",
        "gpu_start_ns",
        "gpu_end_ns",
        "engine",
        "kernel",
        "n_kernels",
        "n_memcpy",
        "memcpy_bytes",
    ];
    for entry in std::fs::read_dir(dir.join("ops")).unwrap() {
        let path = entry.unwrap().path();
        let f = std::fs::File::open(&path).unwrap();
        let batches: Vec<_> = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap()
            .map(|b| b.unwrap())
            .collect();
        let old = batches[0].schema();
        let keep: Vec<usize> = (0..old.fields().len())
            .filter(|&i| !gpu_cols.contains(&old.field(i).name().as_str()))
            .collect();
        let mut meta = old.metadata().clone();
        meta.insert(zcta::SCHEMA_VERSION_KEY, "1");
        let schema = Arc::new(old.project(&keep).unwrap().with_metadata(meta.clone()));
        let out = std::fs::File::create(&path).unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_key_value_metadata(Some(
                meta.iter()
                    .map(|(k, v)| parquet::file::metadata::KeyValue::new(k.clone(), v.clone()))
                    .collect(),
            ))
            .build();
        let mut w = parquet::arrow::ArrowWriter::try_new(out, schema.clone(), Some(props)).unwrap();
        for b in &batches {
            w.write(&b.project(&keep).unwrap().with_schema(schema.clone()).unwrap())
                .unwrap();
        }
        w.close().unwrap();
    }
}

/// A run directory from schema version 1 (no GPU columns): reported, GPU phases not
/// measured.
#[test]
fn an_older_schema_is_read_with_gpu_not_measured() {
    let (_t, dir) = run_dir();
    to_schema_1(&dir);
    let j = json(&dir);
    let ar = group(&j, "AllReduce");
    assert_eq!(
        (
            ar["engine"].as_str(),
            ar["count"].as_u64(),
            ar["measured"].as_u64()
        ),
        (Some("not measured"), Some(200), Some(0))
    );
    assert!(ar["p50_us"].is_null() && ar["shares"]["init"].is_null());
}

/// `zcta phases` writes one row per op and rank whose phases add up to its window.
#[test]
fn phases_table_for_pandas_and_duckdb() {
    use arrow_array::{Array, Int64Array};
    let (_t, dir) = run_dir();
    let (code, out, err) = zcta(&["phases", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("280 rows"), "{out}");
    let t = zcta::reader::read_table(&dir, "phases").unwrap();
    assert_eq!(t.num_rows(), 280);
    let cols = [
        "init_ns",
        "queue_ns",
        "sync_ns",
        "barrier_ns",
        "transfer_ns",
        "memcpy_ns",
        "proxy_ns",
        "unresolved_ns",
    ];
    for b in &t.batches {
        let w = b
            .column_by_name("window_ns")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        for r in 0..b.num_rows() {
            let sum: i64 = cols
                .iter()
                .map(|c| {
                    let a = b
                        .column_by_name(c)
                        .unwrap()
                        .as_any()
                        .downcast_ref::<Int64Array>()
                        .unwrap();
                    if a.is_null(r) { 0 } else { a.value(r) }
                })
                .sum();
            assert_eq!(sum, w.value(r));
        }
    }
    // Written again, it replaces the earlier table.
    let (code, _, _) = zcta(&["phases", dir.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert_eq!(zcta::reader::read_table(&dir, "phases").unwrap().num_rows(), 280);
}

/// `zcta report RUN | head -1`: the reader goes away before zcta writes; zcta stops
/// quietly (exit 0, nothing on stderr) instead of panicking on the broken pipe.
#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    let (_t, dir) = run_dir();
    for args in [vec!["report"], vec!["summary"], vec!["diff"]] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_zcta"));
        cmd.args(&args).arg(&dir);
        if args[0] == "diff" {
            cmd.arg(&dir);
        }
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Close the read end before zcta has loaded the run.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

/// One process on a one-rank communicator: 5 AllReduce that launched no GPU work (as
/// NCCL's one-rank shortcut can), and 4 grouped Send/Recv pairs of the rank to itself
/// whose copy was timed on the Send only.
#[test]
fn local_ops_are_not_link_traffic_nor_lacking_a_rank() {
    let t = tempfile::tempdir().unwrap();
    let r = &RANKS[0];
    let (prefix, ctx) = r.files();
    let mut w = DatasetWriter::<OpsTable>::new(t.path(), &prefix, SinkPolicy::default());
    let mut id = 0;
    for k in 0..5u64 {
        let t0 = 1_000_000_000_000 + k as i64 * 1_000 * US;
        id += 1;
        let mut row = op(
            r,
            id,
            OpKind::AllReduce,
            k,
            4096,
            [t0, t0 + 2 * US, t0 + 3 * US, t0 + 4 * US],
            0x55,
        );
        row.rec.nranks = Some(1);
        row.gpu = None;
        w.append(&row, &ctx).unwrap();
    }
    for k in 0..4u64 {
        let t0 = 2_000_000_000_000 + k as i64 * 1_000 * US;
        for kind in [OpKind::Send, OpKind::Recv] {
            id += 1;
            let mut row = op(
                r,
                id,
                kind,
                k,
                8 << 20,
                [t0, t0 + 2 * US, t0 + 10 * US, t0 + 60 * US],
                0x55,
            );
            row.rec.nranks = Some(2);
            row.rec.peer = Some(0);
            row.rec.group_id = Some(k);
            if kind == OpKind::Recv {
                row.gpu = None;
            }
            w.append(&row, &ctx).unwrap();
        }
    }
    w.close().unwrap();
    let row = process_row("local", "on");
    write_process_file(t.path(), &prefix, &row, &ctx).unwrap();

    let j = json(t.path());
    let notes = j["notes"].to_string();
    assert!(!notes.contains("lack"), "{notes}");
    assert!(!notes.contains("not timed on any rank"), "{notes}");
    assert!(notes.contains("5 local operations have no GPU times"), "{notes}");
    let send = group(&j, "Send");
    assert_eq!(send["local"], true);
    assert!(
        send["busbw_gbs"].is_null() && send["busbw_pct_peak"].is_null(),
        "{send}"
    );
    assert!(send["algbw_gbs"].as_f64().unwrap() > 0.0, "{send}");
    assert!(!send["shares"]["barrier"].is_null(), "{send}");
    let (code, out, err) = zcta(&["report", t.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.starts_with("Send ")).unwrap();
    assert!(line.contains("8–16 MiB") && line.contains(" local "), "{out}");
    assert!(
        out.contains("run ") && out.contains("ops on 1 process\n"),
        "{out}"
    );
}

#[test]
fn help_opens_with_what_zcta_does() {
    let (code, out, _) = zcta(&["--help"]);
    assert_eq!(code, 0);
    let first = out.lines().next().unwrap();
    assert!(
        first.starts_with("zcta: where every NCCL operation's time goes"),
        "{out}"
    );
    assert!(!out.contains("record types, Arrow schemas"), "{out}");
    assert!(
        out.contains("zcta run --") && out.contains("zcta report"),
        "{out}"
    );
}

#[test]
fn bcast_and_broadcast_are_one_op() {
    // ncclBcast is ncclBroadcast in place: one report row, whichever was called.
    let t = tempfile::tempdir().unwrap();
    for r in &RANKS {
        let (prefix, ctx) = r.files();
        let mut w = DatasetWriter::<OpsTable>::new(t.path(), &prefix, SinkPolicy::default());
        for k in 0..5u64 {
            let t0 = 1_000_000_000_000 + k as i64 * 1_000 * US;
            let kind = if k < 3 { OpKind::Broadcast } else { OpKind::Bcast };
            let mut row = op(
                r,
                k + 1,
                kind,
                k,
                1 << 20,
                [t0, t0 + 2 * US, t0 + 3 * US, t0 + 40 * US],
                0x55,
            );
            row.rec.root = Some(0);
            w.append(&row, &ctx).unwrap();
        }
        w.close().unwrap();
        let row = process_row("bcast", "on");
        write_process_file(t.path(), &prefix, &row, &ctx).unwrap();
    }
    let j = json(t.path());
    let groups = j["groups"].as_array().unwrap();
    assert!(groups.iter().all(|g| g["op"] != "Bcast"), "{groups:?}");
    assert_eq!(group(&j, "Broadcast")["count"], 5 * 4, "{groups:?}");
}

/// A run of one rank's AllReduce ops, each `(level, timed µs or None)`: a timed op
/// with GPU stamps, or one the budget did not time at that level.
fn budget_run(dir: &Path, ops: &[(u8, Option<i64>)]) {
    budget_run_of(dir, OpKind::AllReduce, ops);
}

/// [`budget_run`] of `kind`.
fn budget_run_of(dir: &Path, kind: OpKind, ops: &[(u8, Option<i64>)]) {
    let r = &RANKS[0];
    let (prefix, ctx) = r.files();
    let mut w = DatasetWriter::<OpsTable>::new(dir, &prefix, SinkPolicy::default());
    for (k, &(level, us)) in ops.iter().enumerate() {
        let t0 = 1_000_000_000_000 + k as i64 * 1_000 * US;
        let mut row = op(
            r,
            k as u64 + 1,
            kind,
            k as u64,
            1 << 20,
            [t0, t0 + US, t0 + 2 * US, t0 + us.unwrap_or(1) * US],
            0x55,
        );
        if matches!(kind, OpKind::Broadcast | OpKind::Bcast) {
            row.rec.root = Some(0);
        }
        match us {
            Some(_) => {
                row.rec.timing.timing = zcta::record::Timing::Timed(level);
                let g = row.gpu.as_mut().unwrap();
                g.gpu_start_ns = None;
                g.source = zcta::gpu::GpuSourceKind::Stamps;
            }
            None => {
                row.rec.timing.timing = zcta::record::Timing::Skipped(level);
                row.gpu = None;
            }
        }
        w.append(&row, &ctx).unwrap();
    }
    w.close().unwrap();
    let row = process_row("weights", "off: ZCTA_GPU=stamps");
    write_process_file(dir, &prefix, &row, &ctx).unwrap();
}

/// The report's group of `op` whose GPU side was measured.
fn timed_group<'a>(j: &'a serde_json::Value, op: &str) -> &'a serde_json::Value {
    groups_of(j, op)
        .into_iter()
        .find(|g| g["engine"] != "not measured")
        .unwrap_or_else(|| panic!("no timed {op}: {j}"))
}

#[test]
fn an_op_the_budget_timed_stands_for_the_ops_it_was_chosen_among() {
    // Two ops timed at level 0 (10 and 20 µs) and one at level 3 (100 µs) of the 8
    // ops the hash chose it among: the last stands for 8 ops, so the median of the
    // ops the rows stand for is 100 µs (the rows' own median would be 20).
    let t = tempfile::tempdir().unwrap();
    let mut ops = vec![(0, Some(10)), (0, Some(20)), (3, Some(100))];
    ops.extend([(3, None); 7]);
    budget_run(t.path(), &ops);
    let j = json(t.path());
    let g = timed_group(&j, "AllReduce");
    assert_eq!(g["count"], 3, "{g}");
    let p50 = g["p50_us"].as_f64().unwrap();
    assert!((p50 - 100.0).abs() < 1.0, "{g}");
    // Events-mode ops have a GPU time too: their time on the stream.
    assert!(g["gpu_median_us"].as_f64().is_some(), "{g}");
}

/// The rate limiter skips ops the hash selected (a burst): at level 0, 2 ops timed of
/// 20 drawn stand for 10 each, not 1, so the 100 µs op timed at level 3 (1 of 8) no
/// longer outweighs them: the median is 20 µs (with 2^level weights it read 100).
#[test]
fn an_op_timed_where_the_rate_limiter_skipped_others_stands_for_them_too() {
    let t = tempfile::tempdir().unwrap();
    let mut ops = vec![(0, Some(10)), (0, Some(20)), (3, Some(100))];
    ops.extend([(0, None); 18]);
    ops.extend([(3, None); 7]);
    budget_run(t.path(), &ops);
    let j = json(t.path());
    let g = timed_group(&j, "AllReduce");
    let p50 = g["p50_us"].as_f64().unwrap();
    assert!((p50 - 20.0).abs() < 1.0, "{g}");
}

/// Rows whose times are the ends of i64, or past 2116 (a corrupt or hostile file),
/// are left out of every figure and their file named with how many (exit 1), never
/// wrapped or a panic (the tests run a debug build, which panics on overflow); so are
/// the ops rows of calls that succeeded with 2^64 − 1 bytes, while a refused call's
/// 2^64 − 1 bytes are summed exactly. A proxy step's times are judged by every command
/// that reads them. The figures of the other rows are those of the run without the bad
/// ones.
#[test]
fn times_out_of_range_are_left_out_and_named_never_wrapped() {
    use zcta::record::{ProxyKind, ProxyRecord};
    use zcta::tables::ProxyTable;
    let t = tempfile::tempdir().unwrap();
    let (clean, dir) = (t.path().join("clean"), t.path().join("extreme"));
    golden(&clean);
    golden(&dir);
    // Two more processes on a communicator of their own, 6 Broadcasts each: rank 0's
    // first four have a time at an end of i64 or just past 2116, the last two of both
    // ranks carry 2^64 − 1 bytes: the fifth a refused call's, the sixth a successful
    // one's (a corrupt value).
    let pair = [
        Rank {
            host: "hostA",
            pid: 300,
            rank: 0,
            skew: 0,
        },
        Rank {
            host: "hostA",
            pid: 301,
            rank: 1,
            skew: 0,
        },
    ];
    for r in &pair {
        let (prefix, ctx) = r.files();
        let mut w = DatasetWriter::<OpsTable>::new(&dir, &prefix, SinkPolicy::default());
        for k in 0..6u64 {
            let t0 = 3_000_000_000_000 + k as i64 * 1_000 * US;
            let t = [t0, t0 + 2 * US, t0 + 10 * US, t0 + 50 * US];
            let mut row = op(r, k + 1, OpKind::Broadcast, k, 1024, t, 0x55);
            row.rec.comm_id = Some(0xBAD);
            row.rec.nranks = Some(2);
            row.rec.root = Some(0);
            let g = row.gpu.as_mut().unwrap();
            match (r.rank, k) {
                (0, 0) => (row.rec.api_start_ns, row.rec.api_end_ns) = (i64::MIN, i64::MAX),
                (0, 1) => (g.gpu_start_ns, g.gpu_end_ns) = (Some(i64::MIN), Some(i64::MAX)),
                (0, 2) => (g.launch_ns, g.gpu_ready_ns) = (Some(i64::MAX), Some(i64::MIN)),
                (0, 3) => g.gpu_end_ns = Some(1 << 62),
                (_, 4) => (row.rec.bytes, row.rec.result) = (Some(u64::MAX), 4),
                (_, 5) => row.rec.bytes = Some(u64::MAX),
                _ => {}
            }
            w.append(&row, &ctx).unwrap();
        }
        w.close().unwrap();
    }
    // And one proxy step of rank 0 from the beginning of time to its end.
    let (prefix, ctx) = pair[0].files();
    let mut w = DatasetWriter::<ProxyTable>::new(&dir, &prefix, SinkPolicy::default());
    let step = ProxyRecord::new(
        ProxyKind::Step,
        Some(5),
        Some(1),
        Some(0),
        i64::MIN,
        Some(i64::MAX),
        300,
    );
    w.append(&step, &ctx).unwrap();
    w.close().unwrap();
    let ops_file = dir.join("ops").join("hostA-r0-p300-00000.parquet");
    let ops_file_1 = dir.join("ops").join("hostA-r1-p301-00000.parquet");
    let proxy_file = dir.join("proxy").join("hostA-r0-p300-00000.parquet");
    assert!(ops_file.is_file() && ops_file_1.is_file() && proxy_file.is_file());
    let (d, c) = (dir.to_str().unwrap(), clean.to_str().unwrap());
    let trace = t.path().join("trace.json");
    let tr = trace.to_str().unwrap();
    let outs = each_names_damage(
        &[
            vec!["summary", d],
            vec!["report", d, "--format", "json"],
            vec!["diff", c, d, "--format", "json"],
            vec!["export", "--perfetto", d, "-o", tr],
            vec!["phases", d],
        ],
        |cmd, err, what| {
            assert!(named(err, &ops_file, &format!("4 ops rows {TIME_OUT}")), "{what}");
            for f in [&ops_file, &ops_file_1] {
                assert!(named(err, f, &format!("1 ops row {BYTES_OUT}")), "{what}");
            }
            // summary reads no proxy times; every other command judges them.
            if cmd != "summary" {
                assert!(
                    named(err, &proxy_file, &format!("1 proxy row {TIME_OUT}")),
                    "{what}"
                );
            }
            assert!(err.lines().all(|l| l.starts_with("zcta: ")), "{what}");
        },
    );

    // summary: the other rows' figures; a refused call's bytes summed exactly.
    let (_, clean_summary, _) = zcta(&["summary", c]);
    let calls = |s: &str, rank: &str, op: &str| {
        s.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() == 5 && w[0] == rank && w[1] == op)
            .map(|w| w[2..].join(" "))
    };
    let s = &outs[0];
    for rank in ["0", "1", "2", "3"] {
        for op in ["AllReduce", "AlltoAll"] {
            assert_eq!(calls(s, rank, op), calls(&clean_summary, rank, op), "{s}");
            assert!(calls(s, rank, op).is_some(), "{s}");
        }
    }
    let max = u128::from(u64::MAX);
    assert_eq!(calls(s, "0", "Broadcast"), Some(format!("1 {max} 1")), "{s}");
    assert_eq!(
        calls(s, "1", "Broadcast"),
        Some(format!("5 {} 1", max + 4 * 1024)),
        "{s}"
    );

    // report: the golden groups as they are without the extra rows; 4 Broadcasts (rank
    // 1's first four: refused calls are not in the table), all of 1 KiB.
    let j: serde_json::Value = serde_json::from_str(&outs[1]).unwrap();
    let jc = json(&clean);
    for op in ["AllReduce", "AlltoAll"] {
        assert_eq!(group(&j, op), group(&jc, op));
    }
    let bcast = groups_of(&j, "Broadcast");
    let n: u64 = bcast.iter().map(|g| g["count"].as_u64().unwrap()).sum();
    assert_eq!(n, 4, "{bcast:?}");
    for g in &bcast {
        assert_eq!(g["size_bucket_bytes"], 1024, "{g}");
        for k in ["p50_us", "p99_us", "gpu_median_us", "busbw_gbs"] {
            assert!(
                g[k].as_f64()
                    .is_some_and(|v| v.is_finite() && (0.0..1e15).contains(&v)),
                "{k}: {g}"
            );
        }
    }

    // diff: nothing changed in the golden ops.
    let j: serde_json::Value = serde_json::from_str(&outs[2]).unwrap();
    for r in j["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["op"] != "Broadcast")
    {
        let total = &r["changes"][0];
        assert_eq!(total["what"], "total", "{r}");
        assert_eq!(total["median_a_us"], total["median_b_us"], "{r}");
    }

    // export: every timestamp within the run (about 2000 s long), none wrapped.
    let trace: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let ts: Vec<f64> = events.iter().filter_map(|e| e["ts"].as_f64()).collect();
    assert_eq!(
        ts.len(),
        4 * 70 + 6,
        "one per ops row kept, none of the proxy step"
    );
    assert!(ts.iter().all(|&t| (0.0..=2.1e9).contains(&t)), "{ts:?}");
}

/// A proxy-thread copy (gpu, attribution proxy_window) or a proxy step with a time out
/// of range (an end of i64, or before 1970) in a hostile file is left out of the phases
/// as `zcta export` leaves it out of the trace: `report`, `diff` and `phases` name its
/// file with the same count as `export` (exit 1), and the report's figures are those of
/// the run without it. Kept, each such span would cover the whole time after the
/// barrier of its op, and make it memcpy or proxy.
#[test]
fn gpu_and_proxy_times_out_of_range_are_left_out_of_the_phases() {
    use zcta::cupti::{GpuKind, RawActivity};
    use zcta::record::{ProxyKind, ProxyRecord};
    use zcta::rows::{Activity, Attribution, GpuRow};
    use zcta::tables::{GpuTable, ProxyTable};
    let t = tempfile::tempdir().unwrap();
    let (clean, dir) = (t.path().join("clean"), t.path().join("hostile"));
    let r = &RANKS[0];
    let (prefix, ctx) = r.files();
    // AllReduce k (op_id k + 1) of rank 0: [t0, t0 + 200 µs], its barrier ends at
    // t0 + 50 µs.
    let t0 = |k: i64| 1_000_000_000_000 + k * 1_000 * US;
    // One network wait of rank 0's first AllReduce, in both runs: the proxy phase is
    // measured, and not 0, without the hostile rows.
    let good = ProxyRecord {
        channel: Some(0),
        step: Some(0),
        send_wait_ns: Some(t0(0) + 60 * US),
        ..ProxyRecord::new(
            ProxyKind::Step,
            Some(1),
            Some(1),
            Some(0),
            t0(0) + 55 * US,
            Some(t0(0) + 160 * US),
            1,
        )
    };
    for d in [&clean, &dir] {
        golden(d);
        let mut w = DatasetWriter::<ProxyTable>::new(d, &prefix, SinkPolicy::default());
        w.append(&good, &ctx).unwrap();
        if d == &dir {
            // Send waits of ops 2 and 3 from before 1970 / the beginning of time, their
            // stops in range; a step of op 4 from one end of i64 to the other.
            for (op, wait) in [(2u64, -1i64), (3, i64::MIN)] {
                let k = op as i64 - 1;
                w.append(
                    &ProxyRecord {
                        send_wait_ns: Some(wait),
                        ..ProxyRecord::new(
                            ProxyKind::Step,
                            Some(op),
                            Some(1),
                            Some(0),
                            t0(k) + 55 * US,
                            Some(t0(k) + 200 * US),
                            1,
                        )
                    },
                    &ctx,
                )
                .unwrap();
            }
            w.append(
                &ProxyRecord {
                    recv_wait_ns: Some(i64::MIN),
                    ..ProxyRecord::new(
                        ProxyKind::Step,
                        Some(4),
                        Some(1),
                        Some(0),
                        i64::MIN,
                        Some(i64::MAX),
                        1,
                    )
                },
                &ctx,
            )
            .unwrap();
        }
        w.close().unwrap();
    }
    // Proxy-thread copies of ops 5 and 6: from before 1970 into the op, and across
    // all of i64.
    let mut w = DatasetWriter::<GpuTable>::new(&dir, &prefix, SinkPolicy::default());
    for (op, (start, end)) in [(5u64, (-1, t0(4) + 200 * US)), (6, (i64::MIN, i64::MAX))] {
        let copy = GpuRow {
            act: Activity {
                raw: RawActivity {
                    kind: GpuKind::Memcpy,
                    start_ns: start,
                    end_ns: end,
                    device: 0,
                    context: 1,
                    stream: 7,
                    correlation_id: op as u32,
                    bytes: Some(1 << 20),
                    copy_kind: Some(8),
                    src_device: None,
                    dst_device: None,
                    grid: None,
                    block_x: None,
                    name_ptr: 0,
                    graph_id: 0,
                },
                name: None,
            },
            op_id: Some(op),
            group_id: None,
            attribution: Attribution::ProxyWindow,
            launch_ns: None,
            api_thread: None,
        };
        w.append(&copy, &ctx).unwrap();
    }
    w.close().unwrap();
    let gpu_file = dir.join("gpu").join(format!("{prefix}-00000.parquet"));
    let proxy_file = dir.join("proxy").join(format!("{prefix}-00000.parquet"));
    assert!(gpu_file.is_file() && proxy_file.is_file());

    let (d, c) = (dir.to_str().unwrap(), clean.to_str().unwrap());
    let trace = t.path().join("trace.json");
    let outs = each_names_damage(
        &[
            vec!["report", d, "--format", "json"],
            vec!["diff", c, d, "--format", "json"],
            vec!["phases", d],
            vec!["export", "--perfetto", d, "-o", trace.to_str().unwrap()],
        ],
        |_, err, what| {
            assert!(named(err, &gpu_file, &format!("2 gpu rows {TIME_OUT}")), "{what}");
            assert!(
                named(err, &proxy_file, &format!("3 proxy rows {TIME_OUT}")),
                "{what}"
            );
            assert_eq!(err.lines().count(), 2, "{what}");
        },
    );

    // report: every figure as in the run without the hostile rows, the proxy phase
    // measured there.
    let j: serde_json::Value = serde_json::from_str(&outs[0]).unwrap();
    let jc = json(&clean);
    assert!(
        group(&jc, "AllReduce")["shares"]["proxy"]
            .as_f64()
            .is_some_and(|p| p > 0.0),
        "{jc}"
    );
    assert_eq!(j["groups"], jc["groups"]);
    assert_eq!(j["mix"], jc["mix"]);
    assert_eq!(j["findings"], jc["findings"]);
    // diff: no phase of any op changed.
    let j: serde_json::Value = serde_json::from_str(&outs[1]).unwrap();
    let rows = j["rows"].as_array().unwrap();
    assert!(!rows.is_empty(), "{j}");
    for r in rows {
        let changes = r["changes"].as_array().unwrap();
        assert!(!changes.is_empty(), "{r}");
        for ch in changes {
            assert_eq!(ch["median_a_us"], ch["median_b_us"], "{r}");
        }
    }
}

/// An ops row of a call that succeeded with bytes no buffer can hold (2^62, 4 EiB, or
/// more: a corrupt value) is left out of every figure and named, not put in a size
/// bucket of its own (2^63 for 2^64 − 1 bytes); one byte less is a size like any other,
/// and a refused call keeps the bytes its caller asked for.
#[test]
fn impossible_bytes_are_left_out_and_named_not_bucketed() {
    let t = tempfile::tempdir().unwrap();
    let (clean, dir) = (t.path().join("clean"), t.path().join("bytes"));
    golden(&clean);
    golden(&dir);
    // Two processes on a communicator of their own: 4 Broadcasts each, of 2^62 − 1,
    // 2^62 and 2^64 − 1 bytes, and a refused one of 2^64 − 1.
    let pair = [300, 301].map(|pid| Rank {
        host: "hostA",
        pid,
        rank: pid - 300,
        skew: 0,
    });
    let sizes = [(1u64 << 62) - 1, 1 << 62, u64::MAX, u64::MAX];
    for r in &pair {
        let (prefix, ctx) = r.files();
        let mut w = DatasetWriter::<OpsTable>::new(&dir, &prefix, SinkPolicy::default());
        for (k, bytes) in sizes.into_iter().enumerate() {
            let t0 = 3_000_000_000_000 + k as i64 * 1_000 * US;
            let t = [t0, t0 + 2 * US, t0 + 10 * US, t0 + 50 * US];
            let mut row = op(r, k as u64 + 1, OpKind::Broadcast, k as u64, bytes, t, 0x55);
            row.rec.comm_id = Some(0xB1);
            row.rec.nranks = Some(2);
            row.rec.root = Some(0);
            if k == 3 {
                row.rec.result = 4;
            }
            w.append(&row, &ctx).unwrap();
        }
        w.close().unwrap();
    }
    let (d, c) = (dir.to_str().unwrap(), clean.to_str().unwrap());
    let trace = t.path().join("trace.json");
    let outs = each_names_damage(
        &[
            vec!["report", d, "--format", "json"],
            vec!["summary", d],
            vec!["diff", c, d, "--format", "json"],
            vec!["phases", d],
            vec!["export", "--perfetto", d, "-o", trace.to_str().unwrap()],
        ],
        |_, err, what| {
            for r in &pair {
                let file = dir.join("ops").join(format!("{}-00000.parquet", r.files().0));
                assert!(named(err, &file, &format!("2 ops rows {BYTES_OUT}")), "{what}");
            }
            assert_eq!(err.lines().count(), 2, "{what}");
        },
    );

    // report: the golden groups as without the pair; of its Broadcasts the two of
    // 2^62 − 1 bytes alone, in the 2^61 bucket.
    let j: serde_json::Value = serde_json::from_str(&outs[0]).unwrap();
    let jc = json(&clean);
    for op in ["AllReduce", "AlltoAll"] {
        assert_eq!(group(&j, op), group(&jc, op));
    }
    let bcast = groups_of(&j, "Broadcast");
    assert_eq!(bcast.len(), 1, "{bcast:?}");
    assert_eq!(bcast[0]["size_bucket_bytes"], 1u64 << 61, "{bcast:?}");
    assert_eq!(bcast[0]["count"], 2, "{bcast:?}");
    // summary: per rank the kept call and the refused one, bytes summed exactly.
    let line = outs[1]
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() == 5 && w[1] == "Broadcast")
        .map(|w| w.join(" "))
        .collect::<Vec<_>>();
    let sum = u128::from((1u64 << 62) - 1) + u128::from(u64::MAX);
    assert_eq!(
        line,
        [format!("0 Broadcast 2 {sum} 1"), format!("1 Broadcast 2 {sum} 1")],
        "{}",
        outs[1]
    );
}

/// `zcta diff` of a schema-1 run (no GPU side) with a schema-2 one: what run A did not
/// measure is n/m (null in JSON), never 0, and has no change, no interval and no
/// impact; the row is shown, not dropped.
#[test]
fn diff_says_not_measured_where_a_run_did_not_measure() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    golden(&a);
    to_schema_1(&a);
    golden(&b);
    // B without its process rows: no profiler plugin known, so proxy and transfer are
    // not told apart and B's unresolved time is measured and not 0 (A's, with no
    // window, is not measured: before, it showed as 0.0).
    std::fs::remove_dir_all(b.join("process")).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let (code, out, err) = zcta(&["diff", a, b, "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{j}");
    for r in rows {
        let changes = r["changes"].as_array().unwrap();
        assert_eq!(changes[0]["what"], "total", "{r}");
        assert!(changes[0]["median_b_us"].as_f64().is_some_and(|v| v > 0.0), "{r}");
        // B measured its phases: each is there, with A's side not measured.
        for what in ["init", "queue", "sync", "unresolved"] {
            assert!(changes.iter().any(|c| c["what"] == what), "{what}: {r}");
        }
        for c in changes {
            assert!(c["median_a_us"].is_null(), "{c}");
            assert!(c["ci95_us"].is_null() && c["significant"].is_null(), "{c}");
        }
        assert!(r["impact_us"].is_null(), "{r}");
    }
    let (code, out, err) = zcta(&["diff", a, b]);
    assert_eq!(code, 0, "{err}");
    // After "A ...", "B ..." and the header, up to the blank line: one line per change,
    // "[op size n_A n_B impact] what A_us B_us B-A [CI]".
    let what: Vec<&str> = std::iter::once("total")
        .chain(zcta::analysis::phases::PHASES)
        .collect();
    let lines: Vec<&str> = out.lines().skip(3).take_while(|l| !l.is_empty()).collect();
    assert_eq!(lines.iter().filter(|l| l.contains(" total ")).count(), 2, "{out}");
    for l in lines {
        let w: Vec<&str> = l.split_whitespace().collect();
        let i = w
            .iter()
            .position(|x| what.contains(x))
            .unwrap_or_else(|| panic!("{l}"));
        assert_eq!((w[i + 1], w[i + 3]), ("n/m", "n/m"), "A and B-A: {l}");
        assert!(w[i + 2].parse::<f64>().is_ok(), "B: {l}");
        if w[i] == "total" {
            assert_eq!(w[i - 1], "n/m", "impact: {l}");
        }
    }
    // Two schema-1 runs: each row still shown, its total not measured on either side.
    let (code, out, err) = zcta(&["diff", a, a]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("AlltoAll") && l.contains("total") && l.matches("n/m").count() == 4),
        "{out}"
    );
}

/// An op whose GPU end lies before its call (a clock placed beyond its stated error)
/// is not measured in `zcta summary` either, as in the report: the GPU median is of
/// the others, never negative.
#[test]
fn summary_leaves_out_a_gpu_end_before_the_call() {
    let t = tempfile::tempdir().unwrap();
    let r = &RANKS[0];
    let (prefix, ctx) = r.files();
    let mut w = DatasetWriter::<OpsTable>::new(t.path(), &prefix, SinkPolicy::default());
    for k in 0..10u64 {
        let t0 = 1_000_000_000_000 + k as i64 * 1_000 * US;
        let mut row = op(
            r,
            k + 1,
            OpKind::AllReduce,
            k,
            4096,
            [t0, t0 + 2 * US, t0 + 10 * US, t0 + 30 * US],
            0x55,
        );
        if k % 2 == 1 {
            // The GPU side placed 500 µs early: it ends before the call began.
            let g = row.gpu.as_mut().unwrap();
            g.gpu_start_ns = None;
            g.launch_ns = Some(t0 + 2 * US);
            g.gpu_ready_ns = Some(t0 - 500 * US);
            g.gpu_end_ns = Some(t0 - 480 * US);
        }
        w.append(&row, &ctx).unwrap();
    }
    w.close().unwrap();
    write_process_file(t.path(), &prefix, &process_row("wrong", "on"), &ctx).unwrap();
    let (code, out, err) = zcta(&["summary", t.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("AllReduce") && l.contains("GPU side measured"))
        .unwrap_or_else(|| panic!("{out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &words[1..9],
        ["GPU", "side", "measured", "5", "of", "10", "GPU", "median"],
        "{line}"
    );
    assert_eq!(words[9], "20.0", "the good ops' 20 µs: {line}");
}

/// A row that says its op was timed but holds no GPU end (inconsistent: zcta writes
/// none) has no GPU side: its rank's arrival is not known, so the barrier of every rank
/// of its collectives is not measured (as when that rank's op was not timed), never
/// taken from the ranks that have one.
#[test]
fn a_timed_row_without_a_gpu_end_is_not_a_ranks_arrival() {
    let (_t, dir) = run_dir();
    rewrite_ops(&dir.join("ops").join("hostB-r3-p201-00000.parquet"), |cols, i| {
        let n = cols[0].len();
        cols[i("gpu_end_ns")] = arrow_array::new_null_array(cols[i("gpu_end_ns")].data_type(), n);
    });
    let j = json(&dir);
    let ar = group(&j, "AllReduce");
    assert!(
        ar["shares"]["barrier"].is_null() && ar["shares"]["transfer"].is_null(),
        "{ar}"
    );
}

/// Rewrites the ops file `file` with its columns changed by `f` (given the columns
/// and the index of a column by name).
fn rewrite_ops(file: &Path, f: impl Fn(&mut Vec<arrow_array::ArrayRef>, &dyn Fn(&str) -> usize)) {
    let schema = <OpsTable as zcta::tables::Table>::schema();
    let index = |name: &str| schema.index_of(name).unwrap();
    let batches: Vec<_> = zcta::reader::read_file(file, &schema)
        .unwrap()
        .into_iter()
        .map(|b| {
            let mut cols = b.columns().to_vec();
            f(&mut cols, &index);
            arrow_array::RecordBatch::try_new(schema.clone(), cols).unwrap()
        })
        .collect();
    std::fs::remove_file(file).unwrap();
    zcta::sink::write_parquet_file::<OpsTable>(file, &batches).unwrap();
}

/// An ops row whose call returned before it was made (`api_end_ns < api_start_ns`: a
/// corrupt value) is left out of every figure and its file named with how many (exit
/// 1), as a time out of range is: never a negative time in the report.
#[test]
fn a_return_before_the_entry_is_left_out_and_named() {
    let (_t, dir) = run_dir();
    let file = dir.join("ops").join("hostB-r3-p201-00000.parquet");
    rewrite_ops(&file, |cols, i| {
        // The first five rows' entry and return swapped.
        let (s, e) = (i("api_start_ns"), i("api_end_ns"));
        let swap = |a: &arrow_array::ArrayRef, b: &arrow_array::ArrayRef| -> arrow_array::ArrayRef {
            let (a, b) = (
                a.as_any().downcast_ref::<arrow_array::Int64Array>().unwrap(),
                b.as_any().downcast_ref::<arrow_array::Int64Array>().unwrap(),
            );
            std::sync::Arc::new(arrow_array::Int64Array::from_iter_values(
                (0..a.len()).map(|k| if k < 5 { b.value(k) } else { a.value(k) }),
            ))
        };
        let (new_s, new_e) = (swap(&cols[s], &cols[e]), swap(&cols[e], &cols[s]));
        (cols[s], cols[e]) = (new_s, new_e);
    });
    let d = dir.to_str().unwrap();
    let outs = each_names_damage(
        &[
            vec!["summary", d],
            vec!["report", d, "--format", "json"],
            vec!["phases", d],
        ],
        |_, err, what| {
            assert!(
                named(
                    err,
                    &file,
                    "5 ops rows left out: the call's return before its entry"
                ),
                "{what}"
            );
        },
    );
    let j: serde_json::Value = serde_json::from_str(&outs[1]).unwrap();
    assert_eq!(group(&j, "AllReduce")["count"].as_u64(), Some(195), "{j}");
}

/// A pending write-ahead log of any table counts in the report's note, as in `zcta
/// summary`: `zcta recover` turns each into Parquet, including those of tables the
/// report does not read (`comms`, `nccl_ops`).
#[test]
fn pending_logs_of_every_table_are_counted() {
    let (_t, dir) = run_dir();
    for t in ["comms", "nccl_ops", "ops"] {
        std::fs::create_dir_all(dir.join(t)).unwrap();
        std::fs::write(dir.join(t).join("_hostA-r0-p100-00009.wal"), b"").unwrap();
    }
    let j = json(&dir);
    let notes = j["notes"].to_string();
    assert!(notes.contains("3 write-ahead logs pending"), "{notes}");
}
