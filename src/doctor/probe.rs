//! `zcta doctor --probe`: runs a tiny 2-GPU NCCL exchange (`probe.py`, embedded) with
//! `python3 -m torch.distributed.run` under the shim, with `NCCL_DEBUG=INFO`, then
//! compares what was predicted with what was seen: the engine per op (the `ops` table's
//! `engine` column, from CUPTI), the transport NCCL logged (`via P2P/CUMEM`, `via SHM/…`,
//! `via NET/…`, `Init CE`), and the library, version, driver and P2P facts NCCL printed.
//! The user's NCCL settings are kept (NCCL_NVLS_ENABLE included); only NCCL_DEBUG,
//! NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE, which move no data, are changed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::facts::Facts;
use super::verdict::{Family, Path, Report, State};
use crate::nccl::OpKind;
use crate::{launch, reader};

/// The probe program, written to a temporary folder at run time.
pub const PROBE_SCRIPT: &str = include_str!("probe.py");
/// The run id the probe records under (below its own folder).
const RUN_ID: &str = "doctor-probe";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStatus {
    /// Every family and every check agreed.
    Agreed,
    /// Something was seen that the prediction excluded.
    Disagreed,
    /// It ran, but some family could not be judged (no GPU capture, no ops).
    Inconclusive,
    /// Preconditions missing (no torch, < 2 GPUs, no shim).
    NotRun,
    /// The job failed or timed out.
    Failed,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeFamily {
    pub family: Family,
    pub predicted: Path,
    /// `ops.engine` values seen (all ranks and iterations), `not measured` for NULL.
    pub engines: BTreeMap<String, u64>,
    pub seen: Option<Path>,
    pub agrees: Option<bool>,
    pub note: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeCheck {
    pub what: String,
    pub predicted: String,
    pub seen: String,
    pub agrees: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeResult {
    pub status: ProbeStatus,
    pub reason: Option<String>,
    /// Buffers in symmetric windows on a side stream (NCCL_CTA_POLICY=2 was set).
    pub symmetric: bool,
    /// The probe's folder, when kept (a failure, or `--probe-dir`).
    pub dir: Option<String>,
    pub families: Vec<ProbeFamily>,
    pub checks: Vec<ProbeCheck>,
    /// `NCCL WARN` lines of the job (first few).
    pub nccl_warnings: Vec<String>,
}

impl ProbeResult {
    pub fn agreed(&self) -> bool {
        self.status == ProbeStatus::Agreed
    }

    fn not_run(status: ProbeStatus, reason: String, symmetric: bool) -> ProbeResult {
        ProbeResult {
            status,
            reason: Some(reason),
            symmetric,
            dir: None,
            families: Vec::new(),
            checks: Vec::new(),
            nccl_warnings: Vec::new(),
        }
    }

    /// The PROBE section of the table.
    pub fn render_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let status = match self.status {
            ProbeStatus::Agreed => "agrees with the prediction",
            ProbeStatus::Disagreed => "DISAGREES with the prediction",
            ProbeStatus::Inconclusive => "inconclusive",
            ProbeStatus::NotRun => "did not run",
            ProbeStatus::Failed => "FAILED",
        };
        let _ = writeln!(
            s,
            "PROBE ({}): {status}",
            if self.symmetric {
                "symmetric windows on a side stream, NCCL_CTA_POLICY=2"
            } else {
                "plain buffers on the current stream"
            }
        );
        if let Some(r) = &self.reason {
            let _ = writeln!(s, "  {r}");
        }
        if !self.families.is_empty() {
            let _ = writeln!(
                s,
                "  {:<19} {:<40} {:<40} engines (ops.engine)",
                "family", "predicted", "seen"
            );
        }
        for f in &self.families {
            let mark = match f.agrees {
                Some(true) => "",
                Some(false) => "  <-- differs",
                None => "  (cannot tell)",
            };
            let eng: Vec<String> = f.engines.iter().map(|(e, n)| format!("{e} {n}")).collect();
            let _ = writeln!(
                s,
                "  {:<19} {:<40} {:<40} {}{mark}",
                f.family.name(),
                f.predicted.label(),
                f.seen.map_or("-", Path::label),
                eng.join(", ")
            );
            if let Some(n) = &f.note {
                let _ = writeln!(s, "  {:<19} {n}", "");
            }
        }
        for c in &self.checks {
            let mark = match c.agrees {
                Some(true) => "ok",
                Some(false) => "DIFFERS",
                None => "-",
            };
            let _ = writeln!(
                s,
                "  {:<7} {}: predicted {}, seen {}",
                mark, c.what, c.predicted, c.seen
            );
        }
        for w in &self.nccl_warnings {
            let _ = writeln!(s, "  NCCL: {w}");
        }
        if let Some(d) = &self.dir {
            let _ = writeln!(s, "  files kept in {d}");
        }
        s
    }
}

/// How to run the probe.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    pub python: String,
    pub shim: Option<PathBuf>,
    pub timeout: Duration,
    /// Keep the files here (else a temporary folder, removed unless the probe fails).
    pub dir: Option<PathBuf>,
    pub mib: u32,
}

/// What NCCL printed with `NCCL_DEBUG=INFO`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NcclLog {
    pub versions: BTreeSet<String>,
    pub cuda_driver: Option<i32>,
    pub all_cuda_p2p: Option<bool>,
    /// `via` tokens: `P2P/CUMEM`, `P2P/CUMEM/CE`, `SHM/direct/direct`, `NET/Socket/0`.
    pub transports: BTreeSet<String>,
    pub init_ce: bool,
    pub warnings: Vec<String>,
    /// `zcta-probe:` lines of the script.
    pub probe_lines: Vec<String>,
}

