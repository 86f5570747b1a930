//! Helpers shared by the shim integration tests (`mod common; mod support;`):
//! running a fixture scenario with or without the shim in a clean environment, and
//! reading a run's tables back as plain rows.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use arrow_array::{Array, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_array::{UInt32Array, UInt64Array};
use arrow_schema::DataType;
use tempfile::TempDir;

use crate::common;

/// A command with an empty environment except `PATH`: no launcher variable (RANK,
/// SLURM_*, TORCHELASTIC_*, PMIX_*), no `ZCTA_*`, no `FAKE_NCCL_*`, no
/// `GLUE_STATS_FILE` inherited from whoever runs the tests.
pub fn clean_cmd(program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env_clear();
    c.env(
        "PATH",
        std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
    );
    c.stdin(Stdio::null());
    c
}

/// `host ARGS...` without the shim.
pub fn host_plain(args: &[&str]) -> Command {
    let mut c = clean_cmd(&common::fixtures().host);
    c.args(args);
    c
}

/// Makes `cmd` run under the shim.
pub fn preload(cmd: &mut Command) -> &mut Command {
    cmd.env("LD_PRELOAD", common::shim_path())
}

/// A fresh output directory (`ZCTA_OUT`) and a run id.
pub struct Run {
    pub out: TempDir,
    pub id: String,
}

impl Run {
    pub fn new(id: &str) -> Run {
        Run {
            out: tempfile::Builder::new()
                .prefix("zcta-it-")
                .tempdir()
                .expect("temp dir"),
            id: id.to_string(),
        }
    }

    /// `ZCTA_OUT` (created by the test; the run directory below it is not).
    pub fn out_dir(&self) -> &Path {
        self.out.path()
    }

    /// `ZCTA_OUT/<run id>`.
    pub fn dir(&self) -> PathBuf {
        self.out.path().join(&self.id)
    }

    /// A scratch path outside `ZCTA_OUT` (id files, stats files).
    pub fn scratch(&self, name: &str) -> PathBuf {
        let d = self.out.path().join("scratch");
        std::fs::create_dir_all(&d).expect("scratch dir");
        d.join(name)
    }

    /// Sets `ZCTA_OUT`, `ZCTA_RUN_ID` and `LD_PRELOAD` on `cmd`.
    pub fn apply<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        preload(cmd)
            .env("ZCTA_OUT", self.out.path())
            .env("ZCTA_RUN_ID", &self.id)
    }

    /// `host ARGS...` under the shim, recording into this run.
    pub fn host(&self, args: &[&str]) -> Command {
        let mut c = host_plain(args);
        self.apply(&mut c);
        c
    }

    /// Runs `host ARGS...` under the shim and checks it succeeded with no stderr.
    pub fn run_ok(&self, args: &[&str]) -> Output {
        let out = self.host(args).output().expect("running host");
        assert_ok(&out, args);
        out
    }

    /// Every row of `table`, asserting that all files were read and no log is pending.
    pub fn rows(&self, table: &str) -> Vec<Row> {
        read_rows(&self.dir(), table)
    }
}

/// Asserts exit status 0 and an empty stderr.
pub fn assert_ok(out: &Output, what: &[&str]) {
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "host {what:?}: status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One cell.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Null,
    Int(i128),
    Str(String),
    Bool(bool),
}

/// One row, by column name.
#[derive(Clone, Debug, PartialEq)]
pub struct Row(pub BTreeMap<String, Val>);

impl Row {
    pub fn get(&self, col: &str) -> &Val {
        self.0
            .get(col)
            .unwrap_or_else(|| panic!("no column {col:?} in {:?}", self.0.keys().collect::<Vec<_>>()))
    }
    pub fn is_null(&self, col: &str) -> bool {
        *self.get(col) == Val::Null
    }
    pub fn int(&self, col: &str) -> Option<i128> {
        match self.get(col) {
            Val::Null => None,
            Val::Int(v) => Some(*v),
            v => panic!("column {col} is not an integer: {v:?}"),
        }
    }
    pub fn u64(&self, col: &str) -> Option<u64> {
        self.int(col).map(|v| u64::try_from(v).expect("u64"))
    }
    pub fn i64(&self, col: &str) -> Option<i64> {
        self.int(col).map(|v| i64::try_from(v).expect("i64"))
    }
    pub fn i32(&self, col: &str) -> Option<i32> {
        self.int(col).map(|v| i32::try_from(v).expect("i32"))
    }
    pub fn str(&self, col: &str) -> Option<&str> {
        match self.get(col) {
            Val::Null => None,
            Val::Str(s) => Some(s),
            v => panic!("column {col} is not a string: {v:?}"),
        }
    }
    /// A required integer column.
    pub fn req(&self, col: &str) -> i128 {
        self.int(col)
            .unwrap_or_else(|| panic!("column {col} is NULL in {self:?}"))
    }
    pub fn req_u64(&self, col: &str) -> u64 {
        u64::try_from(self.req(col)).expect("u64")
    }
    pub fn req_i64(&self, col: &str) -> i64 {
        i64::try_from(self.req(col)).expect("i64")
    }
    pub fn req_i32(&self, col: &str) -> i32 {
        i32::try_from(self.req(col)).expect("i32")
    }
    pub fn req_str(&self, col: &str) -> &str {
        self.str(col)
            .unwrap_or_else(|| panic!("column {col} is NULL in {self:?}"))
    }
}

