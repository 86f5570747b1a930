//! From [`Facts`] to verdicts, with no I/O: which path each collective family takes
//! here, which copy-engine conditions are met or missing (and who decides each: the
//! machine or the program), which requests in the environment cannot be honoured, and
//! the fixes. The rules themselves, each with its citation, are the tables of
//! [`super::rules`], run here in order. The copy-engine rules are those of the NCCL a
//! torch process loads: the ones that differ between releases come from the table in
//! [`crate::nccl_rules`], which cites each release's source as `tag:file:line`; a
//! reference without a tag is to `v2.28.9-1` and holds unchanged through the newest
//! release checked. docs/doctor.md lists them.

use super::facts::Facts;
use super::rules::{self, Ctx, Judged, families, transport, whats};
use crate::nccl_rules::{NcclRules, Rule};

pub use super::rules::topology::visible_gpus;

pub use super::model::*;

/// Every verdict for `f`.
pub fn verdicts(f: &Facts) -> Report {
    let nccl_rules = NcclRules::for_facts(f);
    let (visible, vis_note) = visible_gpus(f);
    let ctx = Ctx::new(f, &nccl_rules, &visible, vis_note);
    let transport = transport::transport(&ctx);
    let ce: Vec<Condition> = rules::CONDITIONS.iter().filter_map(|r| r.judge(&ctx)).collect();
    let j = Judged::new(&ctx, &transport, &ce);
    let families = Family::ALL
        .iter()
        .map(|&fam| families::verdict(&j, fam))
        .collect();
    let requests: Vec<Request> = rules::REQUESTS
        .iter()
        .filter_map(|r| (r.request)(&j, &r.cite.text(&nccl_rules)))
        .collect();
    let findings: Vec<Finding> = rules::FINDINGS.iter().flat_map(|r| r.findings(&j)).collect();
    let fixes = fixes(&j, &requests, &findings);
    let summary = summary(&j, &requests);
    let exit_code = if requests.iter().any(|r| r.honoured == Some(false)) {
        EXIT_REQUEST_IMPOSSIBLE
    } else {
        0
    };
    Report {
        nccl_rules,
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

/// Every fix, deduplicated: requests first, then errors, missing machine conditions,
/// the program's part, warnings.
fn fixes(j: &Judged<'_>, requests: &[Request], findings: &[Finding]) -> Vec<String> {
    let mut fixes: Vec<String> = Vec::new();
    let mut add_fix = |s: String| {
        if !fixes.contains(&s) {
            fixes.push(s);
        }
    };
    for r in requests {
        if r.honoured == Some(false) {
            add_fix(format!("{} cannot be honoured: {}", r.setting, r.why));
        }
    }
    let fixes_at = |level: Level| {
        findings
            .iter()
            .filter(move |f| f.level == level)
            .filter_map(|f| f.fix.clone())
    };
    fixes_at(Level::Error).for_each(&mut add_fix);
    // Without a driver, the copy-engine steps beyond the driver itself come later.
    let no_driver = !j.ctx.driver_ok();
    for state in [State::Missing, State::ProgramMust] {
        for c in
            j.ce.iter()
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
    fixes_at(Level::Warning).for_each(&mut add_fix);
    fixes
}

/// The verdict in a few sentences.
fn summary(j: &Judged<'_>, requests: &[Request]) -> Vec<String> {
    let ctx = j.ctx;
    let mut summary = vec![gpus_line(j), copy_engine_line(j)];
    for r in requests.iter().filter(|r| r.honoured == Some(false)) {
        summary.push(format!("{} asks for {}: NOT POSSIBLE HERE.", r.setting, r.asks));
    }
    if let Some(c) = ctx.rules.caveat() {
        summary.push(c);
    }
    summary
}

fn gpus_line(j: &Judged<'_>) -> String {
    let f = j.ctx.f;
    if !j.ctx.driver_ok() {
        return format!(
            "No usable NVIDIA driver here (NVML {}): NCCL cannot run on a GPU. What follows is what can be read without one.",
            f.driver.nvml
        );
    }
    let t = j.transport;
    format!(
        "{} GPU(s) usable; between GPUs: {}{}.",
        j.ctx.visible.len(),
        t.path.label(),
        if t.why.is_empty() {
            String::new()
        } else {
            format!(" — {}", t.why)
        }
    )
}

fn copy_engine_line(j: &Judged<'_>) -> String {
    let rules = j.ctx.rules;
    let (_, program_must) = families::program_musts(rules, j.ce, j.ctx.f.nodes.count);
    if j.missing.is_empty() && j.unknown.is_empty() {
        format!(
            "Copy engine (zero-CTA) for AllGather and AlltoAll: possible here — your program must {program_must}."
        )
    } else if let Some(t) = j.auto_threshold {
        format!(
            "Copy engine (zero-CTA) for AllGather and AlltoAll: not taken here — missing: {}; yet {} sends an AllGather of more than {t} elements per rank by copy engine without CTA policy ZERO when its receive buffer is a symmetric window (NCCL_SYM_CE_THRESHOLD; sm100+ GPUs, NVLink between every pair: {}).",
            whats(&j.missing, "; "),
            rules.named(),
            rules.source(Rule::AutoCeAllGather)
        )
    } else if j.missing.is_empty() {
        format!(
            "Copy engine (zero-CTA) for AllGather and AlltoAll: cannot tell — {} (run --probe).",
            whats(&j.unknown, "; ")
        )
    } else {
        format!(
            "Copy engine (zero-CTA) for AllGather and AlltoAll: not taken here — missing: {}.",
            whats(&j.missing, "; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::env::Setting;
    use crate::doctor::facts::{Driver, Gpu, Library, Nodes, NvLink, Pair, PciDevice, Python, Torch};
    use crate::nccl_rules::Basis;

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
        assert_eq!(Family::of_op(crate::nccl::OpKind::Send), Some(Family::AlltoAll));
        assert_eq!(Family::of_op(crate::nccl::OpKind::Bcast), Some(Family::Broadcast));
        assert_eq!(Family::of_op(crate::nccl::OpKind::Reduce), None);
        assert!(Family::AllGather.ce_capable() && !Family::ReduceScatter.ce_capable());
    }
}
