//! The CLI never harms what it did not make: outputs that are not regular files are
//! written to, not replaced; logs it cannot read are kept; links and special files in
//! a run directory are not followed or opened; bad input is named with its path and
//! the exit status says so.

mod common;
mod support;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use zcta::gpu::OpRow;
use zcta::nccl::OpKind;
use zcta::record::OpRecord;
use zcta::sink::{DatasetWriter, SinkPolicy, write_process_file};
use zcta::tables::{Ctx, OpsTable, ProcessRow};

fn zcta_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zcta"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("running zcta")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn op_row(rank: i32, pid: i32, op_id: u64, seq: u64, t0: i64) -> OpRow {
    OpRow {
        rec: OpRecord {
            comm_id: Some(0xC0),
            comm_ptr: 0x1000,
            rank: Some(rank),
            nranks: Some(2),
            seq: Some(seq),
            call_seq: Some(seq),
            count: 1024,
            dtype: 7,
            bytes: Some(4096),
            redop: Some(0),
            sendbuff: 0x7000_0000,
            recvbuff: 0x8000_0000,
            stream: 0x55,
            device: Some(rank),
            api_start_ns: t0,
            api_end_ns: t0 + 5_000,
            tid: pid,
            ..OpRecord::blank(op_id, OpKind::AllReduce)
        },
        gpu: None,
    }
}

/// A small complete run of two ranks (10 AllReduce each) in `dir`, written by the sink.
fn small_run(dir: &Path) {
    run_of(dir, 10);
}

/// A complete run of two ranks, `ops` AllReduce each, in `dir`, written by the sink.
fn run_of(dir: &Path, ops: u64) {
    for rank in 0..2 {
        let pid = 100 + rank;
        let prefix = format!("hostA-r{rank}-p{pid}");
        let ctx = Ctx {
            pid,
            host: "hostA".into(),
        };
        let mut w = DatasetWriter::<OpsTable>::new(dir, &prefix, SinkPolicy::default());
        for k in 0..ops {
            let t0 = 1_000_000_000_000 + k as i64 * 1_000_000;
            w.append(&op_row(rank, pid, k + 1, k, t0), &ctx).unwrap();
        }
        w.close().unwrap();
        let row = ProcessRow {
            run_id: "small".into(),
            run_id_source: "ZCTA_RUN_ID".into(),
            zcta_version: "test".into(),
            schema_version: zcta::SCHEMA_VERSION,
            clock: "CLOCK_REALTIME".into(),
            end_reason: "exit".into(),
            env_json: "{}".into(),
            profiler_plugin: "zcta".into(),
            cupti: "off: ZCTA_CUPTI=0".into(),
            ..ProcessRow::default()
        };
        write_process_file(dir, &prefix, &row, &ctx).unwrap();
    }
}

fn tmp_run() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("run");
    small_run(&d);
    (t, d)
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn is_trace(s: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(s).is_ok_and(|v| v["traceEvents"].is_array())
}

/// An export interrupted while it writes (Ctrl-C, a scheduler's SIGTERM) leaves no
/// temporary file (a trace of a large run is hundreds of MB) and the file it would
/// have replaced as it was; the process still ends by that signal.
#[test]
fn an_interrupted_export_leaves_no_temporary_file() {
    use std::os::unix::process::ExitStatusExt;
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    run_of(&run, 300_000);
    let cwd = t.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    for sig in [libc::SIGINT, libc::SIGTERM] {
        std::fs::write(cwd.join("trace.json"), b"the earlier trace").unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_zcta"))
            .args(["export", "--perfetto", run.to_str().unwrap(), "-o", "trace.json"])
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Signalled once its temporary file is there (the trace is being written).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while temporaries_in(&cwd).is_empty() && std::time::Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            !temporaries_in(&cwd).is_empty(),
            "the trace was written before a signal could come"
        );
        let name = if sig == libc::SIGINT { "-INT" } else { "-TERM" };
        let killed = Command::new("kill")
            .args([name, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(sig), "{status:?}");
        assert!(temporaries_in(&cwd).is_empty(), "{:?}", names_in(&cwd));
        assert_eq!(
            std::fs::read(cwd.join("trace.json")).unwrap(),
            b"the earlier trace"
        );
    }
}

