//! `zcta`: the command-line front end. Thin: all logic lives in the `zcta` library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use zcta::analysis::plural;
use zcta::analysis::summary::Summary;
use zcta::launch;
use zcta::reader;
use zcta::recover::{LogOutcome, recover_run};
use zcta::tables;

/// `println!` to stdout that returns a write error from the enclosing function
/// (`anyhow::Result`) instead of panicking: `zcta report RUN | head` closes the pipe
/// early, and [`main`] ends such a run quietly.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            return Err(anyhow::Error::new(e).context("cannot write to standard output"));
        }
    }};
}

/// `print!` likewise.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($t)*) {
            return Err(anyhow::Error::new(e).context("cannot write to standard output"));
        }
    }};
}

/// What `zcta --help` opens with: what the tool does for its user.
const ABOUT: &str = "zcta: where every NCCL operation's time goes. Record a program with \
`zcta run -- <command>` (or LD_PRELOAD=libzcta_prof.so), then read the run: `zcta report` \
(phases, bus bandwidth, data paths, findings), `zcta diff` of two runs, `zcta export \
--perfetto`, `zcta phases` for pandas/DuckDB; `zcta doctor` says which data path NCCL can \
take on this machine.";

#[derive(Parser, Debug)]
#[command(name = "zcta", version, about = ABOUT, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Turn the write-ahead logs left by killed processes into Parquet files.
    Recover {
        /// Run directory (e.g. zcta-runs/<run id>).
        run: PathBuf,
        /// Also recover logs of processes that still seem to run on this host.
        #[arg(long)]
        force: bool,
    },
    /// Rows per table, rank and operation; files skipped and logs pending.
    Summary {
        /// Run directory.
        run: PathBuf,
    },
    /// Where the time went: per (op, message size, engine) the phase shares, latency
    /// percentiles and bus bandwidth; the path mix; findings with evidence and fix.
    Report {
        /// Run directory.
        run: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        /// Per-direction link bandwidth busbw is compared with, GB/s, from 0.001 to
        /// 1000000 (default: NVLink 4, 18 links × 25 GB/s).
        #[arg(long, default_value_t = 450.0, value_parser = link_peak, allow_negative_numbers = true)]
        link_peak_gbps: f64,
    },
    /// What changed from run A to run B: per (op, size) the change of the median
    /// end-to-end time and of each phase, with a 95 % bootstrap interval, sorted by
    /// impact; data-path changes called out.
    Diff {
        /// Baseline run directory.
        run_a: PathBuf,
        /// Run directory compared with it.
        run_b: PathBuf,
        /// Output format (csv is not offered: the rows are nested).
        #[arg(long, value_enum, default_value_t = DiffFormat::Table)]
        format: DiffFormat,
    },
    /// Write a trace for ui.perfetto.dev / chrome://tracing: one process per rank,
    /// tracks for NCCL API calls, GPU work per stream and proxy steps.
    Export {
        /// Chrome trace-event JSON (the only format so far).
        #[arg(long, required = true)]
        perfetto: bool,
        /// Run directory.
        run: PathBuf,
        /// Output file (`-`: stdout). A regular file, or the file a symlink leads to, is
        /// replaced atomically and keeps its permission bits (a read-only one is not
        /// replaced); a FIFO or device is written to, never replaced.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Run a command under the shim (LD_PRELOAD and a run id for it and its
    /// children), wait for it however it ends (SIGTERM and SIGHUP are passed on to it,
    /// Ctrl-C does not stop zcta), then print the run's report. Exits with the
    /// command's status (128 + N when signal N ended it).
    Run {
        /// Parent of the run directory.
        #[arg(long, default_value = "zcta-runs")]
        out: PathBuf,
        /// Run id (default: run-<UNIX seconds>-<pid of zcta>).
        #[arg(long)]
        run_id: Option<String>,
        /// libzcta_prof.so (default: $ZCTA_SHIM, else next to this zcta binary); its path
        /// must have no space or colon, at which LD_PRELOAD splits it.
        #[arg(long)]
        shim: Option<PathBuf>,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Write the `phases` table (one row per op and rank with its phases) into the
    /// run directory, for pandas/DuckDB.
    Phases {
        /// Run directory.
        run: PathBuf,
    },
    /// Print the documentation of every table's columns (Markdown).
    Schema,
    /// Which data path each NCCL collective can take on this machine (copy engine,
    /// SM kernels over NVLink/PCIe P2P, SHM, NET), which conditions are met or
    /// missing, and how to fix them; --probe checks it with a tiny real 2-GPU run.
    #[command(after_help = zcta::doctor::EXIT_CODES_HELP)]
    Doctor(DoctorArgs),
}

#[derive(clap::Args, Debug)]
struct DoctorArgs {
    /// One JSON document (facts, verdicts, probe) instead of the table.
    #[arg(long)]
    json: bool,
    /// Run a tiny 2-GPU NCCL exchange (torch.distributed.run) under the shim and
    /// compare the path predicted with the engine seen.
    #[arg(long)]
    probe: bool,
    /// Nodes the job will span (default: SLURM_JOB_NUM_NODES, WORLD_SIZE /
    /// LOCAL_WORLD_SIZE, … from the environment, else 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    nodes: Option<u32>,
    /// Python with torch (default: $ZCTA_PYTHON, else python3).
    #[arg(long)]
    python: Option<String>,
    /// libzcta_prof.so for --probe (default: $ZCTA_SHIM, else next to this zcta).
    #[arg(long)]
    shim: Option<PathBuf>,
    /// Longest time the probe may run, seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(5..=3600))]
    probe_timeout: u64,
    /// Keep the probe's script, log and run directory here (each made new: a
    /// directory that holds one already is refused).
    #[arg(long)]
    probe_dir: Option<PathBuf>,
    /// Read the facts from this JSON file instead of the machine (tests).
    #[arg(long, hide = true)]
    facts: Option<PathBuf>,
}

/// `zcta doctor`: the report, and its exit status (see `EXIT_CODES_HELP`).
fn doctor(a: DoctorArgs) -> anyhow::Result<ExitCode> {
    use zcta::doctor::{self, probe as dprobe, render};
    let python = doctor::python_interpreter(a.python);
    let facts = match a.facts {
        Some(p) => {
            let text = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
            let mut f: doctor::Facts = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a facts document", p.display()))?;
            if let Some(n) = a.nodes {
                f.nodes = doctor::facts::Nodes {
                    count: n,
                    source: "--nodes".into(),
                };
            }
            f
        }
        None => doctor::gather_here(&python, a.nodes),
    };
    let report = doctor::verdicts(&facts);
    let probe = a.probe.then(|| {
        eprintln!("zcta doctor: running the probe (at most {} s)…", a.probe_timeout);
        dprobe::run(
            &facts,
            &report,
            &dprobe::ProbeOptions {
                python: python.clone(),
                shim: a.shim,
                timeout: std::time::Duration::from_secs(a.probe_timeout),
                dir: a.probe_dir,
                mib: 16,
            },
        )
    });
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&render::json(&facts, &report, probe.as_ref()))?
        );
    } else {
        out!("{}", render::text(&facts, &report, probe.as_ref()));
    }
    Ok(ExitCode::from(render::exit_code(&report, probe.as_ref())))
}