/// Parses the job's output (NCCL's INFO lines, the script's own lines).
pub fn parse_log(text: &str) -> NcclLog {
    let mut l = NcclLog::default();
    for line in text.lines() {
        if let Some(p) = line.find("zcta-probe: ") {
            l.probe_lines.push(line[p + 12..].to_owned());
        }
        if let Some(p) = line.find("NCCL WARN ") {
            if l.warnings.len() < 8 {
                l.warnings.push(line[p + 10..].trim().to_owned());
            }
            continue;
        }
        // "NCCL version 2.28.9+cuda13.0" (printed at INFO and VERSION levels).
        if let Some(p) = line.find("NCCL version ") {
            let v = &line[p + 13..];
            if v.starts_with(|c: char| c.is_ascii_digit()) {
                let v = v.split(['+', ' ']).next().unwrap_or(v);
                l.versions.insert(v.trim().to_owned());
                continue;
            }
        }
        let Some(p) = line.find("NCCL INFO ") else {
            continue;
        };
        let msg = &line[p + 10..];
        if let Some(v) = msg.strip_prefix("cudaDriverVersion ") {
            l.cuda_driver = v.trim().parse().ok();
        } else if let Some(i) = msg.find("isAllCudaP2p ") {
            l.all_cuda_p2p = msg[i + 13..].split_whitespace().next().map(|v| v == "1");
        } else if msg.starts_with("Init CE") {
            l.init_ce = true;
        } else if let Some(i) = msg.find(" via ")
            && let Some(tok) = msg[i + 5..].split_whitespace().next()
        {
            l.transports.insert(tok.to_owned());
        }
    }
    l
}

/// The path a `via` token stands for.
pub fn transport_path(token: &str) -> Option<Path> {
    let ce = token.split('/').skip(1).any(|p| p == "CE");
    Some(if token.starts_with("P2P") {
        if ce { Path::P2pMemcpy } else { Path::NvlinkP2p }
    } else if token.starts_with("SHM") {
        if ce { Path::ShmMemcpy } else { Path::Shm }
    } else if token.starts_with("NET") {
        Path::Net
    } else {
        return None;
    })
}

fn same(pred: Path, seen: Path) -> bool {
    let p2p = |p| matches!(p, Path::NvlinkP2p | Path::PcieP2p);
    pred == seen || (p2p(pred) && p2p(seen))
}

