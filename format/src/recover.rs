//! `zcta recover RUN`: turns the write-ahead logs a killed process left behind into
//! ordinary Parquet files, so every record that reached a log becomes readable.
//!
//! For each `<table>/_<stem>.wal`: if `<stem>.parquet` exists, is readable, is the
//! same table's and holds the log's rows (as many at least, its first and last the
//! log's), the segment was closed and the log is stale (deleted); if it exists
//! otherwise, both are kept and reported; otherwise every complete batch of the log is
//! read (a torn last batch is dropped and reported), written to `<stem>.parquet`
//! atomically, and the log and the writer's unfinished `_<stem>.parquet.tmp` (a
//! regular file, empty or starting as Parquet; anything else there keeps the log) are
//! deleted. A log is deleted without rows only when it is provably empty (see
//! [`read_log`]); one that cannot be decoded, or is not its table's, is kept and
//! reported. `process` rows recovered this way
//! get `end_reason = killed`, unless the log ends with the process's final row (it
//! could not write its `process` file: the disk was full), which is kept as it is.
//! Idempotent.

use std::fs;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow_ipc::reader::StreamReader;
use arrow_schema::SchemaRef;

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
    read_log_with_schema(path).map(|(_, batches, torn)| (batches, torn))
}

/// [`read_log`] with the schema the log starts with (`None` for a log of no byte).
fn read_log_with_schema(path: &Path) -> Result<(Option<SchemaRef>, Vec<RecordBatch>, bool), String> {
    crate::reader::guarded(|| read_log_inner(path))
        .unwrap_or_else(|_| Err("corrupt log (the decoder rejected it)".into()))
}

/// Whether a log's `schema` is `table`'s: it names that table ([`crate::TABLE_KEY`]),
/// or, naming none, its columns fit the table's. A stream of some other program's
/// schema that happens to sit at a log's name is not zcta's to read or remove.
fn is_table_log(table: &str, schema: &SchemaRef) -> bool {
    let Some(want) = tables::schema_of(table) else {
        return false;
    };
    match schema.metadata().get(crate::TABLE_KEY) {
        Some(named) => named == table,
        None => align(&RecordBatch::new_empty(Arc::clone(schema)), &want).is_ok(),
    }
}

