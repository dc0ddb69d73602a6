//! The exported C++ `operator new`/`delete` (every variant: plain and
//! array, sized, aligned, nothrow) and their hook records.
//!
//! Whether a call is recorded here depends on who defines the original
//! (`originals`): an allocator that defines its own operators next to its
//! `malloc` (tcmalloc, mimalloc, jemalloc) serves `new` without calling
//! `malloc`, so the hook records it; libstdc++'s `operator new` calls
//! `malloc`, which is recorded there, so the hook only forwards (one byte
//! load, then a jump). Calls the allocator makes to its own entry points
//! (jemalloc's `delete` jumps to `free` through its PLT) are sent straight
//! to it by `got::bypass`, so nothing is counted twice.
//!
//! The four throwing `new`s can throw `std::bad_alloc` out of the
//! original. `panic = "abort"` makes every Rust frame a wall for unwinding
//! (a foreign exception through a Rust frame aborts the process), so those
//! hooks are assembly with call-frame information and no Rust frame
//! between the original and the program: an unrecorded call is a jump to
//! the original, a recorded one calls it from an assembly frame and then
//! calls [`new_record`]. The nothrow `new`s and every `delete` cannot
//! throw and are Rust. The assembly exists for x86_64 and aarch64.

use core::ffi::c_void;

use heapprofd_client_core::hookpath::{may_be_sampled, mode, on_alloc, on_free, skip};

use crate::hook::{Hook, Kind};
use crate::{hooks, originals};

/// A nothrow `operator new` variant: `(size, [align,] nothrow)`.
macro_rules! new_nothrow {
    ($rec:ident, $f:ident, $cname:literal, $sym:literal, ($($a:ident: $t:ty),*)) => {
        #[doc = concat!("The record of `", $sym, "`.")]
        pub(crate) static $rec: Hook =
            Hook::cxx($cname, $f as *const (), Kind::CxxNew, &hooks::MALLOC);

        #[doc = concat!("`", $sym, "`: a nothrow `operator new`.")]
        ///
        /// # Safety
        /// Same contract as the C++ operator.
        #[cfg_attr(not(test), unsafe(export_name = $sym))]
        pub unsafe extern "C" fn $f(size: usize $(, $a: $t)*) -> *mut c_void {
            type F = unsafe extern "C" fn(usize $(, $t)*) -> *mut c_void;
            #[cold]
            #[inline(never)]
            unsafe fn slow(size: usize $(, $a: $t)*, m: u64) -> *mut c_void {
                // SAFETY: forwarding with the caller's arguments.
                let p = unsafe { originals::real::<F>(&$rec)(size $(, $a)*) };
                on_alloc(p, size, m);
                p
            }
            let m = mode();
            if !$rec.recorded() || m == 0 || skip(size, m) {
                // SAFETY: forwarding with the caller's arguments.
                return unsafe { originals::real::<F>(&$rec)(size $(, $a)*) };
            }
            // SAFETY: the caller's contract.
            unsafe { slow(size $(, $a)*, m) }
        }
    };
}

/// An `operator delete` variant: `(ptr, [size,] [align,] [nothrow])`.
macro_rules! delete {
    ($rec:ident, $f:ident, $cname:literal, $sym:literal, ($($a:ident: $t:ty),*)) => {
        #[doc = concat!("The record of `", $sym, "`.")]
        pub(crate) static $rec: Hook =
            Hook::cxx($cname, $f as *const (), Kind::CxxDelete, &hooks::FREE);

        #[doc = concat!("`", $sym, "`: an `operator delete`.")]
        ///
        /// # Safety
        /// Same contract as the C++ operator.
        #[cfg_attr(not(test), unsafe(export_name = $sym))]
        pub unsafe extern "C" fn $f(p: *mut c_void $(, $a: $t)*) {
            type F = unsafe extern "C" fn(*mut c_void $(, $t)*);
            #[cold]
            #[inline(never)]
            unsafe fn slow(p: *mut c_void $(, $a: $t)*) {
                // Before the allocator can hand the address out again.
                on_free(p);
                // SAFETY: forwarding with the caller's arguments.
                unsafe { originals::real::<F>(&$rec)(p $(, $a)*) }
            }
            if $rec.recorded() && may_be_sampled(p) {
                // SAFETY: the caller's contract.
                return unsafe { slow(p $(, $a)*) };
            }
            // SAFETY: forwarding with the caller's arguments.
            unsafe { originals::real::<F>(&$rec)(p $(, $a)*) }
        }
    };
}

