//! Reading a run directory back: every complete Parquet file of a table, aligned to
//! the current schema. Never panics on bad input; every file it cannot use is listed
//! with the reason, and pending write-ahead logs are reported so the caller can say
//! "run `zcta recover`".

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, new_null_array};
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::tables;

/// Runs `f`, a read of a file that may be damaged (or another call into code that may
/// panic on input it never expected: `zcta doctor`'s NVML query), and catches a panic
/// in it (the parquet and Arrow IPC crates panic on some corrupt input instead of
/// returning an error) as `Err`, *quietly*: the default panic message (and, with
/// `RUST_BACKTRACE` set, a backtrace) is not printed, since the caller reports the file
/// as skipped, with the reason, itself.
///
/// A process-wide panic hook is installed on the first call; it stays silent only for
/// panics on a thread while it runs such a read (a thread-local depth), and hands
/// every other panic, of any thread, to the hook that was in place before.
pub fn guarded<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> std::thread::Result<R> {
    use std::cell::Cell;
    thread_local! {
        /// Guarded reads running on this thread (nested ones count).
        static GUARDED: Cell<u32> = const { Cell::new(0) };
    }
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let earlier = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // `try_with`: a panic while the thread's locals are torn down is not ours.
            if GUARDED.try_with(Cell::get).unwrap_or(0) == 0 {
                earlier(info);
            }
        }));
    });
    /// Leaves the guarded read, however `f` ends.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            GUARDED.with(|g| g.set(g.get().saturating_sub(1)));
        }
    }
    GUARDED.with(|g| g.set(g.get() + 1));
    let _leave = Leave;
    std::panic::catch_unwind(f)
}

/// Why a file is skipped when the parquet crate panicked on it (caught by [`guarded`]).
const DECODER_PANICKED: &str = "corrupt Parquet metadata (the decoder rejected it)";

/// Why a file whose reading broke off is skipped: `reason`, and how many of its rows
/// (`used`, those read before the damage) went into the figures anyway.
pub fn broken_after(reason: &str, used: usize) -> String {
    match used {
        0 => format!("{reason} (none of its rows were used)"),
        1 => format!("{reason} (its first row was used)"),
        n => format!("{reason} (its first {n} rows were used)"),
    }
}

/// A file that was not read, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// One table of a run.
#[derive(Debug, Default)]
pub struct TableData {
    pub batches: Vec<RecordBatch>,
    pub files: Vec<PathBuf>,
    pub skipped: Vec<Skipped>,
    /// Write-ahead logs of segments never closed (process killed or still running).
    pub pending_logs: Vec<PathBuf>,
}

impl TableData {
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// Problems that stop reading a run at all.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}: no such run directory")]
    Missing(PathBuf),
    #[error("{0}: not a directory")]
    NotADir(PathBuf),
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("unknown table {0:?} (known: ops, comms, calls, process)")]
    UnknownTable(String),
}

/// Checks that `run_dir` is a directory.
pub fn check_run_dir(run_dir: &Path) -> Result<(), ReadError> {
    match std::fs::metadata(run_dir) {
        Err(_) => Err(ReadError::Missing(run_dir.to_owned())),
        Ok(m) if !m.is_dir() => Err(ReadError::NotADir(run_dir.to_owned())),
        Ok(_) => Ok(()),
    }
}

/// What a table's directory holds: complete Parquet files, pending logs, and the
/// entries that look like either but are not read (with the reason).
#[derive(Debug, Default)]
pub struct Listing {
    pub parquet: Vec<PathBuf>,
    pub logs: Vec<PathBuf>,
    pub skipped: Vec<Skipped>,
}

/// Whether a file name is a complete Parquet file (`*.parquet`, not `_`/`.` hidden).
fn is_parquet_name(name: &str) -> bool {
    name.ends_with(".parquet") && !name.starts_with('_') && !name.starts_with('.')
}