/// What the probe's own job should do: its two GPUs are the first two visible ones.
pub fn predictions(report: &Report) -> Vec<(Family, Path)> {
    let pair_path = report
        .transport
        .pairs
        .iter()
        .find(|p| report.visible.len() >= 2 && p.a == report.visible[0] && p.b == report.visible[1])
        .map_or(report.transport.path, |p| p.path);
    // The probe is one node whatever --nodes says, and asks for CTA policy ZERO only
    // through NCCL_CTA_POLICY (never per collective).
    let ce = report
        .copy_engine
        .iter()
        .filter(|c| c.key != "single_node" && c.key != "nodes")
        .all(|c| c.state == State::Met || (c.state == State::ProgramMust && c.key != "cta_policy"));
    report
        .families
        .iter()
        .map(|f| {
            let p = if f.ce_capable && ce {
                Path::CopyEngine
            } else {
                pair_path
            };
            (f.family, p)
        })
        .collect()
}

fn symmetric_mode(report: &Report) -> bool {
    report
        .copy_engine
        .iter()
        .any(|c| c.key == "cta_policy" && c.state == State::Met)
}

crate::read_view! {
    struct OpsCols of ops { op, engine, result }
}

crate::read_view! {
    struct ProcessCols of process { nccl_lib }
}

/// Compares a finished job (its run directory and log) with the prediction.
pub fn judge(facts: &Facts, report: &Report, run_dir: &FsPath, log: &str, symmetric: bool) -> ProbeResult {
    let nl = parse_log(log);
    let mut r = ProbeResult {
        status: ProbeStatus::Agreed,
        reason: None,
        symmetric,
        dir: None,
        families: Vec::new(),
        checks: Vec::new(),
        nccl_warnings: nl.warnings.clone(),
    };
    let mut engines: BTreeMap<Family, BTreeMap<String, u64>> = BTreeMap::new();
    match reader::read_table(run_dir, "ops") {
        Ok(t) => {
            for v in t.batches.iter().filter_map(OpsCols::of) {
                for i in 0..v.rows {
                    if v.result.get(i).is_some_and(|res| res != 0) {
                        continue;
                    }
                    let Some(fam) = OpKind::from_name(v.op.value(i)).and_then(Family::of_op) else {
                        continue;
                    };
                    let e = v.engine.get(i).unwrap_or("not measured").to_owned();
                    *engines.entry(fam).or_default().entry(e).or_default() += 1;
                }
            }
        }
        Err(e) => r.reason = Some(format!("cannot read the probe's run: {e}")),
    }
    // The transport NCCL logged, if one kind only.
    let logged: BTreeSet<Path> = nl.transports.iter().filter_map(|t| transport_path(t)).collect();
    let logged_one = (logged.len() == 1)
        .then(|| logged.iter().next().copied())
        .flatten();
    for (fam, predicted) in predictions(report) {
        let eng = engines.remove(&fam).unwrap_or_default();
        let measured: Vec<(&String, &u64)> = eng
            .iter()
            .filter(|(e, _)| e.as_str() != "not measured" && e.as_str() != "none")
            .collect();
        let dominant = measured.iter().max_by_key(|(_, n)| **n).map(|(e, _)| e.as_str());
        let (seen, note) = match dominant {
            None if eng.is_empty() => (None, Some("no ops recorded for this family".to_owned())),
            None => (
                None,
                Some(
                    "GPU side not measured (CUPTI off: the process table's cupti column says why)".to_owned(),
                ),
            ),
            Some("copy_engine") => (Some(Path::CopyEngine), None),
            Some(e) => match logged_one {
                Some(t) => (Some(t), None),
                None if logged.is_empty() => (
                    None,
                    Some(format!(
                        "{e}, but NCCL logged no transport (NCCL_DEBUG output missing)"
                    )),
                ),
                None => (
                    logged.iter().max_by_key(|p| p_badness(**p)).copied(),
                    Some(format!("NCCL logged several transports: {:?}", nl.transports)),
                ),
            },
        };
        let agrees = seen.map(|s| same(predicted, s));
        r.families.push(ProbeFamily {
            family: fam,
            predicted,
            engines: eng,
            seen,
            agrees,
            note,
        });
    }
    // Facts NCCL printed.
    let sel = facts.nccl.iter().find(|l| l.selected);
    if let Some(v) = nl.versions.iter().next() {
        let pred = sel.and_then(|l| l.version.clone()).unwrap_or_else(|| "?".into());
        r.checks.push(ProbeCheck {
            what: "NCCL version loaded".into(),
            agrees: (pred != "?").then(|| nl.versions.len() == 1 && v.starts_with(&pred)),
            predicted: pred,
            seen: nl.versions.iter().cloned().collect::<Vec<_>>().join(", "),
        });
    }
    if let Some(lib) = loaded_nccl_lib(run_dir) {
        let pred = sel.map(|l| l.path.clone()).unwrap_or_else(|| "?".into());
        let canon = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
        r.checks.push(ProbeCheck {
            what: "NCCL library loaded".into(),
            agrees: (pred != "?").then(|| canon(&pred) == canon(&lib)),
            predicted: pred,
            seen: lib,
        });
    }
    if let Some(c) = nl.cuda_driver {
        r.checks.push(ProbeCheck {
            what: "CUDA driver API".into(),
            predicted: facts.driver.cuda_driver.map_or("?".into(), |v| v.to_string()),
            seen: c.to_string(),
            // An inferred version is a lower bound.
            agrees: facts.driver.cuda_driver.map(|p| {
                if facts
                    .driver
                    .cuda_driver_source
                    .as_deref()
                    .is_some_and(|s| s.starts_with("inferred"))
                {
                    c >= p
                } else {
                    c == p
                }
            }),
        });
    }
    if let Some(seen) = nl.all_cuda_p2p {
        let pred = report
            .copy_engine
            .iter()
            .find(|c| c.key == "all_p2p")
            .map(|c| c.state);
        r.checks.push(ProbeCheck {
            what: "CUDA P2P between all GPUs (isAllCudaP2p)".into(),
            predicted: match pred {
                Some(State::Met) => "1".into(),
                Some(State::Missing) => "0".into(),
                _ => "?".into(),
            },
            seen: if seen { "1" } else { "0" }.into(),
            agrees: match pred {
                Some(State::Met) => Some(seen),
                Some(State::Missing) => Some(!seen),
                _ => None,
            },
        });
    }
    let ce_predicted = r.families.iter().any(|f| f.predicted == Path::CopyEngine);
    if ce_predicted || nl.init_ce {
        r.checks.push(ProbeCheck {
            what: "NCCL initialised its copy-engine collectives ('Init CE')".into(),
            predicted: if ce_predicted { "yes" } else { "no" }.into(),
            seen: if nl.init_ce { "yes" } else { "no" }.into(),
            agrees: Some(ce_predicted == nl.init_ce),
        });
    }
    let any_false = r.families.iter().any(|f| f.agrees == Some(false))
        || r.checks.iter().any(|c| c.agrees == Some(false));
    let any_none = r.families.iter().any(|f| f.agrees.is_none());
    r.status = if any_false {
        ProbeStatus::Disagreed
    } else if any_none {
        ProbeStatus::Inconclusive
    } else {
        ProbeStatus::Agreed
    };
    if r.status == ProbeStatus::Inconclusive && r.reason.is_none() {
        r.reason = Some("some families could not be judged (see the notes)".into());
    }
    r
}

