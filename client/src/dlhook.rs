//! The `dlopen` hook: objects a call loads get patched (a patched,
//! attached client) and the in-process walk's tables get them
//! (`walktables`, once the program prepared the walk API).
//!
//! Reached through patched GOT slots (an attached client, or a preloaded
//! one that does not interpose) and, exported, through interposition (a
//! preloaded client). glibc's `dlopen` looks at its return address to find
//! the calling object (its namespace, `RUNPATH` and `$ORIGIN`), so a
//! wrapper that calls it could change what gets loaded. The hook is a few
//! instructions of assembly: it asks [`dlopen_decide`], with the caller's
//! return address, whether the call needs handling and loads the same
//! object from here (`dlcaller`: a path in the caller's namespace, or a
//! bare name whose search does not depend on the caller); then the call
//! goes to [`dlopen_wrapped`], which calls glibc's `dlopen` and, once it
//! returns, patches the new objects and rebuilds the walk's tables. Every
//! other call is a tail jump to glibc's `dlopen`, which then sees the
//! caller's own return address: a preloaded client whose program never
//! prepared the walk API leaves every call to glibc that way; a patched
//! one sets `newobjects::NEW_OBJECTS`, and the next sampled allocation
//! (or the watcher's poll of `dlpi_adds`) patches those objects.
//!
//! glibc's `dlopen` (libc's since glibc 2.34, libdl's before) is the
//! original of the hook's record, [`DLOPEN`]: the assembly jumps through
//! that field, which [`dlopen_decide`] resolves first.

use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::Ordering;

use crate::hook::{Hook, Kind};
use crate::newobjects::{NEW_OBJECTS, after_dlopen};
use crate::{dlcaller, interpose, originals};

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
unsafe extern "C" {
    fn heapprofd_rs_dlopen_hook();
}

/// The record of the `dlopen` hook (no hook where there is none: objects
/// loaded by `dlopen` are then found by the watcher's poll only).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) static DLOPEN: Hook = Hook::new(
    c"dlopen",
    heapprofd_rs_dlopen_hook as *const (),
    Kind::Loader,
);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) static DLOPEN: Hook = Hook::new(c"dlopen", core::ptr::null(), Kind::Loader);

/// Whether the hook should wrap this call (1) or tail-jump to glibc (0),
/// `caller` being the hook's return address. Resolves glibc's `dlopen`
/// first (the tail jump goes through the record).
extern "C" fn dlopen_decide(file: *const c_char, caller: usize) -> u32 {
    let _ = originals::target(&DLOPEN);
    if file.is_null() {
        return 0; // the program's own handle: nothing loaded
    }
    // SAFETY: dlopen's argument is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(file) }.to_bytes();
    let patched = !interpose::interposing();
    let wrap = wraps(name, caller, patched, crate::walktables::prepared());
    if !wrap && patched {
        // Glibc's dlopen runs on its own: the objects it adds are patched
        // by the next sampled allocation (or the watcher's poll).
        NEW_OBJECTS.store(true, Ordering::Relaxed);
    }
    u32::from(wrap)
}

/// The decision: interposing (`patched` false), the hook is reached by
/// every `dlopen` of the program, and only one that prepared the walk API
/// needs anything done; and only a call that loads the same from here.
fn wraps(name: &[u8], caller: usize, patched: bool, prepared: bool) -> bool {
    (patched || prepared) && dlcaller::caller_independent(name, caller)
}

type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;

