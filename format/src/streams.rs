//! When an op's stream was free for it, from CUPTI's own records.
//!
//! CUDA events around an NCCL call time more than its kernel: NCCL's launch makes the
//! stream wait on its internal streams and the GPU launches the kernel, 4–6 µs on the
//! 2×H200 that no CUPTI activity covers (docs/dev/cupti-measurements.md, "Where the 4–6 µs go").
//! That time starts when the work the op waits for is done. CUPTI says when:
//! - every activity (kernel, copy, memset; the program's own too) with its stream,
//!   the correlation id of the call that launched it and its end;
//! - every `cudaEventRecord` (CUDA_EVENT) with its stream, correlation id and
//!   `cudaEventSyncId`;
//! - every `cudaStreamWaitEvent` (SYNCHRONIZATION) with the waiting stream, its
//!   correlation id and the `cudaEventSyncId` of the record it waits for.
//!
//! Correlation ids are one process-wide sequence in call order, so a stream's work
//! "launched before call `c`" is its work with a smaller id. A stream runs its work in
//! order, so stream `S` is free for call `c` at [`StreamTracker::ready`]`(S, c)`: the
//! later of the end of the last activity launched on `S` before `c`, and, for each wait
//! `S` was given after that activity and before `c`, the time the awaited event record
//! completed — `ready` of the recording stream at the record's call, recursively
//! ([`MAX_DEPTH`] levels, the [`MAX_WAITS`] latest waits per level). Waits given before
//! the last activity are already in its end. What CUPTI did not record (an event
//! recorded by the driver, a stream with no kept work) constrains nothing; when nothing
//! is known the answer is `None`. So is a stream whose last recorded work may have been
//! launched before CUPTI's kinds were last switched on (`since`): work launched while
//! they were off may have followed it unrecorded. Its launch, not its start on the GPU,
//! decides: a GPU running behind starts work launched before a pause after the pause
//! ended. A launch's time is known for the calls CUPTI's launch callbacks reported
//! ([`StreamTracker::launched`]); other work (a framework's kernels) was launched no
//! earlier than the latest reported call before it, and that bound is used.
//!
//! History is kept for [`StreamTracker::new`]'s `keep_ns` after it arrived; a stream's
//! latest activity is kept until `keep_ns` after a newer one replaced it, so an op
//! after a long idle still finds the work ahead of it when its row is written (at most
//! a hold after its own records arrived). Correlation id 0 (no call) is not filed.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound::Excluded;

use crate::cupti::StreamMark;

/// Depth of the recursion through event records (NCCL: user stream → NCCL's device
/// stream → the previous op on the user stream; torch: NCCL stream → compute stream).
pub const MAX_DEPTH: u32 = 4;
/// Waits followed per stream and level, latest first (a stream that only waits, like
/// NCCL's device stream, collects one wait per op).
pub const MAX_WAITS: usize = 4;

/// (context, stream) as CUPTI numbers them.
type StreamKey = (u32, u32);

/// Correlation ids unwrapped to 64 bits (CUPTI's are 32-bit and may wrap in a long
/// run): each id is placed in the 2³² epoch nearest the highest id seen so far.
#[derive(Default)]
struct Unwrap {
    hi: u64,
}

impl Unwrap {
    fn get(&mut self, c: u32) -> u64 {
        let v = self.peek(c);
        self.hi = self.hi.max(v);
        v
    }

    fn peek(&self, c: u32) -> u64 {
        let base = self.hi & !0xffff_ffff;
        let cand = base | u64::from(c);
        if cand > self.hi + (1 << 31) && base > 0 {
            cand - (1 << 32)
        } else if cand + (1 << 31) < self.hi {
            cand + (1 << 32)
        } else {
            cand
        }
    }
}

#[derive(Clone, Copy)]
struct Act {
    end: i64,
    touched: i64,
}

/// Activities, event records and stream waits of the recent past; lives on the writer
/// thread inside the GPU join (`gpu::Attributor`).
pub struct StreamTracker {
    keep_ns: i64,
    corr: Unwrap,
    /// Per stream: launching call → its activity: the earliest start and latest end
    /// for a call that launched several, and when it arrived or, once a newer one
    /// replaced it as the stream's latest, when that happened.
    acts: HashMap<StreamKey, BTreeMap<u64, Act>>,
    /// Per stream: waiting call → (the awaited record's `cudaEventSyncId`, arrival).
    waits: HashMap<StreamKey, BTreeMap<u64, (u64, i64)>>,
    /// `cudaEventSyncId` → the stream and call of that event record, and its arrival.
    records: HashMap<u64, (StreamKey, u64, i64)>,
    /// Calls reported by the launch callbacks → (their entry, CLOCK_REALTIME ns;
    /// arrival).
    launches: BTreeMap<u64, (i64, i64)>,
    /// Event records or waits arrived: CUPTI's CUDA_EVENT and SYNCHRONIZATION kinds
    /// are on. Without them a stream's waits are unknown, and its own work alone
    /// would say it was free too early: [`Self::ready`] answers `None`.
    marks_seen: bool,
}

