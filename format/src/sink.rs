//! The writer side: a crash-safe Parquet dataset per table, and the loop that
//! drains the shim's bounded queue into it.
//!
//! # Crash safety
//! A Parquet file is unreadable until `close()` writes its footer, so every batch is
//! written twice: appended to a write-ahead log in Arrow IPC *stream* format (which
//! survives a torn tail: every complete batch stays readable) and encoded into the
//! segment's Parquet writer. The batch is cut at least every `flush_interval` (default
//! 500 ms) and the log is flushed to the kernel then, so a SIGKILL loses nothing older
//! than that. When a segment rolls (row or age limit) or the process exits, the
//! Parquet file is closed, renamed into place and its log deleted. After a crash,
//! `zcta recover RUN` turns the leftover logs into Parquet ([`crate::recover`]).
//!
//! Files of table `t` written by one process, segment `n`:
//! - `t/<prefix>-<n>.parquet`: complete, readable (the only files readers glob);
//! - `t/_<prefix>-<n>.wal`: the segment's log while it is open (or after a crash);
//! - `t/_<prefix>-<n>.parquet.tmp`: the Parquet file being written.
//!
//! The `_` prefix makes pyarrow/pandas dataset discovery skip leftovers, and
//! `*.parquet` globs (DuckDB) never match them.
//!
//! # A full disk
//! The `ops` log is opened first and claims disk ahead of itself ([`OPS_RESERVE`],
//! renewed as it grows, with `fallocate` keeping its size), so when the disk fills up
//! the other tables run out of room first and `ops` goes on. The claim is the
//! program's disk too: it comes out of what the file system has free beyond
//! [`CLAIM_FLOOR`], and once there is less, what the log claimed and has not used is
//! given back down to [`LOW_CLAIM`] (the writer looks as often as the room beyond the
//! floor could fill: [`Writer::tick`]), so on a nearly full disk zcta holds at most
//! that much it has not written. Logs are written in
//! slices of [`LOG_SLICE_ROWS`] rows: a write without room loses that slice and the
//! rows after it, never those before. A table whose log cannot be written stops alone,
//! counting the rows it could not take (only a full `ops` table stops recording); a
//! Parquet file that cannot be written is given up and its log kept for
//! `zcta recover`. The `process` row says `error`, counts the lost rows in
//! `records_dropped` and per table in `write_errors`; when its own file has no room, it
//! goes into its log (disk claimed at the start for a few rows of its size,
//! [`PROCESS_RESERVE_ROWS`], within [`LOW_CLAIM`] below the floor, never given back),
//! where `zcta recover` finds it.

use std::fs::{self, File};
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding as PqEncoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::files::{OwnFile, make_dirs, rename_new};
use crate::gpu::{Attributor, GpuItem, GpuRow, OpRow};
use crate::record::{Event, PluginEvent, Timing};
use crate::sample::{Detail, Sampler, Sampling};
use crate::tables::{
    CallsTable, CommsTable, Ctx, Encoding, GpuTable, NcclCommsTable, NcclOpsTable, OpsTable, ProcessRow,
    ProcessTable, ProxyTable, RowBuilder, Table,
};

/// An I/O or encoding failure, with the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: io::Error },
    #[error("{path}: {err}")]
    Arrow {
        path: PathBuf,
        err: arrow_schema::ArrowError,
    },
    #[error("{path}: {err}")]
    Parquet {
        path: PathBuf,
        err: parquet::errors::ParquetError,
    },
}

impl SinkError {
    fn io(path: &Path, err: io::Error) -> Self {
        SinkError::Io {
            path: path.to_owned(),
            err,
        }
    }
    fn arrow(path: &Path, err: arrow_schema::ArrowError) -> Self {
        SinkError::Arrow {
            path: path.to_owned(),
            err,
        }
    }
    fn parquet(path: &Path, err: parquet::errors::ParquetError) -> Self {
        SinkError::Parquet {
            path: path.to_owned(),
            err,
        }
    }
}

/// When to cut batches and roll segments.
#[derive(Clone, Copy, Debug)]
pub struct SinkPolicy {
    /// Cut the pending batch and flush the log at least this often.
    pub flush_interval: Duration,
    /// Cut a batch once this many rows are pending.
    pub batch_rows: usize,
    /// Close the Parquet segment after this many rows...
    pub segment_rows: u64,
    /// ...or once it is this old (and not empty).
    pub segment_age: Duration,
    /// Parquet row-group size.
    pub row_group_rows: usize,
    /// Claims disk blocks for a file beyond its end without changing its size (the
    /// shim's `fallocate(FALLOC_FL_KEEP_SIZE)`); `None`: nothing is reserved.
    pub reserve: Option<ReserveFn>,
    /// How much room a file's file system has free (the shim's `fstatvfs`), which
    /// bounds what is claimed ([`CLAIM_FLOOR`]); `None`: not asked, claims unbounded.
    pub room: Option<RoomFn>,
}

/// `reserve(file, offset, len)`: claims `len` bytes of disk from `offset` for `file`,
/// its size unchanged; whether the blocks were claimed.
pub type ReserveFn = fn(&File, u64, u64) -> bool;

/// `room(file)`: the bytes free to the program on the file system holding `file`;
/// `None` when it cannot be told.
pub type RoomFn = fn(&File) -> Option<u64>;

/// The disk the logs claim is the program's disk too: they claim out of what their
/// file system has free beyond this much, and once it has less, what the `ops` log
/// claimed and has not used is given back down to [`LOW_CLAIM`] ([`Writer::tick`]).
/// So on a file system with less than this free, a program that fills it meets at
/// most [`LOW_CLAIM`] a log of zcta's unwritten claims.
pub const CLAIM_FLOOR: u64 = 1 << 30;

/// What a log may still claim below [`CLAIM_FLOOR`] (or a sixteenth of what is free,
/// if less), and keeps: the `ops` log still goes on when the other tables run out,
/// and the `process` log keeps room for the final row, which says how the process
/// ended.
pub const LOW_CLAIM: u64 = 256 << 10;

/// The writer looks at the room left at most this often...
const ROOM_CHECK_MIN: Duration = Duration::from_millis(100);
/// ...and at least this often, while the `ops` log holds more than [`LOW_CLAIM`]
/// unwritten: in between, as often as the room beyond [`CLAIM_FLOOR`] could fill at
/// [`FILL_RATE`] (a file system call that is a server round trip on a network file
/// system is not made ten times a second while there are terabytes free).
const ROOM_CHECK_MAX: Duration = Duration::from_secs(10);
/// The fastest a program is taken to fill its disk, in bytes a second.
const FILL_RATE: u64 = 8 << 30;

/// The most a log may claim on the file system holding `file` (`room`): what it has
/// free beyond [`CLAIM_FLOOR`], and at least [`LOW_CLAIM`] or a sixteenth of what is
/// free; unbounded when the room cannot be told.
fn claim_cap(room: Option<RoomFn>, file: &File) -> u64 {
    room.and_then(|r| r(file)).map_or(u64::MAX, |free| {
        free.saturating_sub(CLAIM_FLOOR).max(LOW_CLAIM.min(free / 16))
    })
}

/// When to look at the room again, having seen `free` (None: unknown).
fn next_room_check(free: Option<u64>) -> Duration {
    let Some(free) = free else {
        return ROOM_CHECK_MAX;
    };
    let fill = Duration::from_secs_f64(free.saturating_sub(CLAIM_FLOOR) as f64 / FILL_RATE as f64);
    fill.clamp(ROOM_CHECK_MIN, ROOM_CHECK_MAX)
}

/// Disk claimed ahead of the `ops` log (renewed while it grows, as much of it as the
/// disk has room for): when the disk fills up, the other tables run out of room
/// first and the `ops` log goes on into this.
pub const OPS_RESERVE: u64 = 8 << 20;

/// Rows per write to a log: a write the disk has no room for loses at most this many
/// rows of those being logged (and those after them).
const LOG_SLICE_ROWS: usize = 4096;

/// The least disk claimed at once ahead of the `ops` log.
const MIN_RESERVE: u64 = 64 << 10;

