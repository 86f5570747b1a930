//! The GPU side of each operation: joining CUPTI's activity records to `ops` rows.
//!
//! # How a GPU activity finds its op
//! 1. **NCCL call.** While an interposed call that can launch GPU work runs (an
//!    ungrouped collective or Send/Recv, or the outermost `ncclGroupEnd`), the shim
//!    marks the thread with the call's id ([`ext_id`]: the op's `op_id`, or the group's
//!    id with [`GROUP_BIT`] set). CUPTI's API callback on the launch calls NCCL makes
//!    (`cuLaunchKernelEx`, `cudaMemcpyBatchAsync`, `cuStreamBatchMemOp`, …) reads the
//!    mark and the call's correlation id; the kernel or copy it launched carries that
//!    correlation id. Ops of one group share the group's launch, hence its activities.
//! 2. **Proxy window.** Copies NCCL's proxy thread issues itself
//!    (`NCCL_P2P_USE_CUDA_MEMCPY=1`, `NCCL_SHM_USE_CUDA_MEMCPY=1`) happen outside any
//!    API call. The thread is known as NCCL's from the profiler plugin's proxy events
//!    (so this needs the plugin); a copy it issues goes to the op whose NCCL kernel on
//!    the same device was running when it was issued (kernel start ≤ issue time ≤
//!    kernel end), or, once no such kernel can still arrive, to the op whose kernel
//!    last started before the issue time. On the GPU machine 94–96 % of proxy copies
//!    were issued inside a kernel window; the rest up to 111 µs after the kernel ended
//!    (the sender's kernel is done while its last chunks are still being copied).
//!    The op the plugin last started a proxy event for is not used: NCCL starts the
//!    proxy ops of many ops before progressing them, and that rule put the copies of
//!    48 of 60 16 MiB all_to_alls on other ops.
//! 3. Anything else (the program's own kernels and copies) is dropped here.
//!
//! # When an ops row is written
//! With CUPTI active, an op is held for `hold` after the writer receives it, so the
//! GPU side (delivered by CUPTI's buffers, flushed at least every second) can be
//! joined; then the row is written with whatever arrived. GPU rows that arrive later
//! still name their op in the `gpu` table.

/// The names of zcta's kernels (the shim's `STAMP_PTX`: the stamp on an op's stream,
/// the anchor on zcta's own), which CUPTI reports among the process's kernels in deep
/// mode.
pub const ZCTA_KERNELS: [&str; 2] = ["zcta_stamp", "zcta_anchor"];

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::cupti::{self, GpuKind, Raw, RawActivity, RawApi};
use crate::record::{OpRecord, Timing};
pub use crate::rows::{Activity, Attribution, Engine, GpuRow, GpuSourceKind, OpGpu, OpRow};

/// Set in external ids that name a group (`group_id`) rather than an op (`op_id`).
pub const GROUP_BIT: u64 = 1 << 63;

/// The external correlation id pushed around an op's launch.
pub fn ext_id(op_id: u64, group_id: Option<u64>) -> u64 {
    match group_id {
        Some(g) => GROUP_BIT | g,
        None => op_id,
    }
}

/// (op_id, group_id) named by an external id.
pub fn split_ext(ext: u64) -> (Option<u64>, Option<u64>) {
    if ext & GROUP_BIT != 0 {
        (None, Some(ext & !GROUP_BIT))
    } else {
        (Some(ext), None)
    }
}

/// What the shim's CUPTI side hands the writer.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuItem {
    Activity(Activity),
    Api(RawApi),
    /// The CUDA call `correlation_id` was made inside the NCCL call of `external_id`
    /// (an [`ext_id`]).
    ExtCorr {
        external_id: u64,
        correlation_id: u32,
    },
    /// A thread (`pthread_self` truncated to 32 bits) on which NCCL ran proxy events.
    ProxyThread(u32),
    /// CUPTI's clock minus CLOCK_REALTIME, measured when capture started (ns).
    ClockOffset(i64),
    /// CUPTI's activity kinds were switched on or off at `t` (CLOCK_REALTIME ns): a
    /// pause of recording or a sampling window ([`Attributor::kinds_switched`]).
    Kinds {
        on: bool,
        t: i64,
    },
    /// The GPU stamps around the launching call of `ext` (an [`ext_id`]): its stream
    /// was free for it at `ready_ns` and done with it at `end_ns` (CLOCK_REALTIME ns).
    Timed {
        ext: u64,
        ready_ns: i64,
        end_ns: i64,
    },
}

impl GpuItem {
    /// From a decoded activity record; the kernel name is resolved by `name` (the shim
    /// reads CUPTI's string). EXTERNAL_CORRELATION records are not used (zcta does not
    /// enable them; another client's would not be ours).
    pub fn from_raw(raw: Raw, name: impl FnOnce(u64) -> Option<Arc<str>>) -> Option<Self> {
        Some(match raw {
            Raw::Activity(a) => GpuItem::Activity(Activity {
                name: if a.kind == GpuKind::Kernel && a.name_ptr != 0 {
                    name(a.name_ptr)
                } else {
                    None
                },
                raw: a,
            }),
            Raw::Api(a) => GpuItem::Api(a),
            Raw::ExtCorr { .. } => return None,
        })
    }
}

/// GPU work's time span.
#[derive(Clone, Copy)]
struct Span {
    start: i64,
    end: i64,
}

/// What bounds an op's GPU window, strongest last: its kernels; without one, the
/// copy-engine copies that moved its data; else whatever ran (setup copies of a
/// communicator's first call).
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Bound {
    #[default]
    Any,
    Copy,
    Kernel,
}

#[derive(Default)]
struct Agg {
    launch_ns: Option<i64>,
    /// The first and last start of its traced calls whose work CUPTI records
    /// ([`Call::has_records`]): under sampling, a window's kinds going off between them
    /// lost some of that work. (Conservative: a call that spans a whole gap without
    /// launching in it, 150 ms or more of connection setup, is not sampled either.)
    work_launches: Option<(i64, i64)>,
    /// The span of the activities of the strongest [`Bound`] seen so far.
    span: Option<Span>,
    bound: Bound,
    kernel: Option<Arc<str>>,
    symmetric: bool,
    n_kernels: u32,
    n_memcpy: u32,
    n_ce_copies: u32,
    n_proxy_copies: u32,
    memcpy_bytes: u64,
    touched_ns: i64,
}

fn widen(span: &mut Option<Span>, r: &RawActivity) {
    match span {
        Some(s) => {
            s.start = s.start.min(r.start_ns);
            s.end = s.end.max(r.end_ns);
        }
        None => {
            *span = Some(Span {
                start: r.start_ns,
                end: r.end_ns,
            })
        }
    }
}

/// The same for a queue.
pub(crate) fn shrink_deque<T>(q: &mut VecDeque<T>) {
    if q.capacity() > 4 * q.len() + 1024 {
        q.shrink_to_fit();
    }
}

