//! Stack reuse: a malloc sample sends only the part of its stack that
//! changed since its thread's previous sample.
//!
//! A sample's stack runs from its stack pointer to the end of the thread's
//! stack, and most of it is the same from one sample to the next: the
//! frames of `main`, the event loop, the interpreter's dispatch. sqlite3
//! inserting rows sends 10.5 KB a sample of which 1.2 KB changed. So each
//! thread keeps a *snapshot*: the top [`STACK_REUSE_WINDOW`] bytes of the
//! stack it last sent, in a private mapping of its own. A sample compares
//! its live stack with the snapshot from the top down, and the record
//! carries only the bytes below the first difference
//! (`MallocHeader::stack_reused` says how many it left out). The daemon
//! keeps the thread's last stack (its *base*) and puts the top back.
//!
//! The two sides agree on a base by construction:
//! * A record that reuses, or that starts a base, has
//!   `MallocHeader::FLAG_STACK_BASE`; the daemon replaces the thread's base
//!   with its whole stack, and nothing else changes a base.
//! * The snapshot changes only once the record's room in the ring is
//!   reserved (a record that could not be written leaves both sides on
//!   the previous base), and the bytes sent are copied *from* the
//!   snapshot after it took them from the live stack, so they are the same
//!   bytes even if the live stack changes meanwhile (our own frame does).
//! * A snapshot is reused only within the session it was made in (the
//!   session's mode word), under the ring's stack resync counter it was
//!   made under (the daemon bumps it when it forgot a base), and for a
//!   sample whose stack ends where the snapshot's did (not one on a signal
//!   stack). Truncated copies never use it.
//!
//! Memory: one mapping of [`MAP_BYTES`] per thread that takes a malloc
//! sample with reuse on, made at its first such sample, of which only the
//! pages the thread's stacks reach become resident. It is unmapped when the
//! thread exits, by a thread-specific data destructor (one key per
//! process); a thread exiting by a raw `exit` syscall leaks its mapping.
//! Later samples of a thread whose destructor ran, or whose mapping could
//! not be made, send whole stacks.

use core::ffi::c_void;
use core::sync::atomic::{AtomicU32, Ordering};

use heapprofd_proto::wire::STACK_REUSE_WINDOW;

use crate::capture::copy_to_ring;
use crate::tls::{self, ThreadState};

/// `ThreadState::snapshot`: no snapshot yet.
const NONE: u64 = 0;
/// `ThreadState::snapshot`: this thread never gets one (exiting, or the
/// mapping or the key failed).
const NEVER: u64 = 1;

/// A thread's last sent stack, at the start of its mapping.
#[repr(C)]
struct Snapshot {
    /// The session it belongs to (`Session::mode_word`; 0 = empty).
    mode_word: u64,
    /// The ring's stack resync counter when it was sent.
    resync: u32,
    _pad: u32,
    /// One past the stack's last byte.
    end: u64,
    /// Bytes held: `data[WINDOW - len..]` is the stack's `[end - len, end)`.
    len: u64,
    data: [u8; STACK_REUSE_WINDOW],
}

/// Bytes of a snapshot's mapping (whole pages).
pub const MAP_BYTES: usize = (core::mem::size_of::<Snapshot>() + 4095) & !4095;

/// The process's thread-specific data key whose destructor unmaps a
/// thread's snapshot: [`KEY_UNMADE`], [`KEY_MAKING`], [`KEY_FAILED`], or
/// the key + [`KEY_BIAS`].
static KEY: AtomicU32 = AtomicU32::new(KEY_UNMADE);
const KEY_UNMADE: u32 = 0;
const KEY_MAKING: u32 = 1;
const KEY_FAILED: u32 = 2;
const KEY_BIAS: u32 = 3;

/// Snapshots unmapped by exiting threads (for tests and debugging).
pub(crate) static UNMAPPED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// What a sample reuses: the thread's snapshot and how many top bytes of
/// its stack are the same as there.
#[derive(Debug)]
pub(crate) struct Plan {
    snap: *mut Snapshot,
    /// Top bytes of the stack left out of the record (a multiple of 8).
    pub reused: usize,
    mode_word: u64,
    resync: u32,
}

