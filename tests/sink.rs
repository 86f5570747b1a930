//! The writer's crash-safety contract, driven directly (no shim): what a live writer
//! and a dead one leave, and what `recover` does with each.

use std::sync::Arc;

use zcta::nccl::CallKind;
use zcta::record::{CallRecord, Event};
use zcta::recover::{LogOutcome, recover_run};
use zcta::sink::{ProcessInfo, SinkPolicy, Writer};
use zcta::tables::{Ctx, ProcessRow};

fn call(i: i64) -> Event {
    Event::Call(CallRecord {
        call: CallKind::GroupStart,
        comm_id: None,
        comm_ptr: None,
        group_id: Some(i as u64),
        n_ops: None,
        buff: None,
        size: None,
        handle: None,
        flags: None,
        api_start_ns: i,
        api_end_ns: i + 1,
        result: 0,
        tid: 1,
    })
}

fn writer(dir: &std::path::Path) -> Writer {
    Writer::new(
        ProcessInfo {
            run_dir: dir.to_owned(),
            prefix: "otherhost-p1".into(),
            ctx: Ctx {
                pid: 1,
                host: Arc::from("otherhost"),
            },
            row: ProcessRow {
                run_id: "t".into(),
                ..ProcessRow::default()
            },
        },
        SinkPolicy::default(),
    )
}

/// A segment that is still being written belongs to a live writer, wherever it runs:
/// `recover` must leave it alone even when the host check says "not running here".
#[test]
fn recover_leaves_a_live_writers_logs_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = writer(dir.path());
    w.start().unwrap();
    for i in 0..10 {
        w.handle(&call(i)).unwrap();
    }
    w.tick(std::time::Instant::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let report = recover_run(dir.path(), &|_, _| false).unwrap();
    assert!(!report.logs.is_empty());
    for (wal, outcome) in &report.logs {
        assert_eq!(outcome, &LogOutcome::Live, "{}", wal.display());
        assert!(wal.exists());
    }
    // Once the writer is gone (here: closed normally) nothing is left to recover.
    w.finish("exit", 0).unwrap();
    let report = recover_run(dir.path(), &|_, _| false).unwrap();
    assert!(report.logs.is_empty(), "{:?}", report.logs);
    let calls = zcta::reader::read_table(dir.path(), "calls").unwrap();
    assert_eq!(calls.num_rows(), 10);
}

/// The log is written before any Parquet encoding, and holds every cut batch.
#[test]
fn every_cut_batch_is_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = writer(dir.path());
    w.start().unwrap();
    for i in 0..100 {
        w.handle(&call(i)).unwrap();
    }
    w.tick(std::time::Instant::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let (_, logs) = zcta::reader::list_table(dir.path(), "calls").unwrap();
    assert_eq!(logs.len(), 1);
    let (batches, torn) = zcta::recover::read_log(&logs[0]).unwrap();
    assert!(!torn);
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 100);
    w.finish("exit", 0).unwrap();
}
