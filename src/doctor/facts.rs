//! What `zcta doctor` knows about the machine: [`Facts`], a plain serde value, and
//! [`gather`], which reads it from a [`System`] — a filesystem root (so tests point it
//! at a fake `/sys`, `/proc`, `/etc`, `/usr/lib`), an environment map, and the NVML
//! and Python sources behind small traits. Everything that can fail becomes a fact
//! ("NVML absent: …") or a note; gathering never panics and never loads NCCL, CUDA
//! or CUPTI into this process (versions are read from files).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::env::{self, ConfFile, Setting};

/// Version of the [`Facts`] layout (the `--json` output's `facts`).
pub const FACTS_VERSION: u32 = 1;

/// Everything read from the machine. Missing knowledge is `None`/empty, never guessed;
/// inferences say so in their `*_source` field.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Facts {
    pub facts_version: u32,
    pub host: Host,
    pub driver: Driver,
    /// GPUs as NVML numbers them (PCI bus order).
    pub gpus: Vec<Gpu>,
    /// Every pair `a < b` of [`Facts::gpus`].
    pub pairs: Vec<Pair>,
    /// NVIDIA PCI functions in sysfs (GPUs and NVSwitches), with or without a driver.
    pub pci: Vec<PciDevice>,
    pub nodes: Nodes,
    pub python: Python,
    /// Every libnccl found; `selected` marks the one a torch process would load.
    pub nccl: Vec<Library>,
    /// Every libcupti found; `selected` marks the one zcta's capture would use.
    pub cupti: Vec<Library>,
    /// CUDA versions: torch's build, runtimes in wheels, installed toolkits.
    pub cuda: Vec<Component>,
    /// NCCL and related variables with their source (environment or a conf file).
    pub settings: Vec<Setting>,
    /// Problems met while gathering (a file unreadable, a query failing).
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Host {
    pub hostname: Option<String>,
    /// Kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel: Option<String>,
    /// WSL2: why we think so (`/dev/dxg present`, `kernel release mentions microsoft`).
    pub wsl2: Option<String>,
    /// Container runtime and the evidence (`docker (/.dockerenv)`), if any.
    pub container: Option<String>,
    /// `/dev/shm` as mounted: size in bytes when the mount says (`size=`).
    pub dev_shm: Option<ShmMount>,
    /// `vendor_id` of the first CPU (`GenuineIntel`, `AuthenticAMD`).
    pub cpu_vendor: Option<String>,
    /// Aarch64 and others have no `vendor_id`; NCCL's AMD rule is x86 only.
    pub cpu_arch: Option<String>,
    /// InfiniBand/RoCE devices (`/sys/class/infiniband`).
    pub ib_devices: Vec<String>,
    /// `Max locked memory` soft limit (`/proc/self/limits`), as written there.
    pub memlock: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShmMount {
    pub fstype: String,
    pub size_bytes: Option<u64>,
    pub options: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Driver {
    /// `loaded`, `absent` (no libnvidia-ml: no driver installed or not on the loader
    /// path), `failed` (library there, but NVML could not start: `nvml_error`), or
    /// `not queried`.
    pub nvml: String,
    pub nvml_error: Option<String>,
    /// Kernel driver version, e.g. `580.65.06`.
    pub version: Option<String>,
    pub version_source: Option<String>,
    /// CUDA driver API version as `cudaDriverGetVersion` reports it (13000 = 13.0).
    pub cuda_driver: Option<i32>,
    /// `NVML` or the inference used (then a lower bound).
    pub cuda_driver_source: Option<String>,
    /// The kernel module is loaded (`/proc/driver/nvidia/version` exists).
    pub kernel_module: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Gpu {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    /// `dddd:bb:dd.f`, lower case (sysfs form).
    pub bus_id: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    /// `9.0`.
    pub compute_capability: Option<String>,
    pub numa_node: Option<i32>,
    /// `Gen5 x16` (current link).
    pub pcie: Option<String>,
    /// Active NVLinks.
    pub nvlinks: Vec<NvLink>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NvLink {
    pub link: u32,
    /// PCI bus id of the far end (a GPU, or an NVSwitch), sysfs form.
    pub remote_bus_id: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Pair {
    pub a: u32,
    pub b: u32,
    /// NVML's common ancestor: `internal`, `single`, `multiple`, `hostbridge`, `node`,
    /// `system` (nvidia-smi's PIX, PXB, PHB, NODE, SYS).
    pub topology: Option<String>,
    /// NVML P2P status for reads, writes and NVLink: `ok`, `not_supported`,
    /// `chipset_not_supported`, `gpu_not_supported`, `ioh_topology_not_supported`,
    /// `disabled_by_regkey`, `unknown`.
    pub p2p_read: Option<String>,
    pub p2p_write: Option<String>,
    pub p2p_nvlink: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PciDevice {
    pub bus_id: String,
    /// `gpu`, `nvswitch`, `other`.
    pub kind: String,
    /// `0x030200`.
    pub class: String,
    pub numa_node: Option<i32>,
    pub pcie: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Nodes {
    pub count: u32,
    pub source: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Python {
    /// The interpreter asked (`--python`, `$ZCTA_PYTHON`, else `python3`).
    pub interpreter: String,
    pub executable: Option<String>,
    pub version: Option<String>,
    pub error: Option<String>,
    pub site_packages: Vec<String>,
    pub torch: Option<Torch>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Torch {
    /// The `torch` package directory.
    pub dir: String,
    pub version: Option<String>,
    /// `torch.version.cuda`, the CUDA torch was built for.
    pub cuda: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Library {
    pub path: String,
    /// Where the symlinks lead, when different.
    pub real_path: Option<String>,
    /// `torch wheel`, `python wheel`, `bundled with torch`, `LD_PRELOAD`,
    /// `LD_LIBRARY_PATH`, `CUDA_HOME`, `system`, `CUDA toolkit`.
    pub origin: String,
    pub version: Option<String>,
    /// How the version was read (`string in the library`, `wheel metadata`, `file name`).
    pub version_source: Option<String>,
    /// NCCL: the CUDA it was built with (`+cuda13.0`; NCCL links the runtime statically).
    pub built_for_cuda: Option<String>,
    pub selected: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Component {
    /// `torch build`, `CUDA runtime`, `CUDA toolkit`.
    pub what: String,
    pub version: String,
    pub path: Option<String>,
}

/// What NVML said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NvmlFacts {
    pub nvml_version: Option<String>,
    pub driver_version: Option<String>,
    pub cuda_driver: Option<i32>,
    pub gpus: Vec<Gpu>,
    pub pairs: Vec<Pair>,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum NvmlOutcome {
    Loaded(NvmlFacts),
    /// No libnvidia-ml to load.
    Absent(String),
    /// The library loaded but NVML failed (driver not loaded, no permission, …).
    Failed(String),
}

/// Where NVML facts come from (the real library, or a test's canned answer).
pub trait NvmlSource {
    fn query(&self) -> NvmlOutcome;
}

/// What the Python interpreter says about itself, without importing torch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PyInfo {
    pub executable: String,
    pub version: String,
    pub site_packages: Vec<String>,
    pub torch_dir: Option<String>,
}

/// Where Python facts come from.
pub trait PythonSource {
    /// The interpreter's name as given (for messages).
    fn interpreter(&self) -> String;
    fn query(&self) -> Result<PyInfo, String>;
}

/// The machine to read: a filesystem root, an environment, and the two sources.
pub struct System<'a> {
    /// `/` for real; a fake tree in tests. System paths (`/sys`, `/proc`, `/etc`,
    /// `/usr`, `/dev`) are read below it; paths from Python or from variables such as
    /// `LD_LIBRARY_PATH` are used as given.
    pub root: PathBuf,
    pub env: BTreeMap<String, String>,
    /// Home of the user id, for `~/.nccl.conf` (NCCL uses the password database).
    pub home: Option<PathBuf>,
    pub nvml: &'a dyn NvmlSource,
    pub python: &'a dyn PythonSource,
    /// `--nodes`.
    pub nodes: Option<u32>,
}

impl System<'_> {
    /// `p` (absolute, system) below the root.
    pub fn sys(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }
    fn read(&self, p: &str) -> Option<String> {
        std::fs::read_to_string(self.sys(p)).ok()
    }
    fn env(&self, k: &str) -> Option<&str> {
        self.env.get(k).map(String::as_str).filter(|v| !v.is_empty())
    }
    /// Logical (root-less) form of a path found below the root.
    fn logical(&self, real: &Path) -> String {
        match real.strip_prefix(&self.root) {
            Ok(rest) if self.root != Path::new("/") => format!("/{}", rest.display()),
            _ => real.display().to_string(),
        }
    }
}

/// Reads every fact. Never fails: what cannot be read is absent, with a note.
pub fn gather(sys: &System<'_>) -> Facts {
    let mut f = Facts {
        facts_version: FACTS_VERSION,
        ..Facts::default()
    };
    f.host = host(sys);
    f.pci = pci_devices(sys);
    f.settings = settings(sys);
    f.nodes = nodes(sys);
    driver_and_gpus(sys, &mut f);
    f.python = python(sys);
    libraries(sys, &mut f);
    f
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_owned()
}

fn host(sys: &System<'_>) -> Host {
    let kernel = sys.read("/proc/sys/kernel/osrelease").map(|s| first_line(&s));
    let wsl2 = if sys.sys("/dev/dxg").exists() {
        Some("/dev/dxg present".to_owned())
    } else {
        kernel
            .as_deref()
            .filter(|k| k.to_ascii_lowercase().contains("microsoft"))
            .map(|k| format!("kernel release {k} mentions microsoft"))
    };
    let container = if sys.sys("/.dockerenv").exists() {
        Some("docker (/.dockerenv)".to_owned())
    } else if sys.sys("/run/.containerenv").exists() {
        Some("podman (/run/.containerenv)".to_owned())
    } else if sys.env("KUBERNETES_SERVICE_HOST").is_some() {
        Some("kubernetes (KUBERNETES_SERVICE_HOST)".to_owned())
    } else {
        sys.read("/proc/1/cgroup").and_then(|c| {
            ["kubepods", "docker", "containerd", "libpod", "lxc"]
                .into_iter()
                .find(|k| c.contains(k))
                .map(|k| format!("{k} (/proc/1/cgroup)"))
        })
    };
    let cpuinfo = sys.read("/proc/cpuinfo").unwrap_or_default();
    let cpu_vendor = cpuinfo
        .lines()
        .find(|l| l.starts_with("vendor_id"))
        .and_then(|l| l.split(':').nth(1))
        .map(|v| v.trim().to_owned());
    let cpu_arch = Some(std::env::consts::ARCH.to_owned());
    let mut ib_devices: Vec<String> = std::fs::read_dir(sys.sys("/sys/class/infiniband"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    ib_devices.sort();
    let memlock = sys.read("/proc/self/limits").and_then(|l| {
        l.lines()
            .find(|x| x.starts_with("Max locked memory"))
            .and_then(|x| {
                x["Max locked memory".len()..]
                    .split_whitespace()
                    .next()
                    .map(str::to_owned)
            })
    });
    Host {
        hostname: sys.read("/proc/sys/kernel/hostname").map(|s| first_line(&s)),
        kernel,
        wsl2,
        container,
        dev_shm: sys.read("/proc/self/mounts").and_then(|m| shm_mount(&m)),
        cpu_vendor,
        cpu_arch,
        ib_devices,
        memlock,
    }
}

/// The `/dev/shm` line of `/proc/self/mounts` (the last one wins, as mounts stack).
pub fn shm_mount(mounts: &str) -> Option<ShmMount> {
    let line = mounts
        .lines()
        .rfind(|l| l.split_whitespace().nth(1) == Some("/dev/shm"))?;
    let mut it = line.split_whitespace();
    let (_, _, fstype, options) = (it.next(), it.next(), it.next()?, it.next().unwrap_or(""));
    let size_bytes = options
        .split(',')
        .find_map(|o| o.strip_prefix("size="))
        .and_then(parse_size);
    Some(ShmMount {
        fstype: fstype.to_owned(),
        size_bytes,
        options: options.to_owned(),
    })
}

/// `65536k`, `1g`, `8388608` → bytes (a `%` size is relative: unknown).
fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1u64 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        't' | 'T' => (&s[..s.len() - 1], 1 << 40),
        c if c.is_ascii_digit() => (s, 1),
        _ => return None,
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// `00000000:19:00.0` (NVML) or `0000:19:00.0` → `0000:19:00.0`.
pub fn norm_bus_id(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    match s.split_once(':') {
        Some((dom, rest)) => match u32::from_str_radix(dom, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => s,
        },
        None => s,
    }
}

/// `32.0 GT/s PCIe` and `16` → `Gen5 x16`.
fn pcie_link(speed: Option<String>, width: Option<String>) -> Option<String> {
    let speed = speed?;
    let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
    let generation = match gts {
        g if g < 3.0 => 1,
        g if g < 6.0 => 2,
        g if g < 10.0 => 3,
        g if g < 20.0 => 4,
        g if g < 40.0 => 5,
        g if g < 80.0 => 6,
        _ => 7,
    };
    Some(
        match width.map(|w| w.trim().to_owned()).filter(|w| !w.is_empty()) {
            Some(w) => format!("Gen{generation} x{w}"),
            None => format!("Gen{generation}"),
        },
    )
}

fn pci_devices(sys: &System<'_>) -> Vec<PciDevice> {
    let dir = sys.sys("/sys/bus/pci/devices");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        let rd = |f: &str| std::fs::read_to_string(p.join(f)).ok().map(|s| first_line(&s));
        if rd("vendor").as_deref() != Some("0x10de") {
            continue;
        }
        let class = rd("class").unwrap_or_default();
        let kind = if class.starts_with("0x0300") || class.starts_with("0x0302") {
            "gpu"
        } else if class.starts_with("0x0680") {
            "nvswitch"
        } else {
            continue; // audio functions of consumer cards, USB controllers, …
        };
        out.push(PciDevice {
            bus_id: norm_bus_id(&e.file_name().to_string_lossy()),
            kind: kind.into(),
            class,
            numa_node: rd("numa_node")
                .and_then(|n| n.parse().ok())
                .filter(|n: &i32| *n >= 0),
            pcie: pcie_link(rd("current_link_speed"), rd("current_link_width")),
        });
    }
    out.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    out
}

/// The password-database home of the current user id (as NCCL's `getpwuid`), read from
/// `/proc/self/status` and `/etc/passwd` below `root`; `$HOME` when that fails.
pub fn home_dir(root: &Path, env: &BTreeMap<String, String>) -> Option<PathBuf> {
    let rd = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let uid = rd("proc/self/status").and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
    });
    let from_passwd = uid.and_then(|uid| {
        rd("etc/passwd")?.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 6 && f[2] == uid).then(|| PathBuf::from(f[5]))
        })
    });
    from_passwd.or_else(|| env.get("HOME").filter(|h| !h.is_empty()).map(PathBuf::from))
}

fn settings(sys: &System<'_>) -> Vec<Setting> {
    let mut files = Vec::new();
    match sys.env("NCCL_CONF_FILE") {
        // NCCL_CONF_FILE is a path of the user's: used as given.
        Some(p) => files.push(ConfFile {
            label: p.to_owned(),
            text: crate::config::conf_file_text(Path::new(p)),
        }),
        None => {
            if let Some(h) = &sys.home {
                let p = h.join(".nccl.conf");
                let real = if h.is_absolute() && sys.root != Path::new("/") {
                    sys.sys(&p.display().to_string())
                } else {
                    p.clone()
                };
                files.push(ConfFile {
                    label: p.display().to_string(),
                    text: crate::config::conf_file_text(&real),
                });
            }
        }
    }
    files.push(ConfFile {
        label: "/etc/nccl.conf".into(),
        text: crate::config::conf_file_text(&sys.sys("/etc/nccl.conf")),
    });
    env::resolve(&sys.env, &files)
}

fn nodes(sys: &System<'_>) -> Nodes {
    if let Some(n) = sys.nodes {
        return Nodes {
            count: n,
            source: "--nodes".into(),
        };
    }
    let num = |k: &str| {
        sys.env(k)
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|n| *n > 0)
    };
    for k in ["SLURM_JOB_NUM_NODES", "SLURM_NNODES", "PET_NNODES"] {
        if let Some(n) = num(k) {
            return Nodes {
                count: n,
                source: k.into(),
            };
        }
    }
    for (w, l) in [
        ("WORLD_SIZE", "LOCAL_WORLD_SIZE"),
        ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ] {
        if let (Some(w_n), Some(l_n)) = (num(w), num(l)) {
            return Nodes {
                count: w_n.div_ceil(l_n),
                source: format!("{w}/{l}"),
            };
        }
    }
    Nodes {
        count: 1,
        source: "assumed: one machine; pass --nodes N for a multi-node job".into(),
    }
}

/// CUDA driver API version a driver branch reports, from NVIDIA's driver/toolkit table
/// (the first driver of each CUDA release). A lower bound for newer drivers.
pub fn cuda_from_driver(version: &str) -> Option<i32> {
    const TABLE: [(u32, i32); 11] = [
        (580, 13000),
        (575, 12090),
        (570, 12080),
        (565, 12070),
        (560, 12060),
        (555, 12050),
        (550, 12040),
        (545, 12030),
        (535, 12020),
        (530, 12010),
        (525, 12000),
    ];
    let major: u32 = version.split('.').next()?.trim().parse().ok()?;
    TABLE.iter().find(|(d, _)| major >= *d).map(|(_, c)| *c)
}

fn driver_and_gpus(sys: &System<'_>, f: &mut Facts) {
    let proc_version = sys.read("/proc/driver/nvidia/version");
    f.driver.kernel_module = proc_version.is_some();
    match sys.nvml.query() {
        NvmlOutcome::Loaded(n) => {
            f.driver.nvml = "loaded".into();
            f.driver.version = n.driver_version.clone();
            f.driver.version_source = n.driver_version.as_ref().map(|_| "NVML".into());
            f.driver.cuda_driver = n.cuda_driver;
            f.driver.cuda_driver_source = n.cuda_driver.map(|_| "NVML".into());
            f.gpus = n.gpus;
            f.pairs = n.pairs;
            f.notes.extend(n.notes);
        }
        NvmlOutcome::Absent(e) => {
            f.driver.nvml = "absent".into();
            f.driver.nvml_error = Some(e);
        }
        NvmlOutcome::Failed(e) => {
            f.driver.nvml = "failed".into();
            f.driver.nvml_error = Some(e);
        }
    }
    if f.driver.version.is_none() {
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 …"
        let v = proc_version.as_deref().and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("NVRM version"))?
                .split_whitespace()
                .find(|w| {
                    w.split('.').count() >= 2 && w.split('.').all(|p| p.chars().all(|c| c.is_ascii_digit()))
                })
                .map(str::to_owned)
        });
        if let Some(v) = v {
            f.driver.version = Some(v);
            f.driver.version_source = Some("/proc/driver/nvidia/version".into());
        }
    }
    if f.driver.cuda_driver.is_none()
        && let Some(v) = f.driver.version.clone()
        && let Some(c) = cuda_from_driver(&v)
    {
        f.driver.cuda_driver = Some(c);
        f.driver.cuda_driver_source = Some(format!(
            "inferred from driver {v} (NVIDIA's driver/CUDA table; at least this)"
        ));
    }
    // Fill what NVML did not say from sysfs (NUMA node, PCIe link).
    for g in &mut f.gpus {
        if let Some(p) = g
            .bus_id
            .as_ref()
            .and_then(|b| f.pci.iter().find(|p| &p.bus_id == b))
        {
            if g.numa_node.is_none() {
                g.numa_node = p.numa_node;
            }
            if g.pcie.is_none() {
                g.pcie = p.pcie.clone();
            }
        }
    }
}

