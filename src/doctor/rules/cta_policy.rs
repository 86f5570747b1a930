//! The CTA policy the copy engine needs (`NCCL_CTA_POLICY_ZERO`): how the judged NCCL
//! reads `NCCL_CTA_POLICY`, the condition, and the requests the variable makes.

use super::super::env::{self, Setting};
use super::super::model::{Decider, Request, State};
use super::{Check, Ctx, Judged, src_of};
use crate::nccl_rules::{NcclRules, Rule};

/// The effective `NCCL_CTA_POLICY`, read as the judged NCCL reads it: (the policy,
/// whether NCCL takes the value, the setting). A value NCCL does not take is policy 0
/// before 2.29 (`init.cc:1785`); from 2.29 on NCCL ignores it, and the communicator's
/// own policy (default 0) stays.
pub fn read<'a>(settings: &'a [Setting], rules: &NcclRules) -> Option<(i64, bool, &'a Setting)> {
    let s = env::get(settings, "NCCL_CTA_POLICY").filter(|s| !s.value.is_empty())?;
    if rules.has(Rule::CtaPolicyFlags) {
        let p = flags(&s.value);
        return Some((p.unwrap_or(0), p.is_some(), s));
    }
    let t = env::strtoll(&s.value);
    let v = t.value.unwrap_or(i64::MIN);
    // init.cc:1785: outside NCCL_CTA_POLICY_DEFAULT..=NCCL_CTA_POLICY_ZERO → default.
    let valid = t.digits && (0..=2).contains(&v);
    Some((if valid { v } else { 0 }, valid, s))
}

/// `getEnvCtaPolicyOnce` from 2.29 on: a leading digit 0, 1 or 2 (the rest of the value
/// unread; another digit is ignored), else `DEFAULT`, `EFFICIENCY`, `ZERO` (any case)
/// joined by `|`, unknown names skipped; ZERO wins over EFFICIENCY. `None`: ignored.
fn flags(v: &str) -> Option<i64> {
    let p = match v.as_bytes().first() {
        Some(c) if c.is_ascii_digit() => match c {
            b'0' => 0,
            b'1' => 1,
            b'2' => 2,
            _ => return None,
        },
        _ => {
            let mut acc = None;
            for t in v.split('|').filter(|t| !t.is_empty()) {
                let bit = match t.to_ascii_uppercase().as_str() {
                    "DEFAULT" => 0,
                    "EFFICIENCY" => 1,
                    "ZERO" => 2,
                    _ => continue,
                };
                acc = Some(acc.unwrap_or(0) | bit);
            }
            acc?
        }
    };
    Some(if p == 3 { 2 } else { p })
}

const PROGRAM_DECIDES: &str = "decided by your program: ncclCollConfig_t.CTAPolicy of each nccl*Config call, else ncclConfig_t.CTAPolicy of the communicator";

/// CTA policy ZERO: the environment's (overriding the communicator's config); from
/// 2.31.2 each collective can ask for its own, which only the program knows.
pub fn condition(ctx: &Ctx<'_>) -> Option<Check> {
    let per_coll = ctx.rules.has(Rule::PerCollectiveCtaPolicy);
    let flags = ctx.rules.has(Rule::CtaPolicyFlags);
    let what = if per_coll {
        "CTA policy ZERO (per collective, per communicator, or NCCL_CTA_POLICY=2)"
    } else if flags {
        "NCCL_CTA_POLICY=2 or ZERO (NCCL_CTA_POLICY_ZERO)"
    } else {
        "NCCL_CTA_POLICY=2 (NCCL_CTA_POLICY_ZERO)"
    };
    let (decided_by, state, evidence) = state(ctx, per_coll, flags);
    Some(Check {
        what: what.into(),
        decided_by,
        state,
        evidence,
        fix: fix(per_coll, flags, state),
    })
}

