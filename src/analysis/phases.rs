//! The phase model (docs/phases.md): one op's window on one rank, `[api_start,
//! gpu_end]`, cut at five points into init, queue, sync, barrier and the GPU
//! remainder, which is split into memcpy, proxy and transfer.
//!
//! Every cut point is clamped into the window and after the previous one, so the
//! phases never overlap, never go negative, and always add up to the window. A cut
//! point that is not known (no launch record, no other rank's start) leaves the two
//! phases around it *not measured* (`None`); their time is counted in `unresolved`,
//! so `Σ measured phases + unresolved = window` holds for every op.

/// What is known of one op on one rank (ns, all on this rank's clock).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cuts {
    pub api_start: i64,
    /// Entry into the first launch call (CUPTI callback).
    pub launch: Option<i64>,
    /// When the op's stream was free for it (`ops.gpu_ready_ns`).
    pub ready: Option<i64>,
    pub gpu_start: Option<i64>,
    pub gpu_end: Option<i64>,
    /// Latest GPU start over the ranks of the same operation, converted to this
    /// rank's clock (None: not every rank's data, or no GPU times there).
    pub last_start: Option<i64>,
    /// Time inside `[barrier end, gpu_end]` covered by copies that are not the
    /// transfer itself (proxy-thread copies); `Some(0)` when CUPTI saw none.
    /// `None`: not measured (CUPTI off).
    pub memcpy: Option<i64>,
    /// Time inside `[barrier end, gpu_end]` in which the op's data was with NCCL's
    /// proxy thread (network send/receive waits of its ProxySteps); `Some(0)` when the
    /// profiler plugin ran but reported no step; `None`: not measured (no plugin).
    pub proxy: Option<i64>,
}

// The phase list (`with_phase_list!`) is part of the on-disk format: it lives with
// the `phases` table in `zcta-format` (format/src/tables/phases.rs).

/// A phase's value type: `Option` where it can be not measured.
macro_rules! phase_type {
    (nullable) => { Option<i64> };
    (required) => { i64 };
}

/// A phase's value as an `Option`.
macro_rules! phase_value {
    (nullable, $v:expr) => {
        $v
    };
    (required, $v:expr) => {
        Some($v)
    };
}

macro_rules! define_phases {
    ($( [$V:ident, $f:ident, $col:ident, $header:literal, $width:literal, $null:ident, $doc:literal] )*) => {
        /// One phase of an op's window.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Phase {
            $( $V, )*
        }

        /// Number of phases, `unresolved` included.
        pub const N_PHASES: usize = [$( stringify!($f) ),*].len();

        /// Names of the phases, in window order (for reports).
        pub const PHASES: [&str; N_PHASES] = [$( stringify!($f) ),*];

        impl Phase {
            /// Every phase, in window order.
            pub const ALL: [Phase; N_PHASES] = [$( Phase::$V ),*];

            /// Its name ([`PHASES`]).
            pub const fn name(self) -> &'static str {
                PHASES[self as usize]
            }

            /// Its column of the `phases` table.
            pub const fn column(self) -> &'static str {
                match self {
                    $( Phase::$V => stringify!($col), )*
                }
            }

            /// Its header in the report's table, and that column's width.
            pub const fn header(self) -> (&'static str, usize) {
                match self {
                    $( Phase::$V => ($header, $width), )*
                }
            }
        }

        /// The phases of one op on one rank (ns). `None`: not measured.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Phases {
            /// `gpu_end - api_start`; `None` without GPU times (then every phase is `None`).
            pub window: Option<i64>,
            $(
                #[doc = $doc]
                pub $f: phase_type!($null),
            )*
        }

        impl Phases {
            /// The value of phase `p` (`unresolved` always measured).
            pub fn get(&self, p: Phase) -> Option<i64> {
                match p {
                    $( Phase::$V => phase_value!($null, self.$f), )*
                }
            }
        }
    };
}

crate::with_phase_list!(define_phases);

