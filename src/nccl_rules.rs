//! The copy-engine rules that differ between NCCL releases, as one table: each entry
//! names a rule, the versions it holds for and where NCCL says so (`tag:file:line`).
//! [`NcclRules::for_facts`] picks the release to judge by — the NCCL a torch process
//! loads — and the verdicts ask it which rules hold ([`NcclRules::has`]) and what to
//! cite ([`NcclRules::source`]). docs/doctor.md ("NCCL versions") is this table in
//! prose.
//!
//! Releases 2.28.9 through 2.30.7 were read at their tags in NVIDIA's repository. For
//! 2.31.2 and 2.32.3 no source tag was at hand: their entries rest on the release's
//! `nccl.h` and on `libnccl.so.2` itself (its symbols, its strings, and the code of one
//! function), both from the `nvidia-nccl-cu13` wheel. A newer release is judged by
//! 2.32.3's rules and said to be unverified.

#[cfg(feature = "doctor")]
use crate::doctor::facts::Facts;

/// `(major, minor, patch)`.
pub type Ver = (u32, u32, u32);

/// A rule of NCCL's copy-engine path that is not the same in every release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The copy engine needs every rank on one node (`comm->nNodes == 1`).
    OneNode,
    /// The copy engine needs every rank in one load/store (LSA) team: one node, or one
    /// multi-node NVLink (MNNVL) domain. More nodes are no bar by themselves.
    OneLsaTeam,
    /// Across nodes, AllGather and AlltoAll may take the hierarchical copy engine:
    /// NCCL's RMA proxy between nodes, copy-engine writes within one.
    HierarchicalCe,
    /// `NCCL_CTA_POLICY` is a number read with `strtoll`; outside 0–2 it means 0; the
    /// copy engine needs exactly `NCCL_CTA_POLICY_ZERO`.
    CtaPolicyNumber,
    /// `NCCL_CTA_POLICY` is a leading digit 0, 1 or 2, or the names `DEFAULT`,
    /// `EFFICIENCY`, `ZERO` joined by `|`; anything else is ignored; ZERO wins over
    /// EFFICIENCY; the copy engine needs the ZERO bit.
    CtaPolicyFlags,
    /// A collective can ask for its own CTA policy (`ncclCollConfig_t.CTAPolicy` with
    /// the `nccl*Config` calls); a set `NCCL_CTA_POLICY` overrides it.
    PerCollectiveCtaPolicy,
    /// Both buffers must be in symmetric windows.
    BothWindows,
    /// On one node (or LSA team) only the receive buffer must be in a symmetric window.
    RecvWindow,
    /// A window with a host-memory segment never takes the copy engine.
    NoSysmemWindows,
    /// AllGather takes the copy engine without CTA policy ZERO when the count per rank
    /// exceeds `NCCL_SYM_CE_THRESHOLD`, every GPU is sm100+ and every pair is NVLink.
    AutoCeAllGather,
    /// The collectives with a copy-engine implementation: AllGather, AlltoAll, Gather,
    /// Scatter (and, across nodes, AllGather and AlltoAll).
    CeCollectives,
}

/// One line of the table.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub rule: Rule,
    /// First version it holds for.
    pub from: Ver,
    /// First version it no longer holds for; `None`: through the newest checked.
    pub until: Option<Ver>,
    /// Where NCCL says so.
    pub source: &'static str,
}

const fn e(rule: Rule, from: Ver, until: Option<Ver>, source: &'static str) -> Entry {
    Entry {
        rule,
        from,
        until,
        source,
    }
}

