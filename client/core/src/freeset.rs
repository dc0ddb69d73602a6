//! The set of live sampled addresses, so that frees of unsampled blocks cost
//! almost nothing and write nothing to shared memory.
//!
//! ```text
//! summary: [u64; BUCKETS / 64]    one bit per bucket, 4 KiB (one page):
//!                                 set while the bucket may hold an entry;
//!                                 the only thing an unsampled free reads
//! counts: [u8; BUCKETS]           entries + inserts in flight per bucket
//!                                 (bits 0..5, saturating); bit 6 = the
//!                                 summary bit is being cleared; bit 7 =
//!                                 sticky overflow
//! slots:  [[u64; 8]; BUCKETS]     one 64-byte cache line per bucket, 2 MiB,
//!                                 0 = empty; MAP_PRIVATE, so a forked child
//!                                 gets its own copy; faulted in by the
//!                                 watcher thread as a session starts
//!                                 if the daemon asks ([`FreeSet::prefault`];
//!                                 the summary and counts when mapped)
//! bucket(addr) = (addr >> 4) * golden_ratio >> (64 - log2(BUCKETS))
//! ```
//!
//! * `insert` (a sampled allocation, before it is returned): increment the
//!   bucket's count, set its summary bit, then CAS the address into an
//!   empty slot of its line. If all 8 slots are taken, set the bucket's
//!   sticky overflow bit instead.
//! * `free` fast path ([`FreeSet::may_hold`]): load the *filter*, then the
//!   bucket's word of it. The filter is null while no session wants frees
//!   (the free is done after one load), the summary while a session runs,
//!   and a static summary of ones while the set is bypassed; so the hook
//!   never reads the mode. A clear bit means no sampled address hashes
//!   there, and the free is done: two loads. (The word was once a load
//!   from the 32 KiB counts: in `record -i 512k` of 4 threads doing
//!   malloc/free, 69% of the free hook's samples were on that load, and
//!   the counts' 8 pages are 8 TLB entries.)
//! * `free` slow path (bit set): scan the line and CAS the address out, then
//!   decrement the count. Found, or not found in an overflowed bucket: the
//!   free is sent to the daemon (which ignores frees of addresses it does
//!   not know, so the overflow fallback stays exact). Not found otherwise:
//!   another address shares the bucket; nothing is sent.
//!
//! Why the summary never hides a live entry: a remove that takes its
//! bucket's count from 1 to 0 (no overflow) does so by setting the
//! *clearing* bit with the same CAS, clears the summary bit, and only then
//! stores 0; an insert finding the clearing bit waits for that store (two
//! atomic operations away: both run under the thread's guard, so never in
//! a signal handler of the thread holding it). So every insert's summary
//! bit is set after any clearing of it that could precede it, the count is
//! at least 1 while an address is in the set, and a bit is only cleared
//! when the count is 0. An address's bit is set before its `malloc`
//! returns, hence before any `free` of it, and a relaxed load in the
//! freeing thread (which synchronised with the allocating one through the
//! program's own ordering of malloc before free) sees it.
//!
//! The memory is mapped once and never unmapped, so a hook running late on
//! another thread can never touch unmapped memory.
//!
//! A session arms the filter ([`FreeSet::arm`]) before it is published, so
//! a thread that sampled an address had seen the armed filter, and so does
//! any thread that frees the address after it; teardown disarms it.
//! `insert` runs after the sample's record is written, whose stores and the
//! program's own work have usually evicted its three lines: the sample path
//! prefetches them for writing first ([`FreeSet::prefetch_insert`]).
//!
//! When every allocation is sampled (`record -i 1`), the set would filter
//! nothing: a session then *bypasses* it ([`FreeSet::arm`]). No
//! address goes in, and every free of `libc.malloc` is sent, as
//! Perfetto's heapprofd sends them all; the daemon ignores those it does not
//! know (blocks allocated before the session, or by a thread whose context
//! the profile leaves out). The set's atomic read-modify-writes and cache
//! misses were 3.4% of all CPU of `record -i 1` of cc1.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering};

use heapprofd_shmem::prefetch_for_write;

/// What the free hook consults while every free is wanted (the set is
/// bypassed): a summary of ones.
static FILTER_ALL: [AtomicU64; BUCKETS / 64] = [const { AtomicU64::new(u64::MAX) }; BUCKETS / 64];

