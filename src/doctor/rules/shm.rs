//! NCCL's SHM transport (host shared memory) where P2P is off, and what can stop it:
//! `NCCL_SHM_DISABLE` (then the network), the proxy-memcpy variant, a small `/dev/shm`.

use super::super::env::Setting;
use super::super::model::{Finding, Level, Path, Request};
use super::p2p::{P2p, PairView, path_request};
use super::{Ctx, Judged, src_of};

/// P2P off and `NCCL_SHM_DISABLE=1`: the network, even within one node.
pub fn disabled(ctx: &Ctx<'_>, v: &PairView<'_>, cite: &str) -> Option<(Path, String)> {
    off_with(ctx, v, ctx.ev.shm_disable, "NCCL_SHM_DISABLE", cite).map(|why| (Path::Net, why))
}

/// P2P off and `NCCL_SHM_USE_CUDA_MEMCPY`: SHM with the proxy thread's copies.
pub fn via_memcpy(ctx: &Ctx<'_>, v: &PairView<'_>, cite: &str) -> Option<(Path, String)> {
    off_with(ctx, v, ctx.ev.shm_memcpy, "NCCL_SHM_USE_CUDA_MEMCPY", cite).map(|why| (Path::ShmMemcpy, why))
}

/// P2P off: kernels through host shared memory.
pub fn shm(_: &Ctx<'_>, v: &PairView<'_>, _: &str) -> Option<(Path, String)> {
    match &v.p2p {
        P2p::Off(why) => Some((Path::Shm, why.clone())),
        _ => None,
    }
}

/// Why P2P is off, and the setting `name` that takes over, when `set`.
fn off_with(ctx: &Ctx<'_>, v: &PairView<'_>, set: bool, name: &str, cite: &str) -> Option<String> {
    match &v.p2p {
        P2p::Off(why) if set => Some(format!(
            "{why}; {} ({cite})",
            src_of(ctx.ev.get(name).unwrap_or(&Setting::default()))
        )),
        _ => None,
    }
}

/// A `/dev/shm` below 512 MiB (Docker's default is 64 MiB).
pub fn small_dev_shm(j: &Judged<'_>, cite: &str) -> Option<Finding> {
    let host = &j.ctx.f.host;
    let b = host.dev_shm.as_ref()?.size_bytes.filter(|b| *b < (512 << 20))?;
    let uses_shm = matches!(j.transport.path, Path::Shm | Path::ShmMemcpy);
    Some(Finding {
        level: if uses_shm { Level::Error } else { Level::Warning },
        what: format!(
            "/dev/shm is {} MiB{}: NCCL creates its shared-memory segments there ({cite}: 'Error while creating shared memory segment'){}",
            b >> 20,
            host.container
                .as_deref()
                .map(|c| format!(" (container: {c})"))
                .unwrap_or_default(),
            if uses_shm {
                ", and the SHM transport is the path here"
            } else {
                ""
            }
        ),
        fix: Some("give the container more (docker run --shm-size=1g, or --ipc=host)".into()),
    })
}

/// `NCCL_SHM_USE_CUDA_MEMCPY` asks for SHM through the proxy's cudaMemcpy.
pub fn memcpy_request(j: &Judged<'_>, _: &str) -> Option<Request> {
    path_request(
        j,
        "NCCL_SHM_USE_CUDA_MEMCPY",
        Path::ShmMemcpy,
        "SHM through proxy cudaMemcpy",
    )
}