fn p_badness(p: Path) -> u8 {
    match p {
        Path::Net => 3,
        Path::ShmMemcpy | Path::Shm => 2,
        _ => 1,
    }
}

/// `process.nccl_lib` of the probe's processes (the first).
fn loaded_nccl_lib(run_dir: &FsPath) -> Option<String> {
    let t = reader::read_table(run_dir, "process").ok()?;
    t.batches
        .iter()
        .filter_map(ProcessCols::of)
        .find_map(|v| (0..v.rows).find_map(|i| v.nccl_lib.get(i).map(str::to_owned)))
}

/// Runs the probe (or says plainly why it cannot).
pub fn run(facts: &Facts, report: &Report, opts: &ProbeOptions) -> ProbeResult {
    let symmetric = symmetric_mode(report);
    let not_run = |why: String| ProbeResult::not_run(ProbeStatus::NotRun, why, symmetric);
    if facts.driver.nvml != "loaded" {
        return not_run("cannot run: no usable NVIDIA driver".into());
    }
    if report.visible.len() < 2 {
        return not_run(format!(
            "cannot run: it needs 2 GPUs, {} visible",
            report.visible.len()
        ));
    }
    if facts.python.torch.is_none() {
        return not_run(format!(
            "cannot run: no torch for {} ({})",
            facts.python.interpreter,
            facts.python.error.as_deref().unwrap_or("pip install torch")
        ));
    }
    let shim = match launch::find_shim(opts.shim.clone()) {
        Ok(s) => s,
        Err(e) => return not_run(format!("cannot run: {e}")),
    };
    let (dir, keep) = match &opts.dir {
        Some(d) => (d.clone(), true),
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            (
                std::env::temp_dir().join(format!("zcta-doctor-probe-{}-{nanos}", std::process::id())),
                false,
            )
        }
    };
    // A folder of our own made new (never one that was there, nor a link planted at
    // its name in the shared temporary directory).
    if !keep && let Err(e) = std::fs::create_dir(&dir) {
        return not_run(format!("cannot run: cannot create {}: {e}", dir.display()));
    }
    let failed = |why: String, dir: &FsPath| ProbeResult {
        dir: Some(dir.display().to_string()),
        ..ProbeResult::not_run(ProbeStatus::Failed, why, symmetric)
    };
    let script = dir.join("zcta_probe.py");
    let runs = dir.join("runs");
    let log_path = dir.join("probe.log");
    let log = match make_probe_files(&script, &runs, &log_path) {
        Ok(f) => f,
        Err(why) => return not_run(format!("cannot run: {why}")),
    };
    let log2 = match log.try_clone() {
        Ok(f) => f,
        Err(e) => return not_run(format!("cannot run: {e}")),
    };
    let mut cmd = Command::new(&opts.python);
    cmd.args([
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ])
    .arg(&script)
    .args(["--mib", &opts.mib.to_string()]);
    if symmetric {
        cmd.arg("--symmetric");
    }
    launch::under_shim(&mut cmd, &shim, &runs, RUN_ID);
    // The two GPUs the prediction is about, in NVML (PCI) order.
    let gpus: Vec<String> = report.visible[..2]
        .iter()
        .map(|i| {
            facts
                .gpus
                .iter()
                .find(|g| g.index == *i)
                .and_then(|g| g.uuid.clone())
                .unwrap_or_else(|| i.to_string())
        })
        .collect();
    cmd.env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        .env("CUDA_VISIBLE_DEVICES", gpus.join(","))
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT,ENV,P2P,SHM,NET")
        .env_remove("NCCL_DEBUG_FILE")
        .env_remove("ZCTA_ENABLE")
        .env_remove("ZCTA_CUPTI")
        // The developers' knobs would hide the engines the probe compares.
        .env_remove("ZCTA_CUPTI_KINDS")
        .env_remove("ZCTA_CUPTI_CALLBACKS")
        .env("OMP_NUM_THREADS", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start {}: {e}", opts.python), &dir),
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if started.elapsed() < opts.timeout => std::thread::sleep(Duration::from_millis(100)),
            Ok(None) | Err(_) => break None,
        }
    };
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let Some(status) = status else {
        kill_group(&mut child);
        return failed(
            format!(
                "timed out after {} s (the job and its workers were stopped); log {}",
                opts.timeout.as_secs(),
                log_path.display()
            ),
            &dir,
        );
    };
    if !status.success() {
        let nl = parse_log(&text);
        let tail: Vec<&str> = if nl.probe_lines.is_empty() {
            let v: Vec<&str> = text.lines().filter(|l| !l.contains("NCCL INFO")).collect();
            v[v.len().saturating_sub(6)..].to_vec()
        } else {
            nl.probe_lines.iter().map(String::as_str).collect()
        };
        let mut r = failed(
            format!(
                "the probe job exited with {status}: {}; log {}",
                tail.join(" | "),
                log_path.display()
            ),
            &dir,
        );
        r.nccl_warnings = nl.warnings;
        return r;
    }
    let mut r = judge(facts, report, &runs.join(RUN_ID), &text, symmetric);
    if keep || r.status != ProbeStatus::Agreed {
        r.dir = Some(dir.display().to_string());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r
}

