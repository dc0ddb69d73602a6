//! Custom heaps: the state behind Perfetto's custom allocator API
//! (`AHeapInfo_*`, `AHeapProfile_*`), which a front-end exports.
//!
//! A program with its own allocator (a pool, an arena, a GC heap) creates
//! a named heap, registers it, and reports each allocation and free of it
//! by an id of its choosing (usually the address). Each heap gets its own
//! sampler with the interval the session's configuration gives its name
//! (`ClientConfig::interval_for`: listed, else `all_heaps`' default, else
//! not sampled), and its records carry its id (1..=256; 0 is libc.malloc).
//!
//! ```text
//! SLOTS[256]  one 64-byte-aligned HeapInfo per created heap (never freed)
//!   name, callbacks        written by create/set*, read after `registered`
//!   enabled                mode word of the session it records for (0 none)
//!   lock + sampler         the heap's sampler, shared by every thread
//! ```
//!
//! * **Enabling.** When a session starts ([`session_started`]) and when a
//!   heap is registered during one ([`register`]), the heap's interval is
//!   looked up; if it is sampled, a `HeapNameRecord` (id, interval, name)
//!   goes into the ring *before* `enabled` is set, so the daemon meets the
//!   declaration before any record of the heap. Then the heap's enabled
//!   callback runs. [`session_ended`] (the watcher, the detach entry) and
//!   [`at_exit`] clear `enabled` and run the disabled callbacks. Callbacks
//!   run with the reentrancy guard held: what they allocate passes through
//!   the hooks unrecorded, and their own reports are no-ops.
//! * **Reporting.** `report_*` first load the global mode word and the
//!   heap's `enabled` (the cheap no-op when no session records the heap);
//!   then under the guard (a signal handler interrupting a report on the
//!   same thread passes through, so the heap's spin lock cannot deadlock)
//!   they run the sampler and write the record like a sampled malloc. The
//!   free set holds sampled custom ids too, under an odd key mixed from
//!   (heap, id) that can never equal a malloc address (those are at least
//!   8-aligned), so a free of an unsampled id writes nothing.
//! * Nothing here allocates: the slots are static, records are built on
//!   the stack.

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use heapprofd_proto::wire::{self, HEAP_NAME_LEN};

use crate::freeset::Removal;
use crate::sampler::{Sampler, mix64};
use crate::session::{self, Session};
use crate::state::{free_set, mode};
use crate::tls::Guard;

/// Heaps a process may create.
pub const MAX_HEAPS: usize = wire::MAX_CUSTOM_HEAPS as usize;

/// What an enabled callback is told (Perfetto's
/// `AHeapProfileEnableCallbackInfo`).
#[repr(C)]
#[derive(Debug)]
pub struct EnableInfo {
    /// Mean bytes between samples of the heap in this session.
    pub sampling_interval: u64,
}

/// What a disabled callback is told (Perfetto's
/// `AHeapProfileDisableCallbackInfo`; nothing yet).
#[repr(C)]
#[derive(Debug)]
pub struct DisableInfo {
    _reserved: u64,
}

/// `void (*)(void *data, const AHeapProfileEnableCallbackInfo *info)`.
pub type EnabledCallback = unsafe extern "C" fn(*mut c_void, *const EnableInfo);
/// `void (*)(void *data, const AHeapProfileDisableCallbackInfo *info)`.
pub type DisabledCallback = unsafe extern "C" fn(*mut c_void, *const DisableInfo);

/// One heap (the `AHeapInfo` the C API hands out).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct HeapInfo {
    name: UnsafeCell<[u8; HEAP_NAME_LEN]>,
    enabled_cb: AtomicUsize,
    enabled_data: AtomicUsize,
    disabled_cb: AtomicUsize,
    disabled_data: AtomicUsize,
    registered: AtomicBool,
    lock: AtomicBool,
    enabled: AtomicU64,
    sampler: UnsafeCell<Sampler>,
}

