//! The two outputs of `zcta doctor`: a table for people and one JSON document
//! (`{"zcta_doctor": 1, "exit_code", "facts", "report", "probe"}`) for programs.

use std::fmt::Write as _;

use super::facts::{Facts, Library};
use super::probe::ProbeResult;
use super::verdict::{Decider, Path, Report, State};

/// Version of the JSON document's layout.
pub const JSON_VERSION: u32 = 1;

/// The exit status for a report and an optional probe (see `zcta doctor --help`):
/// 0 fine; 3 a requested path cannot be taken here (wins); 4 the probe could not run
/// or disagreed.
pub fn exit_code(report: &Report, probe: Option<&ProbeResult>) -> u8 {
    if report.exit_code != 0 {
        report.exit_code
    } else if probe.is_some_and(|p| !p.agreed()) {
        super::verdict::EXIT_PROBE
    } else {
        0
    }
}

/// The JSON document.
pub fn json(facts: &Facts, report: &Report, probe: Option<&ProbeResult>) -> serde_json::Value {
    serde_json::json!({
        "zcta_doctor": JSON_VERSION,
        "exit_code": exit_code(report, probe),
        "facts": facts,
        "report": report,
        "probe": probe,
    })
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30))
}

fn cuda_str(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn lib_line(l: &Library, role: &str) -> String {
    let mut s = format!(
        "{}{}  {}",
        l.version.as_deref().unwrap_or("version ?"),
        l.built_for_cuda
            .as_deref()
            .map(|c| format!(" (+cuda{c})"))
            .unwrap_or_default(),
        l.path
    );
    if let Some(r) = &l.real_path {
        let _ = write!(s, " -> {r}");
    }
    let _ = write!(s, "  [{}{}]", l.origin, if l.selected { role } else { "" });
    s
}

/// The table.
pub fn text(f: &Facts, r: &Report, probe: Option<&ProbeResult>) -> String {
    let mut s = String::new();
    let w = &mut s;
    header(w, f, r);
    machine(w, f, r);
    software(w, f, r);
    settings(w, f);
    transport(w, r);
    conditions(w, r);
    families(w, r);
    requests(w, r);
    findings(w, r);
    gather_notes(w, f);
    fixes(w, r);
    if let Some(p) = probe {
        let _ = writeln!(w, "\n{}", p.render_text());
    }
    exit_line(w, r, probe);
    s
}

fn header(w: &mut String, f: &Facts, r: &Report) {
    let _ = writeln!(
        w,
        "zcta doctor — NCCL data paths on {}\n",
        f.host.hostname.as_deref().unwrap_or("this machine")
    );
    for line in &r.summary {
        let _ = writeln!(w, "  {line}");
    }
}

fn machine(w: &mut String, f: &Facts, r: &Report) {
    let _ = writeln!(w, "\nMACHINE");
    let _ = writeln!(w, "  driver     {}", driver_line(f));
    if f.driver.nvml != "loaded" {
        let _ = writeln!(
            w,
            "  NVML       {}: {}",
            f.driver.nvml,
            f.driver.nvml_error.as_deref().unwrap_or("-")
        );
    }
    gpus(w, f, r);
    for p in &r.transport.pairs {
        let _ = writeln!(w, "  GPU{}-GPU{}  {}: {}", p.a, p.b, p.path.label(), p.why);
    }
    let switches = f.pci.iter().filter(|p| p.kind == "nvswitch").count();
    if switches > 0 {
        let _ = writeln!(w, "  NVSwitch   {switches} on the PCI bus");
    }
    let _ = writeln!(w, "  nodes      {} ({})", f.nodes.count, f.nodes.source);
    let _ = writeln!(w, "  host       {}", host_line(f));
}

fn driver_line(f: &Facts) -> String {
    match (&f.driver.version, f.driver.cuda_driver) {
        (Some(v), Some(c)) => format!(
            "{v}, CUDA driver API {} (from {})",
            cuda_str(c),
            f.driver.cuda_driver_source.as_deref().unwrap_or("?")
        ),
        (Some(v), None) => format!("{v}, CUDA driver API unknown"),
        _ if f.driver.kernel_module => "kernel module loaded, version unreadable".into(),
        _ => "none found (no /proc/driver/nvidia, no NVML)".into(),
    }
}

fn gpus(w: &mut String, f: &Facts, r: &Report) {
    let _ = writeln!(w, "  GPUs       {} visible of {}", r.visible.len(), f.gpus.len());
    for g in &f.gpus {
        let mut parts = vec![g.name.clone().unwrap_or_else(|| "?".into())];
        if let (Some(free), Some(total)) = (g.memory_free_bytes, g.memory_total_bytes) {
            parts.push(format!("{} free of {}", gib(free), gib(total)));
        }
        if let Some(c) = &g.compute_capability {
            parts.push(format!("cc {c}"));
        }
        if let Some(n) = g.numa_node {
            parts.push(format!("NUMA {n}"));
        }
        if let Some(p) = &g.pcie {
            parts.push(p.clone());
        }
        if let Some(b) = &g.bus_id {
            parts.push(b.clone());
        }
        let hidden = if r.visible.contains(&g.index) {
            ""
        } else {
            " (hidden)"
        };
        let _ = writeln!(w, "    GPU{}{hidden}  {}", g.index, parts.join(", "));
    }
    if f.gpus.is_empty() {
        let on_bus: Vec<&str> = f
            .pci
            .iter()
            .filter(|p| p.kind == "gpu")
            .map(|p| p.bus_id.as_str())
            .collect();
        if !on_bus.is_empty() {
            let _ = writeln!(w, "    NVIDIA GPUs on the PCI bus (sysfs): {}", on_bus.join(", "));
        }
    }
}

fn host_line(f: &Facts) -> String {
    let mut host = Vec::new();
    if let Some(k) = &f.host.kernel {
        host.push(format!("kernel {k}"));
    }
    host.push(match &f.host.wsl2 {
        Some(e) => format!("WSL2 ({e})"),
        None => "not WSL2".into(),
    });
    if let Some(c) = &f.host.container {
        host.push(format!("container {c}"));
    }
    if let Some(shm) = &f.host.dev_shm {
        host.push(match shm.size_bytes {
            Some(b) => format!("/dev/shm {} MiB", b >> 20),
            None => format!("/dev/shm {} (no size limit set)", shm.fstype),
        });
    }
    if let Some(v) = &f.host.cpu_vendor {
        host.push(format!("CPU {v}"));
    }
    if !f.host.ib_devices.is_empty() {
        host.push(format!(
            "IB {} (memlock {})",
            f.host.ib_devices.join(","),
            f.host.memlock.as_deref().unwrap_or("?")
        ));
    }
    host.join(", ")
}

/// Libraries under a label: the first line carries it, the others are indented alike.
fn libs(w: &mut String, label: &str, libs: &[Library], role: &str) {
    for (i, l) in libs.iter().enumerate() {
        let label = if i == 0 { label } else { "" };
        let _ = writeln!(w, "  {label:<11}{}", lib_line(l, role));
    }
}

fn software(w: &mut String, f: &Facts, r: &Report) {
    let _ = writeln!(w, "\nSOFTWARE");
    if f.nccl.is_empty() {
        let _ = writeln!(w, "  NCCL       no libnccl.so.2 found");
    }
    libs(w, "NCCL", &f.nccl, ", loaded by torch");
    let _ = writeln!(
        w,
        "  CE rules   {}: {}",
        r.nccl_rules.named(),
        r.nccl_rules.checked
    );
    if !f.cuda.is_empty() {
        let parts: Vec<String> = f
            .cuda
            .iter()
            .map(|c| format!("{} {}", c.what, c.version))
            .collect();
        let _ = writeln!(w, "  CUDA       {}", parts.join("; "));
    }
    if f.cupti.is_empty() {
        let _ = writeln!(w, "  CUPTI      no libcupti found");
    }
    libs(w, "CUPTI", &f.cupti, ", used by zcta");
    let py = match (&f.python.executable, &f.python.error) {
        (Some(e), _) => format!(
            "{e} {}{}",
            f.python.version.as_deref().unwrap_or(""),
            match &f.python.torch {
                Some(t) => format!(", torch {}", t.version.as_deref().unwrap_or("?")),
                None => ", no torch".into(),
            }
        ),
        (None, Some(e)) => e.clone(),
        (None, None) => "not asked".into(),
    };
    let _ = writeln!(w, "  python     {py}");
}

fn settings(w: &mut String, f: &Facts) {
    let _ = writeln!(
        w,
        "\nNCCL SETTINGS (environment, then NCCL_CONF_FILE or ~/.nccl.conf, then /etc/nccl.conf)"
    );
    let shown: Vec<_> = f
        .settings
        .iter()
        .filter(|s| !matches!(s.name.as_str(), "LD_LIBRARY_PATH" | "CUDA_HOME" | "CUDA_PATH"))
        .collect();
    if shown.is_empty() {
        let _ = writeln!(w, "  (none set)");
    }
    for st in shown {
        let _ = writeln!(w, "  {:<34} {}", format!("{}={}", st.name, st.value), st.source);
        for sh in &st.shadowed {
            let _ = writeln!(
                w,
                "  {:<34} {} (overridden)",
                format!("  {}={}", st.name, sh.value),
                sh.source
            );
        }
    }
}

fn transport(w: &mut String, r: &Report) {
    let _ = writeln!(
        w,
        "\nTRANSPORT BETWEEN GPUS: {} — {}",
        r.transport.path.label(),
        r.transport.why
    );
    if let Some(n) = &r.transport.inter_node {
        let _ = writeln!(w, "  between nodes: NET, {n}");
    }
}

fn conditions(w: &mut String, r: &Report) {
    let _ = writeln!(w, "\nCOPY-ENGINE (zero-CTA) CONDITIONS");
    let width = r
        .copy_engine
        .iter()
        .map(|c| c.what.chars().count())
        .max()
        .unwrap_or(0);
    for c in &r.copy_engine {
        let state = match c.state {
            State::Met => "ok",
            State::Missing => "MISSING",
            State::Unknown => "unknown",
            State::ProgramMust => "must",
        };
        let who = match c.decided_by {
            Decider::Machine => "machine",
            Decider::Program => "program",
        };
        let _ = writeln!(w, "  {who:<8} {state:<8} {:<width$} {}", c.what, c.evidence);
        let _ = writeln!(w, "  {:<17} source: {}", "", c.source);
    }
}

fn families(w: &mut String, r: &Report) {
    let _ = writeln!(w, "\nPER COLLECTIVE");
    let _ = writeln!(w, "  {:<19} {:<40} copy engine", "family", "path here");
    for fam in &r.families {
        let star = if fam.fallback.is_some() { "*" } else { "" };
        let _ = writeln!(
            w,
            "  {:<19} {:<40} {}",
            fam.family.name(),
            format!("{}{star}", fam.path.label()),
            fam.copy_engine
        );
        if let Some(fb) = fam.fallback {
            let _ = writeln!(w, "  {:<19} * otherwise: {}", "", fb.label());
        }
        for n in &fam.notes {
            let _ = writeln!(w, "  {:<19} - {n}", "");
        }
    }
}

fn requests(w: &mut String, r: &Report) {
    if r.requests.is_empty() {
        return;
    }
    let _ = writeln!(w, "\nREQUESTS IN THE ENVIRONMENT");
    for q in &r.requests {
        let verdict = match q.honoured {
            Some(true) => "possible",
            Some(false) => "NOT POSSIBLE HERE",
            None => "cannot tell",
        };
        let _ = writeln!(w, "  {} asks for {}: {verdict} — {}", q.setting, q.asks, q.why);
    }
}

fn findings(w: &mut String, r: &Report) {
    if r.findings.is_empty() {
        return;
    }
    let _ = writeln!(w, "\nFINDINGS");
    for fd in &r.findings {
        let _ = writeln!(w, "  {:<8} {}", fd.level.name(), fd.what);
    }
}

fn gather_notes(w: &mut String, f: &Facts) {
    if f.notes.is_empty() {
        return;
    }
    let _ = writeln!(w, "\nNOTES (while reading the machine)");
    for n in &f.notes {
        let _ = writeln!(w, "  {n}");
    }
}

fn fixes(w: &mut String, r: &Report) {
    if r.fixes.is_empty() {
        return;
    }
    let _ = writeln!(w, "\nFIXES");
    for (i, fx) in r.fixes.iter().enumerate() {
        let _ = writeln!(w, "  {}. {fx}", i + 1);
    }
}

fn exit_line(w: &mut String, r: &Report, probe: Option<&ProbeResult>) {
    let code = exit_code(r, probe);
    let why = match code {
        0 if r.requests.is_empty() => {
            "nothing in the environment asks for a path that cannot be taken here".to_owned()
        }
        0 => "every path the environment asks for can be taken here".to_owned(),
        3 => "a setting asks for a path that cannot be taken here (REQUESTS)".to_owned(),
        _ => match probe.map(|p| p.status) {
            Some(super::probe::ProbeStatus::Disagreed) => {
                "the probe saw another path than predicted".to_owned()
            }
            _ => "the probe could not run or could not tell".to_owned(),
        },
    };
    let _ = writeln!(w, "\nexit {code}: {why}");
    if r.families.iter().any(|f| f.path == Path::Unknown) && probe.is_none() {
        let _ = writeln!(
            w,
            "(some paths are unknown without NVML facts: `zcta doctor --probe` runs NCCL to see)"
        );
    }
}