/// Claims up to `want` bytes from `offset` for `file`, within [`claim_cap`], halving
/// what it asks for while the disk has no room for it; returns what was claimed.
fn claim(reserve: ReserveFn, room: Option<RoomFn>, file: &File, offset: u64, want: u64) -> u64 {
    let mut len = want.min(claim_cap(room, file));
    while len >= MIN_RESERVE {
        if reserve(file, offset, len) {
            return len;
        }
        len /= 2;
    }
    0
}

/// Disk claimed by the `process` row's log when it is made, for the final row when
/// the disk is full at the end: this many times what the log holds once its first row
/// is in (the final row has the same columns; the margin is for its longer strings),
/// and no less than [`MIN_RESERVE`]: a claim far beyond the row would take from a
/// small disk the room the `ops` log claims next.
pub const PROCESS_RESERVE_ROWS: u64 = 3;

/// Parquet row-group size of the sink's files (`SinkPolicy::row_group_rows`' default, and
/// the size [`write_parquet_file`] writes).
pub const ROW_GROUP_ROWS: usize = 256 * 1024;

impl Default for SinkPolicy {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_millis(500),
            batch_rows: 16 * 1024,
            segment_rows: 4 * 1024 * 1024,
            segment_age: Duration::from_secs(300),
            row_group_rows: ROW_GROUP_ROWS,
            reserve: None,
            room: None,
        }
    }
}

/// The size at which a column's Parquet page is compressed and set aside.
const DATA_PAGE_BYTES: usize = 64 * 1024;

/// Parquet writer settings for a table: zstd, DELTA_BINARY_PACKED for monotone
/// integer columns, PLAIN for the rest, schema version in the key-value metadata.
/// No dictionary: its encoder hashes and looks up every value, which was the
/// writer's largest cost per row (callgrind, docs/PERFORMANCE.md), while zstd takes
/// the repeats out of plain columns for ~2 more bytes per `ops` row.
pub fn writer_properties<T: Table>(row_group_rows: usize) -> WriterProperties {
    properties_of(&crate::tables::info::<T>(), row_group_rows)
}

/// [`writer_properties`] of a table known by its [`TableInfo`](crate::tables::TableInfo).
fn properties_of(t: &crate::tables::TableInfo, row_group_rows: usize) -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_dictionary_enabled(false)
        .set_encoding(PqEncoding::PLAIN)
        // A column's page is held uncompressed until it reaches this size: PLAIN values
        // fill the default 1 MiB, dozens of columns at once, for tens of MB of memory.
        .set_data_page_size_limit(DATA_PAGE_BYTES)
        .set_max_row_group_row_count(Some(row_group_rows))
        .set_created_by(format!("zcta-prof {}", crate::ZCTA_VERSION))
        .set_key_value_metadata(Some(vec![
            KeyValue::new(
                crate::SCHEMA_VERSION_KEY.to_string(),
                crate::SCHEMA_VERSION.to_string(),
            ),
            KeyValue::new(crate::TABLE_KEY.to_string(), t.name.to_string()),
        ]));
    for (col, enc) in (t.encodings)() {
        if *enc == Encoding::Delta {
            let path = ColumnPath::from(*col);
            b = b
                .set_column_dictionary_enabled(path.clone(), false)
                .set_column_encoding(path, PqEncoding::DELTA_BINARY_PACKED);
        }
    }
    b.build()
}

/// Writes one complete Parquet file atomically (tmp + rename).
pub fn write_parquet_file<T: Table>(path: &Path, batches: &[RecordBatch]) -> Result<(), SinkError> {
    write_table_file(&crate::tables::info::<T>(), path, batches)
}

