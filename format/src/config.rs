//! Settings, all from the environment (the shim has no other input), and the run-id
//! rule that puts every rank of one job into one run directory with no setup.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `ZCTA_ENABLE` | `1` | `0`/`false`/`off`: forward only, record nothing |
//! | `ZCTA_OUT` | `./zcta-runs` | parent of run directories (relative: to where each process started); read by the shim as the bytes it holds (`shim/src/ffi/sys.rs`, `out_dir`), not here |
//! | `ZCTA_RUN_ID` | derived | run directory name |
//! | `ZCTA_NCCL_LIB` | the mapped libnccl | library to forward to |
//! | `ZCTA_FLUSH_MS` | `500` | longest time a record waits before reaching the log |
//! | `ZCTA_QUEUE_CAPACITY` | `32768` | bounded queue length, 1024 … 4194304 (records dropped and counted beyond) |
//! | `ZCTA_EXIT_TIMEOUT_MS` | `5000` | longest wait for the writer at exit (100 ms or more) |
//! | `ZCTA_SEGMENT_ROWS` | `4194304` | rows per Parquet file before rolling |
//! | `ZCTA_SEGMENT_SECS` | `300` | age of a Parquet file before rolling |
//! | `ZCTA_GPU` | `stamps` | GPU side: `stamps` (each op timed with GPU stamps on its stream, under the budget; `events`, its name from when they were CUDA events, is accepted), `deep` (stamps plus CUPTI's kernel and copy records: kernel spans, proxy copies, graph launches), `off` (host rows only) |
//! | `ZCTA_BUDGET` | `1%` | share of wall time GPU timing may cost (`all`: time every op) ([`crate::budget`]) |
//! | `ZCTA_CUPTI` | `1` | `0`/`false`/`off`: in deep mode, no CUPTI (stamps only) |
//! | `ZCTA_CUPTI_LIB` | the mapped libcupti | libcupti to load when none is mapped yet |
//! | `ZCTA_GPU_HOLD_MS` | `1000` | how long an op waits for its GPU side before its row is written |
//! | `ZCTA_SAMPLE` | `all` | `ON/EVERY` (e.g. `1s/10s`): GPU side and NCCL's view only for ops called in those windows ([`crate::sample`]) |
//! | `ZCTA_CUPTI_DEBUG` | unset | `1`: print what CUPTI delivered at exit (read by the shim) |
//! | `ZCTA_PAUSE_CUPTI` | unset | `1`: a pause also switches CUPTI's launch callbacks off (read by the shim) |

use std::time::Duration;

use crate::sink::{GpuPolicy, SinkPolicy};

/// Largest `ZCTA_QUEUE_CAPACITY`. The queues' memory is mapped untouched, so a large
/// capacity costs nothing at the first NCCL call; a slot takes memory once the ring
/// first reaches it: its record rounded up to cache lines plus half a plugin-queue
/// slot (see `shim/src/ffi/queue.rs`), so a process that made that many records holds
/// about 1.9 GB at this maximum.
pub const QUEUE_CAPACITY_MAX: u64 = 4 << 20;

