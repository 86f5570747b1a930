//! Reader robustness: files it cannot use are skipped with the reason and the rest
//! still reads; older schema versions are aligned, newer ones refused; the CLI's exit
//! codes say what happened.
//!
//! Needs the shim (the input files are real recordings): `cargo build -p zcta-shim`.

mod common;
mod support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use zcta::reader::{ReadError, read_table};

use support::{Run, batches_to_rows, text};

/// A run with real files: 1 process, `ops 0 1 ID 2` (22 ops rows).
fn recorded(id: &str) -> Run {
    let run = Run::new(id);
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    run.run_ok(&["ops", "0", "1", idf.to_str().unwrap(), "2"]);
    run
}

fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// `zcta ARGS` in a clean environment with RUST_BACKTRACE=1: a panic message, and
/// its backtrace, would show in the stderr the tests check (none may reach a user).
fn zcta_cli(args: &[&str]) -> Output {
    let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
    c.env("RUST_BACKTRACE", "1");
    c.args(args);
    c.output().unwrap()
}

/// Writes `batches` (projected onto `schema`) as a Parquet file with the given
/// `zcta.schema_version`, as another writer or an older zcta would.
fn write_foreign(path: &Path, schema: SchemaRef, batches: &[RecordBatch], version: Option<&str>) {
    let mut kv = vec![KeyValue::new("zcta.table".into(), "ops".to_string())];
    if let Some(v) = version {
        kv.push(KeyValue::new("zcta.schema_version".into(), v.to_string()));
    }
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(kv))
        .build();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema.clone(), Some(props)).unwrap();
    for b in batches {
        let cols = schema
            .fields()
            .iter()
            .map(|f| b.column_by_name(f.name()).unwrap().clone())
            .collect();
        w.write(&RecordBatch::try_new(schema.clone(), cols).unwrap())
            .unwrap();
    }
    w.close().unwrap();
}

/// The ops schema without its metadata, minus `drop` columns.
fn ops_schema_without(drop: &[&str]) -> SchemaRef {
    let s = zcta::tables::schema_of("ops").unwrap();
    let fields: Vec<_> = s
        .fields()
        .iter()
        .filter(|f| !drop.contains(&f.name().as_str()))
        .cloned()
        .collect();
    Arc::new(Schema::new(fields))
}

#[test]
fn truncated_file_is_skipped_and_the_rest_reads() {
    let run = recorded("truncated");
    let ops_dir = run.dir().join("ops");
    let good = only_file(&ops_dir);
    let bytes = std::fs::read(&good).unwrap();
    let bad = ops_dir.join("zz-truncated-p1-00000.parquet");
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).unwrap();

    let d = read_table(&run.dir(), "ops").unwrap();
    assert_eq!(d.num_rows(), 22);
    assert_eq!(d.files, vec![good]);
    assert_eq!(d.skipped.len(), 1, "{:?}", d.skipped);
    assert_eq!(d.skipped[0].path, bad);
    assert!(
        d.skipped[0].reason.contains("truncated or corrupt"),
        "{:?}",
        d.skipped[0]
    );
    assert!(d.pending_logs.is_empty());

    // The CLI names the file and exits 1.
    let out = zcta_cli(&["summary", run.dir().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains(bad.to_str().unwrap()),
        "stderr does not name the file: {err}"
    );
    assert!(text(&out.stdout).contains("22 rows"), "{}", text(&out.stdout));
}

#[test]
fn a_file_whose_name_is_not_utf8_is_read() {
    use std::os::unix::ffi::OsStrExt;
    let run = recorded("non-utf8");
    let ops_dir = run.dir().join("ops");
    let good = only_file(&ops_dir);
    let odd = ops_dir.join(std::ffi::OsStr::from_bytes(b"h\xff-p1-00000.parquet"));
    std::fs::rename(&good, &odd).unwrap();
    let d = read_table(&run.dir(), "ops").unwrap();
    assert_eq!(d.num_rows(), 22, "{:?}", d.skipped);
    assert_eq!(d.files, vec![odd]);
    assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    let out = zcta_cli(&["summary", run.dir().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).contains("22 rows"), "{}", text(&out.stdout));
}