/// `zcta run`: the command's exit status (128 + signal when it was killed; 127 when
/// it was not found, 126 when it could not be executed, as shells say).
fn run_cmd(
    out: &Path,
    run_id: Option<String>,
    shim: Option<PathBuf>,
    cmd: &[std::ffi::OsString],
) -> anyhow::Result<ExitCode> {
    let shim = launch::find_shim(shim).map_err(anyhow::Error::msg)?;
    let id = match run_id {
        // The shim makes ZCTA_RUN_ID one directory name; the report must look there.
        Some(asked) => {
            let id = zcta::config::sanitize(asked.trim());
            if id != asked {
                eprintln!("zcta: run id {asked:?} is used as {id:?} (one directory name)");
            }
            id
        }
        None => launch::default_run_id(),
    };
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    // Absolute, so that a command that changes directory records where it was asked.
    let out = &std::path::absolute(out).with_context(|| format!("cannot resolve {}", out.display()))?;
    let existing = out.join(&id);
    if std::fs::read_dir(&existing).is_ok_and(|mut d| d.next().is_some()) {
        eprintln!(
            "zcta: {} already holds a run; this one's rows are added to it (--run-id keeps runs apart)",
            existing.display()
        );
    }
    // zcta waits for the command however it ends: a Ctrl-C or a SIGTERM to zcta ends
    // the command, then the report is printed.
    let status = launch::run_to_end(launch::under_shim(
        std::process::Command::new(&cmd[0]).args(&cmd[1..]),
        &shim,
        out,
        &id,
    ));
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            eprintln!("zcta: cannot run {:?}: {e}", cmd[0]);
            return Ok(ExitCode::from(code));
        }
    };
    let code = status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        128 + status.signal().unwrap_or(0)
    });
    // How it ended: its exit status, or the signal that killed it (the status zcta
    // exits with is then the shell's 128 + N).
    let ended = match status.code() {
        Some(c) => format!("exited with {c}"),
        None => format!("was killed by signal {} (zcta exits {code})", code - 128),
    };
    let dir = out.join(&id);
    if dir.is_dir() {
        eprintln!("zcta: {:?} {ended}; run directory {}", cmd[0], dir.display());
        if let Err(e) = report(&dir, Format::Table, 450.0) {
            eprintln!("zcta: {e:#}");
        }
    } else {
        eprintln!(
            "zcta: {:?} {ended}; no NCCL call was recorded (no run directory {})",
            cmd[0],
            dir.display()
        );
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Where `zcta export` writes: `-` is stdout; a path that does not exist or names a
/// regular file, directly or through symbolic links, is replaced atomically (a
/// temporary file next to the file, renamed over it once the trace is complete; the
/// links stay links); anything else (a FIFO, a device, a link through `/proc` such as
/// /dev/stdout) is opened and written to as it is, never replaced.
enum Output {
    Stdout,
    /// `target`: the file (never a link) the trace replaces or creates; `old`: the
    /// file there now, whose permission bits and owner the new one keeps.
    Replace {
        target: PathBuf,
        old: Option<std::fs::Metadata>,
    },
    Direct(PathBuf),
}

/// Whether `dir` is on procfs (the file system of /proc), where a link
/// (`/proc/self/fd/1`) names an open file rather than a path.
fn on_procfs(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(dir), std::fs::metadata("/proc/self")) {
        (Ok(d), Ok(p)) => d.dev() == p.dev(),
        _ => false,
    }
}