type Align = usize;
type Nothrow = *const c_void;

new_nothrow!(NEW_NOTHROW, new_nothrow, c"_ZnwmRKSt9nothrow_t", "_ZnwmRKSt9nothrow_t", (nt: Nothrow));
new_nothrow!(NEW_ARRAY_NOTHROW, new_array_nothrow, c"_ZnamRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", (nt: Nothrow));
new_nothrow!(NEW_ALIGNED_NOTHROW, new_aligned_nothrow, c"_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t", (al: Align, nt: Nothrow));
new_nothrow!(NEW_ARRAY_ALIGNED_NOTHROW, new_array_aligned_nothrow,
    c"_ZnamSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
    (al: Align, nt: Nothrow));

delete!(DELETE, delete_plain, c"_ZdlPv", "_ZdlPv", ());
delete!(DELETE_ARRAY, delete_array, c"_ZdaPv", "_ZdaPv", ());
delete!(DELETE_SIZED, delete_sized, c"_ZdlPvm", "_ZdlPvm", (size: usize));
delete!(DELETE_ARRAY_SIZED, delete_array_sized, c"_ZdaPvm", "_ZdaPvm", (size: usize));
delete!(DELETE_NOTHROW, delete_nothrow, c"_ZdlPvRKSt9nothrow_t", "_ZdlPvRKSt9nothrow_t",
    (nt: Nothrow));
delete!(DELETE_ARRAY_NOTHROW, delete_array_nothrow, c"_ZdaPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t", (nt: Nothrow));
delete!(DELETE_ALIGNED, delete_aligned, c"_ZdlPvSt11align_val_t", "_ZdlPvSt11align_val_t",
    (al: Align));
delete!(DELETE_ARRAY_ALIGNED, delete_array_aligned, c"_ZdaPvSt11align_val_t",
    "_ZdaPvSt11align_val_t", (al: Align));
delete!(DELETE_SIZED_ALIGNED, delete_sized_aligned, c"_ZdlPvmSt11align_val_t",
    "_ZdlPvmSt11align_val_t", (size: usize, al: Align));
delete!(DELETE_ARRAY_SIZED_ALIGNED, delete_array_sized_aligned, c"_ZdaPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t", (size: usize, al: Align));
delete!(DELETE_ALIGNED_NOTHROW, delete_aligned_nothrow, c"_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t", (al: Align, nt: Nothrow));
delete!(DELETE_ARRAY_ALIGNED_NOTHROW, delete_array_aligned_nothrow,
    c"_ZdaPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t",
    (al: Align, nt: Nothrow));

/// The throwing `new`s' decision, called by their assembly when the record
/// is recorded and a session is on: the mode to record the allocation
/// under, or 0 (not sampled: the assembly jumps to the original).
extern "C" fn new_decide(size: usize) -> u64 {
    let m = mode();
    if m == 0 || skip(size, m) { 0 } else { m }
}

/// After a throwing `new` that [`new_decide`] picked returned `p`.
extern "C" fn new_record(p: *mut c_void, size: usize, m: u64) {
    on_alloc(p, size, m);
}

/// The original of a throwing `new` that was not known when its assembly
/// ran (a call before the constructor).
extern "C" fn new_resolve(rec: &'static Hook) -> usize {
    originals::target(rec)
}

