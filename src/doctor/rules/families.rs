//! Each collective family's path here, and the notes on it ([`super::NOTES`]).

use super::super::env;
use super::super::model::{Condition, Family, FamilyVerdict, Path, State};
use super::topology::{PATH_NVL, each_pair, find_pair, path_type, switch_links};
use super::{Ctx, Judged, NOTES, src_of, whats};
use crate::nccl_rules::{Basis, NcclRules, Rule};

/// The program's part of the copy-engine path, as phrases: (for "taken when your
/// program …", for "your program must …").
pub fn program_musts(rules: &NcclRules, ce: &[Condition], nodes: u32) -> (String, String) {
    // Across nodes the hierarchical copy engine wants both buffers in windows.
    let both = rules.has(Rule::BothWindows) || (rules.has(Rule::HierarchicalCe) && nodes > 1);
    let mut when = vec![if both {
        "registers both buffers as symmetric windows"
    } else {
        "registers the receive buffer as a symmetric window"
    }];
    let mut must = vec![if both {
        "put both buffers in symmetric windows"
    } else {
        "put the receive buffer in a symmetric window"
    }];
    when.push("issues on a non-default stream");
    must.push("use a non-default stream");
    if ce
        .iter()
        .any(|c| c.key == "cta_policy" && c.state == State::ProgramMust)
    {
        when.push("asks for CTA policy ZERO (ncclCollConfig_t.CTAPolicy or ncclConfig_t.CTAPolicy)");
        must.push("ask for CTA policy ZERO (per collective: ncclCollConfig_t.CTAPolicy; per communicator: ncclConfig_t.CTAPolicy)");
    }
    let join = |v: &[&str]| match v {
        [.., last] if v.len() > 1 => format!("{} and {last}", v[..v.len() - 1].join(", ")),
        _ => v.join(""),
    };
    (join(&when), join(&must))
}

/// Whether NCCL sends AllGather by copy engine here without CTA policy ZERO (2.29+):
/// `Ok(threshold)` when it does, else why not (`None` when the release has no such rule).
pub fn auto_ce_allgather(ctx: &Ctx<'_>) -> Option<Result<i64, String>> {
    if !ctx.rules.has(Rule::AutoCeAllGather) {
        return None;
    }
    Some(auto_ce_gpus(ctx).map(|()| env::nccl_param(&ctx.f.settings, "NCCL_SYM_CE_THRESHOLD", 8 << 20)))
}

/// sm100+ GPUs, NVLink between every pair.
fn auto_ce_gpus(ctx: &Ctx<'_>) -> Result<(), String> {
    let gpus = &ctx.gpus;
    if gpus.len() < 2 {
        return Err("fewer than two GPUs".into());
    }
    let cc: Vec<Option<u32>> = gpus
        .iter()
        .map(|g| {
            g.compute_capability
                .as_deref()
                .and_then(|c| c.split('.').next()?.parse().ok())
        })
        .collect();
    if cc.iter().any(Option::is_none) {
        return Err("compute capability unknown".into());
    }
    if let Some(g) = gpus.iter().zip(&cc).find(|(_, c)| c.unwrap_or(0) < 10) {
        return Err(format!(
            "GPU{} is compute capability {}, it needs sm100+",
            g.0.index,
            g.0.compute_capability.as_deref().unwrap_or("?")
        ));
    }
    let f = ctx.f;
    match each_pair(gpus)
        .find(|(a, b)| path_type(f, a, b, find_pair(f, a.index, b.index)).map(|(t, _)| t) != Some(PATH_NVL))
    {
        Some((a, b)) => Err(format!(
            "GPU{}-GPU{} is not NVLink, it needs NVLink between every pair",
            a.index, b.index
        )),
        None => Ok(()),
    }
}

/// A family with no copy-engine implementation.
fn never(rules: &NcclRules, fam: Family) -> String {
    let name = match fam {
        Family::AllReduce => "AllReduce",
        Family::ReduceScatter => "ReduceScatter",
        _ => "Broadcast",
    };
    let src = rules.source(Rule::CeCollectives);
    match rules.basis {
        Basis::Loaded | Basis::NewerThanChecked => {
            format!("never: {} has no copy-engine {name} ({src})", rules.named())
        }
        Basis::NoNccl | Basis::UnreadableVersion => format!(
            "never in the NCCL source these rules follow ({}, {src}: no copy-engine {name}); no libnccl found here to check",
            rules.version
        ),
    }
}

