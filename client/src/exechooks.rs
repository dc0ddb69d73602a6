//! The exported exec family, `posix_spawn`, `system` and `popen`: each
//! passes the new image an environment that keeps the profiler
//! (`inherit`), says when the image cannot load it (`unprofilable`: on
//! stderr and to the daemon), and forwards to the original (glibc's). An
//! exec of this process's own image first has the daemon keep its maps if
//! objects were loaded since the handshake (`mapsask`).
//!
//! glibc's own functions call each other internally, never through the
//! PLT (`execvp` calls `__execvpe`, `system` and `popen` spawn through the
//! internal `__posix_spawn`), so every entry point a program can reach is
//! hooked:
//!
//! * with an environment argument: `execve`, `execveat`, `fexecve`,
//!   `execvpe`, `execle`, `posix_spawn`, `posix_spawnp`: the repaired copy
//!   is passed instead;
//! * with the process's `environ`: `execv`, `execvp`, `execl`, `execlp`
//!   call `execve`/`execvpe` with a repaired copy of it (the program's own
//!   environment is untouched);
//! * `system` and `popen` take no environment: `environ` itself is
//!   repaired first (`inherit::repair_environ`).
//!
//! `execl`, `execle` and `execlp` are variadic, which stable Rust cannot
//! define: a few instructions of assembly (x86_64 and aarch64) spill the
//! register arguments next to the stack ones and call [`execl_impl`]. The
//! hooks run in `vfork`
//! children and between `fork` and `exec` of threaded programs: they use
//! the stack, raw system calls and no lock. A raw `execve` system call
//! (`syscall(SYS_execve, ...)`) is not seen.

use core::ffi::{CStr, c_char, c_int, c_void};

use crate::hook::{Hook, Kind};
use heapprofd_proto::wire::Unprofilable;

use crate::inherit::{self, Scratch};
use crate::originals;
use crate::unprofilable;

type Argv = *const *const c_char;

unsafe extern "C" {
    /// The process's environment (glibc's `environ`).
    static environ: *const *const c_char;
}

/// Defines one exported exec-family hook and its record; `real` names the
/// original in the body.
macro_rules! exec_hook {
    ($rec:ident, $f:ident, $cname:literal, $sym:literal, ($($a:ident: $t:ty),*) -> $r:ty,
     |$real:ident| { $($body:tt)* }) => {
        #[doc = concat!("The record of `", $sym, "`.")]
        pub(crate) static $rec: Hook = Hook::new($cname, $f as *const (), Kind::Forward);

        #[doc = concat!("`", $sym, "`, keeping the profiler in the new image.")]
        ///
        /// # Safety
        /// Same contract as glibc's function.
        #[cfg_attr(not(test), unsafe(export_name = $sym))]
        pub unsafe extern "C" fn $f($($a: $t),*) -> $r {
            type F = unsafe extern "C" fn($($t),*) -> $r;
            // SAFETY: the original is this very function of glibc's.
            #[allow(unused_variables)]
            let $real: F = unsafe { originals::real::<F>(&$rec) };
            // SAFETY: the caller's contract, forwarded.
            unsafe { $($body)* }
        }
    };
}

exec_hook!(EXECVE, execve, c"execve", "execve", (path: *const c_char, argv: Argv, envp: Argv) -> c_int,
|real| {
    before_exec(unprofilable::check(libc::AT_FDCWD, path, -1), path);
    let mut s = Scratch::new();
    real(path, argv, inherit::repaired(envp, &mut s))
});

exec_hook!(EXECVEAT, execveat, c"execveat", "execveat",
(dirfd: c_int, path: *const c_char, argv: Argv, envp: Argv, flags: c_int) -> c_int,
|real| {
    let by_fd = flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && *path == 0;
    if by_fd {
        before_exec(unprofilable::check(-1, core::ptr::null(), dirfd), core::ptr::null());
    } else {
        before_exec(unprofilable::check(dirfd, path, -1), path);
    }
    let mut s = Scratch::new();
    real(dirfd, path, argv, inherit::repaired(envp, &mut s), flags)
});

exec_hook!(FEXECVE, fexecve, c"fexecve", "fexecve", (fd: c_int, argv: Argv, envp: Argv) -> c_int,
|real| {
    before_exec(unprofilable::check(-1, core::ptr::null(), fd), core::ptr::null());
    let mut s = Scratch::new();
    real(fd, argv, inherit::repaired(envp, &mut s))
});

exec_hook!(EXECVPE, execvpe, c"execvpe", "execvpe", (file: *const c_char, argv: Argv, envp: Argv) -> c_int,
|real| {
    let mut buf = [0u8; 4096];
    let found = searched(file, &mut buf);
    before_exec(found.and_then(|p| unprofilable::check(libc::AT_FDCWD, p, -1)), file);
    let mut s = Scratch::new();
    real(file, argv, inherit::repaired(envp, &mut s))
});

exec_hook!(EXECV, execv, c"execv", "execv", (path: *const c_char, argv: Argv) -> c_int,
|real| {
    execve(path, argv, environ)
});