impl Agg {
    fn add(&mut self, a: &Activity, proxy: bool, now: i64) {
        let r = &a.raw;
        self.touched_ns = now;
        let bound = match r.kind {
            GpuKind::Kernel => Bound::Kernel,
            GpuKind::Memcpy if !proxy && matches!(r.copy_kind, Some(8 | 10)) => Bound::Copy,
            _ => Bound::Any,
        };
        if bound > self.bound {
            self.bound = bound;
            self.span = None;
        }
        if bound == self.bound {
            widen(&mut self.span, r);
        }
        match r.kind {
            GpuKind::Kernel => {
                self.n_kernels += 1;
                if self.kernel.is_none() {
                    self.kernel = a.name.clone();
                }
                if a.name.as_deref().is_some_and(|n| n.starts_with("ncclSymk")) {
                    self.symmetric = true;
                }
            }
            GpuKind::Memcpy => {
                self.n_memcpy += 1;
                self.memcpy_bytes += r.bytes.unwrap_or(0);
                if proxy {
                    self.n_proxy_copies += 1;
                } else if bound == Bound::Copy {
                    self.n_ce_copies += 1;
                }
            }
            GpuKind::Memset => {}
        }
    }

    /// CUPTI's view of the op; `gpu_ready_ns` comes from its events only (an op the
    /// events did not time has none: queue and sync are not measured for it).
    fn columns(&self) -> OpGpu {
        let engine = if self.n_kernels > 0 {
            if self.symmetric {
                Engine::SymmetricKernel
            } else if self.n_proxy_copies > 0 {
                Engine::ProxyMemcpy
            } else {
                Engine::SmKernel
            }
        } else if self.n_ce_copies > 0 {
            Engine::CopyEngine
        } else if self.n_proxy_copies > 0 {
            Engine::ProxyMemcpy
        } else {
            Engine::None
        };
        let span = self.span;
        OpGpu {
            launch_ns: self.launch_ns,
            gpu_ready_ns: None,
            gpu_start_ns: span.map(|s| s.start),
            gpu_end_ns: span.map(|s| s.end),
            engine,
            kernel: self.kernel.clone(),
            n_kernels: self.n_kernels,
            n_memcpy: self.n_memcpy,
            memcpy_bytes: self.memcpy_bytes,
            source: GpuSourceKind::Cupti,
        }
    }
}

/// Counters reported in the `process` table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttribStats {
    /// GPU rows written.
    pub gpu_rows: u64,
    /// Activities that were not NCCL's (dropped).
    pub foreign: u64,
    /// Ops written before any GPU activity of theirs arrived.
    pub ops_without_gpu: u64,
    /// Activities dropped because they started before the CUDA call their correlation
    /// id names (by more than [`CAUSALITY_SLACK_NS`] plus the clock offset): a wrong
    /// correlation.
    pub inconsistent: u64,
    /// Ops called outside the sampling windows (`ZCTA_SAMPLE`): no launch of theirs
    /// was marked, their GPU columns are NULL.
    pub ops_unsampled: u64,
    /// Ops captured into a CUDA graph ([`OpRecord::graph_captured`]): their GPU work
    /// runs at the graph's launches, not joined; their GPU columns are NULL.
    pub ops_graph_captured: u64,
    /// Launching calls (an ungrouped op, a group) timed with GPU stamps whose times
    /// never arrived within the hold.
    pub ops_timing_lost: u64,
}

/// Joins GPU activities to ops; lives on the writer thread.
pub struct Attributor {
    hold_ns: i64,
    /// The few CUDA calls zcta traces, by correlation id, and the order they were
    /// noted in (pruned by age).
    launches: HashMap<u32, Launch>,
    launch_order: VecDeque<(i64, u32)>,
    proxy_threads: HashSet<u32>,
    /// NCCL kernels by (device, start) → (end, external id), for the proxy rule.
    kernels: BTreeMap<(u32, i64), (i64, u64)>,
    /// Activities waiting for their correlation, with their arrival time.
    waiting: VecDeque<(i64, Activity)>,
    agg: HashMap<u64, Agg>,
    /// Ops held for their GPU side, with their release time.
    held: VecDeque<(i64, OpRecord)>,
    /// Held ops issued in a group: op_id → group_id (a proxy copy named by op goes
    /// to its group's launch).
    op_group: HashMap<u64, u64>,
    pub stats: AttribStats,
    last_prune_ns: i64,
    /// Sampling windows (`ZCTA_SAMPLE`): an op without a marked launch was not
    /// sampled (rather than "no GPU activity arrived").
    sampled: bool,
    /// With sampling: marked launches whose GPU records have not arrived, and the
    /// order they were noted in (entries older than the hold are given up).
    unseen: HashSet<u32>,
    unseen_order: VecDeque<(i64, u32)>,
    /// [`CAUSALITY_SLACK_NS`] plus the measured offset of CUPTI's clock.
    causality_slack_ns: i64,
    /// Since when CUPTI's kinds have been off (`None`: on), and the earlier spans they
    /// were off, (from, to), oldest first (pruned by age): sampling windows and pauses.
    kinds_off_since: Option<i64>,
    kinds_off: VecDeque<(i64, i64)>,
    /// CUDA-event times by external id (ops and groups), with their arrival time.
    timed: HashMap<u64, (i64, i64, i64)>,
    /// Groups already counted in `ops_timing_lost` (by external id, with when): a
    /// launching call is counted once, however many ops its group has.
    lost_groups: HashMap<u64, i64>,
}

/// How far before its launch call an activity may seem to start (clock reading
/// differences between CUPTI and the callback) before its correlation is taken for
/// wrong; the measured offset between the clocks is added ([`GpuItem::ClockOffset`]).
pub const CAUSALITY_SLACK_NS: i64 = 1_000_000;

/// The op of an NCCL kernel on record whose op is not known (yet).
const UNKNOWN_OP: u64 = 0;

/// A traced call made outside any NCCL call (NCCL's proxy thread's): no external id.
/// Op ids start at 1 and group ids carry [`GROUP_BIT`], so no external id is 0.
const NO_EXT: u64 = 0;

/// A CUDA call zcta traced: the NCCL call it was made in (`ext`, [`NO_EXT`] for a proxy
/// thread's, or until its external correlation arrives) and what its API record said.
#[derive(Clone, Copy)]
struct Launch {
    ext: u64,
    call: Option<Call>,
}

/// What the join uses of a traced call's API record.
#[derive(Clone, Copy)]
struct Call {
    start_ns: i64,
    thread: u32,
    /// Whether CUPTI writes activity records for its work
    /// ([`cupti::launch_has_records`]).
    has_records: bool,
}

impl Call {
    fn of(api: &RawApi) -> Self {
        Call {
            start_ns: api.start_ns,
            thread: api.thread,
            has_records: cupti::launch_has_records(api),
        }
    }
}

/// Gives a map's capacity back once a burst has passed (it holds far fewer entries
/// than it has room for).
fn shrink_map<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > 4 * m.len() + 1024 {
        m.shrink_to_fit();
    }
}

/// Correlation entries, NCCL kernels for the proxy rule and groups' GPU sides are kept
/// for twice the hold plus this: an activity arrives within a flush interval of its
/// call, and one still waiting for its correlation gives up after a hold. (It was
/// 60 s: with the stand-in CUPTI at ~46 k calls/s, 443 MB after 33 s and growing;
/// docs/PERFORMANCE.md, "Memory".)
const KEEP_EXTRA_NS: i64 = 2_000_000_000;

