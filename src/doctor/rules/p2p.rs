//! NCCL's P2P transport between two GPUs (NVLink or PCIe): the P2P level, the distance,
//! CUDA P2P (`ncclTopoCheckP2p`, src/graph/paths.cc), and the proxy-memcpy variant.

use super::super::env::Setting;
use super::super::facts::{Gpu, Pair};
use super::super::model::{Finding, Level, Path, Request};
use super::topology::{PATH_LOC, PATH_NAMES, PATH_NVB, PATH_PXB, PATH_SYS, cuda_p2p, find_pair, path_type};
use super::{Ctx, Judged, src_of};

/// Whether NCCL's P2P transport connects a pair, and why not.
pub enum P2p {
    Yes,
    Off(String),
    Unknown(String),
}

/// What NCCL's P2P check sees between two GPUs.
pub struct PairView<'a> {
    /// NCCL's path type between them, and how it shows.
    pub distance: Option<(i32, String)>,
    pub p2p: P2p,
    /// The pair, when P2P is off because NVML reports its P2P status not ok.
    pub status_off: Option<&'a Pair>,
}

impl<'a> PairView<'a> {
    pub fn new(ctx: &Ctx<'a>, a: &Gpu, b: &Gpu) -> Self {
        let f = ctx.f;
        let pair = find_pair(f, a.index, b.index);
        let distance = path_type(f, a, b, pair);
        let (level, level_why) = p2p_level(ctx);
        let status = pair.map(|p| (p, cuda_p2p(p)));
        let mut status_off = None;
        let p2p = if level == PATH_LOC {
            P2p::Off(format!("P2P off: {level_why}"))
        } else {
            match (&distance, status) {
                (None, _) => P2p::Unknown("unknown: no topology from NVML".to_owned()),
                (Some((t, _)), _) if *t > level => P2p::Off(format!(
                    "P2P off: GPUs are {} apart, beyond the P2P level {level_why}",
                    PATH_NAMES[*t as usize]
                )),
                (Some(_), None | Some((_, None))) => {
                    P2p::Unknown("unknown: NVML gave no P2P status".to_owned())
                }
                (Some(_), Some((p, Some(false)))) => {
                    status_off = Some(p);
                    P2p::Off(format!("P2P off: NVML P2P read {}, write {}", read(p), write(p)))
                }
                (Some(_), Some((_, Some(true)))) => P2p::Yes,
            }
        };
        PairView {
            distance,
            p2p,
            status_off,
        }
    }

    fn topo(&self) -> String {
        self.distance
            .as_ref()
            .map_or("topology unknown".to_owned(), |(_, s)| s.clone())
    }

    fn nvlink(&self) -> bool {
        self.distance.as_ref().is_some_and(|(t, _)| *t <= PATH_NVB)
    }
}

fn read(p: &Pair) -> &str {
    p.p2p_read.as_deref().unwrap_or("?")
}

fn write(p: &Pair) -> &str {
    p.p2p_write.as_deref().unwrap_or("?")
}

/// P2P level: the user's, else PXB; SYS for x86 AMD CPUs with ≤ 2 GPUs
/// (graph/paths.cc, ncclTopoCheckP2p).
fn p2p_level(ctx: &Ctx<'_>) -> (i32, String) {
    let host = &ctx.f.host;
    let amd = host.cpu_vendor.as_deref() == Some("AuthenticAMD")
        && host.cpu_arch.as_deref().is_none_or(|a| a == "x86_64");
    match &ctx.ev.p2p_level {
        Some((l, why)) => (*l, why.clone()),
        None if amd && ctx.gpus.len() <= 2 => (
            PATH_SYS,
            "SYS (NCCL's default for AMD CPUs with ≤ 2 GPUs)".to_owned(),
        ),
        None => (PATH_PXB, "PXB (NCCL's default)".to_owned()),
    }
}

