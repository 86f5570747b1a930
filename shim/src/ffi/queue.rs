//! The bounded queue that carries records from NCCL-calling threads to the writer:
//! many producers, one consumer, fixed capacity, never blocks (a full queue refuses
//! the record, which the caller counts as dropped). The algorithm is Dmitry Vyukov's
//! bounded queue: each slot has a sequence number that says whose turn it is.
//!
//! Why not crossbeam's channel, which uses the same algorithm: under a real program's
//! call rate (one NCCL call every few microseconds) the slot a producer writes next
//! was last touched by the writer thread on another core, long ago, and the first
//! load of it missed every cache — about three quarters of the shim's cost per call
//! (`perf annotate` of `host bench N GAP_NS`, docs/PERFORMANCE.md). Here each push
//! ends by prefetching the *next* slot, so that miss is taken in the background while
//! the program computes, not inside the next NCCL call. Slots are cache-line aligned
//! so a record never shares a line with its neighbour; the capacity is rounded up to a
//! power of two.
//!
//! The slots are mapped zeroed and untouched (anonymous `mmap`): the kernel gives a
//! page of them memory only when the ring first reaches it, so making a large queue
//! costs nothing up front. For that, a slot stores its sequence number *minus its
//! index*, which is 0 for every slot of a new queue. During the ring's first round the
//! consumer maps in the 8 MiB ahead of the tail each round (`MADV_POPULATE_WRITE`),
//! so producers that do not outrun it take no page fault, and the mapping asks for
//! huge pages, so those that do take one fault per 2 MiB.
//!
//! Op records can leave a reserve of the slots to others ([`bounded_reserving`]):
//! they compare the tail with a limit computed from the consumer's position, read
//! again only when the tail reaches it, so the check touches no line the consumer
//! keeps writing.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[repr(align(64))]
struct Padded(AtomicUsize);

#[repr(align(64))]
struct Slot<T> {
    /// `pos` when free for the push at `pos`; `pos + 1` once that push wrote it; minus
    /// the slot's index (`pos & mask`), so that a new slot holds 0.
    seq: AtomicUsize,
    val: UnsafeCell<MaybeUninit<T>>,
}

/// The slot array: zeroed pages from an anonymous mapping (all-zero bytes are a valid
/// new slot: sequence 0, no value), or from the allocator when mapping fails; `None`
/// when neither has the memory (an address-space limit): the caller goes without,
/// where the allocator would abort the program.
struct Slots<T> {
    ptr: std::ptr::NonNull<Slot<T>>,
    len: usize,
    mapped: bool,
}

impl<T> Slots<T> {
    fn zeroed(len: usize) -> Option<Self> {
        let layout = std::alloc::Layout::array::<Slot<T>>(len).ok()?;
        // SAFETY: a fresh private anonymous mapping, checked for failure; its pages read
        // as zero until written. MAP_NORESERVE: untouched slots commit no memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED
            && let Some(ptr) = std::ptr::NonNull::new(p.cast::<Slot<T>>())
        {
            // Huge pages where the system allows them (transparent huge pages in
            // `madvise` mode): a first touch of the ring maps in 2 MiB at once, not
            // 4 KiB, so producers that outrun `populate_ahead` take 512 times fewer
            // page faults. Only a hint: without it, 4 KiB pages.
            // SAFETY: the mapping just made, with its length.
            unsafe { libc::madvise(p, layout.size(), libc::MADV_HUGEPAGE) };
            return Some(Self {
                ptr,
                len,
                mapped: true,
            });
        }
        // SAFETY: the layout has a non-zero size (a slot holds at least its sequence).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p.cast::<Slot<T>>())?;
        Some(Self {
            ptr,
            len,
            mapped: false,
        })
    }
}

impl<T> std::ops::Deref for Slots<T> {
    type Target = [Slot<T>];
    fn deref(&self) -> &[Slot<T>] {
        // SAFETY: `len` zeroed slots live at `ptr` until drop; zero bytes are a valid
        // `Slot` (an atomic 0 and an uninitialised value).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        // Values are `Copy` (the queue requires it): nothing to drop but the memory.
        let layout = std::alloc::Layout::array::<Slot<T>>(self.len).expect("as made");
        if self.mapped {
            // SAFETY: the mapping made in `zeroed`, with its size; unmapped once.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), layout.size()) };
        } else {
            // SAFETY: allocated in `zeroed` with this layout; freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
        }
    }
}