#[test]
fn empty_and_garbage_files_are_skipped() {
    let run = recorded("garbage");
    let ops_dir = run.dir().join("ops");
    std::fs::write(ops_dir.join("empty.parquet"), b"").unwrap();
    std::fs::write(ops_dir.join("text.parquet"), b"PAR1 this is not parquet PAR1").unwrap();
    let d = read_table(&run.dir(), "ops").unwrap();
    assert_eq!(d.num_rows(), 22);
    let mut skipped: Vec<_> = d
        .skipped
        .iter()
        .map(|s| s.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    skipped.sort();
    assert_eq!(skipped, ["empty.parquet", "text.parquet"]);
}

/// Another table's file in a table's directory (a `process` file copied into `ops/`)
/// is skipped by the table its footer names, once, by every reader and command, even
/// where its columns would fit: a `calls` file rewritten with the ops columns it has.
#[test]
fn another_tables_file_is_skipped_by_its_name() {
    let run = recorded("wrong-table");
    let ops_dir = run.dir().join("ops");
    let good = only_file(&ops_dir);
    let process = only_file(&run.dir().join("process"));
    let wrong = ops_dir.join("zz-process-p3-00000.parquet");
    std::fs::copy(&process, &wrong).unwrap();
    // An ops file's columns, under the footer of table `calls`.
    let rows = zcta::reader::read_file(&good, &zcta::tables::schema_of("ops").unwrap()).unwrap();
    let disguised = ops_dir.join("zz-calls-p4-00000.parquet");
    {
        let meta = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&File::open(&good).unwrap())
            .unwrap();
        let kv: Vec<KeyValue> = meta
            .file_metadata()
            .key_value_metadata()
            .unwrap()
            .iter()
            .map(|k| match k.key.as_str() {
                "zcta.table" => KeyValue::new(k.key.clone(), "calls".to_string()),
                _ => k.clone(),
            })
            .collect();
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(kv))
            .build();
        let mut w =
            ArrowWriter::try_new(File::create(&disguised).unwrap(), rows[0].schema(), Some(props)).unwrap();
        for b in &rows {
            w.write(b).unwrap();
        }
        w.close().unwrap();
    }
    let d = read_table(&run.dir(), "ops").unwrap();
    assert_eq!(d.num_rows(), 22);
    let why = |d: &[zcta::reader::Skipped], p: &Path| {
        let r: Vec<_> = d
            .iter()
            .filter(|s| s.path == p)
            .map(|s| s.reason.clone())
            .collect();
        assert_eq!(r.len(), 1, "{p:?}: {r:?}");
        r[0].clone()
    };
    assert_eq!(
        why(&d.skipped, &wrong),
        "a file of table `process` (its zcta.table), not of `ops`"
    );
    assert_eq!(
        why(&d.skipped, &disguised),
        "a file of table `calls` (its zcta.table), not of `ops`"
    );
    let s = zcta::reader::for_each_batch(&run.dir(), "ops", &["op_id"], |_| {}).unwrap();
    assert_eq!(s.skipped.len(), 2, "{:?}", s.skipped);
    for cmd in ["summary", "report", "phases"] {
        let out = zcta_cli(&[cmd, run.dir().to_str().unwrap()]);
        let err = text(&out.stderr);
        let what = format!("zcta {cmd} exited {:?}, stderr:\n{err}", out.status.code());
        for p in [&wrong, &disguised] {
            let head = format!("zcta: skipped {}: a file of table `", p.display());
            assert_eq!(err.lines().filter(|l| l.starts_with(&head)).count(), 1, "{what}");
        }
        assert_eq!(out.status.code(), Some(1), "{what}");
    }
}