impl Attributor {
    /// `hold_ns`: how long an op waits for its GPU side (see the module docs).
    pub fn new(hold_ns: i64) -> Self {
        Self {
            hold_ns,
            launches: HashMap::new(),
            launch_order: VecDeque::new(),
            proxy_threads: HashSet::new(),
            kernels: BTreeMap::new(),
            waiting: VecDeque::new(),
            agg: HashMap::new(),
            held: VecDeque::new(),
            op_group: HashMap::new(),
            stats: AttribStats::default(),
            last_prune_ns: 0,
            sampled: false,
            unseen: HashSet::new(),
            unseen_order: VecDeque::new(),
            causality_slack_ns: CAUSALITY_SLACK_NS,
            kinds_off_since: None,
            kinds_off: VecDeque::new(),
            timed: HashMap::new(),
            lost_groups: HashMap::new(),
        }
    }

    /// CUPTI's kinds were switched on or off at `t` ([`GpuItem::Kinds`]).
    fn kinds_switched(&mut self, on: bool, t: i64) {
        match (on, self.kinds_off_since) {
            (true, Some(from)) => {
                self.kinds_off.push_back((from, t));
                self.kinds_off_since = None;
            }
            (false, None) => self.kinds_off_since = Some(t),
            _ => {}
        }
    }

    /// Whether CUPTI's kinds were off at some time in `[a, b]`.
    fn kinds_were_off_within(&self, a: i64, b: i64) -> bool {
        self.kinds_off_since.is_some_and(|from| from <= b)
            || self.kinds_off.iter().any(|&(from, to)| from <= b && a < to)
    }

    /// Capture runs in sampling windows ([`crate::sample`]): ops without a marked
    /// launch are written as not sampled, and launches are tracked until their GPU
    /// records arrive ([`Self::pending`]).
    pub fn with_sampling(mut self) -> Self {
        self.sampled = true;
        self
    }

    /// With sampling: marked launches noted within the hold whose GPU records have not
    /// arrived yet (the window's drain waits for them).
    pub fn pending(&mut self, now: i64) -> usize {
        while let Some(&(t, c)) = self.unseen_order.front() {
            if now - t < self.hold_ns {
                break;
            }
            self.unseen_order.pop_front();
            self.unseen.remove(&c);
        }
        self.unseen.len()
    }

    fn note_unseen(&mut self, corr: u32, call: Call, now: i64) {
        if self.sampled && call.has_records && self.unseen.insert(corr) {
            self.unseen_order.push_back((now, corr));
        }
    }

    /// An op arrived from the hot path at `now`.
    pub fn hold(&mut self, rec: OpRecord, now: i64) {
        if let Some(g) = rec.group_id {
            self.op_group.insert(rec.op_id, g);
        }
        self.held.push_back((now + self.hold_ns, rec));
    }

    /// Ops held.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// One item from CUPTI at `now`; finished `gpu` rows go to `out`.
    pub fn item(&mut self, it: GpuItem, now: i64, out: &mut Vec<GpuRow>) {
        match it {
            GpuItem::ExtCorr {
                external_id,
                correlation_id,
            } => {
                let l = self.launch(correlation_id, now);
                l.ext = external_id;
                if let Some(call) = l.call {
                    self.note_launch(external_id, call, now);
                    self.note_unseen(correlation_id, call, now);
                }
            }
            GpuItem::Api(api) => {
                let call = Call::of(&api);
                let l = self.launch(api.correlation_id, now);
                l.call = Some(call);
                if l.ext != NO_EXT {
                    let ext = l.ext;
                    self.note_launch(ext, call, now);
                    self.note_unseen(api.correlation_id, call, now);
                }
            }
            GpuItem::ProxyThread(t) => {
                self.proxy_threads.insert(t);
            }
            GpuItem::ClockOffset(o) => {
                self.causality_slack_ns = CAUSALITY_SLACK_NS + o.saturating_abs();
            }
            GpuItem::Kinds { on, t } => self.kinds_switched(on, t),
            GpuItem::Timed {
                ext,
                ready_ns,
                end_ns,
            } => {
                self.timed.insert(ext, (ready_ns, end_ns, now));
            }
            GpuItem::Activity(a) => {
                // zcta's own stamps (the default timing, on in deep mode too) are
                // neither NCCL's work nor the program's.
                if a.raw.kind == GpuKind::Kernel
                    && a.name.as_deref().is_some_and(|n| ZCTA_KERNELS.contains(&n))
                {
                    return;
                }
                if a.raw.kind == GpuKind::Kernel && !a.name.as_deref().is_some_and(cupti::is_nccl_kernel) {
                    self.stats.foreign += 1;
                    return;
                }
                if !self.try_attribute(&a, now, false, out) {
                    if a.raw.kind == GpuKind::Kernel {
                        // An NCCL kernel whose op is not known (yet): a proxy copy
                        // issued while it ran is not given to another op's kernel.
                        self.kernels
                            .entry((a.raw.device, a.raw.start_ns))
                            .or_insert((a.raw.end_ns, UNKNOWN_OP));
                    }
                    self.waiting.push_back((now, a));
                }
            }
        }
    }

    /// The entry of the traced call `corr`, made at `now` if new.
    fn launch(&mut self, corr: u32, now: i64) -> &mut Launch {
        self.launches.entry(corr).or_insert_with(|| {
            self.launch_order.push_back((now, corr));
            Launch {
                ext: NO_EXT,
                call: None,
            }
        })
    }

    fn note_launch(&mut self, ext: u64, call: Call, now: i64) {
        let g = self.agg.entry(ext).or_default();
        g.touched_ns = now;
        let start = call.start_ns;
        g.launch_ns = Some(g.launch_ns.map_or(start, |l| l.min(start)));
        if call.has_records {
            g.work_launches = Some(
                g.work_launches
                    .map_or((start, start), |(a, b)| (a.min(start), b.max(start))),
            );
        }
    }

