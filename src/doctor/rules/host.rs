//! The machine under NCCL: driver, visible GPUs, WSL2, torch's CUDA, GPU memory.

use super::super::model::{Finding, Level};
use super::{Judged, cuda_str};

/// No usable NVIDIA driver (and whether GPUs are on the PCI bus anyway).
pub fn no_driver(j: &Judged<'_>, _: &str) -> Option<Finding> {
    let f = j.ctx.f;
    if j.ctx.driver_ok() {
        return None;
    }
    let gpus_on_bus = f.pci.iter().filter(|p| p.kind == "gpu").count();
    Some(Finding {
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
    })
}

/// GPUs hidden by `CUDA_VISIBLE_DEVICES`.
pub fn visible_devices(j: &Judged<'_>, _: &str) -> Option<Finding> {
    let note = j.ctx.vis_note.clone()?;
    Some(Finding {
        level: if j.ctx.visible.is_empty() {
            Level::Warning
        } else {
            Level::Info
        },
        what: note,
        fix: None,
    })
}

/// WSL2: NVML answers partly, and NCCL treats CUDA IPC specially there.
pub fn wsl2(j: &Judged<'_>, cite: &str) -> Option<Finding> {
    let w = j.ctx.f.host.wsl2.as_ref()?;
    Some(Finding {
        level: Level::Warning,
        what: format!(
            "WSL2 ({w}): the GPU is paravirtualised through the Windows driver; NVML answers partly and NCCL treats legacy CUDA IPC specially there ({cite}, 'WSL WAR')"
        ),
        fix: Some("treat P2P and cuMem as unverified: run `zcta doctor --probe`, or use native Linux for multi-GPU runs".into()),
    })
}

/// torch built for a newer CUDA major than the driver supports.
pub fn torch_cuda_too_new(j: &Judged<'_>, _: &str) -> Option<Finding> {
    let f = j.ctx.f;
    let tc = f.python.torch.as_ref()?.cuda.as_deref()?;
    let tm = tc.split('.').next()?.parse::<i32>().ok()?;
    let dc = f.driver.cuda_driver?;
    (tm > dc / 1000).then(|| Finding {
        level: Level::Error,
        what: format!(
            "torch is built for CUDA {tc} but the driver supports CUDA {}: torch cannot use the GPUs",
            cuda_str(dc)
        ),
        fix: Some(format!(
            "install a driver for CUDA {tm} (R580+ for CUDA 13, R525+ for CUDA 12) or a torch built for CUDA {}",
            dc / 1000
        )),
    })
}

/// Visible GPUs with less than 10 % of their memory free.
pub fn low_memory(j: &Judged<'_>, _: &str) -> Vec<Finding> {
    j.ctx
        .f
        .gpus
        .iter()
        .filter(|g| j.ctx.visible.contains(&g.index))
        .filter_map(|g| {
            let (free, total) = (g.memory_free_bytes?, g.memory_total_bytes?);
            (total > 0 && free * 10 < total).then(|| Finding {
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
            })
        })
        .collect()
}