/// Number of buckets (power of two).
pub const BUCKETS: usize = 1 << 15;
/// Slots per bucket: one cache line of `u64`s.
pub const SLOTS: usize = 8;
const BUCKET_BITS: u32 = BUCKETS.trailing_zeros();
/// Sticky bit in a bucket's count: an insert found the line full.
const OVERFLOW: u8 = 0x80;
/// Bit in a bucket's count: a remove is clearing its summary bit.
const CLEARING: u8 = 0x40;
/// Mask of the count proper.
const COUNT_MASK: u8 = 0x3f;

/// The outcome of [`FreeSet::remove`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The address was in the set and has been removed.
    Found,
    /// Not in the set, but its bucket overflowed: it may be sampled.
    MaybeOverflowed,
    /// Certainly not a sampled address.
    Absent,
}

/// A fixed-size set of addresses in its own anonymous mapping.
///
/// The struct itself is two pointers, so it can be a `static` that the free
/// hook reaches with one RIP-relative load (null until [`FreeSet::map`]).
#[derive(Debug)]
pub struct FreeSet {
    /// The summary the free hook reads ([`FreeSet::may_hold`]): null while
    /// disarmed, the set's summary while armed, a static of ones while
    /// armed and bypassed.
    filter: AtomicPtr<AtomicU64>,
    summary: AtomicPtr<AtomicU64>,
    counts: AtomicPtr<AtomicU8>,
    slots: AtomicPtr<AtomicU64>,
    /// The session sends every free of `libc.malloc` (see the module docs).
    bypass: AtomicBool,
}

const COUNTS_BYTES: usize = BUCKETS;
const SUMMARY_BYTES: usize = BUCKETS / 8;
const SLOTS_BYTES: usize = BUCKETS * SLOTS * 8;
/// The size of a transparent huge page (x86_64, and aarch64 with 4 KiB pages).
const HUGE_PAGE: usize = 2 << 20;

impl Default for FreeSet {
    fn default() -> Self {
        Self::new()
    }
}

impl FreeSet {
    /// An empty, unmapped set: contains nothing, inserts fail.
    pub const fn new() -> FreeSet {
        FreeSet {
            filter: AtomicPtr::new(core::ptr::null_mut()),
            summary: AtomicPtr::new(core::ptr::null_mut()),
            counts: AtomicPtr::new(core::ptr::null_mut()),
            slots: AtomicPtr::new(core::ptr::null_mut()),
            bypass: AtomicBool::new(false),
        }
    }

    /// Whether the set is bypassed: `libc.malloc`'s allocations stay out of
    /// it and all its frees are sent (see [`FreeSet::arm`]).
    #[inline(always)]
    pub fn bypassed(&self) -> bool {
        self.bypass.load(Ordering::Relaxed)
    }

    /// Sets whether the set is `bypassed` and points the free hook's filter
    /// at its summary, or, bypassed, at a summary of ones (every free is
    /// wanted). Call after [`FreeSet::map`], before a session's hooks can
    /// sample: a thread that sampled an address has seen this store (the
    /// session's publication comes after it), so a free of that address
    /// sees it too.
    pub fn arm(&self, bypassed: bool) {
        self.bypass.store(bypassed, Ordering::SeqCst);
        let f = if bypassed {
            FILTER_ALL.as_ptr().cast_mut()
        } else {
            self.summary.load(Ordering::Acquire)
        };
        self.filter.store(f, Ordering::SeqCst);
    }

    /// Takes the free hook's filter away: every free passes straight
    /// through (no session, or one pending).
    pub fn disarm(&self) {
        self.filter.store(core::ptr::null_mut(), Ordering::SeqCst);
    }

    /// The whole cost of an unsampled free: whether `addr` may be an
    /// address a session wants the free of (see [`FreeSet::arm`]). One
    /// load of the filter and, armed, one of its word: no check of the
    /// mode, and a null `addr` may say yes (the slow path checks both).
    #[inline(always)]
    pub fn may_hold(&self, addr: u64) -> bool {
        let b = Self::bucket(addr);
        let f = self.filter.load(Ordering::Relaxed);
        // SAFETY: non-null, the filter points at BUCKETS / 64 words that
        // are never unmapped (a static, or the summary); b / 64 < BUCKETS / 64.
        !f.is_null() && unsafe { &*f.add(b >> 6) }.load(Ordering::Relaxed) & (1u64 << (b & 63)) != 0
    }

