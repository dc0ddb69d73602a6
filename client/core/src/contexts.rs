//! User contexts: immutable maps of string keys to string values a program
//! installs on a thread (an endpoint, a request id), carried by every
//! sample the thread makes while installed (`heapprofd_context_*`).
//!
//! # Storage
//! A table of [`MAX_CONTEXTS`] slots in one anonymous mapping, made on the
//! first [`create`] (`MAP_NORESERVE`: a slot's page is touched when first
//! used), never through the hooks. A slot holds a context's complete map
//! (a context that extends a parent copies the parent's pairs, so a
//! definition never needs another), encoded as the wire encodes it. Slot 0
//! is the overflow context: what [`create`] returns when the table is full
//! or the map is over the bounds of `wire::ContextRecord`, counted in
//! [`OVERFLOWED`] and sent flagged `FLAG_OVERFLOW`.
//!
//! # Ids
//! `id = serial << SLOT_BITS | slot`, the serial counting every [`create`]
//! of the process: ids are never reused, and an id whose slot holds another
//! id was released (it is then a context without pairs). 0 is no context.
//!
//! # The thread's word
//! One u64 of the initial-exec TLS block (`ThreadState::context`):
//! `id << 1 | excluded`, one aligned store, so reading it is
//! async-signal-safe. `excluded` says the running session's context
//! filters reject the context: decided at [`activate`] (and when a thread
//! is set up for a session) from the slot's cache, never per allocation;
//! the hooks' fast path skips excluded threads with one branch.
//!
//! # Definitions
//! A sample's context is defined to the daemon by a `ContextRecord` written
//! into the ring just before the first sample of the session that carries
//! it (`ensure_sent`); the slot remembers the session it was sent in.
//! Two threads may both send it (the daemon takes the same definition
//! twice); none marks it sent before the record is in the ring, so a sample
//! never precedes its definition.

use core::cell::UnsafeCell;
use core::ffi::{CStr, c_char};
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use heapprofd_proto::wire::{
    CONTEXT_HEADER_LEN, ContextFilter, ContextRecord, MAX_CONTEXT_BYTES, MAX_CONTEXT_FILTERS,
    MAX_CONTEXT_PAIRS, MAX_CONTEXT_STR, PairIter, context_matches, encode_context_pair,
};

use crate::tls::{self, ThreadState};

/// Bits of an id that name its slot.
pub const SLOT_BITS: u32 = 12;
/// Slots in the table (slot 0 is the overflow context).
pub const MAX_CONTEXTS: usize = 1 << SLOT_BITS;
const SLOT_MASK: u64 = MAX_CONTEXTS as u64 - 1;
/// The id of the overflow context (slot 0, serial 1).
pub const OVERFLOW_ID: u64 = 1 << SLOT_BITS;
/// A slot being filled by [`create`] (never an id: slot bits of a real id
/// match the slot, and this has serial 0).
const FILLING: u64 = SLOT_MASK;

/// `create` calls that got the overflow context.
pub static OVERFLOWED: AtomicU64 = AtomicU64::new(0);
/// Source of serials (from 2; 1 is the overflow context's).
static SERIAL: AtomicU64 = AtomicU64::new(2);
/// Where the next free-slot search starts.
static HINT: AtomicU64 = AtomicU64::new(1);
/// The table, null until the first [`create`].
static TABLE: AtomicPtr<Slot> = AtomicPtr::new(core::ptr::null_mut());
/// The mode word of the running session if it filters by context, else 0.
static FILTER_MODE: AtomicU64 = AtomicU64::new(0);
/// The filters of [`FILTER_MODE`]'s session (written before it is
/// published, by the thread starting the session).
static FILTERS: Filters = Filters(UnsafeCell::new((
    [ContextFilter::EMPTY; MAX_CONTEXT_FILTERS],
    0,
)));

struct Filters(UnsafeCell<([ContextFilter; MAX_CONTEXT_FILTERS], usize)>);
// SAFETY: written only by `session_started` before FILTER_MODE publishes it
// (Release) and read after FILTER_MODE is seen (Acquire); a session's
// filters are replaced only when the next session starts.
unsafe impl Sync for Filters {}

