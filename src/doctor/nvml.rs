//! The real NVML source: `nvml-wrapper` loads `libnvidia-ml.so.1` with `dlopen` at run
//! time, so a machine without the NVIDIA driver gets a clean [`NvmlOutcome::Absent`]
//! rather than a link error, and every query that fails becomes a `None` plus a note.

use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
use nvml_wrapper::error::NvmlError;

use super::facts::{Gpu, NvLink, NvmlFacts, NvmlOutcome, NvmlSource, Pair, norm_bus_id};

/// `NVML_NVLINK_MAX_LINKS` of nvml.h.
const MAX_LINKS: u32 = 18;

/// Queries the NVIDIA Management Library of the installed driver.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealNvml;

impl NvmlSource for RealNvml {
    fn query(&self) -> NvmlOutcome {
        // nvml-wrapper returns errors rather than panicking; the guard is a belt for an
        // unexpected enum value or symbol layout in a driver we never saw, caught
        // quietly: the report says the query failed, no panic message is printed.
        bounded(NVML_LIMIT, || {
            crate::reader::guarded(query)
                .unwrap_or_else(|_| NvmlOutcome::Failed("NVML query panicked".into()))
        })
    }
}

/// How long `zcta doctor` waits for NVML: a driver stuck on a faulty GPU can block its
/// calls for minutes, and the rest of the report does not need NVML.
const NVML_LIMIT: Duration = Duration::from_secs(20);

/// `f` on a thread of its own, given up after `limit` (the thread is left to finish
/// or to die with the process).
fn bounded(limit: Duration, f: impl FnOnce() -> NvmlOutcome + Send + 'static) -> NvmlOutcome {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("zcta-nvml".into())
        .spawn(move || {
            let _ = tx.send(f());
        });
    if let Err(e) = spawned {
        return NvmlOutcome::Failed(format!("could not start a thread for NVML: {e}"));
    }
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        NvmlOutcome::Failed(format!(
            "NVML did not answer within {} s (a driver or GPU in trouble?); the checks that need it are skipped",
            limit.as_secs_f64()
        ))
    })
}

fn init() -> Result<Nvml, NvmlError> {
    // The driver package always has the versioned name; the bare one comes with
    // development packages only (nvml-wrapper's default).
    match Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init()
    {
        Err(NvmlError::LibloadingError(_)) => Nvml::init(),
        r => r,
    }
}

fn query() -> NvmlOutcome {
    let nvml = match init() {
        Ok(n) => n,
        Err(NvmlError::LibloadingError(e)) => {
            let e = e.to_string();
            let detail = if e.contains("No such file") {
                String::new()
            } else {
                format!(" ({e})")
            };
            return NvmlOutcome::Absent(format!(
                "libnvidia-ml.so.1 not found{detail}: no NVIDIA driver installed, or its library is not on the loader path"
            ));
        }
        Err(NvmlError::DriverNotLoaded) => {
            return NvmlOutcome::Failed("the NVIDIA kernel driver is not loaded".into());
        }
        Err(NvmlError::NoPermission) => {
            return NvmlOutcome::Failed("no permission to talk to the NVIDIA driver".into());
        }
        Err(e) => return NvmlOutcome::Failed(format!("NVML did not start: {e}")),
    };
    let mut f = NvmlFacts::default();
    let mut note = |what: &str, e: NvmlError| f.notes.push(format!("NVML {what}: {e}"));
    f.nvml_version = nvml.sys_nvml_version().map_err(|e| note("version", e)).ok();
    f.driver_version = nvml
        .sys_driver_version()
        .map_err(|e| note("driver version", e))
        .ok();
    f.cuda_driver = nvml
        .sys_cuda_driver_version()
        .map_err(|e| note("CUDA driver version", e))
        .ok();
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            note("device count", e);
            0
        }
    };
    for i in 0..count {
        let d = match nvml.device_by_index(i) {
            Ok(d) => d,
            Err(e) => {
                note(&format!("GPU {i}"), e);
                continue;
            }
        };
        let mem = d.memory_info().ok();
        let mut g = Gpu {
            index: i,
            name: d.name().ok(),
            uuid: d.uuid().ok(),
            bus_id: d.pci_info().ok().map(|p| norm_bus_id(&p.bus_id)),
            memory_total_bytes: mem.as_ref().map(|m| m.total),
            memory_free_bytes: mem.as_ref().map(|m| m.free),
            compute_capability: d
                .cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
            numa_node: d.numa_node_id().ok().and_then(|n| i32::try_from(n).ok()),
            ..Gpu::default()
        };
        for l in 0..MAX_LINKS {
            let link = d.link_wrapper_for(l);
            match link.is_active() {
                Ok(true) => g.nvlinks.push(NvLink {
                    link: l,
                    remote_bus_id: link.remote_pci_info().ok().map(|p| norm_bus_id(&p.bus_id)),
                }),
                Ok(false) => {}
                // NotSupported (no NVLink on this GPU) or InvalidArg (past its links).
                Err(_) => break,
            }
        }
        f.gpus.push(g);
    }
    for a in 0..count {
        for b in a + 1..count {
            let (Ok(da), Ok(db)) = (nvml.device_by_index(a), nvml.device_by_index(b)) else {
                continue;
            };
            let st = |idx| da.p2p_status(&db, idx).ok().map(p2p_name);
            let p = Pair {
                a,
                b,
                p2p_read: st(P2pCapabilitiesIndex::Read),
                p2p_write: st(P2pCapabilitiesIndex::Write),
                p2p_nvlink: st(P2pCapabilitiesIndex::NvLink),
                topology: da.topology_common_ancestor(db).ok().map(topo_name),
            };
            f.pairs.push(p);
        }
    }
    NvmlOutcome::Loaded(f)
}

fn p2p_name(s: P2pStatus) -> String {
    match s {
        P2pStatus::Ok => "ok",
        P2pStatus::ChipsetNotSupported => "chipset_not_supported",
        P2pStatus::GpuNotSupported => "gpu_not_supported",
        P2pStatus::IohTopologyNotSupported => "ioh_topology_not_supported",
        P2pStatus::DisabledByRegkey => "disabled_by_regkey",
        P2pStatus::NotSupported => "not_supported",
        P2pStatus::Unknown => "unknown",
    }
    .into()
}

fn topo_name(t: TopologyLevel) -> String {
    match t {
        TopologyLevel::Internal => "internal",
        TopologyLevel::Single => "single",
        TopologyLevel::Multiple => "multiple",
        TopologyLevel::HostBridge => "hostbridge",
        TopologyLevel::Node => "node",
        TopologyLevel::System => "system",
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_nvml_is_given_up_on() {
        let out = bounded(Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_secs(30));
            NvmlOutcome::Absent("late".into())
        });
        match out {
            NvmlOutcome::Failed(why) => assert!(why.contains("did not answer within 0.05 s"), "{why}"),
            _ => panic!("expected a timeout"),
        }
        let quick = bounded(Duration::from_secs(30), || NvmlOutcome::Absent("none".into()));
        assert!(matches!(quick, NvmlOutcome::Absent(ref s) if s == "none"));
    }
}