/// Reads one environment variable (injected in tests).
pub type EnvFn<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What is measured on the GPU side (`ZCTA_GPU`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuMode {
    /// Each op timed with GPU stamps on its stream (the default).
    Stamps,
    /// Stamps plus CUPTI's kernel, copy and launch records.
    Deep,
    /// Host rows only.
    Off,
}

impl GpuMode {
    pub fn parse(v: &str) -> Option<GpuMode> {
        match v.trim().to_ascii_lowercase().as_str() {
            // `events`: the name from when they were CUDA events.
            "" | "stamps" | "events" | "on" | "1" => Some(GpuMode::Stamps),
            "deep" => Some(GpuMode::Deep),
            "off" | "0" | "none" => Some(GpuMode::Off),
            _ => None,
        }
    }
}

/// Everything configurable.
#[derive(Clone, Debug)]
pub struct Config {
    pub enabled: bool,
    pub nccl_lib: Option<String>,
    pub queue_capacity: usize,
    pub exit_timeout: Duration,
    pub policy: SinkPolicy,
    /// What is measured on the GPU side (`ZCTA_GPU`).
    pub gpu_mode: GpuMode,
    /// Share of wall time GPU timing may cost (`ZCTA_BUDGET`; infinite: every op).
    pub budget: f64,
    /// GPU capture through CUPTI: deep mode, unless `ZCTA_CUPTI=0`.
    pub cupti: bool,
    pub gpu: GpuPolicy,
    /// Problems with the settings, each to be printed once.
    pub warnings: Vec<String>,
}

impl Config {
    pub fn from_env(env: EnvFn<'_>) -> Config {
        let mut warnings = Vec::new();
        let enabled = switch(env, "ZCTA_ENABLE", &mut warnings);
        let mut num = |name: &str, default: u64, min: u64, max: u64| -> u64 {
            match env(name) {
                None => default,
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if (min..=max).contains(&n) => n,
                    _ => {
                        warnings.push(format!(
                            "{name}={v:?} is not a number in {min}..={max}; using {default}"
                        ));
                        default
                    }
                },
            }
        };
        let flush_ms = num("ZCTA_FLUSH_MS", 500, 10, 1_500);
        let queue_capacity = num("ZCTA_QUEUE_CAPACITY", 32_768, 1_024, QUEUE_CAPACITY_MAX) as usize;
        // Closing every table takes the writer some time: a shorter wait loses rows.
        let exit_ms = num("ZCTA_EXIT_TIMEOUT_MS", 5_000, 100, 600_000);
        let segment_rows = num("ZCTA_SEGMENT_ROWS", 4 << 20, 1, u64::MAX);
        let segment_secs = num("ZCTA_SEGMENT_SECS", 300, 1, 86_400);
        let hold_ms = num("ZCTA_GPU_HOLD_MS", 1_000, 10, 60_000);
        let gpu_mode = match env("ZCTA_GPU") {
            None => GpuMode::Stamps,
            Some(v) => GpuMode::parse(&v).unwrap_or_else(|| {
                warnings.push(format!("ZCTA_GPU={v:?} is not stamps, deep or off; using stamps"));
                GpuMode::Stamps
            }),
        };
        let budget = match env("ZCTA_BUDGET").filter(|v| !v.trim().is_empty()) {
            None => 0.01,
            Some(v) => crate::budget::parse_budget(&v).unwrap_or_else(|| {
                warnings.push(format!(
                    "ZCTA_BUDGET={v:?} is not a percentage in (0, 100] or `all`; using 1%"
                ));
                0.01
            }),
        };
        let cupti_switch = switch(env, "ZCTA_CUPTI", &mut warnings);
        let cupti = gpu_mode == GpuMode::Deep && cupti_switch;
        // Read by the shim itself; their bad values are reported here, once, with what
        // the shim makes of them.
        switch(env, "ZCTA_NCCL_PLUGIN", &mut warnings);
        switch(env, "ZCTA_CUPTI_CALLBACKS", &mut warnings);
        for name in ["ZCTA_NCCL_KERNEL_CH", "ZCTA_PAUSE_CUPTI"] {
            one_only(env, name, true, &mut warnings);
        }
        if env("ZCTA_GPU_READY").is_some_and(|v| !v.trim().is_empty()) {
            warnings.push(
                "ZCTA_GPU_READY is not used any more: gpu_ready_ns comes from each timed op's GPU \
                 stamps (ZCTA_BUDGET=all times every op)"
                    .into(),
            );
        }
        one_only(env, "ZCTA_CUPTI_DEBUG", false, &mut warnings);
        // Read by the shim's plugin itself (quietly: it also runs in processes that
        // never record); the warning for a bad value is given here, once, at activation.
        if let Some(v) = env("ZCTA_NCCL_MASK").filter(|v| !v.trim().is_empty())
            && let Err(e) = parse_mask(&v)
        {
            warnings.push(format!("ZCTA_NCCL_MASK: {e}; using zcta's events"));
        }
        let sampling = match env("ZCTA_SAMPLE").as_deref().map(crate::sample::parse_sampling) {
            None => None,
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                warnings.push(format!("ZCTA_SAMPLE: {e}; every op in full"));
                None
            }
        };
        Config {
            enabled,
            nccl_lib: env("ZCTA_NCCL_LIB").filter(|s| !s.is_empty()),
            queue_capacity,
            exit_timeout: Duration::from_millis(exit_ms),
            policy: SinkPolicy {
                flush_interval: Duration::from_millis(flush_ms),
                segment_rows,
                segment_age: Duration::from_secs(segment_secs),
                ..SinkPolicy::default()
            },
            gpu_mode,
            budget,
            cupti,
            gpu: GpuPolicy {
                hold: Duration::from_millis(hold_ms),
                sampling,
                ..GpuPolicy::default()
            },
            warnings,
        }
    }
}