/// The directory `path` is in (`.` for a bare name).
fn dir_of(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// The effective user and group of this process and its supplementary groups, from
/// /proc/self/status (`None` when it cannot be read).
fn our_ids() -> Option<(u32, u32, Vec<u32>)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<Vec<u32>> {
        let line = status.lines().find_map(|l| l.strip_prefix(name))?;
        line.split_whitespace().map(|v| v.parse().ok()).collect()
    };
    // "Uid:" and "Gid:" give the real, effective, saved and file-system ids.
    let uid = *field("Uid:")?.get(1)?;
    let gid = *field("Gid:")?.get(1)?;
    Some((uid, gid, field("Groups:").unwrap_or_default()))
}

/// Whether this process may write a file of metadata `m`, judged by its permission
/// bits: the owner's, the group's or the others' write bit, whichever class the
/// effective user is in; for root (whom the bits do not stop), any write bit; the
/// owner's when the ids cannot be read.
fn mode_lets_us_write(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let mode = m.mode();
    let Some((uid, gid, groups)) = our_ids() else {
        return mode & 0o200 != 0;
    };
    if uid == 0 {
        mode & 0o222 != 0
    } else if m.uid() == uid {
        mode & 0o200 != 0
    } else if m.gid() == gid || groups.contains(&m.gid()) {
        mode & 0o020 != 0
    } else {
        mode & 0o002 != 0
    }
}

