//! `zcta doctor` without a GPU: facts gathered from a fake machine (a filesystem root
//! with /sys, /proc, /etc, /usr, a site-packages, a fake NVML and a fake Python), the
//! binary end to end on injected facts (`--facts`: table, `--json`, exit codes), and
//! the probe's judgement of a run directory written with the real sink.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use zcta::doctor::facts::{
    self, Facts, Gpu, NvLink, NvmlFacts, NvmlOutcome, NvmlSource, Pair, PyInfo, PythonSource, System,
};
use zcta::doctor::probe::{self, ProbeStatus};
use zcta::doctor::verdict::{Family, Level, Path as DPath};
use zcta::doctor::{EXIT_PROBE, EXIT_REQUEST_IMPOSSIBLE, verdicts};
use zcta::gpu::{Engine, OpGpu, OpRow};
use zcta::nccl::OpKind;
use zcta::record::OpRecord;
use zcta::sink::{DatasetWriter, SinkPolicy, write_process_file};
use zcta::tables::{Ctx, OpsTable, ProcessRow};

// ---------------------------------------------------------------- fake machine

struct FakeNvml(NvmlOutcome);
impl NvmlSource for FakeNvml {
    fn query(&self) -> NvmlOutcome {
        self.0.clone()
    }
}

struct FakePython(Result<PyInfo, String>);
impl PythonSource for FakePython {
    fn interpreter(&self) -> String {
        "fake-python".into()
    }
    fn query(&self) -> Result<PyInfo, String> {
        self.0.clone()
    }
}

fn write(root: &Path, rel: &str, content: &[u8]) -> PathBuf {
    let p = root.join(rel.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, content).unwrap();
    p
}

fn symlink(root: &Path, target: &str, rel: &str) {
    std::os::unix::fs::symlink(target, root.join(rel.trim_start_matches('/'))).unwrap();
}

fn pci(root: &Path, bdf: &str, vendor: &str, class: &str, numa: &str) {
    let d = format!("sys/bus/pci/devices/{bdf}");
    write(root, &format!("{d}/vendor"), format!("{vendor}\n").as_bytes());
    write(root, &format!("{d}/class"), format!("{class}\n").as_bytes());
    write(root, &format!("{d}/numa_node"), format!("{numa}\n").as_bytes());
    write(root, &format!("{d}/current_link_speed"), b"32.0 GT/s PCIe\n");
    write(root, &format!("{d}/current_link_width"), b"16\n");
}

/// A 2-GPU box in a container: driver 580 in /proc, two GPUs (and an audio function
/// and an Intel bridge) in sysfs, IB, a 64 MiB /dev/shm, nccl.conf in /etc and in the
/// user's home, a system libnccl 2.28.3, a CUDA 13.0 toolkit with CUPTI, and a
/// site-packages with torch 2.11+cu130 and its NCCL 2.28.9 / CUPTI / cudart wheels.
/// Plus an LD_LIBRARY_PATH folder with an NCCL 2.27.7.
fn fake_machine(t: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let root = t.join("root");
    write(&root, "/proc/sys/kernel/hostname", b"gpubox\n");
    write(&root, "/proc/sys/kernel/osrelease", b"6.8.0-60-generic\n");
    write(
        &root,
        "/proc/self/mounts",
        b"proc /proc proc rw 0 0\nshm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k 0 0\n",
    );
    write(
        &root,
        "/proc/cpuinfo",
        b"processor\t: 0\nvendor_id\t: GenuineIntel\n",
    );
    write(
        &root,
        "/proc/driver/nvidia/version",
        b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025\nGCC version: gcc 12\n",
    );
    write(
        &root,
        "/proc/self/status",
        b"Name:\tzcta\nUid:\t1000\t1000\t1000\t1000\n",
    );
    write(
        &root,
        "/proc/self/limits",
        b"Limit Soft Hard Units\nMax locked memory         8388608              8388608              bytes\n",
    );
    write(
        &root,
        "/etc/passwd",
        b"root:x:0:0::/root:/bin/sh\nu:x:1000:1000::/home/u:/bin/bash\n",
    );
    write(&root, "/.dockerenv", b"");
    pci(&root, "0000:19:00.0", "0x10de", "0x030200", "0");
    pci(&root, "0000:3b:00.0", "0x10de", "0x030200", "1");
    pci(&root, "0000:19:00.1", "0x10de", "0x040300", "0");
    pci(&root, "0000:00:00.0", "0x8086", "0x060000", "0");
    std::fs::create_dir_all(root.join("sys/class/infiniband/mlx5_0")).unwrap();
    write(
        &root,
        "/etc/nccl.conf",
        b"NCCL_CTA_POLICY=0\nNCCL_SHM_DISABLE=1\n",
    );
    write(
        &root,
        "/home/u/.nccl.conf",
        b"# mine\nNCCL_CTA_POLICY=1\nNCCL_P2P_LEVEL=NVL\n",
    );
    write(
        &root,
        "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3",
        b"\x7fELF no version string here",
    );
    symlink(
        &root,
        "libnccl.so.2.28.3",
        "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
    );
    write(
        &root,
        "/usr/local/cuda-13.0/version.json",
        br#"{"cuda": {"name": "CUDA SDK", "version": "13.0.1"}}"#,
    );
    write(
        &root,
        "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.2025.3.1",
        b"\x7fELF",
    );
    symlink(
        &root,
        "libcupti.so.2025.3.1",
        "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.13",
    );

    let sp = t.join("venv/lib/python3.12/site-packages");
    write(
        &sp,
        "torch/version.py",
        b"from typing import Optional\n__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n",
    );
    write(&sp, "torch/__init__.py", b"");
    write(
        &sp,
        "nvidia/nccl/lib/libnccl.so.2",
        b"\x7fELF\0\0NCCL version %s\0padding\0NCCL version 2.28.9+cuda13.0\0rest",
    );
    std::fs::create_dir_all(sp.join("nvidia_nccl_cu13-2.28.9.dist-info")).unwrap();
    write(&sp, "nvidia/cu13/lib/libcupti.so.13", b"\x7fELF");
    std::fs::create_dir_all(sp.join("nvidia_cuda_cupti-13.0.85.dist-info")).unwrap();
    write(&sp, "nvidia/cu13/lib/libcudart.so.13", b"\x7fELF");
    std::fs::create_dir_all(sp.join("nvidia_cuda_runtime-13.0.96.dist-info")).unwrap();

    let ld = t.join("ldlib");
    write(&ld, "libnccl.so.2", b"..NCCL version 2.27.7+cuda12.9\0");
    (root, sp, ld)
}