struct Inner<T> {
    /// Next position to push (shared by producers).
    tail: Padded,
    /// Next position to pop (written by the consumer only).
    head: Padded,
    /// Positions below this may take a push that leaves the reserve free
    /// (a push with `leave_reserve`, [`Producer::try_push_all`]): `head + capacity - reserve` for some
    /// past `head`, renewed when the tail reaches it (rarely: read-mostly).
    limit: Padded,
    slots: Slots<T>,
    mask: usize,
    reserve: usize,
    /// Slots from index 0 whose memory is mapped in (the consumer maps in those ahead
    /// of the tail, so producers do not take the page faults; all of them once the
    /// ring has gone round).
    populated: AtomicUsize,
}

/// The most slots a batch push prefetches for the next one.
const PREFETCH_BATCH: usize = 8;

/// Memory of slots mapped in ahead of the tail.
const POPULATE_AHEAD_BYTES: usize = 8 << 20;

// SAFETY: a slot's value is written only by the producer that won its position (the
// compare-and-swap on `tail`) and read only by the single consumer after the
// producer's release store of `seq`; T is Copy + Send, so moving it between threads
// is sound and nothing needs dropping.
unsafe impl<T: Copy + Send> Sync for Inner<T> {}
// SAFETY: as above.
unsafe impl<T: Copy + Send> Send for Inner<T> {}

impl<T> Inner<T> {
    /// The slot at `pos` and its sequence number.
    #[inline]
    fn slot(&self, pos: usize) -> (&Slot<T>, usize) {
        let idx = pos & self.mask;
        let slot = &self.slots[idx];
        (slot, slot.seq.load(Ordering::Acquire).wrapping_add(idx))
    }

    /// Whether a push at `last` (a batch's last position) leaves the reserve free. Reads
    /// the consumer's position only when `last` reaches the last limit it gave.
    #[inline]
    fn leaves_reserve(&self, last: usize) -> bool {
        if (last.wrapping_sub(self.limit.0.load(Ordering::Relaxed)) as isize) < 0 {
            return true;
        }
        let limit = self
            .head
            .0
            .load(Ordering::Acquire)
            .wrapping_add(self.mask + 1 - self.reserve);
        if last.wrapping_sub(limit) as isize >= 0 {
            return false;
        }
        self.limit.0.store(limit, Ordering::Relaxed);
        true
    }

    /// Sets the sequence number of the slot at `pos`.
    #[inline]
    fn set_seq(&self, slot: &Slot<T>, pos: usize, seq: usize) {
        slot.seq
            .store(seq.wrapping_sub(pos & self.mask), Ordering::Release);
    }
}

/// The sending side (cloneable, shared by every producing thread).
pub struct Producer<T>(Arc<Inner<T>>);

impl<T> Clone for Producer<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

/// The receiving side: one, used by one thread at a time (`!Sync`, not `Clone`).
pub struct Consumer<T> {
    q: Arc<Inner<T>>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

/// A queue of at least `capacity` slots (rounded up to a power of two, at least 2);
/// `None` when there is no memory for it.
pub fn bounded<T: Copy + Send>(capacity: usize) -> Option<(Producer<T>, Consumer<T>)> {
    bounded_reserving(capacity, 0)
}

/// As [`bounded`], keeping `reserve` slots (less than the capacity) for the records
/// pushed with [`Producer::try_push`] when those pushed with
/// [`Producer::try_push_all`] leaving the reserve fill the rest.
pub fn bounded_reserving<T: Copy + Send>(
    capacity: usize,
    reserve: usize,
) -> Option<(Producer<T>, Consumer<T>)> {
    let cap = capacity.max(2).next_power_of_two();
    let reserve = reserve.min(cap - 1);
    let slots = Slots::zeroed(cap)?;
    let populated = if slots.mapped { 0 } else { cap };
    let q = Arc::new(Inner {
        tail: Padded(AtomicUsize::new(0)),
        head: Padded(AtomicUsize::new(0)),
        limit: Padded(AtomicUsize::new(cap - reserve)),
        slots,
        mask: cap - 1,
        reserve,
        populated: AtomicUsize::new(populated),
    });
    q.populate_ahead(0);
    Some((
        Producer(Arc::clone(&q)),
        Consumer {
            q,
            _not_sync: PhantomData,
        },
    ))
}

impl<T: Copy + Send> Inner<T> {
    /// Records queued, from a consistent snapshot: None when a push moved the tail
    /// while the positions were read (the caller skips its check rather than spin).
    /// Reading head between two equal reads of tail gives head <= tail.
    fn len(&self) -> Option<usize> {
        let tail = self.tail.0.load(Ordering::Acquire);
        let head = self.head.0.load(Ordering::Acquire);
        (self.tail.0.load(Ordering::Acquire) == tail).then(|| tail.wrapping_sub(head))
    }

