//! From [`Facts`] to verdicts, with no I/O: which path each collective family takes
//! here, which copy-engine conditions are met or missing (and who decides each: the
//! machine or the program), which requests in the environment cannot be honoured, and
//! the fixes. The copy-engine rules are those of the NCCL a torch process loads: the
//! ones that differ between releases come from the table in [`crate::nccl_rules`],
//! which cites each release's source as `tag:file:line`; a reference without a tag is
//! to `v2.28.9-1` and holds unchanged through the newest release checked.
//! docs/doctor.md lists them.

use serde::{Deserialize, Serialize};

use super::env::{self, Setting};
use super::facts::{Facts, Gpu, Pair};
use crate::nccl_rules::{Basis, NcclRules, Rule, parse_version};

/// Exit status: a setting in the environment asks for a path NCCL cannot take here.
pub const EXIT_REQUEST_IMPOSSIBLE: u8 = 3;
/// Exit status: `--probe` could not run, or saw another path than predicted.
pub const EXIT_PROBE: u8 = 4;

/// Collective families, as a user thinks of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Family {
    AllReduce,
    AllGather,
    ReduceScatter,
    /// `ncclAlltoAll` and grouped `ncclSend`/`ncclRecv`.
    AlltoAll,
    Broadcast,
}

impl Family {
    pub const ALL: [Family; 5] = [
        Family::AllReduce,
        Family::AllGather,
        Family::ReduceScatter,
        Family::AlltoAll,
        Family::Broadcast,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::AllReduce => "AllReduce",
            Family::AllGather => "AllGather",
            Family::ReduceScatter => "ReduceScatter",
            Family::AlltoAll => "AlltoAll/Send-Recv",
            Family::Broadcast => "Broadcast",
        }
    }

    /// The NCCL calls and the torch.distributed functions that reach them.
    pub fn calls(self) -> &'static str {
        match self {
            Family::AllReduce => "ncclAllReduce (dist.all_reduce)",
            Family::AllGather => "ncclAllGather (dist.all_gather_into_tensor)",
            Family::ReduceScatter => "ncclReduceScatter (dist.reduce_scatter_tensor)",
            Family::AlltoAll => {
                "ncclAlltoAll (all_to_all_single, equal splits); ncclSend/ncclRecv (unequal splits, all_to_all, isend/irecv)"
            }
            Family::Broadcast => "ncclBroadcast (dist.broadcast)",
        }
    }

    /// `ncclCeImplemented` (src/ce_coll.cc:82-99): AllGather, AlltoAll, Gather and
    /// Scatter only.
    pub fn ce_capable(self) -> bool {
        matches!(self, Family::AllGather | Family::AlltoAll)
    }

    /// The family of an `ops.op` value.
    pub fn of_op(op: &str) -> Option<Family> {
        Some(match op {
            "AllReduce" => Family::AllReduce,
            "AllGather" => Family::AllGather,
            "ReduceScatter" => Family::ReduceScatter,
            "AlltoAll" | "Send" | "Recv" => Family::AlltoAll,
            "Broadcast" | "Bcast" => Family::Broadcast,
            _ => return None,
        })
    }
}

/// A data path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Path {
    /// No kernel: `cuStreamBatchMemOp` flag syncs + `cudaMemcpyBatchAsync` (zero-CTA).
    CopyEngine,
    /// NCCL kernels load/store the peer's memory over NVLink (`via P2P/CUMEM`).
    NvlinkP2p,
    /// Same over PCIe.
    PcieP2p,
    /// Kernels, plus NCCL's proxy thread `cudaMemcpyAsync` into the peer
    /// (`NCCL_P2P_USE_CUDA_MEMCPY=1`, `via P2P/CUMEM/CE`).
    P2pMemcpy,
    /// Kernels read and write host shared memory (`via SHM/direct/direct`).
    Shm,
    /// SHM with proxy-thread copies (`NCCL_SHM_USE_CUDA_MEMCPY=1`, `via SHM/CE/…`).
    ShmMemcpy,
    /// Kernels stage in host memory, the proxy thread sends (`via NET/…`).
    Net,
    /// A one-rank communicator: a local copy, nothing crosses GPUs.
    LocalCopy,
    /// No usable GPU.
    NoGpu,
    Unknown,
}

impl Path {
    pub fn label(self) -> &'static str {
        match self {
            Path::CopyEngine => "copy engine (zero-CTA, no kernel)",
            Path::NvlinkP2p => "SM kernels over NVLink P2P",
            Path::PcieP2p => "SM kernels over PCIe P2P",
            Path::P2pMemcpy => "SM kernels + proxy cudaMemcpy over P2P",
            Path::Shm => "SM kernels via host shared memory (SHM)",
            Path::ShmMemcpy => "SHM + proxy cudaMemcpy",
            Path::Net => "SM kernels + network proxy (NET)",
            Path::LocalCopy => "local copy (one GPU)",
            Path::NoGpu => "none (no usable GPU)",
            Path::Unknown => "unknown",
        }
    }

    /// Worst first: the pair that bounds a ring.
    fn badness(self) -> u8 {
        match self {
            Path::Unknown => 9,
            Path::NoGpu => 8,
            Path::Net => 7,
            Path::ShmMemcpy => 6,
            Path::Shm => 5,
            Path::P2pMemcpy => 4,
            Path::PcieP2p => 3,
            Path::NvlinkP2p => 2,
            Path::CopyEngine => 1,
            Path::LocalCopy => 0,
        }
    }
}

/// Who decides a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    /// Hardware, driver, installed libraries, environment and NCCL configuration.
    Machine,
    /// The code of the job (how buffers are allocated, which stream, which call).
    Program,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Met,
    Missing,
    /// Not knowable from the facts (no NVML, no library found, …).
    Unknown,
    /// A program condition: the program must meet it (`--probe` does).
    ProgramMust,
}

/// One condition of the copy-engine path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    pub key: String,
    pub what: String,
    pub decided_by: Decider,
    pub state: State,
    pub evidence: String,
    pub fix: Option<String>,
    /// Where NCCL's source says so (`tag:file:line`; without a tag, `v2.28.9-1`), or
    /// the measurement that showed it (docs/dev/data-paths.md).
    pub source: String,
}

/// The transport between one pair of GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairPath {
    pub a: u32,
    pub b: u32,
    pub path: Path,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transport {
    /// The slowest pair's path (what bounds a ring), or the one-GPU / no-GPU cases.
    pub path: Path,
    pub why: String,
    pub pairs: Vec<PairPath>,
    /// More than one node: what carries the inter-node part.
    pub inter_node: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FamilyVerdict {
    pub family: Family,
    pub calls: String,
    pub ce_capable: bool,
    /// The path here for a program that meets every program condition.
    pub path: Path,
    /// When `path` is the copy engine: the path when the program does not.
    pub fallback: Option<Path>,
    /// One line: why (not) the copy engine.
    pub copy_engine: String,
    pub notes: Vec<String>,
}

/// A setting that asks NCCL for a path, and whether it can be honoured here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub setting: String,
    pub asks: String,
    /// `None`: cannot tell from the facts.
    pub honoured: Option<bool>,
    pub why: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Something that stops NCCL (or the GPU) from working here.
    Error,
    /// Something that can change the path or break a job.
    Warning,
    Info,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warning => "warning",
            Level::Info => "info",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub level: Level,
    pub what: String,
    pub fix: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The NCCL release whose copy-engine rules these verdicts follow, and why.
    pub nccl_rules: NcclRules,
    /// NVML indices of the GPUs a job started here can use.
    pub visible: Vec<u32>,
    pub transport: Transport,
    /// The copy-engine conditions (machine ones first).
    pub copy_engine: Vec<Condition>,
    pub families: Vec<FamilyVerdict>,
    pub requests: Vec<Request>,
    pub findings: Vec<Finding>,
    /// The verdict in a few sentences (the table's first section).
    pub summary: Vec<String>,
    /// Every fix, deduplicated: requests first, then errors, missing machine
    /// conditions, the program's part, warnings.
    pub fixes: Vec<String>,
    /// 0, or [`EXIT_REQUEST_IMPOSSIBLE`].
    pub exit_code: u8,
}

/// The torch 2.11 recipe for symmetric windows on a side stream
/// (docs/dev/data-paths.md, "The copy-engine path").
pub const TORCH_RECIPE: &str = "after init_process_group(\"nccl\", device_id=dev): b = dist.group.WORLD._get_backend(dev); \
allocate both tensors under torch.cuda.use_mem_pool(torch.cuda.MemPool(b.mem_allocator)); \
register each with ncclCommWindowRegister(c_void_p(b._comm_ptr()), ptr, nbytes, byref(handle), 1) \
(1 = NCCL_WIN_COLL_SYMMETRIC) via ctypes on libnccl.so.2; run the collective under \
`with torch.cuda.stream(side):` (a non-default stream)";

/// NCCL's path types (src/graph/topo.h:62-98), for the P2P level rule.
const PATH_LOC: i32 = 0;
const PATH_NVL: i32 = 1;
const PATH_NVB: i32 = 2;
const PATH_PIX: i32 = 4;
const PATH_PXB: i32 = 5;
const PATH_PHB: i32 = 8;
const PATH_SYS: i32 = 9;
/// `topoPathTypeStr` (src/graph/topo.cc:26).
const PATH_NAMES: [&str; 12] = [
    "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS",
];

fn src_of(s: &Setting) -> String {
    format!("{}={} ({})", s.name, s.value, s.source)
}

/// The settings that steer the transport, read as NCCL reads them.
struct EnvView<'a> {
    settings: &'a [Setting],
    /// User P2P level and the setting it came from (`ncclGetLevel`, graph/paths.cc:217).
    p2p_level: Option<(i32, String)>,
    shm_disable: bool,
    p2p_memcpy: bool,
    shm_memcpy: bool,
    ignore_disabled_p2p: i64,
}

impl<'a> EnvView<'a> {
    fn new(settings: &'a [Setting]) -> Self {
        let get = |n: &str| env::get(settings, n);
        // NCCL_P2P_DISABLE counts only when strtol gives exactly 1; otherwise
        // NCCL_P2P_LEVEL: a name of topoPathTypeStr, or an old-style number.
        let mut p2p_level = get("NCCL_P2P_DISABLE")
            .filter(|s| env::strtoll(&s.value).value == Some(1))
            .map(|s| (PATH_LOC, src_of(s)));
        if p2p_level.is_none()
            && let Some(s) = get("NCCL_P2P_LEVEL")
        {
            let by_name = PATH_NAMES.iter().position(|n| *n == s.value).map(|i| i as i32);
            let old = || {
                s.value.starts_with(|c: char| c.is_ascii_digit()).then(|| {
                    const OLD: [i32; 6] = [PATH_LOC, PATH_PIX, PATH_PXB, PATH_PHB, PATH_SYS, PATH_SYS];
                    let v = env::strtoll(&s.value).value.unwrap_or(5).clamp(0, 5);
                    OLD[v as usize]
                })
            };
            p2p_level = by_name.or_else(old).map(|l| (l, src_of(s)));
        }
        EnvView {
            settings,
            p2p_level,
            shm_disable: env::nccl_param(settings, "NCCL_SHM_DISABLE", 0) == 1,
            p2p_memcpy: env::nccl_param(settings, "NCCL_P2P_USE_CUDA_MEMCPY", 0) != 0,
            shm_memcpy: env::nccl_param(settings, "NCCL_SHM_USE_CUDA_MEMCPY", 0) != 0,
            ignore_disabled_p2p: env::nccl_param(settings, "NCCL_IGNORE_DISABLED_P2P", 0),
        }
    }
    fn get(&self, n: &str) -> Option<&'a Setting> {
        env::get(self.settings, n)
    }
}

