//! `zcta recover RUN`: turns the write-ahead logs a killed process left behind into
//! ordinary Parquet files, so every record that reached a log becomes readable.
//!
//! For each `<table>/_<stem>.wal`: if `<stem>.parquet` exists, is readable, is the
//! same table's and holds at least the log's rows, the segment was closed and the log
//! is stale (deleted); if it exists otherwise, both are kept and reported; otherwise every complete batch
//! of the log is read (a torn last batch is dropped and reported), written to
//! `<stem>.parquet` atomically, and the log and any `_<stem>.parquet.tmp` are deleted.
//! A log is deleted without rows only when it is provably empty (see [`read_log`]);
//! one that cannot be decoded is kept and reported. `process` rows recovered this way
//! get `end_reason = killed`, unless the log ends with the process's final row (it
//! could not write its `process` file: the disk was full), which is kept as it is.
//! Idempotent.

use std::fs::{self, File};
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow_ipc::reader::StreamReader;

use crate::reader::{ReadError, align, check_run_dir, list_files, list_table};
use crate::sink::{SinkError, final_path_for_wal, tmp_path_for};
use crate::tables::{self, CallsTable, CommsTable, OpsTable, ProcessTable, Table};

/// What happened to one log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogOutcome {
    /// Rows written to a new Parquet file; `torn` when an incomplete tail was dropped.
    Recovered {
        parquet: PathBuf,
        rows: usize,
        torn: bool,
    },
    /// The segment had been closed; the log was a leftover.
    AlreadyClosed,
    /// The log was provably empty (no byte, or its schema alone): deleted.
    Empty,
    /// The process that wrote it still runs on this host: left alone.
    Live,
    /// A process holds the log's lock (it is still being written, from this host or
    /// another on a shared file system): left alone, even with `--force`.
    Locked,
    /// Could not be recovered (reason); nothing was deleted.
    Failed(String),
}

/// Report of one recovery run.
#[derive(Debug, Default)]
pub struct RecoverReport {
    pub logs: Vec<(PathBuf, LogOutcome)>,
}

impl RecoverReport {
    pub fn rows_recovered(&self) -> usize {
        self.logs
            .iter()
            .map(|(_, o)| {
                if let LogOutcome::Recovered { rows, .. } = o {
                    *rows
                } else {
                    0
                }
            })
            .sum()
    }
    pub fn failures(&self) -> usize {
        self.logs
            .iter()
            .filter(|(_, o)| matches!(o, LogOutcome::Failed(_)))
            .count()
    }
}

/// Reads every complete batch of an IPC stream log. Returns the batches and whether
/// the tail was torn. A log that holds no row comes back `Ok` only when it is
/// provably empty: no byte at all (killed before the first flush), or the schema
/// and nothing after it that could be a batch. A log whose schema does not decode,
/// or that holds bytes after it but no complete batch, is an `Err` saying so: its
/// contents are unknown, so it must be kept.
pub fn read_log(path: &Path) -> Result<(Vec<RecordBatch>, bool), String> {
    crate::reader::guarded(|| read_log_inner(path))
        .unwrap_or_else(|_| Err("corrupt log (the decoder rejected it)".into()))
}

/// The schema an IPC stream log starts with; `None` for a file that cannot be opened
/// or does not start with one (the decoder's panics on damaged input caught, as in
/// [`read_log`]).
pub fn log_schema(path: &Path) -> Option<arrow_schema::SchemaRef> {
    crate::reader::guarded(|| {
        let f = File::open(path).ok()?;
        StreamReader::try_new(BufReader::new(f), None)
            .ok()
            .map(|r| r.schema())
    })
    .ok()
    .flatten()
}

/// Counts the bytes the decoder consumed.
struct Counted<R> {
    inner: R,
    n: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n.set(self.n.get() + k as u64);
        Ok(k)
    }
}

