//! The doctor's rules: each a small function from the facts (and what earlier rules
//! concluded) to an optional condition, path, note, request or finding, with its
//! citation as data beside it. [`super::verdict::verdicts`] runs the tables below in
//! order; the order of a table is the order of the report.
//!
//! Adding a rule (a new NCCL release's, say) is one function in the file of its family
//! and one entry in its table. What differs between releases is asked of
//! [`crate::nccl_rules`] ([`NcclRules::has`]); a [`Cite::Release`] cites that table's
//! source for the release judged by.

pub mod copy_engine;
pub mod cta_policy;
pub mod families;
pub mod host;
pub mod network;
pub mod p2p;
pub mod settings;
pub mod shm;
pub mod software;
pub mod topology;
pub mod transport;

use super::env::Setting;
use super::facts::{Facts, Gpu};
use super::model::{Condition, Decider, Family, Finding, Path, Request, State, Transport};
use crate::nccl_rules::{NcclRules, Rule};
use p2p::PairView;
use transport::EnvView;

/// Where a rule's fact comes from.
#[derive(Clone, Copy, Debug)]
pub enum Cite {
    /// NCCL's source at tag `v2.28.9-1`, unchanged through the newest release checked.
    Nccl(&'static str),
    /// What the NCCL release table cites for the release judged by, part by part,
    /// joined by `; `.
    Release(&'static [Part]),
    /// A file of this repository, and what it shows.
    Repo { path: &'static str, what: &'static str },
    /// No source named: the rule states what the machine itself reports.
    None,
}

/// One part of a [`Cite::Release`].
#[derive(Clone, Copy, Debug)]
pub enum Part {
    /// The source of the first rule that holds, else of the last one.
    FirstOf(&'static [Rule]),
    /// The rule's source, only when it holds.
    IfHolds(Rule),
}

impl Cite {
    /// The citation as the report prints it.
    pub fn text(&self, rules: &NcclRules) -> String {
        match *self {
            Cite::Nccl(s) => s.to_owned(),
            Cite::Release(parts) => parts
                .iter()
                .filter_map(|p| match *p {
                    Part::FirstOf(rs) => rs
                        .iter()
                        .find(|r| rules.has(**r))
                        .or(rs.last())
                        .map(|r| rules.source(*r)),
                    Part::IfHolds(r) => rules.has(r).then(|| rules.source(r)),
                })
                .collect::<Vec<_>>()
                .join("; "),
            Cite::Repo { path, what } => format!("{what} ({path})"),
            Cite::None => String::new(),
        }
    }
}

/// What every rule may read: the facts, NCCL's settings as NCCL reads them, the
/// release judged by, and the GPUs a job sees.
pub struct Ctx<'a> {
    pub f: &'a Facts,
    pub ev: EnvView<'a>,
    pub rules: &'a NcclRules,
    /// NVML indices of the GPUs a job can use.
    pub visible: &'a [u32],
    /// The same GPUs, in that order.
    pub gpus: Vec<&'a Gpu>,
    /// How `CUDA_VISIBLE_DEVICES` narrowed them, when it is set.
    pub vis_note: Option<String>,
}

impl<'a> Ctx<'a> {
    pub fn new(f: &'a Facts, rules: &'a NcclRules, visible: &'a [u32], vis_note: Option<String>) -> Self {
        Ctx {
            f,
            ev: EnvView::new(&f.settings),
            rules,
            visible,
            gpus: visible
                .iter()
                .filter_map(|i| f.gpus.iter().find(|g| g.index == *i))
                .collect(),
            vis_note,
        }
    }

    pub fn driver_ok(&self) -> bool {
        self.f.driver.nvml == "loaded"
    }
}

/// What the later rules (families, requests, findings) read besides [`Ctx`]: the
/// transport and the copy-engine conditions, with what follows from them.
pub struct Judged<'a> {
    pub ctx: &'a Ctx<'a>,
    pub transport: &'a Transport,
    pub ce: &'a [Condition],
    /// Machine conditions missing, and unknown.
    pub missing: Vec<&'a Condition>,
    pub unknown: Vec<&'a Condition>,
    /// The path of the kernels: the network across nodes, else the transport's.
    pub kernels: Path,
    /// AllGather by copy engine without CTA policy ZERO ([`families::auto_ce_allgather`]).
    pub auto_ag: Option<Result<i64, String>>,
    /// Its threshold, when only the CTA policy is missing.
    pub auto_threshold: Option<i64>,
}

impl<'a> Judged<'a> {
    pub fn new(ctx: &'a Ctx<'a>, transport: &'a Transport, ce: &'a [Condition]) -> Self {
        let machine = |state: State| -> Vec<&'a Condition> {
            ce.iter()
                .filter(|c| c.decided_by == Decider::Machine && c.state == state)
                .collect()
        };
        let missing = machine(State::Missing);
        let unknown = machine(State::Unknown);
        let auto_ag = families::auto_ce_allgather(ctx);
        // Every machine condition but the CTA policy met.
        let only_cta_missing = unknown.is_empty()
            && missing.iter().all(|c| c.key == "cta_policy")
            && ce.iter().any(|c| c.key == "cta_policy" && c.state != State::Met);
        let auto_threshold = match &auto_ag {
            Some(Ok(t)) if only_cta_missing => Some(*t),
            _ => None,
        };
        Judged {
            ctx,
            transport,
            ce,
            missing,
            unknown,
            kernels: if ctx.f.nodes.count > 1 {
                Path::Net
            } else {
                transport.path
            },
            auto_ag,
            auto_threshold,
        }
    }
}