/// The trace never replaces or joins a dataset: not a file of the run it is drawn
/// from (a Parquet file of its ops was once replaced by the trace, losing the rank),
/// not a new file in one of its table directories (its readers would meet it), not
/// another run's Parquet file or log, nor any of them through a link; a new file
/// directly in the run directory is fine.
#[test]
fn export_never_writes_over_or_into_a_dataset() {
    let (t, run) = tmp_run();
    let run_s = run.to_str().unwrap();
    let cwd = t.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let other = t.path().join("other");
    small_run(&other);
    let parquet_in = |dir: &Path| {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("ops"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
            .collect();
        v.sort();
        v
    };
    let own = parquet_in(&run)[0].clone();
    let theirs = parquet_in(&other)[0].clone();
    let log = other.join("ops").join("_hostA-r0-p100-00009.wal");
    std::fs::write(&log, [0xff, 0xff, 0xff, 0xff, 8, 0, 0, 0]).unwrap();
    let link = cwd.join("latest.json");
    std::os::unix::fs::symlink(&own, &link).unwrap();
    let before: Vec<(PathBuf, Vec<u8>)> = [&own, &theirs, &log]
        .iter()
        .map(|p| (p.to_path_buf(), std::fs::read(p).unwrap()))
        .collect();
    let new_in_table = run.join("ops").join("trace.json");
    for (out, says) in [
        (own.to_str().unwrap(), "inside the run directory"),
        ("latest.json", "inside the run directory"),
        (new_in_table.to_str().unwrap(), "inside the run directory"),
        (
            theirs.to_str().unwrap(),
            "a Parquet file (data, not a trace): not replaced",
        ),
        (
            log.to_str().unwrap(),
            "an Arrow stream (data, not a trace): not replaced",
        ),
    ] {
        let o = zcta_in(&cwd, &["export", "--perfetto", run_s, "-o", out]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{out}: {err}");
        assert!(err.contains(says), "{out}: {err}");
        for (p, bytes) in &before {
            assert_eq!(&std::fs::read(p).unwrap(), bytes, "{out} changed {}", p.display());
        }
        assert!(!new_in_table.exists(), "{out}");
        for d in [run.join("ops"), other.join("ops"), cwd.clone()] {
            assert!(temporaries_in(&d).is_empty(), "{out}: {:?}", names_in(&d));
        }
    }
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    // A new file at the run directory's top: written, and the run still reads whole.
    let o = zcta_in(
        &cwd,
        &[
            "export",
            "--perfetto",
            run_s,
            "-o",
            &format!("{run_s}/trace.json"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(is_trace(
        &std::fs::read_to_string(run.join("trace.json")).unwrap()
    ));
    let o = zcta_in(&cwd, &["report", run_s]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// `-o -` is stdout; `-o LINK` writes through the link and keeps it; `-o FIFO` feeds
/// the FIFO; a failed export leaves no temporary file and no output behind.
#[test]
fn export_writes_to_what_the_output_is_and_never_replaces_it() {
    let (t, run) = tmp_run();
    let run_s = run.to_str().unwrap();
    let cwd = t.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();

    // `-`: the trace on stdout, no file named `-`.
    let o = zcta_in(&cwd, &["export", "--perfetto", run_s, "-o", "-"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        is_trace(&text(&o.stdout)),
        "stdout is the trace: {}",
        text(&o.stdout)
    );
    assert!(names_in(&cwd).is_empty(), "{:?}", names_in(&cwd));

    // A symlink: its target gets the trace, the link stays a link.
    let target = t.path().join("target.json");
    std::fs::write(&target, b"old").unwrap();
    let link = cwd.join("trace.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = zcta_in(&cwd, &["export", "--perfetto", run_s, "-o", "trace.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(),
        "the link was replaced"
    );
    assert!(is_trace(&std::fs::read_to_string(&target).unwrap()));
    assert_eq!(names_in(&cwd), ["trace.json"]);

    // A link to our stdout, as /dev/stdout is: stdout holds the trace and nothing else.
    let own = cwd.join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &own).unwrap();
    let o = zcta_in(&cwd, &["export", "--perfetto", run_s, "-o", "stdout"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        is_trace(&text(&o.stdout)),
        "stdout is the trace: {}",
        text(&o.stdout)
    );
    assert!(std::fs::symlink_metadata(&own).unwrap().file_type().is_symlink());
    std::fs::remove_file(&own).unwrap();

    // A FIFO: the reader gets the trace, the FIFO stays a FIFO.
    let fifo = cwd.join("pipe.json");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    let (tx, rx) = std::sync::mpsc::channel();
    let f2 = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read_to_string(&f2));
    });
    let o = zcta_in(
        &cwd,
        &["export", "--perfetto", run_s, "-o", fifo.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(),
        "the FIFO was replaced"
    );
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the FIFO's reader got an end of file")
        .unwrap();
    assert!(is_trace(&got), "{got}");

    // A regular file is replaced whole; nothing else is left in its directory.
    let plain = cwd.join("plain.json");
    std::fs::write(&plain, vec![b'x'; 1 << 20]).unwrap();
    let o = zcta_in(&cwd, &["export", "--perfetto", run_s, "-o", "plain.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(is_trace(&std::fs::read_to_string(&plain).unwrap()));
    assert_eq!(names_in(&cwd), ["pipe.json", "plain.json", "trace.json"]);

    // A failed export (a table that is not a directory) leaves nothing behind.
    let broken = t.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::write(broken.join("ops"), b"not a directory").unwrap();
    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let o = zcta_in(
        &out_dir,
        &["export", "--perfetto", broken.to_str().unwrap(), "-o", "new.json"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("ops"), "{}", text(&o.stderr));
    assert!(names_in(&out_dir).is_empty(), "{:?}", names_in(&out_dir));
}

/// `rows` ops rows of process 42 on "elsewhere", in one batch.
fn ops_batch(rows: u64) -> arrow_array::RecordBatch {
    use zcta::tables::{RowBuilder, Table};
    let ctx = Ctx {
        pid: 42,
        host: "elsewhere".into(),
    };
    let mut b = <OpsTable as Table>::Builder::default();
    for k in 0..rows {
        b.append(&op_row(0, 42, k + 1, k, 1_000_000 + k as i64), &ctx);
    }
    b.finish(&OpsTable::schema()).unwrap()
}

/// A log of `rows` ops rows in one batch, as a killed writer leaves it (schema, batch).
fn ops_log(path: &Path, rows: u64) {
    use arrow_ipc::writer::StreamWriter;
    use zcta::tables::Table;
    let mut w = StreamWriter::try_new(std::fs::File::create(path).unwrap(), &OpsTable::schema()).unwrap();
    if rows > 0 {
        w.write(&ops_batch(rows)).unwrap();
    }
    w.flush().unwrap();
}

/// `zcta recover` deletes a log without recovering rows only when it is provably
/// empty; one it cannot decode is kept, named on stderr, and the exit status is 1.
#[test]
fn recover_keeps_every_log_it_cannot_decode() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let ops = run.join("ops");
    std::fs::create_dir_all(&ops).unwrap();
    // 300 KB that are not a log.
    let garbage = ops.join("_elsewhere-p42-00000.wal");
    let junk: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&garbage, &junk).unwrap();
    // A log whose only batch was cut short (a full disk): the schema, then 2 MB of a
    // batch that never completed.
    let cut = ops.join("_elsewhere-p43-00000.wal");
    ops_log(&cut, 40_000);
    let len = std::fs::metadata(&cut).unwrap().len();
    assert!(len > 2_000_000, "{len}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .unwrap()
        .set_len(2_000_000)
        .unwrap();
    // A readable segment next to its log would make the log stale; a damaged one does not.
    let beside = ops.join("_elsewhere-p44-00000.wal");
    std::fs::write(&beside, b"garbage").unwrap();
    std::fs::write(ops.join("elsewhere-p44-00000.parquet"), b"PAR1 cut short").unwrap();
    // Provably empty: no byte at all, and a schema with nothing after it.
    let zero = ops.join("_elsewhere-p45-00000.wal");
    std::fs::write(&zero, b"").unwrap();
    let schema_only = ops.join("_elsewhere-p46-00000.wal");
    ops_log(&schema_only, 0);
    // A log that does not decode next to a complete file: what it held is unknown.
    let undecodable = ops.join("_elsewhere-p47-00000.wal");
    std::fs::write(&undecodable, b"garbage").unwrap();
    zcta::sink::write_parquet_file::<OpsTable>(&ops.join("elsewhere-p47-00000.parquet"), &[ops_batch(3)])
        .unwrap();
    // Logs whose unfinished-file name holds something that is not a Parquet file
    // zcta began (a user's file, a link): the file stays, and so does the log.
    let beside_foreign = ops.join("_elsewhere-p48-00000.wal");
    ops_log(&beside_foreign, 3);
    let foreign = ops.join("_elsewhere-p48-00000.parquet.tmp");
    std::fs::write(&foreign, b"user data").unwrap();
    let empty_beside_link = ops.join("_elsewhere-p49-00000.wal");
    std::fs::write(&empty_beside_link, b"").unwrap();
    let link = ops.join("_elsewhere-p49-00000.parquet.tmp");
    std::os::unix::fs::symlink(&foreign, &link).unwrap();
    // Another program's stream at a log's name, its schema alone: not zcta's.
    let payroll = ops.join("_payroll.wal");
    {
        let schema = std::sync::Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "salary",
            arrow_schema::DataType::Int64,
            false,
        )]));
        let mut w =
            arrow_ipc::writer::StreamWriter::try_new(std::fs::File::create(&payroll).unwrap(), &schema)
                .unwrap();
        w.flush().unwrap();
    }
    // A link at a log's final name, to a complete file: zcta makes no links there.
    let beside_link = ops.join("_elsewhere-p51-00000.wal");
    ops_log(&beside_link, 3);
    std::os::unix::fs::symlink(
        ops.join("elsewhere-p47-00000.parquet"),
        ops.join("elsewhere-p51-00000.parquet"),
    )
    .unwrap();
    // A recoverable log whose writer left its unfinished Parquet file: that file goes.
    let unfinished_log = ops.join("_elsewhere-p50-00000.wal");
    ops_log(&unfinished_log, 3);
    let unfinished = ops.join("_elsewhere-p50-00000.parquet.tmp");
    std::fs::write(&unfinished, b"PAR1, then cut short").unwrap();

    let o = zcta_in(t.path(), &["recover", run.to_str().unwrap()]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    for kept in [
        &garbage,
        &cut,
        &beside,
        &undecodable,
        &beside_foreign,
        &empty_beside_link,
        &payroll,
        &beside_link,
    ] {
        assert!(kept.exists(), "{} was deleted\n{out}\n{err}", kept.display());
        assert!(
            err.contains(&format!("cannot recover {}", kept.display())),
            "{} not named\n{err}",
            kept.display()
        );
        assert!(!out.contains(&kept.display().to_string()), "{out}");
    }
    assert_eq!(std::fs::read(&garbage).unwrap(), junk);
    assert_eq!(std::fs::metadata(&cut).unwrap().len(), 2_000_000);
    assert_eq!(std::fs::read(&foreign).unwrap(), b"user data");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert!(
        err.contains("not an unfinished Parquet file of zcta's: kept"),
        "{err}"
    );
    assert!(err.contains("not a zcta log of this table"), "{err}");
    assert!(err.contains("exists but is a link (zcta writes none)"), "{err}");
    assert!(!unfinished_log.exists() && !unfinished.exists(), "{out}\n{err}");
    assert!(
        out.contains("recovered 3 rows") || out.contains("3 rows"),
        "{out}"
    );
    for gone in [&zero, &schema_only] {
        assert!(!gone.exists(), "{} kept\n{out}", gone.display());
        assert!(
            out.contains(&format!("removed empty log {}", gone.display())),
            "{out}"
        );
    }
    // Twice: the same logs are kept and named again.
    let o = zcta_in(t.path(), &["recover", run.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(garbage.exists() && cut.exists() && beside.exists());
    assert!(undecodable.exists() && beside_foreign.exists() && foreign.exists() && payroll.exists());
}

/// Runs `zcta ARGS` with a time limit; `None` when it had to be killed.
fn zcta_within(cwd: &Path, args: &[&str], limit: Duration) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_zcta"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Links to directories inside a run are not followed (two links to `.` made every
/// command run until killed; one counted every file again per level) and entries that
/// are not regular files are never opened (a FIFO named `*.parquet` blocked every
/// reader): each is named as skipped and the rest is read once.
#[test]
fn links_and_special_files_in_a_run_are_named_not_followed() {
    let (t, run) = tmp_run();
    let ops = run.join("ops");
    std::os::unix::fs::symlink(".", ops.join("loop")).unwrap();
    std::os::unix::fs::symlink("..", ops.join("up")).unwrap();
    let fifo = ops.join("hostB-p7-00000.parquet");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let wal_fifo = ops.join("_hostB-p8-00000.wal");
    assert!(Command::new("mkfifo").arg(&wal_fifo).status().unwrap().success());
    let run_s = run.to_str().unwrap();
    let limit = Duration::from_secs(20);
    let out_json = t.path().join("trace.json");
    for args in [
        vec!["summary", run_s],
        vec!["report", run_s],
        vec!["report", run_s, "--format", "json"],
        vec!["diff", run_s, run_s],
        vec!["export", "--perfetto", run_s, "-o", out_json.to_str().unwrap()],
        vec!["phases", run_s],
        vec!["recover", run_s],
    ] {
        let o = zcta_within(t.path(), &args, limit)
            .unwrap_or_else(|| panic!("zcta {args:?} still ran after {limit:?}"));
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(1), "zcta {args:?}\n{out}\n{err}");
        let named = |p: &Path| err.contains(&p.display().to_string());
        if args[0] == "recover" {
            assert!(named(&wal_fifo), "zcta {args:?}\n{err}");
        } else {
            assert!(named(&fifo), "zcta {args:?}\n{err}");
            assert!(err.contains("FIFO"), "zcta {args:?}\n{err}");
        }
        assert!(
            named(&ops.join("loop")) && named(&ops.join("up")),
            "zcta {args:?}\n{err}"
        );
        assert!(err.contains("not followed"), "zcta {args:?}\n{err}");
        if args[0] == "summary" {
            assert!(out.contains("20 rows in 2 files"), "every file once\n{out}");
        }
        if args.len() == 4 && args[0] == "report" {
            let j: serde_json::Value = serde_json::from_str(&out).unwrap();
            let n: u64 = j["groups"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g["count"].as_u64().unwrap_or(0))
                .sum();
            assert_eq!(n, 20, "{out}");
        }
    }
    // The FIFOs are still FIFOs, the links still links.
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(
        std::fs::symlink_metadata(&wal_fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(
        std::fs::symlink_metadata(ops.join("loop"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

/// A run without ops rows is an error (exit 2) that says why there may be none: in
/// either place of `diff`, with write-ahead logs left to recover, with the only ops
/// file unreadable (named).
#[test]
fn no_ops_rows_is_an_error_that_says_why() {
    let (t, good) = tmp_run();
    let good_s = good.to_str().unwrap();
    let empty = t.path().join("empty");
    std::fs::create_dir_all(empty.join("ops")).unwrap();
    let empty_s = empty.to_str().unwrap();
    for args in [["diff", good_s, empty_s], ["diff", empty_s, good_s]] {
        let o = zcta_in(t.path(), &args);
        let err = text(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(2),
            "zcta {args:?}\n{}\n{err}",
            text(&o.stdout)
        );
        assert!(
            err.contains(&format!("{empty_s}: no ops rows")),
            "zcta {args:?}\n{err}"
        );
    }

    // Killed and not recovered: only a log.
    let killed = t.path().join("killed");
    std::fs::create_dir_all(killed.join("ops")).unwrap();
    ops_log(&killed.join("ops").join("_elsewhere-p42-00000.wal"), 10);
    let killed_s = killed.to_str().unwrap();
    for args in [vec!["report", killed_s], vec!["diff", good_s, killed_s]] {
        let o = zcta_in(t.path(), &args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "zcta {args:?}\n{err}");
        assert!(
            err.contains(&format!("run `zcta recover {killed_s}`")),
            "zcta {args:?}\n{err}"
        );
    }

    // The only ops file is corrupt: named.
    let corrupt = t.path().join("corrupt");
    std::fs::create_dir_all(corrupt.join("ops")).unwrap();
    let bad = corrupt.join("ops").join("hostA-p1-00000.parquet");
    std::fs::write(&bad, b"PAR1 not really parquet PAR1").unwrap();
    let o = zcta_in(t.path(), &["report", corrupt.to_str().unwrap()]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("skipped {}", bad.display())), "{err}");
    assert!(err.contains("no ops rows"), "{err}");
}

/// `zcta run` reports the directory the shim wrote to (the run id made one directory
/// name), names a run directory only when there is one, and exits as a shell would
/// when the command cannot be started.
#[test]
fn zcta_run_says_where_the_data_went_and_why_not() {
    let out = tempfile::tempdir().unwrap();
    let idf = out.path().join("id");
    common::write_unique_id(&idf);
    let shim = common::shim_path();
    let host = common::fixtures().host.clone();
    let run = |id: Option<&str>, cmd: &[&std::ffi::OsStr]| {
        let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
        c.arg("run").arg("--out").arg(out.path()).arg("--shim").arg(&shim);
        if let Some(id) = id {
            c.args(["--run-id", id]);
        }
        c.arg("--").args(cmd);
        c.output().unwrap()
    };
    let o = run(
        Some("a/b"),
        &[
            host.as_os_str(),
            "ops".as_ref(),
            "0".as_ref(),
            "1".as_ref(),
            idf.as_os_str(),
            "2".as_ref(),
        ],
    );
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    let dir = out.path().join("a_b");
    assert!(dir.join("ops").is_dir());
    assert!(!out.path().join("a").exists());
    assert!(
        stderr.contains(&format!("run directory {}", dir.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("no NCCL call"), "{stderr}");
    assert!(stdout.contains("AllReduce"), "the report: {stdout}");

    let o = run(Some("nothing"), &["false".as_ref()]);
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no NCCL call was recorded"), "{stderr}");
    assert!(!stderr.contains("; run directory"), "{stderr}");

    let o = run(None, &["/nonexistent/command".as_ref()]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("/nonexistent/command"),
        "{}",
        text(&o.stderr)
    );
    let not_exec = out.path().join("not-executable");
    std::fs::write(&not_exec, b"#!/bin/sh\n").unwrap();
    let o = run(None, &[not_exec.as_os_str()]);
    assert_eq!(o.status.code(), Some(126), "{}", text(&o.stderr));
}

/// How to run a command as pid 1 of its own pid namespace here, if this machine lets us.
fn pid_namespace() -> Option<Vec<&'static str>> {
    [
        vec!["unshare", "--pid", "--fork"],
        vec!["unshare", "--user", "--map-root-user", "--pid", "--fork"],
    ]
    .into_iter()
    .find(|pre| {
        support::clean_cmd(pre[0])
            .args(&pre[1..])
            .args(["sh", "-c", "test $$ = 1"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Two processes with the same host name and pid (each pid 1 of its own namespace, as
/// containers with host networking are) keep their own files, and the readers say
/// that two processes claim one (host, pid).
#[test]
fn processes_sharing_a_host_and_pid_keep_their_own_files() {
    let Some(pre) = pid_namespace() else {
        eprintln!(
            "no pid namespace can be made here (unshare): processes_sharing_a_host_and_pid_keep_their_own_files skipped"
        );
        return;
    };
    let run = support::Run::new("same-pid");
    for k in 0..2 {
        let idf = run.scratch(&format!("uid{k}"));
        common::write_unique_id(&idf);
        let mut c = support::clean_cmd(pre[0]);
        c.args(&pre[1..])
            .arg(&common::fixtures().host)
            .args(["ops", "0", "1", idf.to_str().unwrap(), "2"]);
        run.apply(&mut c);
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    let procs = support::read_rows(&run.dir(), "process");
    assert_eq!(procs.len(), 2, "one process row each: {procs:?}");
    assert!(procs.iter().all(|p| p.i32("pid") == Some(1)), "{procs:?}");
    assert_eq!(
        support::read_rows(&run.dir(), "ops").len(),
        44,
        "22 ops rows each"
    );
    let o = zcta_in(run.out_dir(), &["summary", run.dir().to_str().unwrap()]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        text(&o.stdout).contains("44 rows in 2 files"),
        "{}",
        text(&o.stdout)
    );
    assert!(
        err.contains("2 processes claim host") && err.contains(" pid 1 "),
        "{err}"
    );
    let o = zcta_in(run.out_dir(), &["report", run.dir().to_str().unwrap()]);
    assert!(
        text(&o.stdout).contains("2 processes claim host"),
        "{}",
        text(&o.stdout)
    );
}

/// Files of two processes that claim one (host, pid) are named as such, whatever
/// wrote them (here: an older zcta's name without a token next to a newer one).
#[test]
fn readers_name_two_processes_claiming_one_host_and_pid() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    // Their own rows (byte-identical files would be one file's copy, read once).
    for (i, prefix) in ["box-p1", "box-p1-u0123abcd"].into_iter().enumerate() {
        let ctx = Ctx {
            pid: 1,
            host: "box".into(),
        };
        let mut w = DatasetWriter::<OpsTable>::new(&run, prefix, SinkPolicy::default());
        for k in 0..3u64 {
            w.append(
                &op_row(0, 1, k + 1, k, 1_000_000 * (i as i64 + 1) + k as i64),
                &ctx,
            )
            .unwrap();
        }
        w.close().unwrap();
    }
    let o = zcta_in(t.path(), &["summary", run.to_str().unwrap()]);
    let err = text(&o.stderr);
    assert!(
        err.contains("2 processes claim host box pid 1 (files box-p1*, box-p1-u0123abcd*)"),
        "{err}"
    );
    // The trace draws them as one process, and says so.
    let o = zcta_in(
        t.path(),
        &["export", "--perfetto", run.to_str().unwrap(), "-o", "-"],
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("2 processes claim host box pid 1")
            && err.contains("the trace draws them as one process"),
        "{err}"
    );
}

/// Settings out of range or not understood get one warning each and their default:
/// `ZCTA_EXIT_TIMEOUT_MS=0` lost the calls and comms rows, `ZCTA_ENABLE=banana` and
/// `ZCTA_CUPTI=maybe` were taken as on without a word.
#[test]
fn bad_settings_get_one_warning_and_lose_nothing() {
    let run = support::Run::new("settings");
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let mut c = run.host(&["ops", "0", "1", idf.to_str().unwrap(), "2"]);
    c.env("ZCTA_EXIT_TIMEOUT_MS", "0")
        .env("ZCTA_ENABLE", "banana")
        .env("ZCTA_CUPTI", "maybe");
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "one warning per setting: {err}");
    for (line, name) in lines
        .iter()
        .zip(["ZCTA_ENABLE", "ZCTA_EXIT_TIMEOUT_MS", "ZCTA_CUPTI"])
    {
        assert!(line.starts_with("zcta:") && line.contains(name), "{err}");
    }
    assert_eq!(support::read_rows(&run.dir(), "ops").len(), 22);
    assert!(!support::read_rows(&run.dir(), "calls").is_empty());
    assert_eq!(support::read_rows(&run.dir(), "comms").len(), 1);
    assert_eq!(
        support::read_rows(&run.dir(), "process")[0].str("end_reason"),
        Some("exit")
    );
}

/// `ZCTA_NCCL_LIB` naming a library that is not NCCL is passed over with one warning;
/// the calls go to the NCCL the program loaded, and its results are unchanged.
#[test]
fn a_zcta_nccl_lib_that_is_not_nccl_changes_nothing() {
    let run = support::Run::new("not-nccl");
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let args = ["ops", "0", "1", idf.to_str().unwrap(), "2"];
    let plain = support::host_plain(&args).output().unwrap();
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let mut c = run.host(&args);
    c.env("ZCTA_NCCL_LIB", "libm.so.6");
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), plain.status.code(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), text(&plain.stdout));
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("ZCTA_NCCL_LIB=\"libm.so.6\" is not NCCL"), "{err}");
    let ops = support::read_rows(&run.dir(), "ops");
    assert_eq!(ops.len(), 22);
    assert!(ops.iter().all(|r| r.i32("result") == Some(0)), "{ops:?}");
    let p = support::read_rows(&run.dir(), "process");
    assert!(
        p[0].str("nccl_lib").is_some_and(|l| l.contains("libnccl")),
        "{p:?}"
    );

    // NCCL itself is taken, without a word.
    let run = support::Run::new("nccl-lib");
    let lib = common::fixtures().libnccl.to_str().unwrap().to_owned();
    let mut c = run.host(&args);
    c.env("ZCTA_NCCL_LIB", &lib);
    let o = c.output().unwrap();
    support::assert_ok(&o, &args);
    assert_eq!(
        support::read_rows(&run.dir(), "process")[0].str("nccl_lib"),
        Some(lib.as_str())
    );
}

/// `zcta phases` replaces only a phases table zcta wrote: a `phases` directory with
/// anything else in it, a link or a file there is named and left as it was; with no
/// ops rows (not a run, or its ops unreadable) it is an error and an earlier table
/// stays; a rerun replaces the table and leaves no staging directory behind.
#[test]
fn phases_replaces_only_its_own_table() {
    let (t, run) = tmp_run();
    let run_s = run.to_str().unwrap();
    let phases = run.join("phases");
    let rows = |o: &Output| text(&o.stdout).contains(": 20 rows");

    let o = zcta_in(t.path(), &["phases", run_s]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(rows(&o), "{}", text(&o.stdout));
    let first = names_in(&phases);
    assert_eq!(first.len(), 1, "{first:?}");
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let file = phases.join(&first[0]);
    let before = inode(&file);
    // A rerun replaces it (a new file of the same name); nothing else is left.
    let o = zcta_in(t.path(), &["phases", run_s]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(names_in(&phases), first);
    assert_ne!(inode(&file), before, "the table was written again");
    assert_eq!(names_in(&run), ["ops", "phases", "process"]);
    let mut kept = inode(&file);

    // On a disk that fills up while the table is written: either the new table is in
    // place, or the error says so and the earlier one is there as it was.
    let mut outcomes = std::collections::BTreeSet::new();
    for kib in 4..=64 {
        let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
        c.args(["phases", run_s])
            .env("LD_PRELOAD", &common::fixtures().libdisk)
            .env("FAKE_DISK_BYTES", (kib * 1024).to_string());
        let o = c.output().unwrap();
        let err = text(&o.stderr);
        assert_eq!(names_in(&run), ["ops", "phases", "process"], "{kib} KiB: {err}");
        assert_eq!(names_in(&phases), first, "{kib} KiB: {err}");
        match o.status.code() {
            Some(0) => outcomes.insert("replaced"),
            Some(2) => {
                assert_eq!(inode(&file), kept, "{kib} KiB: the earlier table stays\n{err}");
                assert!(err.contains("nothing was changed"), "{kib} KiB: {err}");
                // Its log written, its Parquet file not: the rows are in a log only.
                if err.contains(".parquet.tmp") {
                    outcomes.insert("kept, Parquet file failed");
                }
                outcomes.insert("kept")
            }
            c => panic!("{kib} KiB: exit {c:?}\n{err}"),
        };
        if o.status.success() {
            assert!(rows(&o), "{kib} KiB: {}", text(&o.stdout));
            kept = inode(&file);
        }
    }
    assert_eq!(outcomes.len(), 3, "every outcome seen: {outcomes:?}");

    // A file of the user's beside the table: nothing is removed, the error names it.
    let notes = phases.join("NOTES.txt");
    std::fs::write(&notes, "mine").unwrap();
    let o = zcta_in(t.path(), &["phases", run_s]);
    let err = text(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains(&notes.display().to_string()), "{err}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine");
    assert_eq!(names_in(&phases).len(), 2);
    assert_eq!(names_in(&run), ["ops", "phases", "process"]);
    std::fs::remove_file(&notes).unwrap();

    // A Parquet file named like the table's but not zcta's is not the table's either,
    // nor are a log or a temporary file that only have the table's names.
    for (name, bytes) in [
        ("phases-00009.parquet", &b"PAR1 someone else's PAR1"[..]),
        ("_phases-00007.wal", &b"my notes"[..]),
        ("_phases-00008.parquet.tmp", &b"PAR1 half of someone's"[..]),
    ] {
        let foreign = phases.join(name);
        std::fs::write(&foreign, bytes).unwrap();
        let o = zcta_in(t.path(), &["phases", run_s]);
        let err = text(&o.stderr);
        assert_ne!(o.status.code(), Some(0), "{name}: {err}");
        assert!(err.contains(&foreign.display().to_string()), "{name}: {err}");
        assert_eq!(std::fs::read(&foreign).unwrap(), bytes, "{name}");
        std::fs::remove_file(&foreign).unwrap();
    }
    // A log of the phases table's columns (what zcta's writer leaves when it is
    // stopped) is the table's: replaced with it.
    let log = phases.join("_phases-00007.wal");
    {
        let schema = zcta::tables::schema_of("phases").unwrap();
        let f = std::fs::File::create(&log).unwrap();
        let mut w = arrow_ipc::writer::StreamWriter::try_new(f, &schema).unwrap();
        w.finish().unwrap();
    }
    let o = zcta_in(t.path(), &["phases", run_s]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(!log.exists(), "the table's own log goes with it");

    // A link where the table goes: kept, and its target untouched.
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("thesis.tex"), "ch1").unwrap();
    let kept = t.path().join("kept-phases");
    std::fs::rename(&phases, &kept).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &phases).unwrap();
    let o = zcta_in(t.path(), &["phases", run_s]);
    let err = text(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert!(
        std::fs::symlink_metadata(&phases)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(names_in(&elsewhere), ["thesis.tex"]);
    std::fs::remove_file(&phases).unwrap();
    std::fs::rename(&kept, &phases).unwrap();

    // Its ops unreadable: exit 2, and the earlier table is still there.
    for f in std::fs::read_dir(run.join("ops")).unwrap() {
        let f = f.unwrap().path();
        let n = std::fs::metadata(&f).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(n / 3)
            .unwrap();
    }
    let o = zcta_in(t.path(), &["phases", run_s]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no ops rows") && err.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(names_in(&phases), first);
    assert_eq!(names_in(&run), ["ops", "phases", "process"]);

    // Not a run at all: exit 2 and no phases directory made.
    let mine = t.path().join("project");
    std::fs::create_dir_all(mine.join("phases").join("moon")).unwrap();
    std::fs::write(mine.join("phases").join("moon").join("ch1.tex"), "thesis").unwrap();
    let o = zcta_in(t.path(), &["phases", mine.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(mine.join("phases").join("moon").join("ch1.tex")).unwrap(),
        "thesis"
    );
}

/// A relative `ZCTA_OUT` (and `zcta run --out`) means the directory the program was
/// started in, also when it changes directory after it started (before its first NCCL
/// call, as Hydra does); a `ZCTA_OUT` that is not UTF-8 is the path it names, and a
/// run id that is not is made one directory name with a warning; `zcta run` says when
/// it adds to an existing run.
#[test]
fn the_run_directory_is_where_the_program_started() {
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    let idf = t.path().join("id");
    common::write_unique_id(&idf);
    let f = common::fixtures();
    let shim = common::shim_path();
    let start = t.path().join("start");
    let moved = start.join("moved");
    std::fs::create_dir_all(&moved).unwrap();
    let ops = [
        f.host.as_os_str(),
        "ops".as_ref(),
        "0".as_ref(),
        "1".as_ref(),
        idf.as_os_str(),
        "3".as_ref(),
    ];
    let shimmed = |out: &std::ffi::OsStr, id: &std::ffi::OsStr| {
        let mut c = support::clean_cmd(ops[0]);
        c.args(&ops[1..])
            .current_dir(&start)
            .env("HOST_CHDIR", &moved)
            .env("LD_PRELOAD", &shim)
            .env("ZCTA_OUT", out)
            .env("ZCTA_RUN_ID", id);
        c.output().unwrap()
    };
    let o = shimmed("rel".as_ref(), "r1".as_ref());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stderr), "", "no stray output");
    assert!(start.join("rel/r1/ops").is_dir(), "{:?}", names_in(&start));
    assert!(!moved.join("rel").exists());

    // Not UTF-8: the directory it names, and a run id of one directory name.
    let odd_out = std::ffi::OsStr::from_bytes(b"out\xff\xfe");
    let o = shimmed(odd_out, std::ffi::OsStr::from_bytes(b"r\xff2"));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        start.join(odd_out).join("r_2").join("ops").is_dir(),
        "{:?}",
        names_in(&start)
    );
    assert!(err.contains("ZCTA_RUN_ID") && err.contains("r_2"), "{err}");
    assert!(!err.contains("no ZCTA_RUN_ID"), "{err}");

    // zcta run with a relative --out and a command that changes directory.
    let sh = format!(
        "cd {} && exec {} ops 0 1 {} 3",
        moved.display(),
        f.host.display(),
        idf.display()
    );
    let zrun = || {
        let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
        c.current_dir(&start)
            .args(["run", "--out", "zr", "--run-id", "cd", "--shim"])
            .arg(&shim)
            .args(["--", "sh", "-c", &sh]);
        c.output().unwrap()
    };
    let o = zrun();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let dir = start.join("zr").join("cd");
    assert!(dir.join("ops").is_dir(), "{err}");
    assert!(err.contains(&format!("run directory {}", dir.display())), "{err}");
    assert!(!err.contains("already holds"), "{err}");
    let o = zrun();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("{} already holds a run", dir.display())),
        "{err}"
    );
}

/// A log whose writer holds its lock is left alone, with `--force` too, and the
/// message says why (not that its process runs on this host).
#[test]
fn recover_names_a_locked_log_as_being_written() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let ops = run.join("ops");
    std::fs::create_dir_all(&ops).unwrap();
    let wal = ops.join("_elsewhere-p42-00000.wal");
    ops_log(&wal, 10);
    let held = std::fs::File::open(&wal).unwrap();
    held.lock().unwrap();
    let run_s = run.to_str().unwrap();
    for args in [vec!["recover", run_s], vec!["recover", "--force", run_s]] {
        let o = zcta_in(t.path(), &args);
        let out = text(&o.stdout);
        assert_eq!(
            o.status.code(),
            Some(0),
            "zcta {args:?}\n{out}\n{}",
            text(&o.stderr)
        );
        assert!(out.contains(&format!("skipped {}", wal.display())), "{out}");
        assert!(out.contains("holds its lock"), "{out}");
        assert!(!out.contains("runs on this host"), "{out}");
        assert!(wal.exists());
    }
    drop(held);
    let o = zcta_in(t.path(), &["recover", run_s]);
    assert!(
        text(&o.stdout).contains("recovered 10 rows"),
        "{}",
        text(&o.stdout)
    );
}

/// The entries of `dir` that are temporary files zcta made.
fn temporaries_in(dir: &Path) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `-o LINK` to a file replaces the file the link leads to as a regular file is
/// replaced: only with a complete trace (a run with nothing to export, or a disk that
/// fills up, leaves it as it was), keeping the link a link and the file's permission
/// bits; a file without write permission is named and not replaced, through a link or
/// not.
#[test]
fn export_through_a_link_replaces_the_file_only_with_a_complete_trace() {
    let (t, run) = tmp_run();
    let run_s = run.to_str().unwrap();
    let cwd = t.path().join("cwd");
    let files = t.path().join("files");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::create_dir_all(&files).unwrap();
    let target = files.join("trace.json");
    std::fs::write(&target, b"the earlier trace").unwrap();
    set_mode(&target, 0o600);
    let link = cwd.join("latest.json");
    std::os::unix::fs::symlink("../files/trace.json", &link).unwrap();
    let unchanged = |what: &str, o: &Output| {
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "the earlier trace",
            "{what}: {}",
            text(&o.stderr)
        );
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert!(
            temporaries_in(&files).is_empty(),
            "{what}: {:?}",
            names_in(&files)
        );
        assert_eq!(names_in(&cwd), ["latest.json"], "{what}");
    };

    // A directory with nothing to export: nothing is written.
    let empty = t.path().join("empty");
    std::fs::create_dir_all(empty.join("ops")).unwrap();
    let o = zcta_in(
        &cwd,
        &[
            "export",
            "--perfetto",
            empty.to_str().unwrap(),
            "-o",
            "latest.json",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    unchanged("no ops rows", &o);

    // A disk that fills up while the trace is written.
    let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
    c.current_dir(&cwd)
        .args(["export", "--perfetto", run_s, "-o", "latest.json"])
        .env("LD_PRELOAD", &common::fixtures().libdisk)
        .env("FAKE_DISK_BYTES", "1024");
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    unchanged("full disk", &o);

    // A complete trace: in the file the link leads to, with its permission bits.
    let o = zcta_in(&cwd, &["export", "--perfetto", run_s, "-o", "latest.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(is_trace(&std::fs::read_to_string(&target).unwrap()));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(
        format!("{:04o}", mode_of(&target)),
        "0600",
        "the permission bits are kept"
    );
    assert_eq!(names_in(&files), ["trace.json"]);

    // A regular file keeps its permission bits too.
    let plain = cwd.join("plain.json");
    std::fs::write(&plain, b"mine").unwrap();
    set_mode(&plain, 0o640);
    let o = zcta_in(&cwd, &["export", "--perfetto", run_s, "-o", "plain.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(is_trace(&std::fs::read_to_string(&plain).unwrap()));
    assert_eq!(
        format!("{:04o}", mode_of(&plain)),
        "0640",
        "the permission bits are kept"
    );
    std::fs::remove_file(&plain).unwrap();

    // Read-only (by its permission bits, whoever runs this): named, not replaced.
    std::fs::write(&target, b"the earlier trace").unwrap();
    set_mode(&target, 0o400);
    let ro = files.join("ro.json");
    std::fs::write(&ro, b"the earlier trace").unwrap();
    set_mode(&ro, 0o444);
    for (out, named) in [("latest.json", &target), (ro.to_str().unwrap(), &ro)] {
        let o = zcta_in(&cwd, &["export", "--perfetto", run_s, "-o", out]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{out}: {err}");
        let named_as = std::fs::canonicalize(named).unwrap();
        assert!(
            err.contains("read-only") && err.contains(&named_as.display().to_string()),
            "{out}: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(named).unwrap(),
            "the earlier trace",
            "{out}"
        );
    }
    assert_eq!(format!("{:04o}", mode_of(&target)), "0400");
    assert_eq!(names_in(&files), ["ro.json", "trace.json"]);
}

/// `zcta run --shim PATH` (and `$ZCTA_SHIM`, and `zcta doctor --probe --shim`) refuses
/// a path with a space or a colon, at which `LD_PRELOAD` splits it (nothing would be
/// recorded), before running anything; a link to the same file whose path has neither
/// is taken as it is, and the command is recorded.
#[test]
fn a_shim_path_ld_preload_would_split_is_refused_before_anything_runs() {
    let t = tempfile::tempdir().unwrap();
    let idf = t.path().join("id");
    common::write_unique_id(&idf);
    let host = common::fixtures().host.clone();
    let marker = t.path().join("ran");
    let mut odd = Vec::new();
    for dir in ["with space", "with:colon"] {
        let d = t.path().join(dir);
        std::fs::create_dir(&d).unwrap();
        let shim = d.join("libzcta_prof.so");
        std::fs::copy(common::shim_path(), &shim).unwrap();
        odd.push(shim);
    }
    let zrun = |shim: Option<&Path>, env_shim: Option<&Path>, id: &str| {
        let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
        c.current_dir(t.path())
            .args(["run", "--out", "zr", "--run-id", id]);
        if let Some(s) = shim {
            c.arg("--shim").arg(s);
        }
        if let Some(s) = env_shim {
            c.env("ZCTA_SHIM", s);
        }
        c.arg("--").arg("sh").arg("-c").arg(format!(
            "touch '{}' && exec '{}' ops 0 1 '{}' 2",
            marker.display(),
            host.display(),
            idf.display()
        ));
        c.output().unwrap()
    };
    for shim in &odd {
        for (arg, env) in [(Some(shim.as_path()), None), (None, Some(shim.as_path()))] {
            let o = zrun(arg, env, "odd");
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{}: {err}", shim.display());
            assert!(
                err.contains(&shim.display().to_string())
                    && err.contains("LD_PRELOAD")
                    && err.contains("spaces and colons")
                    && err.contains("symbolic link"),
                "{err}"
            );
            assert!(!marker.exists(), "the command ran with {}", shim.display());
        }
    }

    // A link without either, to the same file: the command runs and is recorded.
    let plain = t.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let link = plain.join("libzcta_prof.so");
    std::os::unix::fs::symlink(&odd[0], &link).unwrap();
    let o = zrun(Some(&link), None, "linked");
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(marker.exists());
    assert!(t.path().join("zr/linked/ops").is_dir(), "{err}");
    assert!(out.contains("AllReduce"), "the report: {out}");

    // The doctor's probe preloads the shim the same way.
    let facts = probe_facts(t.path());
    let py = t.path().join("python");
    std::fs::write(&py, format!("#!/bin/sh\ntouch '{}'\n", marker.display())).unwrap();
    set_mode(&py, 0o755);
    std::fs::remove_file(&marker).unwrap();
    let j = probe_json(t.path(), &facts, &py, &odd[1], &[]);
    assert_eq!(j["probe"]["status"], "not_run", "{j}");
    let reason = j["probe"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("LD_PRELOAD") && reason.contains(odd[1].to_str().unwrap()),
        "{reason}"
    );
    assert!(!marker.exists(), "the probe ran");
}

/// `zcta doctor --facts FACTS --probe --json --python PY --shim SHIM EXTRA...` in
/// `cwd`: its JSON document.
fn probe_json(cwd: &Path, facts: &Path, py: &Path, shim: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "doctor",
        "--facts",
        facts.to_str().unwrap(),
        "--probe",
        "--json",
        "--python",
        py.to_str().unwrap(),
        "--shim",
        shim.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = zcta_in(cwd, &args);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}\n{}", text(&o.stdout), text(&o.stderr)))
}

/// Facts of a machine with two GPUs and torch, for `zcta doctor --facts` with
/// `--probe` (the probe then runs the `--python` it is given).
fn probe_facts(dir: &Path) -> PathBuf {
    let facts = serde_json::json!({
        "facts_version": 1,
        "host": {"hostname": "box", "kernel": "6.8.0"},
        "driver": {"nvml": "loaded", "version": "580.65.06", "version_source": "NVML",
                   "cuda_driver": 13000, "cuda_driver_source": "NVML", "kernel_module": true},
        "gpus": [{"index": 0, "uuid": "GPU-000", "bus_id": "0000:19:00.0", "nvlinks": []},
                 {"index": 1, "uuid": "GPU-111", "bus_id": "0000:3b:00.0", "nvlinks": []}],
        "pairs": [{"a": 0, "b": 1, "topology": "system", "p2p_read": "ok", "p2p_write": "ok"}],
        "nodes": {"count": 1, "source": "assumed"},
        "python": {"interpreter": "python3",
                   "torch": {"dir": "/sp/torch", "version": "2.11.0+cu130", "cuda": "13.0"}},
        "nccl": [], "cupti": [], "settings": [],
    });
    let p = dir.join("facts.json");
    std::fs::write(&p, facts.to_string()).unwrap();
    p
}

/// Whether this process ignores `sig` (so a child started from it does too).
fn ignored_here(sig: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let v = s.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
            u64::from_str_radix(v.trim(), 16).ok()
        })
        .is_some_and(|m| m & (1 << (sig - 1)) != 0)
}

/// `zcta run` waits for its command however the command is asked to end: SIGTERM
/// and SIGHUP sent to zcta go on to the command, SIGINT sent to the whole process group
/// (as a terminal's Ctrl-C is) reaches the command and leaves zcta waiting; zcta then
/// exits with the command's status, 128 + N for a command that signal N ended.
#[test]
fn zcta_run_waits_for_its_command_whatever_signal_comes() {
    use std::os::unix::process::CommandExt;
    let t = tempfile::tempdir().unwrap();
    let shim = common::shim_path();
    // (signal, sent to the whole group, the command's trap, the status expected)
    let cases = [
        (15, false, "trap 'echo 15 > got; sleep 0.3; exit 7' TERM", 7),
        (1, false, "trap 'echo 1 > got; sleep 0.3; exit 9' HUP", 9),
        (2, true, "trap 'echo 2 > got; sleep 0.3; exit 5' INT", 5),
        (3, true, "trap 'echo 3 > got; sleep 0.3; exit 6' QUIT", 6),
        (15, false, ":", 128 + 15),
    ];
    for (k, (sig, group, trap, want)) in cases.into_iter().enumerate() {
        if ignored_here(sig) {
            eprintln!("signal {sig} is ignored by this test process (so by the command): case skipped");
            continue;
        }
        let dir = t.path().join(format!("case{k}"));
        std::fs::create_dir(&dir).unwrap();
        let script = format!("echo $$ > pid; {trap}; touch ready; while :; do sleep 0.1; done");
        let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
        c.current_dir(&dir)
            .args(["run", "--out", "zr", "--run-id", "sig", "--shim"])
            .arg(&shim)
            .args(["--", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut zcta = c.spawn().unwrap();
        let t0 = std::time::Instant::now();
        while !dir.join("ready").exists() {
            if t0.elapsed() > Duration::from_secs(20) || zcta.try_wait().unwrap().is_some() {
                let _ = zcta.kill();
                let o = zcta.wait_with_output().unwrap();
                panic!("signal {sig}: the command never started\n{}", text(&o.stderr));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let to = if group {
            format!("-{}", zcta.id())
        } else {
            zcta.id().to_string()
        };
        let sent = Command::new("kill")
            .args([format!("-{sig}"), "--".into(), to])
            .status()
            .unwrap();
        assert!(sent.success());
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = zcta.try_wait().unwrap() {
                break Some(s);
            }
            if t0.elapsed() > Duration::from_secs(20) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Whatever happened, the command does not outlive the test.
        let pid = std::fs::read_to_string(dir.join("pid")).unwrap();
        let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        let Some(status) = status else {
            let _ = zcta.kill();
            panic!("signal {sig}: zcta still ran after 20 s");
        };
        let o = zcta.wait_with_output().unwrap();
        let err = text(&o.stderr);
        assert_eq!(status.code(), Some(want), "signal {sig}: {status:?}\n{err}");
        // Killed by the signal (no trap): said so, with the status zcta exits with.
        let says = if want > 128 {
            format!("\"sh\" was killed by signal {} (zcta exits {want})", want - 128)
        } else {
            format!("\"sh\" exited with {want}")
        };
        assert!(err.contains(&says), "signal {sig}: {err}");
        if trap != ":" {
            assert_eq!(
                std::fs::read_to_string(dir.join("got")).unwrap().trim(),
                sig.to_string(),
                "the command got the signal"
            );
        }
    }
}

/// `zcta run` without `--run-id` records under `run-<UNIX seconds>-<pid of zcta>`, as
/// its help says.
#[test]
fn the_default_run_id_is_what_the_help_says() {
    let o = zcta_in(Path::new("."), &["run", "--help"]);
    let help = text(&o.stdout);
    assert!(help.contains("run-<UNIX seconds>-<pid of zcta>"), "{help}");
    assert!(!help.contains("UTC"), "{help}");

    let t = tempfile::tempdir().unwrap();
    let idf = t.path().join("id");
    common::write_unique_id(&idf);
    let secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let before = secs();
    let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
    c.current_dir(t.path())
        .args(["run", "--out", "zr", "--shim"])
        .arg(common::shim_path())
        .arg("--")
        .arg(&common::fixtures().host)
        .args(["ops", "0", "1", idf.to_str().unwrap(), "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let after = secs();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let names = names_in(&t.path().join("zr"));
    assert_eq!(names.len(), 1, "{names:?}");
    let rest = names[0].strip_prefix("run-").unwrap();
    let (at, by) = rest.split_once('-').unwrap();
    let at: u64 = at.parse().unwrap();
    assert!(
        (before..=after).contains(&at),
        "{} at {before}..{after}",
        names[0]
    );
    assert_eq!(by, pid.to_string(), "{}", names[0]);
}

/// `zcta export -o -` (or through a link to its stdout) whose reader went away stops
/// quietly, as every other command does: exit 0, nothing on stderr.
#[test]
fn export_to_a_closed_pipe_stops_quietly() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    // Far more than a write buffer of trace.
    run_of(&run, 300);
    let own = t.path().join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &own).unwrap();
    let run_s = run.to_str().unwrap();
    for args in [
        vec!["export", "--perfetto", run_s, "-o", "-"],
        vec!["export", "--perfetto", run_s, "-o", own.to_str().unwrap()],
        vec!["report", run_s],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = Command::new(env!("CARGO_BIN_EXE_zcta"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "zcta {args:?}: {err}");
        assert_eq!(err, "", "zcta {args:?}");
    }
}

/// `zcta export` of a directory without ops rows to draw (empty, not a run, a run
/// whose ops are only logs still to recover) is an error as for `report`: exit 2, the
/// same words, and no output written or changed.
#[test]
fn export_without_ops_rows_is_an_error_as_for_report() {
    let t = tempfile::tempdir().unwrap();
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let not_a_run = t.path().join("project");
    std::fs::create_dir_all(not_a_run.join("src")).unwrap();
    std::fs::write(not_a_run.join("README"), "mine").unwrap();
    let no_rows = t.path().join("no-rows");
    std::fs::create_dir_all(no_rows.join("ops")).unwrap();
    let killed = t.path().join("killed");
    std::fs::create_dir_all(killed.join("ops")).unwrap();
    ops_log(&killed.join("ops").join("_elsewhere-p42-00000.wal"), 10);
    let kept = t.path().join("kept.json");
    std::fs::write(&kept, "the earlier trace").unwrap();
    for dir in [&empty, &not_a_run, &no_rows, &killed] {
        let d = dir.to_str().unwrap();
        let report = zcta_in(t.path(), &["report", d]);
        assert_eq!(report.status.code(), Some(2), "{}", text(&report.stderr));
        for out in ["new.json", "kept.json", "-"] {
            let o = zcta_in(t.path(), &["export", "--perfetto", d, "-o", out]);
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{d} -o {out}: {err}");
            assert!(
                err.contains(&format!("{d}: no ops rows (nothing to export)")),
                "{d}: {err}"
            );
            assert_eq!(text(&o.stdout), "", "{d} -o {out}");
            if dir == &killed {
                assert!(err.contains(&format!("run `zcta recover {d}`")), "{err}");
            }
        }
        assert!(!t.path().join("new.json").exists(), "{d}");
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "the earlier trace");
    }
}

/// `--link-peak-gbps` takes a link bandwidth from 0.001 to 1e6 GB/s; outside that
/// (where %peak would print `inf` or hundreds of digits), not finite or not a number
/// is a usage error that says the range.
#[test]
fn link_peak_outside_its_range_is_refused() {
    let (t, run) = tmp_run();
    let run_s = run.to_str().unwrap();
    for bad in [
        "5e-324", "1e-300", "0.0009", "0", "-1", "1000001", "1e308", "inf", "NaN", "fast",
    ] {
        let o = zcta_in(t.path(), &["report", run_s, &format!("--link-peak-gbps={bad}")]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}\n{err}", text(&o.stdout));
        assert!(err.contains("from 0.001 to 1000000"), "{bad}: {err}");
        assert_eq!(text(&o.stdout), "", "{bad}");
    }
    // A negative value as its own argument is the option's value, judged the same.
    for bad in ["-5", "-0.5"] {
        let o = zcta_in(t.path(), &["report", run_s, "--link-peak-gbps", bad]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("from 0.001 to 1000000"), "{bad}: {err}");
    }
    for good in ["0.001", "25", "450", "1e6"] {
        let o = zcta_in(t.path(), &["report", run_s, "--link-peak-gbps", good]);
        let out = text(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{good}: {}", text(&o.stderr));
        assert!(!out.contains("inf"), "{good}: {out}");
    }
}

/// `zcta doctor --probe --probe-dir D` never reads an earlier probe's rows nor
/// overwrites a file it did not make: a D that holds a run directory of the probe, its
/// log or its script is refused with the file named and left as it was; a fresh D is
/// used, and the next probe there is refused.
#[test]
fn a_probe_never_reuses_what_is_in_its_directory() {
    let t = tempfile::tempdir().unwrap();
    let facts = probe_facts(t.path());
    let shim = common::shim_path();
    let py = t.path().join("python");
    std::fs::write(
        &py,
        format!("#!/bin/sh\necho ran >> '{}/ran'\n", t.path().display()),
    )
    .unwrap();
    set_mode(&py, 0o755);
    let probe = |dir: &Path| {
        probe_json(
            t.path(),
            &facts,
            &py,
            &shim,
            &["--probe-dir", dir.to_str().unwrap()],
        )["probe"]
            .clone()
    };
    let ran = t.path().join("ran");

    // An earlier probe's rows.
    let d = t.path().join("rows");
    let earlier = d.join("runs").join("doctor-probe");
    small_run(&earlier);
    let before = support::list_files(&earlier);
    let p = probe(&d);
    assert_eq!(p["status"], "not_run", "{p}");
    let reason = p["reason"].as_str().unwrap();
    assert!(reason.contains(&earlier.display().to_string()), "{reason}");
    assert_eq!(support::list_files(&earlier), before);
    assert!(!ran.exists(), "the probe ran");

    // A log or a script that was there.
    for name in ["probe.log", "zcta_probe.py"] {
        let d = t.path().join(name.replace('.', "-"));
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join(name), "mine").unwrap();
        let p = probe(&d);
        assert_eq!(p["status"], "not_run", "{name}: {p}");
        let reason = p["reason"].as_str().unwrap();
        assert!(reason.contains(&d.join(name).display().to_string()), "{reason}");
        assert_eq!(std::fs::read_to_string(d.join(name)).unwrap(), "mine");
        assert_eq!(names_in(&d), [name], "nothing else made");
        assert!(!ran.exists(), "the probe ran");
    }

    // A fresh directory is used; the next probe there is refused.
    let d = t.path().join("fresh");
    let p = probe(&d);
    assert_ne!(p["status"], "not_run", "{p}");
    assert!(ran.exists());
    assert_eq!(names_in(&d), ["probe.log", "runs", "zcta_probe.py"]);
    let p = probe(&d);
    assert_eq!(p["status"], "not_run", "{p}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "ran\n", "ran once");
}

/// `zcta ARGS` under a file-size limit of `blocks` (the shell's `ulimit -f`).
fn zcta_under_file_limit(cwd: &Path, blocks: u32, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -f {blocks} && exec \"$@\""))
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_zcta"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("running zcta")
}

/// A write past the file-size limit fails as on a full disk: `zcta recover` keeps the
/// log and names it (exit 1), `zcta export` writes nothing (exit 2); neither is killed
/// by SIGXFSZ, and neither leaves a temporary file.
#[test]
fn a_file_size_limit_is_an_error_that_loses_nothing() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let ops = run.join("ops");
    std::fs::create_dir_all(&ops).unwrap();
    let log = ops.join("_elsewhere-p42-00000.wal");
    ops_log(&log, 40_000);
    let len = std::fs::metadata(&log).unwrap().len();
    let o = zcta_under_file_limit(t.path(), 8, &["recover", run.to_str().unwrap()]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        err.contains(&format!("cannot recover {}", log.display())),
        "{err}"
    );
    assert!(err.contains("File too large"), "{err}");
    assert_eq!(std::fs::metadata(&log).unwrap().len(), len, "{out}");
    assert_eq!(names_in(&ops), vec!["_elsewhere-p42-00000.wal"]);
    // Without the limit it recovers; then the export under one writes nothing.
    let o = zcta_in(t.path(), &["recover", run.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let dest = t.path().join("out");
    std::fs::create_dir(&dest).unwrap();
    let o = zcta_under_file_limit(
        &dest,
        8,
        &["export", "--perfetto", run.to_str().unwrap(), "-o", "t.json"],
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(text(&o.stderr).contains("File too large"), "{}", text(&o.stderr));
    assert!(names_in(&dest).is_empty(), "{:?}", names_in(&dest));
}