impl StreamTracker {
    pub fn new(keep_ns: i64) -> Self {
        Self {
            keep_ns,
            corr: Unwrap::default(),
            acts: HashMap::new(),
            waits: HashMap::new(),
            records: HashMap::new(),
            launches: BTreeMap::new(),
            marks_seen: false,
        }
    }

    /// The unwrapped id of call `c` (as the tracker files it).
    #[cfg(test)]
    fn corr(&self, c: u32) -> u64 {
        self.corr.peek(c)
    }

    /// Call `corr` (a launch the callbacks reported) was entered at `t`
    /// (CLOCK_REALTIME ns).
    pub fn launched(&mut self, corr: u32, t: i64, now: i64) {
        if corr == 0 {
            return;
        }
        let c = self.corr.get(corr);
        self.launches.insert(c, (t, now));
    }

    /// No later than when call `c` was launched: its own entry when reported, else that
    /// of the latest reported call before it (ids follow launch order); `i64::MIN` when
    /// none is kept.
    fn launched_after(&self, c: u64) -> i64 {
        self.launches
            .range(..=c)
            .next_back()
            .map_or(i64::MIN, |(_, &(t, _))| t)
    }

    /// An activity on (context, stream), launched by call `corr`, that ended at
    /// `end_ns`.
    pub fn activity(&mut self, context: u32, stream: u32, corr: u32, end_ns: i64, now: i64) {
        if corr == 0 {
            return;
        }
        let c = self.corr.get(corr);
        let key = (context, stream);
        let m = self.acts.entry(key).or_default();
        // The stream's latest so far is replaced: it is kept for `keep_ns` from now.
        if let Some((&lc, _)) = m.last_key_value()
            && lc < c
            && let Some(v) = m.get_mut(&lc)
        {
            v.touched = now;
        }
        match m.get_mut(&c) {
            Some(v) => v.end = v.end.max(end_ns),
            None => {
                m.insert(
                    c,
                    Act {
                        end: end_ns,
                        touched: now,
                    },
                );
            }
        }
    }

    pub fn event_record(&mut self, m: &StreamMark, now: i64) {
        self.marks_seen = true;
        if m.sync_id == 0 || m.correlation_id == 0 {
            return;
        }
        let c = self.corr.get(m.correlation_id);
        self.records.insert(m.sync_id, ((m.context, m.stream), c, now));
    }

    pub fn stream_wait(&mut self, m: &StreamMark, now: i64) {
        self.marks_seen = true;
        if m.sync_id == 0 || m.correlation_id == 0 {
            return;
        }
        let c = self.corr.get(m.correlation_id);
        let key = (m.context, m.stream);
        self.waits.entry(key).or_default().insert(c, (m.sync_id, now));
    }

    /// When (context, stream) was free for call `corr` (see the module docs); `None`
    /// when nothing ahead of it is known, or no event record or wait was ever seen.
    /// `since`: CUPTI's kinds were last switched on then (`i64::MIN`: never off) —
    /// work launched while they were off has no record, so a stream whose last
    /// recorded work may have been launched before `since` is not known.
    pub fn ready(&self, context: u32, stream: u32, corr: u32, since: i64) -> Option<i64> {
        if !self.marks_seen {
            return None;
        }
        self.ready_at((context, stream), self.corr.peek(corr), since, MAX_DEPTH)
    }

    fn ready_at(&self, key: StreamKey, c: u64, since: i64, depth: u32) -> Option<i64> {
        let last = self.acts.get(&key).and_then(|m| m.range(..c).next_back());
        if last.is_some_and(|(&lc, _)| since != i64::MIN && self.launched_after(lc) < since) {
            return None;
        }
        let mut best = last.map(|(_, a)| a.end);
        if depth == 0 {
            return best;
        }
        let after = last.map_or(0, |(&lc, _)| lc);
        // (after, c) holds no call id when they are adjacent (and `range` would panic on
        // an empty excluded range).
        let Some(w) = self.waits.get(&key).filter(|_| c > after + 1) else {
            return best;
        };
        for (_, (sync, _)) in w.range((Excluded(after), Excluded(c))).rev().take(MAX_WAITS) {
            let Some(&(rkey, rc, _)) = self.records.get(sync) else {
                continue;
            };
            if let Some(t) = self.ready_at(rkey, rc, since, depth - 1) {
                best = Some(best.map_or(t, |b| b.max(t)));
            }
        }
        best
    }