fn h200_nvml() -> NvmlFacts {
    let gpu = |i: u32, bus: &str, peer: &str| Gpu {
        index: i,
        name: Some("NVIDIA H200".into()),
        uuid: Some(format!("GPU-{i}{i}{i}")),
        bus_id: Some(bus.into()),
        memory_total_bytes: Some(150_000 << 20),
        memory_free_bytes: Some(149_000 << 20),
        compute_capability: Some("9.0".into()),
        numa_node: None,
        pcie: None,
        nvlinks: (0..18)
            .map(|l| NvLink {
                link: l,
                remote_bus_id: Some(peer.into()),
            })
            .collect(),
    };
    NvmlFacts {
        nvml_version: Some("13.580.65.06".into()),
        driver_version: Some("580.65.06".into()),
        cuda_driver: Some(13000),
        gpus: vec![
            gpu(0, "0000:19:00.0", "0000:3b:00.0"),
            gpu(1, "0000:3b:00.0", "0000:19:00.0"),
        ],
        pairs: vec![Pair {
            a: 0,
            b: 1,
            topology: Some("system".into()),
            p2p_read: Some("ok".into()),
            p2p_write: Some("ok".into()),
            p2p_nvlink: Some("ok".into()),
        }],
        notes: Vec::new(),
    }
}

fn gather_fake(t: &Path, nvml: NvmlOutcome, extra_env: &[(&str, String)]) -> Facts {
    let (root, sp, ld) = fake_machine(t);
    let mut env: BTreeMap<String, String> = [
        ("NCCL_CTA_POLICY", "2".to_string()),
        ("LD_LIBRARY_PATH", ld.display().to_string()),
        ("WORLD_SIZE", "4".into()),
        ("LOCAL_WORLD_SIZE", "2".into()),
        ("PATH", "/usr/bin".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in extra_env {
        env.insert(k.to_string(), v.clone());
    }
    let home = facts::home_dir(&root, &env);
    assert_eq!(
        home.as_deref(),
        Some(Path::new("/home/u")),
        "getpwuid's home, not $HOME"
    );
    let py = FakePython(Ok(PyInfo {
        executable: "/venv/bin/python3".into(),
        version: "3.12.3".into(),
        site_packages: vec![sp.display().to_string()],
        torch_dir: Some(sp.join("torch").display().to_string()),
    }));
    let nv = FakeNvml(nvml);
    facts::gather(&System {
        root,
        env,
        home,
        nvml: &nv,
        python: &py,
        nodes: None,
    })
}

fn setting<'a>(f: &'a Facts, name: &str) -> &'a zcta::doctor::env::Setting {
    f.settings
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} missing"))
}