/// A throwing `operator new` variant: `(size[, align])`, in assembly.
#[cfg(target_arch = "x86_64")]
macro_rules! new_throwing {
    ($rec:ident, $label:ident, $cname:literal, $sym:literal) => {
        unsafe extern "C" {
            fn $label();
        }

        #[doc = concat!("The record of `", $sym, "` (a throwing `operator new`).")]
        pub(crate) static $rec: Hook =
            Hook::cxx($cname, $label as *const (), Kind::CxxNew, &hooks::MALLOC);

        core::arch::global_asm!(
            ".pushsection .text.{label},\"ax\",@progbits",
            ".p2align 4",
            ".globl {label}",
            ".hidden {label}",
            ".type {label}, @function",
            export!($sym),
            "{label}:",
            ".cfi_startproc",
            // Unrecorded (libstdc++'s operator) or no session: jump.
            "cmp byte ptr [rip + {rec} + {recorded}], 0",
            "je 3f",
            "cmp qword ptr [rip + {hot}], 0",
            "je 3f",
            "push rdi",
            ".cfi_adjust_cfa_offset 8",
            "push rsi",
            ".cfi_adjust_cfa_offset 8",
            "sub rsp, 8",
            ".cfi_adjust_cfa_offset 8",
            "call {decide}",
            "add rsp, 8",
            ".cfi_adjust_cfa_offset -8",
            "pop rsi",
            ".cfi_adjust_cfa_offset -8",
            "pop rdi",
            ".cfi_adjust_cfa_offset -8",
            "test rax, rax",
            "jnz 2f",
            "3:",
            "mov rax, qword ptr [rip + {rec} + {original}]",
            "test rax, rax",
            "jz 4f",
            "jmp rax",
            // Sampled: call the original from this frame (it may throw:
            // the unwinder restores rbx, r12, r13 from the CFI below), then
            // record. `recorded` is only set once the original is known.
            "2:",
            "push rbx",
            ".cfi_adjust_cfa_offset 8",
            ".cfi_rel_offset rbx, 0",
            "push r12",
            ".cfi_adjust_cfa_offset 8",
            ".cfi_rel_offset r12, 0",
            "push r13",
            ".cfi_adjust_cfa_offset 8",
            ".cfi_rel_offset r13, 0",
            "mov rbx, rax",
            "mov r12, rdi",
            "call qword ptr [rip + {rec} + {original}]",
            "mov r13, rax",
            "mov rdi, rax",
            "mov rsi, r12",
            "mov rdx, rbx",
            "call {record}",
            "mov rax, r13",
            "pop r13",
            ".cfi_adjust_cfa_offset -8",
            ".cfi_restore r13",
            "pop r12",
            ".cfi_adjust_cfa_offset -8",
            ".cfi_restore r12",
            "pop rbx",
            ".cfi_adjust_cfa_offset -8",
            ".cfi_restore rbx",
            "ret",
            // Not resolved yet: resolve, then jump.
            "4:",
            "push rdi",
            ".cfi_adjust_cfa_offset 8",
            "push rsi",
            ".cfi_adjust_cfa_offset 8",
            "sub rsp, 8",
            ".cfi_adjust_cfa_offset 8",
            "lea rdi, [rip + {rec}]",
            "call {resolve}",
            "add rsp, 8",
            ".cfi_adjust_cfa_offset -8",
            "pop rsi",
            ".cfi_adjust_cfa_offset -8",
            "pop rdi",
            ".cfi_adjust_cfa_offset -8",
            "jmp rax",
            ".cfi_endproc",
            ".size {label}, . - {label}",
            ".popsection",
            label = sym $label,
            rec = sym $rec,
            recorded = const core::mem::offset_of!(Hook, recorded),
            original = const core::mem::offset_of!(Hook, original),
            hot = sym heapprofd_client_core::state::HOT,
            decide = sym new_decide,
            record = sym new_record,
            resolve = sym new_resolve,
        );
    };
}