// SAFETY: `name` is written only by the creator before `registered` is
// published (Release) and read after it is seen (Acquire); `sampler` only
// under `lock`.
unsafe impl Sync for HeapInfo {}

impl HeapInfo {
    const fn new() -> HeapInfo {
        HeapInfo {
            name: UnsafeCell::new([0; HEAP_NAME_LEN]),
            enabled_cb: AtomicUsize::new(0),
            enabled_data: AtomicUsize::new(0),
            disabled_cb: AtomicUsize::new(0),
            disabled_data: AtomicUsize::new(0),
            registered: AtomicBool::new(false),
            lock: AtomicBool::new(false),
            enabled: AtomicU64::new(0),
            sampler: UnsafeCell::new(Sampler::disabled()),
        }
    }

    fn name(&self) -> &[u8; HEAP_NAME_LEN] {
        // SAFETY: only read once `registered` was seen (see the Sync impl).
        unsafe { &*self.name.get() }
    }

    fn lock(&self) {
        let mut spins = 0u32;
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                // SAFETY: no preconditions; async-signal-safe.
                unsafe { libc::sched_yield() };
            } else {
                core::hint::spin_loop();
            }
        }
    }

    fn unlock(&self) {
        self.lock.store(false, Ordering::Release);
    }
}

static SLOTS: [HeapInfo; MAX_HEAPS] = [const { HeapInfo::new() }; MAX_HEAPS];
/// Slots handed out by [`create`].
static CREATED: AtomicU32 = AtomicU32::new(0);

/// The heap with id `id` (1..=256), if it was registered.
#[inline(always)]
fn registered(id: u32) -> Option<&'static HeapInfo> {
    let slot = SLOTS.get((id as usize).wrapping_sub(1))?;
    slot.registered.load(Ordering::Acquire).then_some(slot)
}

/// The id of a slot pointer handed out by [`create`], if it is one.
fn id_of(info: *const HeapInfo) -> Option<u32> {
    let base = SLOTS.as_ptr() as usize;
    let off = (info as usize).checked_sub(base)?;
    let i = off / core::mem::size_of::<HeapInfo>();
    (off % core::mem::size_of::<HeapInfo>() == 0 && i < MAX_HEAPS).then_some(i as u32 + 1)
}

/// `AHeapInfo_create`: a new heap called `name` (1 to 63 bytes, no NUL),
/// or null when the name does not fit or 256 heaps exist.
pub fn create(name: &[u8]) -> *mut HeapInfo {
    if name.is_empty() || name.len() > wire::MAX_CUSTOM_HEAP_NAME || name.contains(&0) {
        return core::ptr::null_mut();
    }
    let Ok(i) = CREATED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        ((n as usize) < MAX_HEAPS).then_some(n + 1)
    }) else {
        return core::ptr::null_mut();
    };
    let slot = &SLOTS[i as usize];
    // SAFETY: the slot was just handed to us alone; nobody reads its name
    // before it is registered.
    unsafe { (&mut *slot.name.get())[..name.len()].copy_from_slice(name) };
    slot as *const HeapInfo as *mut HeapInfo
}

/// `AHeapInfo_setEnabledCallback`. Returns `info` (null if it is not a heap).
pub fn set_enabled_callback(
    info: *mut HeapInfo,
    cb: Option<EnabledCallback>,
    data: *mut c_void,
) -> *mut HeapInfo {
    let Some(id) = id_of(info) else {
        return core::ptr::null_mut();
    };
    let slot = &SLOTS[id as usize - 1];
    slot.enabled_data.store(data as usize, Ordering::Relaxed);
    slot.enabled_cb
        .store(cb.map_or(0, |f| f as usize), Ordering::Release);
    info
}

/// `AHeapInfo_setDisabledCallback`. Returns `info` (null if it is not a heap).
pub fn set_disabled_callback(
    info: *mut HeapInfo,
    cb: Option<DisabledCallback>,
    data: *mut c_void,
) -> *mut HeapInfo {
    let Some(id) = id_of(info) else {
        return core::ptr::null_mut();
    };
    let slot = &SLOTS[id as usize - 1];
    slot.disabled_data.store(data as usize, Ordering::Relaxed);
    slot.disabled_cb
        .store(cb.map_or(0, |f| f as usize), Ordering::Release);
    info
}