/// GPUs a job can use: all NVML GPUs, or the ones `CUDA_VISIBLE_DEVICES` (from the
/// environment) names. Integers are taken as NVML indices (CUDA's default order
/// equals PCI order for identical GPUs); `GPU-…` as UUID prefixes. As in CUDA, the
/// list stops at the first entry that names no GPU.
pub fn visible_gpus(f: &Facts) -> (Vec<u32>, Option<String>) {
    let all: Vec<u32> = f.gpus.iter().map(|g| g.index).collect();
    let Some(s) = env::get(&f.settings, "CUDA_VISIBLE_DEVICES").filter(|s| s.source == "environment") else {
        return (all, None);
    };
    let mut out = Vec::new();
    for item in s.value.split(',').map(str::trim) {
        let hit = if item.starts_with("GPU-") {
            f.gpus
                .iter()
                .find(|g| g.uuid.as_deref().is_some_and(|u| u.starts_with(item)))
                .map(|g| g.index)
        } else {
            item.parse::<u32>().ok().filter(|i| all.contains(i))
        };
        match hit {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    let note = format!(
        "CUDA_VISIBLE_DEVICES={} leaves {} of {} GPUs",
        s.value,
        out.len(),
        all.len()
    );
    (out, Some(note))
}

fn nvlinks_between(a: &Gpu, b: &Gpu) -> usize {
    let count = |x: &Gpu, y: &Gpu| {
        x.nvlinks
            .iter()
            .filter(|l| l.remote_bus_id.is_some() && l.remote_bus_id == y.bus_id)
            .count()
    };
    count(a, b).max(count(b, a))
}

/// NVLinks of `g` that end at an NVSwitch (a PCI function of class 0x0680, or any far
/// end that is not one of the GPUs).
fn switch_links(f: &Facts, g: &Gpu) -> usize {
    g.nvlinks
        .iter()
        .filter(|l| {
            let Some(r) = l.remote_bus_id.as_deref() else {
                return false;
            };
            !f.gpus.iter().any(|o| o.bus_id.as_deref() == Some(r))
        })
        .count()
}

fn ok(s: &Option<String>) -> Option<bool> {
    s.as_deref().map(|s| s == "ok")
}

/// NVML read and write P2P both ok: NCCL's `cudaP2p` (graph/paths.cc, ncclTopoCheckP2p).
fn cuda_p2p(p: &Pair) -> Option<bool> {
    Some(ok(&p.p2p_read)? && ok(&p.p2p_write)?)
}

fn find_pair(f: &Facts, a: u32, b: u32) -> Option<&Pair> {
    f.pairs
        .iter()
        .find(|p| (p.a == a && p.b == b) || (p.a == b && p.b == a))
}

/// NCCL's path type between two GPUs, from NVLink and NVML's common ancestor.
fn path_type(f: &Facts, a: &Gpu, b: &Gpu, pair: Option<&Pair>) -> Option<(i32, String)> {
    let direct = nvlinks_between(a, b);
    if direct > 0 {
        return Some((PATH_NVL, format!("NV{direct} ({direct} NVLinks)")));
    }
    let via_switch = switch_links(f, a) > 0 && switch_links(f, b) > 0;
    if via_switch || pair.and_then(|p| ok(&p.p2p_nvlink)) == Some(true) {
        return Some((PATH_NVL, "NVLink through NVSwitch".into()));
    }
    let t = pair?.topology.as_deref()?;
    let (l, smi) = match t {
        "internal" | "single" => (PATH_PIX, "PIX"),
        "multiple" => (PATH_PXB, "PXB"),
        "hostbridge" => (PATH_PHB, "PHB"),
        "node" => (PATH_PHB, "NODE"),
        "system" => (PATH_SYS, "SYS"),
        _ => return None,
    };
    Some((l, format!("PCIe, {smi} in nvidia-smi topo -m")))
}

/// Whether NCCL's P2P transport connects a pair, and why not.
enum P2p {
    Yes,
    Off(String),
    Unknown(String),
}

fn pair_path(
    f: &Facts,
    ev: &EnvView<'_>,
    a: &Gpu,
    b: &Gpu,
    nvisible: usize,
    findings: &mut Vec<Finding>,
) -> PairPath {
    let pair = find_pair(f, a.index, b.index);
    let mk = |path: Path, why: String| PairPath {
        a: a.index,
        b: b.index,
        path,
        why,
    };
    let pt = path_type(f, a, b, pair);
    // P2P level: the user's, else PXB; SYS for x86 AMD CPUs with ≤ 2 GPUs
    // (graph/paths.cc, ncclTopoCheckP2p).
    let amd = f.host.cpu_vendor.as_deref() == Some("AuthenticAMD")
        && f.host.cpu_arch.as_deref().is_none_or(|a| a == "x86_64");
    let (level, level_why) = match &ev.p2p_level {
        Some((l, why)) => (*l, why.clone()),
        None if amd && nvisible <= 2 => (
            PATH_SYS,
            "SYS (NCCL's default for AMD CPUs with ≤ 2 GPUs)".to_owned(),
        ),
        None => (PATH_PXB, "PXB (NCCL's default)".to_owned()),
    };
    let status = pair.map(|p| (p, cuda_p2p(p)));
    let p2p = if level == PATH_LOC {
        P2p::Off(format!("P2P off: {level_why}"))
    } else {
        match (&pt, status) {
            (None, _) => P2p::Unknown("unknown: no topology from NVML".to_owned()),
            (Some((t, _)), _) if *t > level => P2p::Off(format!(
                "P2P off: GPUs are {} apart, beyond the P2P level {level_why}",
                PATH_NAMES[*t as usize]
            )),
            (Some(_), None | Some((_, None))) => P2p::Unknown("unknown: NVML gave no P2P status".to_owned()),
            (Some((t, _)), Some((p, Some(false)))) => {
                if *t <= PATH_NVB && ev.ignore_disabled_p2p == 0 {
                    findings.push(Finding {
                        level: Level::Error,
                        what: format!(
                            "GPU{} and GPU{} are NVLink-connected but NVML reports P2P read {}, write {}: NCCL refuses to start ('P2P is disabled between NVLINK connected GPUs', graph/paths.cc)",
                            a.index,
                            b.index,
                            p.p2p_read.as_deref().unwrap_or("?"),
                            p.p2p_write.as_deref().unwrap_or("?")
                        ),
                        fix: Some("check the GPUs and the fabric manager (nvidia-smi -q, nvidia-smi topo -p2p rw); NCCL_IGNORE_DISABLED_P2P=1 proceeds without P2P".into()),
                    });
                }
                P2p::Off(format!(
                    "P2P off: NVML P2P read {}, write {}",
                    p.p2p_read.as_deref().unwrap_or("?"),
                    p.p2p_write.as_deref().unwrap_or("?")
                ))
            }
            (Some(_), Some((_, Some(true)))) => P2p::Yes,
        }
    };
    let topo = pt
        .as_ref()
        .map_or("topology unknown".to_owned(), |(_, s)| s.clone());
    match p2p {
        P2p::Yes if ev.p2p_memcpy => mk(
            Path::P2pMemcpy,
            format!(
                "{topo}; {} (p2p.cc:115)",
                src_of(ev.get("NCCL_P2P_USE_CUDA_MEMCPY").unwrap_or(&Setting::default()))
            ),
        ),
        P2p::Yes => {
            let nvl = pt.as_ref().is_some_and(|(t, _)| *t <= PATH_NVB);
            mk(
                if nvl { Path::NvlinkP2p } else { Path::PcieP2p },
                format!("{topo}; CUDA P2P ok"),
            )
        }
        P2p::Unknown(why) => mk(Path::Unknown, why),
        P2p::Off(why) if ev.shm_disable => mk(
            Path::Net,
            format!(
                "{why}; {} (shm.cc:65)",
                src_of(ev.get("NCCL_SHM_DISABLE").unwrap_or(&Setting::default()))
            ),
        ),
        P2p::Off(why) if ev.shm_memcpy => mk(
            Path::ShmMemcpy,
            format!(
                "{why}; {} (shm.cc:66)",
                src_of(ev.get("NCCL_SHM_USE_CUDA_MEMCPY").unwrap_or(&Setting::default()))
            ),
        ),
        P2p::Off(why) => mk(Path::Shm, why),
    }
}

fn transport(f: &Facts, ev: &EnvView<'_>, visible: &[u32], findings: &mut Vec<Finding>) -> Transport {
    let inter_node = (f.nodes.count > 1).then(|| {
        let net = ev
            .get("NCCL_NET")
            .map(|s| format!("{} chosen by {}", s.value, src_of(s)));
        let ib_off = env::nccl_param(ev.settings, "NCCL_IB_DISABLE", 0) == 1;
        net.unwrap_or_else(|| {
            if !f.host.ib_devices.is_empty() && !ib_off {
                format!("IB ({})", f.host.ib_devices.join(", "))
            } else if ib_off {
                "Socket (NCCL_IB_DISABLE=1)".into()
            } else {
                "Socket (no InfiniBand/RoCE device in /sys/class/infiniband)".into()
            }
        })
    });
    let none = |path: Path, why: String| Transport {
        path,
        why,
        pairs: Vec::new(),
        inter_node: inter_node.clone(),
    };
    if f.driver.nvml != "loaded" {
        return none(
            Path::NoGpu,
            format!("no usable NVIDIA driver (NVML {})", f.driver.nvml),
        );
    }
    if visible.is_empty() {
        return none(Path::NoGpu, "no GPU visible to a job".into());
    }
    if visible.len() == 1 {
        return none(
            Path::LocalCopy,
            "one GPU: a one-rank communicator copies locally (ncclLaunchOneRank, enqueue.cc:2570)".into(),
        );
    }
    let gpus: Vec<&Gpu> = visible
        .iter()
        .filter_map(|i| f.gpus.iter().find(|g| g.index == *i))
        .collect();
    let mut pairs = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            pairs.push(pair_path(f, ev, a, b, gpus.len(), findings));
        }
    }
    let worst = pairs
        .iter()
        .max_by_key(|p| p.path.badness())
        .map_or(Path::Unknown, |p| p.path);
    let mixed = pairs.iter().any(|p| p.path != worst);
    let why = match pairs.iter().find(|p| p.path == worst) {
        Some(p) if mixed => format!("slowest pair GPU{}-GPU{}: {}", p.a, p.b, p.why),
        Some(p) => p.why.clone(),
        None => String::new(),
    };
    Transport {
        path: worst,
        why,
        pairs,
        inter_node,
    }
}