/// A switch that is on unless turned off (`0`, `false`, `off`, `no`, any case); unset
/// or empty is on. Any other value keeps it on, with a warning.
fn switch(env: EnvFn<'_>, name: &str, warnings: &mut Vec<String>) -> bool {
    let Some(v) = env(name) else { return true };
    let t = v.trim().to_ascii_lowercase();
    if is_off(&t) {
        return false;
    }
    if !matches!(t.as_str(), "" | "1" | "true" | "on" | "yes") {
        warnings.push(format!(
            "{name}={v:?} is not a switch (1/0, true/false, on/off, yes/no); using 1"
        ));
    }
    true
}

/// A setting the shim turns on only for exactly `1` (`trimmed`: surrounding spaces
/// allowed); any other value but `0` or empty gets a warning saying it is off.
fn one_only(env: EnvFn<'_>, name: &str, trimmed: bool, warnings: &mut Vec<String>) {
    let Some(v) = env(name) else { return };
    let t = if trimmed { v.trim() } else { v.as_str() };
    if !matches!(t, "" | "0" | "1") {
        warnings.push(format!("{name}={v:?} is not 0 or 1; using 0"));
    }
}

/// Whether a switch variable's value turns something off (`0`, `false`, `off`, `no`).
pub fn is_off(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "0" | "false" | "off" | "no"
    )
}

/// An NCCL profiler event mask (`ZCTA_NCCL_MASK`): a non-negative integer in decimal
/// or `0x` hex, within the 16 event bits of the profiler API v7 (Group 1 ...
/// KernelLaunch 1 << 11, v6's CeColl/CeSync/CeBatch 1 << 12..14, v7's KernelPhase
/// 1 << 15; an NCCL that loaded an older version ignores the bits it does not know).
pub fn parse_mask(value: &str) -> Result<i32, String> {
    let v = value.trim();
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => i32::from_str_radix(hex, 16),
        None => v.parse::<i32>(),
    };
    match parsed {
        Ok(m) if (0..1 << 16).contains(&m) => Ok(m),
        Ok(m) => Err(format!("{m} is not an event mask (0..=0xffff)")),
        Err(_) => Err(format!("{v:?} is not a number (decimal or 0x hex)")),
    }
}

/// Where a run id came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunIdSource {
    Explicit,
    TorchElastic,
    TorchrunParent,
    Slurm,
    Pmix,
    MpSpawn,
    Time,
}

impl RunIdSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RunIdSource::Explicit => "ZCTA_RUN_ID",
            RunIdSource::TorchElastic => "TORCHELASTIC_RUN_ID",
            RunIdSource::TorchrunParent => "torchrun-parent",
            RunIdSource::Slurm => "SLURM",
            RunIdSource::Pmix => "PMIX_NAMESPACE",
            RunIdSource::MpSpawn => "multiprocessing-parent",
            RunIdSource::Time => "time",
        }
    }
}