/// Makes the probe's files, each new: the script, the run directory `runs/doctor-probe`
/// (so that no earlier probe's rows are read as this one's) and the log, opened. Err
/// names the file that is already there, or could not be made; nothing that was there
/// before is changed, and nothing made here is left behind then.
fn make_probe_files(script: &FsPath, runs: &FsPath, log_path: &FsPath) -> Result<std::fs::File, String> {
    let run_dir = runs.join(RUN_ID);
    for p in [script, run_dir.as_path(), log_path] {
        if std::fs::symlink_metadata(p).is_ok() {
            return Err(format!(
                "{} already exists and the probe overwrites nothing: remove it, or pass another \
                 --probe-dir",
                p.display()
            ));
        }
    }
    let new_file = |p: &FsPath| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(p)
            .map_err(|e| format!("cannot create {}: {e}", p.display()))
    };
    let mut made: Vec<PathBuf> = Vec::new();
    let done = (|| {
        use std::io::Write as _;
        std::fs::create_dir_all(runs).map_err(|e| format!("cannot create {}: {e}", runs.display()))?;
        std::fs::create_dir(&run_dir).map_err(|e| format!("cannot create {}: {e}", run_dir.display()))?;
        made.push(run_dir.clone());
        let mut f = new_file(script)?;
        made.push(script.to_path_buf());
        f.write_all(PROBE_SCRIPT.as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
        let log = new_file(log_path)?;
        made.push(log_path.to_path_buf());
        Ok(log)
    })();
    if done.is_err() {
        for p in made {
            let _ = std::fs::remove_dir(&p).or_else(|_| std::fs::remove_file(&p));
        }
    }
    done
}