impl Output {
    /// Where `path` leads; an error for a directory, a read-only file, or a path that
    /// cannot be followed. Nothing is created or changed.
    fn open(path: &Path) -> anyhow::Result<Output> {
        if path.as_os_str() == "-" {
            return Ok(Output::Stdout);
        }
        let cannot = || format!("cannot write {}", path.display());
        // Follows the links one at a time, each relative to the directory it is in.
        let mut p = path.to_path_buf();
        for _ in 0..40 {
            let m = match std::fs::symlink_metadata(&p) {
                Ok(m) => m,
                // A new file, or the file a dangling link names: created.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(Output::Replace { target: p, old: None });
                }
                Err(e) => return Err(e).with_context(cannot),
            };
            let t = m.file_type();
            if t.is_symlink() {
                if on_procfs(dir_of(&p)) {
                    return Ok(Output::Direct(path.to_path_buf()));
                }
                let to = std::fs::read_link(&p).with_context(cannot)?;
                p = dir_of(&p).join(to);
            } else if t.is_dir() {
                anyhow::bail!("{}: is a directory", path.display());
            } else if t.is_file() {
                if !mode_lets_us_write(&m) {
                    use std::os::unix::fs::PermissionsExt;
                    let what = if p == path {
                        path.display().to_string()
                    } else {
                        let to = std::fs::canonicalize(&p).unwrap_or(p);
                        format!("{} links to {}, which", path.display(), to.display())
                    };
                    anyhow::bail!(
                        "{what} is read-only (mode {:04o}) and is not replaced: make it writable \
                         (chmod u+w) or write the trace elsewhere",
                        m.permissions().mode() & 0o7777
                    );
                }
                return Ok(Output::Replace {
                    target: p,
                    old: Some(m),
                });
            } else {
                return Ok(Output::Direct(path.to_path_buf()));
            }
        }
        anyhow::bail!("{}: too many levels of symbolic links", path.display())
    }

    /// Writes through `f`; a replaced file is written in full to a temporary file next
    /// to it first, which takes its place only when `f` and the writing succeeded and
    /// is removed otherwise.
    fn write<T>(
        self,
        path: &Path,
        f: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<T>,
    ) -> anyhow::Result<T> {
        use std::io::Write as _;
        let cannot = || format!("cannot write {}", path.display());
        match self {
            Output::Stdout => {
                let mut w = std::io::BufWriter::new(std::io::stdout().lock());
                let r = f(&mut w).with_context(cannot)?;
                w.flush().with_context(cannot)?;
                Ok(r)
            }
            Output::Direct(p) => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&p)
                    .with_context(cannot)?;
                let mut w = std::io::BufWriter::new(file);
                let r = f(&mut w).with_context(cannot)?;
                w.flush().with_context(cannot)?;
                Ok(r)
            }
            Output::Replace { target, old } => {
                // Made with no more permission than the file it replaces has: its
                // contents are readable by no one the old file kept out.
                let mode = old.as_ref().map_or(0o666, |m| {
                    use std::os::unix::fs::PermissionsExt;
                    m.permissions().mode() & 0o666
                });
                let (tmp, file) = temp_next_to(&target, mode)?;
                zcta::launch::remove_on_interrupt(Some(&tmp));
                let done = (|| {
                    let mut w = std::io::BufWriter::new(file);
                    let r = f(&mut w).with_context(cannot)?;
                    w.flush().with_context(cannot)?;
                    let file = w.into_inner().map_err(|e| e.into_error()).with_context(cannot)?;
                    if let Some(old) = &old {
                        keep_owner_and_mode(&file, old).with_context(cannot)?;
                    }
                    drop(file);
                    std::fs::rename(&tmp, &target).with_context(cannot)?;
                    Ok(r)
                })();
                if done.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                zcta::launch::remove_on_interrupt(None);
                done
            }
        }
    }
}

/// Refuses a trace `target` (where `output` leads) that would replace or add to a
/// dataset: any path inside the run directory `run` but a new file directly in it
/// (the run's own files, and a file in a table's directory that its readers would
/// then meet), and an existing file that begins as a Parquet file or an Arrow
/// stream does (another run's data: never a trace).
fn keeps_data_files(run: &Path, output: &Path, target: &Path, exists: bool) -> anyhow::Result<()> {
    let real_dir = std::fs::canonicalize(dir_of(target)).unwrap_or_else(|_| dir_of(target).to_path_buf());
    if let Ok(real_run) = std::fs::canonicalize(run)
        && real_dir.starts_with(&real_run)
        && (exists || real_dir != real_run)
    {
        anyhow::bail!(
            "{}: inside the run directory {} (its data, or where its readers look): \
             not written; write the trace elsewhere",
            output.display(),
            run.display()
        );
    }
    if exists {
        // Opened as the readers open a data file: never waiting on a FIFO swapped in.
        // A file that cannot be read, or is shorter, matches neither.
        let mut head = Vec::with_capacity(4);
        if let Ok(f) = reader::open_regular(target) {
            let _ = std::io::Read::read_to_end(&mut std::io::Read::take(f, 4), &mut head);
        }
        let what = match head.as_slice() {
            b"PAR1" => "a Parquet file",
            [0xff, 0xff, 0xff, 0xff] => "an Arrow stream",
            _ => return Ok(()),
        };
        anyhow::bail!(
            "{}: {what} (data, not a trace): not replaced; write the trace elsewhere",
            output.display()
        );
    }
    Ok(())
}