/// Which rules hold for which releases. An entry for 2.31 and later that says "as at
/// v2.30.7-1" carries 2.30.7's source forward: the 2.31.2 and 2.32.3 libraries have the
/// same functions, but their source was not read.
pub const TABLE: &[Entry] = &[
    e(
        Rule::OneNode,
        (2, 28, 0),
        Some((2, 29, 0)),
        "v2.28.9-1:src/enqueue.cc:2580 (comm->nNodes == 1)",
    ),
    e(
        Rule::OneNode,
        (2, 29, 0),
        Some((2, 30, 0)),
        "v2.29.7-1:src/ce_coll.cc:105 (ncclCeAvailable: comm->nNodes > 1 skips; v2.29.2-1: :106)",
    ),
    e(
        Rule::OneLsaTeam,
        (2, 30, 0),
        Some((2, 31, 0)),
        "v2.30.7-1:src/ce_coll.cc:118 (ncclCeAvailable: ncclTeamLsa(comm).nRanks < comm->nRanks skips; v2.30.3-1: :110)",
    ),
    e(
        Rule::OneLsaTeam,
        (2, 31, 0),
        None,
        "as at v2.30.7-1:src/ce_coll.cc:118 (2.31.2, 2.32.3: ncclCeAvailable in libnccl.so.2)",
    ),
    // Absent at v2.30.4-1.
    e(
        Rule::HierarchicalCe,
        (2, 30, 5),
        Some((2, 31, 0)),
        "v2.30.7-1:src/ce_coll.cc:719-761 (ncclHierCeAvailable), src/enqueue.cc:3054",
    ),
    e(
        Rule::HierarchicalCe,
        (2, 31, 0),
        None,
        "as at v2.30.7-1:src/ce_coll.cc:719-761 (2.31.2, 2.32.3: ncclHierCeAvailable, ncclHierCeAllGather, ncclHierCeAlltoAll in libnccl.so.2)",
    ),
    e(
        Rule::CtaPolicyNumber,
        (2, 28, 0),
        Some((2, 29, 0)),
        "v2.28.9-1:src/init.cc:60,1745-1750 (strtoll; the variable overrides ncclConfig_t.CTAPolicy), :1785-1788 (outside 0..2 is 0), src/enqueue.cc:2580 (== NCCL_CTA_POLICY_ZERO)",
    ),
    e(
        Rule::CtaPolicyFlags,
        (2, 29, 0),
        Some((2, 30, 0)),
        "v2.29.7-1:src/init.cc:74-116 (getEnvCtaPolicyOnce), :1898-1902 (the variable overrides ncclConfig_t.CTAPolicy), :1947-1952 (ZERO wins over EFFICIENCY), src/enqueue.cc:2920 (CTAPolicy & NCCL_CTA_POLICY_ZERO)",
    ),
    e(
        Rule::CtaPolicyFlags,
        (2, 30, 0),
        Some((2, 31, 0)),
        "v2.30.7-1:src/init.cc:82-126 (getEnvCtaPolicyOnce), :2162-2167 (the variable overrides ncclConfig_t.CTAPolicy), :2217-2223 (ZERO wins over EFFICIENCY), src/enqueue.cc:3054 (CTAPolicy & NCCL_CTA_POLICY_ZERO)",
    ),
    e(
        Rule::CtaPolicyFlags,
        (2, 31, 0),
        None,
        "as at v2.30.7-1:src/init.cc:82-126 (2.31.2, 2.32.3: the same NCCL_CTA_POLICY messages in libnccl.so.2)",
    ),
    // v2.30.7-1 has no ncclCollConfig_t; the 2.31.0a16 pre-release's has no CTAPolicy.
    e(
        Rule::PerCollectiveCtaPolicy,
        (2, 31, 2),
        Some((2, 32, 0)),
        "2.31.2 nccl.h:195 (ncclCollConfig_t.CTAPolicy, unset inherits the communicator's); libnccl.so.2: ncclEnqueueCheck calls ncclCollConfigResolveCTAPolicy (a set NCCL_CTA_POLICY wins) before testing the ZERO bit",
    ),
    e(
        Rule::PerCollectiveCtaPolicy,
        (2, 32, 0),
        None,
        "2.32.3 nccl.h:210 (ncclCollConfig_t.CTAPolicy, unset inherits the communicator's); libnccl.so.2: ncclEnqueueCheck calls ncclCollConfigResolveCTAPolicy (a set NCCL_CTA_POLICY wins) before testing the ZERO bit",
    ),
    e(
        Rule::BothWindows,
        (2, 28, 0),
        Some((2, 29, 0)),
        "v2.28.9-1:src/enqueue.cc:2575-2580 (ncclDevrFindWindow, winFlags)",
    ),
    e(
        Rule::RecvWindow,
        (2, 29, 0),
        Some((2, 30, 0)),
        "v2.29.7-1:src/ce_coll.cc:113 (ncclSymSendRegRecvReg or ncclSymSendNonregRecvReg)",
    ),
    e(
        Rule::RecvWindow,
        (2, 30, 0),
        None,
        "v2.30.7-1:src/ce_coll.cc:126 (ncclSymSendRegRecvReg or ncclSymSendNonregRecvReg), :756 (both across nodes)",
    ),
    e(
        Rule::NoSysmemWindows,
        (2, 30, 0),
        None,
        "v2.30.7-1:src/enqueue.cc:3052-3054 (!hasSysmemSegment; v2.30.3-1: :2955-2957)",
    ),
    e(
        Rule::AutoCeAllGather,
        (2, 29, 0),
        Some((2, 30, 0)),
        "v2.29.7-1:src/enqueue.cc:31,2966 (count > NCCL_SYM_CE_THRESHOLD, minCompCap >= 100, isAllDirectNvlink; v2.29.2-1: :30,2966)",
    ),
    e(
        Rule::AutoCeAllGather,
        (2, 30, 0),
        Some((2, 31, 0)),
        "v2.30.7-1:src/enqueue.cc:31,3110-3111 (count > NCCL_SYM_CE_THRESHOLD, minCompCap >= 100, isAllDirectNvlink)",
    ),
    e(
        Rule::AutoCeAllGather,
        (2, 31, 0),
        None,
        "as at v2.30.7-1:src/enqueue.cc:31,3110-3111 (2.31.2, 2.32.3 read NCCL_SYM_CE_THRESHOLD; their default was not read)",
    ),
    e(
        Rule::CeCollectives,
        (2, 28, 0),
        Some((2, 29, 0)),
        "v2.28.9-1:src/ce_coll.cc:82-99",
    ),
    e(
        Rule::CeCollectives,
        (2, 29, 0),
        Some((2, 30, 0)),
        "v2.29.7-1:src/ce_coll.cc:81-98",
    ),
    e(
        Rule::CeCollectives,
        (2, 30, 0),
        Some((2, 31, 0)),
        "v2.30.7-1:src/ce_coll.cc:93-110",
    ),
    e(
        Rule::CeCollectives,
        (2, 31, 0),
        None,
        "libnccl.so.2 of 2.31.2 and 2.32.3: ncclCeAllGather, ncclCeAlltoAll, ncclCeGather, ncclCeScatter, ncclHierCeAllGather, ncclHierCeAlltoAll, no other",
    ),
];