/// Whether a file name is a write-ahead log (`_*.wal`).
fn is_log_name(name: &str) -> bool {
    name.starts_with('_') && name.ends_with(".wal")
}

/// Lists the files under `dir` (recursively, so `key=value/` partitions work) that
/// are regular files or links to regular files. Links to directories are not
/// followed (a link to `.` would list every file again, forever); those and other
/// entries (FIFOs, sockets, devices) with a table file's name are skipped, with the
/// reason, so that nothing ever blocks opening them.
fn walk(dir: &Path, out: &mut Vec<PathBuf>, skipped: &mut Vec<Skipped>) -> Result<(), ReadError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(ReadError::Io {
                path: dir.to_owned(),
                err: e,
            });
        }
    };
    for ent in rd {
        let ent = ent.map_err(|e| ReadError::Io {
            path: dir.to_owned(),
            err: e,
        })?;
        let p = ent.path();
        let ft = ent.file_type().map_err(|e| ReadError::Io {
            path: p.clone(),
            err: e,
        })?;
        if ft.is_dir() {
            walk(&p, out, skipped)?;
            continue;
        }
        if ft.is_file() {
            out.push(p);
            continue;
        }
        let name = ent.file_name();
        let name = name.to_string_lossy();
        let reason = if ft.is_symlink() {
            match std::fs::metadata(&p) {
                Ok(m) if m.is_file() => {
                    out.push(p);
                    continue;
                }
                Ok(m) if m.is_dir() => Some("a symbolic link to a directory: not followed".to_string()),
                Ok(m) => Some(format!(
                    "a symbolic link to {}: not opened",
                    kind_of(&m.file_type())
                )),
                Err(e) => Some(format!("a symbolic link that cannot be followed: {e}")),
            }
        } else {
            Some(format!("{}: not opened", kind_of(&ft)))
        };
        // A link to a directory is listed whatever its name; other odd entries only
        // when they would have been read.
        let listed = ft.is_symlink() && std::fs::metadata(&p).is_ok_and(|m| m.is_dir());
        if let Some(reason) = reason
            && (listed || is_parquet_name(&name) || is_log_name(&name))
        {
            skipped.push(Skipped { path: p, reason });
        }
    }
    Ok(())
}

fn kind_of(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// Complete Parquet files, pending logs and skipped entries of one table. A table's
/// entry that is no directory (a file, a FIFO, a link to either or one that cannot be
/// followed) is skipped with the reason, as an odd entry inside it would be: the
/// other tables still read. A table file whose name another file of the table already
/// has (zcta's names are one process's own: a copy, say in a `backup/` directory
/// below, or one re-written by another tool) is skipped too, not read twice; the one
/// nearest the table's directory is read. So is a Parquet file whose bytes another's repeat under another
/// name (`skip_same_contents`).
pub fn list_files(run_dir: &Path, table: &str) -> Result<Listing, ReadError> {
    let mut all = Vec::new();
    let mut skipped = Vec::new();
    let dir = run_dir.join(table);
    match std::fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Ok(m) if m.is_dir() => walk(&dir, &mut all, &mut skipped)?,
        _ => match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => walk(&dir, &mut all, &mut skipped)?,
            Ok(m) => skipped.push(Skipped {
                reason: format!(
                    "{} where the table's directory belongs: not read",
                    kind_of(&m.file_type())
                ),
                path: dir,
            }),
            Err(e) => skipped.push(Skipped {
                reason: format!("where the table's directory belongs, and cannot be followed: {e}"),
                path: dir,
            }),
        },
    }
    // Nearest the table's directory first, then by path.
    all.sort_by(|a, b| {
        a.components()
            .count()
            .cmp(&b.components().count())
            .then_with(|| a.cmp(b))
    });
    let mut seen: std::collections::HashMap<std::ffi::OsString, PathBuf> = std::collections::HashMap::new();
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
    all.retain(|p| {
        let Some(name) = p.file_name() else { return true };
        let lossy = name.to_string_lossy();
        if !(is_parquet_name(&lossy) || is_log_name(&lossy)) {
            return true;
        }
        match seen.get(name) {
            // zcta's names are one process's own: another file under one of them is a
            // copy, re-written (another tool's re-save) or not, or an edit, whose rows
            // would count twice.
            Some(first) => {
                let reason = if len(first) == len(p) {
                    format!("a copy of {} (the same name): not read twice", first.display())
                } else {
                    format!(
                        "another file under the name of {} (other bytes: a copy re-written, or an edit): not read twice; the one nearest the table's directory is read",
                        first.display()
                    )
                };
                skipped.push(Skipped {
                    reason,
                    path: p.clone(),
                });
                false
            }
            None => {
                seen.insert(name.to_owned(), p.clone());
                true
            }
        }
    });
    skip_same_contents(&mut all, &mut skipped);
    all.sort();
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    let mut l = Listing {
        skipped,
        ..Listing::default()
    };
    for p in all {
        // Classified by a lossy reading of the name: a name that is not UTF-8 (a host
        // name in another encoding) still ends in `.parquet` or `.wal`, and its file is
        // read, not left out unseen.
        let name = p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        if is_log_name(&name) {
            l.logs.push(p);
        } else if is_parquet_name(&name) {
            l.parquet.push(p);
        }
    }
    Ok(l)
}