exec_hook!(EXECVP, execvp, c"execvp", "execvp", (file: *const c_char, argv: Argv) -> c_int,
|real| {
    execvpe(file, argv, environ)
});

exec_hook!(POSIX_SPAWN, posix_spawn, c"posix_spawn", "posix_spawn",
(pid: *mut libc::pid_t, path: *const c_char, fa: *const c_void, attr: *const c_void,
 argv: Argv, envp: Argv) -> c_int,
|real| {
    let why = unprofilable::check(libc::AT_FDCWD, path, -1);
    let mut s = Scratch::new();
    let rc = real(pid, path, fa, attr, argv, inherit::repaired(envp, &mut s));
    after_spawn(rc, pid, why, path);
    rc
});

exec_hook!(POSIX_SPAWNP, posix_spawnp, c"posix_spawnp", "posix_spawnp",
(pid: *mut libc::pid_t, file: *const c_char, fa: *const c_void, attr: *const c_void,
 argv: Argv, envp: Argv) -> c_int,
|real| {
    let mut buf = [0u8; 4096];
    let found = searched(file, &mut buf);
    let why = found.and_then(|p| unprofilable::check(libc::AT_FDCWD, p, -1));
    let mut s = Scratch::new();
    let rc = real(pid, file, fa, attr, argv, inherit::repaired(envp, &mut s));
    after_spawn(rc, pid, why, file);
    rc
});

exec_hook!(SYSTEM, system, c"system", "system", (cmd: *const c_char) -> c_int,
|real| {
    inherit::repair_environ();
    real(cmd)
});

exec_hook!(POPEN, popen, c"popen", "popen", (cmd: *const c_char, mode: *const c_char) -> *mut c_void,
|real| {
    inherit::repair_environ();
    real(cmd, mode)
});

/// The program exec would run for `file` (a `PATH` search), in `buf`.
///
/// # Safety
/// `file` is null or a NUL-terminated string.
unsafe fn searched(file: *const c_char, buf: &mut [u8; 4096]) -> Option<*const c_char> {
    if file.is_null() || !inherit::active() {
        return None;
    }
    // SAFETY: the caller's contract.
    let name = unsafe { CStr::from_ptr(file) };
    unprofilable::search_path(name, buf).map(CStr::as_ptr)
}

/// Before an exec: the daemon reads our maps first if objects were loaded
/// since the handshake (`mapsask`: this image's maps go with the exec),
/// and if the new image cannot load the client, say so (this process
/// keeps its pid and runs unprofiled).
fn before_exec(why: Option<Unprofilable>, path: *const c_char) {
    heapprofd_client_core::mapsask::before_image_ends();
    if let Some(why) = why {
        // SAFETY: getpid has no preconditions.
        unprofilable::report(why, path, unsafe { libc::getpid() } as u32);
    }
}

/// After a `posix_spawn`: if it started a child that cannot load the
/// client, say so for the child.
///
/// # Safety
/// `pid` is null or the caller's `pid_t` out-parameter.
unsafe fn after_spawn(
    rc: c_int,
    pid: *mut libc::pid_t,
    why: Option<Unprofilable>,
    path: *const c_char,
) {
    if rc != 0 || pid.is_null() {
        return;
    }
    if let Some(why) = why {
        // SAFETY: the caller's contract; posix_spawn stored the child's pid.
        unprofilable::report(why, path, unsafe { *pid } as u32);
    }
}

/// Which variadic exec [`execl_impl`] stands for.
const EXECL: u32 = 0;
const EXECLE: u32 = 1;
const EXECLP: u32 = 2;

/// Most arguments `execl_impl` collects (the kernel's limit on argv is
/// far lower in practice: `ARG_MAX` bytes).
const MAX_ARGS: usize = 1 << 20;

/// How many variadic arguments arrive in registers after `path`: x86_64's
/// rsi, rdx, rcx, r8, r9; aarch64's x1..x7 (Linux's AAPCS64 passes
/// variadic arguments like named ones).
#[cfg(target_arch = "aarch64")]
const REG_ARGS: usize = 7;
#[cfg(not(target_arch = "aarch64"))]
const REG_ARGS: usize = 5;

