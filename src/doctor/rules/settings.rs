//! NCCL's and torch's settings that are not requests: misspelt names, plugins, the
//! `TORCH_NCCL_*` variables.

use super::super::env;
use super::super::model::{Finding, Level};
use super::{Judged, src_of};

/// Conf-file lines with spaces around the name: NCCL never reads them.
pub fn spaced_names(j: &Judged<'_>, _: &str) -> Vec<Finding> {
    j.ctx
        .f
        .settings
        .iter()
        .filter(|s| s.name != s.name.trim())
        .map(|s| Finding {
            level: Level::Warning,
            what: format!(
                "{}: the line for {:?} has spaces around the name, so NCCL sets a variable named {:?} and never reads it",
                s.source,
                s.name.trim(),
                s.name
            ),
            fix: Some(format!("write it as {}={}", s.name.trim(), s.value.trim())),
        })
        .collect()
}

/// A user profiler plugin: NCCL loads one per process, so zcta's stays out.
pub fn profiler_plugin(j: &Judged<'_>, _: &str) -> Option<Finding> {
    let s = env::get(&j.ctx.f.settings, "NCCL_PROFILER_PLUGIN")?;
    Some(Finding {
        level: Level::Info,
        what: format!(
            "{}: NCCL loads one profiler plugin per process, so zcta's NCCL view (algorithm, protocol, proxy steps) stays off; GPU capture is unaffected",
            src_of(s)
        ),
        fix: None,
    })
}

/// An environment plugin may answer NCCL's variables otherwise than shown.
pub fn env_plugin(j: &Judged<'_>, cite: &str) -> Option<Finding> {
    let s = env::get(&j.ctx.f.settings, "NCCL_ENV_PLUGIN")?;
    Some(Finding {
        level: Level::Warning,
        what: format!(
            "{}: an environment plugin may answer NCCL's variables differently from what is shown here ({cite})",
            src_of(s)
        ),
        fix: None,
    })
}

/// `TORCH_NCCL_*`: torch-side, none a copy-engine condition.
pub fn torch_vars(j: &Judged<'_>, _: &str) -> Option<Finding> {
    let vars: Vec<&str> = j
        .ctx
        .f
        .settings
        .iter()
        .filter(|s| s.name.starts_with("TORCH_NCCL_"))
        .map(|s| s.name.as_str())
        .collect();
    (!vars.is_empty()).then(|| Finding {
        level: Level::Info,
        what: format!(
            "{}: torch-side settings of its NCCL process group; none is a condition of the copy-engine path in {}",
            vars.join(", "),
            j.ctx.rules.named()
        ),
        fix: None,
    })
}