    /// Attributes `a` if its op can be known now. `expired`: no more information will
    /// come (apply the proxy rule's fallback, or drop it). Returns whether `a` is done.
    fn try_attribute(&mut self, a: &Activity, now: i64, expired: bool, out: &mut Vec<GpuRow>) -> bool {
        let corr = a.raw.correlation_id;
        let (ext, api) = self
            .launches
            .get(&corr)
            .map_or((NO_EXT, None), |l| (l.ext, l.call));
        if ext != NO_EXT {
            // GPU work cannot start before the call that launched it. On the GPU
            // machine, with CUPTI's launch callbacks switched off and on under load,
            // kernels carried the correlation id of a call made after they ran
            // (docs/dev/cupti.md, "Switching CUPTI").
            if api.is_some_and(|api| a.raw.start_ns < api.start_ns - self.causality_slack_ns) {
                self.stats.inconsistent += 1;
                if self.sampled {
                    self.unseen.remove(&corr);
                }
                return true;
            }
            self.emit(a, ext, Attribution::NcclCall, api, now, out);
            return true;
        }
        let from_proxy =
            a.raw.kind == GpuKind::Memcpy && api.is_some_and(|api| self.proxy_threads.contains(&api.thread));
        if from_proxy {
            let api = api.expect("checked");
            match self.kernel_at(a.raw.device, api.start_ns, expired) {
                Some(UNKNOWN_OP) if expired => {
                    // Issued during a kernel whose op is not known (an op called
                    // outside the sampling windows): not given to another op.
                    self.stats.foreign += 1;
                    return true;
                }
                Some(UNKNOWN_OP) => return false,
                Some(ext) => {
                    self.emit(a, ext, Attribution::ProxyWindow, Some(api), now, out);
                    return true;
                }
                None => {}
            }
            if expired {
                self.stats.foreign += 1;
            }
            return expired;
        }
        // An NCCL kernel launched from a CUDA graph (ops captured into it are written
        // as graph_captured): a gpu row of its own, no op. Copies and memsets in graphs
        // carry no name that would tell NCCL's from the program's.
        if expired && a.raw.kind == GpuKind::Kernel && a.raw.graph_id != 0 {
            self.stats.gpu_rows += 1;
            out.push(GpuRow {
                act: a.clone(),
                op_id: None,
                group_id: None,
                attribution: Attribution::GraphLaunch,
                launch_ns: None,
                api_thread: None,
            });
            return true;
        }
        // Not ours (the program's own copy or memset) once its correlation had time to
        // arrive: CUPTI may deliver the external correlation after the API record.
        if expired {
            self.stats.foreign += 1;
        }
        expired
    }

    /// The op whose NCCL kernel on `device` ran at host time `t`; with `fallback`,
    /// the one whose kernel last started before `t`.
    fn kernel_at(&self, device: u32, t: i64, fallback: bool) -> Option<u64> {
        let (&(_, _start), &(end, ext)) = self.kernels.range((device, i64::MIN)..=(device, t)).next_back()?;
        (end >= t || fallback).then_some(ext)
    }

    fn emit(
        &mut self,
        a: &Activity,
        ext: u64,
        how: Attribution,
        api: Option<Call>,
        now: i64,
        out: &mut Vec<GpuRow>,
    ) {
        // An op issued in a group shares its group's launch, so its GPU work too.
        let (op_id, group_id) = match split_ext(ext) {
            (Some(op), None) => (Some(op), self.op_group.get(&op).copied()),
            other => other,
        };
        let key = group_id.map_or(ext, |g| GROUP_BIT | g);
        self.agg
            .entry(key)
            .or_default()
            .add(a, how == Attribution::ProxyWindow, now);
        if a.raw.kind == GpuKind::Kernel {
            self.kernels
                .insert((a.raw.device, a.raw.start_ns), (a.raw.end_ns, key));
        }
        self.stats.gpu_rows += 1;
        if self.sampled {
            self.unseen.remove(&a.raw.correlation_id);
        }
        out.push(GpuRow {
            act: a.clone(),
            op_id,
            group_id,
            attribution: how,
            launch_ns: api.map(|x| x.start_ns),
            api_thread: api.map(|x| x.thread),
        });
    }

    /// Retries waiting activities (their correlation may have arrived since) and gives
    /// up on those older than `grace_ns`; prunes old state about once a second.
    pub fn settle(&mut self, now: i64, grace_ns: i64, out: &mut Vec<GpuRow>) {
        let n = self.waiting.len();
        for _ in 0..n {
            let Some((t, a)) = self.waiting.pop_front() else {
                break;
            };
            let expired = now - t >= grace_ns;
            if !self.try_attribute(&a, now, expired, out) {
                self.waiting.push_back((t, a));
            }
        }
        if now - self.last_prune_ns >= 1_000_000_000 {
            self.last_prune_ns = now;
            self.prune(now);
        }
    }

    fn prune(&mut self, now: i64) {
        let old = now - (2 * self.hold_ns + KEEP_EXTRA_NS);
        while let Some(&(t, c)) = self.launch_order.front() {
            if t >= old {
                break;
            }
            self.launch_order.pop_front();
            self.launches.remove(&c);
        }
        self.agg.retain(|_, g| g.touched_ns >= old);
        self.timed.retain(|_, t| t.2 >= old);
        self.lost_groups.retain(|_, t| *t >= old);
        // Kernel start times are CUPTI's clock, the same as `now` (checked at start).
        self.kernels.retain(|&(_, start), _| start >= old);
        // Spans that ended before the join's horizon go, the latest one kept. A held op
        // whose call began earlier (a connection setup longer than what the join keeps)
        // still needs the switches since then for the sampling rule in `release`.
        let keep_from = self
            .held
            .iter()
            .map(|(_, r)| r.api_start_ns)
            .min()
            .map_or(old, |t| t.min(old));
        while self.kinds_off.len() > 1 && self.kinds_off.front().is_some_and(|&(_, to)| to < keep_from) {
            self.kinds_off.pop_front();
        }
        // A burst's peak capacity is given back once it has passed.
        shrink_map(&mut self.launches);
        shrink_map(&mut self.agg);
        shrink_map(&mut self.timed);
        shrink_map(&mut self.lost_groups);
        shrink_deque(&mut self.launch_order);
    }

    /// Writes held ops whose time is up (all of them with `all`) to `out`. An op timed
    /// with GPU stamps alone goes as soon as its times arrived; one whose launch CUPTI
    /// traced waits the whole hold for CUPTI's records.
    pub fn release(&mut self, now: i64, all: bool, out: &mut Vec<OpRow>) {
        while let Some((due, rec)) = self.held.front() {
            let ext = ext_id(rec.op_id, rec.group_id);
            let early = !rec.gpu_marked && self.timed.contains_key(&ext);
            if !all && *due > now && !early {
                break;
            }
            let (_, rec) = self.held.pop_front().expect("front exists");
            let timed = matches!(rec.timing.timing, Timing::Timed(_));
            let events = self.timed.get(&ext).map(|&(r, e, _)| (r, e));
            let gpu = if rec.graph_captured == Some(true) || rec.timing.timing == Timing::Captured {
                // Captured into a CUDA graph: its launch ran nothing until the graph
                // is launched (those kernels carry the graph launch's correlation),
                // and no event was recorded into the capturing stream.
                self.stats.ops_graph_captured += 1;
                None
            } else if rec.gpu_marked || !timed {
                self.cupti_columns(&rec, ext).map(|mut g| {
                    if let Some((r, e)) = events {
                        // The stamps are what CUDA events around the op measure.
                        g.gpu_ready_ns = Some(r);
                        g.gpu_end_ns = Some(e);
                    }
                    if g.launch_ns.is_none() {
                        g.launch_ns = rec.timing.launch_ns;
                    }
                    g
                })
            } else if let Some((r, e)) = events {
                Some(OpGpu::from_events(&rec, r, e))
            } else {
                if rec.group_id.is_none() || self.lost_groups.insert(ext, now).is_none() {
                    self.stats.ops_timing_lost += 1;
                }
                None
            };
            if gpu.as_ref().is_some_and(|g| g.engine == Engine::None) {
                self.stats.ops_without_gpu += 1;
            }
            match rec.group_id {
                None => {
                    self.agg.remove(&ext);
                    self.timed.remove(&ext);
                }
                Some(_) => {
                    self.op_group.remove(&rec.op_id);
                }
            }
            out.push(OpRow { rec, gpu });
        }
    }