/// [`write_parquet_file`] of a table known by its [`TableInfo`](crate::tables::TableInfo)
/// (recovery, which finds a table by its name).
pub fn write_table_file(
    t: &crate::tables::TableInfo,
    path: &Path,
    batches: &[RecordBatch],
) -> Result<(), SinkError> {
    let tmp = tmp_path_for(path);
    let file = OwnFile::create(&tmp).map_err(|e| SinkError::io(&tmp, e))?;
    let written = ArrowWriter::try_new(file, (t.schema)(), Some(properties_of(t, ROW_GROUP_ROWS)))
        .and_then(|mut w| {
            for b in batches {
                w.write(b)?;
            }
            w.close()
        })
        .map_err(|e| SinkError::parquet(&tmp, e))
        .and_then(|_| rename_new(&tmp, path).map_err(|e| SinkError::io(path, e)));
    if written.is_err() {
        // Made above: ours to remove.
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// Host and pid encoded in a file stem `<host>-[r<rank>-]p<pid>[-u<token>][-<segment>]`.
pub fn pid_of_stem(stem: &str) -> Option<(String, i32)> {
    let parts: Vec<&str> = stem.split('-').collect();
    let i = parts
        .iter()
        .rposition(|p| p.len() > 1 && p.starts_with('p') && p[1..].bytes().all(|b| b.is_ascii_digit()))?;
    let pid = parts[i][1..].parse().ok()?;
    let host_end = parts[..i]
        .iter()
        .rposition(|p| !(p.len() > 1 && p.starts_with('r') && p[1..].bytes().all(|b| b.is_ascii_digit())))
        .map_or(0, |j| j + 1);
    Some((parts[..host_end].join("-"), pid))
}

/// `dir/_name.parquet.tmp` for `dir/name.parquet`.
pub fn tmp_path_for(final_path: &Path) -> PathBuf {
    let name = final_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    final_path.with_file_name(format!("_{name}.tmp"))
}

/// `dir/_stem.wal` for `dir/stem.parquet`.
pub fn wal_path_for(final_path: &Path) -> PathBuf {
    let stem = final_path
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    final_path.with_file_name(format!("_{stem}.wal"))
}

/// `dir/stem.parquet` for `dir/_stem.wal`, `None` for other names.
pub fn final_path_for_wal(wal: &Path) -> Option<PathBuf> {
    let name = wal.file_name()?.to_str()?;
    let stem = name.strip_prefix('_')?.strip_suffix(".wal")?;
    Some(wal.with_file_name(format!("{stem}.parquet")))
}

struct Segment {
    wal: StreamWriter<BufWriter<OwnFile>>,
    wal_path: PathBuf,
    /// `None` once writing the Parquet file failed (the disk is full): the segment's
    /// rows stay in its log, which is then left for `zcta recover`.
    pq: Option<ArrowWriter<OwnFile>>,
    tmp_path: PathBuf,
    final_path: PathBuf,
    rows: u64,
    opened: Instant,
    /// End of the disk claimed for the log (0: none).
    reserved: u64,
    /// More than [`LOW_CLAIM`] was claimed since the last look found the room low:
    /// the writer looks at the room ([`DatasetWriter::give_back_if_low`]).
    big_claim: bool,
    /// Rows whose batch is complete in the log.
    logged: u64,
}

impl Segment {
    /// Gives the Parquet file up (its rows are in the log): frees its disk.
    fn drop_parquet(&mut self) {
        if self.pq.take().is_some() {
            let _ = fs::remove_file(&self.tmp_path);
        }
    }

    /// Leaves the log on disk for `zcta recover` (its claimed disk beyond the end is
    /// given back) and removes the Parquet file.
    fn keep_log(mut self) {
        self.drop_parquet();
        let _ = self.wal.flush();
        if let Some(f) = self.wal.get_ref().get_ref().file() {
            give_back_claim(f);
        }
    }
}

/// Gives back the disk claimed ahead of `f` beyond its end (`fallocate` keeping its
/// size claims blocks past it): a log left for `zcta recover` holds only what it wrote.
/// Returns the log's length (where its claim now ends), when it could be read. Callers
/// pass the log only while its descriptor is still ours ([`OwnFile::file`]).
fn give_back_claim(f: &File) -> Option<u64> {
    let len = f.metadata().ok()?.len();
    let _ = f.set_len(len);
    Some(len)
}

/// The crash-safe writer of one table for one process.
pub struct DatasetWriter<T: Table> {
    dir: PathBuf,
    prefix: String,
    next_segment: u32,
    policy: SinkPolicy,
    props: WriterProperties,
    schema: SchemaRef,
    builder: T::Builder,
    segment: Option<Segment>,
    /// Batches already in the log, not yet in the Parquet writer.
    unencoded: Vec<RecordBatch>,
    rows_written: u64,
    last_cut: Instant,
    /// Disk to claim ahead of this table's log ([`OPS_RESERVE`] for `ops`).
    reserve_bytes: u64,
    /// The first write error; the table takes no more rows after it.
    failed: Option<String>,
    /// Rows that did not reach the log (the table failed, or their batch was torn).
    lost: u64,
    /// Whether some rows stay in logs for `zcta recover` (their Parquet file failed).
    logs_kept: bool,
    /// The first failed Parquet write, until the writer has reported it.
    notice: Option<SinkError>,
}

impl<T: Table> DatasetWriter<T> {
    /// `run_dir/<table>/` holds the files; `prefix` names this process's files.
    pub fn new(run_dir: &Path, prefix: &str, policy: SinkPolicy) -> Self {
        Self {
            dir: run_dir.join(T::NAME),
            prefix: prefix.to_owned(),
            next_segment: 0,
            policy,
            props: writer_properties::<T>(policy.row_group_rows),
            schema: T::schema(),
            builder: T::Builder::default(),
            segment: None,
            unencoded: Vec::new(),
            rows_written: 0,
            last_cut: Instant::now(),
            reserve_bytes: 0,
            failed: None,
            lost: 0,
            logs_kept: false,
            notice: None,
        }
    }

    /// Claims `bytes` of disk ahead of this table's log (with the policy's `reserve`).
    pub fn with_reserve(mut self, bytes: u64) -> Self {
        self.reserve_bytes = bytes;
        self
    }

    /// Rows written to the log so far, plus those pending.
    pub fn rows(&self) -> u64 {
        self.rows_written + self.builder.len() as u64
    }

    /// Rows that did not reach the log.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// The first write error of this table.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Whether rows of this table wait in logs for `zcta recover`.
    pub fn logs_kept(&self) -> bool {
        self.logs_kept
    }

    /// The table's first failed Parquet write (its rows stayed in the log), once.
    pub fn take_notice(&mut self) -> Option<SinkError> {
        self.notice.take()
    }

    /// Opens the first segment now, so its log claims its disk before other tables'
    /// logs take any.
    pub fn open_now(&mut self) -> Result<(), SinkError> {
        if self.segment.is_none() && self.failed.is_none() {
            let r = self.open_segment().map(|seg| self.segment = Some(seg));
            return self.guard(r);
        }
        Ok(())
    }

    #[inline]
    pub fn append(&mut self, row: &T::Row, ctx: &Ctx) -> Result<(), SinkError> {
        if self.failed.is_some() {
            self.lost += 1;
            return Ok(());
        }
        self.builder.append(row, ctx);
        if self.builder.len() >= self.policy.batch_rows {
            let r = self.cut();
            return self.guard(r);
        }
        Ok(())
    }

    /// Durability first: if the flush interval has passed, cuts the pending rows into
    /// the log. Cheap; [`Writer::tick`] does it for every table before any encoding.
    pub fn tick_log(&mut self, now: Instant) -> Result<(), SinkError> {
        if self.failed.is_none() && now.duration_since(self.last_cut) >= self.policy.flush_interval {
            let r = self.cut_log();
            return self.guard(r);
        }
        Ok(())
    }

    /// Whether the open segment's log holds a claim beyond [`LOW_CLAIM`], which
    /// [`give_back_if_low`](Self::give_back_if_low) would look at.
    pub fn holds_big_claim(&self) -> bool {
        self.policy.room.is_some() && self.segment.as_ref().is_some_and(|s| s.big_claim)
    }

    /// Once the open segment's log's file system has less than [`CLAIM_FLOOR`] free,
    /// gives back the disk claimed ahead of the log down to [`LOW_CLAIM`]: the rest
    /// is the program's room. Returns the room it saw (None: not asked, or unknown).
    pub fn give_back_if_low(&mut self) -> Option<u64> {
        let (Some(room), Some(reserve)) = (self.policy.room, self.policy.reserve) else {
            return None;
        };
        let seg = self.segment.as_mut().filter(|s| s.big_claim)?;
        let f = seg.wal.get_ref().get_ref().file()?;
        let free = room(f);
        if free.is_some_and(|free| free < CLAIM_FLOOR)
            && let Some(len) = give_back_claim(f)
        {
            seg.reserved = len + claim(reserve, Some(room), f, len, LOW_CLAIM);
            seg.big_claim = false;
        }
        free
    }

    /// Then the expensive part: encodes logged batches into Parquet and rolls a full
    /// or old segment.
    pub fn tick_encode(&mut self, now: Instant) -> Result<(), SinkError> {
        if self.failed.is_some() {
            return Ok(());
        }
        let r = self.encode().and_then(|()| {
            if let Some(seg) = &self.segment
                && now.duration_since(seg.opened) >= self.policy.segment_age
            {
                self.roll()?;
            }
            Ok(())
        });
        self.guard(r)
    }

    /// A write error stops the table: its pending rows are lost, its open segment's
    /// log stays for `zcta recover` (what reached it is kept), and the disk held by
    /// the Parquet file being written is given back. Returns the error the first time.
    fn guard(&mut self, r: Result<(), SinkError>) -> Result<(), SinkError> {
        let Err(e) = r else { return Ok(()) };
        if self.failed.is_some() {
            return Ok(());
        }
        self.failed = Some(e.to_string());
        self.lost += self.builder.len() as u64;
        let _ = self.builder.finish(&self.schema);
        self.unencoded.clear();
        if let Some(seg) = self.segment.take() {
            if seg.logged > 0 {
                seg.keep_log();
                self.logs_kept = true;
            } else {
                // Nothing complete in it (its rows are counted as lost): no file left
                // that `zcta recover` could not read.
                let (wal, tmp) = (seg.wal_path.clone(), seg.tmp_path.clone());
                drop(seg);
                let _ = fs::remove_file(tmp);
                let _ = fs::remove_file(wal);
            }
        }
        Err(e)
    }

    /// Writes pending rows to the log (flushed to the kernel) and the Parquet writer.
    pub fn cut(&mut self) -> Result<(), SinkError> {
        self.cut_log()?;
        self.encode()
    }

    /// Writes pending rows to the segment's log and flushes it to the kernel, so they
    /// survive a SIGKILL from now on. The batch waits in `unencoded` for [`Self::encode`].
    fn cut_log(&mut self) -> Result<(), SinkError> {
        self.last_cut = Instant::now();
        if self.builder.is_empty() {
            return Ok(());
        }
        let batch = self
            .builder
            .finish(&self.schema)
            .map_err(|e| SinkError::arrow(&self.dir, e))?;
        let n = batch.num_rows() as u64;
        if self.segment.is_none() {
            match self.open_segment() {
                Ok(seg) => self.segment = Some(seg),
                Err(e) => {
                    self.lost += n;
                    return Err(e);
                }
            }
        }
        let seg = self.segment.as_mut().expect("segment opened above");
        // In slices, each flushed: when the disk fills up, the slices logged before
        // stay complete in the log; a slice whose write or flush failed is torn at the
        // log's end (`zcta recover` drops it), so it and the rest are lost.
        let per_row = batch.get_array_memory_size() as u64 / n.max(1);
        let mut done = 0;
        let mut res = Ok(());
        while done < batch.num_rows() {
            let mut len = LOG_SLICE_ROWS.min(batch.num_rows() - done);
            if self.reserve_bytes > 0
                && let Some(reserve) = self.policy.reserve
            {
                // Room for the slice (its size in memory bounds its size in the log) and
                // a quarter of the reserve after it, claimed before it is written.
                if let Some(f) = seg.wal.get_ref().get_ref().file()
                    && let Ok(m) = f.metadata()
                {
                    let need = m.len() + per_row * len as u64 + self.reserve_bytes / 4;
                    if need > seg.reserved {
                        let from = seg.reserved.max(m.len());
                        let got = claim(
                            reserve,
                            self.policy.room,
                            f,
                            from,
                            self.reserve_bytes.max(need - from),
                        );
                        seg.reserved = from + got;
                        seg.big_claim |= got > LOW_CLAIM;
                    }
                    // Less claimed than the slice needs (the disk is full): a slice that
                    // fits what is claimed, so that the claimed space is used to its end
                    // (less the log message's header and padding: 1 KiB and 64 B a column).
                    let overhead = 1024 + 64 * batch.num_columns() as u64;
                    let fits = seg.reserved.saturating_sub(m.len() + overhead) / per_row.max(1);
                    if fits > 0 && (fits as usize) < len {
                        len = fits as usize;
                    }
                }
            }
            let part = batch.slice(done, len);
            let logged = seg
                .wal
                .write(&part)
                .and_then(|()| seg.wal.flush())
                .map_err(|e| SinkError::arrow(&seg.wal_path, e));
            if let Err(e) = logged {
                res = Err(e);
                break;
            }
            done += len;
        }
        let logged = done as u64;
        self.lost += n - logged;
        self.rows_written += logged;
        seg.logged += logged;
        if logged == n {
            self.unencoded.push(batch);
        } else if logged > 0 {
            self.unencoded.push(batch.slice(0, done));
        }
        res
    }

    /// Encodes logged batches into the segment's Parquet writer; rolls when full.
    fn encode(&mut self) -> Result<(), SinkError> {
        self.encode_pending()?;
        if self
            .segment
            .as_ref()
            .is_some_and(|s| s.rows >= self.policy.segment_rows)
        {
            self.roll()?;
        }
        Ok(())
    }

    /// A Parquet write that fails (the disk is full) gives the segment's Parquet file
    /// up: its rows are in the log, which stays for `zcta recover`; the table goes on
    /// logging. The error is returned once, to be reported.
    fn encode_pending(&mut self) -> Result<(), SinkError> {
        let Some(seg) = self.segment.as_mut() else {
            return Ok(());
        };
        let mut failed = None;
        for batch in self.unencoded.drain(..) {
            seg.rows += batch.num_rows() as u64;
            if let Some(pq) = &mut seg.pq
                && let Err(e) = pq.write(&batch)
            {
                failed = Some(SinkError::parquet(&seg.tmp_path, e));
                seg.drop_parquet();
            }
        }
        if let Some(e) = failed {
            self.parquet_failed(e);
        }
        Ok(())
    }

    /// Notes a failed Parquet write (its rows are logged): kept for the writer to
    /// report, the first time.
    fn parquet_failed(&mut self, e: SinkError) {
        if !self.logs_kept {
            self.notice = Some(e);
        }
        self.logs_kept = true;
    }

    fn open_segment(&mut self) -> Result<Segment, SinkError> {
        make_dirs(&self.dir).map_err(|e| SinkError::io(&self.dir, e))?;
        let final_path = self
            .dir
            .join(format!("{}-{:05}.parquet", self.prefix, self.next_segment));
        self.next_segment += 1;
        let wal_path = wal_path_for(&final_path);
        let tmp_path = tmp_path_for(&final_path);
        let mut wal_file = OwnFile::create(&wal_path).map_err(|e| SinkError::io(&wal_path, e))?;
        // Held while the segment is open: `zcta recover` leaves locked logs alone, even
        // from another host on a shared file system.
        wal_file.lock();
        let mut reserved = 0;
        if self.reserve_bytes > 0
            && let Some(reserve) = self.policy.reserve
            && let Some(f) = wal_file.file()
        {
            reserved = claim(reserve, self.policy.room, f, 0, self.reserve_bytes);
        }
        let wal = StreamWriter::try_new(BufWriter::with_capacity(1 << 20, wal_file), &self.schema)
            .map_err(|e| SinkError::arrow(&wal_path, e));
        let wal = match wal {
            Ok(w) => w,
            Err(e) => {
                let _ = fs::remove_file(&wal_path);
                return Err(e);
            }
        };
        // The Parquet file is the second copy: without it (no room), the log alone
        // keeps the rows, for `zcta recover`.
        let pq = OwnFile::create(&tmp_path)
            .map_err(|e| (false, SinkError::io(&tmp_path, e)))
            .and_then(|tmp| {
                ArrowWriter::try_new(tmp, self.schema.clone(), Some(self.props.clone()))
                    .map_err(|e| (true, SinkError::parquet(&tmp_path, e)))
            });
        let mut seg = Segment {
            wal,
            wal_path,
            pq: None,
            tmp_path,
            final_path,
            rows: 0,
            opened: Instant::now(),
            reserved,
            big_claim: reserved > LOW_CLAIM,
            logged: 0,
        };
        match pq {
            Ok(pq) => seg.pq = Some(pq),
            Err((made, e)) => {
                // Only a file made here is removed: one that was there is not ours.
                if made {
                    let _ = fs::remove_file(&seg.tmp_path);
                }
                self.parquet_failed(e);
            }
        }
        Ok(seg)
    }

    /// Closes the open segment: Parquet footer, rename into place, delete the log.
    /// Logged batches not yet encoded are encoded first.
    /// A segment whose Parquet file failed keeps its log instead, for `zcta recover`.
    /// A segment without rows (opened early by [`Self::open_now`]) leaves no file.
    pub fn roll(&mut self) -> Result<(), SinkError> {
        self.encode_pending()?;
        let Some(mut seg) = self.segment.take() else {
            return Ok(());
        };
        if seg.rows == 0 {
            seg.drop_parquet();
            drop(seg.wal);
            // Its number goes to the next segment: segments stay consecutive.
            self.next_segment -= 1;
            return fs::remove_file(&seg.wal_path).map_err(|e| SinkError::io(&seg.wal_path, e));
        }
        let Some(pq) = seg.pq.take() else {
            seg.keep_log();
            return Ok(());
        };
        if let Err(e) = pq.close() {
            let _ = fs::remove_file(&seg.tmp_path);
            let e = SinkError::parquet(&seg.tmp_path, e);
            seg.keep_log();
            self.parquet_failed(e);
            return Ok(());
        }
        if let Err(e) = rename_new(&seg.tmp_path, &seg.final_path) {
            // Something is where the file goes (not ours to replace): the log keeps
            // the rows.
            let _ = fs::remove_file(&seg.tmp_path);
            let e = SinkError::io(&seg.final_path, e);
            seg.keep_log();
            self.parquet_failed(e);
            return Ok(());
        }
        drop(seg.wal);
        fs::remove_file(&seg.wal_path).map_err(|e| SinkError::io(&seg.wal_path, e))
    }

    /// Writes everything pending and closes the segment.
    pub fn close(&mut self) -> Result<(), SinkError> {
        if self.failed.is_some() {
            return Ok(());
        }
        let r = self.cut().and_then(|()| self.roll());
        self.guard(r)
    }
}

/// How the writer was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// Normal exit (atexit).
    Exit,
    /// `_exit` (e.g. Python's `os._exit`).
    UnderscoreExit,
    /// `execve`, `execv`, `execvp` or `execvpe` in the process itself (not a fork
    /// child's).
    Exec,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Exit => "exit",
            EndReason::UnderscoreExit => "_exit",
            EndReason::Exec => "exec",
        }
    }
}