#[test]
fn newer_schema_version_is_refused() {
    let run = recorded("newer");
    let ops_dir = run.dir().join("ops");
    let good = only_file(&ops_dir);
    let batches = zcta::reader::read_file(&good, &zcta::tables::schema_of("ops").unwrap()).unwrap();
    let newer = ops_dir.join("future-p2-00000.parquet");
    write_foreign(&newer, ops_schema_without(&[]), &batches, Some("999"));
    let d = read_table(&run.dir(), "ops").unwrap();
    assert_eq!(d.num_rows(), 22);
    assert_eq!(d.skipped.len(), 1);
    assert_eq!(d.skipped[0].path, newer);
    assert!(d.skipped[0].reason.contains("newer"), "{:?}", d.skipped[0]);
    assert!(d.skipped[0].reason.contains("999"), "{:?}", d.skipped[0]);

    // No version at all: not written by zcta.
    let foreign = ops_dir.join("foreign-p3-00000.parquet");
    write_foreign(&foreign, ops_schema_without(&[]), &batches, None);
    let d = read_table(&run.dir(), "ops").unwrap();
    assert_eq!(d.num_rows(), 22);
    assert_eq!(d.skipped.len(), 2);
    let s = d.skipped.iter().find(|s| s.path == foreign).unwrap();
    assert!(s.reason.contains("zcta.schema_version"), "{s:?}");
}

#[test]
fn older_schema_without_a_nullable_column_reads_as_null() {
    let run = recorded("older");
    let ops_dir = run.dir().join("ops");
    let good = only_file(&ops_dir);
    let batches = zcta::reader::read_file(&good, &zcta::tables::schema_of("ops").unwrap()).unwrap();
    let orig = batches_to_rows(&batches);
    std::fs::remove_file(&good).unwrap();
    let old = ops_dir.join("old-p4-00000.parquet");
    write_foreign(&old, ops_schema_without(&["device"]), &batches, Some("0"));

    let d = read_table(&run.dir(), "ops").unwrap();
    assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    assert_eq!(d.files, vec![old]);
    assert_eq!(d.batches[0].schema(), zcta::tables::schema_of("ops").unwrap());
    let rows = batches_to_rows(&d.batches);
    assert_eq!(rows.len(), orig.len());
    for (r, o) in rows.iter().zip(&orig) {
        assert!(r.is_null("device"), "{r:?}");
        assert_eq!(o.i32("device"), Some(0), "the original had a device");
        let mut r = r.clone();
        let mut o = o.clone();
        r.0.remove("device");
        o.0.remove("device");
        assert_eq!(r, o);
    }

    // A missing *required* column cannot be filled in.
    std::fs::remove_file(ops_dir.join("old-p4-00000.parquet")).unwrap();
    let bad = ops_dir.join("old-p5-00000.parquet");
    write_foreign(&bad, ops_schema_without(&["comm_ptr"]), &batches, Some("0"));
    let d = read_table(&run.dir(), "ops").unwrap();
    assert_eq!(d.num_rows(), 0);
    assert_eq!(d.skipped.len(), 1);
    assert!(d.skipped[0].reason.contains("comm_ptr"), "{:?}", d.skipped[0]);
}

