//! The transport between the GPUs: NCCL's settings that steer it, and the slowest
//! pair's path (what bounds a ring) from [`super::PAIR_PATHS`].

use super::super::env::{self, Setting};
use super::super::facts::Gpu;
use super::super::model::{PairPath, Path, Transport};
use super::p2p::PairView;
use super::topology::{PATH_LOC, PATH_NAMES, PATH_PHB, PATH_PIX, PATH_PXB, PATH_SYS, each_pair};
use super::{Ctx, PAIR_PATHS, network, src_of};

/// The settings that steer the transport, read as NCCL reads them.
pub struct EnvView<'a> {
    pub settings: &'a [Setting],
    /// User P2P level and the setting it came from (`ncclGetLevel`, graph/paths.cc:217).
    pub p2p_level: Option<(i32, String)>,
    pub shm_disable: bool,
    pub p2p_memcpy: bool,
    pub shm_memcpy: bool,
    pub ignore_disabled_p2p: i64,
}

impl<'a> EnvView<'a> {
    pub fn new(settings: &'a [Setting]) -> Self {
        EnvView {
            settings,
            p2p_level: user_p2p_level(settings),
            shm_disable: env::nccl_param(settings, "NCCL_SHM_DISABLE", 0) == 1,
            p2p_memcpy: env::nccl_param(settings, "NCCL_P2P_USE_CUDA_MEMCPY", 0) != 0,
            shm_memcpy: env::nccl_param(settings, "NCCL_SHM_USE_CUDA_MEMCPY", 0) != 0,
            ignore_disabled_p2p: env::nccl_param(settings, "NCCL_IGNORE_DISABLED_P2P", 0),
        }
    }

    pub fn get(&self, n: &str) -> Option<&'a Setting> {
        env::get(self.settings, n)
    }
}

/// NCCL_P2P_DISABLE counts only when strtol gives exactly 1; otherwise NCCL_P2P_LEVEL:
/// a name of topoPathTypeStr, or an old-style number.
fn user_p2p_level(settings: &[Setting]) -> Option<(i32, String)> {
    let get = |n: &str| env::get(settings, n);
    let disabled = get("NCCL_P2P_DISABLE")
        .filter(|s| env::strtoll(&s.value).value == Some(1))
        .map(|s| (PATH_LOC, src_of(s)));
    if disabled.is_some() {
        return disabled;
    }
    let s = get("NCCL_P2P_LEVEL")?;
    let by_name = PATH_NAMES.iter().position(|n| *n == s.value).map(|i| i as i32);
    let old = || {
        s.value.starts_with(|c: char| c.is_ascii_digit()).then(|| {
            const OLD: [i32; 6] = [PATH_LOC, PATH_PIX, PATH_PXB, PATH_PHB, PATH_SYS, PATH_SYS];
            let v = env::strtoll(&s.value).value.unwrap_or(5).clamp(0, 5);
            OLD[v as usize]
        })
    };
    by_name.or_else(old).map(|l| (l, src_of(s)))
}

fn pair_path(ctx: &Ctx<'_>, a: &Gpu, b: &Gpu) -> PairPath {
    let view = PairView::new(ctx, a, b);
    let (path, why) = PAIR_PATHS
        .iter()
        .find_map(|r| (r.path)(ctx, &view, &r.cite.text(ctx.rules)))
        .unwrap_or((Path::Unknown, String::new()));
    PairPath {
        a: a.index,
        b: b.index,
        path,
        why,
    }
}

pub fn transport(ctx: &Ctx<'_>) -> Transport {
    let inter_node = network::inter_node(ctx);
    let none = |path: Path, why: String| Transport {
        path,
        why,
        pairs: Vec::new(),
        inter_node: inter_node.clone(),
    };
    if !ctx.driver_ok() {
        return none(
            Path::NoGpu,
            format!("no usable NVIDIA driver (NVML {})", ctx.f.driver.nvml),
        );
    }
    if ctx.visible.is_empty() {
        return none(Path::NoGpu, "no GPU visible to a job".into());
    }
    if ctx.visible.len() == 1 {
        return none(
            Path::LocalCopy,
            "one GPU: a one-rank communicator copies locally (ncclLaunchOneRank, enqueue.cc:2570)".into(),
        );
    }
    let pairs: Vec<PairPath> = each_pair(&ctx.gpus).map(|(a, b)| pair_path(ctx, a, b)).collect();
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