fn read_log_inner(path: &Path) -> Result<(Vec<RecordBatch>, bool), String> {
    let f = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = f.metadata().map_err(|e| format!("cannot open: {e}"))?.len();
    if len == 0 {
        return Ok((Vec::new(), false));
    }
    let consumed = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let input = Counted {
        inner: BufReader::new(f),
        n: consumed.clone(),
    };
    let reader = match StreamReader::try_new(input, None) {
        Ok(r) => r,
        Err(e) => {
            return Err(format!(
                "not a readable log: its {len} bytes do not start with an Arrow IPC schema ({e})"
            ));
        }
    };
    let after_schema = consumed.get();
    let mut out = Vec::new();
    let mut torn = false;
    for b in reader {
        match b {
            Ok(b) => out.push(b),
            Err(_) => {
                torn = true;
                break;
            }
        }
    }
    if torn && out.iter().all(|b| b.num_rows() == 0) {
        return Err(format!(
            "no complete batch in its {} bytes after the schema (damaged or cut short)",
            len - after_schema
        ));
    }
    Ok((out, torn))
}

/// Whether a live writer holds the log's lock (the writer locks each log while its
/// segment is open; the kernel drops the lock when the process dies).
fn is_locked(wal: &Path) -> bool {
    matches!(
        File::open(wal).map(|f| f.try_lock()),
        Ok(Err(std::fs::TryLockError::WouldBlock))
    )
}

/// Recovers every log of every table in `run_dir`. `is_live(host, pid)` says whether
/// a process still runs (its logs are then left alone).
pub fn recover_run(run_dir: &Path, is_live: &dyn Fn(&str, i32) -> bool) -> Result<RecoverReport, ReadError> {
    check_run_dir(run_dir)?;
    let mut report = RecoverReport::default();
    for table in tables::ALL_TABLES {
        let listing = list_files(run_dir, table)?;
        // Logs that are not regular files, and links to directories, are named.
        let named = |p: &Path| {
            p.is_dir()
                || p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('_') && n.ends_with(".wal"))
        };
        for sk in listing.skipped.into_iter().filter(|s| named(&s.path)) {
            report.logs.push((sk.path, LogOutcome::Failed(sk.reason)));
        }
        for wal in listing.logs {
            let outcome = recover_log(table, &wal, is_live);
            report.logs.push((wal, outcome));
        }
    }
    Ok(report)
}

fn recover_log(table: &str, wal: &Path, is_live: &dyn Fn(&str, i32) -> bool) -> LogOutcome {
    let Some(final_path) = final_path_for_wal(wal) else {
        return LogOutcome::Failed("unexpected log file name".into());
    };
    let stem = final_path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if let Some((host, pid)) = crate::sink::pid_of_stem(stem)
        && is_live(&host, pid)
    {
        return LogOutcome::Live;
    }
    if is_locked(wal) {
        return LogOutcome::Locked;
    }
    let tmp = tmp_path_for(&final_path);
    if final_path.exists() {
        // The writer renames a segment into place only after its footer is written,
        // and deletes the log after that: a readable file of the same table holding at
        // least the log's rows proves the log stale. Anything else there (another
        // table's file, fewer rows) proves nothing: both are kept.
        let (rows, of) = match crate::reader::parquet_footer(&final_path) {
            Ok(f) => (f.rows, f.table),
            Err(e) => {
                return LogOutcome::Failed(format!(
                    "{} exists but is not a readable Parquet file ({e})",
                    final_path.display()
                ));
            }
        };
        if of.as_deref() != Some(table) {
            return LogOutcome::Failed(format!(
                "{} exists but is {}, not {table}'s: the log is kept",
                final_path.display(),
                of.map_or_else(|| "no zcta table".to_string(), |t| format!("{t}'s file"))
            ));
        }
        // A log that cannot be decoded next to its segment's complete file (the
        // writer died between the rename and the delete, the log's tail torn) holds
        // nothing the file does not.
        let logged = read_log(wal).map_or(0, |(batches, _)| {
            batches.iter().map(RecordBatch::num_rows).sum::<usize>() as u64
        });
        // A process log holds the "running" row and, when its file had no room at
        // the end, the final one too: the file holds that one row.
        let logged = if table == ProcessTable::NAME {
            logged.min(1)
        } else {
            logged
        };
        if rows < logged {
            return LogOutcome::Failed(format!(
                "{} exists but holds {rows} rows where the log holds {logged}: the log is kept",
                final_path.display()
            ));
        }
        let _ = fs::remove_file(&tmp);
        return match fs::remove_file(wal) {
            Ok(()) => LogOutcome::AlreadyClosed,
            Err(e) => LogOutcome::Failed(format!("cannot delete stale log: {e}")),
        };
    }
    let (batches, torn) = match read_log(wal) {
        Ok(x) => x,
        Err(e) => return LogOutcome::Failed(e),
    };
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if rows == 0 {
        let _ = fs::remove_file(&tmp);
        return match fs::remove_file(wal) {
            Ok(()) => LogOutcome::Empty,
            Err(e) => LogOutcome::Failed(format!("cannot delete empty log: {e}")),
        };
    }
    // The dead writer's unfinished Parquet file, where it left one: the file is
    // written anew from the log, and made only where none is.
    let _ = fs::remove_file(&tmp);
    let written = match write_table(table, &final_path, &batches) {
        Ok(()) => Ok(()),
        Err(e) => Err(e.to_string()),
    };
    match written {
        Ok(()) => {
            let _ = fs::remove_file(&tmp);
            if let Err(e) = fs::remove_file(wal) {
                return LogOutcome::Failed(format!(
                    "recovered into {} but cannot delete the log: {e}",
                    final_path.display()
                ));
            }
            LogOutcome::Recovered {
                parquet: final_path,
                rows,
                torn,
            }
        }
        Err(e) => LogOutcome::Failed(e),
    }
}

