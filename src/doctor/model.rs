//! What the doctor's verdicts are made of: families, paths, conditions, requests,
//! findings and the report. The rules (`super::rules`) produce them and
//! `super::verdict` runs the rules; both depend on this module, not on each other.

use serde::{Deserialize, Serialize};

use crate::nccl::OpKind;
use crate::nccl_rules::NcclRules;

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

    /// The family of an op kind (the families the doctor judges; others: none).
    pub fn of_op(op: OpKind) -> Option<Family> {
        Some(match op {
            OpKind::AllReduce => Family::AllReduce,
            OpKind::AllGather => Family::AllGather,
            OpKind::ReduceScatter => Family::ReduceScatter,
            OpKind::AlltoAll | OpKind::Send | OpKind::Recv => Family::AlltoAll,
            OpKind::Broadcast | OpKind::Bcast => Family::Broadcast,
            OpKind::Reduce | OpKind::Gather | OpKind::Scatter => return None,
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
    pub(super) fn badness(self) -> u8 {
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