/// One context.
#[repr(C)]
struct Slot {
    /// The context's id; 0 free, [`FILLING`] being created.
    id: AtomicU64,
    /// `filter mode word | excluded` as last computed, 0 never.
    match_word: AtomicU64,
    /// Mode word of the session the definition was last sent in.
    sent_mode: AtomicU64,
    pairs_len: u32,
    n_pairs: u32,
    pairs: [u8; MAX_CONTEXT_BYTES],
}

const SLOT_SIZE: usize = core::mem::size_of::<Slot>();
const TABLE_BYTES: usize = SLOT_SIZE * MAX_CONTEXTS;

fn table() -> Option<&'static [Slot]> {
    let p = TABLE.load(Ordering::Acquire);
    // SAFETY: a published table is MAX_CONTEXTS zero-initialised slots
    // (all-zero is a valid Slot), never unmapped.
    (!p.is_null()).then(|| unsafe { core::slice::from_raw_parts(p, MAX_CONTEXTS) })
}

#[cold]
fn map_table() -> Option<&'static [Slot]> {
    // SAFETY: a fresh anonymous private mapping.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            TABLE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let slots = p.cast::<Slot>();
    // SAFETY: slot 0 of our unpublished mapping.
    unsafe { (*slots).id.store(OVERFLOW_ID, Ordering::Relaxed) };
    match TABLE.compare_exchange(
        core::ptr::null_mut(),
        slots,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {}
        Err(_) => {
            // SAFETY: our own mapping, never published.
            unsafe { libc::munmap(p, TABLE_BYTES) };
        }
    }
    table()
}

/// The slot holding `id`, if it is a live context.
#[inline(always)]
fn slot_of(id: u64) -> Option<&'static Slot> {
    let s = table()?.get((id & SLOT_MASK) as usize)?;
    (id != 0 && s.id.load(Ordering::Acquire) == id).then_some(s)
}

/// Copies the pairs of the live context `id` into `out`: (bytes, pairs);
/// `None` if it is not live (or was released while copying).
fn copy_pairs(id: u64, out: &mut [u8; MAX_CONTEXT_BYTES]) -> Option<(usize, usize)> {
    let s = slot_of(id)?;
    let len = (s.pairs_len as usize).min(MAX_CONTEXT_BYTES);
    let n = s.n_pairs as usize;
    out[..len].copy_from_slice(&s.pairs[..len]);
    (s.id.load(Ordering::Acquire) == id).then_some((len, n))
}

fn pairs(bytes: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    // Our own encoding: every pair decodes.
    PairIter::new(bytes).filter_map(Result::ok)
}

fn c_bytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes NUL-terminated strings (checked non-null);
    // the length is bounded by the wire's limit below.
    let s = unsafe { CStr::from_ptr(p) }.to_bytes();
    (s.len() <= MAX_CONTEXT_STR).then_some(s)
}

fn overflow() -> u64 {
    OVERFLOWED.fetch_add(1, Ordering::Relaxed);
    OVERFLOW_ID
}