#[test]
fn missing_or_bad_run_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-run");
    match read_table(&missing, "ops") {
        Err(ReadError::Missing(p)) => assert_eq!(p, missing),
        other => panic!("expected Missing, got {other:?}"),
    }
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(read_table(&file, "ops"), Err(ReadError::NotADir(p)) if p == file));
    assert!(matches!(
        read_table(tmp.path(), "nope"),
        Err(ReadError::UnknownTable(t)) if t == "nope"
    ));
    // An existing run directory without a table directory is an empty table.
    let d = read_table(tmp.path(), "ops").unwrap();
    assert_eq!((d.num_rows(), d.files.len(), d.skipped.len()), (0, 0, 0));

    let out = zcta_cli(&["summary", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out.stderr).contains("/nonexistent"),
        "{}",
        text(&out.stderr)
    );
    let out = zcta_cli(&["recover", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out.stderr).contains(missing.to_str().unwrap()),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn summary_of_a_good_run() {
    let run = recorded("summary");
    let out = zcta_cli(&["summary", run.dir().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty());
    let s = text(&out.stdout);
    assert!(s.contains("ops") && s.contains("22 rows in 1 file\n"), "{s}");
    // One column of counts, `nccl_comms` (the longest table name) included.
    let at: Vec<usize> = s.lines().filter_map(|l| l.find(" rows in ")).collect();
    assert!(s.contains("  nccl_comms "), "{s}");
    assert!(at.len() == 9 && at.iter().all(|&c| c == at[0]), "{s}");
    // rank 0, AllReduce: 2 calls, 2 x 4096 bytes, 0 errors.
    assert!(
        s.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["0", "AllReduce", "2", "8192", "0"]),
        "{s}"
    );
}

/// Copy of the Parquet file `good` whose footer says the first column chunk of the
/// first row group has a negative compressed size: a damaged (or hostile) footer that
/// still decodes. The data pages are the original ones.
fn with_negative_chunk_size(good: &Path, out: &Path) {
    with_negative_chunk_size_in(good, out, 0);
}

/// The same, in row group `at` of `good`.
fn with_negative_chunk_size_in(good: &Path, out: &Path, at: usize) {
    use parquet::file::metadata::{ParquetMetaDataReader, ParquetMetaDataWriter};
    let bytes = std::fs::read(good).unwrap();
    let md = ParquetMetaDataReader::new()
        .parse_and_finish(&File::open(good).unwrap())
        .unwrap();
    let mut b = md.into_builder();
    let mut rgs = b.take_row_groups();
    let rg = rgs.remove(at);
    let mut cols = rg.columns().to_vec();
    cols[0] = cols[0]
        .clone()
        .into_builder()
        .set_total_compressed_size(-1)
        .build()
        .unwrap();
    let rg = rg.into_builder().set_column_metadata(cols).build().unwrap();
    rgs.insert(at, rg);
    let md = b.set_row_groups(rgs).build();
    let n = bytes.len();
    let footer_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let mut buf = bytes[..n - 8 - footer_len].to_vec();
    ParquetMetaDataWriter::new(&mut buf, &md).finish().unwrap();
    std::fs::write(out, buf).unwrap();
}

/// A file with a damaged footer is skipped with a reason like any other unreadable
/// file: reader.rs promises it "never panics on bad input". The parquet crate panics
/// on this footer ("column start and length should not be negative"); the panic is
/// caught, and its message (a backtrace with RUST_BACKTRACE=1) never reaches the
/// user: every command that reads the file says only that it skipped it, and why.
#[test]
fn damaged_footer_is_skipped_not_a_panic() {
    let run = recorded("damaged");
    let ops_dir = run.dir().join("ops");
    let good = only_file(&ops_dir);
    let bad = ops_dir.join("zz-damaged-p7-00000.parquet");
    with_negative_chunk_size(&good, &bad);
    // The CLI first: what a user sees.
    let out = zcta_cli(&["summary", run.dir().to_str().unwrap()]);
    let cli = format!(
        "zcta summary exited {:?} with stderr {:?}",
        out.status.code(),
        text(&out.stderr)
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
    );
    let schema = zcta::tables::schema_of("ops").unwrap();
    let r = std::panic::catch_unwind(|| zcta::reader::read_file(&bad, &schema));
    let lib = match &r {
        Ok(Ok(b)) => format!("read_file returned {} batches", b.len()),
        Ok(Err(e)) => format!("read_file returned Err({e:?})"),
        Err(_) => "read_file panicked".to_string(),
    };
    assert!(matches!(r, Ok(Err(_))), "{lib}; {cli}");
    let d = std::panic::catch_unwind(|| read_table(&run.dir(), "ops"));
    let d = d.expect("read_table panicked").unwrap();
    assert_eq!(d.num_rows(), 22);
    assert_eq!(d.skipped.len(), 1);
    assert_eq!(d.skipped[0].path, bad);
    assert_eq!(out.status.code(), Some(1), "{cli}");
    assert!(text(&out.stderr).contains(bad.to_str().unwrap()), "{cli}");

    // Every command that reads it: the skip named, nothing else.
    let dir = run.dir();
    let dir = dir.to_str().unwrap();
    let trace = run.scratch("trace.json");
    // A run of the good file alone, to compare with.
    let alone = run.scratch("alone");
    std::fs::create_dir_all(alone.join("ops")).unwrap();
    std::fs::copy(&good, alone.join("ops").join(good.file_name().unwrap())).unwrap();
    for args in [
        vec!["summary", dir],
        vec!["report", dir],
        vec!["diff", alone.to_str().unwrap(), dir],
        vec!["export", "--perfetto", dir, "-o", trace.to_str().unwrap()],
        vec!["phases", dir],
    ] {
        let out = zcta_cli(&args);
        let err = text(&out.stderr);
        let what = format!("zcta {args:?} exited {:?}, stderr:\n{err}", out.status.code());
        let skipped = format!("zcta: skipped {}: ", bad.display());
        assert!(err.lines().any(|l| l.starts_with(&skipped)), "{what}");
        assert!(
            !err.contains("panicked at") && !err.contains("stack backtrace"),
            "{what}"
        );
        assert!(err.lines().all(|l| l.starts_with("zcta: ")), "{what}");
        assert_eq!(out.status.code(), Some(1), "{what}");
    }
}

/// A file whose reading breaks off says how many of its rows went into the figures:
/// none where its first row group is damaged, the batches read before the damage where
/// its second is (a batch of 65,536 rows of the first row group; the next batch spans
/// into the damaged one).
#[test]
fn a_file_that_breaks_off_says_how_many_of_its_rows_were_used() {
    let run = recorded("breaks-off");
    let ops_dir = run.dir().join("ops");
    let good = only_file(&ops_dir);
    let rows = zcta::reader::read_file(&good, &zcta::tables::schema_of("ops").unwrap()).unwrap();
    let n: usize = rows.iter().map(|b| b.num_rows()).sum();
    // The same rows again and again, in two row groups (the first larger than a read
    // batch of 65,536 rows), as another process's file.
    let copies = 65_536 / n + 1;
    let two = run.scratch("two-groups.parquet");
    {
        let meta = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&File::open(&good).unwrap())
            .unwrap();
        let kv = meta.file_metadata().key_value_metadata().cloned();
        let props = WriterProperties::builder().set_key_value_metadata(kv).build();
        let schema = rows[0].schema();
        let mut w = ArrowWriter::try_new(File::create(&two).unwrap(), schema, Some(props)).unwrap();
        for copies in [copies, 1] {
            for _ in 0..copies {
                for b in &rows {
                    w.write(b).unwrap();
                }
            }
            w.flush().unwrap();
        }
        w.close().unwrap();
    }
    let first = ops_dir.join("zz-first-p8-00000.parquet");
    let second = ops_dir.join("zz-second-p9-00000.parquet");
    with_negative_chunk_size_in(&two, &first, 0);
    with_negative_chunk_size_in(&two, &second, 1);
    let dir = run.dir();
    for cmd in ["report", "phases", "summary"] {
        let out = zcta_cli(&[cmd, dir.to_str().unwrap()]);
        let err = text(&out.stderr);
        let what = format!("zcta {cmd} exited {:?}, stderr:\n{err}", out.status.code());
        let line = |p: &Path| {
            let head = format!("zcta: skipped {}: ", p.display());
            err.lines().find(|l| l.starts_with(&head)).map(str::to_owned)
        };
        let first_line = line(&first).unwrap_or_else(|| panic!("{what}"));
        let second_line = line(&second).unwrap_or_else(|| panic!("{what}"));
        assert!(!err.contains("rows before it were used"), "{what}");
        if cmd == "summary" {
            // summary reads whole files: a damaged one is left out entirely.
            assert!(
                !first_line.contains("were used") && !second_line.contains("were used"),
                "{what}"
            );
        } else {
            assert!(first_line.ends_with("(none of its rows were used)"), "{what}");
            assert!(
                second_line.ends_with("(its first 65536 rows were used)"),
                "{what}"
            );
        }
        assert_eq!(out.status.code(), Some(1), "{what}");
    }
    // The trace takes the rows read before the damage too, and says so.
    let trace = run.scratch("trace.json");
    let out = zcta_cli(&[
        "export",
        "--perfetto",
        "-o",
        trace.to_str().unwrap(),
        dir.to_str().unwrap(),
    ]);
    let err = text(&out.stderr);
    let what = format!("zcta export exited {:?}, stderr:\n{err}", out.status.code());
    assert_eq!(out.status.code(), Some(1), "{what}");
    let said = |p: &Path, end: &str| {
        let head = format!("zcta: skipped {}: ", p.display());
        err.lines().any(|l| l.starts_with(&head) && l.ends_with(end))
    };
    assert!(said(&first, "(none of its rows were used)"), "{what}");
    assert!(said(&second, "(its first 65536 rows were used)"), "{what}");
    let events: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let api = events["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 1)
        .count();
    assert!(
        api >= n + 65_536,
        "{api} API events: the good file's {n} and the broken one's first 65536"
    );
    let d = zcta::reader::for_each_batch(&dir, "ops", &["op_id"], |_| {}).unwrap();
    let why: Vec<_> = d
        .skipped
        .iter()
        .map(|s| (s.path.clone(), s.reason.clone()))
        .collect();
    assert!(
        why.iter()
            .any(|(p, r)| *p == second && r.ends_with("(its first 65536 rows were used)")),
        "{why:?}"
    );
    assert!(
        why.iter()
            .any(|(p, r)| *p == first && r.ends_with("(none of its rows were used)")),
        "{why:?}"
    );
}

/// Write-ahead logs damaged anywhere never make `recover` panic.
#[test]
fn damaged_logs_never_panic() {
    use zcta::nccl::OpKind;
    use zcta::record::OpRecord;
    use zcta::sink::{DatasetWriter, SinkPolicy};
    use zcta::tables::{Ctx, OpsTable};

    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let ctx = Ctx {
        pid: 42,
        host: "h".into(),
    };
    let mut w: DatasetWriter<OpsTable> = DatasetWriter::new(&run_dir, "h-p42", SinkPolicy::default());
    for i in 0..300u64 {
        let r = OpRecord {
            comm_id: Some(7),
            comm_ptr: 0x1000,
            rank: Some(0),
            nranks: Some(1),
            seq: Some(i),
            call_seq: Some(i),
            count: 1024,
            dtype: 7,
            bytes: Some(4096),
            redop: Some(0),
            sendbuff: 0x2000,
            recvbuff: 0x3000,
            device: Some(0),
            api_start_ns: 1_000_000 + i as i64,
            api_end_ns: 1_000_010 + i as i64,
            tid: 42,
            gpu_marked: true,
            graph_captured: Some(false),
            ..OpRecord::blank(i + 1, OpKind::AllReduce)
        };
        w.append(&zcta::gpu::OpRow { rec: r, gpu: None }, &ctx).unwrap();
        if i % 100 == 99 {
            w.cut().unwrap();
        }
    }
    drop(w); // "killed": the log and the tmp file stay
    let wal = run_dir.join("ops").join("_h-p42-00000.wal");
    let bytes = std::fs::read(&wal).unwrap();
    let mut panics = Vec::new();
    let step = (bytes.len() / 150).max(1);
    for at in (0..bytes.len()).step_by(step) {
        for flip in [0xffu8, 0x01] {
            let mut b = bytes.clone();
            b[at] ^= flip;
            std::fs::write(&wal, &b).unwrap();
            if std::panic::catch_unwind(|| zcta::recover::read_log(&wal)).is_err() {
                panics.push((at, flip));
            }
        }
    }
    assert!(
        panics.is_empty(),
        "read_log panicked on {} damaged logs, e.g. {:?}",
        panics.len(),
        panics[0]
    );
}

/// A file whose `host` column has a zeroed page: the decoder gives an error for every
/// batch asked for after it. Every command still finishes, and says what it skipped.
#[test]
fn a_page_the_decoder_fails_on_for_ever_ends_the_file() {
    let run = recorded("endless");
    let ops_dir = run.dir().join("ops");
    let good = only_file(&ops_dir);
    let mut bytes = std::fs::read(&good).unwrap();
    let meta = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(&File::open(&good).unwrap())
        .unwrap();
    let rg = meta.row_group(0);
    let host = (0..rg.num_columns())
        .find(|&i| rg.column(i).column_path().string() == "host")
        .expect("a host column");
    let at = usize::try_from(rg.column(host).data_page_offset()).unwrap();
    bytes[at..at + 16].fill(0);
    std::fs::write(&good, &bytes).unwrap();

    let schema = zcta::tables::schema_of("ops").unwrap();
    let items: Vec<_> = zcta::reader::stream_file(&good, &schema, &["host"], 1)
        .unwrap()
        .take(1000)
        .collect();
    assert!(items.len() < 1000, "the batches never end");
    assert!(items.last().unwrap().is_err(), "ends with the error");

    let dir = run.dir();
    for cmd in ["report", "diff", "phases"] {
        let mut args = vec![cmd, dir.to_str().unwrap()];
        if cmd == "diff" {
            args.push(dir.to_str().unwrap());
        }
        let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
        let mut child = c
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > std::time::Duration::from_secs(60) {
                let _ = child.kill();
                panic!("zcta {cmd} did not finish in 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert!(st.code().is_some(), "zcta {cmd}: {st:?}");
    }
}

/// A table's entry that is no directory is skipped and named, the other tables still
/// read (exit 1); a copy of a file below the table's directory, or beside it under
/// another name, is not read twice.
#[test]
fn odd_table_entries_and_copies_are_skipped_not_fatal() {
    let run = recorded("odd-tables");
    let dir = run.dir();
    let n_ops = run.rows("ops").len();
    std::fs::write(dir.join("gpu"), b"x").unwrap();
    std::os::unix::fs::symlink("proxy", dir.join("proxy")).unwrap();
    let ops_dir = dir.join("ops");
    let good = only_file(&ops_dir);
    std::fs::create_dir_all(ops_dir.join("backup")).unwrap();
    std::fs::copy(&good, ops_dir.join("backup").join(good.file_name().unwrap())).unwrap();
    // A copy under another name, beside the file: its bytes say it is one (and the
    // file under zcta's own name, read first by path or not, is the one read).
    std::fs::copy(&good, ops_dir.join("a-backup.parquet")).unwrap();
    // A copy re-written by another tool under the same name (its rows, other bytes):
    // read once too, the file nearest the table's directory.
    let resaved = ops_dir.join("resaved").join(good.file_name().unwrap());
    std::fs::create_dir_all(resaved.parent().unwrap()).unwrap();
    let r =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(File::open(&good).unwrap())
            .unwrap();
    let schema = r.schema().clone();
    let batches: Vec<RecordBatch> = r.build().unwrap().map(Result::unwrap).collect();
    write_foreign(
        &resaved,
        schema,
        &batches,
        Some(&zcta::SCHEMA_VERSION.to_string()),
    );
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert_ne!(size(&resaved), size(&good));
    let d = read_table(&dir, "ops").unwrap();
    assert_eq!(d.num_rows(), n_ops, "a copy was read too");
    assert!(
        d.skipped
            .iter()
            .any(|s| s.path == resaved && s.reason.contains(&format!("the name of {}", good.display()))),
        "{:?}",
        d.skipped
    );
    assert!(
        d.skipped.iter().any(|s| s.reason.contains("a copy of")),
        "{:?}",
        d.skipped
    );
    assert!(
        d.skipped.iter().any(|s| s.path.ends_with("a-backup.parquet")
            && s.reason == format!("a copy of {} (the same bytes): not read twice", good.display())),
        "{:?}",
        d.skipped
    );
    for cmd in ["report", "summary"] {
        let out = zcta_cli(&[cmd, dir.to_str().unwrap()]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "zcta {cmd}: {err}");
        assert!(
            err.contains("gpu") && err.contains("where the table's directory belongs"),
            "{err}"
        );
        assert!(err.contains("proxy"), "{err}");
        assert!(err.contains("a copy of"), "{err}");
    }
    let out = zcta_cli(&["report", dir.to_str().unwrap()]);
    assert!(
        text(&out.stdout).contains(&format!("{n_ops} ops")),
        "{}",
        text(&out.stdout)
    );
}
