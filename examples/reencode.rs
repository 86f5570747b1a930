//! Rewrites one table of a run directory with zcta's Parquet settings for that table
//! (`zcta::sink::write_parquet_file`, as `zcta phases` writes its table) into one
//! temporary file and prints bytes per row: how an encoding change sizes real data,
//! e.g. a run copied back from a GPU machine. Build it once at each setting and compare
//! the "again in one file" figures; the "as written" figure also counts the run's file
//! count and footers. The table's rows are held in memory while it is written.
//!
//! `cargo run --release --example reencode -- RUN_DIR TABLE` (TABLE: ops, gpu, calls,
//! nccl_ops, proxy). The run directory is only read; files are read as `zcta` reads
//! them (aligned to today's schema; a corrupt file is an error naming it).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use zcta::tables::{CallsTable, GpuTable, NcclOpsTable, OpsTable, ProxyTable, Table};

/// Bytes of the files as written, bytes of all their rows written again in one file
/// with `T`'s settings, and the rows.
fn reencode<T: Table>(files: &[PathBuf]) -> Result<(u64, u64, u64)> {
    let schema = T::schema();
    let (mut before, mut batches) = (0u64, Vec::new());
    for f in files {
        before += std::fs::metadata(f)
            .with_context(|| format!("reading {}", f.display()))?
            .len();
        batches.extend(
            zcta::reader::read_file(f, &schema).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?,
        );
    }
    let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
    let out = tempfile::tempdir().context("creating a temporary directory")?;
    let path = out.path().join(format!("{}.parquet", T::NAME));
    zcta::sink::write_parquet_file::<T>(&path, &batches)?;
    let after = std::fs::metadata(&path)?.len();
    Ok((before, after, rows))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [run, table] = args.as_slice() else {
        bail!("usage: reencode RUN_DIR TABLE (ops, gpu, calls, nccl_ops, proxy)");
    };
    type Reencode = fn(&[PathBuf]) -> Result<(u64, u64, u64)>;
    let f: Reencode = match table.as_str() {
        "ops" => reencode::<OpsTable>,
        "gpu" => reencode::<GpuTable>,
        "calls" => reencode::<CallsTable>,
        "nccl_ops" => reencode::<NcclOpsTable>,
        "proxy" => reencode::<ProxyTable>,
        other => bail!("unknown table {other} (ops, gpu, calls, nccl_ops, proxy)"),
    };
    let dir = Path::new(run);
    let (files, _logs) = zcta::reader::list_table(dir, table)
        .with_context(|| format!("reading {}", dir.join(table).display()))?;
    if files.is_empty() {
        bail!("no Parquet files in {}", dir.join(table).display());
    }
    let (before, after, rows) = f(&files)?;
    if rows == 0 {
        bail!("no rows in {}", dir.join(table).display());
    }
    println!(
        "{table}: {rows} rows in {} files; as written {before} bytes ({:.1} B/row); \
         again in one file with today's settings {after} bytes ({:.1} B/row)",
        files.len(),
        before as f64 / rows as f64,
        after as f64 / rows as f64
    );
    Ok(())
}