/// Runs `cmd` for at most `timeout`; its exit status, stdout and stderr.
pub fn run_with_timeout(
    cmd: &mut std::process::Command,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, String, String), String> {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut s);
            }
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = pipe(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = pipe(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", timeout.as_secs()));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    Ok((
        status,
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    ))
}

/// Asks the interpreter for its site-packages and where `torch` is, without importing
/// torch (importlib's spec lookup only).
pub const PY_QUERY: &str = r#"
import importlib.util, json, os, site, sys, sysconfig
sp = []
for f in (lambda: site.getsitepackages(), lambda: [site.getusersitepackages()],
          lambda: [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]):
    try:
        sp += [p for p in f() if p not in sp]
    except Exception:
        pass
try:
    spec = importlib.util.find_spec("torch")
    torch_dir = os.path.dirname(spec.origin) if spec and spec.origin else None
except Exception:
    torch_dir = None
print(json.dumps({"executable": sys.executable, "version": sys.version.split()[0],
                  "site_packages": sp, "torch_dir": torch_dir}))
"#;

/// The real interpreter (`--python`, `$ZCTA_PYTHON`, else `python3`).
#[derive(Clone, Debug)]
pub struct RealPython {
    pub interpreter: String,
    pub timeout: Duration,
}

impl PythonSource for RealPython {
    fn interpreter(&self) -> String {
        self.interpreter.clone()
    }
    fn query(&self) -> Result<PyInfo, String> {
        let mut cmd = std::process::Command::new(&self.interpreter);
        // Not isolated (-I): a user-site or PYTHONPATH torch is what the job imports too.
        cmd.args(["-c", PY_QUERY]);
        let (status, out, err) = run_with_timeout(&mut cmd, self.timeout).map_err(|e| {
            if e.contains("No such file") || e.contains("not found") {
                format!("{} not found", self.interpreter)
            } else {
                format!("{}: {e}", self.interpreter)
            }
        })?;
        if !status.success() {
            return Err(format!(
                "{} failed ({status}): {}",
                self.interpreter,
                err.lines().last().unwrap_or("")
            ));
        }
        serde_json::from_str(out.trim()).map_err(|e| format!("{}: unexpected answer ({e})", self.interpreter))
    }
}

