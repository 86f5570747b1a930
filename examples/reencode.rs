//! Rewrites one table of a run directory with zcta's Parquet settings for that table
//! (`zcta::sink::writer_properties`) and prints bytes per row before and after: how an
//! encoding change would size real data, e.g. a run copied back from a GPU machine.
//!
//! `cargo run --release --example reencode -- RUN_DIR TABLE` (TABLE: ops, gpu, calls,
//! nccl_ops, proxy). The run directory is only read.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use zcta::tables::{CallsTable, GpuTable, NcclOpsTable, OpsTable, ProxyTable, Table};

fn files(run: &Path, table: &str) -> Result<Vec<PathBuf>> {
    let dir = run.join(table);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    v.sort();
    if v.is_empty() {
        bail!("no Parquet files in {}", dir.display());
    }
    Ok(v)
}

/// Bytes and rows of the files as they are, and of all their rows written again in
/// one file with `T`'s settings.
fn reencode<T: Table>(files: &[PathBuf]) -> Result<(u64, u64, u64)> {
    let (mut before, mut rows) = (0u64, 0u64);
    let out = tempfile_path()?;
    let mut writer: Option<ArrowWriter<File>> = None;
    for f in files {
        before += std::fs::metadata(f)?.len();
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(f)?)?.build()?;
        for batch in reader {
            let batch = batch.with_context(|| format!("decoding {}", f.display()))?;
            rows += batch.num_rows() as u64;
            if writer.is_none() {
                let props = zcta::sink::writer_properties::<T>(256 * 1024);
                writer = Some(ArrowWriter::try_new(
                    File::create(&out)?,
                    batch.schema(),
                    Some(props),
                )?);
            }
            writer.as_mut().unwrap().write(&batch)?;
        }
    }
    let after = match writer {
        Some(w) => {
            w.close()?;
            std::fs::metadata(&out)?.len()
        }
        None => 0,
    };
    let _ = std::fs::remove_file(&out);
    Ok((before, after, rows))
}

fn tempfile_path() -> Result<PathBuf> {
    let p = std::env::temp_dir().join(format!("zcta-reencode-{}.parquet", std::process::id()));
    Ok(p)
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
    let fs = files(Path::new(run), table)?;
    let (before, after, rows) = f(&fs)?;
    if rows == 0 {
        bail!("no rows in {run}/{table}");
    }
    println!(
        "{table}: {rows} rows in {} files; as written {before} bytes ({:.1} B/row); \
         again in one file with today's settings {after} bytes ({:.1} B/row)",
        fs.len(),
        before as f64 / rows as f64,
        after as f64 / rows as f64
    );
    Ok(())
}