/// `AHeapProfile_registerHeap`: the heap's id (from 1), 0 if `info` is not
/// a heap. A session already running starts recording it.
pub fn register(info: *mut HeapInfo) -> u32 {
    let Some(id) = id_of(info) else { return 0 };
    let slot = &SLOTS[id as usize - 1];
    if slot.registered.swap(true, Ordering::AcqRel) {
        return id;
    }
    let _g = Guard::enter();
    let m = mode().load(Ordering::Acquire);
    if m >= 2
        && let Some(s) = session::acquire(m)
    {
        enable(slot, id, s);
        session::release(s);
    }
    id
}

/// A session became active: every registered heap its configuration
/// samples is declared and enabled. `s` is held by the caller.
pub(crate) fn session_started(s: &Session) {
    let n = (CREATED.load(Ordering::Acquire) as usize).min(MAX_HEAPS);
    for (i, slot) in SLOTS[..n].iter().enumerate() {
        if slot.registered.load(Ordering::Acquire) {
            enable(slot, i as u32 + 1, s);
        }
    }
}

fn enable(slot: &HeapInfo, id: u32, s: &Session) {
    let interval = s.heap_interval(slot.name());
    if interval == 0 {
        return;
    }
    slot.lock();
    if slot.enabled.load(Ordering::Relaxed) == s.mode_word {
        slot.unlock();
        return;
    }
    let seed = mix64(s.seed_base ^ mix64(0x4845_4150_0000_0000 | u64::from(id)));
    // SAFETY: under the heap's lock.
    unsafe { *slot.sampler.get() = Sampler::new(interval, seed) };
    let declared = s.record_heap_name(id, interval, slot.name());
    if declared {
        slot.enabled.store(s.mode_word, Ordering::Release);
    }
    slot.unlock();
    if !declared {
        return;
    }
    let cb = slot.enabled_cb.load(Ordering::Acquire);
    if cb != 0 {
        let info = EnableInfo {
            sampling_interval: interval,
        };
        // SAFETY: `cb` was stored from an `EnabledCallback`; the program
        // promised it may be called with its data at any time.
        unsafe {
            let f: EnabledCallback = core::mem::transmute::<usize, EnabledCallback>(cb);
            f(
                slot.enabled_data.load(Ordering::Relaxed) as *mut c_void,
                &info,
            );
        }
    }
}

