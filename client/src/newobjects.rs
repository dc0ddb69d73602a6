//! Objects loaded while a session is patched: finding and patching them.
//!
//! Three ways in. A `dlopen` of a plain path goes through the `dlopen` hook
//! (`dlhook`), which patches what the call added as soon as glibc's `dlopen`
//! returns ([`after_dlopen`]). Any other `dlopen` is a tail jump to glibc's,
//! which flags [`NEW_OBJECTS`]; the next sampled allocation then patches
//! what it added ([`catch_up`]). As a safety net (and for glibc's own
//! `dlopen`s: NSS, iconv), the watcher compares `dlpi_adds` every
//! [`POLL_MS`] and patches objects that appeared ([`poll`]; a synchronous
//! session has no watcher). The first two run inside the program's calls:
//! they only try the patch lock, never wait for it, and keep the caller's
//! `errno`.

use core::sync::atomic::{AtomicBool, Ordering};

use heapprofd_client_core::errno;
use heapprofd_client_core::mapsask::objects_added;
use heapprofd_client_core::tls::Guard;

use crate::got;

/// How often the watcher looks for newly loaded objects while patched.
pub(crate) const POLL_MS: u16 = 200;

/// Set by the `dlopen` hook when glibc's `dlopen` ran unwrapped: objects
/// may have been added since the last pass.
pub(crate) static NEW_OBJECTS: AtomicBool = AtomicBool::new(false);

/// Patches objects loaded since the last pass, if any (the watcher, every
/// [`POLL_MS`]).
pub(crate) fn poll() {
    let mut st = got::lock();
    if st.active() && objects_added() != st.adds() {
        st.patch_new();
    }
}

/// On a sampled allocation (guard held): if a bare-name `dlopen` ran since
/// the last pass and the set of objects changed, patch the new ones. One
/// relaxed load otherwise. Never waits for the patch lock.
#[inline]
pub(crate) fn catch_up() {
    if !NEW_OBJECTS.load(Ordering::Relaxed) {
        return;
    }
    catch_up_slow();
}

#[cold]
fn catch_up_slow() {
    let saved = errno::get();
    if let Some(mut st) = got::try_lock() {
        if !st.active() {
            NEW_OBJECTS.store(false, Ordering::Relaxed);
        } else if objects_added() != st.adds() {
            // (Still set if the dlopen has not added its objects yet.)
            NEW_OBJECTS.store(false, Ordering::Relaxed);
            st.patch_new();
        }
    }
    errno::set(saved);
}

/// After a wrapped `dlopen` succeeded: patch the new objects now, unless
/// someone else is patching (the watcher's poll catches up).
pub(crate) fn after_dlopen() {
    let Some(_g) = Guard::enter() else { return };
    let saved = errno::get();
    if let Some(mut st) = got::try_lock() {
        st.patch_new();
    }
    errno::set(saved);
}