/// (path, the path when the program does not meet its part, the copy-engine line).
fn path(j: &Judged<'_>, fam: Family) -> (Path, Option<Path>, String) {
    let rules = j.ctx.rules;
    let kernels = j.kernels;
    let auto_src = rules.source(Rule::AutoCeAllGather);
    if !fam.ce_capable() {
        return (kernels, None, never(rules, fam));
    }
    if j.missing.is_empty() && j.unknown.is_empty() {
        let (taken_when, _) = program_musts(rules, j.ce, j.ctx.f.nodes.count);
        let line = match j.auto_threshold {
            Some(t) if fam == Family::AllGather => format!(
                "taken when your program {taken_when}; more than {t} elements per rank need no CTA policy ZERO ({auto_src})"
            ),
            _ => format!("taken when your program {taken_when}"),
        };
        return (Path::CopyEngine, Some(kernels), line);
    }
    match j.auto_threshold {
        Some(t) if fam == Family::AllGather => (
            Path::CopyEngine,
            Some(kernels),
            format!(
                "taken for more than {t} elements per rank when your program registers the receive buffer as a symmetric window and issues on a non-default stream, without CTA policy ZERO ({}, {auto_src}); smaller ones need {}",
                rules.named(),
                whats(&j.missing, "; ")
            ),
        ),
        _ if j.missing.is_empty() => (
            kernels,
            None,
            format!(
                "unconfirmed: cannot check {} (run --probe)",
                whats(&j.unknown, ", ")
            ),
        ),
        _ => (kernels, None, format!("not taken: {}", whats(&j.missing, "; "))),
    }
}

/// The verdict for one family.
pub fn verdict(j: &Judged<'_>, fam: Family) -> FamilyVerdict {
    let (path, fallback, copy_engine) = path(j, fam);
    let notes = NOTES
        .iter()
        .filter_map(|r| (r.note)(j, fam, path, &r.cite.text(j.ctx.rules)))
        .collect();
    FamilyVerdict {
        family: fam,
        calls: fam.calls().into(),
        ce_capable: fam.ce_capable(),
        path,
        fallback,
        copy_engine,
        notes,
    }
}

/// From 2.29, why AllGather does not take the copy engine without CTA policy ZERO here.
pub fn no_auto_ce_allgather(j: &Judged<'_>, fam: Family, _: Path, cite: &str) -> Option<String> {
    match &j.auto_ag {
        Some(Err(why)) if fam == Family::AllGather => Some(format!(
            "{} sends large AllGathers by copy engine without CTA policy ZERO only on sm100+ GPUs with NVLink between every pair ({cite}); not here: {why}",
            j.ctx.rules.named()
        )),
        _ => None,
    }
}

/// From 2.30.5, across nodes: the hierarchical copy engine for AllGather and AlltoAll.
pub fn hierarchical_ce(j: &Judged<'_>, fam: Family, _: Path, cite: &str) -> Option<String> {
    let rules = j.ctx.rules;
    (rules.has(Rule::HierarchicalCe)
        && j.ctx.f.nodes.count > 1
        && matches!(fam, Family::AllGather | Family::AlltoAll))
    .then(|| {
        format!(
            "across nodes {} may take its hierarchical copy engine (RMA proxy between nodes, copy engine within one) with both buffers in symmetric windows and CTA policy ZERO ({cite})",
            rules.named()
        )
    })
}

/// Grouped Send/Recv never takes the copy engine.
pub fn send_recv_kernels(_: &Judged<'_>, fam: Family, _: Path, _: &str) -> Option<String> {
    (fam == Family::AlltoAll).then(|| "only ncclAlltoAll (all_to_all_single with equal splits) can use the copy engine; grouped Send/Recv always runs kernels (ncclDevKernel_SendRecv)".into())
}

fn symk_family(fam: Family) -> bool {
    matches!(fam, Family::AllReduce | Family::ReduceScatter | Family::AllGather)
}

/// NCCL's symmetric-memory kernels, where the copy engine is not the path.
pub fn symmetric_kernels(_: &Judged<'_>, fam: Family, path: Path, _: &str) -> Option<String> {
    (symk_family(fam) && path != Path::CopyEngine)
        .then(|| "on symmetric windows NCCL may run its symmetric-memory kernels instead (ncclSymk…)".into())
}

/// NVLS (NVLink SHARP) on NVSwitch systems.
pub fn nvls(j: &Judged<'_>, fam: Family, _: Path, _: &str) -> Option<String> {
    let f = j.ctx.f;
    let nvswitch = f
        .gpus
        .iter()
        .any(|g| j.ctx.visible.contains(&g.index) && switch_links(f, g) > 0);
    if !symk_family(fam) || !nvswitch {
        return None;
    }
    let nvls = env::get(&f.settings, "NCCL_NVLS_ENABLE").filter(|s| !s.value.is_empty());
    Some(match nvls {
        Some(s) if env::strtoll(&s.value).value == Some(0) => {
            format!("NVLS (NVLink SHARP) is off: {}", src_of(s))
        }
        _ => {
            "GPUs hang off NVSwitches: NCCL may use NVLS (NVLink SHARP) here (NCCL_NVLS_ENABLE, default auto)"
                .into()
        }
    })
}
