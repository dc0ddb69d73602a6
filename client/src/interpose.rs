//! Whether the library interposes the program's malloc (it was preloaded
//! ahead of every other definition) or not (it was `dlopen`ed by an
//! attach, or preloaded after another allocator), in which case a session
//! reaches the program's calls by patching GOTs.
//!
//! Decided by the first walk of `originals` that sees this library (the
//! first hook call or the constructor, whichever comes first): the library
//! interposes if no object before it in load order defines `malloc`. (Not
//! `dlsym(RTLD_DEFAULT, "malloc") == ours`: for a non-PIE program that
//! takes `malloc`'s address, a global lookup returns the program's
//! canonical PLT entry, which jumps to us.)

use core::sync::atomic::{AtomicU8, Ordering};

/// [`interposing`]: not decided (no walk ran).
const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;
static INTERPOSING: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Records the decision (only the first one counts: objects loaded later
/// come after this library and cannot change it).
pub(crate) fn set(yes: bool) {
    let v = if yes { YES } else { NO };
    let _ = INTERPOSING.compare_exchange(UNKNOWN, v, Ordering::SeqCst, Ordering::SeqCst);
}

/// Whether the library interposes the program's malloc (false also when
/// unknown, e.g. the constructor did not run).
pub(crate) fn interposing() -> bool {
    INTERPOSING.load(Ordering::SeqCst) == YES
}

/// Whether sessions of this process need GOT patching.
pub(crate) fn needs_patching() -> bool {
    INTERPOSING.load(Ordering::SeqCst) == NO
}
