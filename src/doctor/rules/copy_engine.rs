//! The conditions of the copy-engine ("zero-CTA") path, but the CTA policy
//! ([`super::cta_policy`]): the machine's (GPUs, nodes, CUDA P2P, cuMem, windows
//! enabled, NCCL and driver versions), then the program's (windows, stream).

use super::super::env;
use super::super::model::{Decider, State, TORCH_RECIPE};
use super::topology::{cuda_p2p, find_pair, switch_links};
use super::{Check, Ctx, cuda_str, src_of};
use crate::nccl_rules::{Rule, parse_version};

fn machine(what: &str, state: State, evidence: String, fix: &'static str) -> Option<Check> {
    Some(Check {
        what: what.into(),
        decided_by: Decider::Machine,
        state,
        evidence,
        fix,
    })
}

fn program(what: String, fix: &'static str) -> Option<Check> {
    Some(Check {
        what,
        decided_by: Decider::Program,
        state: State::ProgramMust,
        evidence: "decided by your program".into(),
        fix,
    })
}

/// At least two ranks: one rank copies locally.
pub fn gpus(ctx: &Ctx<'_>) -> Option<Check> {
    let n = ctx.visible.len();
    let (st, ev) = if !ctx.driver_ok() {
        (
            State::Missing,
            format!("no usable NVIDIA driver (NVML {})", ctx.f.driver.nvml),
        )
    } else if n >= 2 || ctx.f.nodes.count > 1 {
        (State::Met, format!("{n} GPUs visible"))
    } else {
        (State::Missing, format!("{n} GPU visible"))
    };
    machine(
        "≥ 2 GPUs (ranks) in the communicator",
        st,
        ev,
        "run on a machine with at least two NVIDIA GPUs visible (CUDA_VISIBLE_DEVICES)",
    )
}

fn nodes_evidence(ctx: &Ctx<'_>) -> String {
    let n = ctx.f.nodes.count;
    format!(
        "{n} node{} ({})",
        if n == 1 { "" } else { "s" },
        ctx.f.nodes.source
    )
}

/// To 2.29: every rank on one node.
pub fn single_node(ctx: &Ctx<'_>) -> Option<Check> {
    if !ctx.rules.has(Rule::OneNode) {
        return None;
    }
    let st = if ctx.f.nodes.count <= 1 {
        State::Met
    } else {
        State::Missing
    };
    machine(
        "single node",
        st,
        nodes_evidence(ctx),
        "the copy-engine path is single-node: keep the communicator within one node (e.g. a per-node sub-group for AlltoAll)",
    )
}

/// From 2.30: one NVLink domain, or (2.30.5 on) the hierarchical copy engine across
/// nodes.
pub fn nvlink_domain(ctx: &Ctx<'_>) -> Option<Check> {
    if ctx.rules.has(Rule::OneNode) {
        return None;
    }
    let hier = ctx.rules.has(Rule::HierarchicalCe);
    let (st, ev) = nvlink_domain_state(ctx, hier);
    let (what, fix) = if hier {
        (
            "one NVLink domain, or the hierarchical copy engine across nodes",
            "keep the communicator within one NVLink domain, or across nodes give NCCL a network its RMA proxy or GPU-initiated networking can use (e.g. IB/RoCE with GPUDirect RDMA; NCCL_NUM_RMA_CTX unset or ≥ 1) and both buffers in symmetric windows; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING prints '[Hierarchical CE]' when it is taken",
        )
    } else {
        (
            "one NVLink domain (one node or multi-node NVLink)",
            "keep the communicator within one node (or one multi-node NVLink system)",
        )
    };
    machine(what, st, ev, fix)
}

fn nvlink_domain_state(ctx: &Ctx<'_>, hier: bool) -> (State, String) {
    let f = ctx.f;
    let nodes_ev = nodes_evidence(ctx);
    // A multi-node NVLink domain runs through NVSwitches.
    let on_switches = ctx.gpus.iter().any(|g| switch_links(f, g) > 0);
    let rma_off = env::get(&f.settings, "NCCL_NUM_RMA_CTX").is_some()
        && env::nccl_param(&f.settings, "NCCL_NUM_RMA_CTX", 1) == 0;
    if f.nodes.count <= 1 {
        (State::Met, nodes_ev)
    } else if !on_switches && !ctx.driver_ok() {
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
    }
}