/// Plans the stack copy of a sample taken at `sp` on a stack ending at
/// `end` (`sp < end`, the whole range copied), in the session `mode_word`
/// under the ring's `resync` value. `None`: no snapshot for this thread
/// (copy the whole stack the usual way, without `FLAG_STACK_BASE`).
///
/// Call with the guard held (making the key and the mapping may call into
/// glibc).
pub(crate) fn plan(
    st: *mut ThreadState,
    mode_word: u64,
    resync: u32,
    sp: u64,
    end: u64,
) -> Option<Plan> {
    let snap = snapshot(st)?;
    // SAFETY: the thread's own snapshot, mapped and written only by it.
    let s = unsafe { &*snap };
    let reused = if s.mode_word == mode_word && s.resync == resync && s.end == end {
        let n = (end - sp).min(s.len) as usize;
        // SAFETY: `[end - n, end)` is inside the live stack `[sp, end)`,
        // and `data[WINDOW - n..]` inside the snapshot (`n <= len <= WINDOW`).
        unsafe { common_top(end as *const u8, s.data.as_ptr().add(STACK_REUSE_WINDOW), n) }
    } else {
        0
    };
    Some(Plan {
        snap,
        reused,
        mode_word,
        resync,
    })
}

/// Copies the part of the stack `[sp, end)` that `plan` did not reuse into
/// `dst` (`end - sp - plan.reused` bytes), and makes the whole stack the
/// thread's snapshot. The bytes within the window go through the snapshot,
/// so that what the ring gets is exactly what the snapshot holds.
///
/// # Safety
/// `[sp, end)` is the calling thread's live stack, `plan` was made for it
/// by this thread, and `dst` is writable for `end - sp - plan.reused` bytes
/// (ring memory not overlapping the stack).
pub(crate) unsafe fn copy(plan: &Plan, sp: u64, end: u64, dst: *mut u8) {
    let total = (end - sp) as usize;
    let fresh = total - plan.reused;
    // Bytes deeper than the window go straight to the ring.
    let below = total.saturating_sub(STACK_REUSE_WINDOW);
    // SAFETY: the caller's contract; the snapshot is this thread's.
    unsafe {
        copy_to_ring(dst, sp as *const u8, below);
        let s = &mut *plan.snap;
        let windowed = fresh - below;
        let at = STACK_REUSE_WINDOW - (total - below);
        let slot = s.data.as_mut_ptr().add(at);
        core::ptr::copy_nonoverlapping((sp as usize + below) as *const u8, slot, windowed);
        copy_to_ring(dst.add(below), slot, windowed);
        s.mode_word = plan.mode_word;
        s.resync = plan.resync;
        s.end = end;
        s.len = (total - below) as u64;
    }
}

/// Bytes compared at once, from the top down, before the word loop.
const CHUNK: usize = 1024;

/// Top bytes (a multiple of 8) that the `n` bytes below `a_end` and below
/// `b_end` have in common, compared from the top down: in chunks of
/// [`CHUNK`] bytes (libc's `bcmp`, vectorized), then, in the chunk that
/// differs, in blocks of 64 bytes and words. (Word by word alone, this was
/// 4.4% of all CPU of `record -i 1` of node, whose samples share most of
/// a deep stack.)
///
/// # Safety
/// Both `[a_end - n, a_end)` and `[b_end - n, b_end)` are readable.
#[inline]
unsafe fn common_top(a_end: *const u8, b_end: *const u8, n: usize) -> usize {
    let mut bytes = 0;
    while bytes + CHUNK <= n {
        // SAFETY: `[end - bytes - CHUNK, end - bytes)` is inside both ranges.
        let same = unsafe {
            core::slice::from_raw_parts(a_end.sub(bytes + CHUNK), CHUNK)
                == core::slice::from_raw_parts(b_end.sub(bytes + CHUNK), CHUNK)
        };
        if !same {
            break;
        }
        bytes += CHUNK;
    }
    let words = n / 8;
    // SAFETY: word `k` (counted from the top) is inside both ranges for
    // every `k < words`.
    let word =
        |p: *const u8, k: usize| unsafe { p.sub(8 * (k + 1)).cast::<u64>().read_unaligned() };
    let mut k = bytes / 8;
    while k + 8 <= words {
        let mut diff = 0;
        for j in 0..8 {
            diff |= word(a_end, k + j) ^ word(b_end, k + j);
        }
        if diff != 0 {
            break;
        }
        k += 8;
    }
    while k < words && word(a_end, k) == word(b_end, k) {
        k += 1;
    }
    k * 8
}