/// Stops the probe's process group (torchrun and its workers): TERM, then KILL.
fn kill_group(child: &mut std::process::Child) {
    let pgid = format!("-{}", child.id());
    let signal = |sig: &str| {
        let _ = Command::new("kill")
            .args([sig, "--", &pgid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    };
    signal("-TERM");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    signal("-KILL");
    let _ = child.wait();
    // Signals arrive asynchronously: give the rest of the group a moment to go.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        let alive = Command::new("kill")
            .args(["-0", "--", &pgid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !alive {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_log_lines() {
        let log = "\
NCCL version 2.28.9+cuda13.0
h:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
h:1:1 [0] NCCL INFO cudaDriverVersion 13000
h:1:1 [0] NCCL INFO Check P2P Type isAllDirectP2p 1 directMode 0 isAllCudaP2p 1
h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
h:1:1 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read
h:1:1 [0] NCCL INFO Init CE, rank 0 baseUCSymReadyPtr 0x1, baseUCSymComplPtr 0x2, seq num 0
h:1:1 [0] NCCL WARN something odd
zcta-probe: rank 0 ok symmetric=1
";
        let l = parse_log(log);
        assert_eq!(l.versions.iter().collect::<Vec<_>>(), vec!["2.28.9"]);
        assert_eq!(l.cuda_driver, Some(13000));
        assert_eq!(l.all_cuda_p2p, Some(true));
        assert!(l.init_ce);
        assert_eq!(l.transports.len(), 2);
        assert_eq!(l.warnings, vec!["something odd".to_string()]);
        assert_eq!(l.probe_lines, vec!["rank 0 ok symmetric=1".to_string()]);
    }

    #[test]
    fn via_tokens() {
        assert_eq!(transport_path("P2P/CUMEM"), Some(Path::NvlinkP2p));
        assert_eq!(transport_path("P2P/CUMEM/read"), Some(Path::NvlinkP2p));
        assert_eq!(transport_path("P2P/CUMEM/CE"), Some(Path::P2pMemcpy));
        assert_eq!(transport_path("P2P/IPC/CE"), Some(Path::P2pMemcpy));
        assert_eq!(transport_path("SHM/direct/direct"), Some(Path::Shm));
        assert_eq!(transport_path("SHM/CE/direct"), Some(Path::ShmMemcpy));
        assert_eq!(transport_path("NET/Socket/0"), Some(Path::Net));
        assert_eq!(transport_path("NET/IB/0/GDRDMA"), Some(Path::Net));
        assert_eq!(transport_path("COLLNET"), None);
    }
}