/// A run id and its provenance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunId {
    pub id: String,
    pub source: RunIdSource,
    /// Set when the id cannot be shared by other processes of the job.
    pub warning: Option<String>,
}

/// Facts about the process the run-id rule may use besides the environment.
#[derive(Clone, Debug, Default)]
pub struct ProcFacts {
    pub pid: i32,
    pub ppid: i32,
    /// Start time of the parent process (clock ticks since boot, /proc/PPID/stat).
    pub parent_start: Option<u64>,
    pub host: String,
    pub now_ns: i64,
    /// The process is a child started by Python multiprocessing's spawn/forkserver
    /// (`--multiprocessing-fork` on its command line), e.g. `torch.multiprocessing.spawn`.
    pub mp_child: bool,
}

/// Chooses the run id: `ZCTA_RUN_ID`; torchrun's `TORCHELASTIC_RUN_ID` (when it is not
/// torchrun's placeholder `none`); under torchrun without an id, the agent (our
/// parent, shared by the node's ranks) and its start time; SLURM job+step; the PMIx
/// namespace (Open MPI 5, other PMIx launchers); for children of Python
/// multiprocessing (`torch.multiprocessing.spawn`), the parent and its start time;
/// else the time, with a warning.
pub fn derive_run_id(env: EnvFn<'_>, facts: &ProcFacts) -> RunId {
    let get = |k: &str| env(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    if let Some(asked) = get("ZCTA_RUN_ID") {
        let id = sanitize(&asked);
        return RunId {
            warning: (id != asked)
                .then(|| format!("ZCTA_RUN_ID={asked:?} is used as {id:?} (one directory name)")),
            id,
            source: RunIdSource::Explicit,
        };
    }
    if let Some(id) = get("TORCHELASTIC_RUN_ID") {
        if id != "none" {
            return RunId {
                id: sanitize(&format!("torch-{id}")),
                source: RunIdSource::TorchElastic,
                warning: None,
            };
        }
        let port = get("MASTER_PORT").unwrap_or_else(|| "0".into());
        let start = facts.parent_start.unwrap_or(0);
        let multi_node = get("GROUP_WORLD_SIZE")
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(1)
            > 1;
        let warning = multi_node.then(|| {
            "torchrun without --rdzv-id on several nodes: each node gets its own run directory; \
             set ZCTA_RUN_ID or --rdzv-id to join them"
                .to_string()
        });
        return RunId {
            id: sanitize(&format!(
                "torchrun-{}-{}-{}-{}",
                facts.host, port, facts.ppid, start
            )),
            source: RunIdSource::TorchrunParent,
            warning,
        };
    }
    if let Some(job) = get("SLURM_JOB_ID") {
        let step = get("SLURM_STEP_ID").unwrap_or_else(|| "batch".into());
        return RunId {
            id: sanitize(&format!("slurm-{job}.{step}")),
            source: RunIdSource::Slurm,
            warning: None,
        };
    }
    if let Some(ns) = get("PMIX_NAMESPACE") {
        return RunId {
            id: sanitize(&format!("pmix-{ns}")),
            source: RunIdSource::Pmix,
            warning: None,
        };
    }
    if facts.mp_child {
        let start = facts.parent_start.unwrap_or(0);
        return RunId {
            id: sanitize(&format!("mp-{}-{}-{}", facts.host, facts.ppid, start)),
            source: RunIdSource::MpSpawn,
            warning: None,
        };
    }
    let secs = facts.now_ns.div_euclid(1_000_000_000);
    let id = sanitize(&format!("{}-{}-{}", format_utc(secs), facts.host, facts.pid));
    RunId {
        warning: Some(format!(
            "no ZCTA_RUN_ID or launcher job id found; recording to run id {id} (other processes of this job will use other ids)"
        )),
        id,
        source: RunIdSource::Time,
    }
}

/// Keeps run ids usable as one directory name.
pub fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    match out.as_str() {
        "" | "." | ".." => "run".into(),
        _ => out,
    }
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the epoch (UTC), without a date crate.
pub fn format_utc(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Global rank from the launcher's environment, if any.
pub fn rank_from_env(env: EnvFn<'_>) -> Option<i32> {
    [
        "RANK",
        "OMPI_COMM_WORLD_RANK",
        "SLURM_PROCID",
        "PMI_RANK",
        "PMIX_RANK",
    ]
    .iter()
    .find_map(|k| env(k).and_then(|v| v.trim().parse::<i32>().ok()))
}

/// Whether an environment variable belongs in the `process` row.
pub fn is_recorded_env(name: &str) -> bool {
    const PREFIXES: [&str; 5] = ["NCCL_", "ZCTA_", "TORCH_NCCL_", "TORCHELASTIC_", "SLURM_"];
    const NAMES: [&str; 12] = [
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "LD_PRELOAD",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PMIX_NAMESPACE",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name)
}

/// JSON object of the recorded variables among `vars` (sorted by name).
pub fn env_json(vars: impl Iterator<Item = (String, String)>) -> String {
    let mut v: Vec<(String, String)> = vars.filter(|(k, _)| is_recorded_env(k)).collect();
    v.sort();
    let m: serde_json::Map<String, serde_json::Value> = v
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    serde_json::Value::Object(m).to_string()
}

/// The text of NCCL's configuration file `path` (`NCCL_CONF_FILE`, `~/.nccl.conf`,
/// `/etc/nccl.conf`) when it is a regular file (its first MiB): a pipe or a terminal
/// (`NCCL_CONF_FILE=/dev/stdin`) would lose the program its input, opening a FIFO
/// would wait for a writer (or, without blocking, release a writer waiting on it into a
/// closed pipe), and a device such as `/dev/zero` never ends. Anything but a regular
/// file is not opened; should it be swapped for one between that look and the open,
/// the open does not block and the open file is asked again.
pub fn conf_file_text(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(1 << 20).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn event_masks_parse_in_decimal_and_hex_within_the_v5_bits() {
        assert_eq!(parse_mask("0"), Ok(0));
        assert_eq!(parse_mask(" 1598 "), Ok(1598));
        assert_eq!(parse_mask("0x63e"), Ok(0x63e));
        assert_eq!(parse_mask("0X7FF"), Ok(0x7ff));
        assert_eq!(parse_mask("0x800"), Ok(0x800), "KernelLaunch");
        assert_eq!(parse_mask("0x1000"), Ok(0x1000), "CeColl (v6)");
        assert_eq!(parse_mask("0x8000"), Ok(0x8000), "KernelPhase (v7)");
        assert!(parse_mask("0x10000").unwrap_err().contains("not an event mask"));
        assert!(parse_mask("-1").unwrap_err().contains("not an event mask"));
        assert!(parse_mask("coll").unwrap_err().contains("not a number"));
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn facts() -> ProcFacts {
        ProcFacts {
            pid: 10,
            ppid: 9,
            parent_start: Some(1234),
            host: "h1".into(),
            now_ns: 1_764_477_823_000_000_000,
            mp_child: false,
        }
    }

    #[test]
    fn run_id_precedence() {
        let e = env(&[("ZCTA_RUN_ID", "my/run"), ("TORCHELASTIC_RUN_ID", "abc")]);
        assert_eq!(derive_run_id(&e, &facts()).id, "my_run");
        let e = env(&[("TORCHELASTIC_RUN_ID", "abc"), ("SLURM_JOB_ID", "5")]);
        let r = derive_run_id(&e, &facts());
        assert_eq!(
            (r.id.as_str(), r.source),
            ("torch-abc", RunIdSource::TorchElastic)
        );
        let e = env(&[("TORCHELASTIC_RUN_ID", "none"), ("MASTER_PORT", "29500")]);
        let r = derive_run_id(&e, &facts());
        assert_eq!(r.id, "torchrun-h1-29500-9-1234");
        assert!(r.warning.is_none());
        let e = env(&[("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "2")]);
        assert_eq!(derive_run_id(&e, &facts()).id, "slurm-77.2");
        let e = env(&[("PMIX_NAMESPACE", "prterun-x-1@1")]);
        assert_eq!(derive_run_id(&e, &facts()).id, "pmix-prterun-x-1_1");
        let mp = ProcFacts {
            mp_child: true,
            ..facts()
        };
        let r = derive_run_id(&env(&[]), &mp);
        assert_eq!((r.id.as_str(), r.source), ("mp-h1-9-1234", RunIdSource::MpSpawn));
        let mp = ProcFacts {
            mp_child: true,
            ..facts()
        };
        let r = derive_run_id(&env(&[]), &mp);
        assert_eq!((r.id.as_str(), r.source), ("mp-h1-9-1234", RunIdSource::MpSpawn));
        let r = derive_run_id(&env(&[]), &facts());
        assert_eq!(r.source, RunIdSource::Time);
        assert_eq!(r.id, "20251130T044343Z-h1-10");
        assert!(r.warning.is_some());
    }

    #[test]
    fn torchrun_multi_node_without_id_warns() {
        let e = env(&[("TORCHELASTIC_RUN_ID", "none"), ("GROUP_WORLD_SIZE", "2")]);
        assert!(derive_run_id(&e, &facts()).warning.is_some());
    }

    #[test]
    fn bad_numbers_warn_and_default() {
        let e = env(&[
            ("ZCTA_FLUSH_MS", "abc"),
            ("ZCTA_QUEUE_CAPACITY", "5"),
            ("ZCTA_ENABLE", "0"),
        ]);
        let c = Config::from_env(&e);
        assert!(!c.enabled);
        assert_eq!(c.policy.flush_interval, Duration::from_millis(500));
        assert_eq!(c.queue_capacity, 32_768);
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        let c = Config::from_env(&env(&[("ZCTA_NCCL_MASK", "coll")]));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].starts_with("ZCTA_NCCL_MASK"), "{:?}", c.warnings);
        for quiet in ["", " ", "0x202"] {
            let c = Config::from_env(&env(&[("ZCTA_NCCL_MASK", quiet)]));
            assert!(c.warnings.is_empty(), "{quiet:?}: {:?}", c.warnings);
        }
        let c = Config::from_env(&env(&[("ZCTA_SAMPLE", "1s")]));
        assert_eq!(c.gpu.sampling, None);
        assert!(c.warnings[0].starts_with("ZCTA_SAMPLE"), "{:?}", c.warnings);
        let c = Config::from_env(&env(&[("ZCTA_SAMPLE", "1s/10s")]));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.gpu.sampling.map(|s| s.every), Some(Duration::from_secs(10)));
    }

    #[test]
    fn queue_capacity_is_bounded() {
        let c = Config::from_env(&env(&[("ZCTA_QUEUE_CAPACITY", "4194304")]));
        assert_eq!((c.queue_capacity, c.warnings.len()), (4 << 20, 0));
        let c = Config::from_env(&env(&[("ZCTA_QUEUE_CAPACITY", "16777216")]));
        assert_eq!(c.queue_capacity, 32_768);
        assert!(
            c.warnings[0].starts_with("ZCTA_QUEUE_CAPACITY"),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn every_setting_is_checked_with_one_warning() {
        // An exit wait of 0 ms closed no file: calls and comms rows were lost.
        let c = Config::from_env(&env(&[("ZCTA_EXIT_TIMEOUT_MS", "0")]));
        assert_eq!(c.exit_timeout, Duration::from_millis(5_000));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(
            c.warnings[0].starts_with("ZCTA_EXIT_TIMEOUT_MS"),
            "{:?}",
            c.warnings
        );
        let c = Config::from_env(&env(&[("ZCTA_EXIT_TIMEOUT_MS", "100")]));
        assert_eq!(
            (c.exit_timeout, c.warnings.len()),
            (Duration::from_millis(100), 0)
        );
        // `events` is the default's older name (from when it used CUDA events).
        for (v, mode) in [
            ("stamps", GpuMode::Stamps),
            ("events", GpuMode::Stamps),
            (" Stamps ", GpuMode::Stamps),
            ("deep", GpuMode::Deep),
            ("off", GpuMode::Off),
        ] {
            let c = Config::from_env(&env(&[("ZCTA_GPU", v)]));
            assert_eq!((c.gpu_mode, c.warnings.len()), (mode, 0), "ZCTA_GPU={v:?}");
        }
        for (name, bad) in [
            ("ZCTA_ENABLE", "banana"),
            ("ZCTA_CUPTI", "maybe"),
            ("ZCTA_NCCL_PLUGIN", "2"),
            ("ZCTA_CUPTI_CALLBACKS", "none"),
            ("ZCTA_NCCL_KERNEL_CH", "yes"),
            ("ZCTA_PAUSE_CUPTI", "on"),
            ("ZCTA_CUPTI_DEBUG", " 1"),
            ("ZCTA_GPU", "fast"),
            ("ZCTA_BUDGET", "lots"),
        ] {
            let c = Config::from_env(&env(&[(name, bad)]));
            assert_eq!(c.warnings.len(), 1, "{name}={bad}: {:?}", c.warnings);
            assert!(
                c.warnings[0].starts_with(&format!("{name}={bad:?}")),
                "{:?}",
                c.warnings
            );
            assert!(
                c.enabled && c.gpu_mode == GpuMode::Stamps && c.budget == 0.01,
                "{name}={bad}: the default stays"
            );
        }
        for (name, on) in [("ZCTA_ENABLE", true), ("ZCTA_CUPTI", false)] {
            for v in ["0", "false", "OFF", "no", "1", "true", "On", "YES", "", " 1 "] {
                // ZCTA_CUPTI matters in deep mode only.
                let c = Config::from_env(&env(&[(name, v), ("ZCTA_GPU", "deep")]));
                assert!(c.warnings.is_empty(), "{name}={v:?}: {:?}", c.warnings);
                let want = !is_off(v);
                assert_eq!(if on { c.enabled } else { c.cupti }, want, "{name}={v:?}");
            }
        }
        for name in ["ZCTA_NCCL_KERNEL_CH", "ZCTA_PAUSE_CUPTI", "ZCTA_CUPTI_DEBUG"] {
            for v in ["0", "1", ""] {
                assert!(
                    Config::from_env(&env(&[(name, v)])).warnings.is_empty(),
                    "{name}={v:?}"
                );
            }
        }
        // A setting that no longer exists is named, not silently ignored.
        let c = Config::from_env(&env(&[("ZCTA_GPU_READY", "1")]));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("ZCTA_GPU_READY is not used any more"));
        let e = env(&[("ZCTA_RUN_ID", "a/b")]);
        let r = derive_run_id(&e, &facts());
        assert_eq!(r.id, "a_b");
        assert!(
            r.warning.as_deref().is_some_and(|w| w.contains("\"a_b\"")),
            "{r:?}"
        );
        assert!(
            derive_run_id(&env(&[("ZCTA_RUN_ID", "ok.1")]), &facts())
                .warning
                .is_none()
        );
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "19700101T000000Z");
        assert_eq!(format_utc(951_782_400), "20000229T000000Z");
    }

    #[test]
    fn recorded_env() {
        assert!(is_recorded_env("NCCL_P2P_DISABLE"));
        assert!(is_recorded_env("RANK"));
        assert!(!is_recorded_env("HOME"));
    }
}