/// Leaves out of `all` a Parquet file whose bytes another one's repeat under another
/// name (`cp ops/x.parquet ops/backup.parquet`): the same length and the same footer,
/// which records every column chunk's offsets, sizes and statistics (the process's
/// host and pid among them), so the two hold the same rows. The one kept is the nearest
/// the table's directory, one under zcta's own name before others, then the first by
/// path. A file whose footer cannot be read is left for its reader to name.
fn skip_same_contents(all: &mut Vec<PathBuf>, skipped: &mut Vec<Skipped>) {
    let zcta_name = |p: &Path| {
        p.file_stem()
            .and_then(|s| s.to_str())
            .is_some_and(|s| crate::sink::pid_of_stem(s).is_some())
    };
    let mut order: Vec<&PathBuf> = all
        .iter()
        .filter(|p| is_parquet_name(&p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()))
        .collect();
    order.sort_by_key(|p| (p.components().count(), !zcta_name(p), (*p).clone()));
    let mut seen: std::collections::HashMap<(u64, Vec<u8>), &PathBuf> = std::collections::HashMap::new();
    let mut copies: Vec<(PathBuf, PathBuf)> = Vec::new();
    for p in order {
        let Some(key) = footer_bytes(p) else { continue };
        match seen.get(&key) {
            Some(first) => copies.push((p.clone(), (*first).clone())),
            None => {
                seen.insert(key, p);
            }
        }
    }
    for (copy, first) in copies {
        all.retain(|p| *p != copy);
        skipped.push(Skipped {
            reason: format!("a copy of {} (the same bytes): not read twice", first.display()),
            path: copy,
        });
    }
}

/// A Parquet file's length and the bytes of its footer (its metadata, then the
/// metadata's length and the magic); `None` when they cannot be read.
fn footer_bytes(p: &Path) -> Option<(u64, Vec<u8>)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = open_regular(p).ok()?;
    let len = f.metadata().ok()?.len();
    let mut tail = [0u8; 8];
    f.seek(SeekFrom::Start(len.checked_sub(8)?)).ok()?;
    f.read_exact(&mut tail).ok()?;
    if &tail[4..] != b"PAR1" {
        return None;
    }
    let n = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]])) + 8;
    if n > len || n > 64 << 20 {
        return None;
    }
    let mut buf = vec![0u8; usize::try_from(n).ok()?];
    f.seek(SeekFrom::Start(len - n)).ok()?;
    f.read_exact(&mut buf).ok()?;
    Some((len, buf))
}