    /// Forgets what arrived more than `keep_ns` before `now`; a stream's latest activity
    /// is kept until `keep_ns` after a newer one replaced it. One pass over what is
    /// kept (called about once a second).
    pub fn prune(&mut self, now: i64) {
        let old = now - self.keep_ns;
        for m in self.acts.values_mut() {
            let latest = m.last_key_value().map(|(&c, _)| c);
            m.retain(|&c, a| a.touched >= old || Some(c) == latest);
        }
        for m in self.waits.values_mut() {
            m.retain(|_, &mut (_, t)| t >= old);
        }
        self.waits.retain(|_, m| !m.is_empty());
        self.records.retain(|_, &mut (_, _, t)| t >= old);
        shrink_map(&mut self.records);
        // The launch bounding each kept activity's stays with it.
        let mut floors: Vec<u64> = (self.acts.values())
            .flat_map(|m| m.keys())
            .filter_map(|&c| self.launches.range(..=c).next_back().map(|(&l, _)| l))
            .collect();
        floors.sort_unstable();
        self.launches
            .retain(|c, &mut (_, t)| t >= old || floors.binary_search(c).is_ok());
    }

    /// Entries kept (activities, waits, records, launches).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.acts.values().map(BTreeMap::len).sum::<usize>()
            + self.waits.values().map(BTreeMap::len).sum::<usize>()
            + self.records.len()
            + self.launches.len()
    }
}