/// Index of `unresolved` in [`PHASES`] (the last).
pub const UNRESOLVED: usize = Phase::Unresolved as usize;
const _: () = assert!(UNRESOLVED == N_PHASES - 1, "unresolved is the last phase");

impl Phases {
    /// Values in [`PHASES`] order.
    pub fn values(&self) -> [Option<i64>; N_PHASES] {
        Phase::ALL.map(|p| self.get(p))
    }
}

/// Where the op's GPU side begins on its stream: its first kernel or copy (deep mode),
/// else — timed with stamps, which see no kernel start — when both the stream was
/// free and NCCL had launched (the later of `ready` and `launch`; `ready` alone when
/// the launch is not known).
pub fn gpu_begin(gpu_start: Option<i64>, ready: Option<i64>, launch: Option<i64>) -> Option<i64> {
    gpu_start.or_else(|| ready.map(|r| launch.map_or(r, |l| r.max(l))))
}

/// The GPU cut points as [`split`] uses them, each clamped into the window after the
/// previous one: (GPU begin ([`gpu_begin`]), barrier end, gpu_end). `None` without GPU
/// times, or with a GPU end before the call; the barrier end is `None` without the
/// last rank's begin.
pub fn gpu_cuts(c: &Cuts) -> Option<(i64, Option<i64>, i64)> {
    let (s, e) = gpu_span(c.api_start, c.gpu_start, c.ready, c.launch, c.gpu_end)?;
    Some((s, c.last_start.map(|l| l.clamp(s, e)), e))
}

/// The op's GPU side within its window: (GPU begin ([`gpu_begin`]) clamped into
/// `[api_start, gpu_end]`, gpu_end). `None` without GPU times, or with a GPU end
/// before the call: its GPU times are then wrong (a clock placed beyond its stated
/// error), not a span of 0.
pub fn gpu_span(
    api_start: i64,
    gpu_start: Option<i64>,
    ready: Option<i64>,
    launch: Option<i64>,
    gpu_end: Option<i64>,
) -> Option<(i64, i64)> {
    let (s, e) = (gpu_begin(gpu_start, ready, launch)?, gpu_end?);
    (e >= api_start).then(|| (s.clamp(api_start, e), e))
}

/// The longest window [`split`] measures phases in (about 104 days): an op whose
/// times lie further apart holds a corrupt or foreign timestamp, and its phases are
/// not measured (differences and sums of its times could overflow).
pub const MAX_WINDOW_NS: i64 = 1 << 53;

pub fn split(c: &Cuts) -> Phases {
    let Some((s, rest_start, e)) = gpu_cuts(c) else {
        return Phases::default();
    };
    let a = c.api_start;
    let Some(window) = e.checked_sub(a).filter(|w| (0..=MAX_WINDOW_NS).contains(w)) else {
        return Phases::default();
    };
    let mut p = Phases {
        window: Some(window),
        ..Phases::default()
    };
    // init | queue | sync, cut at the launch call and at the stream being free;
    // a phase is measured when both of its ends are known.
    let l = c.launch.map(|l| l.clamp(a, s));
    // Without the launch call the stream's readiness is not used: clamped to the API
    // entry instead, sync could take in host time.
    let r = l.and_then(|l| c.ready.map(|r| r.clamp(l, s)));
    let mut from = Some(a);
    let mut measured_to = a;
    // Without a kernel start (stamps), the GPU side begins where the stream was
    // free after the launch: queue ends there, and sync (NCCL's stream waits, the
    // kernel's start on the GPU) is inside the time after it, not a phase of its own.
    let sync_cut = c.gpu_start.map(|_| s);
    let r = if sync_cut.is_none() { l.map(|_| s) } else { r };
    for (cut, phase) in [(l, &mut p.init), (r, &mut p.queue), (sync_cut, &mut p.sync)] {
        if let (Some(f), Some(t)) = (from, cut) {
            *phase = Some(t - f);
            measured_to = t;
        } else if let Some(t) = cut {
            p.unresolved += t - measured_to;
            measured_to = t;
        }
        from = cut;
    }
    if sync_cut.is_none() && measured_to < s {
        // No launch: init and queue are not told apart.
        p.unresolved += s - measured_to;
    }
    // barrier | rest, cut at the last rank's start.
    p.barrier = rest_start.map(|b| b - s);
    // The rest: memcpy first, then proxy, transfer is what remains. Stamps see no
    // copies: there the proxy thread's copies are inside transfer, and memcpy is not a
    // phase of its own (deep mode measures it).
    let events = c.gpu_start.is_none();
    let memcpy = if events { Some(0) } else { c.memcpy };
    match (rest_start, memcpy, c.proxy) {
        (Some(b), Some(m), Some(x)) => {
            let m = m.clamp(0, e - b);
            let x = x.clamp(0, e - b - m);
            p.memcpy = Some(m);
            p.proxy = Some(x);
            p.transfer = Some(e - b - m - x);
        }
        (Some(b), Some(m), None) => {
            // Without the plugin, proxy and transfer cannot be told apart.
            let m = m.clamp(0, e - b);
            p.memcpy = Some(m);
            p.unresolved += e - b - m;
        }
        (Some(b), None, _) => p.unresolved += e - b,
        (None, ..) => p.unresolved += e - s,
    }
    if events {
        p.memcpy = None;
    }
    p
}