/// CUDA P2P between every pair (NCCL_P2P_DISABLE does not change it).
pub fn all_p2p(ctx: &Ctx<'_>) -> Option<Check> {
    let f = ctx.f;
    let mut bad = Vec::new();
    let mut unknown = false;
    for (i, a) in ctx.visible.iter().enumerate() {
        for b in &ctx.visible[i + 1..] {
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
    let (st, ev) = if !ctx.driver_ok() || (unknown && bad.is_empty()) {
        (State::Unknown, "no P2P status from NVML".to_owned())
    } else if !bad.is_empty() {
        (State::Missing, format!("NVML: {}", bad.join("; ")))
    } else if ctx.visible.len() < 2 {
        (State::Unknown, "fewer than two GPUs".to_owned())
    } else {
        (
            State::Met,
            "NVML: P2P read and write ok between every pair (NCCL_P2P_DISABLE does not change this)"
                .to_owned(),
        )
    };
    machine(
        "CUDA P2P between all GPUs",
        st,
        ev,
        "use GPUs that can reach each other with CUDA P2P (NVLink or a common PCIe switch; check ACS/IOMMU settings, nvidia-smi topo -p2p rw)",
    )
}

/// cuMem (VMM) allocations: `NCCL_CUMEM_ENABLE`, else auto-detect from the driver.
pub fn cumem(ctx: &Ctx<'_>) -> Option<Check> {
    let f = ctx.f;
    let cumem = env::get(&f.settings, "NCCL_CUMEM_ENABLE").filter(|s| !s.value.is_empty());
    let param = env::nccl_param(&f.settings, "NCCL_CUMEM_ENABLE", -2);
    let (st, ev) = match (param, cumem) {
        (p, Some(s)) if p >= 1 => (State::Met, format!("forced on by {}", src_of(s))),
        (0, Some(s)) => (State::Missing, format!("turned off by {}", src_of(s))),
        (p, Some(s)) if p != -2 => (
            State::Missing,
            format!("{}: NCCL treats negative values other than -2 as off", src_of(s)),
        ),
        _ => cumem_auto(ctx),
    };
    machine(
        "cuMem (VMM) allocations in NCCL",
        st,
        ev,
        "unset NCCL_CUMEM_ENABLE (auto-detect) or set it to 1; needs a driver with CUDA ≥ 12.0",
    )
}

fn cumem_auto(ctx: &Ctx<'_>) -> (State, String) {
    match ctx.f.driver.cuda_driver {
        _ if ctx.f.host.wsl2.is_some() => (
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
    }
}

/// `NCCL_WIN_ENABLE` (default 1).
pub fn win_enable(ctx: &Ctx<'_>) -> Option<Check> {
    let f = ctx.f;
    let win = env::nccl_param(&f.settings, "NCCL_WIN_ENABLE", 1);
    let (st, ev) = match env::get(&f.settings, "NCCL_WIN_ENABLE").filter(|s| !s.value.is_empty()) {
        Some(s) if win == 0 => (State::Missing, format!("turned off by {}", src_of(s))),
        Some(s) => (State::Met, src_of(s)),
        None => (State::Met, "default 1".to_owned()),
    };
    machine(
        "symmetric windows enabled in NCCL",
        st,
        ev,
        "unset NCCL_WIN_ENABLE (it defaults to 1)",
    )
}

/// The NCCL a torch process loads is 2.28 or later.
pub fn nccl_version(ctx: &Ctx<'_>) -> Option<Check> {
    let sel = ctx.f.nccl.iter().find(|l| l.selected);
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
    machine(
        "NCCL ≥ 2.28 (the copy a torch process loads)",
        st,
        ev,
        "install NCCL ≥ 2.28 where torch finds it (pip install -U nvidia-nccl-cu13, or the cu12 wheel for a CUDA 12 torch)",
    )
}

/// A driver of CUDA 12.5 or later.
pub fn driver(ctx: &Ctx<'_>) -> Option<Check> {
    let d = &ctx.f.driver;
    let version = d.version.as_deref().unwrap_or("?");
    let (st, ev) = match d.cuda_driver {
        Some(c) if c >= 12050 => (
            State::Met,
            format!(
                "driver API {} ({version}){}",
                cuda_str(c),
                d.cuda_driver_source
                    .as_deref()
                    .filter(|s| s.starts_with("inferred"))
                    .map(|s| format!(", {s}"))
                    .unwrap_or_default()
            ),
        ),
        Some(c) => (State::Missing, format!("driver API {} ({version})", cuda_str(c))),
        None if !ctx.driver_ok() && !d.kernel_module => (State::Missing, "no NVIDIA driver".to_owned()),
        None => (State::Unknown, "driver version unknown".to_owned()),
    };
    machine(
        "CUDA driver ≥ 12.5",
        st,
        ev,
        "install an NVIDIA driver of branch R555 or newer (CUDA 12.5+; R580 for CUDA 13)",
    )
}

/// The program's buffers in symmetric windows: both (2.28), else the receive buffer (of
/// device memory from 2.30; both across nodes with the hierarchical copy engine).
pub fn symmetric_windows(ctx: &Ctx<'_>) -> Option<Check> {
    let rules = ctx.rules;
    let what = if rules.has(Rule::BothWindows) {
        "both buffers in symmetric windows (NCCL_WIN_COLL_SYMMETRIC)".to_owned()
    } else {
        format!(
            "the receive buffer in a symmetric window{} (NCCL_WIN_COLL_SYMMETRIC{})",
            if rules.has(Rule::NoSysmemWindows) {
                " of device memory"
            } else {
                ""
            },
            if rules.has(Rule::HierarchicalCe) && ctx.f.nodes.count > 1 {
                "; both buffers across nodes"
            } else {
                ""
            }
        )
    };
    program(what, TORCH_RECIPE)
}

/// A non-default stream.
pub fn side_stream(_: &Ctx<'_>) -> Option<Check> {
    program(
        "a non-default stream".into(),
        "issue the collective under `with torch.cuda.stream(side):` — on the legacy default stream NCCL's cudaMemcpyBatchAsync fails with 'invalid argument'",
    )
}
