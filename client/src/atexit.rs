//! The process's end: the library's destructor, which runs when the
//! process exits through `exit` (after the program's own destructors,
//! which may still allocate and free: the client was loaded first, so it
//! is finalized last), and the exported `_exit` and `_Exit`, which skip
//! destructors. A process killed by a signal, or ending with a raw
//! `exit_group` system call, does neither.

use core::ffi::c_int;

use crate::hook::{Hook, Kind};
use crate::originals;

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".fini_array")]
static DESTRUCTOR: extern "C" fn() = destructor;

/// At exit: the heaps of the running session are disabled, the samples
/// threads lost since their last sample are sent, and, if objects were
/// loaded since the handshake, the daemon reads our maps before they are
/// gone (`mapsask`).
#[cfg_attr(test, allow(dead_code))]
extern "C" fn destructor() {
    heapprofd_client_core::heaps::at_exit();
    heapprofd_client_core::stacksample::send_losses_at_exit();
    heapprofd_client_core::mapsask::before_image_ends();
}

/// The record of `_exit`.
pub(crate) static EXIT: Hook = Hook::new(c"_exit", exit_now as *const (), Kind::Forward);
/// The record of `_Exit` (C99's name for it).
pub(crate) static EXIT_C99: Hook = Hook::new(c"_Exit", exit_now_c99 as *const (), Kind::Forward);

/// `_exit`: the maps ask (`mapsask`; nothing without a session this
/// process owns, so a forked child's `_exit` costs a few loads), then
/// glibc's. glibc's own `exit` reaches its `_exit` directly, not here.
///
/// # Safety
/// Same contract as glibc's `_exit`.
#[cfg_attr(not(test), unsafe(export_name = "_exit"))]
pub unsafe extern "C" fn exit_now(status: c_int) -> ! {
    // SAFETY: the record of this very function.
    unsafe { ask_then_forward(&EXIT, status) }
}

/// `_Exit`: as [`exit_now`].
///
/// # Safety
/// Same contract as glibc's `_Exit`.
#[cfg_attr(not(test), unsafe(export_name = "_Exit"))]
pub unsafe extern "C" fn exit_now_c99(status: c_int) -> ! {
    // SAFETY: the record of this very function.
    unsafe { ask_then_forward(&EXIT_C99, status) }
}

/// The maps ask, then the original of `rec` (glibc's `_exit` or `_Exit`).
///
/// # Safety
/// `rec` is [`EXIT`] or [`EXIT_C99`].
unsafe fn ask_then_forward(rec: &'static Hook, status: c_int) -> ! {
    heapprofd_client_core::mapsask::before_image_ends();
    type F = unsafe extern "C" fn(c_int) -> !;
    // SAFETY: the caller's contract: the original is glibc's function of
    // that signature.
    let real: F = unsafe { originals::real::<F>(rec) };
    // SAFETY: forwarded.
    unsafe { real(status) }
}