/// Releases whose rules were read: `true` at their source tag, `false` from the
/// release's `nccl.h` and `libnccl.so.2` (no source tag at hand).
pub const CHECKED: &[(Ver, bool)] = &[
    ((2, 28, 9), true),
    ((2, 29, 2), true),
    ((2, 29, 3), true),
    ((2, 29, 7), true),
    ((2, 30, 3), true),
    ((2, 30, 4), true),
    ((2, 30, 7), true),
    ((2, 31, 2), false),
    ((2, 32, 3), false),
];

/// The newest release checked: newer ones are judged by its rules, unverified.
pub const NEWEST_CHECKED: Ver = (2, 32, 3);

/// The release judged by when no NCCL (or no version) is found: torch 2.11's NCCL.
pub const WITHOUT_NCCL: Ver = (2, 28, 9);

/// Why these rules were chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "doctor", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "doctor", serde(rename_all = "snake_case"))]
pub enum Basis {
    /// The NCCL a torch process loads, a version checked or inside a checked range.
    Loaded,
    /// Newer than the newest checked: that one's rules, unverified.
    NewerThanChecked,
    /// No libnccl found: [`WITHOUT_NCCL`]'s rules.
    NoNccl,
    /// A libnccl whose version is unreadable: [`WITHOUT_NCCL`]'s rules.
    UnreadableVersion,
}

/// The rules a report follows.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "doctor", derive(serde::Serialize, serde::Deserialize))]
pub struct NcclRules {
    /// The release whose rules are applied (`2.30.7`).
    pub version: String,
    /// The version of the NCCL found, when there is one.
    pub loaded: Option<String>,
    pub basis: Basis,
    /// How that release's rules were read.
    pub checked: String,
    #[cfg_attr(feature = "doctor", serde(skip))]
    ver: Ver,
}

pub fn parse_version(v: &str) -> Option<Ver> {
    let mut it = v.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty());
    Some((
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next().and_then(|p| p.parse().ok()).unwrap_or(0),
    ))
}

fn ver_str(v: Ver) -> String {
    format!("{}.{}.{}", v.0, v.1, v.2)
}