/// Shared between the hot path, the writer thread and the exit hooks.
#[derive(Debug, Default)]
pub struct WriterControl {
    stop: AtomicBool,
    /// How the process ended ([`EndReason`] as a number, 0: exit).
    reason: std::sync::atomic::AtomicU8,
    done: std::sync::Mutex<bool>,
    done_cv: std::sync::Condvar,
    /// Records the hot path could not enqueue (queue full or writer failed).
    pub dropped: AtomicU64,
    /// Set once the writer failed: the hot path stops producing.
    pub failed: AtomicBool,
    /// Set when the shim hit an internal error and stopped recording early.
    pub internal_error: AtomicBool,
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl WriterControl {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    /// Registers the writer thread so [`Self::request_stop`] can wake it.
    pub fn set_thread(&self, t: std::thread::Thread) {
        let _ = self.thread.set(t);
    }
    /// Wakes the writer early (e.g. the queue is filling up).
    pub fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
    /// Asks the writer to drain, close every file and stop; waits at most `timeout`.
    /// Returns whether it finished in time.
    pub fn stop_and_wait(&self, reason: EndReason, timeout: Duration) -> bool {
        self.reason.store(reason as u8, Ordering::Relaxed);
        self.stop.store(true, Ordering::Release);
        self.wake();
        let deadline = Instant::now() + timeout;
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            done = match self.done_cv.wait_timeout(done, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }
    fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
    /// Releases everybody waiting in [`Self::stop_and_wait`].
    pub fn mark_done(&self) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.done_cv.notify_all();
    }
}

/// Identity of the recording process, for file names and the `process` row.
#[derive(Clone, Debug)]
pub struct ProcessInfo {
    pub run_dir: PathBuf,
    /// File-name prefix, unique per process: `<host>-[r<rank>-]p<pid>-u<token>`.
    pub prefix: String,
    pub ctx: Ctx,
    pub row: ProcessRow,
}

/// File-name prefix for a process: `<host>-[r<rank>-]p<pid>-u<token>`. The host name
/// and pid alone do not tell processes apart: containers sharing the host's network
/// share its name, and each has its own pids (the training process is often pid 1).
/// `token` ([`process_token`]) does.
pub fn file_prefix(host: &str, rank_env: Option<i32>, pid: i32, token: &str) -> String {
    let host = file_host(host);
    match rank_env {
        Some(r) => format!("{host}-r{r}-p{pid}-u{token}"),
        None => format!("{host}-p{pid}-u{token}"),
    }
}

/// A host name as file names spell it.
pub fn file_host(host: &str) -> String {
    host.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Eight hex digits drawn for one process's file names: from the kernel's random
/// source (`/proc/sys/kernel/random/uuid`), else mixed from the clock, the pid and the
/// stack's address.
pub fn process_token() -> String {
    if let Ok(u) = std::fs::read_to_string("/proc/sys/kernel/random/uuid") {
        let hex: String = u.chars().filter(char::is_ascii_hexdigit).take(8).collect();
        if hex.len() == 8 {
            return hex.to_ascii_lowercase();
        }
    }
    let here = 0u8;
    let h = crate::hash::StableHasher::new()
        .i64(crate::clock::now_ns())
        .u64(u64::from(std::process::id()))
        .u64(std::ptr::addr_of!(here) as usize as u64)
        .finish();
    format!("{:08x}", h as u32)
}

/// What the shim's CUPTI side reports in the `process` row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuStatus {
    /// `on`, `off: <why>` or `stopped: <why>` (see the `process.cupti` column).
    pub cupti: String,
    pub lib: Option<String>,
    pub version: Option<u32>,
    pub clock: Option<String>,
    pub clock_offset_ns: Option<i64>,
    pub dropped: Option<u64>,
    /// Per-op timing with GPU stamps; `None` from sources without it.
    pub timing: Option<TimingStatus>,
}

/// What per-op CUDA-event timing did (the `process.gpu_timing` columns); counts are
/// `None` while it is off.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimingStatus {
    pub state: String,
    /// Timing ran; the writer counts what it did per call from the ops rows.
    pub on: bool,
    pub errors: Option<u64>,
    /// Flights the timer gave up on (each is also an op row without times, which
    /// is what `process.ops_timing_lost` counts).
    pub lost: Option<u64>,
    pub clock_error_ns: Option<i64>,
    pub drift_ns_per_s: Option<i64>,
}