fn cuda_str(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The effective `NCCL_CTA_POLICY`, read as the judged NCCL reads it: (the policy,
/// whether NCCL takes the value, the setting). A value NCCL does not take is policy 0
/// before 2.29 (`init.cc:1785`); from 2.29 on NCCL ignores it, and the communicator's
/// own policy (default 0) stays.
fn cta_policy<'a>(settings: &'a [Setting], rules: &NcclRules) -> Option<(i64, bool, &'a Setting)> {
    let s = env::get(settings, "NCCL_CTA_POLICY").filter(|s| !s.value.is_empty())?;
    if rules.has(Rule::CtaPolicyFlags) {
        let p = cta_policy_flags(&s.value);
        return Some((p.unwrap_or(0), p.is_some(), s));
    }
    let t = env::strtoll(&s.value);
    let v = t.value.unwrap_or(i64::MIN);
    // init.cc:1785: outside NCCL_CTA_POLICY_DEFAULT..=NCCL_CTA_POLICY_ZERO → default.
    let valid = t.digits && (0..=2).contains(&v);
    Some((if valid { v } else { 0 }, valid, s))
}

/// `getEnvCtaPolicyOnce` from 2.29 on: a leading digit 0, 1 or 2 (the rest of the value
/// unread; another digit is ignored), else `DEFAULT`, `EFFICIENCY`, `ZERO` (any case)
/// joined by `|`, unknown names skipped; ZERO wins over EFFICIENCY. `None`: ignored.
fn cta_policy_flags(v: &str) -> Option<i64> {
    let p = match v.as_bytes().first() {
        Some(c) if c.is_ascii_digit() => match c {
            b'0' => 0,
            b'1' => 1,
            b'2' => 2,
            _ => return None,
        },
        _ => {
            let mut acc = None;
            for t in v.split('|').filter(|t| !t.is_empty()) {
                let bit = match t.to_ascii_uppercase().as_str() {
                    "DEFAULT" => 0,
                    "EFFICIENCY" => 1,
                    "ZERO" => 2,
                    _ => continue,
                };
                acc = Some(acc.unwrap_or(0) | bit);
            }
            acc?
        }
    };
    Some(if p == 3 { 2 } else { p })
}

/// The program's part of the copy-engine path, as phrases: (for "taken when your
/// program …", for "your program must …").
fn program_musts(rules: &NcclRules, ce: &[Condition], nodes: u32) -> (String, String) {
    // Across nodes the hierarchical copy engine wants both buffers in windows.
    let both = rules.has(Rule::BothWindows) || (rules.has(Rule::HierarchicalCe) && nodes > 1);
    let mut when = vec![if both {
        "registers both buffers as symmetric windows"
    } else {
        "registers the receive buffer as a symmetric window"
    }];
    let mut must = vec![if both {
        "put both buffers in symmetric windows"
    } else {
        "put the receive buffer in a symmetric window"
    }];
    when.push("issues on a non-default stream");
    must.push("use a non-default stream");
    if ce
        .iter()
        .any(|c| c.key == "cta_policy" && c.state == State::ProgramMust)
    {
        when.push("asks for CTA policy ZERO (ncclCollConfig_t.CTAPolicy or ncclConfig_t.CTAPolicy)");
        must.push("ask for CTA policy ZERO (per collective: ncclCollConfig_t.CTAPolicy; per communicator: ncclConfig_t.CTAPolicy)");
    }
    let join = |v: &[&str]| match v {
        [.., last] if v.len() > 1 => format!("{} and {last}", v[..v.len() - 1].join(", ")),
        _ => v.join(""),
    };
    (join(&when), join(&must))
}

/// Whether NCCL sends AllGather by copy engine here without CTA policy ZERO (2.29+):
/// `Ok(threshold)` when it does, else why not (`None` when the release has no such rule).
fn auto_ce_allgather(f: &Facts, visible: &[u32], rules: &NcclRules) -> Option<Result<i64, String>> {
    if !rules.has(Rule::AutoCeAllGather) {
        return None;
    }
    let gpus: Vec<&Gpu> = visible
        .iter()
        .filter_map(|i| f.gpus.iter().find(|g| g.index == *i))
        .collect();
    if gpus.len() < 2 {
        return Some(Err("fewer than two GPUs".into()));
    }
    let cc: Vec<Option<u32>> = gpus
        .iter()
        .map(|g| {
            g.compute_capability
                .as_deref()
                .and_then(|c| c.split('.').next()?.parse().ok())
        })
        .collect();
    if cc.iter().any(Option::is_none) {
        return Some(Err("compute capability unknown".into()));
    }
    if let Some(g) = gpus.iter().zip(&cc).find(|(_, c)| c.unwrap_or(0) < 10) {
        return Some(Err(format!(
            "GPU{} is compute capability {}, it needs sm100+",
            g.0.index,
            g.0.compute_capability.as_deref().unwrap_or("?")
        )));
    }
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            if path_type(f, a, b, find_pair(f, a.index, b.index)).map(|(t, _)| t) != Some(PATH_NVL) {
                return Some(Err(format!(
                    "GPU{}-GPU{} is not NVLink, it needs NVLink between every pair",
                    a.index, b.index
                )));
            }
        }
    }
    Some(Ok(env::nccl_param(&f.settings, "NCCL_SYM_CE_THRESHOLD", 8 << 20)))
}

#[allow(clippy::too_many_lines)]
fn copy_engine_conditions(f: &Facts, visible: &[u32], rules: &NcclRules) -> Vec<Condition> {
    let mut v = Vec::new();
    let mut add =
        |key: &str, what: &str, decided_by, state, evidence: String, fix: Option<&str>, source: &str| {
            v.push(Condition {
                key: key.into(),
                what: what.into(),
                decided_by,
                state,
                evidence,
                fix: (state != State::Met).then(|| fix.map(str::to_owned)).flatten(),
                source: source.into(),
            });
        };
    use Decider::{Machine, Program};
    let driver_ok = f.driver.nvml == "loaded";
    // GPUs.
    let (st, ev) = if !driver_ok {
        (
            State::Missing,
            format!("no usable NVIDIA driver (NVML {})", f.driver.nvml),
        )
    } else if visible.len() >= 2 || f.nodes.count > 1 {
        (State::Met, format!("{} GPUs visible", visible.len()))
    } else {
        (State::Missing, format!("{} GPU visible", visible.len()))
    };
    add(
        "gpus",
        "≥ 2 GPUs (ranks) in the communicator",
        Machine,
        st,
        ev,
        Some("run on a machine with at least two NVIDIA GPUs visible (CUDA_VISIBLE_DEVICES)"),
        "enqueue.cc:2569 (one rank: local copy)",
    );
    // One node (to 2.29), one NVLink domain (2.30), or the hierarchical copy engine
    // across nodes (2.30.5 on).
    let n = f.nodes.count;
    let nodes_ev = format!("{n} node{} ({})", if n == 1 { "" } else { "s" }, f.nodes.source);
    if rules.has(Rule::OneNode) {
        let st = if n <= 1 { State::Met } else { State::Missing };
        add(
            "single_node",
            "single node",
            Machine,
            st,
            nodes_ev,
            Some(
                "the copy-engine path is single-node: keep the communicator within one node (e.g. a per-node sub-group for AlltoAll)",
            ),
            rules.source(Rule::OneNode),
        );
    } else {
        let hier = rules.has(Rule::HierarchicalCe);
        // A multi-node NVLink domain runs through NVSwitches.
        let on_switches = visible
            .iter()
            .filter_map(|i| f.gpus.iter().find(|g| g.index == *i))
            .any(|g| switch_links(f, g) > 0);
        let rma_off = env::get(&f.settings, "NCCL_NUM_RMA_CTX").is_some()
            && env::nccl_param(&f.settings, "NCCL_NUM_RMA_CTX", 1) == 0;
        let (st, ev) = if n <= 1 {
            (State::Met, nodes_ev)
        } else if !on_switches && !driver_ok {
            (State::Unknown, format!("{nodes_ev}; NVLink unknown without NVML"))
        } else if !on_switches && (!hier || rma_off) {
            (
                State::Missing,
                format!(
                    "{nodes_ev}: the GPUs have no NVLink to an NVSwitch, so the nodes share no NVLink domain{}",
                    if hier {
                        "; NCCL_NUM_RMA_CTX=0 turns off the RMA proxy of the hierarchical copy engine (v2.30.7-1:src/ce_coll.cc:751)"
                    } else {
                        ""
                    }
                ),
            )
        } else if !on_switches {
            (
                State::Unknown,
                format!(
                    "{nodes_ev}: NCCL decides at init whether its hierarchical copy engine can run (GPU-initiated networking or its RMA proxy, with GPUDirect RDMA: v2.30.7-1:src/init.cc:1674-1677); zcta cannot check"
                ),
            )
        } else {
            (
                State::Unknown,
                format!(
                    "{nodes_ev}: whether they form one multi-node NVLink (MNNVL) domain{} is not visible to zcta",
                    if hier {
                        ", or NCCL's hierarchical copy engine can run between them,"
                    } else {
                        ""
                    }
                ),
            )
        };
        let src = if hier {
            format!(
                "{}; {}",
                rules.source(Rule::OneLsaTeam),
                rules.source(Rule::HierarchicalCe)
            )
        } else {
            rules.source(Rule::OneLsaTeam).to_owned()
        };
        add(
            "nodes",
            if hier {
                "one NVLink domain, or the hierarchical copy engine across nodes"
            } else {
                "one NVLink domain (one node or multi-node NVLink)"
            },
            Machine,
            st,
            ev,
            Some(if hier {
                "keep the communicator within one NVLink domain, or across nodes give NCCL a network its RMA proxy or GPU-initiated networking can use (e.g. IB/RoCE with GPUDirect RDMA; NCCL_NUM_RMA_CTX unset or ≥ 1) and both buffers in symmetric windows; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING prints '[Hierarchical CE]' when it is taken"
            } else {
                "keep the communicator within one node (or one multi-node NVLink system)"
            }),
            &src,
        );
    }
    // All CUDA P2P.
    let mut bad = Vec::new();
    let mut unknown = false;
    for (i, a) in visible.iter().enumerate() {
        for b in &visible[i + 1..] {
            match find_pair(f, *a, *b).map(|p| (p, cuda_p2p(p))) {
                Some((_, Some(true))) => {}
                Some((p, Some(false))) => bad.push(format!(
                    "GPU{a}-GPU{b} read {} write {}",
                    p.p2p_read.as_deref().unwrap_or("?"),
                    p.p2p_write.as_deref().unwrap_or("?")
                )),
                Some((_, None)) | None => unknown = true,
            }
        }
    }
    let (st, ev) = if !driver_ok || (unknown && bad.is_empty()) {
        (State::Unknown, "no P2P status from NVML".to_owned())
    } else if !bad.is_empty() {
        (State::Missing, format!("NVML: {}", bad.join("; ")))
    } else if visible.len() < 2 {
        (State::Unknown, "fewer than two GPUs".to_owned())
    } else {
        (
            State::Met,
            "NVML: P2P read and write ok between every pair (NCCL_P2P_DISABLE does not change this)"
                .to_owned(),
        )
    };
    add(
        "all_p2p",
        "CUDA P2P between all GPUs",
        Machine,
        st,
        ev,
        Some(
            "use GPUs that can reach each other with CUDA P2P (NVLink or a common PCIe switch; check ACS/IOMMU settings, nvidia-smi topo -p2p rw)",
        ),
        "init.cc:1376 (isAllCudaP2p), transport.cc:111",
    );
    // cuMem.
    let cumem = env::get(&f.settings, "NCCL_CUMEM_ENABLE").filter(|s| !s.value.is_empty());
    let param = env::nccl_param(&f.settings, "NCCL_CUMEM_ENABLE", -2);
    let (st, ev) = match (param, cumem) {
        (p, Some(s)) if p >= 1 => (State::Met, format!("forced on by {}", src_of(s))),
        (0, Some(s)) => (State::Missing, format!("turned off by {}", src_of(s))),
        (p, Some(s)) if p != -2 => (
            State::Missing,
            format!("{}: NCCL treats negative values other than -2 as off", src_of(s)),
        ),
        _ => match f.driver.cuda_driver {
            _ if f.host.wsl2.is_some() => (
                State::Unknown,
                "auto-detect; WSL2: cuMem/VMM support is not knowable without CUDA (run --probe)".to_owned(),
            ),
            Some(c) if c >= 12000 => (
                State::Met,
                format!(
                    "auto-detect: driver API {} ≥ 12.0; VMM support assumed (every NVIDIA GPU under a native Linux driver has it; --probe confirms)",
                    cuda_str(c)
                ),
            ),
            Some(c) => (
                State::Missing,
                format!("auto-detect: driver API {} < 12.0", cuda_str(c)),
            ),
            None => (State::Unknown, "driver version unknown".to_owned()),
        },
    };
    add(
        "cumem",
        "cuMem (VMM) allocations in NCCL",
        Machine,
        st,
        ev,
        Some("unset NCCL_CUMEM_ENABLE (auto-detect) or set it to 1; needs a driver with CUDA ≥ 12.0"),
        "misc/cudawrap.cc:15,45 (ncclCuMemEnable)",
    );
    // NCCL_WIN_ENABLE.
    let win = env::nccl_param(&f.settings, "NCCL_WIN_ENABLE", 1);
    let (st, ev) = match env::get(&f.settings, "NCCL_WIN_ENABLE").filter(|s| !s.value.is_empty()) {
        Some(s) if win == 0 => (State::Missing, format!("turned off by {}", src_of(s))),
        Some(s) => (State::Met, src_of(s)),
        None => (State::Met, "default 1".to_owned()),
    };
    add(
        "win_enable",
        "symmetric windows enabled in NCCL",
        Machine,
        st,
        ev,
        Some("unset NCCL_WIN_ENABLE (it defaults to 1)"),
        "init.cc:58,1376 (ncclParamWinEnable)",
    );
    // NCCL version.
    let sel = f.nccl.iter().find(|l| l.selected);
    let (st, ev) = match sel.and_then(|l| Some((l, l.version.as_deref()?))) {
        Some((l, v)) if parse_version(v).is_some_and(|t| t >= (2, 28, 0)) => {
            (State::Met, format!("{v} ({}, {})", l.origin, l.path))
        }
        Some((l, v)) => (State::Missing, format!("{v} ({}, {})", l.origin, l.path)),
        None if sel.is_some() => (State::Unknown, "the library's version is unreadable".to_owned()),
        None => (
            State::Unknown,
            "no libnccl.so.2 found (torch may link NCCL statically: torch.cuda.nccl.version() tells)"
                .to_owned(),
        ),
    };
    add(
        "nccl_version",
        "NCCL ≥ 2.28 (the copy a torch process loads)",
        Machine,
        st,
        ev,
        Some(
            "install NCCL ≥ 2.28 where torch finds it (pip install -U nvidia-nccl-cu13, or the cu12 wheel for a CUDA 12 torch)",
        ),
        "ce_coll.cc (copy-engine collectives are new in 2.28)",
    );
    // Driver.
    let (st, ev) = match f.driver.cuda_driver {
        Some(c) if c >= 12050 => (
            State::Met,
            format!(
                "driver API {} ({}){}",
                cuda_str(c),
                f.driver.version.as_deref().unwrap_or("?"),
                f.driver
                    .cuda_driver_source
                    .as_deref()
                    .filter(|s| s.starts_with("inferred"))
                    .map(|s| format!(", {s}"))
                    .unwrap_or_default()
            ),
        ),
        Some(c) => (
            State::Missing,
            format!(
                "driver API {} ({})",
                cuda_str(c),
                f.driver.version.as_deref().unwrap_or("?")
            ),
        ),
        None if !driver_ok && !f.driver.kernel_module => (State::Missing, "no NVIDIA driver".to_owned()),
        None => (State::Unknown, "driver version unknown".to_owned()),
    };
    add(
        "driver",
        "CUDA driver ≥ 12.5",
        Machine,
        st,
        ev,
        Some("install an NVIDIA driver of branch R555 or newer (CUDA 12.5+; R580 for CUDA 13)"),
        "ce_coll.cc:82-99 (ncclCeImplemented: driverVersion >= 12050)",
    );
    // CTA policy: the environment's (overriding the communicator's config); from 2.31.2
    // each collective can ask for its own, which only the program knows.
    let per_coll = rules.has(Rule::PerCollectiveCtaPolicy);
    let flags = rules.has(Rule::CtaPolicyFlags);
    let cta_what = if per_coll {
        "CTA policy ZERO (per collective, per communicator, or NCCL_CTA_POLICY=2)"
    } else if flags {
        "NCCL_CTA_POLICY=2 or ZERO (NCCL_CTA_POLICY_ZERO)"
    } else {
        "NCCL_CTA_POLICY=2 (NCCL_CTA_POLICY_ZERO)"
    };
    let program_decides = "decided by your program: ncclCollConfig_t.CTAPolicy of each nccl*Config call, else ncclConfig_t.CTAPolicy of the communicator";
    let (who, st, ev) = match cta_policy(&f.settings, rules) {
        Some((2, true, s)) => (Machine, State::Met, src_of(s)),
        Some((v, true, s)) if per_coll => (
            Machine,
            State::Missing,
            format!(
                "{} (policy {v}, no ZERO): the variable overrides the program's per-communicator and per-collective CTA policy",
                src_of(s)
            ),
        ),
        Some((v, true, s)) => (
            Machine,
            State::Missing,
            format!("{} (policy {v}, not 2)", src_of(s)),
        ),
        Some((_, false, s)) if per_coll => (
            Program,
            State::ProgramMust,
            format!(
                "{}: not a policy NCCL knows, so NCCL ignores it; {program_decides}",
                src_of(s)
            ),
        ),
        Some((_, false, s)) if flags => (
            Machine,
            State::Missing,
            format!(
                "{}: not a policy NCCL knows; NCCL ignores it and keeps the communicator's (default 0)",
                src_of(s)
            ),
        ),
        Some((_, false, s)) => (
            Machine,
            State::Missing,
            format!("{}: not a policy NCCL knows; it uses 0", src_of(s)),
        ),
        None if per_coll => (
            Program,
            State::ProgramMust,
            format!("NCCL_CTA_POLICY not set: {program_decides}"),
        ),
        None => (
            Machine,
            State::Missing,
            "NCCL_CTA_POLICY not set (policy 0)".to_owned(),
        ),
    };
    let cta_fix = match (per_coll, st) {
        (true, State::ProgramMust) => {
            "pass ncclCollConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO to the nccl*Config call of each collective (or set ncclConfig_t.CTAPolicy for the communicator), or export NCCL_CTA_POLICY=2 for every communicator of the process"
        }
        (true, _) => {
            "unset NCCL_CTA_POLICY so that the program's own CTA policy counts (ncclCollConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO per collective, ncclConfig_t.CTAPolicy per communicator), or set it to 2: the variable overrides both"
        }
        _ if flags => {
            "export NCCL_CTA_POLICY=2 (or ZERO; or set ncclConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO in the program; the variable overrides the config)"
        }
        _ => {
            "export NCCL_CTA_POLICY=2 (or set ncclConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO in the program; the variable overrides the config)"
        }
    };
    let cta_src = if per_coll {
        rules.source(Rule::PerCollectiveCtaPolicy).to_owned()
    } else if flags {
        rules.source(Rule::CtaPolicyFlags).to_owned()
    } else {
        rules.source(Rule::CtaPolicyNumber).to_owned()
    };
    add("cta_policy", cta_what, who, st, ev, Some(cta_fix), &cta_src);
    // Program conditions.
    let win_what = if rules.has(Rule::BothWindows) {
        "both buffers in symmetric windows (NCCL_WIN_COLL_SYMMETRIC)".to_owned()
    } else {
        format!(
            "the receive buffer in a symmetric window{} (NCCL_WIN_COLL_SYMMETRIC{})",
            if rules.has(Rule::NoSysmemWindows) {
                " of device memory"
            } else {
                ""
            },
            if rules.has(Rule::HierarchicalCe) && f.nodes.count > 1 {
                "; both buffers across nodes"
            } else {
                ""
            }
        )
    };
    let mut win_src = rules
        .source(if rules.has(Rule::BothWindows) {
            Rule::BothWindows
        } else {
            Rule::RecvWindow
        })
        .to_owned();
    if rules.has(Rule::NoSysmemWindows) {
        win_src = format!("{win_src}; {}", rules.source(Rule::NoSysmemWindows));
    }
    add(
        "symmetric_windows",
        &win_what,
        Program,
        State::ProgramMust,
        "decided by your program".into(),
        Some(TORCH_RECIPE),
        &win_src,
    );
    add(
        "side_stream",
        "a non-default stream",
        Program,
        State::ProgramMust,
        "decided by your program".into(),
        Some(
            "issue the collective under `with torch.cuda.stream(side):` — on the legacy default stream NCCL's cudaMemcpyBatchAsync fails with 'invalid argument'",
        ),
        "measured on 2×H200, NCCL 2.28.9, torch 2.11 (docs/dev/data-paths.md)",
    );
    v
}