/// A version from `ncclGetVersion`'s code ([`crate::nccl::version_parts`]); `None`
/// before 2.9 (no copy engine, and another encoding) and for odd codes.
pub fn from_version_code(code: i32) -> Option<Ver> {
    crate::nccl::version_parts(code).filter(|&v| v >= (2, 9, 0))
}

impl NcclRules {
    /// The rules of the NCCL that a torch process loads (`selected`).
    #[cfg(feature = "doctor")]
    pub fn for_facts(f: &Facts) -> Self {
        let sel = f.nccl.iter().find(|l| l.selected);
        let loaded = sel.and_then(|l| l.version.clone());
        match (sel, loaded.as_deref().and_then(parse_version)) {
            (Some(_), Some(v)) => Self::of(v, loaded),
            (Some(_), None) => Self::fallback(Basis::UnreadableVersion, loaded),
            (None, _) => Self::fallback(Basis::NoNccl, None),
        }
    }

    /// The rules for version `v`.
    pub fn of(v: Ver, loaded: Option<String>) -> Self {
        let loaded = loaded.or_else(|| Some(ver_str(v)));
        if v > NEWEST_CHECKED {
            return NcclRules {
                version: ver_str(NEWEST_CHECKED),
                loaded,
                basis: Basis::NewerThanChecked,
                checked: checked_how(NEWEST_CHECKED),
                ver: NEWEST_CHECKED,
            };
        }
        NcclRules {
            version: ver_str(v),
            loaded,
            basis: Basis::Loaded,
            checked: checked_how(v),
            ver: v,
        }
    }

    /// The rules used when no NCCL says its version (2.28.9's).
    pub fn without_nccl() -> Self {
        Self::fallback(Basis::NoNccl, None)
    }

    fn fallback(basis: Basis, loaded: Option<String>) -> Self {
        NcclRules {
            version: ver_str(WITHOUT_NCCL),
            loaded,
            basis,
            checked: checked_how(WITHOUT_NCCL),
            ver: WITHOUT_NCCL,
        }
    }

    fn entry(&self, rule: Rule) -> Option<&'static Entry> {
        TABLE
            .iter()
            .find(|e| e.rule == rule && e.from <= self.ver && e.until.is_none_or(|u| self.ver < u))
    }

    /// Whether `rule` holds in the release judged by. Releases before 2.28 (no copy
    /// engine at all) are judged by 2.28's rules, their version condition aside.
    pub fn has(&self, rule: Rule) -> bool {
        self.entry(rule).is_some() || (self.ver < (2, 28, 0) && Self::of((2, 28, 0), None).has(rule))
    }

    /// Where NCCL says so, for a rule that holds (else the empty string).
    pub fn source(&self, rule: Rule) -> &'static str {
        match self.entry(rule) {
            Some(e) => e.source,
            None if self.ver < (2, 28, 0) => Self::of((2, 28, 0), None).source(rule),
            None => "",
        }
    }

    /// "NCCL 2.30.7" or, for a newer release, "NCCL 2.32.3 (the newest checked;
    /// 2.40.1 unverified)".
    pub fn named(&self) -> String {
        match self.basis {
            Basis::NewerThanChecked => format!(
                "NCCL {} (the newest checked; {} unverified)",
                self.version,
                self.loaded.as_deref().unwrap_or("?")
            ),
            _ => format!("NCCL {}", self.version),
        }
    }

    /// One sentence on which rules these are, when that is not simply the loaded NCCL's.
    pub fn caveat(&self) -> Option<String> {
        match self.basis {
            Basis::Loaded => None,
            Basis::NewerThanChecked => Some(format!(
                "NCCL {} is newer than the newest NCCL checked ({}): the copy-engine rules here are {}'s, unverified for {}.",
                self.loaded.as_deref().unwrap_or("?"),
                self.version,
                self.version,
                self.loaded.as_deref().unwrap_or("?")
            )),
            Basis::NoNccl => Some(format!(
                "No libnccl.so.2 found: the copy-engine rules here are NCCL {}'s (torch 2.11's NCCL; torch.cuda.nccl.version() tells which NCCL torch has).",
                self.version
            )),
            Basis::UnreadableVersion => Some(format!(
                "The version of the libnccl torch loads is unreadable: the copy-engine rules here are NCCL {}'s.",
                self.version
            )),
        }
    }
}