#[test]
fn gathers_a_fake_machine_without_nvml() {
    let t = tempfile::tempdir().unwrap();
    let f = gather_fake(
        t.path(),
        NvmlOutcome::Absent("libnvidia-ml.so.1 not found".into()),
        &[],
    );
    // Host.
    assert_eq!(f.host.hostname.as_deref(), Some("gpubox"));
    assert_eq!(f.host.container.as_deref(), Some("docker (/.dockerenv)"));
    assert_eq!(f.host.dev_shm.as_ref().and_then(|s| s.size_bytes), Some(64 << 20));
    assert_eq!(f.host.cpu_vendor.as_deref(), Some("GenuineIntel"));
    assert_eq!(f.host.ib_devices, vec!["mlx5_0".to_string()]);
    assert_eq!(f.host.memlock.as_deref(), Some("8388608"));
    assert!(f.host.wsl2.is_none());
    // PCI: the two GPUs only (not the audio function, not Intel's bridge).
    let gpus: Vec<(&str, Option<i32>, Option<&str>)> = f
        .pci
        .iter()
        .map(|p| (p.bus_id.as_str(), p.numa_node, p.pcie.as_deref()))
        .collect();
    assert_eq!(
        gpus,
        vec![
            ("0000:19:00.0", Some(0), Some("Gen5 x16")),
            ("0000:3b:00.0", Some(1), Some("Gen5 x16"))
        ]
    );
    // Driver from /proc; the CUDA version inferred (a lower bound) and saying so.
    assert_eq!(f.driver.nvml, "absent");
    assert_eq!(f.driver.version.as_deref(), Some("580.65.06"));
    assert_eq!(
        f.driver.version_source.as_deref(),
        Some("/proc/driver/nvidia/version")
    );
    assert_eq!(f.driver.cuda_driver, Some(13000));
    assert!(
        f.driver
            .cuda_driver_source
            .as_deref()
            .unwrap()
            .starts_with("inferred")
    );
    // Settings: environment > ~/.nccl.conf > /etc/nccl.conf, every source named.
    let cta = setting(&f, "NCCL_CTA_POLICY");
    assert_eq!((cta.value.as_str(), cta.source.as_str()), ("2", "environment"));
    let shadowed: Vec<(&str, &str)> = cta
        .shadowed
        .iter()
        .map(|s| (s.value.as_str(), s.source.as_str()))
        .collect();
    assert_eq!(
        shadowed,
        vec![("1", "/home/u/.nccl.conf"), ("0", "/etc/nccl.conf")]
    );
    assert_eq!(setting(&f, "NCCL_P2P_LEVEL").source, "/home/u/.nccl.conf");
    assert_eq!(setting(&f, "NCCL_SHM_DISABLE").source, "/etc/nccl.conf");
    assert!(
        f.settings
            .iter()
            .all(|s| s.name != "PATH" && s.name != "WORLD_SIZE")
    );
    // Nodes from the launcher's variables.
    assert_eq!(
        (f.nodes.count, f.nodes.source.as_str()),
        (2, "WORLD_SIZE/LOCAL_WORLD_SIZE")
    );
    // Python and torch (version.py, never imported).
    let torch = f.python.torch.as_ref().unwrap();
    assert_eq!(torch.version.as_deref(), Some("2.11.0+cu130"));
    assert_eq!(torch.cuda.as_deref(), Some("13.0"));
    // NCCL: three copies; torch's wheel is the one torch loads.
    let nccl: Vec<(&str, Option<&str>, Option<&str>, bool)> = f
        .nccl
        .iter()
        .map(|l| {
            (
                l.origin.as_str(),
                l.version.as_deref(),
                l.version_source.as_deref(),
                l.selected,
            )
        })
        .collect();
    assert_eq!(
        nccl,
        vec![
            ("torch wheel", Some("2.28.9"), Some("string in the library"), true),
            (
                "LD_LIBRARY_PATH",
                Some("2.27.7"),
                Some("string in the library"),
                false
            ),
            ("system", Some("2.28.3"), Some("file name"), false),
        ]
    );
    assert_eq!(f.nccl[0].built_for_cuda.as_deref(), Some("13.0"));
    assert_eq!(f.nccl[2].path, "/usr/lib/x86_64-linux-gnu/libnccl.so.2");
    assert_eq!(
        f.nccl[2].real_path.as_deref(),
        Some("/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3")
    );
    // CUPTI: torch's wheel (selected: zcta reuses it) and the toolkit's.
    let cupti: Vec<(&str, Option<&str>, bool)> = f
        .cupti
        .iter()
        .map(|l| (l.origin.as_str(), l.version.as_deref(), l.selected))
        .collect();
    assert_eq!(
        cupti,
        vec![
            ("torch wheel", Some("13.0.85"), true),
            ("CUDA toolkit", Some("2025.3.1"), false)
        ]
    );
    // CUDA versions.
    let cuda: Vec<(&str, &str)> = f
        .cuda
        .iter()
        .map(|c| (c.what.as_str(), c.version.as_str()))
        .collect();
    assert_eq!(
        cuda,
        vec![
            ("torch build", "13.0"),
            ("CUDA runtime (wheel)", "13.0.96"),
            ("CUDA toolkit", "13.0.1"),
            ("NCCL's runtime (static)", "13.0"),
        ]
    );
    // The facts survive the JSON round trip `--facts` relies on.
    let back: Facts = serde_json::from_value(serde_json::to_value(&f).unwrap()).unwrap();
    assert_eq!(back, f);

    // Verdicts: no driver, yet NCCL_CTA_POLICY=2 on two nodes → exit 3.
    let r = verdicts(&f);
    assert_eq!(r.exit_code, EXIT_REQUEST_IMPOSSIBLE);
    assert!(
        r.findings
            .iter()
            .any(|x| x.what.contains("2 NVIDIA GPU(s) on the PCI bus"))
    );
    assert!(
        r.findings
            .iter()
            .any(|x| x.level == Level::Warning && x.what.contains("the LD_LIBRARY_PATH copy wins if")),
        "{:?}",
        r.findings
    );
    // Two nodes over IB with an 8 MiB memlock limit.
    assert!(
        r.findings
            .iter()
            .any(|x| x.what.starts_with("locked-memory limit is 8388608"))
    );
    assert_eq!(r.transport.inter_node.as_deref(), Some("IB (mlx5_0)"));
}

#[test]
fn nvml_facts_are_completed_from_sysfs() {
    let t = tempfile::tempdir().unwrap();
    let f = gather_fake(
        t.path(),
        NvmlOutcome::Loaded(h200_nvml()),
        &[("WORLD_SIZE", "2".into()), ("CUDA_VISIBLE_DEVICES", "0,1".into())],
    );
    assert_eq!(f.driver.nvml, "loaded");
    assert_eq!(f.driver.cuda_driver_source.as_deref(), Some("NVML"));
    assert_eq!(f.gpus[1].numa_node, Some(1), "NUMA from sysfs");
    assert_eq!(f.gpus[0].pcie.as_deref(), Some("Gen5 x16"));
    assert_eq!(f.nodes.count, 1);
    let r = verdicts(&f);
    // NCCL_SHM_DISABLE=1 from /etc/nccl.conf does not matter: NVLink P2P is used;
    // NCCL_P2P_LEVEL=NVL from ~/.nccl.conf allows NVLink.
    assert_eq!(r.transport.path, DPath::NvlinkP2p);
    let ag = r.families.iter().find(|v| v.family == Family::AllGather).unwrap();
    assert_eq!(ag.path, DPath::CopyEngine);
    assert_eq!(r.exit_code, 0);
}