/// A new file of our own next to `target` with permission bits `mode` (less the
/// umask): created new, so nothing that was there before is ever overwritten (or
/// deleted on failure).
fn temp_next_to(target: &Path, mode: u32) -> anyhow::Result<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned());
    let name = name.with_context(|| format!("{}: not a file name", target.display()))?;
    for i in 0..100u32 {
        let tmp = dir_of(target).join(format!(".{name}.zcta-{}-{i}.tmp", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", tmp.display())),
        }
    }
    anyhow::bail!("cannot create a temporary file next to {}", target.display())
}

/// Gives `file` the permission bits of `old`, and its owner and group where this
/// process may (root, or a group it is in); the new file is ours otherwise.
fn keep_owner_and_mode(file: &std::fs::File, old: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let now = file.metadata()?;
    if (now.uid(), now.gid()) != (old.uid(), old.gid())
        && std::os::unix::fs::fchown(file, Some(old.uid()), Some(old.gid())).is_err()
    {
        let _ = std::os::unix::fs::fchown(file, None, Some(old.gid()));
    }
    file.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777))
}

/// `zcta export --perfetto`: exit 0, or 1 when files had to be skipped; a run without
/// ops rows to draw is an error, as for `report`.
fn export(run: &Path, output: &Path) -> anyhow::Result<ExitCode> {
    reader::check_run_dir(run)?;
    let out = Output::open(output)?;
    if let Output::Replace { target, old } = &out {
        keeps_data_files(run, output, target, old.is_some())?;
    }
    let trace = zcta::analysis::export::Trace::read(run)?;
    for s in &trace.skipped {
        eprintln!("zcta: skipped {}: {}", s.path.display(), s.reason);
    }
    // A process is a track group by (host, pid): processes that share them are drawn
    // as one (a reused pid in a container, or copied files), as `report` warns too.
    for p in reader::shared_pids(run).unwrap_or_default() {
        eprintln!("zcta: warning: {p}; the trace draws them as one process");
    }
    if trace.processes() == 0 {
        anyhow::bail!(
            "{}",
            no_ops_rows_of(
                run,
                trace.pending_ops_logs,
                trace.skipped.len(),
                "nothing to export"
            )
        );
    }
    // The trace may be going to our own stdout (`-`, /dev/stdout, a pipe): the line
    // saying what was written goes there only when the trace went to a file in place.
    let in_place = matches!(out, Output::Replace { .. });
    let events = out.write(output, |w| trace.write(w))?;
    let what = if output.as_os_str() == "-" {
        "stdout".to_string()
    } else {
        output.display().to_string()
    };
    let line = format!(
        "{what}: {events} events from {} processes (open it in https://ui.perfetto.dev)",
        trace.processes()
    );
    if in_place {
        outln!("{line}");
    } else {
        eprintln!("zcta: {line}");
    }
    Ok(if trace.skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum DiffFormat {
    Table,
    Json,
}

/// `zcta diff`: exit 0, or 1 when files of either run had to be skipped.
fn diff(a: &Path, b: &Path, format: DiffFormat) -> anyhow::Result<ExitCode> {
    use zcta::analysis;
    let mut ra = analysis::load(a)?;
    let mut rb = analysis::load(b)?;
    let d = analysis::diff::diff(&mut ra, &mut rb)?;
    let mut skipped = 0;
    for s in ra.skipped.iter().chain(&rb.skipped) {
        skipped += 1;
        eprintln!("zcta: skipped {}: {}", s.path.display(), s.reason);
    }
    if d.rows.is_empty() && d.only_a.is_empty() {
        anyhow::bail!("{}", no_ops_rows(&ra, "nothing to compare"));
    }
    if d.rows.is_empty() && d.only_b.is_empty() {
        anyhow::bail!("{}", no_ops_rows(&rb, "nothing to compare"));
    }
    match format {
        DiffFormat::Table => {
            outln!("A {}\nB {}", a.display(), b.display());
            out!("{}", analysis::diff::render_text(&d));
        }
        DiffFormat::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&analysis::diff::render_json(&d))?
        ),
    }
    Ok(if skipped == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// "RUN: no ops rows (WHAT)", and why there may be none: logs still to recover,
/// files skipped (named before this line).
fn no_ops_rows(run: &zcta::analysis::Run, what: &str) -> String {
    no_ops_rows_of(&run.dir, run.pending_logs, run.skipped.len(), what)
}

/// [`no_ops_rows`] of run directory `dir` with `pending_logs` write-ahead logs and
/// `skipped` files that could not be read.
fn no_ops_rows_of(dir: &Path, pending_logs: usize, skipped: usize, what: &str) -> String {
    let mut msg = format!("{}: no ops rows ({what})", dir.display());
    if pending_logs > 0 {
        msg += &format!(
            "; {} pending (a process was killed or still runs): run `zcta recover {}` for their rows",
            plural(pending_logs as u64, "write-ahead log", "write-ahead logs"),
            dir.display()
        );
    }
    if skipped > 0 {
        msg += &format!("; {skipped} files could not be read (named above)");
    }
    msg
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Table,
    Json,
    Csv,
}

/// The range `--link-peak-gbps` takes, GB/s: from a slow network link to far beyond
/// any link there is; outside it the %peak column would say nothing (`inf`, or a
/// number of hundreds of digits).
const LINK_PEAK_GBPS: std::ops::RangeInclusive<f64> = 0.001..=1e6;

fn link_peak(s: &str) -> Result<f64, String> {
    let (lo, hi) = (LINK_PEAK_GBPS.start(), LINK_PEAK_GBPS.end());
    match s.parse::<f64>() {
        Ok(v) if LINK_PEAK_GBPS.contains(&v) => Ok(v),
        Ok(v) if v > 0.0 => Err(format!("{s:?} is not a link bandwidth in GB/s from {lo} to {hi}")),
        _ => Err(format!(
            "{s:?} is not a positive number (a link bandwidth in GB/s from {lo} to {hi})"
        )),
    }
}

/// `zcta report`: exit 0, or 1 when files had to be skipped (the report covers the rest).
fn report(run: &Path, format: Format, peak: f64) -> anyhow::Result<ExitCode> {
    use zcta::analysis;
    let mut data = analysis::load(run)?;
    let r = analysis::report::build(&mut data, peak)?;
    let n: u64 = r.mix.iter().map(|m| m.2).sum();
    if r.mix.is_empty() {
        for s in &data.skipped {
            eprintln!("zcta: skipped {}: {}", s.path.display(), s.reason);
        }
        anyhow::bail!("{}", no_ops_rows(&data, "nothing to report"));
    }
    match format {
        Format::Table => {
            outln!(
                "run {} — {} on {}",
                run.display(),
                plural(n, "op", "ops"),
                plural(data.procs.len() as u64, "process", "processes")
            );
            out!("{}", analysis::report::render_text(&r));
        }
        Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&analysis::report::render_json(&r))?
        ),
        Format::Csv => out!("{}", analysis::report::render_csv(&r)),
    }
    for s in &data.skipped {
        eprintln!("zcta: skipped {}: {}", s.path.display(), s.reason);
    }
    Ok(if data.skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        // The reader of our output went away (`zcta report RUN | head`): stop quietly.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zcta: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // Commands that start none write their files under the file-size limit
    // (`ulimit -f`) as on a full disk: the write fails, and they say so and clean up.
    if !matches!(cli.cmd, Cmd::Run { .. } | Cmd::Doctor(_)) {
        zcta::launch::file_size_limit_is_an_error();
    }
    match cli.cmd {
        Cmd::Recover { run, force } => recover(&run, force),
        Cmd::Summary { run } => summary(&run),
        Cmd::Report {
            run,
            format,
            link_peak_gbps,
        } => report(&run, format, link_peak_gbps),
        Cmd::Diff { run_a, run_b, format } => diff(&run_a, &run_b, format),
        Cmd::Export { run, output, .. } => export(&run, &output),
        Cmd::Phases { run } => {
            let mut data = zcta::analysis::load(&run)?;
            let written = zcta::analysis::write_phases(&mut data);
            for s in &data.skipped {
                eprintln!("zcta: skipped {}: {}", s.path.display(), s.reason);
            }
            let n = match written {
                Err(zcta::analysis::WritePhasesError::NoOps) => {
                    anyhow::bail!(
                        "{}; nothing was changed",
                        no_ops_rows(&data, "no phases to write")
                    )
                }
                w => w?,
            };
            outln!("{}: {n} rows", run.join("phases").display());
            Ok(if data.skipped.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Cmd::Run {
            out,
            run_id,
            shim,
            cmd,
        } => run_cmd(&out, run_id, shim, &cmd),
        Cmd::Doctor(a) => doctor(a),
        Cmd::Schema => {
            for t in tables::ALL_TABLES {
                outln!("## `{t}`\n");
                out!(
                    "{}",
                    tables::markdown_columns(tables::columns_of(t).unwrap_or(&[]))
                );
                outln!();
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn recover(run: &Path, force: bool) -> anyhow::Result<ExitCode> {
    let host = zcta::sink::file_host(&this_host());
    let is_live = |h: &str, pid: i32| !force && h == host && Path::new(&format!("/proc/{pid}")).exists();
    let report = recover_run(run, &is_live)?;
    if report.logs.is_empty() {
        outln!("{}: nothing to recover", run.display());
        return Ok(ExitCode::SUCCESS);
    }
    for (wal, outcome) in &report.logs {
        match outcome {
            LogOutcome::Recovered { parquet, rows, torn } => outln!(
                "recovered {rows} rows: {} -> {}{}",
                wal.display(),
                parquet.display(),
                if *torn {
                    " (incomplete last batch dropped)"
                } else {
                    ""
                }
            ),
            LogOutcome::AlreadyClosed => outln!("removed stale log {}", wal.display()),
            LogOutcome::Empty => outln!("removed empty log {}", wal.display()),
            LogOutcome::Live => outln!(
                "skipped {}: its process still runs on this host (use --force if it is gone)",
                wal.display()
            ),
            LogOutcome::Locked => outln!(
                "skipped {}: a process still holds its lock and writes it (on this host or another \
                 sharing the file system); --force does not override that",
                wal.display()
            ),
            LogOutcome::Failed(why) => {
                eprintln!("zcta: cannot recover {} (left in place): {why}", wal.display())
            }
        }
    }
    outln!(
        "{} rows recovered from {} logs",
        report.rows_recovered(),
        report.logs.len()
    );
    Ok(if report.failures() > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// NCCL's own view: whether the profiler plugin ran, which ops it reported, and the
/// algorithm/protocol mix it chose.
fn nccl_view(s: &Summary) -> anyhow::Result<()> {
    outln!("\n  NCCL's view (profiler plugin)");
    for p in &s.processes {
        let what = p.profiler_plugin.as_deref().unwrap_or("");
        let line = if what == "zcta" && p.plugin_comms > 0 {
            format!(
                "loaded by NCCL for {}",
                plural(p.plugin_comms, "communicator", "communicators")
            )
        } else if what == "zcta" {
            "offered, but NCCL never called it (no communicator, or NCCL_PROFILER_PLUGIN came from nccl.conf)"
                .into()
        } else if let Some(user) = what.strip_prefix("user: ") {
            format!("missing: your NCCL_PROFILER_PLUGIN={user} was left in place (NCCL loads one plugin)")
        } else {
            format!("missing: {what}")
        };
        outln!("    pid {:<8} {line}", p.pid);
    }
    for (op, c) in &s.nccl_cover {
        let (n, with, skipped) = (c.ops, c.with_view, c.not_selected);
        let mut why = Vec::new();
        if skipped > 0 {
            why.push(format!(
                "{skipped} not selected by the budget: NCCL is asked for events for the timed ops only"
            ));
        }
        if n - with > skipped {
            why.push(format!(
                "{} not reported by NCCL: copy-engine and symmetric-kernel ops, single-rank communicators and plugin-less processes have no events",
                n - with - skipped
            ));
        }
        let note = if why.is_empty() {
            String::new()
        } else {
            format!("  ({})", why.join("; "))
        };
        outln!("    {op:<14} {with:>8} of {n:<8} ops with NCCL's view{note}");
    }
    for ((func, algo, proto, ch), n) in &s.nccl_mix {
        outln!("    {func:<14} {algo:<10} {proto:<7} {ch:>3} channels  {n:>8} events");
    }
    Ok(())
}

/// What the processes could not write (`process.records_dropped`).
fn dropped_view(s: &Summary) -> anyhow::Result<()> {
    // The total in u128: the counts come from the files (a damaged one may hold any u64).
    let (mut total, mut known, mut unknown, mut with) = (0u128, 0usize, 0usize, 0usize);
    for d in s.processes.iter().map(|p| p.records_dropped) {
        match d {
            None => unknown += 1,
            Some(d) => {
                known += 1;
                total += u128::from(d);
                with += usize::from(d > 0);
            }
        }
    }
    if known + unknown == 0 {
        return Ok(());
    }
    let unknown = if unknown > 0 {
        format!(
            ", unknown for {} killed (recovered)",
            plural(unknown as u64, "process", "processes")
        )
    } else {
        String::new()
    };
    outln!(
        "  {:<TABLE_W$} {total:>10} records (process.records_dropped) in {with} of {}{unknown}",
        "dropped",
        plural(known as u64, "process", "processes")
    );
    Ok(())
}

/// The GPU side: whether GPU stamps and CUPTI ran in each process, and per op which
/// engine moved the bytes and how long the GPU work took.
fn gpu_view(s: &Summary) -> anyhow::Result<()> {
    outln!("\n  GPU side (GPU stamps by default, CUPTI in deep mode)");
    for p in &s.processes {
        let events = p
            .gpu_timing
            .as_deref()
            .unwrap_or("no status (files written before it existed)");
        outln!("    pid {:<8} GPU stamps: {events}", p.pid);
        let cupti = p
            .cupti
            .as_deref()
            .unwrap_or("no status (files from schema version 1)");
        outln!("    {:12} CUPTI: {cupti}", "");
        if let Some(n) = p.ops_graph_captured.filter(|&n| n > 0) {
            outln!(
                "    {:12} {n} ops captured into CUDA graphs (ops.graph_captured), GPU side not measured",
                ""
            );
        }
        if let Some(sampling) = &p.gpu_sampling {
            outln!(
                "    {:12} sampled (ZCTA_SAMPLE): {}; {} ops not captured (outside the windows, or overtaken by a capture switch), GPU side not measured",
                "",
                sampling,
                p.ops_unsampled.map_or("?".into(), |n| n.to_string())
            );
        } else if let Some(n) = p.ops_unsampled.filter(|&n| n > 0) {
            outln!(
                "    {:12} {n} ops whose capture went off during their call (a pause, CUPTI handed over), GPU side not measured",
                ""
            );
        }
    }
    for (op, g) in &s.gpu {
        let mix: Vec<String> = g.engines.iter().map(|(e, n)| format!("{e} {n}")).collect();
        let us = |v: Option<i64>| v.map_or("-".to_string(), |v| format!("{:.1} us", v as f64 / 1e3));
        outln!(
            "    {op:<14} GPU side measured {:>7} of {:<7} GPU median {:>10}  launch->kernel median {:>10}  {}",
            g.measured,
            g.ops,
            us(g.median_ns),
            us(g.launch_to_kernel_ns),
            mix.join(", ")
        );
    }
    Ok(())
}

/// Width of the table-name column of `zcta summary` (the longest name, `nccl_comms`).
const TABLE_W: usize = 10;

fn summary(run: &Path) -> anyhow::Result<ExitCode> {
    let s = zcta::analysis::summary::summarize(run)?;
    outln!("run {}", run.display());
    let mut problems = 0usize;
    for t in &s.tables {
        outln!(
            "  {:<TABLE_W$} {:>10} rows in {}",
            t.table,
            t.rows,
            plural(t.files as u64, "file", "files")
        );
        for sk in &t.skipped {
            problems += 1;
            eprintln!("zcta: skipped {}: {}", sk.path.display(), sk.reason);
        }
        if t.pending_logs > 0 {
            outln!(
                "  {:TABLE_W$} {} pending (process killed or still running): run `zcta recover {}`",
                "",
                plural(t.pending_logs as u64, "write-ahead log", "write-ahead logs"),
                run.display()
            );
        }
    }
    if let Some(stop) = s.stopped {
        return Err(match stop.table {
            Some(t) => anyhow::Error::new(stop.error).context(format!("reading table {t}")),
            None => stop.error.into(),
        });
    }
    for p in &s.shared_pids {
        eprintln!("zcta: warning: {p}");
    }
    dropped_view(&s)?;
    nccl_view(&s)?;
    gpu_view(&s)?;
    if !s.calls.is_empty() {
        outln!(
            "\n  {:>5}  {:<14} {:>10} {:>14} {:>8}",
            "rank",
            "op",
            "calls",
            "bytes",
            "errors"
        );
        for ((rank, op), c) in &s.calls {
            let rank = rank.map_or("-".to_string(), |r| r.to_string());
            outln!(
                "  {rank:>5}  {op:<14} {:>10} {:>14} {:>8}",
                c.calls,
                c.bytes,
                c.errors
            );
        }
    }
    Ok(if problems > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