/// Gives back a map's capacity when it holds less than a quarter of it.
pub(crate) fn shrink_map<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > 4 * m.len() + 1024 {
        m.shrink_to_fit();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const MIN: i64 = i64::MIN;

    /// An event record or wait on context 1.
    pub(crate) fn mark(stream: u32, corr: u32, sync_id: u64) -> StreamMark {
        StreamMark {
            context: 1,
            stream,
            correlation_id: corr,
            sync_id,
        }
    }

    #[test]
    fn same_stream_last_activity_launched_before() {
        let mut t = StreamTracker::new(10_000);
        assert_eq!(t.ready(1, 7, 10, MIN), None);
        t.activity(1, 7, 5, 1_000, 0); // the sleep
        assert_eq!(
            t.ready(1, 7, 10, MIN),
            None,
            "no event record or wait seen yet: waits unknown"
        );
        t.event_record(&mark(9, 1, 50), 0);
        t.activity(1, 7, 12, 2_000, 0); // the op itself (launched after call 10)
        t.activity(1, 8, 9, 5_000, 0); // another stream: no effect
        assert_eq!(t.ready(1, 7, 10, MIN), Some(1_000));
        assert_eq!(t.ready(1, 7, 13, MIN), Some(2_000));
        assert_eq!(t.ready(2, 7, 10, MIN), None, "another context");
    }

    #[test]
    fn waits_follow_event_records_across_streams() {
        // torch: compute stream 3 runs a kernel (call 4, ends at 9_000), records event
        // (call 6, sync 100); NCCL stream 7 (last work: call 2, ended at 1_000) waits on
        // it (call 8); the op launches at call 20.
        let mut t = StreamTracker::new(10_000);
        t.activity(1, 7, 2, 1_000, 0);
        t.activity(1, 3, 4, 9_000, 0);
        t.event_record(&mark(3, 6, 100), 0);
        t.stream_wait(&mark(7, 8, 100), 0);
        assert_eq!(t.ready(1, 7, 20, MIN), Some(9_000));
        // A wait issued before the stream's last activity is already in its end.
        t.activity(1, 7, 10, 9_500, 0);
        assert_eq!(t.ready(1, 7, 20, MIN), Some(9_500));
        // Work launched on the compute stream after the record does not count.
        t.activity(1, 3, 7, 50_000, 0);
        t.stream_wait(&mark(7, 15, 100), 0);
        assert_eq!(t.ready(1, 7, 20, MIN), Some(9_500));
    }

    #[test]
    fn nccl_launch_chain_through_a_stream_without_work() {
        // Previous op's kernel on user stream 7 (call 2, ends 5_000), NCCL's finished
        // event on 7 (call 3, sync 1); the device stream 9 waits on it (call 4); next op:
        // event on 9 (call 10, sync 2), stream 7 waits on it (call 11), kernel (call 12).
        let mut t = StreamTracker::new(10_000);
        t.activity(1, 7, 2, 5_000, 0);
        t.event_record(&mark(7, 3, 1), 0);
        t.stream_wait(&mark(9, 4, 1), 0);
        t.event_record(&mark(9, 10, 2), 0);
        t.stream_wait(&mark(7, 11, 2), 0);
        assert_eq!(t.ready(1, 7, 12, MIN), Some(5_000));
        assert_eq!(t.ready(1, 9, 10, MIN), Some(5_000));
        // A record CUPTI did not report (sync id unknown) constrains nothing.
        t.stream_wait(&mark(7, 11, 77), 0);
        assert_eq!(t.ready(1, 7, 12, MIN), Some(5_000));
        // Unknown everything: None.
        let mut u = StreamTracker::new(10_000);
        u.stream_wait(&mark(7, 11, 2), 0);
        assert_eq!(u.ready(1, 7, 12, MIN), None);
    }

    #[test]
    fn recursion_is_bounded_on_cycles_of_records() {
        // Two streams waiting on each other's records over and over stay finite.
        let mut t = StreamTracker::new(1 << 40);
        for i in 0..200u32 {
            let (a, b) = if i % 2 == 0 { (1, 2) } else { (2, 1) };
            t.event_record(&mark(a, 3 * i + 2, u64::from(i) + 1), 0);
            t.stream_wait(&mark(b, 3 * i + 3, u64::from(i) + 1), 0);
        }
        t.activity(1, 1, 1, 42, 0);
        assert_eq!(t.ready(1, 2, 10_000, MIN), Some(42));
    }

    #[test]
    fn prune_keeps_each_streams_latest_activity() {
        let mut t = StreamTracker::new(100);
        t.stream_wait(&mark(9, 0, 0), 0); // a wait CUPTI could not link: marks seen
        t.activity(1, 7, 1, 10, 0);
        t.activity(1, 7, 2, 20, 0);
        t.event_record(&mark(7, 3, 5), 0);
        t.stream_wait(&mark(8, 4, 5), 0);
        t.prune(1_000);
        assert_eq!(t.len(), 1);
        assert_eq!(t.ready(1, 7, 50, MIN), Some(20));
        assert_eq!(t.ready(1, 8, 50, MIN), None);
    }

    #[test]
    fn adjacent_or_tiny_ids_do_not_panic() {
        let mut t = StreamTracker::new(10_000);
        t.stream_wait(&mark(7, 1, 3), 0);
        assert_eq!(t.ready(1, 7, 0, MIN), None);
        assert_eq!(t.ready(1, 7, 1, MIN), None);
        t.activity(1, 7, 4, 10, 0);
        assert_eq!(t.ready(1, 7, 5, MIN), Some(10));
        assert_eq!(t.ready(1, 7, 4, MIN), None);
    }

    #[test]
    fn a_streams_latest_activity_does_not_pile_up() {
        let mut t = StreamTracker::new(100);
        t.stream_wait(&mark(9, 0, 0), 0);
        for i in 0..50u32 {
            // One activity, then a quiet spell longer than the history kept.
            t.activity(1, 7, i, i64::from(i), i64::from(i) * 1_000);
            t.prune(i64::from(i) * 1_000 + 500);
        }
        assert_eq!(t.len(), 1);
        assert_eq!(t.ready(1, 7, 100, MIN), Some(49));
    }

    /// Work launched before CUPTI's kinds were last switched on may be followed by
    /// work launched while they were off: not used. Its launch decides, not its start
    /// on the GPU (CI once had a GPU running behind start, after a resume, the work
    /// launched before the pause).
    #[test]
    fn history_launched_before_the_kinds_went_back_on_does_not_count() {
        let mut t = StreamTracker::new(10_000);
        t.stream_wait(&mark(9, 0, 0), 0);
        t.launched(1, 100, 0);
        t.activity(1, 7, 1, 900, 0); // launched at 100, ran until 900
        // Kinds on again at 150 (after the launch): unknown, whenever it started.
        assert_eq!(t.ready(1, 7, 5, 150), None);
        // On at 100 or before (or never off): its end holds.
        assert_eq!(t.ready(1, 7, 5, 100), Some(900));
        assert_eq!(t.ready(1, 7, 5, MIN), Some(900));
        // A framework's kernel (call 2, not reported) was launched no earlier than
        // call 1: that bound is used.
        t.activity(1, 7, 2, 950, 0);
        assert_eq!(t.ready(1, 7, 5, 100), Some(950));
        assert_eq!(t.ready(1, 7, 5, 101), None);
        // Nothing reported before it: no bound, so unknown once the kinds were off.
        let mut u = StreamTracker::new(10_000);
        u.stream_wait(&mark(9, 0, 0), 0);
        u.activity(1, 7, 1, 200, 0);
        assert_eq!(u.ready(1, 7, 5, -1_000), None);
        assert_eq!(u.ready(1, 7, 5, MIN), Some(200));
        // Through a wait too: the awaited stream's last work is from before.
        t.launched(3, 300, 0);
        t.event_record(&mark(7, 4, 40), 0);
        t.activity(1, 8, 3, 400, 0);
        t.stream_wait(&mark(8, 6, 40), 0);
        assert_eq!(t.ready(1, 8, 7, 250), Some(400));
        assert_eq!(t.ready(1, 8, 7, 350), None);
    }

    /// A launch stays known as long as the activity it bounds is kept.
    #[test]
    fn prune_keeps_the_launch_of_each_kept_activity() {
        let mut t = StreamTracker::new(100);
        t.stream_wait(&mark(9, 0, 0), 0);
        t.launched(1, 10, 0);
        t.launched(2, 20, 0); // bounds nothing kept: goes
        t.activity(1, 7, 1, 50, 0);
        t.prune(1_000);
        assert_eq!(t.launches.len(), 1);
        assert_eq!(t.ready(1, 7, 5, 10), Some(50));
        assert_eq!(t.ready(1, 7, 5, 11), None);
    }

    /// An op after a long idle: its predecessor stops being the stream's latest when
    /// the op's own kernel arrives, and must outlive that by the history kept.
    #[test]
    fn a_replaced_latest_is_kept_for_the_history_span() {
        let mut t = StreamTracker::new(100);
        t.stream_wait(&mark(9, 0, 0), 0);
        t.activity(1, 7, 1, 10, 0);
        t.prune(5_000); // idle: kept as the latest
        t.activity(1, 7, 5, 6_000, 5_050); // the op's kernel arrives
        t.prune(5_100); // the predecessor was replaced 50 ago: kept
        assert_eq!(t.ready(1, 7, 5, MIN), Some(10));
        t.prune(5_200);
        assert_eq!(t.ready(1, 7, 5, MIN), None, "replaced more than keep_ns ago");
        assert_eq!(t.ready(1, 7, 6, MIN), Some(6_000));
    }

    #[test]
    fn the_four_latest_waits_are_followed() {
        let mut t = StreamTracker::new(10_000);
        // Stream 7 waits on five records; the oldest wait is on the latest work (end 900).
        t.activity(1, 3, 1, 900, 0);
        t.event_record(&mark(3, 2, 1), 0);
        t.stream_wait(&mark(7, 3, 1), 0);
        for i in 0..4u32 {
            t.activity(1, 10 + i, 10 + 10 * i, 100, 0);
            t.event_record(&mark(10 + i, 11 + 10 * i, 10 + u64::from(i)), 0);
            t.stream_wait(&mark(7, 12 + 10 * i, 10 + u64::from(i)), 0);
        }
        assert_eq!(
            t.ready(1, 7, 100, MIN),
            Some(100),
            "only the latest {MAX_WAITS} waits count"
        );
        // Correlation id 0 (no call) is not filed.
        t.activity(1, 7, 0, 5_000, 0);
        assert_eq!(t.ready(1, 7, 100, MIN), Some(100));
    }

    #[test]
    fn correlation_ids_unwrap() {
        let mut t = StreamTracker::new(10_000);
        t.stream_wait(&mark(9, 0, 0), 0);
        t.activity(1, 7, u32::MAX - 5, 1_000, 0);
        t.activity(1, 7, 3, 2_000, 0); // after the wrap
        assert_eq!(t.ready(1, 7, u32::MAX - 1, MIN), Some(1_000));
        assert_eq!(t.ready(1, 7, 10, MIN), Some(2_000));
        assert!(t.corr(10) > t.corr(u32::MAX - 1));
        // An id slightly out of order near the wrap still lands before it.
        assert!(t.corr(u32::MAX - 2) < t.corr(3));
    }
}