    /// The GPU columns of an op CUPTI captured (deep mode).
    fn cupti_columns(&mut self, rec: &OpRecord, ext: u64) -> Option<OpGpu> {
        match self.agg.get(&ext) {
            // Its launching call was not marked: called outside the windows.
            _ if self.sampled && !rec.gpu_marked => {
                self.stats.ops_unsampled += 1;
                None
            }
            // Marked, but some of its work launched after the kinds went off (a
            // call that outlived its window's drain, like a communicator's first
            // call, whose connection setup copies ran in the window and whose
            // kernel did not; a call a pause or CUPTI's hand-over overtook):
            // CUPTI could not record all of it.
            Some(g)
                if g.work_launches
                    .is_some_and(|(first, last)| self.kinds_were_off_within(first, last)) =>
            {
                self.stats.ops_unsampled += 1;
                None
            }
            Some(g) => Some(g.columns()),
            // Nothing arrived, and the kinds were off at some time during its call
            // (its launches unreported: the callbacks were off too): not measured.
            None if self.kinds_were_off_within(rec.api_start_ns, rec.api_end_ns) => {
                self.stats.ops_unsampled += 1;
                None
            }
            None => Some(Agg::default().columns()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::OpKind;

    pub(crate) fn op(op_id: u64, group: Option<u64>) -> OpRecord {
        OpRecord {
            comm_id: Some(1),
            comm_ptr: 1,
            rank: Some(0),
            nranks: Some(2),
            seq: Some(op_id),
            call_seq: Some(op_id),
            count: 1,
            dtype: 7,
            bytes: Some(4),
            redop: Some(0),
            device: Some(0),
            group_id: group,
            tid: 1,
            gpu_marked: true,
            graph_captured: Some(false),
            ..OpRecord::blank(op_id, OpKind::AllReduce)
        }
    }

    fn act(kind: GpuKind, corr: u32, start: i64, end: i64, name: Option<&str>, copy: Option<u8>) -> GpuItem {
        GpuItem::Activity(Activity {
            raw: RawActivity {
                kind,
                start_ns: start,
                end_ns: end,
                device: 0,
                context: 1,
                stream: 7,
                correlation_id: corr,
                bytes: copy.map(|_| 1024),
                copy_kind: copy,
                src_device: None,
                dst_device: None,
                grid: None,
                block_x: None,
                name_ptr: 0,
                graph_id: 0,
            },
            name: name.map(Arc::from),
        })
    }

    fn api(corr: u32, start: i64, thread: u32) -> GpuItem {
        GpuItem::Api(RawApi {
            driver: false,
            cbid: 41,
            start_ns: start,
            end_ns: start + 10,
            thread,
            correlation_id: corr,
        })
    }

    fn ext(e: u64, corr: u32) -> GpuItem {
        GpuItem::ExtCorr {
            external_id: e,
            correlation_id: corr,
        }
    }

    fn run(items: Vec<GpuItem>, ops: Vec<OpRecord>) -> (Vec<GpuRow>, Vec<OpRow>, AttribStats) {
        let mut at = Attributor::new(100);
        for o in ops {
            at.hold(o, 0);
        }
        let mut rows = Vec::new();
        for it in items {
            at.item(it, 10, &mut rows);
            at.settle(10, 50, &mut rows);
        }
        at.settle(1000, 50, &mut rows);
        let mut out = Vec::new();
        at.release(1000, false, &mut out);
        (rows, out, at.stats)
    }

    #[test]
    fn kernel_joins_its_op_in_either_order() {
        for swap in [false, true] {
            let mut items = vec![
                ext(5, 100),
                act(
                    GpuKind::Kernel,
                    100,
                    200,
                    300,
                    Some("ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
                    None,
                ),
            ];
            if swap {
                items.reverse();
            }
            items.push(GpuItem::Api(RawApi {
                driver: true,
                cbid: 652,
                start_ns: 150,
                end_ns: 160,
                thread: 9,
                correlation_id: 100,
            }));
            let (rows, ops, _) = run(items, vec![op(5, None)]);
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].op_id, Some(5));
            let g = ops[0].gpu.as_ref().unwrap();
            assert_eq!(
                (g.gpu_start_ns, g.gpu_end_ns, g.launch_ns),
                (Some(200), Some(300), Some(150))
            );
            assert_eq!(g.engine, Engine::SmKernel);
            assert_eq!(
                g.kernel.as_deref(),
                Some("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
            );
        }
    }

    #[test]
    fn copy_engine_and_group_sharing() {
        let gid = 3;
        let e = ext_id(0, Some(gid));
        let items = vec![
            ext(e, 7),
            act(GpuKind::Memcpy, 7, 100, 150, None, Some(8)),
            act(GpuKind::Memcpy, 7, 110, 180, None, Some(10)),
        ];
        let (rows, ops, _) = run(items, vec![op(1, Some(gid)), op(2, Some(gid))]);
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.group_id == Some(gid) && r.op_id.is_none()));
        for o in &ops {
            let g = o.gpu.as_ref().unwrap();
            assert_eq!(g.engine, Engine::CopyEngine);
            assert_eq!((g.gpu_start_ns, g.gpu_end_ns), (Some(100), Some(180)));
            assert_eq!((g.n_memcpy, g.memcpy_bytes, g.n_kernels), (2, 2048, 0));
        }
    }

    #[test]
    fn nccl_kernels_of_graph_launches_are_gpu_rows_without_an_op() {
        let graph = |corr, name: &str, graph_id| match act(GpuKind::Kernel, corr, 100, 200, Some(name), None)
        {
            GpuItem::Activity(mut a) => {
                a.raw.graph_id = graph_id;
                GpuItem::Activity(a)
            }
            _ => unreachable!(),
        };
        let (rows, _, stats) = run(
            vec![
                graph(40, "ncclDevKernel_SendRecv", 3),
                // Not NCCL's, or NCCL's without a graph and without a known launch.
                graph(41, "gemm", 3),
                graph(42, "ncclDevKernel_SendRecv", 0),
            ],
            vec![],
        );
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(
            (r.op_id, r.group_id, r.attribution, r.act.raw.graph_id),
            (None, None, Attribution::GraphLaunch, 3)
        );
        assert_eq!((stats.gpu_rows, stats.foreign), (1, 2));
    }

    #[test]
    fn a_graph_captured_op_is_not_measured_rather_than_without_gpu() {
        let mut captured = op(5, None);
        captured.graph_captured = Some(true);
        // Its launch was traced, but the captured kernel runs only at graph launches.
        let (rows, ops, stats) = run(vec![ext(5, 1), api(1, 5, 9)], vec![captured, op(6, None)]);
        assert!(rows.is_empty());
        assert_eq!(ops[0].gpu, None);
        assert_eq!(ops[1].gpu.as_ref().map(|g| g.engine), Some(Engine::None));
        assert_eq!((stats.ops_graph_captured, stats.ops_without_gpu), (1, 1));
    }

    #[test]
    fn the_window_is_the_kernels_else_the_copy_engine_copies_else_anything() {
        let kernel = |corr, s, e| act(GpuKind::Kernel, corr, s, e, Some("ncclDevKernel_SendRecv"), None);
        let memset = |corr, s, e| act(GpuKind::Memset, corr, s, e, None, None);
        let dtod = |corr, s, e| act(GpuKind::Memcpy, corr, s, e, None, Some(8));
        let htod = |corr, s, e| act(GpuKind::Memcpy, corr, s, e, None, Some(1));
        // (activities in arrival order, expected window): a stronger bound's first
        // activity drops the weaker span, whichever order they arrive in.
        let cases = [
            (vec![memset(1, 10, 20), htod(1, 30, 40)], (10, 40)),
            (
                vec![memset(1, 10, 20), dtod(1, 30, 40), htod(1, 50, 90)],
                (30, 40),
            ),
            (vec![dtod(1, 30, 40), memset(1, 5, 95), dtod(1, 60, 70)], (30, 70)),
            (
                vec![
                    dtod(1, 30, 40),
                    kernel(1, 50, 60),
                    memset(1, 0, 99),
                    kernel(1, 45, 55),
                ],
                (45, 60),
            ),
            (vec![kernel(1, 50, 60), dtod(1, 10, 20)], (50, 60)),
        ];
        for (acts, (start, end)) in cases {
            let mut items = vec![ext(5, 1)];
            items.extend(acts);
            let (_, ops, _) = run(items, vec![op(5, None)]);
            let g = ops[0].gpu.as_ref().unwrap();
            assert_eq!((g.gpu_start_ns, g.gpu_end_ns), (Some(start), Some(end)));
        }
    }

    #[test]
    fn proxy_copies_go_to_the_running_kernel() {
        let k = |corr, s, e| act(GpuKind::Kernel, corr, s, e, Some("ncclDevKernel_SendRecv"), None);
        let items = vec![
            GpuItem::ProxyThread(77),
            ext(1, 10),
            ext(2, 20),
            k(10, 100, 200),
            k(20, 300, 400),
            // issued at 150 (op 1 running), at 350 (op 2), at 450 (after op 2's kernel)
            api(31, 150, 77),
            act(GpuKind::Memcpy, 31, 160, 170, None, Some(10)),
            api(32, 350, 77),
            act(GpuKind::Memcpy, 32, 360, 370, None, Some(10)),
            api(33, 450, 77),
            act(GpuKind::Memcpy, 33, 460, 470, None, Some(10)),
            // the program's own copy on another thread: dropped
            api(34, 150, 5),
            act(GpuKind::Memcpy, 34, 160, 170, None, Some(1)),
            // the program's own kernel: dropped
            act(GpuKind::Kernel, 40, 0, 1, Some("elementwise"), None),
        ];
        let (rows, ops, stats) = run(items, vec![op(1, None), op(2, None)]);
        let by_op = |id| rows.iter().filter(|r| r.op_id == Some(id)).count();
        assert_eq!((by_op(1), by_op(2)), (2, 3));
        assert!(
            rows.iter()
                .filter(|r| r.act.raw.kind == GpuKind::Memcpy)
                .all(|r| r.attribution == Attribution::ProxyWindow && r.api_thread == Some(77))
        );
        assert_eq!(stats.foreign, 2);
        assert_eq!(ops[0].gpu.as_ref().unwrap().engine, Engine::ProxyMemcpy);
        assert_eq!(ops[1].gpu.as_ref().unwrap().n_memcpy, 2);
        // The window stays the kernel's: proxy copies do not widen it.
        assert_eq!(ops[1].gpu.as_ref().unwrap().gpu_end_ns, Some(400));
    }

    fn launch(corr: u32, cbid: u32, start: i64) -> GpuItem {
        GpuItem::Api(RawApi {
            driver: true,
            cbid,
            start_ns: start,
            end_ns: start + 10,
            thread: 9,
            correlation_id: corr,
        })
    }

    #[test]
    fn with_sampling_an_op_without_a_marked_launch_is_not_measured() {
        let mut at = Attributor::new(100).with_sampling();
        at.hold(op(1, None), 0); // sampled: marked launch, kernel arrives
        at.hold(op(2, None), 0); // sampled: marked launch, nothing arrives
        // called outside the windows: not marked
        at.hold(
            OpRecord {
                gpu_marked: false,
                graph_captured: Some(false),
                timing: Default::default(),
                ..op(3, None)
            },
            0,
        );
        // marked, but its call failed before launching anything: engine none
        at.hold(op(4, None), 0);
        let mut rows = Vec::new();
        for it in [
            ext(1, 10),
            launch(10, 652, 5),
            ext(2, 20),
            launch(20, 652, 6),
            // op 3's kernel ran while a window drained: recorded, op unknown
            act(GpuKind::Kernel, 30, 50, 60, Some("ncclDevKernel_AllReduce"), None),
        ] {
            at.item(it, 10, &mut rows);
        }
        assert_eq!(at.pending(10), 2);
        at.item(
            act(GpuKind::Kernel, 10, 20, 30, Some("ncclDevKernel_AllReduce"), None),
            11,
            &mut rows,
        );
        assert_eq!(at.pending(11), 1);
        // A launch not heard of within the hold is given up.
        assert_eq!(at.pending(10 + 100), 0);
        at.settle(1000, 50, &mut rows);
        let mut out = Vec::new();
        at.release(1000, false, &mut out);
        assert_eq!(out[0].gpu.as_ref().unwrap().engine, Engine::SmKernel);
        assert_eq!(out[1].gpu.as_ref().unwrap().engine, Engine::None);
        assert_eq!(out[2].gpu, None);
        assert_eq!(out[3].gpu.as_ref().unwrap().engine, Engine::None);
        let st = at.stats;
        assert_eq!((st.ops_unsampled, st.ops_without_gpu, st.foreign), (1, 2, 1));
    }

    #[test]
    fn an_activity_that_ran_before_its_launch_call_is_not_attributed() {
        let k = |corr, s, e| act(GpuKind::Kernel, corr, s, e, Some("ncclDevKernel_AllReduce"), None);
        let ms = 1_000_000;
        let (rows, ops, stats) = run(
            vec![
                ext(1, 10),
                launch(10, 652, 20 * ms),
                k(10, 12 * ms, 13 * ms), // 8 ms before its call: wrong correlation
                k(10, 20 * ms - ms / 2, 21 * ms), // within the slack: kept
            ],
            vec![op(1, None)],
        );
        assert_eq!(rows.len(), 1);
        assert_eq!(stats.inconsistent, 1);
        assert_eq!(ops[0].gpu.as_ref().unwrap().gpu_start_ns, Some(20 * ms - ms / 2));
    }

    #[test]
    fn the_causality_slack_grows_with_the_measured_clock_offset() {
        let k = |corr, s, e| act(GpuKind::Kernel, corr, s, e, Some("ncclDevKernel_AllReduce"), None);
        let ms = 1_000_000;
        let (rows, _, stats) = run(
            vec![
                GpuItem::ClockOffset(-3 * ms),
                ext(1, 10),
                launch(10, 652, 20 * ms),
                k(10, 17 * ms, 18 * ms), // 3 ms early: within 1 ms + |offset|
                k(10, 15 * ms, 16 * ms), // 5 ms early: not
            ],
            vec![op(1, None)],
        );
        assert_eq!((rows.len(), stats.inconsistent), (1, 1));
    }

    #[test]
    fn with_sampling_memops_are_not_waited_for() {
        let mut at = Attributor::new(100).with_sampling();
        let mut rows = Vec::new();
        at.item(ext(1, 10), 0, &mut rows);
        at.item(launch(10, cupti::CBID_STREAM_BATCH_MEMOP, 0), 0, &mut rows);
        assert_eq!(at.pending(1), 0);
        // Without sampling nothing is tracked.
        let mut at = Attributor::new(100);
        at.item(ext(1, 10), 0, &mut rows);
        at.item(launch(10, 652, 0), 0, &mut rows);
        assert_eq!(at.pending(1), 0);
    }

    /// A marked call that launches only after the window's kinds went off (it outlived
    /// the drain) is not sampled, not "nothing arrived".
    #[test]
    fn a_launch_after_the_kinds_went_off_is_not_sampled() {
        let mut at = Attributor::new(100).with_sampling();
        let mut rows = Vec::new();
        at.hold(op(1, None), 0);
        at.hold(op(2, None), 0);
        at.item(ext(1, 10), 0, &mut rows);
        at.item(launch(10, 652, 50), 0, &mut rows); // launched while the kinds were on
        at.kinds_switched(false, 100);
        at.item(ext(2, 11), 0, &mut rows);
        at.item(launch(11, 652, 150), 0, &mut rows); // launched after they went off
        at.kinds_switched(true, 300);
        let mut out = Vec::new();
        at.release(1_000, false, &mut out);
        assert_eq!(out[0].gpu.as_ref().map(|g| g.engine), Some(Engine::None));
        assert_eq!(out[1].gpu, None);
        assert_eq!((at.stats.ops_without_gpu, at.stats.ops_unsampled), (1, 1));
        assert!(at.kinds_were_off_within(299, 299) && !at.kinds_were_off_within(300, 400));
        assert!(!at.kinds_were_off_within(0, 99) && at.kinds_were_off_within(0, 100));
    }

    /// The sampling rule's other cases: the kinds still off when the op is released (the
    /// usual case, the hold being shorter than the gap between windows); launches in a
    /// window, in the gap and in the next window (the last one alone would pass); a
    /// flag-sync memop (no activity record) launched in the gap, which loses nothing.
    #[test]
    fn the_sampling_rule_looks_at_every_recorded_launch_and_the_open_gap() {
        let nccl = Some("ncclDevKernel_AllReduce_Sum_f32_RING_LL");
        let mut at = Attributor::new(100).with_sampling();
        let mut rows = Vec::new();
        for id in 1..=3 {
            at.hold(op(id, None), 0);
        }
        at.item(ext(1, 10), 0, &mut rows); // op 1: a copy in the first window...
        at.item(launch(10, 41, 50), 0, &mut rows);
        at.item(act(GpuKind::Memcpy, 10, 55, 60, None, Some(1)), 0, &mut rows);
        at.kinds_switched(false, 100);
        at.item(ext(1, 11), 0, &mut rows); // ...a copy in the gap...
        at.item(launch(11, 41, 150), 0, &mut rows);
        at.kinds_switched(true, 300);
        at.item(ext(1, 12), 0, &mut rows); // ...and its kernel in the next window
        at.item(launch(12, 652, 310), 0, &mut rows);
        at.item(act(GpuKind::Kernel, 12, 320, 330, nccl, None), 0, &mut rows);
        at.item(ext(2, 13), 0, &mut rows); // op 2: kernel in the window, then a memop in the gap
        at.item(launch(13, 652, 350), 0, &mut rows);
        at.item(act(GpuKind::Kernel, 13, 360, 370, nccl, None), 0, &mut rows);
        at.kinds_switched(false, 400);
        at.item(ext(2, 14), 0, &mut rows);
        at.item(launch(14, cupti::CBID_STREAM_BATCH_MEMOP, 410), 0, &mut rows);
        at.item(ext(3, 15), 0, &mut rows); // op 3: its kernel launched after the kinds went off
        at.item(launch(15, 652, 420), 0, &mut rows);
        at.settle(1_000, 50, &mut rows);
        let mut out = Vec::new();
        at.release(1_000, false, &mut out); // the kinds are still off
        assert_eq!(out[0].gpu, None, "op 1 lost its copy in the gap");
        assert_eq!(out[1].gpu.as_ref().map(|g| g.engine), Some(Engine::SmKernel));
        assert_eq!(out[2].gpu, None, "op 3 launched while the kinds were off");
        assert_eq!((at.stats.ops_without_gpu, at.stats.ops_unsampled), (0, 2));
    }

    /// Switches older than the join keeps stay while a held op's call began before them.
    #[test]
    fn switches_stay_while_a_held_call_needs_them() {
        let mut at = Attributor::new(100).with_sampling();
        at.kinds_switched(false, 100);
        at.kinds_switched(true, 300);
        at.kinds_switched(false, 400);
        at.kinds_switched(true, 500);
        let mut long_call = op(1, None);
        long_call.api_start_ns = 50;
        at.hold(long_call, 20_000_000_000);
        at.prune(20_000_000_000);
        assert_eq!(at.kinds_off.len(), 2);
        let mut out = Vec::new();
        at.release(i64::MAX, true, &mut out);
        at.prune(40_000_000_000);
        assert_eq!(at.kinds_off.len(), 1, "the latest switch on stays");
    }

    /// A communicator's first call, seen on the GPU machine (tests/gpu/cupti.sh, sampled
    /// mode): its connection-setup copies launched and ran in the window, its kernel
    /// launched after the kinds went off. Not sampled, rather than engine `none`.
    #[test]
    fn a_call_whose_kernel_launched_after_the_kinds_went_off_is_not_sampled() {
        let mut at = Attributor::new(100).with_sampling();
        let mut rows = Vec::new();
        at.hold(op(1, None), 0);
        at.hold(op(2, None), 0);
        at.item(ext(1, 10), 0, &mut rows);
        at.item(launch(10, 41, 50), 0, &mut rows); // a setup copy, in the window
        at.item(act(GpuKind::Memcpy, 10, 55, 60, None, Some(1)), 0, &mut rows);
        at.kinds_switched(false, 100);
        at.item(ext(1, 11), 0, &mut rows);
        at.item(launch(11, 652, 150), 0, &mut rows); // its kernel, after the kinds went off
        at.kinds_switched(true, 300);
        at.item(ext(2, 12), 0, &mut rows); // the next window's op: measured
        at.item(launch(12, 652, 310), 0, &mut rows);
        at.item(
            act(
                GpuKind::Kernel,
                12,
                320,
                330,
                Some("ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
                None,
            ),
            0,
            &mut rows,
        );
        at.settle(1_000, 50, &mut rows);
        let mut out = Vec::new();
        at.release(1_000, false, &mut out);
        assert_eq!(out[0].gpu, None);
        assert_eq!(out[1].gpu.as_ref().map(|g| g.engine), Some(Engine::SmKernel));
        assert_eq!((at.stats.ops_without_gpu, at.stats.ops_unsampled), (0, 1));
    }

    #[test]
    fn proxy_copies_never_go_to_an_unsampled_ops_kernel() {
        let k = |corr, s, e| act(GpuKind::Kernel, corr, s, e, Some("ncclDevKernel_SendRecv"), None);
        let mut at = Attributor::new(100).with_sampling();
        at.hold(op(1, None), 0);
        let mut rows = Vec::new();
        for it in [
            GpuItem::ProxyThread(77),
            ext(1, 10),
            k(10, 100, 200), // op 1, sampled
            k(20, 300, 400), // an unsampled op's kernel (no marked launch)
            // issued while the unsampled kernel ran, and after it ended: neither goes
            // to op 1, the last sampled kernel
            api(31, 350, 77),
            act(GpuKind::Memcpy, 31, 360, 370, None, Some(10)),
            api(32, 450, 77),
            act(GpuKind::Memcpy, 32, 460, 470, None, Some(10)),
        ] {
            at.item(it, 500, &mut rows);
        }
        at.settle(2000, 50, &mut rows);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].op_id, Some(1));
        assert_eq!(at.stats.foreign, 3);
    }

