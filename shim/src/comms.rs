//! Communicators known to this process: identity (comm_id, rank, nranks, device)
//! and the counters that give every op its sequence numbers.
//!
//! Lookups happen on every NCCL call, so the map sits behind an `RwLock` with a
//! per-thread one-entry cache ([`Cache`], kept in the hooks' thread-local) validated
//! by a global epoch (bumped whenever a communicator is added or removed: a freed
//! `ncclComm_t` address can be reused).

use std::cell::{Ref, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, RwLock};

/// One communicator on this rank.
#[derive(Debug)]
pub struct CommState {
    pub comm_id: Option<u64>,
    rank: AtomicI32,
    nranks: AtomicI32,
    device: AtomicI32,
    /// rank, nranks and device all known (they only ever go from unknown to known):
    /// the hot path's check is one load.
    complete: AtomicBool,
    coll_seq: AtomicU64,
    call_seq: AtomicU64,
    /// Per-peer counters, two per rank (send, receive), made when `nranks` is first
    /// known: a Send's or Recv's lookup is one load, its count one atomic add.
    p2p: OnceLock<Box<[AtomicU64]>>,
    /// Counters of peers outside `0..nranks` (an invalid peer NCCL will refuse, or
    /// ops before `nranks` was known).
    p2p_seq: Mutex<HashMap<(bool, i32), u64, BuildHasherDefault<PeerHasher>>>,
    split_index: AtomicU64,
    shrink_index: AtomicU64,
}

const UNKNOWN: i32 = i32::MIN;

/// Set for good when a communicator is first made without its full identity (a
/// non-blocking or deferred initialisation): until then no group's end needs to look
/// for one to complete ([`maybe_incomplete`]).
static EVER_INCOMPLETE: AtomicBool = AtomicBool::new(false);

/// Whether some communicator may lack part of its identity (rank, nranks or device):
/// false while every communicator made so far had all three (one load).
#[inline]
pub fn maybe_incomplete() -> bool {
    EVER_INCOMPLETE.load(Ordering::Relaxed)
}

/// Communicators larger than this count their peers in the map (16 B a rank would
/// be 1 MiB each).
const MAX_COUNTED_RANKS: i32 = 1 << 16;

/// The hasher of the per-peer counters, which every Send/Recv looks up (twice when
/// timing picks it): a (direction, peer) key needs no DoS-resistant SipHash.
#[derive(Default)]
pub struct PeerHasher(u64);