/// The thread's snapshot, made at its first use.
fn snapshot(st: *mut ThreadState) -> Option<*mut Snapshot> {
    // SAFETY: `st` is the calling thread's own TLS block.
    let v = unsafe { (*st).snapshot };
    match v {
        NONE => {}
        NEVER => return None,
        p => return Some(p as *mut Snapshot),
    }
    let made = make(st);
    // SAFETY: as above.
    unsafe { (*st).snapshot = made.map_or(NEVER, |p| p as u64) };
    made
}

/// Maps a snapshot and registers it for unmapping at thread exit.
fn make(_st: *mut ThreadState) -> Option<*mut Snapshot> {
    let key = key()?;
    // SAFETY: a fresh anonymous private mapping (zeroed: mode word 0 = empty).
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            MAP_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: a key made by `key`; glibc stores the value in the thread's
    // descriptor (allocating a block for keys past the first 32, under our
    // guard).
    if unsafe { libc::pthread_setspecific(key, p) } != 0 {
        // SAFETY: the mapping made above, not shared.
        unsafe { libc::munmap(p, MAP_BYTES) };
        return None;
    }
    Some(p.cast())
}

/// The process's key, made at the first call (a thread that finds another
/// making it gets none this time).
fn key() -> Option<libc::pthread_key_t> {
    match KEY.load(Ordering::Acquire) {
        KEY_UNMADE => {}
        KEY_MAKING | KEY_FAILED => return None,
        k => return Some((k - KEY_BIAS) as libc::pthread_key_t),
    }
    if KEY
        .compare_exchange(KEY_UNMADE, KEY_MAKING, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return None;
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: valid out-pointer and an `extern "C"` destructor.
    let ok = unsafe { libc::pthread_key_create(&mut key, Some(forget)) } == 0;
    // `pthread_key_t` is unsigned in glibc, `int` in bionic.
    let k = key as i64;
    let state = if ok && (0..i64::from(u32::MAX - KEY_BIAS)).contains(&k) {
        k as u32 + KEY_BIAS
    } else {
        KEY_FAILED
    };
    KEY.store(state, Ordering::Release);
    (state != KEY_FAILED).then_some(key)
}

/// The key's destructor, run by the exiting thread: unmaps its snapshot;
/// its later samples (other destructors may allocate) send whole stacks.
unsafe extern "C" fn forget(p: *mut c_void) {
    let st = tls::state();
    // SAFETY: the exiting thread's own TLS block, and the mapping
    // `make` registered for it, which nothing uses any more.
    unsafe {
        (*st).snapshot = NEVER;
        if libc::munmap(p, MAP_BYTES) == 0 {
            UNMAPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_top_counts_equal_words_from_the_top() {
        let a: Vec<u8> = (0..5000u32).map(|i| (i * 13 + 1) as u8).collect();
        for (n, diff_at) in [
            (1000, None),
            (1000, Some(999)),
            (1000, Some(0)),
            (1000, Some(500)),
            (13, None),
            (7, None),
            (200, Some(137)),
            // Longer than a chunk: the difference in the first chunk from
            // the top, in a later one, on a chunk's edges, in none.
            (5000, None),
            (5000, Some(4999)),
            (5000, Some(4000)),
            (5000, Some(3976)),
            (5000, Some(3975)),
            (5000, Some(1234)),
            (5000, Some(7)),
            (4096, Some(0)),
            (4096, None),
            (4100, Some(3)),
        ] {
            let mut b = a.clone();
            if let Some(d) = diff_at {
                b[d] ^= 0xff;
            }
            // SAFETY: both vectors hold 5000 bytes; n <= 5000.
            let got = unsafe { common_top(a.as_ptr().add(n), b.as_ptr().add(n), n) };
            // The equal top bytes, counting down from `n` to the difference,
            // rounded down to whole words of the compared range.
            let equal = match diff_at {
                Some(d) if d < n => n - d - 1,
                _ => n,
            };
            assert_eq!(got, equal / 8 * 8, "n {n} diff {diff_at:?}");
        }
    }

    /// The tests that make snapshots (only this module does).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_thread_reuses_the_unchanged_top_of_its_stack() {
        let _one = ONE_AT_A_TIME.lock().unwrap();
        std::thread::spawn(|| {
            let _g = crate::tls::Guard::enter().unwrap();
            let st = tls::state();
            // A fake stack: 3000 bytes, the sample at 1000.
            let mut stack: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
            let base = stack.as_mut_ptr() as u64;
            let (sp, end) = (base + 1000, base + 4000);
            let mut ring = vec![0u8; 4000];
            let first = plan(st, 10, 0, sp, end).expect("snapshot");
            assert_eq!(first.reused, 0, "nothing to reuse yet");
            // SAFETY: [sp, end) is inside `stack`, `ring` holds 3000 bytes.
            unsafe { copy(&first, sp, end, ring.as_mut_ptr()) };
            assert_eq!(&ring[..3000], &stack[1000..]);
            // Change a byte 600 below the end; sample deeper, at 800.
            stack[3400] ^= 1;
            let sp2 = base + 800;
            let again = plan(st, 10, 0, sp2, end).unwrap();
            assert_eq!(again.reused, 592, "the words above byte 3400");
            let mut ring2 = vec![0u8; 4000];
            // SAFETY: as above; 3200 - 592 bytes fit.
            unsafe { copy(&again, sp2, end, ring2.as_mut_ptr()) };
            assert_eq!(&ring2[..3200 - 592], &stack[800..4000 - 592]);
            // Another session, a resync or another stack end: nothing reused.
            assert_eq!(plan(st, 12, 0, sp2, end).unwrap().reused, 0);
            assert_eq!(plan(st, 10, 1, sp2, end).unwrap().reused, 0);
            assert_eq!(plan(st, 10, 0, sp2, end - 8).unwrap().reused, 0);
            assert_eq!(plan(st, 10, 0, sp2, end).unwrap().reused, 3200);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_stack_deeper_than_the_window_sends_its_bottom_whole() {
        let _one = ONE_AT_A_TIME.lock().unwrap();
        std::thread::spawn(|| {
            let _g = crate::tls::Guard::enter().unwrap();
            let st = tls::state();
            let len = STACK_REUSE_WINDOW + 5000;
            let stack: Vec<u8> = (0..len as u32).map(|i| (i * 31 + 5) as u8).collect();
            let (sp, end) = (stack.as_ptr() as u64, stack.as_ptr() as u64 + len as u64);
            let mut ring = vec![0u8; len];
            let p = plan(st, 3, 0, sp, end).unwrap();
            // SAFETY: the whole fake stack fits in `ring`.
            unsafe { copy(&p, sp, end, ring.as_mut_ptr()) };
            assert_eq!(ring, stack);
            let p = plan(st, 3, 0, sp, end).unwrap();
            assert_eq!(p.reused, STACK_REUSE_WINDOW, "at most the window");
            let mut ring = vec![0u8; 5000];
            // SAFETY: 5000 bytes are not reused.
            unsafe { copy(&p, sp, end, ring.as_mut_ptr()) };
            assert_eq!(ring, stack[..5000]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_exiting_thread_unmaps_its_snapshot() {
        let _one = ONE_AT_A_TIME.lock().unwrap();
        let before = UNMAPPED.load(Ordering::Relaxed);
        std::thread::spawn(|| {
            let _g = crate::tls::Guard::enter().unwrap();
            let stack = [1u8; 256];
            let sp = stack.as_ptr() as u64;
            assert!(plan(tls::state(), 1, 0, sp, sp + 256).is_some());
        })
        .join()
        .unwrap();
        // The key's destructor ran when the thread exited.
        assert_eq!(UNMAPPED.load(Ordering::Relaxed), before + 1);
    }
}