fn python(sys: &System<'_>) -> Python {
    let mut p = Python {
        interpreter: sys.python.interpreter(),
        ..Python::default()
    };
    match sys.python.query() {
        Err(e) => p.error = Some(e),
        Ok(info) => {
            p.executable = Some(info.executable).filter(|s| !s.is_empty());
            p.version = Some(info.version).filter(|s| !s.is_empty());
            p.site_packages = info.site_packages;
            p.torch = info.torch_dir.map(|dir| {
                let text = std::fs::read_to_string(Path::new(&dir).join("version.py")).unwrap_or_default();
                Torch {
                    version: py_string_assignment(&text, "__version__"),
                    cuda: py_string_assignment(&text, "cuda"),
                    dir,
                }
            });
        }
    }
    p
}

/// The string value of `name = '…'` or `name: Optional[str] = '…'` in a Python file.
pub fn py_string_assignment(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with(' ') || rest.starts_with(':') || rest.starts_with('=')) {
            return None;
        }
        let rhs = rest.split_once('=')?.1.trim();
        let q = rhs.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        rhs[1..].split(q).next().map(str::to_owned)
    })
}

/// `NCCL version 2.28.9+cuda13.0` inside a libnccl: (`2.28.9`, `13.0`). Reads the file
/// in chunks; never loads it.
pub fn nccl_version_in_file(path: &Path) -> std::io::Result<Option<(String, Option<String>)>> {
    const NEEDLE: &[u8] = b"NCCL version ";
    const CHUNK: usize = 8 << 20;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; CHUNK + 64];
    let mut keep = 0usize;
    loop {
        let n = f.read(&mut buf[keep..])?;
        let len = keep + n;
        let hay = &buf[..len];
        let mut from = 0;
        while let Some(i) = hay[from..]
            .windows(NEEDLE.len())
            .position(|w| w[0] == b'N' && w == NEEDLE)
        {
            let at = from + i + NEEDLE.len();
            let tail = &hay[at..len.min(at + 48)];
            if tail.len() == 48 || n == 0 {
                if let Some(v) = parse_nccl_version(tail) {
                    return Ok(Some(v));
                }
            } else {
                break; // the candidate runs past the buffer: read more first
            }
            from = at;
        }
        if n == 0 {
            return Ok(None);
        }
        // Keep the last 64 bytes so a string across chunks is seen whole.
        keep = len.min(64);
        buf.copy_within(len - keep..len, 0);
    }
}