/// How `v`'s rules were read: the checked releases of its minor version.
fn checked_how(v: Ver) -> String {
    let same = CHECKED.iter().filter(|(c, _)| (c.0, c.1) == (v.0, v.1));
    let tags: Vec<String> = same
        .clone()
        .filter(|(_, src)| *src)
        .map(|(c, _)| format!("v{}-1", ver_str(*c)))
        .collect();
    let libs: Vec<String> = same.filter(|(_, src)| !*src).map(|(c, _)| ver_str(*c)).collect();
    let mut how = Vec::new();
    if !tags.is_empty() {
        how.push(format!(
            "read from the source at tag{} {}",
            if tags.len() > 1 { "s" } else { "" },
            tags.join(", ")
        ));
    }
    if !libs.is_empty() {
        how.push(format!(
            "read from the nccl.h and libnccl.so.2 of {} (no source tag at hand)",
            libs.join(", ")
        ));
    }
    if how.is_empty() {
        format!("no {}.{} release checked: judged by the table's ranges", v.0, v.1)
    } else {
        how.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_has_one_entry_per_version() {
        let rules = [
            Rule::OneNode,
            Rule::OneLsaTeam,
            Rule::HierarchicalCe,
            Rule::CtaPolicyNumber,
            Rule::CtaPolicyFlags,
            Rule::PerCollectiveCtaPolicy,
            Rule::BothWindows,
            Rule::RecvWindow,
            Rule::NoSysmemWindows,
            Rule::AutoCeAllGather,
            Rule::CeCollectives,
        ];
        for minor in 28..=32 {
            for patch in 0..=9 {
                let v = (2, minor, patch);
                for r in rules {
                    let n = TABLE
                        .iter()
                        .filter(|e| e.rule == r && e.from <= v && e.until.is_none_or(|u| v < u))
                        .count();
                    assert!(n <= 1, "{r:?} at {v:?}: {n} entries");
                }
                let r = NcclRules::of(v, None);
                // Exactly one node rule, one CTA-policy parser, one window rule.
                assert!(r.has(Rule::OneNode) ^ r.has(Rule::OneLsaTeam), "{v:?}");
                assert!(
                    r.has(Rule::CtaPolicyNumber) ^ r.has(Rule::CtaPolicyFlags),
                    "{v:?}"
                );
                assert!(r.has(Rule::BothWindows) ^ r.has(Rule::RecvWindow), "{v:?}");
                assert!(r.has(Rule::CeCollectives), "{v:?}");
            }
        }
        for e in TABLE {
            assert!(e.source.contains(':'), "{e:?}");
            assert!(e.until.is_none_or(|u| e.from < u), "{e:?}");
        }
    }

    #[test]
    fn version_codes_are_nccl_version_code() {
        assert_eq!(from_version_code(22809), Some((2, 28, 9)));
        assert_eq!(from_version_code(23203), Some((2, 32, 3)));
        assert_eq!(from_version_code(2708), None, "before 2.9: another encoding");
        assert_eq!(from_version_code(-1), None);
    }

    #[test]
    fn versions_parse_and_pick_their_rules() {
        assert_eq!(parse_version("2.29.3"), Some((2, 29, 3)));
        assert_eq!(parse_version("2.28.9+cuda13.0"), Some((2, 28, 9)));
        assert_eq!(parse_version("2.30"), Some((2, 30, 0)));
        assert_eq!(parse_version("x"), None);
        let r = NcclRules::of((2, 40, 1), None);
        assert_eq!(r.basis, Basis::NewerThanChecked);
        assert_eq!(r.version, "2.32.3");
        assert!(r.has(Rule::PerCollectiveCtaPolicy));
        assert!(r.named().contains("2.40.1 unverified"), "{}", r.named());
        let r = NcclRules::of((2, 30, 4), None);
        assert!(!r.has(Rule::HierarchicalCe) && r.has(Rule::OneLsaTeam));
        assert!(r.checked.contains("v2.30.4-1"), "{}", r.checked);
        assert_eq!(
            NcclRules::of((2, 32, 3), None).checked,
            "read from the nccl.h and libnccl.so.2 of 2.32.3 (no source tag at hand)"
        );
        assert!(NcclRules::of((2, 30, 7), None).has(Rule::HierarchicalCe));
        assert!(NcclRules::of((2, 27, 7), None).has(Rule::OneNode));
        assert!(!NcclRules::of((2, 31, 0), None).has(Rule::PerCollectiveCtaPolicy));
    }
}