#[test]
fn wsl2_is_detected_and_makes_cumem_unknown() {
    let t = tempfile::tempdir().unwrap();
    let (root, _, _) = fake_machine(t.path());
    write(&root, "/dev/dxg", b"");
    let nv = FakeNvml(NvmlOutcome::Loaded(h200_nvml()));
    let py = FakePython(Err("fake-python not found".into()));
    let f = facts::gather(&System {
        root,
        env: BTreeMap::new(),
        home: None,
        nvml: &nv,
        python: &py,
        nodes: Some(1),
    });
    assert_eq!(f.host.wsl2.as_deref(), Some("/dev/dxg present"));
    assert!(f.python.torch.is_none());
    assert_eq!(f.python.error.as_deref(), Some("fake-python not found"));
    // Without torch the system copy is what a program would load.
    assert!(f.nccl.iter().any(|l| l.origin == "system" && l.selected));
    let r = verdicts(&f);
    let cumem = r.copy_engine.iter().find(|c| c.key == "cumem").unwrap();
    assert_eq!(cumem.state, zcta::doctor::verdict::State::Unknown);
    assert!(r.findings.iter().any(|x| x.what.starts_with("WSL2")));
}

// ---------------------------------------------------------------- the binary

fn zcta(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zcta"))
        .args(args)
        .env_remove("NCCL_CTA_POLICY")
        .env_remove("ZCTA_SHIM")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Facts of the 2×H200 as a JSON document, with `settings` added.
fn h200_json(settings: &[(&str, &str)]) -> Value {
    let n = h200_nvml();
    json!({
        "facts_version": 1,
        "host": {"hostname": "h200box", "kernel": "6.8.0"},
        "driver": {"nvml": "loaded", "version": "580.65.06", "version_source": "NVML",
                   "cuda_driver": 13000, "cuda_driver_source": "NVML", "kernel_module": true},
        "gpus": serde_json::to_value(&n.gpus).unwrap(),
        "pairs": serde_json::to_value(&n.pairs).unwrap(),
        "nodes": {"count": 1, "source": "assumed"},
        "python": {"interpreter": "python3", "executable": "/opt/torch/.venv/bin/python3",
                   "torch": {"dir": "/sp/torch", "version": "2.11.0+cu130", "cuda": "13.0"}},
        "nccl": [{"path": "/sp/nvidia/nccl/lib/libnccl.so.2", "origin": "torch wheel",
                  "version": "2.28.9", "built_for_cuda": "13.0", "selected": true}],
        "cupti": [{"path": "/sp/nvidia/cu13/lib/libcupti.so.13", "origin": "torch wheel",
                   "version": "13.0.85", "selected": true}],
        "settings": settings.iter().map(|(k, v)| json!({"name": k, "value": v, "source": "environment"})).collect::<Vec<_>>(),
    })
}

fn facts_file(t: &Path, name: &str, v: &Value) -> String {
    let p = t.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p.display().to_string()
}

#[test]
fn table_and_exit_codes_on_injected_facts() {
    let t = tempfile::tempdir().unwrap();
    let plain = facts_file(t.path(), "plain.json", &h200_json(&[]));
    let (code, out, err) = zcta(&["doctor", "--facts", &plain]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "zcta doctor — NCCL data paths on h200box",
        "GPU0-GPU1  SM kernels over NVLink P2P: NV18 (18 NVLinks); CUDA P2P ok",
        "machine  MISSING  NCCL_CTA_POLICY=2",
        "program  must",
        "AlltoAll/Send-Recv",
        "exit 0:",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }

    let ce = facts_file(t.path(), "ce.json", &h200_json(&[("NCCL_CTA_POLICY", "2")]));
    let (code, out, _) = zcta(&["doctor", "--facts", &ce]);
    assert_eq!(code, 0);
    assert!(out.contains("copy engine (zero-CTA, no kernel)*"), "{out}");
    assert!(out.contains("* otherwise: SM kernels over NVLink P2P"), "{out}");
    assert!(
        out.contains("asks for the copy engine for AllGather and AlltoAll: possible"),
        "{out}"
    );

    // Same facts, but the job spans two nodes: the requested path is impossible.
    let (code, out, _) = zcta(&["doctor", "--facts", &ce, "--nodes", "2"]);
    assert_eq!(code, i32::from(EXIT_REQUEST_IMPOSSIBLE), "{out}");
    assert!(out.contains("NOT POSSIBLE HERE"), "{out}");
    assert!(out.contains("exit 3:"), "{out}");

    let p2poff = facts_file(
        t.path(),
        "p2poff.json",
        &h200_json(&[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_USE_CUDA_MEMCPY", "1")]),
    );
    let (code, out, _) = zcta(&["doctor", "--facts", &p2poff]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("TRANSPORT BETWEEN GPUS: SHM + proxy cudaMemcpy"),
        "{out}"
    );
}

#[test]
fn json_document_shape() {
    let t = tempfile::tempdir().unwrap();
    let ce = facts_file(t.path(), "ce.json", &h200_json(&[("NCCL_CTA_POLICY", "2")]));
    let (code, out, err) = zcta(&["doctor", "--facts", &ce, "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["zcta_doctor"], 1);
    assert_eq!(j["exit_code"], 0);
    assert!(j["probe"].is_null());
    assert_eq!(j["facts"]["gpus"].as_array().unwrap().len(), 2);
    let fams = j["report"]["families"].as_array().unwrap();
    let got: Vec<(&str, &str)> = fams
        .iter()
        .map(|f| (f["family"].as_str().unwrap(), f["path"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("AllReduce", "nvlink_p2p"),
            ("AllGather", "copy_engine"),
            ("ReduceScatter", "nvlink_p2p"),
            ("AlltoAll", "copy_engine"),
            ("Broadcast", "nvlink_p2p"),
        ]
    );
    assert_eq!(fams[1]["fallback"], "nvlink_p2p");
    let conds = j["report"]["copy_engine"].as_array().unwrap();
    for c in conds {
        for k in ["key", "what", "decided_by", "state", "evidence", "source"] {
            assert!(c.get(k).is_some(), "{k} missing in {c}");
        }
    }
    let program: Vec<&str> = conds
        .iter()
        .filter(|c| c["decided_by"] == "program")
        .map(|c| c["key"].as_str().unwrap())
        .collect();
    assert_eq!(program, vec!["symmetric_windows", "side_stream"]);
    assert!(
        conds
            .iter()
            .filter(|c| c["decided_by"] == "machine")
            .all(|c| c["state"] == "met")
    );
    assert_eq!(j["report"]["requests"][0]["honoured"], true);
    assert_eq!(j["report"]["transport"]["pairs"][0]["path"], "nvlink_p2p");
}

#[test]
fn probe_that_cannot_run_exits_4_and_3_wins() {
    let t = tempfile::tempdir().unwrap();
    // No driver: the probe cannot run.
    let mut nodrv = h200_json(&[]);
    nodrv["driver"] = json!({"nvml": "absent", "nvml_error": "libnvidia-ml.so.1 not found"});
    nodrv["gpus"] = json!([]);
    nodrv["pairs"] = json!([]);
    let p = facts_file(t.path(), "nodrv.json", &nodrv);
    let (code, out, _) = zcta(&["doctor", "--facts", &p, "--probe", "--json"]);
    assert_eq!(code, i32::from(EXIT_PROBE), "{out}");
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["probe"]["status"], "not_run");
    assert!(
        j["probe"]["reason"]
            .as_str()
            .unwrap()
            .contains("no usable NVIDIA driver")
    );
    assert_eq!(j["exit_code"], 4);

    // Two GPUs and torch, but no shim where we point.
    let p = facts_file(t.path(), "h200.json", &h200_json(&[]));
    let (code, out, _) = zcta(&[
        "doctor",
        "--facts",
        &p,
        "--probe",
        "--shim",
        "/nonexistent/libzcta_prof.so",
    ]);
    assert_eq!(code, i32::from(EXIT_PROBE), "{out}");
    assert!(
        out.contains("PROBE (plain buffers on the current stream): did not run"),
        "{out}"
    );
    assert!(
        out.contains("/nonexistent/libzcta_prof.so: no such file"),
        "{out}"
    );

    // No torch.
    let mut notorch = h200_json(&[]);
    notorch["python"] = json!({"interpreter": "python3", "error": "python3 not found"});
    let p = facts_file(t.path(), "notorch.json", &notorch);
    let (code, out, _) = zcta(&["doctor", "--facts", &p, "--probe"]);
    assert_eq!(code, i32::from(EXIT_PROBE));
    assert!(
        out.contains("cannot run: no torch for python3 (python3 not found)"),
        "{out}"
    );

    // A requested path that is impossible wins over the probe.
    let mut both = nodrv.clone();
    both["settings"] = json!([{"name": "NCCL_CTA_POLICY", "value": "2", "source": "/etc/nccl.conf"}]);
    let p = facts_file(t.path(), "both.json", &both);
    let (code, out, _) = zcta(&["doctor", "--facts", &p, "--probe"]);
    assert_eq!(code, i32::from(EXIT_REQUEST_IMPOSSIBLE), "{out}");
    assert!(out.contains("NCCL_CTA_POLICY=2 (/etc/nccl.conf)"), "{out}");
}

#[test]
fn bad_input_exits_2_and_help_documents_exit_codes() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("bad.json");
    std::fs::write(&p, "not json").unwrap();
    let (code, _, err) = zcta(&["doctor", "--facts", p.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("not a facts document"), "{err}");
    let (code, _, _) = zcta(&["doctor", "--nodes", "0"]);
    assert_eq!(code, 2);
    let (code, out, _) = zcta(&["doctor", "--help"]);
    assert_eq!(code, 0);
    for want in [
        "Exit status:",
        "  3  a setting asks for a path",
        "  4  --probe could not run",
    ] {
        assert!(out.contains(want), "{want:?} not in --help:\n{out}");
    }
    assert!(!out.contains("--facts"), "--facts is for tests only");
}

#[test]
fn real_machine_never_fails_without_a_gpu() {
    // This machine (CI: no GPU, maybe no python/torch): the doctor must report, not
    // crash, and exit 0 when nothing is requested.
    let out = Command::new(env!("CARGO_BIN_EXE_zcta"))
        .args(["doctor", "--json"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("NCCL_CONF_FILE", "/nonexistent/nccl.conf")
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let nvml = j["facts"]["driver"]["nvml"].as_str().unwrap();
    assert!(["loaded", "absent", "failed"].contains(&nvml), "{nvml}");
    // /etc/nccl.conf on the machine could ask for something; else 0.
    let requested = !j["report"]["requests"].as_array().unwrap().is_empty();
    assert!(code == 0 || (requested && code == 3), "exit {code}");
    assert_eq!(j["exit_code"], code);
}

// ---------------------------------------------------------------- the probe's judgement

fn op_row(op_id: u64, kind: OpKind, rank: i32, engine: Option<Engine>) -> OpRow {
    let t = 1_000_000_000_000 + op_id as i64 * 1_000_000;
    OpRow {
        rec: OpRecord {
            comm_id: Some(0xC0),
            comm_ptr: 0x1000,
            rank: Some(rank),
            nranks: Some(2),
            seq: Some(op_id),
            call_seq: Some(op_id),
            count: 1 << 20,
            dtype: 7,
            bytes: Some(4 << 20),
            sendbuff: 0x7000_0000,
            recvbuff: 0x8000_0000,
            stream: 0x55,
            device: Some(rank),
            api_start_ns: t,
            api_end_ns: t + 5_000,
            tid: 100 + rank,
            gpu_marked: true,
            graph_captured: Some(false),
            ..OpRecord::blank(op_id, kind)
        },
        gpu: engine.map(|e| OpGpu {
            launch_ns: Some(t + 1_000),
            gpu_ready_ns: Some(t + 1_500),
            gpu_start_ns: Some(t + 2_000),
            gpu_end_ns: Some(t + 50_000),
            engine: e,
            kernel: None,
            n_kernels: u32::from(e != Engine::CopyEngine),
            n_memcpy: 0,
            memcpy_bytes: 0,
            source: zcta::gpu::GpuSourceKind::Cupti,
        }),
    }
}

/// A probe run: 2 ranks × 5 iterations of the five families; AllGather and AlltoAll
/// on `ce_engine`, the rest on SM kernels (`None`: CUPTI off everywhere).
fn probe_run(dir: &Path, ce_engine: Option<Engine>, others: Option<Engine>) {
    for rank in 0..2 {
        let pid = 100 + rank;
        let prefix = format!("box-r{rank}-p{pid}");
        let ctx = Ctx {
            pid,
            host: "box".into(),
        };
        let mut w = DatasetWriter::<OpsTable>::new(dir, &prefix, SinkPolicy::default());
        let mut id = 0;
        for _ in 0..5 {
            for (k, e) in [
                (OpKind::AllReduce, others),
                (OpKind::AllGather, ce_engine),
                (OpKind::AlltoAll, ce_engine),
                (OpKind::ReduceScatter, others),
                (OpKind::Broadcast, others),
            ] {
                id += 1;
                w.append(&op_row(id, k, rank, e), &ctx).unwrap();
            }
        }
        w.close().unwrap();
        let row = ProcessRow {
            run_id: "doctor-probe".into(),
            run_id_source: "ZCTA_RUN_ID".into(),
            zcta_version: "test".into(),
            schema_version: zcta::SCHEMA_VERSION,
            clock: "CLOCK_REALTIME".into(),
            end_reason: "exit".into(),
            env_json: "{}".into(),
            profiler_plugin: "zcta".into(),
            cupti: if others.is_some() {
                "on"
            } else {
                "off: ZCTA_CUPTI=0"
            }
            .into(),
            nccl_lib: Some("/sp/nvidia/nccl/lib/libnccl.so.2".into()),
            nccl_version: Some(22809),
            ..ProcessRow::default()
        };
        write_process_file(dir, &prefix, &row, &ctx).unwrap();
    }
}

const LOG_P2P: &str = "\
box:100:100 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
box:100:100 [0] NCCL INFO cudaDriverVersion 13000
box:100:100 [0] NCCL INFO Check P2P Type isAllDirectP2p 1 directMode 0 isAllCudaP2p 1
box:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
box:101:101 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM
";

fn facts_of(v: &Value) -> Facts {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn probe_agrees_on_the_copy_engine_path() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("doctor-probe");
    probe_run(&dir, Some(Engine::CopyEngine), Some(Engine::SmKernel));
    let f = facts_of(&h200_json(&[("NCCL_CTA_POLICY", "2")]));
    let r = verdicts(&f);
    let log = format!(
        "{LOG_P2P}box:100:100 [0] NCCL INFO Init CE, rank 0 baseUCSymReadyPtr 0x1, baseUCSymComplPtr 0x2, seq num 0\n"
    );
    let p = probe::judge(&f, &r, &dir, &log, true);
    assert_eq!(p.status, ProbeStatus::Agreed, "{}", p.render_text());
    let ag = p.families.iter().find(|x| x.family == Family::AllGather).unwrap();
    assert_eq!(
        (ag.predicted, ag.seen),
        (DPath::CopyEngine, Some(DPath::CopyEngine))
    );
    assert_eq!(ag.engines.get("copy_engine"), Some(&10));
    let ar = p.families.iter().find(|x| x.family == Family::AllReduce).unwrap();
    assert_eq!(ar.seen, Some(DPath::NvlinkP2p));
    assert!(p.checks.iter().all(|c| c.agrees == Some(true)), "{:?}", p.checks);
    assert!(p.checks.iter().any(|c| c.what.starts_with("NCCL library loaded")));
}

#[test]
fn probe_disagrees_when_the_copy_engine_was_not_taken() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("doctor-probe");
    probe_run(&dir, Some(Engine::SmKernel), Some(Engine::SmKernel));
    let f = facts_of(&h200_json(&[("NCCL_CTA_POLICY", "2")]));
    let r = verdicts(&f);
    let p = probe::judge(&f, &r, &dir, LOG_P2P, true);
    assert_eq!(p.status, ProbeStatus::Disagreed);
    let ag = p.families.iter().find(|x| x.family == Family::AllGather).unwrap();
    assert_eq!(ag.agrees, Some(false));
    assert!(p.render_text().contains("<-- differs"));
    let ce = p.checks.iter().find(|c| c.what.contains("Init CE")).unwrap();
    assert_eq!(ce.agrees, Some(false));
}

#[test]
fn probe_disagrees_on_the_transport_and_is_inconclusive_without_cupti() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("doctor-probe");
    probe_run(&dir, Some(Engine::SmKernel), Some(Engine::SmKernel));
    // Predicted: P2P off → SHM; NCCL logged P2P: the doctor's model was wrong.
    let f = facts_of(&h200_json(&[("NCCL_P2P_DISABLE", "1")]));
    let r = verdicts(&f);
    let p = probe::judge(&f, &r, &dir, LOG_P2P, false);
    assert_eq!(p.status, ProbeStatus::Disagreed);
    assert!(
        p.families
            .iter()
            .all(|x| x.predicted == DPath::Shm && x.seen == Some(DPath::NvlinkP2p))
    );
    // The log agrees with SHM: agreement.
    let shm = LOG_P2P.replace("via P2P/CUMEM", "via SHM/direct/direct");
    assert_eq!(
        probe::judge(&f, &r, &dir, &shm, false).status,
        ProbeStatus::Agreed
    );

    let dir2 = t.path().join("nocupti");
    probe_run(&dir2, None, None);
    let f = facts_of(&h200_json(&[]));
    let p = probe::judge(&f, &verdicts(&f), &dir2, LOG_P2P, false);
    assert_eq!(p.status, ProbeStatus::Inconclusive);
    assert!(p.families[0].note.as_deref().unwrap().contains("CUPTI off"));
    assert_eq!(p.families[0].engines.get("not measured"), Some(&10));
}

/// A stand-in `python3` for the probe: records its arguments, environment and pid,
/// then fails like the probe script does, or hangs.
fn fake_python(t: &Path, behaviour: &str) -> String {
    let p = t.join("fake-python");
    let body = format!(
        "#!/bin/sh\necho \"$@\" > '{d}/args'\nenv > '{d}/env'\necho $$ > '{d}/pid'\n{behaviour}\n",
        d = t.display()
    );
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p.display().to_string()
}

#[test]
fn probe_launch_environment_and_failure() {
    let t = tempfile::tempdir().unwrap();
    // The stand-in python never loads it; `--shim` takes only an ELF file.
    let shim = write(t.path(), "libzcta_prof.so", b"\x7fELF");
    let py = fake_python(
        t.path(),
        "echo 'zcta-probe: error: needs 2 GPUs, torch sees 1' >&2\nexit 1",
    );
    let f = facts_file(
        t.path(),
        "ce.json",
        &h200_json(&[("NCCL_CTA_POLICY", "2"), ("NCCL_NVLS_ENABLE", "0")]),
    );
    let pdir = t.path().join("probe");
    let out = Command::new(env!("CARGO_BIN_EXE_zcta"))
        .args(["doctor", "--facts", &f, "--probe", "--json", "--python", &py])
        .arg("--shim")
        .arg(&shim)
        .arg("--probe-dir")
        .arg(&pdir)
        .env("NCCL_NVLS_ENABLE", "0")
        .env("NCCL_DEBUG_FILE", "/tmp/somewhere")
        .env("ZCTA_CUPTI", "0")
        .env("ZCTA_CUPTI_CALLBACKS", "0")
        .env("ZCTA_CUPTI_KINDS", "none")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(i32::from(EXIT_PROBE)));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["probe"]["status"], "failed");
    assert_eq!(j["probe"]["symmetric"], true);
    let reason = j["probe"]["reason"].as_str().unwrap();
    assert!(reason.contains("error: needs 2 GPUs, torch sees 1"), "{reason}");

    let args = std::fs::read_to_string(t.path().join("args")).unwrap();
    let script = pdir.join("zcta_probe.py");
    assert_eq!(
        args.trim(),
        format!(
            "-m torch.distributed.run --standalone --nproc-per-node 2 {} --mib 16 --symmetric",
            script.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&script).unwrap(), probe::PROBE_SCRIPT);
    let env = std::fs::read_to_string(t.path().join("env")).unwrap();
    let has = |kv: &str| env.lines().any(|l| l == kv);
    let shim_canon = std::fs::canonicalize(&shim).unwrap();
    assert!(
        env.lines()
            .any(|l| l.starts_with(&format!("LD_PRELOAD={}", shim_canon.display()))),
        "{env}"
    );
    assert!(has(&format!("ZCTA_OUT={}", pdir.join("runs").display())));
    assert!(has("ZCTA_RUN_ID=doctor-probe"));
    assert!(has("NCCL_DEBUG=INFO"));
    assert!(has("NCCL_NVLS_ENABLE=0"), "the user's NVLS setting is kept");
    assert!(has("CUDA_VISIBLE_DEVICES=GPU-000,GPU-111"));
    assert!(has("CUDA_DEVICE_ORDER=PCI_BUS_ID"));
    assert!(
        !env.contains("NCCL_DEBUG_FILE="),
        "NCCL's log must reach the probe's log"
    );
    for knob in ["ZCTA_CUPTI=", "ZCTA_CUPTI_CALLBACKS=", "ZCTA_CUPTI_KINDS="] {
        assert!(
            !env.contains(knob),
            "GPU capture is needed to see engines: {knob}"
        );
    }
}

#[test]
fn probe_times_out_and_stops_its_process_group() {
    let t = tempfile::tempdir().unwrap();
    // The stand-in python never loads it; `--shim` takes only an ELF file.
    let shim = write(t.path(), "libzcta_prof.so", b"\x7fELF");
    // The "job" starts a child that would outlive it if only the leader were killed.
    let py = fake_python(
        t.path(),
        &format!("sleep 60 &\necho $! > '{}/child'\nwait", t.path().display()),
    );
    let f = facts_file(t.path(), "h200.json", &h200_json(&[]));
    let started = std::time::Instant::now();
    let (code, out, _) = zcta(&[
        "doctor",
        "--facts",
        &f,
        "--probe",
        "--python",
        &py,
        "--shim",
        shim.to_str().unwrap(),
        "--probe-timeout",
        "5",
    ]);
    assert_eq!(code, i32::from(EXIT_PROBE), "{out}");
    assert!(out.contains("timed out after 5 s"), "{out}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    for f in ["pid", "child"] {
        let pid = std::fs::read_to_string(t.path().join(f)).unwrap();
        let alive = || {
            Path::new(&format!("/proc/{}", pid.trim())).exists()
                && !std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
                    .unwrap_or_default()
                    .contains(") Z ")
        };
        // KILL was sent before zcta returned; its delivery is asynchronous (a loaded
        // machine can take a moment), so allow a short grace period.
        let t0 = std::time::Instant::now();
        while alive() && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(!alive(), "{f} {} still runs", pid.trim());
    }
}

#[test]
fn real_python_finds_torch_without_importing_it() {
    let t = tempfile::tempdir().unwrap();
    // A "torch" that would fail loudly if imported.
    write(t.path(), "torch/__init__.py", b"raise SystemExit('imported!')\n");
    write(
        t.path(),
        "torch/version.py",
        b"__version__ = '9.9.9'\ncuda = '13.0'\n",
    );
    let py = facts::RealPython {
        interpreter: "python3".into(),
        timeout: std::time::Duration::from_secs(20),
    };
    // PYTHONPATH only for the child: this test process's environment stays untouched.
    let info = {
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(facts::PY_QUERY).env("PYTHONPATH", t.path());
        match facts::run_with_timeout(&mut cmd, std::time::Duration::from_secs(20)) {
            Err(e) if e.contains("No such file") => {
                eprintln!("no python3 here: skipped");
                return;
            }
            r => r.unwrap(),
        }
    };
    assert!(info.0.success(), "{}", info.2);
    let parsed: PyInfo = serde_json::from_str(info.1.trim()).unwrap();
    assert_eq!(
        parsed.torch_dir.as_deref().map(Path::new),
        Some(t.path().join("torch").as_path())
    );
    assert!(!parsed.site_packages.is_empty());
    // The trait object gives the same answer shape (whatever torch this machine has).
    match py.query() {
        Ok(i) => assert!(!i.executable.is_empty()),
        Err(e) => panic!("python3 ran above but not through RealPython: {e}"),
    }
    let missing = facts::RealPython {
        interpreter: "/nonexistent/python3".into(),
        timeout: std::time::Duration::from_secs(5),
    };
    assert_eq!(missing.query().unwrap_err(), "/nonexistent/python3 not found");
}

#[test]
fn without_libnccl_no_version_is_claimed_for_it() {
    let t = tempfile::tempdir().unwrap();
    let mut v = h200_json(&[]);
    v["nccl"] = json!([]);
    let none = facts_file(t.path(), "none.json", &v);
    let (_, out, _) = zcta(&["doctor", "--facts", &none]);
    assert!(out.contains("no libnccl.so.2 found"), "{out}");
    assert!(!out.contains("NCCL 2.28.9 has no"), "{out}");
    assert!(out.contains("no libnccl found here to check"), "{out}");
    // With the library found, its version's fact is stated.
    let plain = facts_file(t.path(), "plain.json", &h200_json(&[]));
    let (_, out, _) = zcta(&["doctor", "--facts", &plain]);
    assert!(
        out.contains("never: NCCL 2.28.9 has no copy-engine AllReduce"),
        "{out}"
    );
}

/// `NCCL_CONF_FILE` naming a FIFO (no writer: opening it would wait for ever) or a
/// device that never ends: the doctor reads neither, and finishes.
#[test]
fn a_configuration_file_that_is_no_regular_file_is_not_read() {
    let t = tempfile::tempdir().unwrap();
    let fifo = t.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for conf in [fifo.display().to_string(), "/dev/zero".to_string()] {
        let dir = t.path().join(format!("m{}", conf.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let c = conf.clone();
        std::thread::spawn(move || {
            let f = gather_fake(&dir, NvmlOutcome::Absent("none".into()), &[("NCCL_CONF_FILE", c)]);
            let _ = tx.send(f);
        });
        let f = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("NCCL_CONF_FILE={conf}: the doctor did not finish"));
        assert_eq!(setting(&f, "NCCL_CTA_POLICY").value, "2", "{conf}");
    }
}