fn write_table(table: &str, path: &Path, batches: &[RecordBatch]) -> Result<(), String> {
    let schema = tables::schema_of(table).ok_or("unknown table")?;
    // A process that could not write its final `process` file (the disk was full)
    // appended its final row to the log: that row is the process's, as it wrote it.
    if table == ProcessTable::NAME
        && let Some(last) = batches.iter().rev().find(|b| b.num_rows() > 0)
    {
        let last = align(last, &schema)?;
        let ended = last
            .column_by_name("end_reason")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .is_some_and(|r| r.value(last.num_rows() - 1) != "running");
        if ended {
            let row = last.slice(last.num_rows() - 1, 1);
            let info = tables::table(table).ok_or("unknown table")?;
            let r: Result<(), SinkError> = crate::sink::write_table_file(info, path, &[row]);
            return r.map_err(|e| e.to_string());
        }
    }
    let mut aligned = Vec::with_capacity(batches.len());
    for b in batches {
        let mut b = align(b, &schema)?;
        if table == ProcessTable::NAME {
            let prefix = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let run_dir = path.parent().and_then(Path::parent).unwrap_or(Path::new("."));
            b = mark_killed(&b, run_dir, prefix).map_err(|e| e.to_string())?;
        }
        aligned.push(b);
    }
    let info = tables::table(table).ok_or("unknown table")?;
    let r: Result<(), SinkError> = crate::sink::write_table_file(info, path, &aligned);
    r.map_err(|e| e.to_string())
}

/// The process row of a killed process: `end_reason = killed`, row counts taken from
/// the files its process left (complete and recovered), drops unknown (NULL).
fn mark_killed(
    b: &RecordBatch,
    run_dir: &Path,
    prefix: &str,
) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let schema = b.schema();
    let n = b.num_rows();
    let mut cols: Vec<ArrayRef> = b.columns().to_vec();
    cols[schema.index_of("end_reason")?] = Arc::new(StringArray::from(vec!["killed"; n]));
    for (col, table) in [
        ("ops_rows", OpsTable::NAME),
        ("calls_rows", CallsTable::NAME),
        ("comms_rows", CommsTable::NAME),
    ] {
        let rows = rows_of_process(run_dir, table, prefix);
        cols[schema.index_of(col)?] = Arc::new(UInt64Array::from(vec![rows; n]));
    }
    cols[schema.index_of("records_dropped")?] = Arc::new(UInt64Array::from(vec![None::<u64>; n]));
    RecordBatch::try_new(schema, cols)
}

/// Rows in the complete Parquet files `<table>/<prefix>-<segment>.parquet`.
fn rows_of_process(run_dir: &Path, table: &str, prefix: &str) -> u64 {
    let Ok((files, _)) = list_table(run_dir, table) else {
        return 0;
    };
    files
        .iter()
        .filter(|f| {
            f.file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.strip_prefix(prefix))
                .is_some_and(|rest| rest.starts_with('-') && rest[1..].bytes().all(|c| c.is_ascii_digit()))
        })
        .filter_map(|f| crate::reader::parquet_footer(f).ok().map(|f| f.rows))
        .sum()
}