/// A copy-engine condition as a rule finds it; [`ConditionRule::judge`] adds the key,
/// the citation, and the fix when the condition is not met.
pub struct Check {
    pub what: String,
    pub decided_by: Decider,
    pub state: State,
    pub evidence: String,
    pub fix: &'static str,
}

/// A condition of the copy-engine path; `check` is `None` where the release judged by
/// has no such condition.
pub struct ConditionRule {
    pub key: &'static str,
    pub cite: Cite,
    pub check: fn(&Ctx<'_>) -> Option<Check>,
}

impl ConditionRule {
    pub fn judge(&self, ctx: &Ctx<'_>) -> Option<Condition> {
        let c = (self.check)(ctx)?;
        Some(Condition {
            key: self.key.into(),
            what: c.what,
            decided_by: c.decided_by,
            state: c.state,
            evidence: c.evidence,
            fix: (c.state != State::Met).then(|| c.fix.to_owned()),
            source: self.cite.text(ctx.rules),
        })
    }
}

/// One step of the transport between two GPUs: the first rule that gives a path wins.
pub struct PairRule {
    pub cite: Cite,
    pub path: fn(&Ctx<'_>, &PairView<'_>, &str) -> Option<(Path, String)>,
}

/// A note on a family's verdict (its path here given).
pub struct NoteRule {
    pub cite: Cite,
    pub note: fn(&Judged<'_>, Family, Path, &str) -> Option<String>,
}

/// A setting that asks for a path.
pub struct RequestRule {
    pub cite: Cite,
    pub request: fn(&Judged<'_>, &str) -> Option<Request>,
}

/// A finding: one at most, or one per GPU, pair or setting.
pub enum Finds {
    One(fn(&Judged<'_>, &str) -> Option<Finding>),
    Each(fn(&Judged<'_>, &str) -> Vec<Finding>),
}

pub struct FindingRule {
    pub cite: Cite,
    pub find: Finds,
}

impl FindingRule {
    pub fn findings(&self, j: &Judged<'_>) -> Vec<Finding> {
        let cite = self.cite.text(j.ctx.rules);
        match self.find {
            Finds::One(f) => f(j, &cite).into_iter().collect(),
            Finds::Each(f) => f(j, &cite),
        }
    }
}

/// The copy-engine conditions, machine ones first.
pub const CONDITIONS: &[ConditionRule] = &[
    ConditionRule {
        key: "gpus",
        cite: Cite::Nccl("enqueue.cc:2569 (one rank: local copy)"),
        check: copy_engine::gpus,
    },
    ConditionRule {
        key: "single_node",
        cite: Cite::Release(&[Part::FirstOf(&[Rule::OneNode])]),
        check: copy_engine::single_node,
    },
    ConditionRule {
        key: "nodes",
        cite: Cite::Release(&[
            Part::FirstOf(&[Rule::OneLsaTeam]),
            Part::IfHolds(Rule::HierarchicalCe),
        ]),
        check: copy_engine::nvlink_domain,
    },
    ConditionRule {
        key: "all_p2p",
        cite: Cite::Nccl("init.cc:1376 (isAllCudaP2p), transport.cc:111"),
        check: copy_engine::all_p2p,
    },
    ConditionRule {
        key: "cumem",
        cite: Cite::Nccl("misc/cudawrap.cc:15,45 (ncclCuMemEnable)"),
        check: copy_engine::cumem,
    },
    ConditionRule {
        key: "win_enable",
        cite: Cite::Nccl("init.cc:58,1376 (ncclParamWinEnable)"),
        check: copy_engine::win_enable,
    },
    ConditionRule {
        key: "nccl_version",
        cite: Cite::Nccl("ce_coll.cc (copy-engine collectives are new in 2.28)"),
        check: copy_engine::nccl_version,
    },
    ConditionRule {
        key: "driver",
        cite: Cite::Nccl("ce_coll.cc:82-99 (ncclCeImplemented: driverVersion >= 12050)"),
        check: copy_engine::driver,
    },
    ConditionRule {
        key: "cta_policy",
        cite: Cite::Release(&[Part::FirstOf(&[
            Rule::PerCollectiveCtaPolicy,
            Rule::CtaPolicyFlags,
            Rule::CtaPolicyNumber,
        ])]),
        check: cta_policy::condition,
    },
    ConditionRule {
        key: "symmetric_windows",
        cite: Cite::Release(&[
            Part::FirstOf(&[Rule::BothWindows, Rule::RecvWindow]),
            Part::IfHolds(Rule::NoSysmemWindows),
        ]),
        check: copy_engine::symmetric_windows,
    },
    ConditionRule {
        key: "side_stream",
        cite: Cite::Repo {
            path: "docs/dev/data-paths.md",
            what: "measured on 2×H200, NCCL 2.28.9, torch 2.11",
        },
        check: copy_engine::side_stream,
    },
];

/// The transport between two GPUs, tried in order.
pub const PAIR_PATHS: &[PairRule] = &[
    PairRule {
        cite: Cite::Nccl("p2p.cc:115"),
        path: p2p::via_memcpy,
    },
    PairRule {
        cite: Cite::None,
        path: p2p::direct,
    },
    PairRule {
        cite: Cite::None,
        path: p2p::unknown,
    },
    PairRule {
        cite: Cite::Nccl("shm.cc:65"),
        path: shm::disabled,
    },
    PairRule {
        cite: Cite::Nccl("shm.cc:66"),
        path: shm::via_memcpy,
    },
    PairRule {
        cite: Cite::None,
        path: shm::shm,
    },
];

/// Notes on each family's verdict.
pub const NOTES: &[NoteRule] = &[
    NoteRule {
        cite: Cite::Release(&[Part::FirstOf(&[Rule::AutoCeAllGather])]),
        note: families::no_auto_ce_allgather,
    },
    NoteRule {
        cite: Cite::Release(&[Part::FirstOf(&[Rule::HierarchicalCe])]),
        note: families::hierarchical_ce,
    },
    NoteRule {
        cite: Cite::None,
        note: families::send_recv_kernels,
    },
    NoteRule {
        cite: Cite::None,
        note: families::symmetric_kernels,
    },
    NoteRule {
        cite: Cite::None,
        note: families::nvls,
    },
];

/// Settings that ask for a path.
pub const REQUESTS: &[RequestRule] = &[
    RequestRule {
        cite: Cite::Nccl("init.cc:1785"),
        request: cta_policy::unreadable_number,
    },
    RequestRule {
        cite: Cite::Release(&[Part::FirstOf(&[Rule::CtaPolicyFlags])]),
        request: cta_policy::unreadable_flags,
    },
    RequestRule {
        cite: Cite::None,
        request: cta_policy::zero_request,
    },
    RequestRule {
        cite: Cite::None,
        request: p2p::memcpy_request,
    },
    RequestRule {
        cite: Cite::None,
        request: shm::memcpy_request,
    },
];

/// Findings, in the report's order.
pub const FINDINGS: &[FindingRule] = &[
    FindingRule {
        cite: Cite::Nccl("graph/paths.cc"),
        find: Finds::Each(p2p::nvlink_p2p_disabled),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::One(host::no_driver),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::One(host::visible_devices),
    },
    FindingRule {
        cite: Cite::Nccl("p2p.cc"),
        find: Finds::One(host::wsl2),
    },
    FindingRule {
        cite: Cite::Nccl("misc/shmutils.cc"),
        find: Finds::One(shm::small_dev_shm),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::One(network::memlock),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::One(host::torch_cuda_too_new),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::One(software::nccl_copies),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::One(software::no_torch),
    },
    FindingRule {
        cite: Cite::Repo {
            path: "shim/src/ffi/cupti.rs",
            what: "zcta's capture loads a libcupti.so.13",
        },
        find: Finds::One(software::cupti),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::Each(host::low_memory),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::Each(settings::spaced_names),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::One(settings::profiler_plugin),
    },
    FindingRule {
        cite: Cite::Nccl("plugin/env.cc"),
        find: Finds::One(settings::env_plugin),
    },
    FindingRule {
        cite: Cite::None,
        find: Finds::One(settings::torch_vars),
    },
];

/// `NAME=value (source)`.
pub fn src_of(s: &Setting) -> String {
    format!("{}={} ({})", s.name, s.value, s.source)
}

/// `13.0` for a CUDA driver API version of 13000.
pub fn cuda_str(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The `what` of each condition, joined by `sep`.
pub fn whats(v: &[&Condition], sep: &str) -> String {
    v.iter().map(|c| c.what.as_str()).collect::<Vec<_>>().join(sep)
}
