//! The rows of the `ops` and `gpu` tables: an op's host record with its GPU columns,
//! and a GPU activity tied to its op. The GPU join (`gpu`) makes them, the tables
//! (`tables::ops`, `tables::gpu`) write them.

use std::sync::Arc;

use crate::cupti::RawActivity;
use crate::record::{OpRecord, PlanEngine};

/// Which engine moved an op's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// NCCL device kernels (SMs load/store over NVLink/PCIe, or stage for SHM/NET).
    SmKernel,
    /// Symmetric-memory kernels (`ncclSymkDevKernel_*`).
    SymmetricKernel,
    /// No kernel: the copy engine moved the bytes (`cudaMemcpyBatchAsync` DtoD/PtoP).
    CopyEngine,
    /// Kernels ran, and NCCL's proxy thread moved bytes with `cudaMemcpyAsync`.
    ProxyMemcpy,
    /// CUPTI was on but nothing was attributed by the time the row was written.
    None,
    /// Not known: the op was timed with GPU stamps, and NCCL's events said nothing of
    /// its engine (no profiler plugin, a one-rank shortcut, the copy-engine path on an
    /// NCCL before 2.29 or a v5 plugin, whose events do not show it). Written as NULL.
    Unknown,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::SmKernel => "sm_kernel",
            Engine::SymmetricKernel => "symmetric_kernel",
            Engine::CopyEngine => "copy_engine",
            Engine::ProxyMemcpy => "proxy_memcpy",
            Engine::None => "none",
            Engine::Unknown => "unknown",
        }
    }

    /// The `ops.engine` value (NULL when not known).
    pub fn column(self) -> Option<&'static str> {
        (self != Engine::Unknown).then(|| self.name())
    }
}

/// How an op's GPU columns were measured (`ops.gpu_source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuSourceKind {
    /// GPU stamps on the op's stream; the engine from NCCL's profiler events. Files
    /// written before stamps replaced CUDA events say `events`: readers take both.
    Stamps,
    /// CUPTI's activity records (deep mode), with the stamps' ready and end when the
    /// op was timed too.
    Cupti,
}

impl GpuSourceKind {
    pub fn name(self) -> &'static str {
        match self {
            GpuSourceKind::Stamps => "stamps",
            GpuSourceKind::Cupti => "cupti",
        }
    }
}

/// GPU columns of one ops row.
#[derive(Clone, Debug, PartialEq)]
pub struct OpGpu {
    pub launch_ns: Option<i64>,
    /// When the op's stream was free for it ([`crate::streams`]), at most
    /// `gpu_start_ns`; `None` when nothing ahead of it was recorded.
    pub gpu_ready_ns: Option<i64>,
    pub gpu_start_ns: Option<i64>,
    pub gpu_end_ns: Option<i64>,
    pub engine: Engine,
    pub kernel: Option<Arc<str>>,
    pub n_kernels: u32,
    pub n_memcpy: u32,
    pub memcpy_bytes: u64,
    pub source: GpuSourceKind,
}

impl OpGpu {
    /// An op timed with GPU stamps only: `ready_ns`..`end_ns` on its stream; NCCL's
    /// events during the launching call say whether a kernel ran.
    pub fn from_events(rec: &OpRecord, ready_ns: i64, end_ns: i64) -> OpGpu {
        OpGpu {
            launch_ns: rec.timing.launch_ns,
            gpu_ready_ns: Some(ready_ns),
            gpu_start_ns: None,
            gpu_end_ns: Some(end_ns),
            engine: match rec.timing.nccl_engine {
                PlanEngine::SmKernel => Engine::SmKernel,
                PlanEngine::SymmetricKernel => Engine::SymmetricKernel,
                PlanEngine::CopyEngine => Engine::CopyEngine,
                PlanEngine::Unknown => Engine::Unknown,
            },
            kernel: None,
            n_kernels: 0,
            n_memcpy: 0,
            memcpy_bytes: 0,
            source: GpuSourceKind::Stamps,
        }
    }
}

/// One `ops` row: the host record plus, when CUPTI was active, its GPU side.
#[derive(Clone, Debug, PartialEq)]
pub struct OpRow {
    pub rec: OpRecord,
    pub gpu: Option<OpGpu>,
}

impl std::ops::Deref for OpRow {
    type Target = OpRecord;
    fn deref(&self) -> &OpRecord {
        &self.rec
    }
}

/// A decoded GPU activity with its kernel name resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Activity {
    pub raw: RawActivity,
    /// Kernels: the short name ([`cupti::short_kernel_name`]).
    pub name: Option<Arc<str>>,
}

/// How a `gpu` row was tied to its op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attribution {
    /// Launched by a CUDA call made inside the NCCL call.
    NcclCall,
    /// Issued by NCCL's proxy thread, tied by the kernel-window rule.
    ProxyWindow,
    /// An NCCL kernel run by a launch of a CUDA graph that captured NCCL calls: its
    /// correlation id is the graph launch's, which names no op.
    GraphLaunch,
}

impl Attribution {
    pub fn name(self) -> &'static str {
        match self {
            Attribution::NcclCall => "nccl_call",
            Attribution::ProxyWindow => "proxy_window",
            Attribution::GraphLaunch => "graph_launch",
        }
    }
}

/// One `gpu` row.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuRow {
    pub act: Activity,
    pub op_id: Option<u64>,
    pub group_id: Option<u64>,
    pub attribution: Attribution,
    /// Start of the CUDA call that issued it, when its API record was kept.
    pub launch_ns: Option<i64>,
    /// Issuing thread (`pthread_self` truncated), when its API record was kept.
    pub api_thread: Option<u32>,
}