/// Complete Parquet files and pending logs of one table (regular files only; see
/// [`list_files`] for what is left out and why).
pub fn list_table(run_dir: &Path, table: &str) -> Result<(Vec<PathBuf>, Vec<PathBuf>), ReadError> {
    let l = list_files(run_dir, table)?;
    Ok((l.parquet, l.logs))
}

/// Several processes whose files name the same host and pid (containers sharing a
/// host name, each with its own pids; or files of an earlier zcta, whose names held
/// no per-process token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedPid {
    pub host: String,
    pub pid: i32,
    /// The file-name prefixes of those processes, one each.
    pub prefixes: Vec<String>,
}

impl std::fmt::Display for SharedPid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} processes claim host {} pid {} (files {}): their rows share (host, pid), so what joins on it (op_id, phases, nccl_ops, gpu, proxy) may mix them",
            self.prefixes.len(),
            self.host,
            self.pid,
            self.prefixes
                .iter()
                .map(|p| format!("{p}*"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// The (host, pid) pairs that the file names of `run_dir` give to more than one process.
pub fn shared_pids(run_dir: &Path) -> Result<Vec<SharedPid>, ReadError> {
    use std::collections::{BTreeMap, BTreeSet};
    check_run_dir(run_dir)?;
    let mut by: BTreeMap<(String, i32), BTreeSet<String>> = BTreeMap::new();
    for table in tables::ALL_TABLES {
        let l = list_files(run_dir, table)?;
        for p in l.parquet.iter().chain(&l.logs) {
            let name = p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
            let stem = name.strip_prefix('_').unwrap_or(&name);
            let stem = stem
                .strip_suffix(".parquet")
                .or_else(|| stem.strip_suffix(".wal"))
                .unwrap_or(stem);
            // `process` files have no segment number.
            let prefix = match stem.rsplit_once('-') {
                Some((pre, seg))
                    if table != "process" && !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    pre
                }
                _ => stem,
            };
            if let Some((host, pid)) = crate::sink::pid_of_stem(prefix) {
                by.entry((host, pid)).or_default().insert(prefix.to_owned());
            }
        }
    }
    Ok(by
        .into_iter()
        .filter(|(_, p)| p.len() > 1)
        .map(|((host, pid), p)| SharedPid {
            host,
            pid,
            prefixes: p.into_iter().collect(),
        })
        .collect())
}

/// What reading any table starts with: the run directory checked, the table's current
/// schema, its complete files, and a result holding its pending logs.
fn open_table(run_dir: &Path, table: &str) -> Result<(SchemaRef, Vec<PathBuf>, TableData), ReadError> {
    check_run_dir(run_dir)?;
    let schema = tables::schema_of(table).ok_or_else(|| ReadError::UnknownTable(table.into()))?;
    let l = list_files(run_dir, table)?;
    let data = TableData {
        pending_logs: l.logs,
        skipped: l.skipped,
        ..TableData::default()
    };
    Ok((schema, l.parquet, data))
}

/// Reads every complete file of `table` in `run_dir`, aligned to the current schema.
pub fn read_table(run_dir: &Path, table: &str) -> Result<TableData, ReadError> {
    let (mut data, files) = fold_table(run_dir, table, Vec::new, |v, b| v.push(b.clone()))?;
    data.batches = files.into_iter().flat_map(|(_, batches)| batches).collect();
    Ok(data)
}

/// Reads `table` as [`read_table`] does (each complete file used whole, or skipped
/// whole with the same reason) without holding it: each file's batches, every column
/// aligned to the current schema, go one at a time into an `A` of its own, made by
/// `new`. Returns the table's files, skipped files and pending logs (`batches` stays
/// empty), and per file used its rows and its `A`.
pub fn fold_table<A>(
    run_dir: &Path,
    table: &str,
    mut new: impl FnMut() -> A,
    mut add: impl FnMut(&mut A, &RecordBatch),
) -> Result<(TableData, Vec<(usize, A)>), ReadError> {
    let (schema, files, mut data) = open_table(run_dir, table)?;
    let mut used = Vec::new();
    for path in files {
        let mut acc = new();
        let mut rows = 0;
        let read = file_batches(&path, &schema).and_then(|batches| {
            for b in batches {
                let b = b?;
                rows += b.num_rows();
                add(&mut acc, &b);
            }
            Ok(())
        });
        match read {
            Ok(()) => {
                used.push((rows, acc));
                data.files.push(path);
            }
            Err(reason) => data.skipped.push(Skipped { path, reason }),
        }
    }
    Ok((data, used))
}

/// Streams every complete file of `table`, a batch at a time and only `columns`, into
/// `f`: memory stays bounded by one batch. The result lists the files read, those
/// skipped (a file that breaks off part-way is listed too; its earlier batches were
/// used) and the pending logs; its `batches` stay empty.
pub fn for_each_batch(
    run_dir: &Path,
    table: &str,
    columns: &[&str],
    mut f: impl FnMut(&RecordBatch),
) -> Result<TableData, ReadError> {
    for_each_batch_by_file(run_dir, table, columns, |b, _: &mut ()| f(b), |_, (), _| {})
}

/// [`for_each_batch`] with a state `S` per file: each file's batches go into `f` with
/// that file's own `S` (from `S::default()`), and `done` then gets the file's path, its
/// `S` and the list of skipped files (where a caller that judges rows as it reads
/// names the file) before the file is listed as read or as broken off.
pub fn for_each_batch_by_file<S: Default>(
    run_dir: &Path,
    table: &str,
    columns: &[&str],
    mut f: impl FnMut(&RecordBatch, &mut S),
    mut done: impl FnMut(&Path, S, &mut Vec<Skipped>),
) -> Result<TableData, ReadError> {
    let (schema, files, mut data) = open_table(run_dir, table)?;
    for path in files {
        match stream_file(&path, &schema, columns, 64 * 1024) {
            Ok(batches) => {
                let (mut state, mut broke, mut used) = (S::default(), None, 0usize);
                for b in batches {
                    match b {
                        Ok(b) => {
                            used += b.num_rows();
                            f(&b, &mut state);
                        }
                        Err(reason) => {
                            broke = Some(reason);
                            break;
                        }
                    }
                }
                done(&path, state, &mut data.skipped);
                match broke {
                    None => data.files.push(path),
                    Some(reason) => data.skipped.push(Skipped {
                        path,
                        reason: broken_after(&reason, used),
                    }),
                }
            }
            Err(reason) => data.skipped.push(Skipped { path, reason }),
        }
    }
    Ok(data)
}

/// Batches of one Parquet file of a table, only the `columns` asked for (a column the
/// file lacks, from an older schema version, reads as NULL), `batch_rows` at a time:
/// memory stays bounded whatever the file's size. Opening errors, and a decoder error
/// or panic while reading, come back as the human reason the file is skipped; the
/// batches end after the first such error.
pub fn stream_file(
    path: &Path,
    schema: &SchemaRef,
    columns: &[&str],
    batch_rows: usize,
) -> Result<impl Iterator<Item = Result<RecordBatch, String>> + Send + use<>, String> {
    let want = arrow_schema::Schema::new(
        columns
            .iter()
            .filter_map(|c| schema.field_with_name(c).ok().cloned())
            .collect::<Vec<_>>(),
    );
    let want = std::sync::Arc::new(want);
    let open = || -> Result<_, String> {
        let (builder, _) = open_checked(path, schema)?;
        let file_schema = builder.parquet_schema();
        let idx: Vec<usize> = (0..file_schema.num_columns())
            .filter(|&i| columns.contains(&file_schema.column(i).name()))
            .collect();
        let mask = parquet::arrow::ProjectionMask::leaves(file_schema, idx);
        builder
            .with_projection(mask)
            .with_batch_size(batch_rows)
            .build()
            .map_err(|e| format!("cannot read: {e}"))
    };
    let mut reader = guarded(open).unwrap_or_else(|_| Err(DECODER_PANICKED.into()))?;
    // Ends after the first error: a damaged page can make the decoder give the same
    // error for ever, and a caller that skips errors would then never finish.
    let mut failed = false;
    Ok(std::iter::from_fn(move || {
        if failed {
            return None;
        }
        let item = match guarded(std::panic::AssertUnwindSafe(|| reader.next())) {
            Err(_) => Err(DECODER_PANICKED.into()),
            Ok(next) => next?
                .map_err(|e| format!("corrupt data: {e}"))
                .and_then(|b| align(&b, &want)),
        };
        failed = item.is_err();
        Some(item)
    }))
}

/// Opens `path` (links followed) for reading only if it is a regular file: a FIFO or
/// device put there, even after a listing saw a file, is opened without waiting
/// (`O_NONBLOCK`, which does nothing to a regular file's reads) and refused. `Err` is
/// the human reason.
pub fn open_regular(path: &Path) -> Result<File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let not_file = |ft: &std::fs::FileType| format!("{}: not a regular file", kind_of(ft));
    let m = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if !m.is_file() {
        return Err(not_file(&m.file_type()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot open: {e}"))?;
    let m = file.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !m.is_file() {
        return Err(not_file(&m.file_type()));
    }
    Ok(file)
}

/// What a Parquet file's footer says ([`parquet_footer`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Footer {
    pub rows: u64,
    /// Its [`crate::TABLE_KEY`]; `None` when zcta did not write it (or wrote it with a
    /// schema this build does not read), or when `path` is a link (zcta writes none).
    pub table: Option<String>,
}

/// Reads the footer of the Parquet file at `path` once. Links are followed for the
/// rows; only regular files are opened (a FIFO would block: one put there after the
/// check is opened without waiting, then refused). `Err` says why it is no readable
/// Parquet file.
pub fn parquet_footer(path: &Path) -> Result<Footer, String> {
    let own = std::fs::symlink_metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    let file = open_regular(path)?;
    // The parquet crate can panic on a corrupt footer (as `file_batches` notes).
    let meta = guarded(|| {
        parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&file)
            .map_err(|e| e.to_string())
    })
    .unwrap_or_else(|_| Err("the decoder rejected its footer".into()))?;
    let rows =
        u64::try_from(meta.file_metadata().num_rows()).map_err(|_| "negative row count".to_string())?;
    let table = own
        .file_type()
        .is_file()
        .then(|| meta.file_metadata().key_value_metadata())
        .flatten()
        .filter(|kv| check_version(Some(kv)).is_ok())
        .and_then(|kv| kv.iter().find(|k| k.key == crate::TABLE_KEY))
        .and_then(|k| k.value.clone());
    Ok(Footer { rows, table })
}

/// The zcta table a Parquet file says it belongs to (its footer's
/// [`crate::TABLE_KEY`]); `None` for a file that cannot be opened as Parquet, a link,
/// or a file not written by zcta. Opens only regular files (a FIFO would block).
pub fn parquet_table(path: &Path) -> Option<String> {
    parquet_footer(path).ok()?.table
}

fn check_version(kv: Option<&Vec<parquet::file::metadata::KeyValue>>) -> Result<u32, String> {
    let version = kv
        .and_then(|kv| kv.iter().find(|k| k.key == crate::SCHEMA_VERSION_KEY))
        .and_then(|k| k.value.as_deref())
        .ok_or_else(|| {
            format!(
                "no {} in the file metadata: not written by zcta",
                crate::SCHEMA_VERSION_KEY
            )
        })?;
    let version: u32 = version
        .parse()
        .map_err(|_| format!("bad schema version {version:?}"))?;
    if version > crate::SCHEMA_VERSION {
        return Err(format!(
            "written with schema version {version}, newer than this zcta's {}; upgrade zcta",
            crate::SCHEMA_VERSION
        ));
    }
    Ok(version)
}

/// Opens a Parquet file of the table `schema` describes, once its footer says zcta may
/// use it ([`check_version`], [`check_table`]): the reader's builder and the file's
/// schema version, or the human reason the file is skipped. Call it inside [`guarded`]
/// (the footer's decoder may panic).
fn open_checked(
    path: &Path,
    schema: &SchemaRef,
) -> Result<(ParquetRecordBatchReaderBuilder<File>, u32), String> {
    let file = open_regular(path)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| format!("not a readable Parquet file (truncated or corrupt?): {e}"))?;
    let kv = builder.metadata().file_metadata().key_value_metadata();
    let version = check_version(kv)?;
    check_table(kv, schema)?;
    Ok((builder, version))
}