/// The shim's CUPTI side as the writer sees it (implemented over libcupti in the
/// shim; by synthetic sources in tests).
pub trait GpuSource: Send {
    /// Moves what CUPTI delivered since the last call into `out`; with `flush`, first
    /// asks CUPTI to hand over its completed buffers.
    fn poll(&mut self, flush: bool, out: &mut Vec<GpuItem>);
    /// At the end: a forced flush, then everything left.
    fn finish(&mut self, out: &mut Vec<GpuItem>);
    /// Whether capture was running at `t_ns` (CLOCK_REALTIME), i.e. whether an op
    /// called then is held for its GPU side; otherwise its GPU columns are NULL.
    fn captured(&self, t_ns: i64) -> bool;
    fn status(&self) -> GpuStatus;
    /// With `ZCTA_SAMPLE`: what runs from now on ([`crate::sample::Detail`]; the shim
    /// switches the marking of NCCL calls, CUPTI's activity kinds and NCCL's event
    /// mask). Sources that cannot switch anything ignore it.
    fn set_detail(&mut self, _detail: Detail) {}
    /// With `ZCTA_SAMPLE`: NCCL calls marked in a window that have not returned yet.
    fn marked_in_flight(&self) -> usize {
        0
    }
}

/// How often CUPTI is asked to flush while a sampling window drains.
const DRAIN_FLUSH_EVERY: Duration = Duration::from_millis(10);

/// How GPU data is joined (see [`crate::gpu`]).
#[derive(Clone, Copy, Debug)]
pub struct GpuPolicy {
    /// How long an op waits for its GPU side before its row is written.
    pub hold: Duration,
    /// How often CUPTI is asked to flush (keep ≤ 1 s: the 2-second durability bound).
    pub flush_every: Duration,
    /// `ZCTA_SAMPLE`: detail only in windows ([`crate::sample`]); `None`: every op.
    pub sampling: Option<Sampling>,
}

impl Default for GpuPolicy {
    fn default() -> Self {
        Self {
            hold: Duration::from_millis(1000),
            flush_every: Duration::from_millis(500),
            sampling: None,
        }
    }
}

struct GpuPipe {
    src: Box<dyn GpuSource>,
    policy: GpuPolicy,
    attrib: Attributor,
    sampler: Option<Sampler>,
    last_flush: Instant,
    items: Vec<GpuItem>,
    rows: Vec<GpuRow>,
    ops: Vec<OpRow>,
}

/// Owns every table writer of the process.
pub struct Writer {
    info: ProcessInfo,
    ops: DatasetWriter<OpsTable>,
    gpu: DatasetWriter<GpuTable>,
    gpu_pipe: Option<GpuPipe>,
    calls: DatasetWriter<CallsTable>,
    comms: DatasetWriter<CommsTable>,
    nccl_ops: DatasetWriter<NcclOpsTable>,
    proxy: DatasetWriter<ProxyTable>,
    nccl_comms: DatasetWriter<NcclCommsTable>,
    /// Set by the shim: communicators for which NCCL initialised its plugin.
    pub plugin_comms: Arc<AtomicU64>,
    /// The profiler API version of the last `nccl_comms` row (0: none yet).
    profiler_abi: u8,
    /// The `process` row's log, kept open (and locked) until the final row is written.
    process_wal: Option<(PathBuf, StreamWriter<BufWriter<OwnFile>>)>,
    error: Option<String>,
    /// What the timing did per launching call, counted from the op rows received.
    timing_calls: TimingCalls,
    reserve: Option<ReserveFn>,
    room: Option<RoomFn>,
    /// When to look at the room left next ([`Writer::tick`]).
    room_check_at: Option<Instant>,
}

/// Launching calls (an ungrouped op, or a group: its ops share the outcome) by how
/// their timing went, counted from the rows the writer receives, so the process row
/// agrees with the ops rows (a call in flight at exit has neither).
#[derive(Default)]
struct TimingCalls {
    timed: u64,
    pool_empty: u64,
    captured: u64,
    /// Groups already counted (their ops may interleave with other threads' rows).
    recent_groups: std::collections::VecDeque<u64>,
}

impl TimingCalls {
    const GROUPS_KEPT: usize = 256;