impl Hasher for PeerHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u8(b);
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    fn write_i32(&mut self, v: i32) {
        self.write_u64(u64::from(v as u32));
    }
    fn write_u64(&mut self, v: u64) {
        // FxHash's step: a rotate, an xor and a multiply by an odd constant.
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// Takes the next value of one of a communicator's sequence counters: a load and a
/// store, not a locked read-modify-write, which also waits for the thread's pending
/// stores (the rows it just wrote): docs/PERFORMANCE.md, "Locked instructions".
/// Exact under NCCL's rule that one communicator is never issued operations by
/// several threads at once (its user guide, "Thread Safety": threads take turns,
/// synchronised by the program); a program that breaks it can at worst give two ops
/// one number.
#[inline]
fn take(c: &AtomicU64) -> u64 {
    let v = c.load(Ordering::Relaxed);
    c.store(v.wrapping_add(1), Ordering::Relaxed);
    v
}

fn opt(v: i32) -> Option<i32> {
    (v != UNKNOWN).then_some(v)
}

impl CommState {
    pub fn new(comm_id: Option<u64>, rank: Option<i32>, nranks: Option<i32>, device: Option<i32>) -> Self {
        let complete = rank.is_some() && nranks.is_some() && device.is_some();
        if !complete {
            EVER_INCOMPLETE.store(true, Ordering::Relaxed);
        }
        Self {
            comm_id,
            rank: AtomicI32::new(rank.unwrap_or(UNKNOWN)),
            nranks: AtomicI32::new(nranks.unwrap_or(UNKNOWN)),
            device: AtomicI32::new(device.unwrap_or(UNKNOWN)),
            complete: AtomicBool::new(complete),
            coll_seq: AtomicU64::new(0),
            call_seq: AtomicU64::new(0),
            p2p: OnceLock::new(),
            p2p_seq: Mutex::new(HashMap::default()),
            split_index: AtomicU64::new(0),
            shrink_index: AtomicU64::new(0),
        }
    }
    pub fn rank(&self) -> Option<i32> {
        opt(self.rank.load(Ordering::Relaxed))
    }
    pub fn nranks(&self) -> Option<i32> {
        opt(self.nranks.load(Ordering::Relaxed))
    }
    pub fn device(&self) -> Option<i32> {
        opt(self.device.load(Ordering::Relaxed))
    }
    /// Fills identity fields that were not known at creation (non-blocking init).
    pub fn fill(&self, rank: Option<i32>, nranks: Option<i32>, device: Option<i32>) {
        for (slot, v) in [(&self.rank, rank), (&self.nranks, nranks), (&self.device, device)] {
            if let Some(v) = v {
                let _ = slot.compare_exchange(UNKNOWN, v, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        if self.rank().is_some() && self.nranks().is_some() && self.device().is_some() {
            self.complete.store(true, Ordering::Relaxed);
        }
    }
    #[inline]
    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Relaxed)
    }
    pub fn next_call_seq(&self) -> u64 {
        take(&self.call_seq)
    }
    pub fn next_coll_seq(&self) -> u64 {
        take(&self.coll_seq)
    }
    /// Index of this send to (`send`) or receive from `peer`.
    /// The sequence number the next collective will take (without taking it).
    pub fn peek_coll_seq(&self) -> u64 {
        self.coll_seq.load(Ordering::Relaxed)
    }
    /// The sequence number the next send to (receive from) `peer` will take.
    pub fn peek_p2p_seq(&self, send: bool, peer: i32) -> u64 {
        if let Some(c) = self.p2p_counter(send, peer) {
            return c.load(Ordering::Relaxed);
        }
        let m = self.p2p_seq.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&(send, peer)).copied().unwrap_or(0)
    }
    #[inline(always)]
    pub fn next_p2p_seq(&self, send: bool, peer: i32) -> u64 {
        if let Some(c) = self.p2p_counter(send, peer) {
            return take(c);
        }
        self.next_p2p_seq_mapped(send, peer)
    }
    /// [`next_p2p_seq`](Self::next_p2p_seq) for a peer without its own counter.
    #[cold]
    fn next_p2p_seq_mapped(&self, send: bool, peer: i32) -> u64 {
        let mut m = self.p2p_seq.lock().unwrap_or_else(|p| p.into_inner());
        let c = m.entry((send, peer)).or_insert(0);
        let v = *c;
        *c += 1;
        v
    }
    /// The counter of sends to (receives from) `peer` in `0..nranks`, once `nranks` is
    /// known; continuing from what the map counted before.
    #[inline(always)]
    fn p2p_counter(&self, send: bool, peer: i32) -> Option<&AtomicU64> {
        let n = self.nranks()?;
        if !(0..n).contains(&peer) || n > MAX_COUNTED_RANKS {
            return None;
        }
        let counters = match self.p2p.get() {
            Some(c) => c,
            None => self.p2p_counters(n),
        };
        counters.get(2 * peer as usize + usize::from(!send))
    }
    /// Makes the per-peer counters once `nranks` (`n`) is known.
    #[cold]
    fn p2p_counters(&self, n: i32) -> &[AtomicU64] {
        self.p2p.get_or_init(|| {
            let m = self.p2p_seq.lock().unwrap_or_else(|p| p.into_inner());
            (0..2 * n as usize)
                .map(|i| {
                    let key = (i % 2 == 0, (i / 2) as i32);
                    AtomicU64::new(m.get(&key).copied().unwrap_or(0))
                })
                .collect()
        })
    }
    pub fn next_split_index(&self) -> u64 {
        self.split_index.fetch_add(1, Ordering::Relaxed)
    }
    pub fn next_shrink_index(&self) -> u64 {
        self.shrink_index.fetch_add(1, Ordering::Relaxed)
    }
}

static MAP: LazyLock<RwLock<HashMap<usize, Arc<CommState>>>> = LazyLock::new(|| RwLock::new(HashMap::new()));
static EPOCH: AtomicU64 = AtomicU64::new(1);

/// A thread's last lookup: (address, epoch it was valid at, what it found).
pub struct Cache(RefCell<(usize, u64, Option<Arc<CommState>>)>);

impl Cache {
    pub const fn new() -> Self {
        Self(RefCell::new((0, 0, None)))
    }
}

/// Registers a communicator created at `ptr` (replacing any stale entry).
pub fn insert(ptr: usize, st: Arc<CommState>) {
    let mut m = MAP.write().unwrap_or_else(|p| p.into_inner());
    m.insert(ptr, st);
    EPOCH.fetch_add(1, Ordering::Release);
}

/// Forgets the destroyed communicator `st` at `ptr`; not another one a create on
/// another thread placed at the freed address meanwhile.
pub fn remove(ptr: usize, st: &Arc<CommState>) {
    let mut m = MAP.write().unwrap_or_else(|p| p.into_inner());
    if m.get(&ptr).is_some_and(|cur| Arc::ptr_eq(cur, st)) {
        m.remove(&ptr);
        EPOCH.fetch_add(1, Ordering::Release);
    }
}

/// Makes `cache` hold what the map holds at `ptr` now (looking it up only when the
/// cache was of another address or an older epoch); false when the cache is in use
/// (a lookup re-entered another, or one is lent out): then the map answers.
#[inline(always)]
fn refresh(ptr: usize, cache: &Cache) -> bool {
    let epoch = EPOCH.load(Ordering::Acquire);
    let Ok(mut c) = cache.0.try_borrow_mut() else {
        return false;
    };
    if c.0 != ptr || c.1 != epoch {
        *c = (ptr, epoch, lookup(ptr));
    }
    true
}

/// The communicator at `ptr`, if known, through this thread's `cache`.
#[inline]
pub fn get(ptr: usize, cache: &Cache) -> Option<Arc<CommState>> {
    if ptr == 0 {
        return None;
    }
    if !refresh(ptr, cache) {
        return lookup(ptr);
    }
    cache.0.try_borrow().map_or_else(|_| lookup(ptr), |c| c.2.clone())
}

/// A communicator found for a call: borrowed from the thread's cache (no reference
/// count taken), or held where the cache could not lend it.
pub enum CommRef<'a> {
    Cached(Ref<'a, CommState>),
    Held(Arc<CommState>),
}

impl std::ops::Deref for CommRef<'_> {
    type Target = CommState;
    #[inline(always)]
    fn deref(&self) -> &CommState {
        match self {
            CommRef::Cached(r) => r,
            CommRef::Held(a) => a,
        }
    }
}

