//! The libraries a torch process loads: NCCL copies, torch itself, CUPTI.

use super::super::model::{Finding, Level};
use super::Judged;

/// More than one libnccl: which one torch loads, and whether another could win.
pub fn nccl_copies(j: &Judged<'_>, _: &str) -> Option<Finding> {
    let nccl = &j.ctx.f.nccl;
    let sel = nccl.iter().find(|l| l.selected)?;
    let others: Vec<String> = nccl
        .iter()
        .filter(|l| !l.selected)
        .map(|l| {
            format!(
                "{} {} ({})",
                l.version.as_deref().unwrap_or("?"),
                l.path,
                l.origin
            )
        })
        .collect();
    if others.is_empty() {
        return None;
    }
    let ld = nccl.iter().any(|l| l.origin == "LD_LIBRARY_PATH" && !l.selected);
    Some(Finding {
        level: if ld { Level::Warning } else { Level::Info },
        what: format!(
            "{} NCCL copies: torch loads {} {} ({}); also {}{}",
            others.len() + 1,
            sel.version.as_deref().unwrap_or("?"),
            sel.path,
            sel.origin,
            others.join("; "),
            if ld {
                " — the LD_LIBRARY_PATH copy wins if torch's library uses RUNPATH"
            } else {
                ""
            }
        ),
        fix: ld.then(|| "`zcta doctor --probe` shows which copy really loads (process.nccl_lib)".to_owned()),
    })
}

/// No torch: the NCCL reported is what any program linking libnccl.so.2 loads.
pub fn no_torch(j: &Judged<'_>, _: &str) -> Option<Finding> {
    let py = &j.ctx.f.python;
    py.torch.is_none().then(|| Finding {
        level: Level::Info,
        what: format!(
            "no torch found by {} ({}): the NCCL reported is what a program linking libnccl.so.2 loads",
            py.interpreter,
            py.error.as_deref().unwrap_or("torch not installed")
        ),
        fix: None,
    })
}

/// The libcupti.so.13 zcta's GPU capture uses: torch's own, or none.
pub fn cupti(j: &Judged<'_>, _: &str) -> Option<Finding> {
    let cupti = &j.ctx.f.cupti;
    match cupti.iter().find(|l| l.selected) {
        Some(c) if c.origin == "torch wheel" || c.origin == "bundled with torch" => Some(Finding {
            level: Level::Info,
            what: format!(
                "torch ships CUPTI {} ({}): it is loaded once torch is imported, and zcta's capture reuses that copy (never a second one)",
                c.version.as_deref().unwrap_or("?"),
                c.path
            ),
            fix: None,
        }),
        Some(_) => None,
        None => Some(Finding {
            level: Level::Warning,
            what: if cupti.is_empty() {
                "no libcupti found: zcta's GPU capture (engine, GPU times) will be off".into()
            } else {
                format!(
                    "no libcupti.so.13 (CUPTI 13) found, only {}: zcta's GPU capture will be off",
                    cupti.iter().map(|l| l.path.as_str()).collect::<Vec<_>>().join(", ")
                )
            },
            fix: Some("install CUPTI 13 (pip install nvidia-cuda-cupti, or the CUDA 13 toolkit) or point ZCTA_CUPTI_LIB at it".into()),
        }),
    }
}