/// Every verdict for `f`.
pub fn verdicts(f: &Facts) -> Report {
    let ev = EnvView::new(&f.settings);
    let mut findings = Vec::new();
    let (visible, vis_note) = visible_gpus(f);
    let transport = transport(f, &ev, &visible, &mut findings);
    let rules = NcclRules::for_facts(f);
    let ce = copy_engine_conditions(f, &visible, &rules);
    let machine_missing: Vec<&Condition> = ce
        .iter()
        .filter(|c| c.decided_by == Decider::Machine && c.state == State::Missing)
        .collect();
    let machine_unknown: Vec<&Condition> = ce
        .iter()
        .filter(|c| c.decided_by == Decider::Machine && c.state == State::Unknown)
        .collect();
    let kernels = if f.nodes.count > 1 {
        Path::Net
    } else {
        transport.path
    };
    let nvswitch = f
        .gpus
        .iter()
        .any(|g| visible.contains(&g.index) && switch_links(f, g) > 0);
    let nvls = env::get(&f.settings, "NCCL_NVLS_ENABLE").filter(|s| !s.value.is_empty());
    let (taken_when, _) = program_musts(&rules, &ce, f.nodes.count);
    // AllGather by copy engine without CTA policy ZERO (2.29+): every machine condition
    // but the CTA policy met, and large messages on sm100+ GPUs all linked by NVLink.
    let auto_ag = auto_ce_allgather(f, &visible, &rules);
    let only_cta_missing = machine_unknown.is_empty()
        && machine_missing.iter().all(|c| c.key == "cta_policy")
        && ce.iter().any(|c| c.key == "cta_policy" && c.state != State::Met);
    let auto_threshold = match &auto_ag {
        Some(Ok(t)) if only_cta_missing => Some(*t),
        _ => None,
    };
    let auto_line = |t: i64| {
        format!(
            "{} sends an AllGather of more than {t} elements per rank by copy engine without CTA policy ZERO when its receive buffer is a symmetric window (NCCL_SYM_CE_THRESHOLD; sm100+ GPUs, NVLink between every pair: {})",
            rules.named(),
            rules.source(Rule::AutoCeAllGather)
        )
    };
    let hier_across = rules.has(Rule::HierarchicalCe) && f.nodes.count > 1;
    let families = Family::ALL
        .iter()
        .map(|&fam| {
            let mut notes = Vec::new();
            let (path, fallback, copy_engine) = if !fam.ce_capable() {
                (
                    kernels,
                    None,
                    {
                        let name = match fam {
                            Family::AllReduce => "AllReduce",
                            Family::ReduceScatter => "ReduceScatter",
                            _ => "Broadcast",
                        };
                        let src = rules.source(Rule::CeCollectives);
                        match rules.basis {
                            Basis::Loaded | Basis::NewerThanChecked => {
                                format!("never: {} has no copy-engine {name} ({src})", rules.named())
                            }
                            Basis::NoNccl | Basis::UnreadableVersion => format!(
                                "never in the NCCL source these rules follow ({}, {src}: no copy-engine {name}); no libnccl found here to check",
                                rules.version
                            ),
                        }
                    },
                )
            } else if machine_missing.is_empty() && machine_unknown.is_empty() {
                (
                    Path::CopyEngine,
                    Some(kernels),
                    match auto_threshold {
                        Some(t) if fam == Family::AllGather => format!(
                            "taken when your program {taken_when}; more than {t} elements per rank need no CTA policy ZERO ({})",
                            rules.source(Rule::AutoCeAllGather)
                        ),
                        _ => format!("taken when your program {taken_when}"),
                    },
                )
            } else if fam == Family::AllGather
                && let Some(t) = auto_threshold
            {
                (
                    Path::CopyEngine,
                    Some(kernels),
                    format!(
                        "taken for more than {t} elements per rank when your program registers the receive buffer as a symmetric window and issues on a non-default stream, without CTA policy ZERO ({}, {}); smaller ones need {}",
                        rules.named(),
                        rules.source(Rule::AutoCeAllGather),
                        machine_missing.iter().map(|c| c.what.as_str()).collect::<Vec<_>>().join("; ")
                    ),
                )
            } else if machine_missing.is_empty() {
                (
                    kernels,
                    None,
                    format!(
                        "unconfirmed: cannot check {} (run --probe)",
                        machine_unknown.iter().map(|c| c.what.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                )
            } else {
                (
                    kernels,
                    None,
                    format!(
                        "not taken: {}",
                        machine_missing.iter().map(|c| c.what.as_str()).collect::<Vec<_>>().join("; ")
                    ),
                )
            };
            if fam == Family::AllGather
                && let Some(Err(why)) = &auto_ag
            {
                notes.push(format!(
                    "{} sends large AllGathers by copy engine without CTA policy ZERO only on sm100+ GPUs with NVLink between every pair ({}); not here: {why}",
                    rules.named(),
                    rules.source(Rule::AutoCeAllGather)
                ));
            }
            if hier_across && matches!(fam, Family::AllGather | Family::AlltoAll) {
                notes.push(format!(
                    "across nodes {} may take its hierarchical copy engine (RMA proxy between nodes, copy engine within one) with both buffers in symmetric windows and CTA policy ZERO ({})",
                    rules.named(),
                    rules.source(Rule::HierarchicalCe)
                ));
            }
            if fam == Family::AlltoAll {
                notes.push("only ncclAlltoAll (all_to_all_single with equal splits) can use the copy engine; grouped Send/Recv always runs kernels (ncclDevKernel_SendRecv)".into());
            }
            if matches!(fam, Family::AllReduce | Family::ReduceScatter | Family::AllGather) {
                if path != Path::CopyEngine {
                    notes.push("on symmetric windows NCCL may run its symmetric-memory kernels instead (ncclSymk…)".into());
                }
                if nvswitch {
                    notes.push(match nvls {
                        Some(s) if env::strtoll(&s.value).value == Some(0) => {
                            format!("NVLS (NVLink SHARP) is off: {}", src_of(s))
                        }
                        _ => "GPUs hang off NVSwitches: NCCL may use NVLS (NVLink SHARP) here (NCCL_NVLS_ENABLE, default auto)".into(),
                    });
                }
            }
            FamilyVerdict {
                family: fam,
                calls: fam.calls().into(),
                ce_capable: fam.ce_capable(),
                path,
                fallback,
                copy_engine,
                notes,
            }
        })
        .collect();

    // --- requests ---
    let mut requests = Vec::new();
    if let Some((v, valid, s)) = cta_policy(&f.settings, &rules) {
        if !valid {
            let why = if rules.has(Rule::CtaPolicyFlags) {
                format!(
                    "NCCL reads a leading digit 0, 1 or 2, or the names DEFAULT, EFFICIENCY, ZERO joined by '|', and ignores anything else ({}): the communicator's own CTA policy stays",
                    rules.source(Rule::CtaPolicyFlags)
                )
            } else {
                format!(
                    "NCCL reads it with strtoll as {} and uses policy 0 for anything outside 0..2 (init.cc:1785)",
                    env::strtoll(&s.value)
                        .value
                        .map_or("an overflow".into(), |n| n.to_string())
                )
            };
            requests.push(Request {
                setting: src_of(s),
                asks: "a CTA policy".into(),
                honoured: Some(false),
                why,
            });
        } else if v == 2 {
            let honoured = if !machine_missing.is_empty() {
                Some(false)
            } else if !machine_unknown.is_empty() {
                None
            } else {
                Some(true)
            };
            let why = match honoured {
                Some(false) => format!(
                    "missing here: {}",
                    machine_missing
                        .iter()
                        .map(|c| format!("{} ({})", c.what, c.evidence))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                None => format!(
                    "cannot check: {}",
                    machine_unknown.iter().map(|c| c.what.as_str()).collect::<Vec<_>>().join(", ")
                ),
                Some(true) => "every machine condition is met; the program must still use symmetric windows and a side stream".into(),
            };
            requests.push(Request {
                setting: src_of(s),
                asks: "the copy engine for AllGather and AlltoAll".into(),
                honoured,
                why,
            });
        }
    }
    for (name, want, asks) in [
        (
            "NCCL_P2P_USE_CUDA_MEMCPY",
            Path::P2pMemcpy,
            "P2P through proxy cudaMemcpy",
        ),
        (
            "NCCL_SHM_USE_CUDA_MEMCPY",
            Path::ShmMemcpy,
            "SHM through proxy cudaMemcpy",
        ),
    ] {
        let Some(s) = env::get(&f.settings, name).filter(|_| env::nccl_param(&f.settings, name, 0) != 0)
        else {
            continue;
        };
        let any = transport.pairs.iter().any(|p| p.path == want);
        let unknown = transport.pairs.iter().any(|p| p.path == Path::Unknown);
        let honoured = if any {
            Some(true)
        } else if unknown || (transport.pairs.is_empty() && transport.path == Path::Unknown) {
            None
        } else {
            Some(false)
        };
        let why = match honoured {
            Some(true) => format!(
                "{} pair(s) use it",
                transport.pairs.iter().filter(|p| p.path == want).count()
            ),
            None => "the transport is unknown here".into(),
            Some(false) => format!(
                "the transport here is {}: {}",
                transport.path.label(),
                transport.why
            ),
        };
        requests.push(Request {
            setting: src_of(s),
            asks: asks.into(),
            honoured,
            why,
        });
    }

    // --- findings ---
    if f.driver.nvml != "loaded" {
        let gpus_on_bus = f.pci.iter().filter(|p| p.kind == "gpu").count();
        findings.push(Finding {
            level: Level::Error,
            what: format!(
                "no usable NVIDIA driver: NVML {} ({}){}",
                f.driver.nvml,
                f.driver.nvml_error.as_deref().unwrap_or("-"),
                if gpus_on_bus > 0 {
                    format!("; {gpus_on_bus} NVIDIA GPU(s) on the PCI bus")
                } else {
                    "; no NVIDIA GPU on the PCI bus".into()
                }
            ),
            fix: Some("install and load the NVIDIA driver (nvidia-smi must work); in a container, start it with the NVIDIA runtime (--gpus all)".into()),
        });
    }
    if let Some(n) = vis_note {
        findings.push(Finding {
            level: if visible.is_empty() {
                Level::Warning
            } else {
                Level::Info
            },
            what: n,
            fix: None,
        });
    }
    if let Some(w) = &f.host.wsl2 {
        findings.push(Finding {
            level: Level::Warning,
            what: format!(
                "WSL2 ({w}): the GPU is paravirtualised through the Windows driver; NVML answers partly and NCCL treats legacy CUDA IPC specially there (p2p.cc, 'WSL WAR')"
            ),
            fix: Some("treat P2P and cuMem as unverified: run `zcta doctor --probe`, or use native Linux for multi-GPU runs".into()),
        });
    }
    if let Some(shm) = &f.host.dev_shm
        && let Some(b) = shm.size_bytes
        && b < (512 << 20)
    {
        let uses_shm = matches!(transport.path, Path::Shm | Path::ShmMemcpy);
        findings.push(Finding {
            level: if uses_shm { Level::Error } else { Level::Warning },
            what: format!(
                "/dev/shm is {} MiB{}: NCCL creates its shared-memory segments there (misc/shmutils.cc: 'Error while creating shared memory segment'){}",
                b >> 20,
                f.host.container.as_deref().map(|c| format!(" (container: {c})")).unwrap_or_default(),
                if uses_shm { ", and the SHM transport is the path here" } else { "" }
            ),
            fix: Some("give the container more (docker run --shm-size=1g, or --ipc=host)".into()),
        });
    }
    if f.nodes.count > 1
        && !f.host.ib_devices.is_empty()
        && let Some(m) = f.host.memlock.as_deref()
        && m != "unlimited"
    {
        findings.push(Finding {
            level: Level::Warning,
            what: format!(
                "locked-memory limit is {m} bytes: NCCL's IB transport registers its buffers with the NIC, which counts against it"
            ),
            fix: Some("raise it (ulimit -l unlimited; docker run --ulimit memlock=-1)".into()),
        });
    }
    if let Some(tc) = f.python.torch.as_ref().and_then(|t| t.cuda.as_deref())
        && let (Some(tm), Some(dc)) = (
            tc.split('.').next().and_then(|m| m.parse::<i32>().ok()),
            f.driver.cuda_driver,
        )
        && tm > dc / 1000
    {
        findings.push(Finding {
            level: Level::Error,
            what: format!(
                "torch is built for CUDA {tc} but the driver supports CUDA {}: torch cannot use the GPUs",
                cuda_str(dc)
            ),
            fix: Some(format!(
                "install a driver for CUDA {tm} (R580+ for CUDA 13, R525+ for CUDA 12) or a torch built for CUDA {}",
                dc / 1000
            )),
        });
    }
    let sel = f.nccl.iter().find(|l| l.selected);
    let others: Vec<String> = f
        .nccl
        .iter()
        .filter(|l| !l.selected)
        .map(|l| {
            format!(
                "{} {} ({})",
                l.version.as_deref().unwrap_or("?"),
                l.path,
                l.origin
            )
        })
        .collect();
    if let Some(sel) = sel
        && !others.is_empty()
    {
        let ld = f
            .nccl
            .iter()
            .any(|l| l.origin == "LD_LIBRARY_PATH" && !l.selected);
        findings.push(Finding {
            level: if ld { Level::Warning } else { Level::Info },
            what: format!(
                "{} NCCL copies: torch loads {} {} ({}); also {}{}",
                others.len() + 1,
                sel.version.as_deref().unwrap_or("?"),
                sel.path,
                sel.origin,
                others.join("; "),
                if ld {
                    " — the LD_LIBRARY_PATH copy wins if torch's library uses RUNPATH"
                } else {
                    ""
                }
            ),
            fix: ld
                .then(|| "`zcta doctor --probe` shows which copy really loads (process.nccl_lib)".to_owned()),
        });
    }
    if f.python.torch.is_none() {
        findings.push(Finding {
            level: Level::Info,
            what: format!(
                "no torch found by {} ({}): the NCCL reported is what a program linking libnccl.so.2 loads",
                f.python.interpreter,
                f.python.error.as_deref().unwrap_or("torch not installed")
            ),
            fix: None,
        });
    }
    let cupti13 = f.cupti.iter().find(|l| l.selected);
    match cupti13 {
        Some(c) if c.origin == "torch wheel" || c.origin == "bundled with torch" => findings.push(Finding {
            level: Level::Info,
            what: format!(
                "torch ships CUPTI {} ({}): it is loaded once torch is imported, and zcta's capture reuses that copy (never a second one)",
                c.version.as_deref().unwrap_or("?"),
                c.path
            ),
            fix: None,
        }),
        Some(_) => {}
        None => findings.push(Finding {
            level: Level::Warning,
            what: if f.cupti.is_empty() {
                "no libcupti found: zcta's GPU capture (engine, GPU times) will be off".into()
            } else {
                format!(
                    "no libcupti.so.13 (CUPTI 13) found, only {}: zcta's GPU capture will be off",
                    f.cupti.iter().map(|l| l.path.as_str()).collect::<Vec<_>>().join(", ")
                )
            },
            fix: Some("install CUPTI 13 (pip install nvidia-cuda-cupti, or the CUDA 13 toolkit) or point ZCTA_CUPTI_LIB at it".into()),
        }),
    }
    for g in &f.gpus {
        if let (Some(free), Some(total)) = (g.memory_free_bytes, g.memory_total_bytes)
            && total > 0
            && free * 10 < total
            && visible.contains(&g.index)
        {
            findings.push(Finding {
                level: Level::Warning,
                what: format!(
                    "GPU{} has {} MiB free of {} MiB: other processes hold its memory",
                    g.index,
                    free >> 20,
                    total >> 20
                ),
                fix: Some(
                    "free the GPU (nvidia-smi lists the processes) before a job that needs NCCL's buffers"
                        .into(),
                ),
            });
        }
    }
    for s in &f.settings {
        if s.name != s.name.trim() {
            findings.push(Finding {
                level: Level::Warning,
                what: format!(
                    "{}: the line for {:?} has spaces around the name, so NCCL sets a variable named {:?} and never reads it",
                    s.source,
                    s.name.trim(),
                    s.name
                ),
                fix: Some(format!("write it as {}={}", s.name.trim(), s.value.trim())),
            });
        }
    }
    if let Some(s) = env::get(&f.settings, "NCCL_PROFILER_PLUGIN") {
        findings.push(Finding {
            level: Level::Info,
            what: format!(
                "{}: NCCL loads one profiler plugin per process, so zcta's NCCL view (algorithm, protocol, proxy steps) stays off; GPU capture is unaffected",
                src_of(s)
            ),
            fix: None,
        });
    }
    if let Some(s) = env::get(&f.settings, "NCCL_ENV_PLUGIN") {
        findings.push(Finding {
            level: Level::Warning,
            what: format!(
                "{}: an environment plugin may answer NCCL's variables differently from what is shown here (plugin/env.cc)",
                src_of(s)
            ),
            fix: None,
        });
    }
    let torch_vars: Vec<&str> = f
        .settings
        .iter()
        .filter(|s| s.name.starts_with("TORCH_NCCL_"))
        .map(|s| s.name.as_str())
        .collect();
    if !torch_vars.is_empty() {
        findings.push(Finding {
            level: Level::Info,
            what: format!(
                "{}: torch-side settings of its NCCL process group; none is a condition of the copy-engine path in {}",
                torch_vars.join(", "),
                rules.named()
            ),
            fix: None,
        });
    }

    // --- fixes ---
    let mut fixes: Vec<String> = Vec::new();
    let mut add_fix = |s: String| {
        if !fixes.contains(&s) {
            fixes.push(s);
        }
    };
    for r in &requests {
        if r.honoured == Some(false) {
            add_fix(format!("{} cannot be honoured: {}", r.setting, r.why));
        }
    }
    for fd in findings.iter().filter(|f| f.level == Level::Error) {
        if let Some(fx) = &fd.fix {
            add_fix(fx.clone());
        }
    }
    // Without a driver, the copy-engine steps beyond the driver itself come later.
    let no_driver = f.driver.nvml != "loaded";
    for state in [State::Missing, State::ProgramMust] {
        for c in ce
            .iter()
            .filter(|c| c.state == state && (!no_driver || matches!(c.key.as_str(), "gpus" | "driver")))
        {
            if let Some(fx) = &c.fix {
                add_fix(if state == State::Missing {
                    format!("{}: {fx}", c.what)
                } else {
                    format!("your program must use {}: {fx}", c.what)
                });
            }
        }
    }
    for fd in findings.iter().filter(|f| f.level == Level::Warning) {
        if let Some(fx) = &fd.fix {
            add_fix(fx.clone());
        }
    }

    // --- summary ---
    let mut summary = Vec::new();
    if f.driver.nvml != "loaded" {
        summary.push(format!(
            "No usable NVIDIA driver here (NVML {}): NCCL cannot run on a GPU. What follows is what can be read without one.",
            f.driver.nvml
        ));
    } else {
        summary.push(format!(
            "{} GPU(s) usable; between GPUs: {}{}.",
            visible.len(),
            transport.path.label(),
            if transport.why.is_empty() {
                String::new()
            } else {
                format!(" — {}", transport.why)
            }
        ));
    }
    let list = |v: &[&Condition]| v.iter().map(|c| c.what.as_str()).collect::<Vec<_>>().join("; ");
    let (_, program_must) = program_musts(&rules, &ce, f.nodes.count);
    summary.push(if machine_missing.is_empty() && machine_unknown.is_empty() {
        format!(
            "Copy engine (zero-CTA) for AllGather and AlltoAll: possible here — your program must {program_must}."
        )
    } else if let Some(t) = auto_threshold {
        format!(
            "Copy engine (zero-CTA) for AllGather and AlltoAll: not taken here — missing: {}; yet {}.",
            list(&machine_missing),
            auto_line(t)
        )
    } else if machine_missing.is_empty() {
        format!(
            "Copy engine (zero-CTA) for AllGather and AlltoAll: cannot tell — {} (run --probe).",
            list(&machine_unknown)
        )
    } else {
        format!(
            "Copy engine (zero-CTA) for AllGather and AlltoAll: not taken here — missing: {}.",
            list(&machine_missing)
        )
    });
    for r in requests.iter().filter(|r| r.honoured == Some(false)) {
        summary.push(format!("{} asks for {}: NOT POSSIBLE HERE.", r.setting, r.asks));
    }
    if let Some(c) = rules.caveat() {
        summary.push(c);
    }
    let exit_code = if requests.iter().any(|r| r.honoured == Some(false)) {
        EXIT_REQUEST_IMPOSSIBLE
    } else {
        0
    };
    Report {
        nccl_rules: rules,
        visible,
        transport,
        copy_engine: ce,
        families,
        requests,
        findings,
        summary,
        fixes,
        exit_code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::facts::{Driver, Library, Nodes, NvLink, PciDevice, Python, Torch};

    const B0: &str = "0000:19:00.0";
    const B1: &str = "0000:3b:00.0";

    fn links(to: &str, n: u32) -> Vec<NvLink> {
        (0..n)
            .map(|l| NvLink {
                link: l,
                remote_bus_id: Some(to.into()),
            })
            .collect()
    }

    /// The 2×H200 test machine: NV18, NVML P2P ok, driver 580 (CUDA 13.0), torch's
    /// NCCL 2.28.9, nothing set.
    fn h200() -> Facts {
        let gpu = |i: u32, bus: &str, peer: &str| Gpu {
            index: i,
            name: Some("NVIDIA H200".into()),
            uuid: Some(format!("GPU-000{i}-aaaa")),
            bus_id: Some(bus.into()),
            memory_total_bytes: Some(150_000 << 20),
            memory_free_bytes: Some(149_000 << 20),
            compute_capability: Some("9.0".into()),
            numa_node: Some(0),
            pcie: Some("Gen5 x16".into()),
            nvlinks: links(peer, 18),
        };
        Facts {
            facts_version: 1,
            driver: Driver {
                nvml: "loaded".into(),
                version: Some("580.65.06".into()),
                version_source: Some("NVML".into()),
                cuda_driver: Some(13000),
                cuda_driver_source: Some("NVML".into()),
                kernel_module: true,
                ..Driver::default()
            },
            gpus: vec![gpu(0, B0, B1), gpu(1, B1, B0)],
            pairs: vec![Pair {
                a: 0,
                b: 1,
                topology: Some("system".into()),
                p2p_read: Some("ok".into()),
                p2p_write: Some("ok".into()),
                p2p_nvlink: Some("ok".into()),
            }],
            nodes: Nodes {
                count: 1,
                source: "assumed".into(),
            },
            python: Python {
                interpreter: "python3".into(),
                torch: Some(Torch {
                    dir: "/sp/torch".into(),
                    version: Some("2.11.0+cu130".into()),
                    cuda: Some("13.0".into()),
                }),
                ..Python::default()
            },
            nccl: vec![Library {
                path: "/sp/nvidia/nccl/lib/libnccl.so.2".into(),
                origin: "torch wheel".into(),
                version: Some("2.28.9".into()),
                built_for_cuda: Some("13.0".into()),
                selected: true,
                ..Library::default()
            }],
            cupti: vec![Library {
                path: "/sp/nvidia/cu13/lib/libcupti.so.13".into(),
                origin: "torch wheel".into(),
                version: Some("13.0.85".into()),
                selected: true,
                ..Library::default()
            }],
            ..Facts::default()
        }
    }

    fn set(f: &mut Facts, name: &str, value: &str) {
        f.settings.retain(|s| s.name != name);
        f.settings.push(Setting {
            name: name.into(),
            value: value.into(),
            source: "environment".into(),
            shadowed: Vec::new(),
        });
    }

    fn fam(r: &Report, f: Family) -> &FamilyVerdict {
        r.families.iter().find(|v| v.family == f).unwrap()
    }

    fn cond<'a>(r: &'a Report, key: &str) -> &'a Condition {
        r.copy_engine.iter().find(|c| c.key == key).unwrap()
    }

    /// With NCCL_CTA_POLICY=2: the condition `key` is missing, AllGather and AlltoAll
    /// fall back to `kernels`, the request fails (exit 3) and a fix names it.
    fn assert_blocks_ce(f: &Facts, key: &str, kernels: Path) -> Report {
        let mut f = f.clone();
        set(&mut f, "NCCL_CTA_POLICY", "2");
        let r = verdicts(&f);
        assert_eq!(cond(&r, key).state, State::Missing, "{key}: {:?}", cond(&r, key));
        for fm in [Family::AllGather, Family::AlltoAll] {
            let v = fam(&r, fm);
            assert_eq!(v.path, kernels, "{key} {fm:?}");
            assert!(v.fallback.is_none());
            assert!(v.copy_engine.starts_with("not taken"), "{}", v.copy_engine);
        }
        assert_eq!(r.exit_code, EXIT_REQUEST_IMPOSSIBLE, "{key}");
        let req = &r.requests[0];
        assert_eq!(req.honoured, Some(false));
        assert!(req.why.contains(&cond(&r, key).what), "{}", req.why);
        let what = &cond(&r, key).what;
        assert!(
            r.fixes.iter().any(|x| x.starts_with(what.as_str())),
            "{key}: {:?}",
            r.fixes
        );
        r
    }

    #[test]
    fn default_h200_runs_sm_kernels_over_nvlink() {
        let r = verdicts(&h200());
        assert_eq!(r.visible, vec![0, 1]);
        assert_eq!(r.transport.path, Path::NvlinkP2p);
        assert!(r.transport.why.contains("NV18"), "{}", r.transport.why);
        for f in Family::ALL {
            assert_eq!(fam(&r, f).path, Path::NvlinkP2p, "{f:?}");
        }
        assert_eq!(cond(&r, "cta_policy").state, State::Missing);
        assert!(
            fam(&r, Family::AllGather)
                .copy_engine
                .contains("NCCL_CTA_POLICY=2")
        );
        for key in [
            "gpus",
            "single_node",
            "all_p2p",
            "cumem",
            "win_enable",
            "nccl_version",
            "driver",
        ] {
            assert_eq!(cond(&r, key).state, State::Met, "{key}");
        }
        assert!(r.requests.is_empty());
        assert_eq!(r.exit_code, 0);
    }

    #[test]
    fn cta_policy_2_gives_the_copy_engine_to_capable_families_only() {
        let mut f = h200();
        set(&mut f, "NCCL_CTA_POLICY", "2");
        let r = verdicts(&f);
        for fm in [Family::AllGather, Family::AlltoAll] {
            assert_eq!(fam(&r, fm).path, Path::CopyEngine);
            assert_eq!(fam(&r, fm).fallback, Some(Path::NvlinkP2p));
        }
        for fm in [Family::AllReduce, Family::ReduceScatter, Family::Broadcast] {
            assert_eq!(fam(&r, fm).path, Path::NvlinkP2p);
            assert!(fam(&r, fm).copy_engine.starts_with("never"), "{fm:?}");
        }
        assert!(fam(&r, Family::AlltoAll).notes[0].contains("Send/Recv"));
        assert_eq!(cond(&r, "symmetric_windows").state, State::ProgramMust);
        assert_eq!(cond(&r, "side_stream").decided_by, Decider::Program);
        assert_eq!(r.requests[0].honoured, Some(true));
        assert_eq!(r.exit_code, 0);
        assert!(
            r.fixes.iter().any(|x| x.contains("use_mem_pool")),
            "the torch recipe is a fix"
        );
        // Hex is what strtoll reads too.
        set(&mut f, "NCCL_CTA_POLICY", "0x2");
        assert_eq!(verdicts(&f).families[1].path, Path::CopyEngine);
    }

    #[test]
    fn each_machine_condition_blocks_the_copy_engine() {
        let mut f = h200();
        f.nodes = Nodes {
            count: 2,
            source: "--nodes".into(),
        };
        let r = assert_blocks_ce(&f, "single_node", Path::Net);
        assert!(r.transport.inter_node.as_deref().unwrap().contains("Socket"));

        let mut f = h200();
        for g in &mut f.gpus {
            g.nvlinks.clear();
        }
        f.pairs[0].p2p_read = Some("not_supported".into());
        f.pairs[0].p2p_nvlink = Some("not_supported".into());
        assert_blocks_ce(&f, "all_p2p", Path::Shm);

        let mut f = h200();
        set(&mut f, "NCCL_CUMEM_ENABLE", "0");
        assert_blocks_ce(&f, "cumem", Path::NvlinkP2p);

        let mut f = h200();
        set(&mut f, "NCCL_WIN_ENABLE", "0");
        assert_blocks_ce(&f, "win_enable", Path::NvlinkP2p);

        let mut f = h200();
        f.nccl[0].version = Some("2.27.7".into());
        assert_blocks_ce(&f, "nccl_version", Path::NvlinkP2p);

        let mut f = h200();
        f.driver.cuda_driver = Some(12040);
        f.driver.version = Some("550.54.14".into());
        assert_blocks_ce(&f, "driver", Path::NvlinkP2p);

        let mut f = h200();
        set(&mut f, "CUDA_VISIBLE_DEVICES", "1");
        let r = assert_blocks_ce(&f, "gpus", Path::LocalCopy);
        assert_eq!(r.visible, vec![1]);

        let mut f = h200();
        f.driver = Driver {
            nvml: "absent".into(),
            nvml_error: Some("libnvidia-ml.so.1 not found".into()),
            ..Driver::default()
        };
        f.gpus.clear();
        f.pairs.clear();
        let r = assert_blocks_ce(&f, "driver", Path::NoGpu);
        assert_eq!(cond(&r, "gpus").state, State::Missing);
        assert_eq!(cond(&r, "all_p2p").state, State::Unknown);
        assert!(
            r.summary[0].starts_with("No usable NVIDIA driver"),
            "{:?}",
            r.summary
        );
        assert!(
            r.findings
                .iter()
                .any(|x| x.level == Level::Error && x.what.contains("no usable NVIDIA driver"))
        );
    }

    #[test]
    fn no_driver_without_requests_exits_zero_and_says_so() {
        let mut f = h200();
        f.driver = Driver {
            nvml: "failed".into(),
            nvml_error: Some("the NVIDIA kernel driver is not loaded".into()),
            ..Driver::default()
        };
        f.gpus.clear();
        f.pairs.clear();
        f.pci = vec![PciDevice {
            bus_id: B0.into(),
            kind: "gpu".into(),
            class: "0x030200".into(),
            ..PciDevice::default()
        }];
        let r = verdicts(&f);
        assert_eq!(r.exit_code, 0);
        assert_eq!(r.transport.path, Path::NoGpu);
        let e = r.findings.iter().find(|x| x.level == Level::Error).unwrap();
        assert!(e.what.contains("1 NVIDIA GPU(s) on the PCI bus"), "{}", e.what);
        assert!(
            r.fixes[0].contains("install and load the NVIDIA driver"),
            "{:?}",
            r.fixes
        );
    }

    #[test]
    fn unknown_conditions_do_not_fail_but_do_not_promise() {
        let mut f = h200();
        f.nccl.clear();
        set(&mut f, "NCCL_CTA_POLICY", "2");
        let r = verdicts(&f);
        assert_eq!(cond(&r, "nccl_version").state, State::Unknown);
        assert_eq!(fam(&r, Family::AllGather).path, Path::NvlinkP2p);
        assert!(fam(&r, Family::AllGather).copy_engine.starts_with("unconfirmed"));
        assert_eq!(r.requests[0].honoured, None);
        assert_eq!(r.exit_code, 0);
    }

    #[test]
    fn invalid_and_other_cta_policies() {
        let mut f = h200();
        set(&mut f, "NCCL_CTA_POLICY", "zero");
        let r = verdicts(&f);
        assert_eq!(r.requests[0].honoured, Some(false));
        assert!(r.requests[0].why.contains("as 0"), "{}", r.requests[0].why);
        assert_eq!(r.exit_code, EXIT_REQUEST_IMPOSSIBLE);
        set(&mut f, "NCCL_CTA_POLICY", "3");
        assert_eq!(verdicts(&f).exit_code, EXIT_REQUEST_IMPOSSIBLE);
        set(&mut f, "NCCL_CTA_POLICY", "1");
        let r = verdicts(&f);
        assert!(r.requests.is_empty());
        assert_eq!(r.exit_code, 0);
        assert_eq!(cond(&r, "cta_policy").state, State::Missing);
        assert!(cond(&r, "cta_policy").evidence.contains("policy 1"));
        // An empty value is "unset" for NCCL.
        set(&mut f, "NCCL_CTA_POLICY", "");
        assert!(verdicts(&f).requests.is_empty());
    }

    #[test]
    fn transport_rules_p2p_shm_net() {
        // NCCL_P2P_DISABLE=1: SHM, yet CUDA P2P (what the copy engine needs) stays.
        let mut f = h200();
        set(&mut f, "NCCL_P2P_DISABLE", "1");
        set(&mut f, "NCCL_CTA_POLICY", "2");
        let r = verdicts(&f);
        assert_eq!(r.transport.path, Path::Shm);
        assert!(r.transport.why.contains("NCCL_P2P_DISABLE=1"));
        assert_eq!(fam(&r, Family::AllGather).path, Path::CopyEngine);
        assert_eq!(fam(&r, Family::AllGather).fallback, Some(Path::Shm));
        assert_eq!(fam(&r, Family::AllReduce).path, Path::Shm);
        // ...and SHM off too: the network.
        set(&mut f, "NCCL_SHM_DISABLE", "1");
        assert_eq!(verdicts(&f).transport.path, Path::Net);
        // NCCL_P2P_DISABLE counts only when it reads as exactly 1.
        let mut f = h200();
        set(&mut f, "NCCL_P2P_DISABLE", "0");
        assert_eq!(verdicts(&f).transport.path, Path::NvlinkP2p);
        set(&mut f, "NCCL_P2P_LEVEL", "LOC");
        assert_eq!(verdicts(&f).transport.path, Path::Shm);
    }

    #[test]
    fn pcie_distance_and_the_p2p_level() {
        let mut f = h200();
        for g in &mut f.gpus {
            g.nvlinks.clear();
        }
        f.pairs[0].p2p_nvlink = Some("not_supported".into());
        // Across the CPU interconnect: beyond NCCL's default level PXB.
        let r = verdicts(&f);
        assert_eq!(r.transport.path, Path::Shm);
        assert!(r.transport.why.contains("SYS"), "{}", r.transport.why);
        // Same PCIe switch: P2P over PCIe.
        f.pairs[0].topology = Some("multiple".into());
        assert_eq!(verdicts(&f).transport.path, Path::PcieP2p);
        // AMD x86 CPU with 2 GPUs: NCCL allows P2P up to SYS.
        f.pairs[0].topology = Some("system".into());
        f.host.cpu_vendor = Some("AuthenticAMD".into());
        f.host.cpu_arch = Some("x86_64".into());
        assert_eq!(verdicts(&f).transport.path, Path::PcieP2p);
        // A user level below the distance turns it off again.
        set(&mut f, "NCCL_P2P_LEVEL", "PXB");
        assert_eq!(verdicts(&f).transport.path, Path::Shm);
        // No NVML topology: unknown.
        f.pairs[0].topology = None;
        assert_eq!(verdicts(&f).transport.path, Path::Unknown);
    }

    #[test]
    fn nvlink_with_p2p_disabled_is_an_init_error() {
        let mut f = h200();
        f.pairs[0].p2p_write = Some("disabled_by_regkey".into());
        let r = verdicts(&f);
        assert!(
            r.findings
                .iter()
                .any(|x| x.level == Level::Error && x.what.contains("refuses to start"))
        );
        set(&mut f, "NCCL_IGNORE_DISABLED_P2P", "1");
        let r = verdicts(&f);
        assert!(!r.findings.iter().any(|x| x.what.contains("refuses to start")));
        assert_eq!(r.transport.path, Path::Shm);
    }

    #[test]
    fn memcpy_requests() {
        let mut f = h200();
        set(&mut f, "NCCL_P2P_USE_CUDA_MEMCPY", "1");
        let r = verdicts(&f);
        assert_eq!(r.transport.path, Path::P2pMemcpy);
        assert_eq!(r.requests[0].honoured, Some(true));
        assert_eq!(r.exit_code, 0);
        set(&mut f, "NCCL_P2P_DISABLE", "1");
        let r = verdicts(&f);
        assert_eq!(r.requests[0].honoured, Some(false));
        assert_eq!(r.exit_code, EXIT_REQUEST_IMPOSSIBLE);

        let mut f = h200();
        set(&mut f, "NCCL_SHM_USE_CUDA_MEMCPY", "1");
        let r = verdicts(&f);
        assert_eq!(r.requests[0].honoured, Some(false), "P2P is used, not SHM");
        assert_eq!(r.exit_code, EXIT_REQUEST_IMPOSSIBLE);
        set(&mut f, "NCCL_P2P_DISABLE", "1");
        let r = verdicts(&f);
        assert_eq!(r.transport.path, Path::ShmMemcpy);
        assert_eq!(r.exit_code, 0);
        // "0" asks for nothing.
        let mut f = h200();
        set(&mut f, "NCCL_SHM_USE_CUDA_MEMCPY", "0");
        assert!(verdicts(&f).requests.is_empty());
    }

    #[test]
    fn visible_devices_by_index_and_uuid() {
        let mut f = h200();
        set(&mut f, "CUDA_VISIBLE_DEVICES", "GPU-0001,0");
        assert_eq!(visible_gpus(&f).0, vec![1, 0]);
        set(&mut f, "CUDA_VISIBLE_DEVICES", "0,7,1");
        assert_eq!(
            visible_gpus(&f).0,
            vec![0],
            "CUDA stops at the first invalid entry"
        );
        set(&mut f, "CUDA_VISIBLE_DEVICES", "");
        let r = verdicts(&f);
        assert!(r.visible.is_empty());
        assert_eq!(r.transport.path, Path::NoGpu);
        // From a conf file it has no effect (NCCL sets it after CUDA started).
        f.settings[0].source = "/etc/nccl.conf".into();
        assert_eq!(visible_gpus(&f).0, vec![0, 1]);
    }

    #[test]
    fn nvswitch_and_nvls_notes() {
        let mut f = h200();
        for g in &mut f.gpus {
            g.nvlinks = links("0000:c1:00.0", 18);
        }
        f.pairs[0].p2p_nvlink = Some("ok".into());
        let r = verdicts(&f);
        assert_eq!(r.transport.path, Path::NvlinkP2p);
        assert!(r.transport.why.contains("NVSwitch"));
        assert!(
            fam(&r, Family::AllReduce)
                .notes
                .iter()
                .any(|n| n.contains("NVLS"))
        );
        assert!(
            !fam(&r, Family::Broadcast)
                .notes
                .iter()
                .any(|n| n.contains("NVLS"))
        );
        set(&mut f, "NCCL_NVLS_ENABLE", "0");
        let r = verdicts(&f);
        assert!(
            fam(&r, Family::AllReduce)
                .notes
                .iter()
                .any(|n| n.contains("NVLS (NVLink SHARP) is off"))
        );
        // Direct links (the H200 pair): no NVSwitch, no NVLS note.
        let r = verdicts(&h200());
        assert!(
            !fam(&r, Family::AllReduce)
                .notes
                .iter()
                .any(|n| n.contains("NVLS"))
        );
    }

    #[test]
    fn findings_for_common_traps() {
        let mut f = h200();
        f.host.dev_shm = Some(crate::doctor::facts::ShmMount {
            fstype: "tmpfs".into(),
            size_bytes: Some(64 << 20),
            options: "size=65536k".into(),
        });
        f.host.container = Some("docker (/.dockerenv)".into());
        f.settings.push(Setting {
            name: "NCCL_CTA_POLICY ".into(),
            value: " 2".into(),
            source: "/etc/nccl.conf".into(),
            shadowed: Vec::new(),
        });
        f.driver.cuda_driver = Some(12040);
        f.gpus[1].memory_free_bytes = Some(1 << 30);
        set(&mut f, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
        let r = verdicts(&f);
        let has = |lvl: Level, s: &str| r.findings.iter().any(|x| x.level == lvl && x.what.contains(s));
        assert!(has(Level::Warning, "/dev/shm is 64 MiB"));
        assert!(has(Level::Warning, "spaces around the name"));
        assert!(has(
            Level::Error,
            "built for CUDA 13.0 but the driver supports CUDA 12.4"
        ));
        assert!(has(Level::Warning, "GPU1 has 1024 MiB free"));
        assert!(has(Level::Info, "TORCH_NCCL_ASYNC_ERROR_HANDLING"));
        assert!(r.requests.is_empty(), "the spaced name is not NCCL_CTA_POLICY");
    }

    fn with_nccl(version: &str) -> Facts {
        let mut f = h200();
        f.nccl[0].version = Some(version.into());
        f
    }

    fn two_nodes(f: &mut Facts) {
        f.nodes = Nodes {
            count: 2,
            source: "--nodes".into(),
        };
    }

    #[test]
    fn nccl_2_28_9_keeps_its_rules() {
        let r = verdicts(&h200());
        assert_eq!(r.nccl_rules.version, "2.28.9");
        assert_eq!(r.nccl_rules.basis, Basis::Loaded);
        assert_eq!(r.nccl_rules.checked, "read from the source at tag v2.28.9-1");
        let c = cond(&r, "cta_policy");
        assert_eq!(c.what, "NCCL_CTA_POLICY=2 (NCCL_CTA_POLICY_ZERO)");
        assert_eq!((c.decided_by, c.state), (Decider::Machine, State::Missing));
        assert_eq!(cond(&r, "single_node").what, "single node");
        assert!(!r.copy_engine.iter().any(|c| c.key == "nodes"));
        assert_eq!(
            cond(&r, "symmetric_windows").what,
            "both buffers in symmetric windows (NCCL_WIN_COLL_SYMMETRIC)"
        );
        assert_eq!(
            r.summary[1],
            "Copy engine (zero-CTA) for AllGather and AlltoAll: not taken here — missing: NCCL_CTA_POLICY=2 (NCCL_CTA_POLICY_ZERO)."
        );
        assert_eq!(
            r.summary.len(),
            2,
            "no caveat for a checked release: {:?}",
            r.summary
        );
        assert!(
            fam(&r, Family::AllReduce).copy_engine.starts_with(
                "never: NCCL 2.28.9 has no copy-engine AllReduce (v2.28.9-1:src/ce_coll.cc:82-99)"
            ),
            "{}",
            fam(&r, Family::AllReduce).copy_engine
        );
        // strtoll: 0x2 is 2, ZERO is not a number.
        let mut f = h200();
        set(&mut f, "NCCL_CTA_POLICY", "0x2");
        let r = verdicts(&f);
        assert_eq!(fam(&r, Family::AllGather).path, Path::CopyEngine);
        assert_eq!(
            fam(&r, Family::AllGather).copy_engine,
            "taken when your program registers both buffers as symmetric windows and issues on a non-default stream"
        );
        assert_eq!(
            r.summary[1],
            "Copy engine (zero-CTA) for AllGather and AlltoAll: possible here — your program must put both buffers in symmetric windows and use a non-default stream."
        );
        set(&mut f, "NCCL_CTA_POLICY", "ZERO");
        assert_eq!(verdicts(&f).exit_code, EXIT_REQUEST_IMPOSSIBLE);
        // Two nodes: the single-node rule blocks the copy engine.
        set(&mut f, "NCCL_CTA_POLICY", "2");
        two_nodes(&mut f);
        let r = verdicts(&f);
        assert_eq!(cond(&r, "single_node").state, State::Missing);
        assert_eq!(r.exit_code, EXIT_REQUEST_IMPOSSIBLE);
        // A Blackwell pair: no copy engine without the CTA policy in 2.28.
        let mut f = h200();
        for g in &mut f.gpus {
            g.compute_capability = Some("10.0".into());
        }
        let r = verdicts(&f);
        assert_eq!(fam(&r, Family::AllGather).path, Path::NvlinkP2p);
        assert!(
            fam(&r, Family::AllGather)
                .notes
                .iter()
                .all(|n| !n.contains("sm100"))
        );
    }

    #[test]
    fn cta_policy_is_a_digit_or_names_from_2_29() {
        let mut f = with_nccl("2.29.7");
        let ce = |f: &Facts| fam(&verdicts(f), Family::AllGather).path == Path::CopyEngine;
        for (v, want) in [
            ("2", true),
            ("ZERO", true),
            ("zero|EFFICIENCY", true),
            ("20", true),
            ("0x2", false),
            ("1", false),
            ("EFFICIENCY", false),
        ] {
            set(&mut f, "NCCL_CTA_POLICY", v);
            assert_eq!(ce(&f), want, "NCCL_CTA_POLICY={v}");
        }
        let r = verdicts(&f);
        assert_eq!(
            cond(&r, "cta_policy").what,
            "NCCL_CTA_POLICY=2 or ZERO (NCCL_CTA_POLICY_ZERO)"
        );
        assert!(
            cond(&r, "cta_policy")
                .source
                .starts_with("v2.29.7-1:src/init.cc:74-116")
        );
        assert!(r.requests.is_empty(), "EFFICIENCY asks for no path");
        for v in ["3", "fast", " 2"] {
            set(&mut f, "NCCL_CTA_POLICY", v);
            let r = verdicts(&f);
            assert_eq!(r.exit_code, EXIT_REQUEST_IMPOSSIBLE, "{v}");
            assert!(
                r.requests[0].why.contains("ignores anything else"),
                "{}",
                r.requests[0].why
            );
        }
        // Only the receive buffer needs a window on one node.
        let r = verdicts(&f);
        assert!(
            cond(&r, "symmetric_windows")
                .what
                .starts_with("the receive buffer"),
            "{}",
            cond(&r, "symmetric_windows").what
        );
    }

    #[test]
    fn multi_node_allgather_and_alltoall_are_not_single_node_from_2_30_7() {
        let mut f = with_nccl("2.30.7");
        set(&mut f, "NCCL_CTA_POLICY", "2");
        two_nodes(&mut f);
        let r = verdicts(&f);
        assert!(!r.copy_engine.iter().any(|c| c.key == "single_node"));
        let c = cond(&r, "nodes");
        assert!(c.what.contains("hierarchical copy engine"), "{}", c.what);
        assert_eq!(c.state, State::Unknown, "{}", c.evidence);
        assert!(
            c.source.contains("v2.30.7-1:src/ce_coll.cc:719-761"),
            "{}",
            c.source
        );
        assert_eq!(r.exit_code, 0, "{:?}", r.requests);
        assert_eq!(r.requests[0].honoured, None);
        for fm in [Family::AllGather, Family::AlltoAll] {
            let v = fam(&r, fm);
            assert!(v.copy_engine.starts_with("unconfirmed"), "{}", v.copy_engine);
            assert!(
                v.notes.iter().any(|n| n.contains("hierarchical copy engine")),
                "{:?}",
                v.notes
            );
        }
        assert!(
            !r.summary.iter().any(|l| l.contains("single node")),
            "{:?}",
            r.summary
        );
        // Without the RMA proxy (and no NVSwitch for an NVLink domain) it is blocked.
        set(&mut f, "NCCL_NUM_RMA_CTX", "0");
        let r = verdicts(&f);
        assert_eq!(cond(&r, "nodes").state, State::Missing);
        assert_eq!(r.exit_code, EXIT_REQUEST_IMPOSSIBLE);
        // 2.30.4: no hierarchical copy engine, only one NVLink domain; never "single node".
        let mut f = with_nccl("2.30.4");
        set(&mut f, "NCCL_CTA_POLICY", "2");
        two_nodes(&mut f);
        let r = verdicts(&f);
        let c = cond(&r, "nodes");
        assert_eq!(c.what, "one NVLink domain (one node or multi-node NVLink)");
        assert_eq!(c.state, State::Missing, "direct NVLinks: no NVSwitch, no MNNVL");
        assert!(c.source.contains("ce_coll.cc:118"), "{}", c.source);
        assert_eq!(r.exit_code, EXIT_REQUEST_IMPOSSIBLE);
        // ...and on NVSwitches, whether they form one domain is not visible.
        for g in &mut f.gpus {
            g.nvlinks = links("0000:c1:00.0", 18);
        }
        assert_eq!(cond(&verdicts(&f), "nodes").state, State::Unknown);
        // 2.29: still one node.
        let mut f = with_nccl("2.29.7");
        set(&mut f, "NCCL_CTA_POLICY", "2");
        two_nodes(&mut f);
        assert_blocks_ce(&f, "single_node", Path::Net);
    }

    #[test]
    fn per_collective_cta_policy_from_2_31_2() {
        let r = verdicts(&with_nccl("2.31.2"));
        let c = cond(&r, "cta_policy");
        assert!(c.what.contains("per collective"), "{}", c.what);
        assert!(
            c.evidence.contains("ncclCollConfig_t.CTAPolicy"),
            "{}",
            c.evidence
        );
        assert_eq!((c.decided_by, c.state), (Decider::Program, State::ProgramMust));
        assert!(c.source.contains("2.31.2 nccl.h:195"), "{}", c.source);
        assert!(c.fix.as_deref().unwrap().contains("nccl*Config"));
        let ag = fam(&r, Family::AllGather);
        assert_eq!(ag.path, Path::CopyEngine);
        assert_eq!(ag.fallback, Some(Path::NvlinkP2p));
        assert!(
            ag.copy_engine.contains("asks for CTA policy ZERO"),
            "{}",
            ag.copy_engine
        );
        assert!(r.summary[1].contains("possible here"), "{}", r.summary[1]);
        assert!(
            r.fixes
                .iter()
                .any(|x| x.starts_with("your program must use CTA policy ZERO"))
        );
        assert_eq!(r.exit_code, 0);
        // The probe asks only through NCCL_CTA_POLICY: it expects kernels here.
        let pred = crate::doctor::probe::predictions(&r);
        assert!(pred.contains(&(Family::AllGather, Path::NvlinkP2p)), "{pred:?}");
        // The variable overrides the program's per-collective policy.
        let mut f = with_nccl("2.32.3");
        set(&mut f, "NCCL_CTA_POLICY", "0");
        let r = verdicts(&f);
        let c = cond(&r, "cta_policy");
        assert_eq!((c.decided_by, c.state), (Decider::Machine, State::Missing));
        assert!(c.evidence.contains("overrides"), "{}", c.evidence);
        set(&mut f, "NCCL_CTA_POLICY", "ZERO");
        assert_eq!(cond(&verdicts(&f), "cta_policy").state, State::Met);
        // 2.30.7 has no per-collective policy: the variable is still needed.
        let r = verdicts(&with_nccl("2.30.7"));
        assert_eq!(cond(&r, "cta_policy").state, State::Missing);
        assert!(!cond(&r, "cta_policy").what.contains("per collective"));
    }

    #[test]
    fn a_newer_nccl_follows_the_newest_checked_rules_and_says_so() {
        let r = verdicts(&with_nccl("2.40.1"));
        assert_eq!(r.nccl_rules.basis, Basis::NewerThanChecked);
        assert_eq!(r.nccl_rules.version, "2.32.3");
        assert_eq!(r.nccl_rules.loaded.as_deref(), Some("2.40.1"));
        assert!(
            r.summary
                .iter()
                .any(|l| l.contains("newer than the newest NCCL checked (2.32.3)")
                    && l.contains("unverified for 2.40.1")),
            "{:?}",
            r.summary
        );
        let ar = &fam(&r, Family::AllReduce).copy_engine;
        assert!(
            ar.starts_with(
                "never: NCCL 2.32.3 (the newest checked; 2.40.1 unverified) has no copy-engine AllReduce"
            ),
            "{ar}"
        );
        assert_eq!(cond(&r, "cta_policy").state, State::ProgramMust);
        // No libnccl: the rules followed are named too.
        let mut f = h200();
        f.nccl.clear();
        let r = verdicts(&f);
        assert_eq!(r.nccl_rules.basis, Basis::NoNccl);
        assert!(
            r.summary.iter().any(|l| l.starts_with("No libnccl.so.2 found: the copy-engine rules here are NCCL 2.28.9's")),
            "{:?}",
            r.summary
        );
    }

    #[test]
    fn blackwell_allgather_takes_the_copy_engine_by_itself_from_2_29() {
        let mut f = with_nccl("2.29.2");
        for g in &mut f.gpus {
            g.compute_capability = Some("10.0".into());
        }
        let r = verdicts(&f);
        let ag = fam(&r, Family::AllGather);
        assert_eq!(ag.path, Path::CopyEngine, "{}", ag.copy_engine);
        assert!(
            ag.copy_engine
                .starts_with("taken for more than 8388608 elements per rank"),
            "{}",
            ag.copy_engine
        );
        assert!(
            ag.copy_engine.contains("enqueue.cc:31,2966"),
            "{}",
            ag.copy_engine
        );
        assert_eq!(fam(&r, Family::AlltoAll).path, Path::NvlinkP2p);
        assert!(
            r.summary[1].contains("by copy engine without CTA policy ZERO"),
            "{}",
            r.summary[1]
        );
        set(&mut f, "NCCL_SYM_CE_THRESHOLD", "1024");
        assert!(
            fam(&verdicts(&f), Family::AllGather)
                .copy_engine
                .contains("more than 1024 elements")
        );
        // Hopper: a note says why not.
        let r = verdicts(&with_nccl("2.29.2"));
        let ag = fam(&r, Family::AllGather);
        assert_eq!(ag.path, Path::NvlinkP2p);
        assert!(
            ag.notes
                .iter()
                .any(|n| n.contains("not here: GPU0 is compute capability 9.0")),
            "{:?}",
            ag.notes
        );
    }

    #[test]
    fn families_of_ops() {
        assert_eq!(Family::of_op("Send"), Some(Family::AlltoAll));
        assert_eq!(Family::of_op("Bcast"), Some(Family::Broadcast));
        assert_eq!(Family::of_op("Reduce"), None);
        assert!(Family::AllGather.ce_capable() && !Family::ReduceScatter.ce_capable());
    }
}