    #[test]
    fn nothing_arrived_is_none_not_zero() {
        let (_, ops, stats) = run(vec![], vec![op(9, None)]);
        let g = ops[0].gpu.as_ref().unwrap();
        assert_eq!(g.engine, Engine::None);
        assert_eq!((g.gpu_start_ns, g.launch_ns), (None, None));
        assert_eq!(stats.ops_without_gpu, 1);
    }

    #[test]
    fn hold_releases_in_time_only() {
        let mut at = Attributor::new(100);
        at.hold(op(1, None), 0);
        at.hold(op(2, None), 50);
        let mut out = Vec::new();
        at.release(99, false, &mut out);
        assert!(out.is_empty());
        at.release(100, false, &mut out);
        assert_eq!(out.len(), 1);
        at.release(100, true, &mut out);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn external_correlation_records_are_not_used() {
        let raw = Raw::ExtCorr {
            external_kind: 3,
            external_id: 1,
            correlation_id: 1,
        };
        assert_eq!(GpuItem::from_raw(raw, |_| None), None);
        assert_eq!(split_ext(ext_id(4, Some(9))), (None, Some(9)));
        assert_eq!(split_ext(ext_id(4, None)), (Some(4), None));
    }

    /// zcta's own kernels, stamps and anchors (deep mode sees them), are neither an
    /// op's kernels nor counted among the program's.
    #[test]
    fn zctas_stamp_kernels_are_nobodys() {
        let items = vec![
            act(GpuKind::Kernel, 3, 100, 500, Some("scale"), None),
            act(GpuKind::Kernel, 4, 500, 510, Some(ZCTA_KERNELS[0]), None),
            api(10, 200, 1),
            ext(1, 10),
            act(GpuKind::Kernel, 5, 520, 530, Some(ZCTA_KERNELS[0]), None),
            act(GpuKind::Kernel, 6, 530, 535, Some(ZCTA_KERNELS[1]), None),
            act(
                GpuKind::Kernel,
                10,
                540,
                900,
                Some("ncclDevKernel_AllReduce"),
                None,
            ),
        ];
        let (_, out, stats) = run(items, vec![op(1, None)]);
        let g = out[0].gpu.as_ref().unwrap();
        assert_eq!(
            (g.gpu_start_ns, g.gpu_end_ns, g.n_kernels),
            (Some(540), Some(900), 1)
        );
        assert_eq!(stats.foreign, 1, "only the program's kernel: {stats:?}");
    }

    /// CUPTI's records give an op its kernel span, never when its stream was free:
    /// `gpu_ready_ns` is NULL (not measured) unless its events timed it.
    #[test]
    fn readiness_comes_from_the_events_only() {
        let kernel = |corr, s, e| act(GpuKind::Kernel, corr, s, e, Some("ncclDevKernel_AllReduce"), None);
        let items = vec![
            act(GpuKind::Kernel, 3, 100, 500, Some("scale"), None),
            api(10, 200, 1),
            ext(1, 10),
            kernel(10, 540, 900),
        ];
        let (_, out, stats) = run(items, vec![op(1, None)]);
        let g = out[0].gpu.as_ref().unwrap();
        assert_eq!(
            (g.gpu_ready_ns, g.gpu_start_ns, g.gpu_end_ns),
            (None, Some(540), Some(900))
        );
        assert_eq!(stats.foreign, 1, "the program's kernel is not a gpu row");

        // The same op timed with events too: ready and end are the events'.
        let mut at = Attributor::new(100);
        let mut rows = Vec::new();
        at.hold(
            OpRecord {
                gpu_marked: true,
                timing: crate::record::OpTiming {
                    timing: Timing::Timed(0),
                    ..crate::record::OpTiming::default()
                },
                ..op(1, None)
            },
            0,
        );
        for it in [
            act(GpuKind::Kernel, 3, 100, 500, Some("scale"), None),
            api(10, 200, 1),
            ext(1, 10),
            kernel(10, 540, 900),
            GpuItem::Timed {
                ext: ext_id(1, None),
                ready_ns: 510,
                end_ns: 905,
            },
        ] {
            at.item(it, 0, &mut rows);
        }
        let mut out = Vec::new();
        at.release(1_000, false, &mut out);
        let g = out[0].gpu.as_ref().unwrap();
        assert_eq!(
            (g.gpu_ready_ns, g.gpu_start_ns, g.gpu_end_ns),
            (Some(510), Some(540), Some(905))
        );
    }

    /// Without sampling too: an op that a pause (or CUPTI's hand-over) overtook — its
    /// launch came after the kinds went off, or nothing arrived and the kinds were off
    /// during its call — is not measured (NULL), not "ran nothing" (none).
    #[test]
    fn an_op_a_pause_overtook_is_not_measured() {
        let mut at = Attributor::new(100);
        let mut rows = Vec::new();
        let mut overtaken = op(1, None);
        (overtaken.api_start_ns, overtaken.api_end_ns) = (550, 650);
        let mut silent = op(2, None);
        (silent.api_start_ns, silent.api_end_ns) = (560, 640);
        let mut before = op(3, None);
        (before.api_start_ns, before.api_end_ns) = (100, 200);
        for o in [overtaken, silent, before] {
            at.hold(o, 0);
        }
        at.item(GpuItem::Kinds { on: false, t: 600 }, 600, &mut rows);
        // Op 1 launched at 620, with the kinds off: its kernel has no record.
        at.item(api(10, 620, 1), 620, &mut rows);
        at.item(ext(1, 10), 620, &mut rows);
        at.item(GpuItem::Kinds { on: true, t: 700 }, 700, &mut rows);
        let mut out = Vec::new();
        at.release(1_000, false, &mut out);
        let by: Vec<(u64, Option<Engine>)> = out
            .iter()
            .map(|o| (o.rec.op_id, o.gpu.as_ref().map(|g| g.engine)))
            .collect();
        assert_eq!(by, [(1, None), (2, None), (3, Some(Engine::None))]);
        assert_eq!((at.stats.ops_unsampled, at.stats.ops_without_gpu), (2, 1));
    }
}