/// `2.28.9+cuda13.0…` → (`2.28.9`, `13.0`); `None` unless it starts with a digit.
fn parse_nccl_version(tail: &[u8]) -> Option<(String, Option<String>)> {
    let s: String = tail
        .iter()
        .take_while(|b| b.is_ascii_graphic())
        .map(|b| *b as char)
        .collect();
    if !s.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let (ver, cuda) = match s.split_once("+cuda") {
        Some((v, c)) => (
            v.to_owned(),
            Some(c.trim_end_matches(|c: char| !c.is_ascii_digit()).to_owned()),
        ),
        None => (s.clone(), None),
    };
    Some((ver, cuda.filter(|c| !c.is_empty())))
}

/// The version in a `<prefix>*-<version>.dist-info` folder of `site`.
pub fn dist_info_version(site: &Path, prefix: &str) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(site)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".dist-info"))
        .collect();
    names.sort();
    let n = names.pop()?;
    let stem = n.trim_end_matches(".dist-info");
    stem.split_once('-').map(|(_, v)| v.to_owned())
}

/// `libnccl.so.2.28.3` → `2.28.3` (only names with three numeric parts after `.so.`).
fn version_from_name(real: &Path, stem: &str) -> Option<String> {
    let name = real.file_name()?.to_string_lossy().into_owned();
    let v = name.strip_prefix(stem)?;
    (v.split('.').count() >= 3
        && v.split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit())))
    .then(|| v.to_owned())
}