/// P2P with `NCCL_P2P_USE_CUDA_MEMCPY`: the proxy thread copies.
pub fn via_memcpy(ctx: &Ctx<'_>, v: &PairView<'_>, cite: &str) -> Option<(Path, String)> {
    (matches!(v.p2p, P2p::Yes) && ctx.ev.p2p_memcpy).then(|| {
        let s = ctx.ev.get("NCCL_P2P_USE_CUDA_MEMCPY");
        (
            Path::P2pMemcpy,
            format!(
                "{}; {} ({cite})",
                v.topo(),
                src_of(s.unwrap_or(&Setting::default()))
            ),
        )
    })
}

/// P2P: kernels load and store the peer's memory, over NVLink or PCIe.
pub fn direct(_: &Ctx<'_>, v: &PairView<'_>, _: &str) -> Option<(Path, String)> {
    matches!(v.p2p, P2p::Yes).then(|| {
        (
            if v.nvlink() {
                Path::NvlinkP2p
            } else {
                Path::PcieP2p
            },
            format!("{}; CUDA P2P ok", v.topo()),
        )
    })
}

/// Not knowable from NVML's facts.
pub fn unknown(_: &Ctx<'_>, v: &PairView<'_>, _: &str) -> Option<(Path, String)> {
    match &v.p2p {
        P2p::Unknown(why) => Some((Path::Unknown, why.clone())),
        _ => None,
    }
}

/// NVLink-connected GPUs with P2P reported disabled: NCCL refuses to start.
pub fn nvlink_p2p_disabled(j: &Judged<'_>, cite: &str) -> Vec<Finding> {
    let ctx = j.ctx;
    if ctx.ev.ignore_disabled_p2p != 0 {
        return Vec::new();
    }
    let gpu = |i: u32| ctx.gpus.iter().find(|g| g.index == i);
    j.transport
        .pairs
        .iter()
        .filter_map(|pp| {
            let (a, b) = (gpu(pp.a)?, gpu(pp.b)?);
            let v = PairView::new(ctx, a, b);
            let p = v.status_off.filter(|_| v.nvlink())?;
            Some(Finding {
                level: Level::Error,
                what: format!(
                    "GPU{} and GPU{} are NVLink-connected but NVML reports P2P read {}, write {}: NCCL refuses to start ('P2P is disabled between NVLINK connected GPUs', {cite})",
                    a.index,
                    b.index,
                    read(p),
                    write(p)
                ),
                fix: Some("check the GPUs and the fabric manager (nvidia-smi -q, nvidia-smi topo -p2p rw); NCCL_IGNORE_DISABLED_P2P=1 proceeds without P2P".into()),
            })
        })
        .collect()
}

/// Whether the transport here uses `want`, for a setting that asks for it.
pub fn path_request(j: &Judged<'_>, name: &str, want: Path, asks: &str) -> Option<Request> {
    let settings = &j.ctx.f.settings;
    let s = super::super::env::get(settings, name)
        .filter(|_| super::super::env::nccl_param(settings, name, 0) != 0)?;
    let t = j.transport;
    let any = t.pairs.iter().any(|p| p.path == want);
    let unknown = t.pairs.iter().any(|p| p.path == Path::Unknown);
    let honoured = if any {
        Some(true)
    } else if unknown || (t.pairs.is_empty() && t.path == Path::Unknown) {
        None
    } else {
        Some(false)
    };
    let why = match honoured {
        Some(true) => format!(
            "{} pair(s) use it",
            t.pairs.iter().filter(|p| p.path == want).count()
        ),
        None => "the transport is unknown here".into(),
        Some(false) => format!("the transport here is {}: {}", t.path.label(), t.why),
    };
    Some(Request {
        setting: src_of(s),
        asks: asks.into(),
        honoured,
        why,
    })
}

/// `NCCL_P2P_USE_CUDA_MEMCPY` asks for P2P through the proxy's cudaMemcpy.
pub fn memcpy_request(j: &Judged<'_>, _: &str) -> Option<Request> {
    path_request(
        j,
        "NCCL_P2P_USE_CUDA_MEMCPY",
        Path::P2pMemcpy,
        "P2P through proxy cudaMemcpy",
    )
}