    fn count(&mut self, r: &crate::record::OpRecord) {
        // Only these outcomes are counted: an op with another (most of them, under
        // the budget) is passed over before the group check, which scans the groups
        // kept.
        let counter = match r.timing.timing {
            Timing::Timed(_) => &mut self.timed,
            Timing::PoolEmpty => &mut self.pool_empty,
            Timing::Captured => &mut self.captured,
            _ => return,
        };
        if let Some(g) = r.group_id {
            if self.recent_groups.contains(&g) {
                return;
            }
            if self.recent_groups.len() == Self::GROUPS_KEPT {
                self.recent_groups.pop_front();
            }
            self.recent_groups.push_back(g);
        }
        *counter += 1;
    }
}

impl Writer {
    pub fn new(info: ProcessInfo, policy: SinkPolicy) -> Self {
        Self {
            ops: DatasetWriter::new(&info.run_dir, &info.prefix, policy).with_reserve(OPS_RESERVE),
            gpu: DatasetWriter::new(&info.run_dir, &info.prefix, policy),
            gpu_pipe: None,
            calls: DatasetWriter::new(&info.run_dir, &info.prefix, policy),
            comms: DatasetWriter::new(&info.run_dir, &info.prefix, policy),
            nccl_ops: DatasetWriter::new(&info.run_dir, &info.prefix, policy),
            proxy: DatasetWriter::new(&info.run_dir, &info.prefix, policy),
            nccl_comms: DatasetWriter::new(&info.run_dir, &info.prefix, policy),
            plugin_comms: Arc::new(AtomicU64::new(0)),
            profiler_abi: 0,
            info,
            process_wal: None,
            error: None,
            timing_calls: TimingCalls::default(),
            reserve: policy.reserve,
            room: policy.room,
            room_check_at: None,
        }
    }

    fn process_final_path(&self) -> PathBuf {
        process_file(&self.info.run_dir, &self.info.prefix)
    }

    /// Logs the `process` row (end_reason "running") so a killed process still
    /// leaves one after recovery.
    pub fn start(&mut self) -> Result<(), SinkError> {
        let final_path = self.process_final_path();
        let dir = final_path.parent().expect("has parent").to_owned();
        make_dirs(&dir).map_err(|e| SinkError::io(&dir, e))?;
        let wal_path = wal_path_for(&final_path);
        let mut row = self.info.row.clone();
        row.end_reason = "running".into();
        row.end_ns = None;
        let batch = process_batch(&row, &self.info.ctx).map_err(|e| SinkError::arrow(&wal_path, e))?;
        let mut f = OwnFile::create(&wal_path).map_err(|e| SinkError::io(&wal_path, e))?;
        f.lock();
        let mut w = StreamWriter::try_new(BufWriter::new(f), &ProcessTable::schema())
            .map_err(|e| SinkError::arrow(&wal_path, e))?;
        w.write(&batch).map_err(|e| SinkError::arrow(&wal_path, e))?;
        w.flush().map_err(|e| SinkError::arrow(&wal_path, e))?;
        // Room for the final row, should the disk be full at the end: a few rows of
        // the size the first one took.
        if let Some(reserve) = self.reserve
            && let Some(f) = w.get_ref().get_ref().file()
            && let Ok(m) = f.metadata()
        {
            let want = (PROCESS_RESERVE_ROWS * m.len()).max(MIN_RESERVE);
            claim(reserve, self.room, f, 0, want);
        }
        self.process_wal = Some((wal_path, w));
        // The ops log is opened next, before any other table's, and claims its disk.
        if self.reserve.is_some() {
            self.ops.open_now()?;
        }
        Ok(())
    }

    /// Attaches the CUPTI side: from now on ops are held for their GPU data while
    /// `src` is active.
    pub fn set_gpu_source(&mut self, src: Box<dyn GpuSource>, policy: GpuPolicy) {
        let attrib = Attributor::new(policy.hold.as_nanos() as i64);
        // In the row logged at start too, so a killed process's run still says so.
        self.info.row.gpu_sampling = policy.sampling.map(|s| s.describe());
        self.gpu_pipe = Some(GpuPipe {
            src,
            policy,
            attrib: match policy.sampling {
                Some(_) => attrib.with_sampling(),
                None => attrib,
            },
            sampler: policy.sampling.map(|s| Sampler::new(s, policy.hold)),
            last_flush: Instant::now(),
            items: Vec::new(),
            rows: Vec::new(),
            ops: Vec::new(),
        });
    }

    #[inline]
    pub fn handle(&mut self, ev: &Event) -> Result<(), SinkError> {
        let ctx = &self.info.ctx;
        match ev {
            Event::Op(r) => {
                let r = &r.record().with_bytes();
                self.timing_calls.count(r);
                match &mut self.gpu_pipe {
                    Some(p)
                        if matches!(r.timing.timing, Timing::Timed(_)) || p.src.captured(r.api_start_ns) =>
                    {
                        p.attrib.hold(*r, crate::clock::now_ns());
                        Ok(())
                    }
                    Some(p) => {
                        if r.timing.timing == Timing::Captured {
                            p.attrib.stats.ops_graph_captured += 1;
                        }
                        self.ops.append(&OpRow { rec: *r, gpu: None }, ctx)
                    }
                    None => self.ops.append(&OpRow { rec: *r, gpu: None }, ctx),
                }
            }
            Event::Call(r) => {
                // Both rows are handed on, whatever the first's outcome.
                let start = r.opening_row().map_or(Ok(()), |s| self.calls.append(&s, ctx));
                let end = self.calls.append(r, ctx);
                start.and(end)
            }
            Event::Comm(r) => self.comms.append(r, ctx),
        }
    }

    #[inline]
    pub fn handle_plugin(&mut self, ev: &PluginEvent) -> Result<(), SinkError> {
        let ctx = &self.info.ctx;
        match ev {
            PluginEvent::NcclOp(r) => self.nccl_ops.append(r, ctx),
            PluginEvent::Proxy(r) => self.proxy.append(r, ctx),
            PluginEvent::NcclComm(r) => {
                if r.abi != 0 {
                    self.profiler_abi = r.abi;
                }
                self.nccl_comms.append(r, ctx)
            }
        }
    }

    /// Takes what CUPTI delivered, joins it to held ops, and writes the `gpu` rows and
    /// the ops whose hold is over (every held op with `last`).
    pub fn pump_gpu(&mut self, now: Instant, last: bool) -> Result<(), SinkError> {
        let Some(p) = &mut self.gpu_pipe else {
            return Ok(());
        };
        // Read before the notes are drained: a marked call that returns meanwhile has
        // pushed its launch notes first, so they are drained below and counted in
        // `pending`; read after, its launch would be counted nowhere.
        let in_flight = p.src.marked_in_flight();
        if last {
            p.src.finish(&mut p.items);
        } else {
            // While a sampling window drains, flush often: it ends once the window's
            // launches have their GPU records.
            let draining = p.sampler.as_ref().is_some_and(|s| s.state() == Detail::Draining);
            let since = now.duration_since(p.last_flush);
            let flush = since >= p.policy.flush_every || (draining && since >= DRAIN_FLUSH_EVERY);
            if flush {
                p.last_flush = now;
            }
            p.src.poll(flush, &mut p.items);
        }
        let t = crate::clock::now_ns();
        for it in p.items.drain(..) {
            p.attrib.item(it, t, &mut p.rows);
        }
        let grace = if last { 0 } else { p.policy.hold.as_nanos() as i64 };
        p.attrib.settle(t, grace, &mut p.rows);
        if let Some(s) = &mut p.sampler
            && !last
            && let Some(d) = s.step(t, p.attrib.pending(t) + in_flight)
        {
            p.src.set_detail(d);
        }
        p.attrib.release(t, last, &mut p.ops);
        let ctx = &self.info.ctx;
        // Every row is handed on: a table that fails counts the rows it cannot write.
        let mut res = Ok(());
        for r in p.rows.drain(..) {
            if let Err(e) = self.gpu.append(&r, ctx) {
                res = res.and(Err(e));
            }
        }
        for o in p.ops.drain(..) {
            if let Err(e) = self.ops.append(&o, ctx) {
                res = res.and(Err(e));
            }
        }
        res
    }