/// A file that names its table ([`crate::TABLE_KEY`]) must name the one being read
/// (`schema`'s): a `process` file copied into `ops/` is another table's rows, whatever
/// columns they share. Files that name none (other writers) are judged by their columns.
fn check_table(
    kv: Option<&Vec<parquet::file::metadata::KeyValue>>,
    schema: &SchemaRef,
) -> Result<(), String> {
    let Some(want) = schema.metadata().get(crate::TABLE_KEY) else {
        return Ok(());
    };
    let got = kv
        .and_then(|kv| kv.iter().find(|k| k.key == crate::TABLE_KEY))
        .and_then(|k| k.value.as_deref());
    match got {
        Some(got) if got != want => Err(format!(
            "a file of table `{got}` (its {}), not of `{want}`",
            crate::TABLE_KEY
        )),
        _ => Ok(()),
    }
}

/// Reads one Parquet file; `Err` is the human reason it was skipped.
///
/// The parquet crate can panic on some corrupt footers (e.g. a negative column-chunk
/// size); such a panic is contained here and reported as a corrupt file.
pub fn read_file(path: &Path, schema: &SchemaRef) -> Result<Vec<RecordBatch>, String> {
    file_batches(path, schema)?.collect()
}

/// The batches of one Parquet file as they decode, every column aligned to `schema`;
/// the first `Err` (the last item) is the human reason the file cannot be used, as
/// [`read_file`] gives it.
fn file_batches(
    path: &Path,
    schema: &SchemaRef,
) -> Result<impl Iterator<Item = Result<RecordBatch, String>> + use<>, String> {
    let open = || -> Result<_, String> {
        let (builder, version) = open_checked(path, schema)?;
        let reader = builder.build().map_err(|e| format!("cannot read: {e}"))?;
        Ok((version, reader))
    };
    let (version, mut reader) = guarded(open).unwrap_or_else(|_| Err(DECODER_PANICKED.into()))?;
    let schema = Arc::clone(schema);
    let mut failed = false;
    Ok(std::iter::from_fn(move || {
        if failed {
            return None;
        }
        let b = match guarded(std::panic::AssertUnwindSafe(|| reader.next())) {
            Err(_) => Err(DECODER_PANICKED.to_owned()),
            Ok(None) => return None,
            Ok(Some(Err(e))) => Err(format!("corrupt data: {e}")),
            Ok(Some(Ok(b))) => align(&b, &schema).map_err(|e| format!("schema version {version}: {e}")),
        };
        failed = b.is_err();
        Some(b)
    }))
}

/// Projects a batch onto `schema` by column name: missing nullable columns become
/// NULL (files from older schema versions), extra columns are dropped.
pub fn align(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => cols.push(c.clone()),
            Some(c) => {
                return Err(format!(
                    "column {} has type {}, expected {}",
                    f.name(),
                    c.data_type(),
                    f.data_type()
                ));
            }
            None if f.is_nullable() => cols.push(new_null_array(f.data_type(), batch.num_rows())),
            None => return Err(format!("required column {} is missing", f.name())),
        }
    }
    RecordBatch::try_new(Arc::clone(schema), cols).map_err(|e| e.to_string())
}