/// A throwing `operator new` variant on aarch64 (the same paths as the
/// x86_64 one): x0/x1 saved in the frame across the decision; a sampled
/// call keeps the mode in x19 (saved, described by the CFI for an
/// exception thrown out of the original) and the size in the frame.
#[cfg(target_arch = "aarch64")]
macro_rules! new_throwing {
    ($rec:ident, $label:ident, $cname:literal, $sym:literal) => {
        unsafe extern "C" {
            fn $label();
        }

        #[doc = concat!("The record of `", $sym, "` (a throwing `operator new`).")]
        pub(crate) static $rec: Hook =
            Hook::cxx($cname, $label as *const (), Kind::CxxNew, &hooks::MALLOC);

        core::arch::global_asm!(
            ".pushsection .text.{label},\"ax\",%progbits",
            ".p2align 4",
            ".globl {label}",
            ".hidden {label}",
            ".type {label}, %function",
            export!($sym),
            "{label}:",
            ".cfi_startproc",
            // Unrecorded (libstdc++'s operator) or no session: jump.
            "adrp x16, {rec}",
            "add x16, x16, :lo12:{rec}",
            "ldrb w17, [x16, #{recorded}]",
            "cbz w17, 3f",
            "adrp x17, {hot}",
            "ldr x17, [x17, :lo12:{hot}]",
            "cbz x17, 3f",
            "stp x29, x30, [sp, #-48]!",
            ".cfi_def_cfa_offset 48",
            ".cfi_offset x29, -48",
            ".cfi_offset x30, -40",
            "mov x29, sp",
            "stp x0, x1, [sp, #16]",
            "str x19, [sp, #32]",
            ".cfi_offset x19, -16",
            "bl {decide}",
            "cbz x0, 5f",
            // Sampled: call the original from this frame (it may throw),
            // then record. `recorded` is only set once the original is known.
            "mov x19, x0",
            "ldp x0, x1, [sp, #16]",
            "adrp x16, {rec}",
            "add x16, x16, :lo12:{rec}",
            "ldr x16, [x16, #{original}]",
            "blr x16",
            "str x0, [sp, #24]",
            "ldr x1, [sp, #16]",
            "mov x2, x19",
            "bl {record}",
            "ldr x0, [sp, #24]",
            ".cfi_remember_state",
            "ldr x19, [sp, #32]",
            "ldp x29, x30, [sp], #48",
            ".cfi_def_cfa_offset 0",
            ".cfi_restore x19",
            ".cfi_restore x29",
            ".cfi_restore x30",
            "ret",
            ".cfi_restore_state",
            // Not sampled after all: pop the frame, then jump.
            "5:",
            "ldp x0, x1, [sp, #16]",
            "ldr x19, [sp, #32]",
            "ldp x29, x30, [sp], #48",
            ".cfi_def_cfa_offset 0",
            ".cfi_restore x19",
            ".cfi_restore x29",
            ".cfi_restore x30",
            "3:",
            "adrp x16, {rec}",
            "add x16, x16, :lo12:{rec}",
            "ldr x17, [x16, #{original}]",
            "cbz x17, 4f",
            "br x17",
            // Not resolved yet: resolve, then jump.
            "4:",
            "stp x29, x30, [sp, #-32]!",
            ".cfi_def_cfa_offset 32",
            ".cfi_offset x29, -32",
            ".cfi_offset x30, -24",
            "mov x29, sp",
            "stp x0, x1, [sp, #16]",
            "mov x0, x16",
            "bl {resolve}",
            "mov x17, x0",
            "ldp x0, x1, [sp, #16]",
            "ldp x29, x30, [sp], #32",
            ".cfi_def_cfa_offset 0",
            ".cfi_restore x29",
            ".cfi_restore x30",
            "br x17",
            ".cfi_endproc",
            ".size {label}, . - {label}",
            ".popsection",
            label = sym $label,
            rec = sym $rec,
            recorded = const core::mem::offset_of!(Hook, recorded),
            original = const core::mem::offset_of!(Hook, original),
            hot = sym heapprofd_client_core::state::HOT,
            decide = sym new_decide,
            record = sym new_record,
            resolve = sym new_resolve,
        );
    };
}

new_throwing!(NEW, heapprofd_rs_cxx_new, c"_Znwm", "_Znwm");
new_throwing!(NEW_ARRAY, heapprofd_rs_cxx_new_array, c"_Znam", "_Znam");
new_throwing!(
    NEW_ALIGNED,
    heapprofd_rs_cxx_new_aligned,
    c"_ZnwmSt11align_val_t",
    "_ZnwmSt11align_val_t"
);
new_throwing!(
    NEW_ARRAY_ALIGNED,
    heapprofd_rs_cxx_new_array_aligned,
    c"_ZnamSt11align_val_t",
    "_ZnamSt11align_val_t"
);