/// The variadic execs, after their assembly spilled the register arguments:
/// `regs` holds the [`REG_ARGS`] after `path`, `stack` the rest. The
/// arguments are `arg0, ..., NULL` (then `envp` for `execle`).
extern "C" fn execl_impl(
    kind: u32,
    path: *const c_char,
    regs: *const usize,
    stack: *const usize,
) -> c_int {
    // SAFETY: the variadic arguments are pointer-sized, REG_ARGS in `regs`
    // and the others on the caller's stack, in order, the list ending with
    // a NULL (the exec functions' contract).
    let arg = |i: usize| unsafe {
        if i < REG_ARGS {
            *regs.add(i)
        } else {
            *stack.add(i - REG_ARGS)
        }
    };
    let n = (0..MAX_ARGS).find(|&i| arg(i) == 0).unwrap_or(MAX_ARGS);
    let mut small = [core::ptr::null::<c_char>(); 256];
    let mut map: *mut c_void = core::ptr::null_mut();
    let bytes = (n + 1) * core::mem::size_of::<*const c_char>();
    let argv: &mut [*const c_char] = if n < small.len() {
        &mut small[..]
    } else {
        // SAFETY: an anonymous private mapping.
        map = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            heapprofd_client_core::errno::set(libc::E2BIG);
            return -1;
        }
        // SAFETY: the mapping holds n + 1 pointers.
        unsafe { core::slice::from_raw_parts_mut(map.cast(), n + 1) }
    };
    for (i, slot) in argv.iter_mut().take(n).enumerate() {
        *slot = arg(i) as *const c_char;
    }
    argv[n] = core::ptr::null();
    // `execle`: the envp after the NULL.
    let envp = if kind == EXECLE {
        arg(n + 1) as Argv
    } else {
        // SAFETY: reading the process's environment pointer.
        unsafe { environ }
    };
    // SAFETY: forwarding the caller's arguments to our own hooks.
    let rc = unsafe {
        if kind == EXECLP {
            execvpe(path, argv.as_ptr(), envp)
        } else {
            execve(path, argv.as_ptr(), envp)
        }
    };
    if !map.is_null() {
        let e = heapprofd_client_core::errno::get();
        // SAFETY: our own mapping; the exec failed and returned.
        unsafe { libc::munmap(map, bytes) };
        heapprofd_client_core::errno::set(e);
    }
    rc
}

/// One variadic exec: spill rsi..r9 next to the stack arguments, call
/// [`execl_impl`] with its kind.
#[cfg(target_arch = "x86_64")]
macro_rules! execl_asm {
    ($rec:ident, $label:ident, $cname:literal, $sym:literal, $kind:expr) => {
        unsafe extern "C" {
            fn $label();
        }

        #[doc = concat!("The record of `", $sym, "` (variadic, in assembly).")]
        pub(crate) static $rec: Hook = Hook::new($cname, $label as *const (), Kind::Forward);

        core::arch::global_asm!(
            ".pushsection .text.{label},\"ax\",@progbits",
            ".p2align 4",
            ".globl {label}",
            ".hidden {label}",
            ".type {label}, @function",
            export!($sym),
            "{label}:",
            ".cfi_startproc",
            "sub rsp, 56",
            ".cfi_adjust_cfa_offset 56",
            "mov [rsp], rsi",
            "mov [rsp + 8], rdx",
            "mov [rsp + 16], rcx",
            "mov [rsp + 24], r8",
            "mov [rsp + 32], r9",
            "mov rsi, rdi",
            "mov edi, {kind}",
            "mov rdx, rsp",
            // The caller's stack arguments start above our frame and the
            // return address.
            "lea rcx, [rsp + 64]",
            "call {imp}",
            "add rsp, 56",
            ".cfi_adjust_cfa_offset -56",
            "ret",
            ".cfi_endproc",
            ".size {label}, . - {label}",
            ".popsection",
            label = sym $label,
            kind = const $kind,
            imp = sym execl_impl,
        );
    };
}

/// One variadic exec on aarch64: spill x1..x7 into the frame, pass the
/// caller's stack arguments (at the entry sp) to [`execl_impl`].
#[cfg(target_arch = "aarch64")]
macro_rules! execl_asm {
    ($rec:ident, $label:ident, $cname:literal, $sym:literal, $kind:expr) => {
        unsafe extern "C" {
            fn $label();
        }

        #[doc = concat!("The record of `", $sym, "` (variadic, in assembly).")]
        pub(crate) static $rec: Hook = Hook::new($cname, $label as *const (), Kind::Forward);

        core::arch::global_asm!(
            ".pushsection .text.{label},\"ax\",%progbits",
            ".p2align 4",
            ".globl {label}",
            ".hidden {label}",
            ".type {label}, %function",
            export!($sym),
            "{label}:",
            ".cfi_startproc",
            "stp x29, x30, [sp, #-80]!",
            ".cfi_def_cfa_offset 80",
            ".cfi_offset x29, -80",
            ".cfi_offset x30, -72",
            "mov x29, sp",
            "stp x1, x2, [sp, #16]",
            "stp x3, x4, [sp, #32]",
            "stp x5, x6, [sp, #48]",
            "str x7, [sp, #64]",
            "mov x1, x0",
            "mov w0, #{kind}",
            "add x2, sp, #16",
            "add x3, sp, #80",
            "bl {imp}",
            "ldp x29, x30, [sp], #80",
            ".cfi_def_cfa_offset 0",
            ".cfi_restore x29",
            ".cfi_restore x30",
            "ret",
            ".cfi_endproc",
            ".size {label}, . - {label}",
            ".popsection",
            label = sym $label,
            kind = const $kind,
            imp = sym execl_impl,
        );
    };
}

execl_asm!(EXECL_REC, heapprofd_rs_execl, c"execl", "execl", EXECL);
execl_asm!(EXECLE_REC, heapprofd_rs_execle, c"execle", "execle", EXECLE);
execl_asm!(EXECLP_REC, heapprofd_rs_execlp, c"execlp", "execlp", EXECLP);