/// `heapprofd_context_create`: a context mapping `keys[i]` to `values[i]`
/// that extends `parent` (0: the calling thread's current context); its
/// pairs override the parent's of the same key. Returns its id, or
/// [`OVERFLOW_ID`] if the table is full, a string is null or over 255
/// bytes, a key is empty, or the map is over the wire's bounds.
///
/// # Safety
/// `keys` and `values` point to `n` NUL-terminated strings each (or are
/// null with `n` 0).
pub unsafe fn create(
    parent: u64,
    keys: *const *const c_char,
    values: *const *const c_char,
    n: usize,
) -> u64 {
    if n > MAX_CONTEXT_PAIRS || (n > 0 && (keys.is_null() || values.is_null())) {
        return overflow();
    }
    let Some(table) = table().or_else(map_table) else {
        return overflow();
    };
    let parent = if parent == 0 { current() } else { parent };
    let mut parent_buf = [0u8; MAX_CONTEXT_BYTES];
    let (plen, _) = copy_pairs(parent, &mut parent_buf).unwrap_or((0, 0));
    let mut kv: [(&[u8], &[u8]); MAX_CONTEXT_PAIRS] = [(&[], &[]); MAX_CONTEXT_PAIRS];
    for (i, slot) in kv.iter_mut().enumerate().take(n) {
        // SAFETY: i < n, within the caller's arrays.
        let (k, v) = unsafe { (*keys.add(i), *values.add(i)) };
        match (c_bytes(k), c_bytes(v)) {
            (Some(k), Some(v)) if !k.is_empty() => *slot = (k, v),
            _ => return overflow(),
        }
    }
    let kv = &kv[..n];
    let mut buf = [0u8; MAX_CONTEXT_BYTES];
    let mut pos = 0;
    let mut count = 0;
    for (k, v) in pairs(&parent_buf[..plen]) {
        if !kv.iter().any(|(nk, _)| *nk == k) {
            if count == MAX_CONTEXT_PAIRS || !encode_context_pair(&mut buf, &mut pos, k, v) {
                return overflow();
            }
            count += 1;
        }
    }
    for (i, (k, v)) in kv.iter().enumerate() {
        // A key given twice: the last one wins.
        if kv[i + 1..].iter().any(|(nk, _)| nk == k) {
            continue;
        }
        if count == MAX_CONTEXT_PAIRS || !encode_context_pair(&mut buf, &mut pos, k, v) {
            return overflow();
        }
        count += 1;
    }
    let Some((index, slot)) = claim(table) else {
        return overflow();
    };
    let id = (SERIAL.fetch_add(1, Ordering::Relaxed) << SLOT_BITS) | index as u64;
    let p = slot as *const Slot as *mut Slot;
    // SAFETY: the slot is FILLING: ours alone until its id is published.
    unsafe {
        (&mut (*p).pairs)[..pos].copy_from_slice(&buf[..pos]);
        (*p).pairs_len = pos as u32;
        (*p).n_pairs = count as u32;
    }
    slot.match_word.store(0, Ordering::Relaxed);
    slot.sent_mode.store(0, Ordering::Relaxed);
    slot.id.store(id, Ordering::Release);
    id
}

/// A free slot, marked [`FILLING`]; `None` if every slot is taken.
fn claim(table: &'static [Slot]) -> Option<(usize, &'static Slot)> {
    let start = HINT.load(Ordering::Relaxed) as usize;
    for i in 0..MAX_CONTEXTS - 1 {
        let index = 1 + (start + i - 1) % (MAX_CONTEXTS - 1);
        let s = table.get(index)?;
        if s.id.load(Ordering::Relaxed) == 0
            && s.id
                .compare_exchange(0, FILLING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            HINT.store(index as u64 + 1, Ordering::Relaxed);
            return Some((index, s));
        }
    }
    None
}

/// `heapprofd_context_release`: the context's slot is free again (its id
/// is never handed out again). Samples of threads that still have it
/// installed carry an id the daemon may not know (a context without pairs).
pub fn release(id: u64) {
    if id == OVERFLOW_ID {
        return;
    }
    if let Some(s) = slot_of(id) {
        let _ =
            s.id.compare_exchange(id, 0, Ordering::Release, Ordering::Relaxed);
    }
}

/// `heapprofd_context_current`: the calling thread's context (0: none).
#[inline(always)]
pub fn current() -> u64 {
    // SAFETY: this thread's TLS block; one aligned load.
    unsafe { core::ptr::addr_of!((*tls::state()).context).read_volatile() >> 1 }
}

/// `heapprofd_context_activate`: installs `id` on the calling thread;
/// returns the token that [`deactivate`] takes to restore what was there.
#[inline(always)]
pub fn activate(id: u64) -> u64 {
    let st = tls::state();
    let word = (id << 1) | excluded(id);
    // SAFETY: this thread's TLS block; one aligned load and store (a signal
    // handler sees the old word or the new one).
    unsafe {
        let p = core::ptr::addr_of_mut!((*st).context);
        let old = p.read_volatile();
        p.write_volatile(word);
        old
    }
}