    /// Maps in the memory of the slots up to [`POPULATE_AHEAD_BYTES`] past the
    /// position `tail` (during the ring's first round; the consumer's thread, or the
    /// one making the queue). `MADV_POPULATE_WRITE`, else a write of no change to one
    /// slot per page.
    fn populate_ahead(&self, tail: usize) {
        let len = self.mask + 1;
        let from = self.populated.load(Ordering::Relaxed);
        if from >= len {
            return;
        }
        let size = size_of::<Slot<T>>();
        let to = tail.saturating_add(POPULATE_AHEAD_BYTES / size).min(len);
        if to <= from {
            return;
        }
        const PAGE: usize = 4096;
        let base = self.slots.ptr.as_ptr().cast::<u8>();
        let start = from * size / PAGE * PAGE;
        let end = (to * size).div_ceil(PAGE) * PAGE;
        // SAFETY: a page-aligned range inside the slots' own mapping (whole pages:
        // the mapping's length is rounded up to pages); populating changes no byte.
        let done =
            unsafe { libc::madvise(base.add(start).cast(), end - start, libc::MADV_POPULATE_WRITE) == 0 };
        if !done {
            for i in (from..to).step_by((PAGE / size).max(1)) {
                self.slots[i].seq.fetch_add(0, Ordering::Relaxed);
            }
        }
        self.populated.store(to, Ordering::Relaxed);
    }

