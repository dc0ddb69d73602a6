//! Names of stack-sample tags (`heapprofd_register_event`): 64 static
//! slots, each sent once per session as an [`EventNameRecord`] before the
//! first sample of its tag (a handler may be the one that sends it).
//!
//! Registering is not async-signal-safe by contract but takes no lock: a
//! slot is claimed with a compare-exchange, its name written, then
//! published. Tag 0 is CPU time and cannot be renamed. A tag that was never
//! named reaches the trace as `event-<tag>`.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use heapprofd_proto::wire::{EventNameRecord, HEAP_NAME_LEN, TAG_CPU_TIME, heap_name_field};

/// Named tags a process may have.
pub const MAX_EVENTS: usize = 64;

/// `register_event`'s result: the name is not 1 to 63 bytes of UTF-8
/// without NUL and comma, or the tag is 0.
pub const INVALID: i32 = -1;
/// The tag already has another name.
pub const TAG_TAKEN: i32 = -2;
/// Every slot is used.
pub const FULL: i32 = -3;

const FREE: u8 = 0;
const WRITING: u8 = 1;
const READY: u8 = 2;

struct Slot {
    state: AtomicU8,
    tag: AtomicU64,
    name: UnsafeCell<[u8; HEAP_NAME_LEN]>,
    /// The mode word of the session the name was last sent in.
    sent: AtomicU64,
}

// SAFETY: `name` is written only by the thread that claimed the slot
// (state WRITING) and read only once the state is READY (acquire).
unsafe impl Sync for Slot {}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    state: AtomicU8::new(FREE),
    tag: AtomicU64::new(0),
    name: UnsafeCell::new([0; HEAP_NAME_LEN]),
    sent: AtomicU64::new(0),
};
static SLOTS: [Slot; MAX_EVENTS] = [EMPTY; MAX_EVENTS];

fn find(tag: u64) -> Option<&'static Slot> {
    SLOTS
        .iter()
        .find(|s| s.state.load(Ordering::Acquire) == READY && s.tag.load(Ordering::Relaxed) == tag)
}

/// Names `tag`; 0 on success (also when it already has this name).
pub fn register_event(tag: u64, name: &[u8]) -> i32 {
    let Some(field) = core::str::from_utf8(name)
        .ok()
        .filter(|n| !n.is_empty() && n.len() < HEAP_NAME_LEN && !n.contains(['\0', ',']))
        .and_then(heap_name_field)
    else {
        return INVALID;
    };
    if tag == TAG_CPU_TIME {
        return INVALID;
    }
    if let Some(s) = find(tag) {
        // SAFETY: READY: the name is no longer written.
        return if unsafe { *s.name.get() } == field {
            0
        } else {
            TAG_TAKEN
        };
    }
    for s in SLOTS.iter() {
        if s.state
            .compare_exchange(FREE, WRITING, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.tag.store(tag, Ordering::Relaxed);
            // SAFETY: we claimed the slot; no reader looks at it before READY.
            unsafe { *s.name.get() = field };
            s.sent.store(0, Ordering::Relaxed);
            s.state.store(READY, Ordering::Release);
            return 0;
        }
    }
    FULL
}

/// Sends `tag`'s name with `write` unless it was sent in the session
/// `mode_word`. False if it had to be sent and could not be (the sample
/// must then not go before it). Async-signal-safe.
pub(crate) fn ensure_sent(tag: u64, mode_word: u64, write: impl FnOnce(&[u8]) -> bool) -> bool {
    let Some(s) = find(tag) else {
        return true;
    };
    if s.sent.load(Ordering::Acquire) == mode_word {
        return true;
    }
    // SAFETY: READY: the name is no longer written.
    let name = unsafe { *s.name.get() };
    let rec = EventNameRecord { tag, name }.encode();
    if !write(&rec) {
        return false;
    }
    // Two threads may both send it; a sample never precedes its name.
    s.sent.store(mode_word, Ordering::Release);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_kept_and_sent_once_per_session() {
        assert_eq!(register_event(0, b"cpu"), INVALID);
        assert_eq!(register_event(5, b""), INVALID);
        assert_eq!(register_event(5, b"a,b"), INVALID);
        assert_eq!(register_event(5, b"page-faults"), 0);
        assert_eq!(register_event(5, b"page-faults"), 0);
        assert_eq!(register_event(5, b"other"), TAG_TAKEN);
        let mut sent = Vec::new();
        let mut write = |r: &[u8]| {
            sent.push(EventNameRecord::decode(r).unwrap().name_str().to_owned());
            true
        };
        assert!(ensure_sent(5, 2, &mut write));
        assert!(ensure_sent(5, 2, &mut write));
        assert!(ensure_sent(5, 4, &mut write));
        assert!(ensure_sent(77, 4, &mut write), "unnamed tags need nothing");
        assert_eq!(sent, ["page-faults", "page-faults"]);
        assert!(!ensure_sent(5, 6, |_| false));
    }
}