/// The schema an IPC stream log starts with; `None` for a file that cannot be opened
/// or does not start with one (the decoder's panics on damaged input caught, as in
/// [`read_log`]).
pub fn log_schema(path: &Path) -> Option<arrow_schema::SchemaRef> {
    crate::reader::guarded(|| {
        let f = crate::reader::open_regular(path).ok()?;
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

fn read_log_inner(path: &Path) -> Result<(Option<SchemaRef>, Vec<RecordBatch>, bool), String> {
    let f = crate::reader::open_regular(path)?;
    let len = f.metadata().map_err(|e| format!("cannot open: {e}"))?.len();
    if len == 0 {
        return Ok((None, Vec::new(), false));
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
    let schema = reader.schema();
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
    Ok((Some(schema), out, torn))
}

/// Whether a live writer holds the log's lock (the writer locks each log while its
/// segment is open; the kernel drops the lock when the process dies).
fn is_locked(wal: &Path) -> bool {
    matches!(
        crate::reader::open_regular(wal).map(|f| f.try_lock()),
        Ok(Err(std::fs::TryLockError::WouldBlock))
    )
}

/// Removes `tmp` (`_<stem>.parquet.tmp`) where it is a Parquet file that a zcta writer
/// or an earlier `zcta recover` began and did not finish: a regular file, not a link,
/// that is empty or starts with Parquet's magic. `Ok` when none is there or it was
/// removed; otherwise `Err` says why it is kept (it may be someone else's).
fn remove_unfinished(tmp: &Path) -> Result<(), String> {
    let m = match fs::symlink_metadata(tmp) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot look at {}: {e}", tmp.display())),
        Ok(m) => m,
    };
    let foreign = |what: &str| {
        format!(
            "{} {what}, not an unfinished Parquet file of zcta's: kept",
            tmp.display()
        )
    };
    if !m.file_type().is_file() {
        return Err(foreign("is a link or not a regular file"));
    }
    if m.len() > 0 {
        let mut magic = [0u8; 4];
        crate::reader::open_regular(tmp)
            .and_then(|mut f| f.read_exact(&mut magic).map_err(|e| e.to_string()))
            .map_err(|e| format!("cannot read {}: {e}", tmp.display()))?;
        if &magic != b"PAR1" {
            return Err(foreign("does not start as a Parquet file"));
        }
    }
    match fs::remove_file(tmp) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot delete {}: {e}", tmp.display())),
    }
}

/// Whether the Parquet file `path` of `table` holds the log's rows `logged`
/// (`logged` rows in all): its first row and its row `logged - 1` are the log's first
/// and last, column for column. A process file holds the final row where the log holds
/// the "running" one: the process's identity (run, host, pid, start) is compared.
/// The file is streamed up to the last row compared (memory bounded by a batch).
/// `Err` says what differs, or why the file could not be read.
fn holds_log_rows(table: &str, path: &Path, log: &[RecordBatch], logged: usize) -> Result<(), String> {
    if logged == 0 {
        return Ok(());
    }
    let schema = tables::schema_of(table).ok_or("unknown table")?;
    let process = table == ProcessTable::NAME;
    let columns: Vec<&str> = if process {
        vec!["run_id", "host", "pid", "start_ns"]
    } else {
        schema.fields().iter().map(|f| f.name().as_str()).collect()
    };
    let rows: Vec<usize> = if process { vec![0] } else { vec![0, logged - 1] };
    let log = log
        .iter()
        .map(|b| align(b, &schema))
        .collect::<Result<Vec<_>, _>>()?;
    let row_of = |batches: &[RecordBatch], mut i: usize| {
        for b in batches {
            if i < b.num_rows() {
                return Some(b.slice(i, 1));
            }
            i -= b.num_rows();
        }
        None
    };
    let mut found: Vec<Option<RecordBatch>> = vec![None; rows.len()];
    let mut base = 0;
    for b in crate::reader::stream_file(path, &schema, &columns, 8192)? {
        let b = b?;
        for (slot, &i) in found.iter_mut().zip(&rows) {
            if (base..base + b.num_rows()).contains(&i) {
                *slot = Some(b.slice(i - base, 1));
            }
        }
        base += b.num_rows();
        if rows.iter().all(|&i| i < base) {
            break;
        }
    }
    for (&i, f) in rows.iter().zip(&found) {
        let (Some(l), Some(f)) = (row_of(&log, i), f) else {
            return Err(format!("holds no row {i}"));
        };
        let same = columns
            .iter()
            .all(|c| match (l.column_by_name(c), f.column_by_name(c)) {
                (Some(a), Some(b)) => a.to_data() == b.to_data(),
                _ => false,
            });
        if !same {
            return Err(format!("its row {i} is not the log's row {i}"));
        }
    }
    Ok(())
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

/// [`read_log`] of a log of `table`: `Err` too when its schema is not the table's
/// ([`is_table_log`]), whose contents are not zcta's to read or remove.
fn read_table_log(table: &str, wal: &Path) -> Result<(Vec<RecordBatch>, bool), String> {
    match read_log_with_schema(wal)? {
        (Some(schema), _, _) if !is_table_log(table, &schema) => Err(
            "not a zcta log of this table (its schema names another table, or its columns are not this table's): kept"
                .into(),
        ),
        (_, batches, torn) => Ok((batches, torn)),
    }
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
            let link = fs::symlink_metadata(&final_path).is_ok_and(|m| m.file_type().is_symlink());
            let what = match of {
                _ if link => "a link (zcta writes none)".to_string(),
                Some(t) => format!("{t}'s file"),
                None => "no zcta table's file".to_string(),
            };
            return LogOutcome::Failed(format!(
                "{} exists but is {what}, not {table}'s: the log is kept",
                final_path.display(),
            ));
        }
        // The log's complete batches (a torn tail dropped): a log that does not
        // decode, or is not this table's, proves nothing and is kept.
        let batches = match read_table_log(table, wal) {
            Ok((batches, _)) => batches,
            Err(e) => {
                return LogOutcome::Failed(format!(
                    "{} exists, and the log cannot be read ({e}): both are kept",
                    final_path.display()
                ));
            }
        };
        let logged = batches.iter().map(RecordBatch::num_rows).sum::<usize>() as u64;
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
        // The same count is no proof: the file must hold the log's rows.
        if let Err(why) = holds_log_rows(table, &final_path, &batches, logged as usize) {
            return LogOutcome::Failed(format!(
                "{} exists but {why}: the log is kept",
                final_path.display()
            ));
        }
        if let Err(why) = remove_unfinished(&tmp) {
            return LogOutcome::Failed(format!("{why}; the log is kept"));
        }
        return match fs::remove_file(wal) {
            Ok(()) => LogOutcome::AlreadyClosed,
            Err(e) => LogOutcome::Failed(format!("cannot delete stale log: {e}")),
        };
    }
    let (batches, torn) = match read_table_log(table, wal) {
        Ok(x) => x,
        Err(e) => return LogOutcome::Failed(e),
    };
    // The dead writer's unfinished Parquet file, where it left one, goes: the file is
    // written anew from the log. Anything else at its name stays, and so does the log.
    if let Err(why) = remove_unfinished(&tmp) {
        return LogOutcome::Failed(format!("{why}; the log is kept"));
    }
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if rows == 0 {
        return match fs::remove_file(wal) {
            Ok(()) => LogOutcome::Empty,
            Err(e) => LogOutcome::Failed(format!("cannot delete empty log: {e}")),
        };
    }
    // The file is made only where none is.
    let written = match write_table(table, &final_path, &batches) {
        Ok(()) => Ok(()),
        Err(e) => Err(e.to_string()),
    };
    match written {
        Ok(()) => {
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