/// `heapprofd_context_deactivate`: restores the word `token` saved.
#[inline(always)]
pub fn deactivate(token: u64) {
    // SAFETY: as in `activate`.
    unsafe { core::ptr::addr_of_mut!((*tls::state()).context).write_volatile(token) };
}

/// 1 if the running session's filters reject context `id`, else 0.
#[inline(always)]
fn excluded(id: u64) -> u64 {
    let fm = FILTER_MODE.load(Ordering::Relaxed);
    if fm == 0 {
        return 0;
    }
    if let Some(s) = slot_of(id) {
        let w = s.match_word.load(Ordering::Relaxed);
        if w & !1 == fm {
            return w & 1;
        }
    }
    compute_excluded(id, fm)
}

#[cold]
#[inline(never)]
fn compute_excluded(id: u64, fm: u64) -> u64 {
    if FILTER_MODE.load(Ordering::Acquire) != fm {
        return 0;
    }
    // SAFETY: FILTER_MODE published the filters (see `Filters`).
    let (all, n) = unsafe { &*FILTERS.0.get() };
    let filters = all.get(..*n).unwrap_or(&[]);
    let mut buf = [0u8; MAX_CONTEXT_BYTES];
    let pass = match copy_pairs(id, &mut buf) {
        Some((len, _)) => context_matches(filters, || pairs(&buf[..len])),
        // No context, or a released one: only `any` takes a context
        // without pairs, and no filter takes no context.
        None => id != 0 && context_matches(filters, || pairs(&[])),
    };
    let ex = u64::from(!pass);
    if let Some(s) = slot_of(id) {
        s.match_word.store(fm | ex, Ordering::Relaxed);
    }
    ex
}

/// A thread is set up for a session: its installed context is matched
/// against the session's filters again.
pub(crate) fn init_thread(st: *mut ThreadState) {
    // SAFETY: the calling thread's own block.
    unsafe {
        let p = core::ptr::addr_of_mut!((*st).context);
        let id = p.read_volatile() >> 1;
        p.write_volatile((id << 1) | excluded(id));
    }
}

/// Whether the calling thread's context is excluded (the custom heap
/// reports' check; the hooks read the bit inline).
#[inline(always)]
pub fn thread_excluded() -> bool {
    // SAFETY: this thread's TLS block.
    unsafe { core::ptr::addr_of!((*tls::state()).context).read_volatile() & 1 != 0 }
}

/// A session starts (before its mode word is published): its filters.
pub(crate) fn session_started(mode_word: u64, filters: &[ContextFilter]) {
    FILTER_MODE.store(0, Ordering::SeqCst);
    if filters.is_empty() {
        return;
    }
    // SAFETY: FILTER_MODE is 0: no reader dereferences the filters now
    // (`compute_excluded` re-checks it with Acquire first). The vector is
    // a fixed array.
    unsafe {
        let (all, n) = &mut *FILTERS.0.get();
        *n = filters.len().min(MAX_CONTEXT_FILTERS);
        all[..*n].copy_from_slice(&filters[..*n]);
    }
    FILTER_MODE.store(mode_word, Ordering::Release);
}

/// The session ended: nothing is filtered.
pub(crate) fn session_ended() {
    FILTER_MODE.store(0, Ordering::SeqCst);
}