/// Total length of the union of `spans` clipped to `[lo, hi]`.
pub fn covered(spans: &mut [(i64, i64)], lo: i64, hi: i64) -> i64 {
    spans.sort_unstable();
    let (mut total, mut cur): (i64, Option<(i64, i64)>) = (0, None);
    for &(s, e) in spans.iter() {
        let (s, e) = (s.max(lo), e.min(hi));
        if s >= e {
            continue;
        }
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total = total.saturating_add(ce.saturating_sub(cs));
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    // Saturating: times from a corrupt file may lie the whole i64 range apart.
    total.saturating_add(cur.map_or(0, |(s, e)| e.saturating_sub(s)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Timestamps from a corrupt or foreign file (the ends of i64) measure nothing
    /// and do not overflow.
    #[test]
    fn extreme_times_are_not_measured() {
        for (a, e, last) in [
            (i64::MIN, i64::MAX, Some(0)),
            (0, i64::MAX, Some(i64::MIN)),
            (i64::MIN, 0, None),
            (0, MAX_WINDOW_NS + 1, Some(1)),
        ] {
            let p = split(&Cuts {
                api_start: a,
                launch: Some(a),
                ready: Some(0),
                gpu_start: None,
                gpu_end: Some(e),
                last_start: last,
                memcpy: Some(i64::MAX),
                proxy: Some(i64::MIN),
            });
            assert_eq!(p.window, None, "{a} {e}");
            assert_eq!(p.unresolved, 0);
        }
        let mut spans = [(i64::MIN, i64::MAX), (0, 1), (i64::MIN, 0)];
        assert_eq!(covered(&mut spans, i64::MIN, i64::MAX), i64::MAX);
    }

    /// A GPU end before the call is a clock placed wrongly: the op's window is not
    /// measured (never a window of 0 with every phase 0).
    #[test]
    fn a_gpu_end_before_the_call_is_not_measured() {
        let p = split(&Cuts {
            api_start: 1_000,
            launch: Some(1_100),
            ready: Some(900),
            gpu_start: None,
            gpu_end: Some(950),
            last_start: Some(900),
            memcpy: None,
            proxy: None,
        });
        assert_eq!(p.window, None);
        assert_eq!(p.unresolved, 0);
    }

    #[test]
    fn a_fully_measured_op() {
        let p = split(&Cuts {
            api_start: 100,
            launch: Some(110),
            ready: Some(125),
            gpu_start: Some(130),
            gpu_end: Some(200),
            last_start: Some(150),
            memcpy: Some(20),
            proxy: Some(10),
        });
        assert_eq!(p.window, Some(100));
        assert_eq!(
            (p.init, p.queue, p.sync, p.barrier, p.memcpy, p.proxy, p.transfer),
            (
                Some(10),
                Some(15),
                Some(5),
                Some(20),
                Some(20),
                Some(10),
                Some(20)
            )
        );
        assert_eq!(p.unresolved, 0);
        // Without the plugin, proxy and transfer are not measured.
        let q = split(&Cuts {
            proxy: None,
            api_start: 100,
            launch: Some(110),
            ready: Some(125),
            gpu_start: Some(130),
            gpu_end: Some(200),
            last_start: Some(150),
            memcpy: Some(20),
        });
        assert_eq!((q.proxy, q.transfer, q.unresolved), (None, None, 30));
    }

    #[test]
    fn unknown_cuts_are_not_measured_not_zero() {
        let p = split(&Cuts {
            api_start: 0,
            launch: None,
            ready: None,
            gpu_start: Some(10),
            gpu_end: Some(50),
            last_start: None,
            memcpy: Some(0),
            proxy: Some(0),
        });
        assert_eq!(
            (p.init, p.queue, p.sync, p.barrier, p.transfer, p.memcpy),
            (None, None, None, None, None, None)
        );
        assert_eq!(p.unresolved, 50);
        assert_eq!(split(&Cuts::default()), Phases::default());
        // The same GPU span in the cases below.
        let gpu = Cuts {
            gpu_start: Some(10),
            gpu_end: Some(50),
            ..Cuts::default()
        };
        // The launch call known, the stream's readiness not (a run from before
        // gpu_ready_ns, or no work ahead recorded): queue and sync are not measured.
        let q = split(&Cuts {
            launch: Some(4),
            ..gpu
        });
        assert_eq!(
            (q.init, q.queue, q.sync, q.unresolved),
            (Some(4), None, None, 6 + 40)
        );
        // Readiness known, the launch call not: none of the three is measured.
        let r = split(&Cuts {
            ready: Some(7),
            ..gpu
        });
        assert_eq!(
            (r.init, r.queue, r.sync, r.unresolved),
            (None, None, None, 10 + 40)
        );
        // A stream free before the launch call (idle): no queue, sync from the call.
        let idle = split(&Cuts {
            launch: Some(4),
            ready: Some(1),
            ..gpu
        });
        assert_eq!((idle.init, idle.queue, idle.sync), (Some(4), Some(0), Some(6)));
    }

    #[test]
    fn the_first_rank_to_arrive_waits() {
        // Own start 10, the other rank starts at 40 (our clock): 30 of barrier.
        let p = split(&Cuts {
            api_start: 0,
            launch: Some(5),
            ready: Some(8),
            gpu_start: Some(10),
            gpu_end: Some(60),
            last_start: Some(40),
            memcpy: Some(0),
            proxy: Some(0),
        });
        assert_eq!((p.barrier, p.transfer), (Some(30), Some(20)));
        // The last rank itself has none; a start past the end is clamped.
        let late = split(&Cuts {
            last_start: Some(1_000),
            ..Cuts {
                api_start: 0,
                launch: Some(5),
                ready: None,
                gpu_start: Some(10),
                gpu_end: Some(60),
                last_start: None,
                memcpy: Some(0),
                proxy: Some(0),
            }
        });
        assert_eq!((late.barrier, late.transfer), (Some(50), Some(0)));
    }

    #[test]
    fn union_of_copies() {
        let mut v = vec![(0, 10), (5, 20), (30, 40), (35, 36), (100, 200)];
        assert_eq!(covered(&mut v, 0, 150), 20 + 10 + 50);
        assert_eq!(covered(&mut [], 0, 10), 0);
    }

    #[test]
    fn an_op_timed_with_cuda_events() {
        // No kernel start: the GPU side begins when the stream was free after the
        // launch; sync and memcpy are inside transfer, not phases of their own.
        let c = Cuts {
            api_start: 100,
            launch: Some(110),
            ready: Some(125),
            gpu_start: None,
            gpu_end: Some(200),
            last_start: Some(150),
            memcpy: None,
            proxy: Some(10),
        };
        let p = split(&c);
        assert_eq!(p.window, Some(100));
        assert_eq!(
            (
                p.init,
                p.queue,
                p.sync,
                p.barrier,
                p.memcpy,
                p.proxy,
                p.transfer,
                p.unresolved
            ),
            (Some(10), Some(15), None, Some(25), None, Some(10), Some(40), 0)
        );
        // An idle stream: the op's GPU side begins at the launch; queue is 0.
        let idle = split(&Cuts {
            ready: Some(105),
            last_start: Some(110),
            ..c
        });
        assert_eq!(
            (idle.init, idle.queue, idle.barrier),
            (Some(10), Some(0), Some(0))
        );
        // Without NCCL's launch event, init and queue are not told apart.
        let no_launch = split(&Cuts { launch: None, ..c });
        assert_eq!(
            (no_launch.init, no_launch.queue, no_launch.unresolved),
            (None, None, 25)
        );
        assert_eq!(no_launch.barrier, Some(25));
    }

    /// The Python package and the SQL breakdown spell the phase list out: they must
    /// follow this one (the names, their order, the `phases` columns).
    #[test]
    fn python_and_sql_follow_the_phase_list() {
        let root = env!("CARGO_MANIFEST_DIR");
        let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).unwrap();
        let py = read("analysis/zcta_analysis/__init__.py");
        let quoted: Vec<String> = PHASES.iter().map(|p| format!("\"{p}\"")).collect();
        let want = format!("PHASES = ({})", quoted.join(", "));
        assert!(
            py.lines().any(|l| l == want),
            "analysis/zcta_analysis/__init__.py must say {want}"
        );
        let plot = read("analysis/zcta_analysis/plot.py");
        for p in PHASES {
            assert!(
                plot.contains(&format!("    \"{p}\": \"#")),
                "analysis/zcta_analysis/plot.py has no colour for {p}"
            );
        }
        // `sum(init_ns) / sum(window_ns) as init,` per phase, in order.
        let sql = read("analysis/sql/phase_breakdown.sql");
        let shares: Vec<(String, String)> = sql
            .lines()
            .filter_map(|l| {
                let (sum, name) = l.trim().split_once(" / sum(window_ns) as ")?;
                let col = sum.strip_prefix("sum(")?.strip_suffix(')')?;
                Some((col.to_owned(), name.trim_end_matches(',').to_owned()))
            })
            .collect();
        let want: Vec<(String, String)> = Phase::ALL
            .iter()
            .map(|p| (p.column().to_owned(), p.name().to_owned()))
            .collect();
        assert_eq!(shares, want, "analysis/sql/phase_breakdown.sql");
    }

    proptest! {
        /// Conservation: measured phases plus unresolved add up to the window, and
        /// nothing is negative, whatever order the cut points come in.
        #[test]
        fn phases_add_up_to_the_window(
            a in -1_000_000i64..1_000_000,
            l in proptest::option::of(-1_000_000i64..3_000_000),
            r in proptest::option::of(-1_000_000i64..3_000_000),
            s in proptest::option::of(-1_000_000i64..3_000_000),
            e in proptest::option::of(-1_000_000i64..3_000_000),
            last in proptest::option::of(-1_000_000i64..3_000_000),
            m in proptest::option::of(-10i64..2_000_000),
            x in proptest::option::of(-10i64..2_000_000),
        ) {
            let p = split(&Cuts { api_start: a, launch: l, ready: r, gpu_start: s, gpu_end: e, last_start: last, memcpy: m, proxy: x });
            let sum: i64 = p.values().iter().map(|v| v.unwrap_or(0)).sum();
            match p.window {
                Some(w) => {
                    prop_assert_eq!(sum, w);
                    prop_assert!(w >= 0);
                    for v in p.values().iter().flatten() {
                        prop_assert!(*v >= 0);
                    }
                }
                None => prop_assert_eq!(p, Phases::default()),
            }
        }
    }
}
