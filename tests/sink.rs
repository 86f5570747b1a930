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
        group_start: None,
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
        assert_eq!(outcome, &LogOutcome::Locked, "{}", wal.display());
        assert!(wal.exists());
    }
    // Once the writer is gone (here: closed normally) nothing is left to recover.
    w.finish("exit", 0).unwrap();
    let report = recover_run(dir.path(), &|_, _| false).unwrap();
    assert!(report.logs.is_empty(), "{:?}", report.logs);
    let calls = zcta::reader::read_table(dir.path(), "calls").unwrap();
    assert_eq!(calls.num_rows(), 10);
}

/// A group's end record can carry its ncclGroupStart (the hot path sends one record
/// for both): the writer writes the start's `calls` row, then the end's.
#[test]
fn a_group_end_record_writes_its_start_row_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = writer(dir.path());
    w.start().unwrap();
    let Event::Call(mut end) = call(7) else {
        unreachable!()
    };
    end.call = CallKind::GroupEnd;
    end.n_ops = Some(2);
    end.api_start_ns = 50;
    end.api_end_ns = 60;
    end.tid = 9;
    end.group_start = Some((10, 12));
    w.handle(&Event::Call(end)).unwrap();
    // Without it, the end's row alone.
    end.group_start = None;
    end.group_id = Some(8);
    w.handle(&Event::Call(end)).unwrap();
    w.finish("exit", 0).unwrap();
    let calls = zcta::reader::read_table(dir.path(), "calls").unwrap();
    assert_eq!(calls.batches.len(), 1);
    let calls = &calls.batches[0];
    let col = |name: &str| calls.column_by_name(name).unwrap().clone();
    let kinds = col("call");
    let kinds = kinds.as_any().downcast_ref::<arrow_array::StringArray>().unwrap();
    let num = |name: &str, i: usize| -> Option<i64> {
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Int32Type, Int64Type, UInt32Type, UInt64Type};
        let a = col(name);
        if a.is_null(i) {
            return None;
        }
        Some(match a.data_type() {
            arrow_schema::DataType::Int32 => i64::from(a.as_primitive::<Int32Type>().value(i)),
            arrow_schema::DataType::UInt32 => i64::from(a.as_primitive::<UInt32Type>().value(i)),
            arrow_schema::DataType::Int64 => a.as_primitive::<Int64Type>().value(i),
            arrow_schema::DataType::UInt64 => a.as_primitive::<UInt64Type>().value(i) as i64,
            t => panic!("{name}: {t}"),
        })
    };
    let got: Vec<_> = (0..calls.num_rows())
        .map(|i| {
            (
                kinds.value(i).to_string(),
                num("group_id", i),
                num("n_ops", i),
                num("api_start_ns", i),
                num("api_end_ns", i),
                num("result", i),
                num("tid", i),
            )
        })
        .collect();
    let row = |k: &str, g, n, t0, t1| (k.to_string(), Some(g), n, Some(t0), Some(t1), Some(0), Some(9));
    assert_eq!(
        got,
        [
            row("GroupStart", 7, None, 10, 12),
            row("GroupEnd", 7, Some(2), 50, 60),
            row("GroupEnd", 8, Some(2), 50, 60),
        ]
    );
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

/// A batch of `n` rows of `T`'s schema with increasing values in every column.
fn rows_of<T: zcta::tables::Table>(n: usize) -> arrow_array::RecordBatch {
    use arrow_array::{
        ArrayRef, BooleanArray, Int32Array, Int64Array, StringArray, UInt32Array, UInt64Array,
    };
    use arrow_schema::DataType;
    let schema = T::schema();
    let cols: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| -> ArrayRef {
            match f.data_type() {
                DataType::Int32 => Arc::new(Int32Array::from_iter_values(0..n as i32)),
                DataType::Int64 => Arc::new(Int64Array::from_iter_values(
                    (0..n as i64).map(|i| 1_700_000_000_000_000_000 + i * 977),
                )),
                DataType::UInt32 => Arc::new(UInt32Array::from_iter_values(0..n as u32)),
                DataType::UInt64 => Arc::new(UInt64Array::from_iter_values(0..n as u64)),
                DataType::Boolean => Arc::new(BooleanArray::from_iter((0..n).map(|i| Some(i % 2 == 0)))),
                DataType::Utf8 => Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("v{}", i % 3)),
                )),
                other => panic!("{}.{}: no test values for {other}", T::NAME, f.name()),
            }
        })
        .collect();
    arrow_array::RecordBatch::try_new(schema, cols).unwrap()
}

/// Every column a table declares `delta` is an integer column, and the file the sink
/// writes stores it DELTA_BINARY_PACKED without a dictionary.
fn delta_columns_are_written_delta<T: zcta::tables::Table>(dir: &std::path::Path) {
    use parquet::basic::Encoding as PqEncoding;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use zcta::tables::Encoding;
    let delta: Vec<&str> = T::encodings()
        .iter()
        .filter(|(_, e)| *e == Encoding::Delta)
        .map(|(c, _)| *c)
        .collect();
    let path = dir.join(format!("{}.parquet", T::NAME));
    zcta::sink::write_parquet_file::<T>(&path, &[rows_of::<T>(5_000)]).unwrap();
    let meta = SerializedFileReader::new(std::fs::File::open(&path).unwrap())
        .unwrap()
        .metadata()
        .clone();
    let rg = meta.row_group(0);
    for c in &delta {
        let chunk = rg
            .columns()
            .iter()
            .find(|m| m.column_path().string() == *c)
            .unwrap_or_else(|| panic!("{}.{c}: declared delta, not in the file", T::NAME));
        let enc: Vec<PqEncoding> = chunk.encodings().collect();
        assert!(
            enc.contains(&PqEncoding::DELTA_BINARY_PACKED)
                && !enc.contains(&PqEncoding::RLE_DICTIONARY)
                && !enc.contains(&PqEncoding::PLAIN_DICTIONARY),
            "{}.{c}: {enc:?}",
            T::NAME
        );
    }
}

#[test]
fn delta_columns_are_integers_written_delta_binary_packed() {
    use zcta::tables::*;
    let dir = tempfile::tempdir().unwrap();
    delta_columns_are_written_delta::<OpsTable>(dir.path());
    delta_columns_are_written_delta::<GpuTable>(dir.path());
    delta_columns_are_written_delta::<CallsTable>(dir.path());
    delta_columns_are_written_delta::<NcclOpsTable>(dir.path());
    delta_columns_are_written_delta::<ProxyTable>(dir.path());
    delta_columns_are_written_delta::<CommsTable>(dir.path());
    delta_columns_are_written_delta::<NcclCommsTable>(dir.path());
    delta_columns_are_written_delta::<PhasesTable>(dir.path());
    delta_columns_are_written_delta::<ProcessTable>(dir.path());
}