    /// Maps the set's memory if not done yet. The mapping is never unmapped.
    /// Call from one thread at a time (the connecting thread).
    pub fn map(&self) -> bool {
        if !self.summary.load(Ordering::Acquire).is_null() {
            return true;
        }
        // The slots are one huge page where the kernel allows it (THP
        // `madvise` or `always`): an insert's slot is a random line of 2
        // MiB, and with 4 KiB pages each one was also a TLB miss (an insert
        // cost 0.55 us, 1.8% of all CPU of `record -i 512k` of 10M
        // malloc/free pairs). So the mapping is made one huge page larger
        // than needed and the slots start at a huge-page boundary.
        let len = HUGE_PAGE + SLOTS_BYTES + COUNTS_BYTES + SUMMARY_BYTES;
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return false;
        }
        let head = (HUGE_PAGE - raw as usize % HUGE_PAGE) % HUGE_PAGE;
        // SAFETY: inside the mapping (head < HUGE_PAGE).
        let base = unsafe { raw.cast::<u8>().add(head) }.cast::<libc::c_void>();
        // SAFETY: unmapping the parts of our own fresh mapping outside
        // [base, base + SLOTS_BYTES + COUNTS_BYTES + SUMMARY_BYTES); advice
        // on the rest.
        // Best effort: a failure leaves memory mapped, never unmapped.
        unsafe {
            if head != 0 {
                libc::munmap(raw, head);
            }
            let tail = HUGE_PAGE - head;
            if tail != 0 {
                libc::munmap(
                    base.cast::<u8>()
                        .add(SLOTS_BYTES + COUNTS_BYTES + SUMMARY_BYTES)
                        .cast(),
                    tail,
                );
            }
            libc::madvise(base, SLOTS_BYTES, libc::MADV_HUGEPAGE);
        }
        // SAFETY: inside the mapping.
        let counts = unsafe { base.cast::<u8>().add(SLOTS_BYTES) }.cast::<AtomicU8>();
        // SAFETY: inside the mapping; page-aligned (SLOTS_BYTES and
        // COUNTS_BYTES are multiples of the page size).
        let summary = unsafe { counts.cast::<u8>().add(COUNTS_BYTES) }.cast::<AtomicU64>();
        // The counts (32 KiB) and the summary (4 KiB, read by every free)
        // are faulted in now; the slots (2 MiB) by the watcher thread
        // ([`FreeSet::prefault`]), or else as sampled addresses reach them.
        // Best effort.
        // SAFETY: advice on the mapping we just made.
        unsafe {
            libc::madvise(
                counts.cast(),
                COUNTS_BYTES + SUMMARY_BYTES,
                libc::MADV_POPULATE_WRITE,
            );
        }
        self.slots.store(base.cast(), Ordering::Release);
        self.counts.store(counts, Ordering::Release);
        // Last: a non-null summary means all of it is mapped.
        self.summary.store(summary, Ordering::Release);
        true
    }

    /// Faults the slots in now (`MADV_POPULATE_WRITE`), so that a
    /// session's first inserts, on the program's threads, do not. The
    /// watcher thread calls it as its session starts, beside the program.
    /// That first touch is the slots' huge page where the kernel gives one:
    /// zeroing 2 MiB took 0.05-0.25 ms alone here, but 17-58 ms in 2 or 3
    /// of 10 runs of `record -i 512k` of a 4-thread program (`perf`:
    /// `clear_page_erms` under an insert; a VM that reports free 2 MiB
    /// blocks to its host). Else it is up to 512 page faults. So a
    /// process has the 2 MiB in whether it samples or not: the watcher
    /// calls this only when the daemon asks
    /// (`ClientConfig::FLAG_PREFAULT_FREE_SET`: `record`, and a service
    /// profile that names its processes; not one of every process, whose
    /// idle processes would each pay twice their ring). Nothing while
    /// unmapped or bypassed (no address goes in); pages already in stay as
    /// they are. Best effort: true if the kernel faulted the slots in
    /// (Linux 5.14+).
    pub fn prefault(&self) -> bool {
        let slots = self.slots.load(Ordering::Acquire);
        if slots.is_null() || self.bypassed() {
            return false;
        }
        // SAFETY: advice on the set's own mapping, which is never unmapped;
        // the contents are not changed (concurrent inserts are unaffected).
        unsafe { libc::madvise(slots.cast(), SLOTS_BYTES, libc::MADV_POPULATE_WRITE) == 0 }
    }

    #[inline(always)]
    fn bucket(addr: u64) -> usize {
        ((addr >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - BUCKET_BITS)) as usize
    }

    /// The bucket's count; `None` while unmapped.
    #[inline(always)]
    fn count(&self, b: usize) -> Option<&AtomicU8> {
        let c = self.counts.load(Ordering::Acquire);
        // SAFETY: non-null means mapped (forever); b < BUCKETS by
        // construction of `bucket`.
        (!c.is_null()).then(|| unsafe { &*c.add(b) })
    }

    /// The summary word of bucket `b` and its bit; `None` while unmapped.
    #[inline(always)]
    fn summary_bit(&self, b: usize) -> Option<(&AtomicU64, u64)> {
        let w = self.summary.load(Ordering::Relaxed);
        // SAFETY: non-null means mapped (forever); b / 64 < BUCKETS / 64.
        (!w.is_null()).then(|| (unsafe { &*w.add(b >> 6) }, 1u64 << (b & 63)))
    }

    /// Slot `i` of bucket `b`. Only called after `count` returned `Some`.
    #[inline(always)]
    fn slot(&self, b: usize, i: usize) -> &AtomicU64 {
        // SAFETY: `slots` is stored before `counts`, so it is mapped when a
        // count was found; b < BUCKETS, i < SLOTS.
        unsafe { &*self.slots.load(Ordering::Acquire).add(b * SLOTS + i) }
    }

    /// Whether `addr` may be in the set: the whole cost of an unsampled free.
    #[inline(always)]
    pub fn may_contain(&self, addr: u64) -> bool {
        self.summary_bit(Self::bucket(addr))
            .is_some_and(|(w, bit)| w.load(Ordering::Relaxed) & bit != 0)
    }

    /// Starts bringing the lines an [`FreeSet::insert`] of `addr` writes
    /// (its count, summary word and slots) into this core's cache, for
    /// writing, so that the insert after a sample's record does not wait
    /// for them. A hint: touches nothing, never faults.
    #[inline(always)]
    pub fn prefetch_insert(&self, addr: u64) {
        let b = Self::bucket(addr);
        // The same lines `insert` finds, found the same way.
        let (Some((word, _)), Some(count)) = (self.summary_bit(b), self.count(b)) else {
            return;
        };
        let slots: *const AtomicU64 = self.slot(b, 0);
        for p in [
            count.as_ptr().cast_const(),
            word.as_ptr().cast_const().cast(),
            slots.cast(),
        ] {
            prefetch_for_write(p);
        }
    }

    /// Adds a sampled address. Returns false if its bucket was full (the
    /// bucket is then marked overflowed and its frees are always reported).
    pub fn insert(&self, addr: u64) -> bool {
        let b = Self::bucket(addr);
        let (Some((word, bit)), Some(count)) = (self.summary_bit(b), self.count(b)) else {
            return false;
        };
        // Saturating increment: a count that cannot grow is an overflow, so
        // the flag bits can never be reached by carrying. A summary bit
        // being cleared is waited for (see the module docs).
        let mut c = count.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            if c & CLEARING != 0 {
                spins += 1;
                if spins % 64 == 0 {
                    // SAFETY: no preconditions.
                    unsafe { libc::sched_yield() };
                } else {
                    core::hint::spin_loop();
                }
                c = count.load(Ordering::Relaxed);
                continue;
            }
            if c & COUNT_MASK == COUNT_MASK {
                // Sticky: the bit is never cleared again. It is set here
                // too, as the inserts counted may still be on their way
                // to setting it.
                count.fetch_or(OVERFLOW, Ordering::SeqCst);
                word.fetch_or(bit, Ordering::SeqCst);
                return false;
            }
            match count.compare_exchange_weak(c, c + 1, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => c = now,
            }
        }
        word.fetch_or(bit, Ordering::SeqCst);
        for i in 0..SLOTS {
            let slot = self.slot(b, i);
            if slot.load(Ordering::Relaxed) == 0
                && slot
                    .compare_exchange(0, addr, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                return true;
            }
        }
        // Overflowed: sticky, so the bit is never cleared again.
        count.fetch_or(OVERFLOW, Ordering::SeqCst);
        self.decrement(count, word, bit);
        false
    }

    /// Takes one off the bucket's count; the last one out of a bucket that
    /// never overflowed clears its summary bit (see the module docs).
    fn decrement(&self, count: &AtomicU8, word: &AtomicU64, bit: u64) {
        let mut c = count.load(Ordering::Relaxed);
        let last = loop {
            let last = c & COUNT_MASK == 1 && c & OVERFLOW == 0;
            let next = if last { CLEARING } else { c - 1 };
            match count.compare_exchange_weak(c, next, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => break last,
                Err(now) => c = now,
            }
        };
        if last {
            word.fetch_and(!bit, Ordering::SeqCst);
            count.store(0, Ordering::SeqCst);
        }
    }

    /// Removes `addr` if present. Call only when [`Self::may_contain`] said so.
    pub fn remove(&self, addr: u64) -> Removal {
        let b = Self::bucket(addr);
        let (Some((word, bit)), Some(count)) = (self.summary_bit(b), self.count(b)) else {
            return Removal::Absent;
        };
        for i in 0..SLOTS {
            let slot = self.slot(b, i);
            if slot.load(Ordering::Relaxed) == addr
                && slot
                    .compare_exchange(addr, 0, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                self.decrement(count, word, bit);
                return Removal::Found;
            }
        }
        if count.load(Ordering::Relaxed) & OVERFLOW != 0 {
            Removal::MaybeOverflowed
        } else {
            Removal::Absent
        }
    }

    /// Empties the set (a new session starts).
    pub fn clear(&self) {
        for b in 0..BUCKETS {
            let (Some((word, _)), Some(count)) = (self.summary_bit(b), self.count(b)) else {
                return;
            };
            if count.load(Ordering::Relaxed) != 0 {
                for i in 0..SLOTS {
                    self.slot(b, i).store(0, Ordering::Relaxed);
                }
                count.store(0, Ordering::Relaxed);
            }
            if b & 63 == 63 {
                word.store(0, Ordering::Relaxed);
            }
        }
        core::sync::atomic::fence(Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of the slots' pages are resident (`mincore`).
    fn resident_slot_pages(set: &FreeSet) -> usize {
        let mut vec = vec![0u8; SLOTS_BYTES / 4096];
        // SAFETY: the slots are mapped (page-aligned) and `vec` has a byte
        // per page.
        let rc = unsafe {
            libc::mincore(
                set.slots.load(Ordering::Relaxed).cast(),
                SLOTS_BYTES,
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// Whether `MADV_POPULATE_WRITE` brings a fresh page in here: not
    /// before Linux 5.14, nor under qemu-user, which accepts the advice and
    /// ignores it (the aarch64 tests run there).
    fn populate_works() -> bool {
        // SAFETY: a fresh private anonymous page of our own, advised,
        // queried and unmapped; nothing else sees it.
        unsafe {
            let p = libc::mmap(
                core::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let mut v = 0u8;
            let works = libc::madvise(p, 4096, libc::MADV_POPULATE_WRITE) == 0
                && libc::mincore(p, 4096, &mut v) == 0
                && v & 1 != 0;
            libc::munmap(p, 4096);
            works
        }
    }

    #[test]
    fn prefault_brings_the_slots_in_unless_bypassed() {
        let set = FreeSet::new();
        assert!(!set.prefault(), "nothing to fault in before the mapping");
        assert!(set.map());
        set.arm(true);
        assert!(!set.prefault(), "a bypassed set holds no address");
        assert_eq!(resident_slot_pages(&set), 0);
        set.arm(false);
        // Nothing inserted yet: with a huge page, one insert would bring
        // all of them in.
        let brought_in = set.prefault();
        if populate_works() {
            assert!(brought_in);
            assert_eq!(resident_slot_pages(&set), SLOTS_BYTES / 4096);
        } else {
            eprintln!("MADV_POPULATE_WRITE has no effect here: residency not checked");
        }
        // An entry survives a later prefault, and the set works as before.
        assert!(set.insert(0x1000));
        let _ = set.prefault();
        assert_eq!(set.remove(0x1000), Removal::Found);
        assert_eq!(set.remove(0x1000), Removal::Absent);
    }

    #[test]
    fn slots_start_at_a_huge_page_boundary_and_every_byte_is_usable() {
        let set = FreeSet::new();
        assert!(set.map());
        let slots = set.slots.load(Ordering::Relaxed) as usize;
        assert_eq!(slots % HUGE_PAGE, 0);
        assert_eq!(
            set.counts.load(Ordering::Relaxed) as usize,
            slots + SLOTS_BYTES
        );
        let summary = set.summary.load(Ordering::Relaxed) as usize;
        assert_eq!(summary, slots + SLOTS_BYTES + COUNTS_BYTES);
        assert_eq!(summary % 4096, 0, "the summary is one page");
        // Its last word is mapped and writable.
        set.summary_bit(BUCKETS - 1)
            .unwrap()
            .0
            .store(u64::MAX, Ordering::Relaxed);
        // The first and last slot and count are mapped and writable.
        for b in [0, BUCKETS - 1] {
            for i in [0, SLOTS - 1] {
                set.slot(b, i).store(1, Ordering::Relaxed);
            }
        }
        set.count(BUCKETS - 1).unwrap().store(1, Ordering::Relaxed);
        set.clear();
        assert!(!set.may_contain(0x7f00_0000_0010));
    }

    #[test]
    fn the_free_hooks_filter_follows_arm_bypass_and_disarm() {
        let set = FreeSet::new();
        let a = 0x7f00_1234_5670u64;
        let other = 0x7f00_0000_0040u64;
        // Unmapped and disarmed: nothing, and arming an unmapped set
        // leaves it so.
        assert!(!set.may_hold(a));
        set.arm(false);
        assert!(!set.may_hold(a));
        assert!(set.map());
        assert!(set.insert(a));
        // Mapped, with an entry, but disarmed: every free passes.
        assert!(set.may_contain(a));
        assert!(!set.may_hold(a));
        // Armed: the summary decides.
        set.arm(false);
        assert!(set.may_hold(a));
        assert!(!set.may_hold(other));
        assert_eq!(set.remove(a), Removal::Found);
        assert!(!set.may_hold(a));
        // Armed and bypassed: every address, null too.
        set.arm(true);
        for p in [a, other, 0, u64::MAX] {
            assert!(set.may_hold(p), "{p:#x}");
        }
        set.disarm();
        for p in [a, other, 0, u64::MAX] {
            assert!(!set.may_hold(p), "{p:#x}");
        }
        set.arm(false);
        assert!(!set.may_hold(other));
    }

    #[test]
    fn prefetching_an_insert_touches_nothing() {
        let set = FreeSet::new();
        // Unmapped: returns without a hint.
        set.prefetch_insert(0x7f00_1234_5670);
        assert!(set.map());
        for a in [0u64, 0x10, 0x7f00_1234_5670, u64::MAX] {
            set.prefetch_insert(a);
            assert!(!set.may_contain(a));
        }
    }

    #[test]
    fn insert_lookup_remove() {
        let set = FreeSet::new();
        assert!(!set.insert(0x1230));
        assert!(!set.may_contain(0x1230));
        assert!(set.map());
        let a = 0x7f00_1234_5670u64;
        assert!(!set.may_contain(a));
        assert!(set.insert(a));
        assert!(set.may_contain(a));
        assert_eq!(set.remove(a), Removal::Found);
        assert!(!set.may_contain(a));
        assert_eq!(set.remove(a), Removal::Absent);
    }

    #[test]
    fn full_bucket_overflows_stickily_and_stays_exact() {
        let set = FreeSet::new();
        assert!(set.map());
        // Find 10 addresses in one bucket.
        let target = FreeSet::bucket(0x1000);
        let same: Vec<u64> = (1u64..)
            .map(|i| 0x1000 + i * 16)
            .filter(|&a| FreeSet::bucket(a) == target)
            .take(10)
            .collect();
        for &a in &same[..SLOTS] {
            assert!(set.insert(a));
        }
        assert!(!set.insert(same[8]));
        // The overflowed address is reported on free, as are the others.
        assert!(set.may_contain(same[8]));
        assert_eq!(set.remove(same[8]), Removal::MaybeOverflowed);
        for &a in &same[..SLOTS] {
            assert_eq!(set.remove(a), Removal::Found);
        }
        // Sticky: even an address never inserted is reported.
        assert!(set.may_contain(same[9]));
        assert_eq!(set.remove(same[9]), Removal::MaybeOverflowed);
        set.clear();
        assert!(!set.may_contain(same[9]));
    }

    /// Addresses that share bucket `target`.
    fn same_bucket(target: usize, n: usize) -> Vec<u64> {
        (1u64..)
            .map(|i| 0x7f00_0000_0000 + i * 16)
            .filter(|&a| FreeSet::bucket(a) == target)
            .take(n)
            .collect()
    }

    #[test]
    fn the_summary_bit_lives_as_long_as_its_bucket_holds_an_entry() {
        let set = FreeSet::new();
        assert!(set.map());
        let same = same_bucket(77, 3);
        let (word, bit) = set.summary_bit(77).unwrap();
        assert!(set.insert(same[0]));
        assert!(set.insert(same[1]));
        assert_ne!(word.load(Ordering::Relaxed) & bit, 0);
        assert_eq!(set.remove(same[0]), Removal::Found);
        // One entry left: still set, and the other address is only a
        // false positive (its free sends nothing).
        assert!(set.may_contain(same[2]));
        assert_eq!(set.remove(same[2]), Removal::Absent);
        assert_eq!(set.remove(same[1]), Removal::Found);
        assert_eq!(word.load(Ordering::Relaxed) & bit, 0);
        assert_eq!(set.count(77).unwrap().load(Ordering::Relaxed), 0);
        // Neighbours in the same word are untouched.
        let other = same_bucket(78, 1)[0];
        assert!(set.insert(other));
        assert!(set.insert(same[0]));
        assert_eq!(set.remove(same[0]), Removal::Found);
        assert!(set.may_contain(other));
    }

    /// Threads inserting and removing in the same few buckets, so that a
    /// bucket's last entry goes and another comes all the time: every
    /// address is seen by `may_contain` from its insert to its remove,
    /// and the buckets end empty with their bits clear.
    #[test]
    fn a_bucket_emptied_while_another_thread_inserts_never_hides_it() {
        let set = std::sync::Arc::new(FreeSet::new());
        assert!(set.map());
        let buckets = [5usize, 6, 700];
        let threads: Vec<_> = (0..4usize)
            .map(|t| {
                let set = set.clone();
                let mine: Vec<u64> = buckets
                    .iter()
                    .flat_map(|&b| same_bucket(b, 8).into_iter().skip(t * 2).take(2))
                    .collect();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        for &a in &mine {
                            if set.insert(a) {
                                assert!(set.may_contain(a), "{a:#x} hidden after its insert");
                                assert_eq!(set.remove(a), Removal::Found);
                            } else {
                                // A full line: overflowed, reported on free.
                                assert!(set.may_contain(a));
                                assert_ne!(set.remove(a), Removal::Absent);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for b in buckets {
            let c = set.count(b).unwrap().load(Ordering::Relaxed);
            assert_eq!(c & (COUNT_MASK | CLEARING), 0, "bucket {b}: count {c:#x}");
            if c & OVERFLOW == 0 {
                let (w, bit) = set.summary_bit(b).unwrap();
                assert_eq!(w.load(Ordering::Relaxed) & bit, 0, "bucket {b}");
            }
        }
    }

    #[test]
    fn concurrent_inserts_and_removes_lose_nothing() {
        let set = std::sync::Arc::new(FreeSet::new());
        assert!(set.map());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let set = set.clone();
                std::thread::spawn(move || {
                    let mut lost = 0;
                    for round in 0..200u64 {
                        let addrs: Vec<u64> = (0..500u64)
                            .map(|i| ((t << 40) | (round << 20) | i) * 16 + 0x10_0000)
                            .collect();
                        let inserted: Vec<bool> = addrs.iter().map(|&a| set.insert(a)).collect();
                        for (&a, &ok) in addrs.iter().zip(&inserted) {
                            assert!(set.may_contain(a));
                            match set.remove(a) {
                                Removal::Found => assert!(ok),
                                Removal::MaybeOverflowed => assert!(!ok),
                                Removal::Absent => lost += 1,
                            }
                        }
                    }
                    lost
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 0);
        }
    }
}