/// Converts record batches into rows.
pub fn batches_to_rows(batches: &[RecordBatch]) -> Vec<Row> {
    let mut rows = Vec::new();
    for b in batches {
        let schema = b.schema();
        let mut out: Vec<BTreeMap<String, Val>> = vec![BTreeMap::new(); b.num_rows()];
        for (f, col) in schema.fields().iter().zip(b.columns()) {
            for (i, row) in out.iter_mut().enumerate() {
                let v = if col.is_null(i) {
                    Val::Null
                } else {
                    match f.data_type() {
                        DataType::Int32 => {
                            Val::Int(col.as_any().downcast_ref::<Int32Array>().unwrap().value(i).into())
                        }
                        DataType::Int64 => {
                            Val::Int(col.as_any().downcast_ref::<Int64Array>().unwrap().value(i).into())
                        }
                        DataType::UInt32 => Val::Int(
                            col.as_any()
                                .downcast_ref::<UInt32Array>()
                                .unwrap()
                                .value(i)
                                .into(),
                        ),
                        DataType::UInt64 => Val::Int(
                            col.as_any()
                                .downcast_ref::<UInt64Array>()
                                .unwrap()
                                .value(i)
                                .into(),
                        ),
                        DataType::Utf8 => Val::Str(
                            col.as_any()
                                .downcast_ref::<StringArray>()
                                .unwrap()
                                .value(i)
                                .to_string(),
                        ),
                        DataType::Boolean => {
                            Val::Bool(col.as_any().downcast_ref::<BooleanArray>().unwrap().value(i))
                        }
                        t => panic!("column {} has unexpected type {t}", f.name()),
                    }
                };
                row.insert(f.name().clone(), v);
            }
        }
        rows.extend(out.into_iter().map(Row));
    }
    rows
}

/// Reads `table` of `run_dir`, asserting nothing was skipped and no log is pending.
pub fn read_rows(run_dir: &Path, table: &str) -> Vec<Row> {
    let data = zcta::reader::read_table(run_dir, table)
        .unwrap_or_else(|e| panic!("reading {table} of {}: {e}", run_dir.display()));
    assert!(
        data.skipped.is_empty(),
        "{table}: skipped files {:?}",
        data.skipped
    );
    assert!(
        data.pending_logs.is_empty(),
        "{table}: pending logs {:?}",
        data.pending_logs
    );
    batches_to_rows(&data.batches)
}

/// Every file (not directory) under `dir`, relative to it, sorted.
pub fn list_files(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The 128 bytes of an id file written by [`common::write_unique_id`].
pub fn read_id(path: &Path) -> Vec<u8> {
    let id = std::fs::read(path).expect("id file");
    assert_eq!(id.len(), 128);
    id
}

/// comm_id the shim must give a communicator made from this unique id.
pub fn comm_id_of(id: &[u8]) -> u64 {
    zcta::hash::comm_id_from_unique_ids([id])
}

/// Rows of `rows` whose column `col` equals the string `v`.
pub fn with_str<'a>(rows: &'a [Row], col: &str, v: &str) -> Vec<&'a Row> {
    rows.iter().filter(|r| r.str(col) == Some(v)).collect()
}

/// Host name as the shim names files (`file_prefix` of the host, without the pid).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Lossy UTF-8 of captured output.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The file-name prefix the shim gave process `pid` of `run_dir`
/// (`<host>-[r<rank>-]p<pid>-u<8 hex digits>`), read from its `process` file; asserts
/// that form.
pub fn prefix_of(run_dir: &Path, rank: Option<i32>, pid: impl std::fmt::Display) -> String {
    let start = match rank {
        Some(r) => format!("{}-r{r}-p{pid}-u", host_name()),
        None => format!("{}-p{pid}-u", host_name()),
    };
    let found: Vec<String> = list_files(&run_dir.join("process"))
        .into_iter()
        .filter_map(|f| f.strip_suffix(".parquet").map(str::to_owned))
        .filter(|f| f.starts_with(&start))
        .collect();
    assert_eq!(found.len(), 1, "one process file {start}*: {found:?}");
    let token = &found[0][start.len()..];
    assert!(
        token.len() == 8 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{}",
        found[0]
    );
    found[0].clone()
}