    /// Every table's log first (durability), then the Parquet encoding and rolls, so
    /// no table's log waits behind another table's compression or file system calls.
    /// A table that fails stops alone ([`DatasetWriter`]); the first error is returned
    /// after every table had its turn.
    pub fn tick(&mut self, now: Instant) -> Result<(), SinkError> {
        self.give_back_claims_if_low(now);
        let mut first = None;
        for t in self.datasets() {
            if let Err(e) = t.tick_log(now) {
                first.get_or_insert(e);
            }
        }
        for t in self.datasets() {
            if let Err(e) = t.tick_encode(now) {
                first.get_or_insert(e);
            }
            if let Some(e) = t.take_notice() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// While the `ops` log holds more than [`LOW_CLAIM`] claimed and unwritten: looks
    /// at the room left as often as the room beyond [`CLAIM_FLOOR`] could fill at
    /// [`FILL_RATE`] (every 100 ms to 10 s), and once it is under the floor gives the
    /// claim back down to [`LOW_CLAIM`], so that the program, not zcta, gets the room.
    fn give_back_claims_if_low(&mut self, now: Instant) {
        if !self.ops.holds_big_claim() || self.room_check_at.is_some_and(|t| now < t) {
            return;
        }
        let free = self.ops.give_back_if_low();
        self.room_check_at = Some(now + next_room_check(free));
    }

    /// Whether the `ops` table failed (then recording stops).
    pub fn ops_failed(&self) -> bool {
        self.ops.failed().is_some()
    }

    /// Rows that reached no log, per table, and the tables whose rows wait in logs
    /// for `zcta recover`, as the `process.write_errors` note says them.
    fn losses(&mut self) -> (u64, Option<String>) {
        let mut lost = Vec::new();
        let mut kept = Vec::new();
        let mut total = 0;
        for t in self.datasets() {
            if t.lost() > 0 || t.failed() {
                lost.push(format!("{} {}", t.name(), t.lost()));
                total += t.lost();
            }
            if t.logs_kept() {
                kept.push(t.name());
            }
        }
        let mut note = Vec::new();
        if !lost.is_empty() {
            note.push(format!("rows not written: {}", lost.join(", ")));
        }
        if !kept.is_empty() {
            note.push(format!(
                "rows left in write-ahead logs for `zcta recover`: {}",
                kept.join(", ")
            ));
        }
        (total, (!note.is_empty()).then(|| note.join("; ")))
    }

    /// Closes every table and writes the final `process` row.
    /// Any write error makes `end_reason` `error`, and the rows it cost are counted in
    /// `records_dropped` (per table in `write_errors`).
    pub fn finish(&mut self, reason: &str, dropped: u64) -> Result<(), SinkError> {
        let mut first_err = self.pump_gpu(Instant::now(), true).err();
        for t in self.datasets() {
            if let Err(e) = t.close() {
                first_err.get_or_insert(e);
            }
            if let Some(e) = t.take_notice() {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            self.note_error(&e);
        }
        let (lost, note) = self.losses();
        if let Some(note) = note {
            let first = self.error.take().unwrap_or_default();
            self.error = Some(if first.is_empty() {
                note
            } else {
                format!("{first}; {note}")
            });
        }
        let reason = if self.error.is_some() { "error" } else { reason };
        self.write_process_row(reason, dropped + lost)
    }

    fn note_error(&mut self, e: &SinkError) {
        if self.error.is_none() {
            self.error = Some(e.to_string());
        }
    }

    fn write_process_row(&mut self, reason: &str, dropped: u64) -> Result<(), SinkError> {
        let mut row = self.info.row.clone();
        row.end_ns = Some(crate::clock::now_ns());
        row.end_reason = reason.into();
        row.ops_rows = self.ops.rows();
        row.calls_rows = self.calls.rows();
        row.comms_rows = self.comms.rows();
        row.plugin_comms = self.plugin_comms.load(Ordering::Relaxed);
        row.profiler_abi = crate::nccl::profiler_abi_name(self.profiler_abi).map(str::to_owned);
        row.records_dropped = Some(dropped);
        row.write_errors = self.error.clone();
        if let Some(p) = &self.gpu_pipe {
            let st = p.src.status();
            row.cupti = st.cupti;
            row.cupti_lib = st.lib;
            row.cupti_version = st.version;
            row.gpu_clock = st.clock;
            row.gpu_clock_offset_ns = st.clock_offset_ns;
            row.cupti_dropped = st.dropped;
            let s = p.attrib.stats;
            if row.cupti.starts_with("on") || row.cupti.starts_with("stopped") {
                row.gpu_rows = Some(s.gpu_rows);
                row.gpu_foreign = Some(s.foreign);
                row.ops_without_gpu = Some(s.ops_without_gpu);
                row.ops_unsampled = Some(s.ops_unsampled);
                row.ops_graph_captured = Some(s.ops_graph_captured);
                row.gpu_inconsistent = Some(s.inconsistent);
            }
            if let Some(t) = st.timing {
                if t.state.starts_with("on") {
                    row.ops_graph_captured = Some(s.ops_graph_captured);
                    // Every call the timer gave up on is a row without times, counted
                    // there (t.lost too would count it twice).
                    row.ops_timing_lost = Some(s.ops_timing_lost);
                }
                row.gpu_timing = Some(t.state);
                let on = t.on;
                let c = &self.timing_calls;
                row.ops_timed = on.then_some(c.timed);
                row.timing_captured = on.then_some(c.captured);
                row.timing_pool_empty = on.then_some(c.pool_empty);
                row.timing_errors = t.errors;
                row.gpu_clock_error_ns = t.clock_error_ns;
                row.gpu_clock_drift_ns_per_s = t.drift_ns_per_s;
            }
        }
        if let Err(e) = write_process_file(&self.info.run_dir, &self.info.prefix, &row, &self.info.ctx) {
            // No room for the file: the final row goes into the row's log, into the
            // disk it claimed at the start; `zcta recover` takes it from there. What
            // the row did not use of that claim is given back (the log stays behind,
            // and would keep a full disk full for the recovery).
            if let Some((_, log)) = &mut self.process_wal {
                if let Ok(batch) = process_batch(&row, &self.info.ctx) {
                    let _ = log.write(&batch).and_then(|()| log.flush());
                }
                if let Some(f) = log.get_ref().get_ref().file() {
                    give_back_claim(f);
                }
            }
            return Err(e);
        }
        if let Some((wal, log)) = self.process_wal.take() {
            drop(log);
            fs::remove_file(&wal).map_err(|e| SinkError::io(&wal, e))?;
        }
        Ok(())
    }
}

/// The table writers, type-erased for the operations all of them share.
trait Dataset {
    fn tick_log(&mut self, now: Instant) -> Result<(), SinkError>;
    fn tick_encode(&mut self, now: Instant) -> Result<(), SinkError>;
    fn close(&mut self) -> Result<(), SinkError>;
    fn take_notice(&mut self) -> Option<SinkError>;
    fn name(&self) -> &'static str;
    fn lost(&self) -> u64;
    fn failed(&self) -> bool;
    fn logs_kept(&self) -> bool;
}

impl<T: Table> Dataset for DatasetWriter<T> {
    fn take_notice(&mut self) -> Option<SinkError> {
        DatasetWriter::take_notice(self)
    }
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn lost(&self) -> u64 {
        self.lost
    }
    fn failed(&self) -> bool {
        self.failed.is_some()
    }
    fn logs_kept(&self) -> bool {
        self.logs_kept
    }
    fn tick_log(&mut self, now: Instant) -> Result<(), SinkError> {
        DatasetWriter::tick_log(self, now)
    }
    fn tick_encode(&mut self, now: Instant) -> Result<(), SinkError> {
        DatasetWriter::tick_encode(self, now)
    }
    fn close(&mut self) -> Result<(), SinkError> {
        DatasetWriter::close(self)
    }
}

impl Writer {
    fn datasets(&mut self) -> [&mut dyn Dataset; 7] {
        [
            &mut self.ops,
            &mut self.gpu,
            &mut self.calls,
            &mut self.comms,
            &mut self.nccl_ops,
            &mut self.proxy,
            &mut self.nccl_comms,
        ]
    }
}

/// `run_dir/process/<prefix>.parquet`: the final file of a process's `process` row.
pub fn process_file(run_dir: &Path, prefix: &str) -> PathBuf {
    run_dir.join(ProcessTable::NAME).join(format!("{prefix}.parquet"))
}

/// Writes a process's final `process` row (creating the table's directory).
pub fn write_process_file(
    run_dir: &Path,
    prefix: &str,
    row: &ProcessRow,
    ctx: &Ctx,
) -> Result<(), SinkError> {
    let path = process_file(run_dir, prefix);
    let dir = path.parent().expect("has parent");
    make_dirs(dir).map_err(|e| SinkError::io(dir, e))?;
    let batch = process_batch(row, ctx).map_err(|e| SinkError::arrow(&path, e))?;
    write_parquet_file::<ProcessTable>(&path, &[batch])
}

fn process_batch(row: &ProcessRow, ctx: &Ctx) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let mut b = <ProcessTable as Table>::Builder::default();
    b.append(row, ctx);
    b.finish(&ProcessTable::schema())
}

/// How long the writer sleeps when the queue is empty. Producers do not wake it for
/// each record (a wake-up would put a futex syscall on the NCCL hot path); it polls,
/// and is woken only when the queue is half full.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Where the writer takes records from: the shim's record queue or, in tests, any
/// channel. `next` never blocks.
pub trait RecordSource<T> {
    /// The oldest record, if one is ready.
    fn next(&self) -> Option<T>;
    /// Whether no record is queued (a snapshot).
    fn is_empty(&self) -> bool;
    /// Housekeeping once per writer round (the shim's queue maps in the memory of
    /// the slots its producers write next).
    fn maintain(&self) {}
}

impl<T> RecordSource<T> for crossbeam_channel::Receiver<T> {
    fn next(&self) -> Option<T> {
        self.try_recv().ok()
    }
    fn is_empty(&self) -> bool {
        crossbeam_channel::Receiver::is_empty(self)
    }
}

/// The writer thread's body: drains `rx` until asked to stop, then closes everything.
/// Never panics on I/O errors: it reports the first one on stderr (with the path),
/// marks `ctl.failed` so producers stop, and keeps draining so nobody blocks.
pub fn run_writer(
    rx: impl RecordSource<Event>,
    prx: impl RecordSource<PluginEvent>,
    mut writer: Writer,
    ctl: Arc<WriterControl>,
) {
    let mut failed = match writer.start() {
        Ok(()) => false,
        Err(e) => {
            report_failure(&ctl, &e);
            true
        }
    };
    loop {
        rx.maintain();
        prx.maintain();
        let stopping = ctl.stop_requested();
        // A bounded batch from each queue, so tick() runs under sustained load.
        let limit = if stopping { usize::MAX } else { 65536 };
        let n = drain(&rx, limit, &mut failed, &mut writer, &ctl, Writer::handle)
            + drain(&prx, limit, &mut failed, &mut writer, &ctl, Writer::handle_plugin);
        if !failed && let Err(e) = writer.pump_gpu(Instant::now(), false) {
            write_error(&mut writer, &ctl, &e, &mut failed);
        }
        if !failed && let Err(e) = writer.tick(Instant::now()) {
            write_error(&mut writer, &ctl, &e, &mut failed);
        }
        if stopping && rx.is_empty() && prx.is_empty() {
            break;
        }
        if n == 0 {
            std::thread::park_timeout(POLL_INTERVAL);
        }
    }
    let reason = match ctl.reason.load(Ordering::Relaxed) {
        r if r == EndReason::UnderscoreExit as u8 => EndReason::UnderscoreExit,
        r if r == EndReason::Exec as u8 => EndReason::Exec,
        _ => EndReason::Exit,
    }
    .as_str();
    let internal = ctl.internal_error.load(Ordering::Relaxed);
    if internal {
        writer
            .error
            .get_or_insert_with(|| "internal error in the shim: recording stopped early".into());
    }
    let reason = if failed || internal { "error" } else { reason };
    if let Err(e) = writer.finish(reason, ctl.dropped.load(Ordering::Relaxed))
        && !failed
    {
        report_failure(&ctl, &e);
    }
    ctl.mark_done();
}

/// Hands up to `limit` queued records to the writer; once it has failed, counts them
/// as dropped instead. Returns how many were taken off the queue.
fn drain<T>(
    rx: &impl RecordSource<T>,
    limit: usize,
    failed: &mut bool,
    writer: &mut Writer,
    ctl: &WriterControl,
    handle: fn(&mut Writer, &T) -> Result<(), SinkError>,
) -> usize {
    let mut n = 0usize;
    while n < limit {
        let Some(ev) = rx.next() else { break };
        n += 1;
        if *failed {
            ctl.dropped.fetch_add(1, Ordering::Relaxed);
        } else if let Err(e) = handle(writer, &ev) {
            write_error(writer, ctl, &e, failed);
        }
    }
    n
}

/// A table could not be written: noted for the `process` row. Only the `ops` table's
/// failure stops recording; another table stops alone (its rows are counted).
fn write_error(writer: &mut Writer, ctl: &WriterControl, e: &SinkError, failed: &mut bool) {
    writer.note_error(e);
    if writer.ops_failed() {
        report_failure(ctl, e);
        *failed = true;
    } else if !ctl.failed.load(Ordering::Relaxed) {
        crate::warn(format_args!(
            "cannot write {e}; recording goes on (process.write_errors says what was not written)"
        ));
    }
}

fn report_failure(ctl: &WriterControl, e: &SinkError) {
    if !ctl.failed.swap(true, Ordering::AcqRel) {
        crate::warn(format_args!(
            "cannot write {e}; recording stopped, the program continues unchanged"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_come_out_of_room_beyond_the_floor_and_a_little_below_it() {
        fn granted(_: &File, _: u64, _: u64) -> bool {
            true
        }
        fn a_mib_beyond(_: &File) -> Option<u64> {
            Some(CLAIM_FLOOR + (1 << 20))
        }
        fn under(_: &File) -> Option<u64> {
            Some(CLAIM_FLOOR - 1)
        }
        fn two_mib(_: &File) -> Option<u64> {
            Some(2 << 20)
        }
        fn half_a_mib(_: &File) -> Option<u64> {
            Some(512 << 10)
        }
        fn unknown(_: &File) -> Option<u64> {
            None
        }
        let f = File::open("/dev/null").unwrap();
        let want = 8 << 20;
        assert_eq!(claim(granted, Some(a_mib_beyond), &f, 0, want), 1 << 20);
        assert_eq!(claim(granted, Some(under), &f, 0, want), LOW_CLAIM);
        // A sixteenth of what is free, halved to what the claim's steps allow.
        assert_eq!(claim(granted, Some(two_mib), &f, 0, want), 128 << 10);
        assert_eq!(claim(granted, Some(half_a_mib), &f, 0, want), 0);
        assert_eq!(claim(granted, Some(unknown), &f, 0, want), want);
        assert_eq!(claim(granted, None, &f, 0, want), want);
        // Looked at as often as the room beyond the floor could fill.
        assert_eq!(next_room_check(Some(CLAIM_FLOOR)), ROOM_CHECK_MIN);
        assert_eq!(
            next_room_check(Some(CLAIM_FLOOR + (16 << 30))),
            Duration::from_secs(2)
        );
        assert_eq!(next_room_check(Some(u64::MAX)), ROOM_CHECK_MAX);
        assert_eq!(next_room_check(None), ROOM_CHECK_MAX);
    }

    #[test]
    fn stems() {
        assert_eq!(
            pid_of_stem("gpu-node-1-r3-p1234-00002"),
            Some(("gpu-node-1".into(), 1234))
        );
        assert_eq!(pid_of_stem("h-p77"), Some(("h".into(), 77)));
        assert_eq!(
            pid_of_stem("gpu-node-1-r3-p1-u0a1b2c3d-00002"),
            Some(("gpu-node-1".into(), 1))
        );
        assert_eq!(pid_of_stem("h-p1-u12345678"), Some(("h".into(), 1)));
        assert_eq!(pid_of_stem("nothing"), None);
    }
}