const SYSTEM_LIB_DIRS: [&str; 8] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/cuda/lib64",
    "/usr/local/nccl/lib",
    "/opt/nccl/lib",
];

struct Found {
    real: PathBuf,
    shown: String,
    origin: String,
    wheel_version: Option<String>,
}

fn push_found(v: &mut Vec<Found>, real: PathBuf, shown: String, origin: &str, wheel_version: Option<String>) {
    if !real.is_file() {
        return;
    }
    let canon = std::fs::canonicalize(&real).unwrap_or_else(|_| real.clone());
    if v.iter()
        .any(|f| std::fs::canonicalize(&f.real).unwrap_or_else(|_| f.real.clone()) == canon)
    {
        return;
    }
    v.push(Found {
        real,
        shown,
        origin: origin.into(),
        wheel_version,
    });
}

fn ld_library_dirs(sys: &System<'_>) -> Vec<PathBuf> {
    sys.env("LD_LIBRARY_PATH")
        .map(|p| {
            p.split(':')
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

fn files_starting(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `/usr/local/cuda*` folders below the root, newest name first.
fn cuda_roots(sys: &System<'_>) -> Vec<PathBuf> {
    let mut v = files_starting(&sys.sys("/usr/local"), "cuda");
    v.retain(|p| p.is_dir());
    v.reverse();
    v
}

fn libraries(sys: &System<'_>, f: &mut Facts) {
    let torch = f.python.torch.clone();
    let sites = site_dirs(f);
    let found = find_nccl(sys, &sites, torch.as_ref());
    f.nccl = found
        .into_iter()
        .map(|x| nccl_library(sys, x, &mut f.notes))
        .collect();
    select_nccl(&mut f.nccl);
    f.cupti = find_cupti(sys, &sites, torch.as_ref())
        .into_iter()
        .map(|x| cupti_library(sys, x))
        .collect();
    select_cupti(&mut f.cupti);
    f.cuda = cuda_versions(sys, &sites, torch.as_ref(), &f.nccl);
}

/// The site-packages to search: the one holding torch first (its wheels are what
/// torch loads), then the interpreter's others.
fn site_dirs(f: &Facts) -> Vec<PathBuf> {
    let mut sites: Vec<PathBuf> = Vec::new();
    if let Some(t) = &f.python.torch
        && let Some(p) = Path::new(&t.dir).parent()
    {
        sites.push(p.to_owned());
    }
    for s in &f.python.site_packages {
        let p = PathBuf::from(s);
        if !sites.contains(&p) {
            sites.push(p);
        }
    }
    sites
}

/// `torch wheel` for torch's site-packages, else `python wheel`.
fn wheel_origin(site: &Path, torch: Option<&Torch>) -> &'static str {
    if torch.is_some_and(|t| Path::new(&t.dir).parent() == Some(site)) {
        "torch wheel"
    } else {
        "python wheel"
    }
}

/// Every file named `prefix*` in `dir`, found with `origin`.
fn push_files(v: &mut Vec<Found>, dir: &Path, prefix: &str, origin: &str, wheel_version: Option<&String>) {
    for p in files_starting(dir, prefix) {
        push_found(
            v,
            p.clone(),
            p.display().to_string(),
            origin,
            wheel_version.cloned(),
        );
    }
}

/// Every libnccl, in the loader's order of preference.
fn find_nccl(sys: &System<'_>, sites: &[PathBuf], torch: Option<&Torch>) -> Vec<Found> {
    let mut nccl = Vec::new();
    for p in sys.env("LD_PRELOAD").unwrap_or("").split([':', ' ']) {
        if p.contains("libnccl") {
            push_found(&mut nccl, PathBuf::from(p), p.to_owned(), "LD_PRELOAD", None);
        }
    }
    for s in sites {
        let lib = s.join("nvidia/nccl/lib/libnccl.so.2");
        push_found(
            &mut nccl,
            lib.clone(),
            lib.display().to_string(),
            wheel_origin(s, torch),
            dist_info_version(s, "nvidia_nccl_cu"),
        );
    }
    if let Some(t) = torch {
        push_files(
            &mut nccl,
            &Path::new(&t.dir).join("lib"),
            "libnccl.so",
            "bundled with torch",
            None,
        );
    }
    for d in ld_library_dirs(sys) {
        let p = d.join("libnccl.so.2");
        push_found(
            &mut nccl,
            p.clone(),
            p.display().to_string(),
            "LD_LIBRARY_PATH",
            None,
        );
    }
    for d in SYSTEM_LIB_DIRS {
        let p = sys.sys(&format!("{d}/libnccl.so.2"));
        let shown = sys.logical(&p);
        push_found(&mut nccl, p, shown, "system", None);
    }
    nccl
}

/// Where the symlinks of `x` lead, when elsewhere, and the file itself.
fn real_path(sys: &System<'_>, x: &Found) -> (Option<PathBuf>, Option<String>) {
    let real = std::fs::canonicalize(&x.real).ok();
    let shown = real.as_ref().filter(|r| **r != x.real).map(|r| sys.logical(r));
    (real, shown)
}

/// A libnccl with its version: the string inside, else the file name, else the wheel's.
fn nccl_library(sys: &System<'_>, x: Found, notes: &mut Vec<String>) -> Library {
    let (real, real_path) = real_path(sys, &x);
    let mut lib = Library {
        real_path,
        path: x.shown,
        origin: x.origin,
        ..Library::default()
    };
    match nccl_version_in_file(&x.real) {
        Ok(Some((v, cuda))) => {
            lib.version = Some(v);
            lib.version_source = Some("string in the library".into());
            lib.built_for_cuda = cuda;
        }
        Ok(None) => {
            let by_name = real.as_deref().and_then(|r| version_from_name(r, "libnccl.so."));
            match (by_name, &x.wheel_version) {
                (Some(v), _) => {
                    lib.version = Some(v);
                    lib.version_source = Some("file name".into());
                }
                (None, Some(w)) => {
                    lib.version = Some(w.clone());
                    lib.version_source = Some("wheel metadata".into());
                }
                (None, None) => notes.push(format!("{}: no NCCL version string inside", lib.path)),
            }
        }
        Err(e) => notes.push(format!("{}: {e}", lib.path)),
    }
    if let (Some(w), Some(v)) = (&x.wheel_version, &lib.version)
        && !v.starts_with(w.as_str())
        && !w.starts_with(v.as_str())
    {
        notes.push(format!(
            "{}: the library says {v}, its wheel metadata {w}",
            lib.path
        ));
    }
    lib
}

/// What a torch process loads: a preloaded copy, else the wheel its RPATH names, else
/// the copy bundled in torch/lib, else the loader's search (LD_LIBRARY_PATH, then the
/// system). Without torch: what any program linking libnccl.so.2 gets.
fn select_nccl(nccl: &mut [Library]) {
    let order = [
        "LD_PRELOAD",
        "torch wheel",
        "bundled with torch",
        "LD_LIBRARY_PATH",
        "system",
    ];
    if let Some(i) = order
        .iter()
        .find_map(|o| nccl.iter().position(|l| l.origin == *o))
    {
        nccl[i].selected = true;
    }
}

/// Every libcupti: torch's wheels, torch/lib, LD_LIBRARY_PATH, the CUDA toolkits.
fn find_cupti(sys: &System<'_>, sites: &[PathBuf], torch: Option<&Torch>) -> Vec<Found> {
    let mut cupti = Vec::new();
    for s in sites {
        let origin = wheel_origin(s, torch);
        let wv = dist_info_version(s, "nvidia_cuda_cupti");
        for sub in ["nvidia/cu13/lib", "nvidia/cuda_cupti/lib", "nvidia/cu12/lib"] {
            push_files(&mut cupti, &s.join(sub), "libcupti.so", origin, wv.as_ref());
        }
    }
    if let Some(t) = torch {
        push_files(
            &mut cupti,
            &Path::new(&t.dir).join("lib"),
            "libcupti.so",
            "bundled with torch",
            None,
        );
    }
    for d in ld_library_dirs(sys) {
        push_files(&mut cupti, &d, "libcupti.so", "LD_LIBRARY_PATH", None);
    }
    for root in cuda_roots(sys) {
        for sub in [
            "extras/CUPTI/lib64",
            "targets/x86_64-linux/lib",
            "targets/sbsa-linux/lib",
            "lib64",
        ] {
            for p in files_starting(&root.join(sub), "libcupti.so") {
                let shown = sys.logical(&p);
                push_found(&mut cupti, p, shown, "CUDA toolkit", None);
            }
        }
    }
    cupti
}

/// A libcupti with its version: the wheel's, else the file name's. One entry per
/// library file (the versioned name and its symlinks are one).
fn cupti_library(sys: &System<'_>, x: Found) -> Library {
    let (real, real_path) = real_path(sys, &x);
    let from_name = real.as_deref().and_then(|r| version_from_name(r, "libcupti.so."));
    let (version, version_source) = match (&x.wheel_version, from_name) {
        (Some(w), _) => (Some(w.clone()), Some("wheel metadata".to_owned())),
        (None, Some(n)) => (Some(n), Some("file name".to_owned())),
        (None, None) => (None, None),
    };
    Library {
        real_path,
        path: x.shown,
        origin: x.origin,
        version,
        version_source,
        ..Library::default()
    }
}

/// zcta's shim uses the libcupti already mapped (torch's, once torch is imported),
/// else $ZCTA_CUPTI_LIB, $CUDA_HOME, the NCCL wheel's sibling nvidia/cu13/lib, then
/// /usr/local/cuda*: always a libcupti.so.13 (shim/src/ffi/cupti.rs).
fn select_cupti(cupti: &mut [Library]) {
    let is13 = |l: &Library| l.path.ends_with("libcupti.so.13");
    let pick = ["torch wheel", "bundled with torch", "CUDA toolkit"]
        .iter()
        .find_map(|o| cupti.iter().position(|l| is13(l) && l.origin == *o));
    if let Some(i) = pick {
        cupti[i].selected = true;
    }
}

/// CUDA versions: torch's build, runtimes in wheels, installed toolkits, and the one
/// NCCL links statically.
fn cuda_versions(
    sys: &System<'_>,
    sites: &[PathBuf],
    torch: Option<&Torch>,
    nccl: &[Library],
) -> Vec<Component> {
    let mut cuda = Vec::new();
    if let Some(t) = torch
        && let Some(c) = t.cuda.clone()
    {
        cuda.push(Component {
            what: "torch build".into(),
            version: c,
            path: Some(format!("{}/version.py", t.dir)),
        });
    }
    cuda.extend(wheel_runtimes(sites));
    cuda.extend(toolkits(sys));
    if let Some(l) = nccl.iter().find(|l| l.selected)
        && let Some(c) = &l.built_for_cuda
    {
        cuda.push(Component {
            what: "NCCL's runtime (static)".into(),
            version: c.clone(),
            path: Some(l.path.clone()),
        });
    }
    cuda
}

/// The CUDA runtimes in wheels.
fn wheel_runtimes(sites: &[PathBuf]) -> Vec<Component> {
    let mut out = Vec::new();
    for s in sites {
        let v = dist_info_version(s, "nvidia_cuda_runtime");
        for sub in ["nvidia/cu13/lib", "nvidia/cuda_runtime/lib", "nvidia/cu12/lib"] {
            if let Some(p) = files_starting(&s.join(sub), "libcudart.so").first() {
                out.push(Component {
                    what: "CUDA runtime (wheel)".into(),
                    version: v.clone().unwrap_or_else(|| {
                        p.file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    }),
                    path: Some(p.display().to_string()),
                });
            }
        }
    }
    out
}

/// The CUDA toolkits in `/usr/local/cuda*`, by their version.json.
fn toolkits(sys: &System<'_>) -> Vec<Component> {
    let mut out = Vec::new();
    for root in cuda_roots(sys) {
        let vj = root.join("version.json");
        let v = std::fs::read_to_string(&vj)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|j| j["cuda"]["version"].as_str().map(str::to_owned));
        if let Some(v) = v {
            out.push(Component {
                what: "CUDA toolkit".into(),
                version: v,
                path: Some(sys.logical(&root)),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_mount_sizes() {
        let m = "sysfs /sys sysfs rw 0 0\nshm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k,inode64 0 0\n";
        let s = shm_mount(m).unwrap();
        assert_eq!(s.size_bytes, Some(64 << 20));
        assert_eq!(s.fstype, "tmpfs");
        let s = shm_mount("tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0\n").unwrap();
        assert_eq!(s.size_bytes, None);
        assert!(shm_mount("proc /proc proc rw 0 0\n").is_none());
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("50%"), None);
    }

    #[test]
    fn bus_ids_normalised() {
        assert_eq!(norm_bus_id("00000000:19:00.0"), "0000:19:00.0");
        assert_eq!(norm_bus_id("0000:1A:00.0"), "0000:1a:00.0");
        assert_eq!(norm_bus_id("0001:c3:00.0"), "0001:c3:00.0");
    }

    #[test]
    fn pcie_generations() {
        assert_eq!(
            pcie_link(Some("32.0 GT/s PCIe".into()), Some("16".into())).as_deref(),
            Some("Gen5 x16")
        );
        assert_eq!(
            pcie_link(Some("16.0 GT/s PCIe".into()), None).as_deref(),
            Some("Gen4")
        );
        assert_eq!(pcie_link(Some("Unknown".into()), Some("16".into())), None);
    }

    #[test]
    fn driver_table_is_a_lower_bound() {
        assert_eq!(cuda_from_driver("580.65.06"), Some(13000));
        assert_eq!(cuda_from_driver("590.1"), Some(13000));
        assert_eq!(cuda_from_driver("550.54.14"), Some(12040));
        assert_eq!(cuda_from_driver("554.1"), Some(12040));
        assert_eq!(cuda_from_driver("555.42.02"), Some(12050));
        assert_eq!(cuda_from_driver("470.1"), None);
        assert_eq!(cuda_from_driver("x"), None);
    }

    #[test]
    fn torch_version_file() {
        let t = "from typing import Optional\n__all__ = ['__version__']\n__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\ngit_version = 'abc'\n";
        assert_eq!(
            py_string_assignment(t, "__version__").as_deref(),
            Some("2.11.0+cu130")
        );
        assert_eq!(py_string_assignment(t, "cuda").as_deref(), Some("13.0"));
        assert_eq!(py_string_assignment("cuda = None\n", "cuda"), None);
        assert_eq!(py_string_assignment("cudaX = '1'\n", "cuda"), None);
    }

    #[test]
    fn nccl_version_string_is_found_across_chunks() {
        let dir = std::env::temp_dir().join(format!("zcta-doctor-ver-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("libnccl.so.2");
        // A format string first (not a version), then the real one after 9 MiB, so it
        // crosses the 8 MiB chunk boundary in some position.
        let mut bytes = b"\x00NCCL version %s\x00".to_vec();
        bytes.resize((8 << 20) - 5, 0x11);
        bytes.extend_from_slice(b"NCCL version 2.28.9+cuda13.0\x00tail");
        std::fs::write(&p, &bytes).unwrap();
        let v = nccl_version_in_file(&p).unwrap();
        assert_eq!(v, Some(("2.28.9".to_string(), Some("13.0".to_string()))));
        std::fs::write(&p, b"nothing here").unwrap();
        assert_eq!(nccl_version_in_file(&p).unwrap(), None);
        std::fs::write(&p, b"xxNCCL version 2.27.3-1\0").unwrap();
        assert_eq!(
            nccl_version_in_file(&p).unwrap(),
            Some(("2.27.3-1".to_string(), None))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