/// The session with mode word `mode_word` ended: its heaps are disabled and
/// their disabled callbacks run.
pub fn session_ended(mode_word: u64) {
    if mode_word < 2 {
        return;
    }
    let n = (CREATED.load(Ordering::Acquire) as usize).min(MAX_HEAPS);
    for slot in &SLOTS[..n] {
        if slot
            .enabled
            .compare_exchange(mode_word, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        let cb = slot.disabled_cb.load(Ordering::Acquire);
        if cb != 0 {
            let info = DisableInfo { _reserved: 0 };
            // SAFETY: as for the enabled callback.
            unsafe {
                let f: DisabledCallback = core::mem::transmute::<usize, DisabledCallback>(cb);
                f(
                    slot.disabled_data.load(Ordering::Relaxed) as *mut c_void,
                    &info,
                );
            }
        }
    }
}

/// The process exits: heaps of the running session are disabled (their
/// callbacks run) and report nothing more.
pub fn at_exit() {
    let _g = Guard::enter();
    session_ended(mode().load(Ordering::Acquire));
}

/// The free-set key of `(heap, id)`: odd, so never a malloc address.
#[inline(always)]
fn key(heap: u32, id: u64) -> u64 {
    mix64(id ^ (u64::from(heap) << 48).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
}

/// The session mode word if heap `slot` records in it, else `None`.
#[inline(always)]
fn recording(slot: &HeapInfo) -> Option<u64> {
    let m = mode().load(Ordering::Relaxed);
    (m >= 2 && slot.enabled.load(Ordering::Acquire) == m).then_some(m)
}

/// `AHeapProfile_reportAllocation`: samples an allocation of `size` bytes
/// with id `alloc_id`; true if it was recorded.
pub fn report_allocation(heap: u32, alloc_id: u64, size: u64) -> bool {
    let Some(slot) = registered(heap) else {
        return false;
    };
    let Some(m) = recording(slot) else {
        return false;
    };
    if crate::contexts::thread_excluded() {
        return false;
    }
    let Some(g) = Guard::enter() else {
        return false;
    };
    slot.lock();
    // SAFETY: under the heap's lock.
    let ss = unsafe { (*slot.sampler.get()).sample_size(size as usize) };
    slot.unlock();
    ss != 0 && record(&g, m, heap, alloc_id, size, ss)
}

/// `AHeapProfile_reportSample`: records an allocation the program sampled
/// itself (it stands for `size` bytes); true if it was recorded.
pub fn report_sample(heap: u32, alloc_id: u64, size: u64) -> bool {
    let Some(slot) = registered(heap) else {
        return false;
    };
    let Some(m) = recording(slot) else {
        return false;
    };
    if crate::contexts::thread_excluded() {
        return false;
    }
    let Some(g) = Guard::enter() else {
        return false;
    };
    record(&g, m, heap, alloc_id, size, size)
}

fn record(g: &Guard, m: u64, heap: u32, alloc_id: u64, size: u64, ss: u64) -> bool {
    let Some(s) = session::acquire(m) else {
        return false;
    };
    let mut ok = false;
    if s.owns() && s.record_malloc(g.thread(), alloc_id as *mut c_void, size as usize, ss, heap) {
        free_set().insert(key(heap, alloc_id));
        ok = true;
    }
    session::release(s);
    ok
}

/// `AHeapProfile_reportFree`: the allocation `alloc_id` of `heap` is gone.
pub fn report_free(heap: u32, alloc_id: u64) {
    let Some(slot) = registered(heap) else { return };
    let Some(m) = recording(slot) else { return };
    let k = key(heap, alloc_id);
    if !free_set().may_contain(k) {
        return;
    }
    let Some(_g) = Guard::enter() else { return };
    let Some(s) = session::acquire(m) else { return };
    if s.owns() {
        match free_set().remove(k) {
            Removal::Found | Removal::MaybeOverflowed => s.record_free(alloc_id, heap),
            Removal::Absent => {}
        }
    }
    session::release(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_ids_and_limits() {
        assert!(create(b"").is_null());
        assert!(create(&[b'x'; 64]).is_null());
        assert!(create(b"a\0b").is_null());
        let a = create(&[b'x'; 63]);
        assert!(!a.is_null());
        assert_eq!(register(core::ptr::null_mut()), 0);
        assert_eq!(register((a as usize + 8) as *mut HeapInfo), 0);
        let id = register(a);
        assert!((1..=MAX_HEAPS as u32).contains(&id));
        assert_eq!(register(a), id, "registering twice keeps the id");
        assert!(registered(id).is_some() && registered(0).is_none());
        assert!(registered(MAX_HEAPS as u32 + 1).is_none());
        // No session: every report is a no-op.
        assert!(!report_allocation(id, 16, 16));
        assert!(!report_sample(id, 16, 16));
        report_free(id, 16);
        let mut made = 1;
        while !create(b"more").is_null() {
            made += 1;
        }
        assert!(made <= MAX_HEAPS);
        assert_eq!(CREATED.load(Ordering::Relaxed) as usize, MAX_HEAPS);
    }

    #[test]
    fn keys_are_odd_and_spread() {
        let mut seen = std::collections::HashSet::new();
        for heap in 1..4 {
            for id in (0..4096u64).map(|i| i * 16) {
                let k = key(heap, id);
                assert_eq!(k & 1, 1);
                assert!(seen.insert(k));
            }
        }
    }
}