/// A wrapped `dlopen`: glibc's, then the new objects are patched (if the
/// client patches) and the walk's tables rebuilt (if prepared).
extern "C" fn dlopen_wrapped(file: *const c_char, mode: c_int) -> *mut c_void {
    let real = DLOPEN.original();
    if real == 0 {
        return core::ptr::null_mut();
    }
    // SAFETY: the original is glibc's dlopen (resolved by the decision),
    // called with the caller's arguments.
    let h = unsafe { core::mem::transmute::<usize, DlopenFn>(real)(file, mode) };
    if !h.is_null() {
        if !interpose::interposing() {
            after_dlopen();
        }
        crate::walktables::refresh_if_prepared();
    }
    h
}

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.heapprofd_rs_dlopen_hook,\"ax\",@progbits",
    ".p2align 4",
    ".globl heapprofd_rs_dlopen_hook",
    ".hidden heapprofd_rs_dlopen_hook",
    ".type heapprofd_rs_dlopen_hook, @function",
    export!("dlopen"),
    "heapprofd_rs_dlopen_hook:",
    ".cfi_startproc",
    "push rdi",
    ".cfi_adjust_cfa_offset 8",
    "push rsi",
    ".cfi_adjust_cfa_offset 8",
    "sub rsp, 8",
    ".cfi_adjust_cfa_offset 8",
    "mov rsi, qword ptr [rsp + 24]", // the caller's return address
    "call {decide}",
    "add rsp, 8",
    ".cfi_adjust_cfa_offset -8",
    "pop rsi",
    ".cfi_adjust_cfa_offset -8",
    "pop rdi",
    ".cfi_adjust_cfa_offset -8",
    "test eax, eax",
    "jnz 2f",
    "jmp qword ptr [rip + {record} + {original}]",
    "2:",
    "jmp {wrapped}",
    ".cfi_endproc",
    ".size heapprofd_rs_dlopen_hook, . - heapprofd_rs_dlopen_hook",
    ".popsection",
    decide = sym dlopen_decide,
    record = sym DLOPEN,
    original = const core::mem::offset_of!(Hook, original),
    wrapped = sym dlopen_wrapped,
);

// The same on aarch64: x0/x1 kept in the frame across the decision, the
// frame popped before the jump so glibc sees the caller's x30.
#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".pushsection .text.heapprofd_rs_dlopen_hook,\"ax\",%progbits",
    ".p2align 4",
    ".globl heapprofd_rs_dlopen_hook",
    ".hidden heapprofd_rs_dlopen_hook",
    ".type heapprofd_rs_dlopen_hook, %function",
    export!("dlopen"),
    "heapprofd_rs_dlopen_hook:",
    ".cfi_startproc",
    "stp x29, x30, [sp, #-32]!",
    ".cfi_def_cfa_offset 32",
    ".cfi_offset x29, -32",
    ".cfi_offset x30, -24",
    "mov x29, sp",
    "stp x0, x1, [sp, #16]",
    "mov x1, x30", // the caller's return address
    "bl {decide}",
    "mov w9, w0",
    "ldp x0, x1, [sp, #16]",
    "ldp x29, x30, [sp], #32",
    ".cfi_def_cfa_offset 0",
    ".cfi_restore x29",
    ".cfi_restore x30",
    "cbnz w9, 2f",
    "adrp x16, {record}",
    "add x16, x16, :lo12:{record}",
    "ldr x16, [x16, #{original}]",
    "br x16",
    "2:",
    "b {wrapped}",
    ".cfi_endproc",
    ".size heapprofd_rs_dlopen_hook, . - heapprofd_rs_dlopen_hook",
    ".popsection",
    decide = sym dlopen_decide,
    record = sym DLOPEN,
    original = const core::mem::offset_of!(Hook, original),
    wrapped = sym dlopen_wrapped,
);

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const _: (
    extern "C" fn(*const c_char, usize) -> u32,
    extern "C" fn(*const c_char, c_int) -> *mut c_void,
) = (dlopen_decide, dlopen_wrapped);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_what_loads_the_same_from_here_when_needed() {
        let here = wraps as *const () as usize;
        for (patched, prepared) in [(true, false), (false, true), (true, true)] {
            assert!(wraps(b"/usr/lib/libx.so", here, patched, prepared));
            assert!(wraps(b"./libx.so", here, patched, prepared));
            assert!(!wraps(b"$ORIGIN/libx.so", here, patched, prepared));
        }
        // Interposing, unprepared: every call goes to glibc untouched.
        assert!(!wraps(b"/usr/lib/libx.so", here, false, false));
    }

    #[test]
    fn decide_resolves_the_original_first() {
        let here = wraps as *const () as usize;
        assert_eq!(dlopen_decide(core::ptr::null(), here), 0);
        assert_ne!(DLOPEN.original(), 0);
    }
}