/// The communicator at `ptr`, if known, through this thread's `cache`, borrowed from
/// it: the hot path's lookup. A second lookup while the first is held reads the map.
#[inline(always)]
pub fn find(ptr: usize, cache: &Cache) -> Option<CommRef<'_>> {
    if ptr == 0 {
        return None;
    }
    if !refresh(ptr, cache) {
        return lookup(ptr).map(CommRef::Held);
    }
    match cache.0.try_borrow() {
        Ok(c) => Ref::filter_map(c, |c| c.2.as_deref()).ok().map(CommRef::Cached),
        Err(_) => lookup(ptr).map(CommRef::Held),
    }
}

#[cold]
fn lookup(ptr: usize) -> Option<Arc<CommState>> {
    MAP.read().unwrap_or_else(|p| p.into_inner()).get(&ptr).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_is_invalidated_on_reuse() {
        let c = Cache::new();
        let a = Arc::new(CommState::new(Some(1), Some(0), Some(2), None));
        insert(0x1000, Arc::clone(&a));
        assert_eq!(get(0x1000, &c).unwrap().comm_id, Some(1));
        remove(0x1000, &a);
        assert!(get(0x1000, &c).is_none());
        insert(0x1000, Arc::new(CommState::new(Some(2), Some(0), Some(2), None)));
        assert_eq!(get(0x1000, &c).unwrap().comm_id, Some(2));
        // A second thread's cache sees the same map.
        assert_eq!(get(0x1000, &Cache::new()).unwrap().comm_id, Some(2));
    }

    /// The hot path's lookup lends the cached communicator without a reference count
    /// (the count stays what the map and the cache hold); a second lookup while the
    /// first is lent still finds it, and a re-registration at the address is seen.
    #[test]
    fn find_lends_the_cached_communicator_and_sees_a_new_one_at_its_address() {
        let c = Cache::new();
        let a = Arc::new(CommState::new(Some(11), Some(0), Some(2), None));
        insert(0x3000, Arc::clone(&a));
        let first = find(0x3000, &c).unwrap();
        assert!(matches!(first, CommRef::Cached(_)));
        assert_eq!(first.comm_id, Some(11));
        assert_eq!(
            Arc::strong_count(&a),
            3,
            "ours, the map's, the cache's: none per lookup"
        );
        let second = find(0x3000, &c).unwrap();
        assert!(
            matches!(second, CommRef::Held(_)),
            "the cache is lent out: the map answers"
        );
        assert_eq!(second.comm_id, Some(11));
        drop((first, second));
        insert(0x3000, Arc::new(CommState::new(Some(12), Some(0), Some(2), None)));
        assert_eq!(find(0x3000, &c).unwrap().comm_id, Some(12));
        assert!(find(0, &c).is_none());
        assert!(find(0x3008, &c).is_none());
    }

    /// A destroy that finishes after another thread created a communicator at the
    /// freed address leaves the new one registered.
    #[test]
    fn a_destroy_does_not_forget_a_newer_communicator_at_its_address() {
        let old = Arc::new(CommState::new(Some(7), Some(0), Some(2), None));
        insert(0x2000, Arc::clone(&old));
        insert(0x2000, Arc::new(CommState::new(Some(8), Some(0), Some(2), None)));
        remove(0x2000, &old);
        assert_eq!(get(0x2000, &Cache::new()).unwrap().comm_id, Some(8));
    }

    #[test]
    fn p2p_counters_are_per_peer_and_direction() {
        let c = CommState::new(Some(1), Some(0), Some(4), None);
        assert_eq!(c.next_p2p_seq(true, 1), 0);
        assert_eq!(c.next_p2p_seq(true, 1), 1);
        assert_eq!(c.next_p2p_seq(false, 1), 0);
        assert_eq!(c.next_p2p_seq(true, 2), 0);
        c.fill(None, None, Some(3));
        assert_eq!(c.device(), Some(3));
        // Counted before nranks was known, then per peer: one sequence throughout.
        let late = CommState::new(Some(2), Some(0), None, None);
        assert_eq!(late.next_p2p_seq(true, 1), 0);
        assert_eq!(late.next_p2p_seq(false, 3), 0);
        late.fill(None, Some(4), None);
        assert_eq!(late.peek_p2p_seq(true, 1), 1);
        assert_eq!(late.next_p2p_seq(true, 1), 1);
        assert_eq!(late.next_p2p_seq(false, 3), 1);
        assert_eq!(late.next_p2p_seq(false, 1), 0);
        // A peer NCCL will refuse keeps its own count.
        assert_eq!(late.next_p2p_seq(true, 9), 0);
        assert_eq!(late.next_p2p_seq(true, -1), 0);
        assert_eq!(late.peek_p2p_seq(true, 9), 1);
        c.fill(Some(5), None, Some(4));
        assert_eq!((c.rank(), c.device()), (Some(0), Some(3)));
        // Complete once rank, nranks and device are all known, and from then on.
        let d = CommState::new(Some(3), Some(1), None, None);
        assert!(!d.is_complete());
        d.fill(None, Some(2), None);
        assert!(!d.is_complete());
        d.fill(None, None, Some(0));
        assert!(d.is_complete());
        d.fill(Some(7), Some(7), Some(7));
        assert!(d.is_complete() && d.rank() == Some(1));
        assert!(CommState::new(None, Some(0), Some(1), Some(0)).is_complete());
        assert!(maybe_incomplete(), "d was made without its device");
    }
}