fn state(ctx: &Ctx<'_>, per_coll: bool, flags: bool) -> (Decider, State, String) {
    use Decider::{Machine, Program};
    match read(&ctx.f.settings, ctx.rules) {
        Some((2, true, s)) => (Machine, State::Met, src_of(s)),
        Some((v, true, s)) if per_coll => (
            Machine,
            State::Missing,
            format!(
                "{} (policy {v}, no ZERO): the variable overrides the program's per-communicator and per-collective CTA policy",
                src_of(s)
            ),
        ),
        Some((v, true, s)) => (
            Machine,
            State::Missing,
            format!("{} (policy {v}, not 2)", src_of(s)),
        ),
        Some((_, false, s)) if per_coll => (
            Program,
            State::ProgramMust,
            format!(
                "{}: not a policy NCCL knows, so NCCL ignores it; {PROGRAM_DECIDES}",
                src_of(s)
            ),
        ),
        Some((_, false, s)) if flags => (
            Machine,
            State::Missing,
            format!(
                "{}: not a policy NCCL knows; NCCL ignores it and keeps the communicator's (default 0)",
                src_of(s)
            ),
        ),
        Some((_, false, s)) => (
            Machine,
            State::Missing,
            format!("{}: not a policy NCCL knows; it uses 0", src_of(s)),
        ),
        None if per_coll => (
            Program,
            State::ProgramMust,
            format!("NCCL_CTA_POLICY not set: {PROGRAM_DECIDES}"),
        ),
        None => (
            Machine,
            State::Missing,
            "NCCL_CTA_POLICY not set (policy 0)".to_owned(),
        ),
    }
}

fn fix(per_coll: bool, flags: bool, state: State) -> &'static str {
    match (per_coll, state) {
        (true, State::ProgramMust) => {
            "pass ncclCollConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO to the nccl*Config call of each collective (or set ncclConfig_t.CTAPolicy for the communicator), or export NCCL_CTA_POLICY=2 for every communicator of the process"
        }
        (true, _) => {
            "unset NCCL_CTA_POLICY so that the program's own CTA policy counts (ncclCollConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO per collective, ncclConfig_t.CTAPolicy per communicator), or set it to 2: the variable overrides both"
        }
        _ if flags => {
            "export NCCL_CTA_POLICY=2 (or ZERO; or set ncclConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO in the program; the variable overrides the config)"
        }
        _ => {
            "export NCCL_CTA_POLICY=2 (or set ncclConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO in the program; the variable overrides the config)"
        }
    }
}

/// The setting, when the judged NCCL cannot read its value.
fn unreadable<'a>(j: &Judged<'a>) -> Option<&'a Setting> {
    match read(&j.ctx.f.settings, j.ctx.rules) {
        Some((_, false, s)) => Some(s),
        _ => None,
    }
}

fn policy_request(s: &Setting, why: String) -> Option<Request> {
    Some(Request {
        setting: src_of(s),
        asks: "a CTA policy".into(),
        honoured: Some(false),
        why,
    })
}

/// To 2.28: a value `strtoll` does not read as 0–2 is policy 0.
pub fn unreadable_number(j: &Judged<'_>, cite: &str) -> Option<Request> {
    if j.ctx.rules.has(Rule::CtaPolicyFlags) {
        return None;
    }
    let s = unreadable(j)?;
    policy_request(
        s,
        format!(
            "NCCL reads it with strtoll as {} and uses policy 0 for anything outside 0..2 ({cite})",
            env::strtoll(&s.value)
                .value
                .map_or("an overflow".into(), |n| n.to_string())
        ),
    )
}

/// From 2.29: a value NCCL cannot read is ignored.
pub fn unreadable_flags(j: &Judged<'_>, cite: &str) -> Option<Request> {
    if !j.ctx.rules.has(Rule::CtaPolicyFlags) {
        return None;
    }
    policy_request(
        unreadable(j)?,
        format!(
            "NCCL reads a leading digit 0, 1 or 2, or the names DEFAULT, EFFICIENCY, ZERO joined by '|', and ignores anything else ({cite}): the communicator's own CTA policy stays"
        ),
    )
}

/// Policy ZERO asks for the copy engine: honoured when every machine condition is met.
pub fn zero_request(j: &Judged<'_>, _: &str) -> Option<Request> {
    let Some((2, true, s)) = read(&j.ctx.f.settings, j.ctx.rules) else {
        return None;
    };
    let honoured = if !j.missing.is_empty() {
        Some(false)
    } else if !j.unknown.is_empty() {
        None
    } else {
        Some(true)
    };
    let why = match honoured {
        Some(false) => format!(
            "missing here: {}",
            j.missing
                .iter()
                .map(|c| format!("{} ({})", c.what, c.evidence))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        None => format!("cannot check: {}", super::whats(&j.unknown, ", ")),
        Some(true) => {
            "every machine condition is met; the program must still use symmetric windows and a side stream"
                .into()
        }
    };
    Some(Request {
        setting: src_of(s),
        asks: "the copy engine for AllGather and AlltoAll".into(),
        honoured,
        why,
    })
}
