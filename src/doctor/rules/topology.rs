//! Which GPUs a job sees and how two of them are connected, as NCCL's topology code
//! classifies it (`src/graph/topo.h`, `src/graph/paths.cc`).

use super::super::env;
use super::super::facts::{Facts, Gpu, Pair};

/// NCCL's path types (src/graph/topo.h:62-98), for the P2P level rule.
pub const PATH_LOC: i32 = 0;
pub const PATH_NVL: i32 = 1;
pub const PATH_NVB: i32 = 2;
pub const PATH_PIX: i32 = 4;
pub const PATH_PXB: i32 = 5;
pub const PATH_PHB: i32 = 8;
pub const PATH_SYS: i32 = 9;
/// `topoPathTypeStr` (src/graph/topo.cc:26).
pub const PATH_NAMES: [&str; 12] = [
    "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS",
];

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
pub fn switch_links(f: &Facts, g: &Gpu) -> usize {
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
pub fn cuda_p2p(p: &Pair) -> Option<bool> {
    Some(ok(&p.p2p_read)? && ok(&p.p2p_write)?)
}

pub fn find_pair(f: &Facts, a: u32, b: u32) -> Option<&Pair> {
    f.pairs
        .iter()
        .find(|p| (p.a == a && p.b == b) || (p.a == b && p.b == a))
}

/// NCCL's path type between two GPUs, from NVLink and NVML's common ancestor.
pub fn path_type(f: &Facts, a: &Gpu, b: &Gpu, pair: Option<&Pair>) -> Option<(i32, String)> {
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

/// Pairs of visible GPUs, each once, in the order of `gpus`.
pub fn each_pair<'g, 'a>(gpus: &'g [&'a Gpu]) -> impl Iterator<Item = (&'a Gpu, &'a Gpu)> + 'g {
    gpus.iter()
        .enumerate()
        .flat_map(move |(i, a)| gpus[i + 1..].iter().map(move |b| (*a, *b)))
}