/// Writes the definition of context `id` into the session's ring unless it
/// was sent in this session already; `write` writes one whole record and
/// says whether it did. No-op for no context or a released one.
pub(crate) fn ensure_sent(id: u64, mode_word: u64, write: impl FnOnce(&[u8]) -> bool) {
    let Some(s) = slot_of(id) else { return };
    if s.sent_mode.load(Ordering::Acquire) == mode_word {
        return;
    }
    let mut rec = [0u8; CONTEXT_HEADER_LEN + MAX_CONTEXT_BYTES];
    let (head, body) = rec.split_at_mut(CONTEXT_HEADER_LEN);
    let mut pairs_buf = [0u8; MAX_CONTEXT_BYTES];
    let Some((len, n)) = copy_pairs(id, &mut pairs_buf) else {
        return;
    };
    body[..len].copy_from_slice(&pairs_buf[..len]);
    let (flags, overflowed) = if id == OVERFLOW_ID {
        (
            ContextRecord::FLAG_OVERFLOW,
            OVERFLOWED.load(Ordering::Relaxed),
        )
    } else {
        (0, OVERFLOWED.load(Ordering::Relaxed))
    };
    head.copy_from_slice(&ContextRecord::encode_header(id, flags, overflowed, len, n));
    if write(&rec[..CONTEXT_HEADER_LEN + len]) {
        s.sent_mode.store(mode_word, Ordering::Release);
    }
}

/// The running session's mode word (for tests of the filter state).
#[cfg(test)]
fn filter_mode() -> u64 {
    FILTER_MODE.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make(parent: u64, list: &[(&CStr, &CStr)]) -> u64 {
        let keys: Vec<*const c_char> = list.iter().map(|(k, _)| k.as_ptr()).collect();
        let values: Vec<*const c_char> = list.iter().map(|(_, v)| v.as_ptr()).collect();
        // SAFETY: valid arrays of C strings.
        unsafe { create(parent, keys.as_ptr(), values.as_ptr(), list.len()) }
    }

    fn stored(id: u64) -> Vec<(String, String)> {
        let mut buf = [0u8; MAX_CONTEXT_BYTES];
        let (len, _) = copy_pairs(id, &mut buf).expect("live");
        pairs(&buf[..len])
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn create_extend_activate_release_and_filter() {
        let a = make(0, &[(c"endpoint", c"/a"), (c"user", c"u1")]);
        assert_ne!(a, OVERFLOW_ID);
        assert_eq!(current(), 0);
        let t1 = activate(a);
        assert_eq!((current(), t1), (a, 0));
        // Extends the current context; overrides `user`.
        let b = make(0, &[(c"user", c"u2"), (c"req", c"7")]);
        assert_eq!(
            stored(b),
            [("endpoint", "/a"), ("user", "u2"), ("req", "7")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        let t2 = activate(b);
        assert_eq!(current(), b);
        deactivate(t2);
        assert_eq!(current(), a);
        deactivate(t1);
        assert_eq!(current(), 0);
        // Bounds: an empty key, a null array.
        assert_eq!(make(0, &[(c"", c"x")]), OVERFLOW_ID);
        // SAFETY: null arrays with n > 0 are refused before use.
        let null = unsafe { create(0, core::ptr::null(), core::ptr::null(), 1) };
        assert_eq!(null, OVERFLOW_ID);
        assert!(OVERFLOWED.load(Ordering::Relaxed) >= 2);
        // Filters: decided at activation, cached per context.
        let filters = [ContextFilter::parse("endpoint=/b").unwrap()];
        session_started(1000, &filters);
        assert_eq!(filter_mode(), 1000);
        let c = make(a, &[(c"endpoint", c"/b")]);
        activate(a);
        assert!(thread_excluded());
        activate(c);
        assert!(!thread_excluded());
        assert_eq!(slot_of(c).unwrap().match_word.load(Ordering::Relaxed), 1000);
        activate(0);
        assert!(thread_excluded(), "no context is filtered out");
        session_ended();
        activate(a);
        assert!(!thread_excluded());
        deactivate(0);
        // Definitions: once per session.
        let mut sent = Vec::new();
        ensure_sent(c, 2000, |r| {
            sent.push(r.to_vec());
            true
        });
        ensure_sent(c, 2000, |_| panic!("sent twice"));
        let rec = ContextRecord::decode(&sent[0]).unwrap();
        assert_eq!(rec.context_id, c);
        assert_eq!(rec.pairs_lossy()[1], ("endpoint".into(), "/b".into()));
        // Released: ids never come back, the slot is reused.
        release(b);
        assert!(slot_of(b).is_none());
        let d = make(0, &[]);
        assert!(d > c && d != b);
    }
}