    /// Asks the CPU to bring the slot at `pos` into this core's cache, to be written,
    /// before the next push writes it: `prefetchw`, so the line arrives owned and the
    /// push's stores need no upgrade from the shared state, in which a read prefetch
    /// would bring a line the writer thread read. (`_mm_prefetch` emits `prefetchw`
    /// only with the `prfchw` target feature, which the x86-64 baseline lacks; the
    /// instruction is a no-op hint where a CPU does not implement it.)
    #[inline]
    fn prefetch(&self, pos: usize) {
        let slot: *const Slot<T> = &self.slots[pos & self.mask];
        #[cfg(target_arch = "x86_64")]
        {
            let base = slot.cast::<u8>();
            for off in (0..size_of::<Slot<T>>()).step_by(64) {
                // SAFETY: a prefetch is a hint that never faults and writes nothing;
                // the address lies inside the slot array.
                unsafe {
                    std::arch::asm!(
                        "prefetchw [{p}]",
                        p = in(reg) base.wrapping_add(off),
                        options(nostack, preserves_flags, readonly)
                    )
                };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }
}

impl<T: Copy + Send> Producer<T> {
    /// Appends `v` and returns its position (0, 1, 2, ... over the queue's life), or
    /// gives it back when the queue is full. Never blocks.
    #[inline]
    pub fn try_push(&self, v: T) -> Result<usize, T> {
        self.try_push_all(std::slice::from_ref(&v), false).map_err(|()| v)
    }

    /// Appends the records of `vs` at consecutive positions with one reservation (a
    /// group's rows: one compare-and-swap where each record would take its own), and
    /// returns the first position; or takes none of them when the queue has no room
    /// for all (with `leave_reserve`, for all and the queue's reserve of slots
    /// ([`bounded_reserving`]), so that records pushed without it still find room;
    /// producers racing each other can each pass that check once, so the reserve is
    /// kept to within their number). More records than the capacity never fit.
    /// Between the reservation and the last publication nothing can fail: the
    /// consumer waits at an unpublished slot, so no slot is ever left claimed.
    #[inline(always)]
    pub fn try_push_all(&self, vs: &[T], leave_reserve: bool) -> Result<usize, ()> {
        // `i < vs.len()` for every index asked: the indexing cannot panic.
        self.try_push_with(vs.len(), leave_reserve, |i| vs[i])
    }

    /// As [`try_push_all`](Self::try_push_all), for `n` records that `make(i)` builds
    /// straight into their slots, in order (`i` in `0..n`, each once): a record made
    /// from the caller's own state is then written once, not built and copied. `make`
    /// runs between the reservation and the publication, so it must not panic: a
    /// panic there would leave its slot claimed and the consumer waiting at it.
    #[inline(always)]
    pub fn try_push_with(
        &self,
        n: usize,
        leave_reserve: bool,
        mut make: impl FnMut(usize) -> T,
    ) -> Result<usize, ()> {
        let q = &*self.0;
        if n == 0 {
            return Ok(q.tail.0.load(Ordering::Relaxed));
        }
        if n > q.mask + 1 {
            return Err(());
        }
        if leave_reserve
            && q.reserve > 0
            && !q.leaves_reserve(q.tail.0.load(Ordering::Relaxed).wrapping_add(n - 1))
        {
            return Err(());
        }
        let mut pos = q.tail.0.load(Ordering::Relaxed);
        loop {
            // The consumer frees slots in order: the last one free for its position
            // means every slot before it is free for its own.
            let last = pos.wrapping_add(n - 1);
            let (_, seq) = q.slot(last);
            let dif = seq.wrapping_sub(last) as isize;
            if dif == 0 {
                match q.tail.0.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(n),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        for i in 0..n {
                            let at = pos.wrapping_add(i);
                            let (slot, _) = q.slot(at);
                            // SAFETY: winning the CAS for `pos..pos + n` gives this
                            // thread sole access to those slots until each store below
                            // publishes one.
                            unsafe { (*slot.val.get()).write(make(i)) };
                            q.set_seq(slot, at, at.wrapping_add(1));
                        }
                        // The next group of the same size finds its slots in this
                        // core's cache (a few, however large this one was).
                        for i in 0..n.min(PREFETCH_BATCH) {
                            q.prefetch(pos.wrapping_add(n + i));
                        }
                        return Ok(pos);
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return Err(()); // the consumer has not freed the last slot yet: full
            } else {
                pos = q.tail.0.load(Ordering::Relaxed); // another producer took it
            }
        }
    }

    /// Records in the queue (a snapshot; reads the consumer's position too); None when
    /// a concurrent push made the snapshot inconsistent.
    pub fn len(&self) -> Option<usize> {
        self.0.len()
    }

    /// Slots: the capacity asked for, rounded up to a power of two.
    pub fn capacity(&self) -> usize {
        self.0.mask + 1
    }
}

impl<T: Copy + Send> Consumer<T> {
    /// Takes the oldest record, if its producer has finished writing it.
    pub fn try_pop(&self) -> Option<T> {
        let q = &*self.q;
        let pos = q.head.0.load(Ordering::Relaxed);
        let (slot, seq) = q.slot(pos);
        if seq != pos.wrapping_add(1) {
            return None;
        }
        // SAFETY: seq == pos + 1 means the producer of `pos` wrote the value and
        // released it; only this (single) consumer reads it, once.
        let v = unsafe { (*slot.val.get()).assume_init_read() };
        q.set_seq(slot, pos, pos.wrapping_add(q.mask + 1));
        q.head.0.store(pos.wrapping_add(1), Ordering::Release);
        Some(v)
    }

    /// Whether the queue held no record at the moment of the snapshot (exact from
    /// the consumer: no push can make a record disappear).
    pub fn is_empty(&self) -> bool {
        let q = &*self.q;
        q.tail.0.load(Ordering::Acquire) == q.head.0.load(Ordering::Relaxed)
    }
}

impl<T: Copy + Send> Consumer<T> {
    /// Maps in the memory of the slots the producers will write next (during the
    /// ring's first round), so that they do not take those page faults.
    pub fn populate(&self) {
        let q = &*self.q;
        q.populate_ahead(q.tail.0.load(Ordering::Relaxed));
    }
}

impl<T: Copy + Send> zcta::sink::RecordSource<T> for Consumer<T> {
    fn next(&self) -> Option<T> {
        self.try_pop()
    }
    fn maintain(&self) {
        self.populate();
    }
    fn is_empty(&self) -> bool {
        Consumer::is_empty(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_full_and_wrap_around() {
        let (p, c) = bounded::<u64>(3).unwrap(); // rounded up to 4
        for round in 0..1000u64 {
            for i in 0..4 {
                assert_eq!(p.try_push(round * 4 + i), Ok((round * 4 + i) as usize));
            }
            assert_eq!(p.try_push(99), Err(99), "full at 4");
            assert_eq!((p.len(), p.capacity()), (Some(4), 4));
            for i in 0..4 {
                assert_eq!(c.try_pop(), Some(round * 4 + i));
            }
            assert_eq!(c.try_pop(), None);
            assert!(c.is_empty() && p.len() == Some(0));
        }
    }

    #[test]
    fn a_reserve_stays_for_the_records_that_may_use_it() {
        let (p, c) = bounded_reserving::<u64>(8, 2).unwrap();
        for round in 0..100u64 {
            for i in 0..6 {
                assert!(p.try_push_all(&[round * 10 + i], true).is_ok(), "{round} {i}");
            }
            assert_eq!(p.try_push_all(&[99], true), Err(()), "6 of 8 used: 2 stay free");
            assert!(p.try_push(round * 10 + 6).is_ok());
            assert!(p.try_push(round * 10 + 7).is_ok());
            assert_eq!(p.try_push(99), Err(99));
            for i in 0..8 {
                assert_eq!(c.try_pop(), Some(round * 10 + i));
            }
        }
        // One taken from a full queue makes room for one with the reserve kept.
        for i in 0..8 {
            assert!(p.try_push(i).is_ok());
        }
        for _ in 0..3 {
            c.try_pop();
        }
        assert!(p.try_push_all(&[8], true).is_ok());
        assert_eq!(p.try_push_all(&[9], true), Err(()));
    }

    /// `threads` producers, the t-th pushing its items 0..`each` with `push(p, t, i)`,
    /// each retried while the queue refuses it.
    fn producers(
        p: &Producer<(u64, u64)>,
        threads: u64,
        each: u64,
        push: fn(&Producer<(u64, u64)>, u64, u64) -> bool,
    ) -> Vec<std::thread::JoinHandle<()>> {
        (0..threads)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut i = 0;
                    while i < each {
                        if push(&p, t, i) {
                            i += 1;
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect()
    }

    #[test]
    fn a_batch_takes_consecutive_slots_or_none() {
        let (p, c) = bounded_reserving::<u64>(8, 2).unwrap();
        for round in 0..100u64 {
            let b = round * 10;
            assert_eq!(p.try_push_all(&[b, b + 1, b + 2], true), Ok(round as usize * 8));
            assert!(p.try_push(b + 3).is_ok());
            // 4 used, 2 kept in reserve: 3 more do not fit, 2 do.
            assert_eq!(p.try_push_all(&[99, 99, 99], true), Err(()));
            assert!(p.try_push_all(&[b + 4, b + 5], true).is_ok());
            assert_eq!(p.try_push_all(&[99, 99, 99], false), Err(()), "only 2 free");
            assert!(p.try_push_all(&[b + 6, b + 7], false).is_ok());
            assert_eq!(p.try_push_all(&[99], false), Err(()), "full");
            for i in 0..8 {
                assert_eq!(c.try_pop(), Some(b + i));
            }
            assert_eq!(c.try_pop(), None);
        }
        assert_eq!(p.try_push_all(&[0; 9], false), Err(()), "larger than the queue");
        assert!(p.try_push_all(&[], true).is_ok());
        assert!(c.is_empty());
    }

    #[test]
    fn records_built_in_their_slots_come_out_in_order_and_a_refused_batch_builds_none() {
        let (p, c) = bounded_reserving::<u64>(8, 2).unwrap();
        let mut asked = Vec::new();
        assert_eq!(
            p.try_push_with(4, true, |i| {
                asked.push(i);
                100 + i as u64
            }),
            Ok(0)
        );
        assert_eq!(asked, [0, 1, 2, 3]);
        // 4 used, 2 kept in reserve: 3 more do not fit, and nothing is built for them.
        let mut built = 0;
        assert_eq!(
            p.try_push_with(3, true, |_| {
                built += 1;
                0
            }),
            Err(())
        );
        assert_eq!(built, 0);
        for i in 0..4 {
            assert_eq!(c.try_pop(), Some(100 + i));
        }
        assert_eq!(c.try_pop(), None);
    }

    #[test]
    fn batches_from_many_producers_stay_whole_and_in_order() {
        const PRODUCERS: u64 = 4;
        const BATCHES: u64 = 50_000;
        let (p, c) = bounded::<(u64, u64)>(256).unwrap();
        let handles = producers(&p, PRODUCERS, BATCHES, |p, t, i| {
            let batch: Vec<_> = (0..1 + (i % 3)).map(|k| (t, i * 4 + k)).collect();
            p.try_push_all(&batch, false).is_ok()
        });
        let mut next = [0u64; PRODUCERS as usize];
        let mut got = 0;
        while got < PRODUCERS * BATCHES {
            let Some((t, v)) = c.try_pop() else {
                std::hint::spin_loop();
                continue;
            };
            let (i, k) = (v / 4, v % 4);
            assert_eq!((i, k), (next[t as usize], 0), "producer {t}: a batch starts");
            for k in 1..=(i % 3) {
                let got = loop {
                    if let Some(x) = c.try_pop() {
                        break x;
                    }
                };
                assert_eq!(got, (t, i * 4 + k), "a batch's records are consecutive");
            }
            next[t as usize] += 1;
            got += 1;
        }
        for h in handles {
            h.join().unwrap();
        }
        assert!(next.iter().all(|&n| n == BATCHES));
    }

    #[test]
    fn populating_ahead_keeps_every_record() {
        let (p, c) = bounded::<[u64; 8]>(1 << 20).unwrap(); // 64 MiB of slots
        for i in 0..(3u64 << 20) {
            if i % 1000 == 0 {
                c.populate();
            }
            assert!(p.try_push([i; 8]).is_ok());
            assert_eq!(c.try_pop(), Some([i; 8]));
        }
    }

    #[test]
    fn many_producers_lose_nothing_and_keep_each_ones_order() {
        const PRODUCERS: u64 = 4;
        const EACH: u64 = 200_000;
        let (p, c) = bounded::<(u64, u64)>(256).unwrap();
        let handles = producers(&p, PRODUCERS, EACH, |p, t, i| p.try_push((t, i)).is_ok());
        let mut next = [0u64; PRODUCERS as usize];
        let mut got = 0;
        while got < PRODUCERS * EACH {
            match c.try_pop() {
                Some((t, i)) => {
                    assert_eq!(i, next[t as usize], "producer {t} out of order");
                    next[t as usize] += 1;
                    got += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(c.try_pop(), None);
        assert!(next.iter().all(|&n| n == EACH));
    }

    /// The memory a queue slot costs once the ring has reached it (the figure the
    /// settings' documentation gives per `ZCTA_QUEUE_CAPACITY` slot: one record slot
    /// plus half a plugin slot).
    #[test]
    fn slot_sizes() {
        use zcta::record::{Event, PluginEvent};
        assert_eq!(size_of::<Slot<Event>>(), 256);
        assert_eq!(size_of::<Slot<PluginEvent>>(), 384);
    }

    #[test]
    fn a_large_queue_is_mapped_untouched() {
        let (p, c) = bounded::<[u8; 192]>(1 << 22).unwrap(); // 1 GiB of slots
        assert_eq!(p.capacity(), 1 << 22);
        for round in 0..3u8 {
            assert!(p.try_push([round; 192]).is_ok());
            assert_eq!(c.try_pop(), Some([round; 192]));
        }
        assert!(c.is_empty());
    }

    #[test]
    fn slots_are_whole_cache_lines() {
        assert_eq!(align_of::<Slot<u8>>(), 64);
        assert_eq!(size_of::<Slot<[u8; 208]>>() % 64, 0);
    }
}
