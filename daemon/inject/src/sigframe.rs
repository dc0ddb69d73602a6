//! The way back that needs no tracer: what makes killing `record --pid`
//! at any moment of an injection harmless to the target.
//!
//! Every injected call returns into a 12-byte stub written at the
//! program's entry point (`AT_ENTRY`: `_start`, which never runs again once
//! the program started, as gdb uses it for its own inferior calls):
//!
//! ```text
//!  +0  mov  %rax, %rdi     the call's result, for the tracer to read
//!  +3  mov  $15, %eax      rt_sigreturn
//!  +8  syscall
//! +10  ud2                 never reached
//! ```
//!
//! Above the call's stack pointer lies a signal frame (`struct
//! rt_sigframe`: the return address slot, a `ucontext` holding the
//! thread's saved general registers, signal mask and a pointer to its
//! saved XSAVE area) built before the first call. The tracer runs the
//! thread with `PTRACE_SYSCALL` and catches the stub's `rt_sigreturn` at
//! its system-call entry stop (the result is in `rdi`): there it either
//! starts the next call or, after the last one, moves the thread to an
//! ordinary stop and restores its registers exactly as before. If the
//! tracer vanishes (SIGKILL), the kernel detaches the thread wherever it
//! is; the call it is in finishes, returns into the stub, and
//! `rt_sigreturn` puts every register, the vector state and the signal mask
//! back: the thread resumes where it was interrupted. A thread that was
//! stopped inside a blocking system call gets it restarted (`rip` moved
//! back to the `syscall` instruction with the call number in `rax`, what
//! the kernel does for a restart without a handler; a call that would have
//! been restarted through `restart_syscall`, such as `nanosleep`, starts
//! again with its original arguments). The alternate signal stack is left
//! alone (the frame's `uc_stack` has invalid flags, which `rt_sigreturn`
//! ignores).

use crate::ptrace::Regs;

/// The stub's code (see the module docs).
pub(crate) const STUB: [u8; 12] = [
    0x48, 0x89, 0xc7, // mov %rax,%rdi
    0xb8, 0x0f, 0x00, 0x00, 0x00, // mov $15,%eax
    0x0f, 0x05, // syscall
    0x0f, 0x0b, // ud2
];
/// Offset in the stub of the `rt_sigreturn` sequence (skipping the result move).
pub(crate) const STUB_SIGRETURN: u64 = 3;
/// Offset in the stub just after the `syscall`: where the thread is at the
/// system-call stop of the stub's `rt_sigreturn`.
pub(crate) const STUB_SYSCALL_END: u64 = 10;
/// `__NR_rt_sigreturn` on x86_64.
pub(crate) const NR_RT_SIGRETURN: u64 = 15;

/// Bytes of the frame: the return-address slot, the kernel's `struct
/// ucontext` (`uc_flags`, `uc_link`, `uc_stack`, `uc_mcontext`, a 64-bit
/// `uc_sigmask`) and a `siginfo`, which `rt_sigreturn` does not read.
pub(crate) const FRAME_LEN: usize = 8 + UCONTEXT_LEN + 128;
/// The kernel's `struct ucontext` on x86_64.
const UCONTEXT_LEN: usize = 8 + 8 + 24 + 256 + 8;
// glibc's (and bionic's) ucontext_t starts like the kernel's (its sigmask is longer).
const _: () = assert!(std::mem::offset_of!(libc::ucontext_t, uc_mcontext) == 40);
#[cfg(not(target_os = "android"))]
const _: () = assert!(std::mem::offset_of!(libc::ucontext_t, uc_sigmask) == 296);
// bionic names its sigmask union `uc_sigmask64`.
#[cfg(target_os = "android")]
const _: () = assert!(std::mem::offset_of!(libc::ucontext_t, uc_sigmask64) == 296);
const _: () = assert!(std::mem::size_of::<libc::mcontext_t>() == 256);

/// `uc_flags`: the frame holds an XSAVE area, `ss` is in the context and
/// is restored as it is.
const UC_FP_XSTATE: u64 = 1;
const UC_SIGCONTEXT_SS: u64 = 2;
const UC_STRICT_RESTORE_SS: u64 = 4;

/// An `ss_flags` value that is neither 0, `SS_ONSTACK` nor `SS_DISABLE`:
/// `rt_sigreturn`'s `restore_altstack` fails on it and changes nothing.
const SS_FLAGS_KEEP: i32 = 3;

/// The "restart" errors a system call interrupted by a stop returns until
/// the kernel restarts it.
const ERESTARTSYS: i64 = 512;
const ERESTARTNOINTR: i64 = 513;
const ERESTARTNOHAND: i64 = 514;
const ERESTART_RESTARTBLOCK: i64 = 516;

/// Where and how the thread resumes after the frame's `rt_sigreturn`:
/// `(rip, rax)`. An interrupted system call is restarted (see the module docs).
pub(crate) fn resume_point(saved: &Regs) -> (u64, u64) {
    let in_syscall = saved.orig_rax as i64 >= 0;
    let restart = matches!(
        -(saved.rax as i64),
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK
    );
    if in_syscall && restart {
        (saved.rip.wrapping_sub(2), saved.orig_rax)
    } else {
        (saved.rip, saved.rax)
    }
}

/// The signal frame that resumes `saved` with signal mask `sigmask`, the
/// XSAVE area being at `fpstate` in the target (0: none); its first word
/// is `ret`, the calls' return address (the stub).
pub(crate) fn frame(
    saved: &Regs,
    sigmask: u64,
    fpstate: u64,
    xsave: bool,
    ret: u64,
) -> [u8; FRAME_LEN] {
    // SAFETY: ucontext_t is plain data (integers and raw pointers); all
    // zeroes is a valid value.
    let mut uc: libc::ucontext_t = unsafe { std::mem::zeroed() };
    uc.uc_flags = UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS | if xsave { UC_FP_XSTATE } else { 0 };
    uc.uc_stack.ss_flags = SS_FLAGS_KEEP;
    let (rip, rax) = resume_point(saved);
    let g = &mut uc.uc_mcontext.gregs;
    let mut set = |reg: libc::c_int, v: u64| g[reg as usize] = v as i64;
    set(libc::REG_R8, saved.r8);
    set(libc::REG_R9, saved.r9);
    set(libc::REG_R10, saved.r10);
    set(libc::REG_R11, saved.r11);
    set(libc::REG_R12, saved.r12);
    set(libc::REG_R13, saved.r13);
    set(libc::REG_R14, saved.r14);
    set(libc::REG_R15, saved.r15);
    set(libc::REG_RDI, saved.rdi);
    set(libc::REG_RSI, saved.rsi);
    set(libc::REG_RBP, saved.rbp);
    set(libc::REG_RBX, saved.rbx);
    set(libc::REG_RDX, saved.rdx);
    set(libc::REG_RAX, rax);
    set(libc::REG_RCX, saved.rcx);
    set(libc::REG_RSP, saved.rsp);
    set(libc::REG_RIP, rip);
    set(libc::REG_EFL, saved.eflags);
    // cs, gs, fs, ss as four 16-bit fields.
    let sel = |v: u64| v & 0xffff;
    set(
        libc::REG_CSGSFS,
        sel(saved.cs) | sel(saved.gs) << 16 | sel(saved.fs) << 32 | sel(saved.ss) << 48,
    );
    uc.uc_mcontext.fpregs = fpstate as usize as *mut libc::_libc_fpstate;
    let mut out = [0u8; FRAME_LEN];
    out[..8].copy_from_slice(&ret.to_le_bytes());
    // SAFETY: reading the bytes of a plain-data struct we own; the kernel's
    // ucontext is the first UCONTEXT_LEN bytes of glibc's (asserted above).
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&uc as *const libc::ucontext_t).cast::<u8>(),
            std::mem::size_of::<libc::ucontext_t>(),
        )
    };
    out[8..8 + UCONTEXT_LEN].copy_from_slice(&bytes[..UCONTEXT_LEN]);
    // The 64 signals of the kernel's sigset, at the end of its ucontext.
    out[8 + UCONTEXT_LEN - 8..8 + UCONTEXT_LEN].copy_from_slice(&sigmask.to_le_bytes());
    out
}

/// `FP_XSTATE_MAGIC1`, in the software-reserved bytes of an XSAVE area in
/// a signal frame, and `FP_XSTATE_MAGIC2`, right after the area.
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// Offset of the software-reserved bytes in the FXSAVE region.
const SW_RESERVED: usize = 464;
/// The legacy region and the XSAVE header: the smallest XSAVE area.
const XSAVE_MIN: usize = 512 + 64;

/// The saved vector state as a signal frame carries it, from what
/// `PTRACE_GETREGSET` gave: an XSAVE area (`xsave`) or a bare FXSAVE one.
///
/// ptrace puts XCR0 in the first software-reserved word; a signal frame
/// needs `_fpx_sw_bytes` there (magic, sizes, features) and the second
/// magic after the area, else the kernel restores only x87/SSE. The size
/// is that of the features enabled for every task (AMX's tile state,
/// which a task must ask for, is left out: its tiles are reset instead).
pub(crate) fn fpstate(area: &[u8], xsave: bool) -> Vec<u8> {
    let mut out = area.to_vec();
    if !xsave || area.len() < XSAVE_MIN {
        return out;
    }
    let xcr0 = u64::from_le_bytes(
        area[SW_RESERVED..SW_RESERVED + 8]
            .try_into()
            .unwrap_or([0; 8]),
    );
    let features = xcr0 & !AMX_FEATURES;
    let size = xstate_size(features).clamp(XSAVE_MIN, area.len());
    let mut sw = [0u8; 48];
    sw[0..4].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
    sw[4..8].copy_from_slice(&(size as u32 + 4).to_le_bytes());
    sw[8..16].copy_from_slice(&features.to_le_bytes());
    sw[16..20].copy_from_slice(&(size as u32).to_le_bytes());
    out[SW_RESERVED..SW_RESERVED + 48].copy_from_slice(&sw);
    out.truncate(size);
    out.extend_from_slice(&FP_XSTATE_MAGIC2.to_le_bytes());
    out
}

/// XTILECFG and XTILEDATA (bits 17, 18): enabled per task on request.
const AMX_FEATURES: u64 = 3 << 17;

/// Size of the standard-format XSAVE area holding `features` (CPUID leaf
/// 0xD gives each component's offset and size).
fn xstate_size(features: u64) -> usize {
    let mut end = XSAVE_MIN;
    for i in 2..63 {
        if features & (1 << i) != 0 {
            // CPUID leaf 0xD exists on every CPU with XSAVE (and ptrace
            // gave us an XSAVE area, so this one has it).
            let r = core::arch::x86_64::__cpuid_count(0xd, i);
            end = end.max((r.ebx + r.eax) as usize);
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs() -> Regs {
        // SAFETY: plain data.
        let mut r: Regs = unsafe { std::mem::zeroed() };
        r.rip = 0x40_1000;
        r.rsp = 0x7ffc_0000_1000;
        r.rax = 7;
        r.orig_rax = u64::MAX;
        r.rbx = 0xb;
        r.r15 = 0xf15;
        r.eflags = 0x246;
        r.cs = 0x33;
        r.ss = 0x2b;
        r
    }

    fn greg(f: &[u8], reg: libc::c_int) -> u64 {
        let off = 8 + 40 + reg as usize * 8;
        u64::from_le_bytes(f[off..off + 8].try_into().unwrap())
    }

    #[test]
    fn frame_holds_the_saved_context() {
        let f = frame(&regs(), 0x8000_0001, 0x7ffc_0000_0040, true, 0x40_0000);
        assert_eq!(u64::from_le_bytes(f[..8].try_into().unwrap()), 0x40_0000);
        assert_eq!(u64::from_le_bytes(f[8..16].try_into().unwrap()), 7);
        // uc_stack.ss_flags (after ss_sp): an invalid value, the alternate
        // stack stays as it is.
        assert_eq!(i32::from_le_bytes(f[8 + 24..8 + 28].try_into().unwrap()), 3);
        assert_eq!(greg(&f, libc::REG_RIP), 0x40_1000);
        assert_eq!(greg(&f, libc::REG_RSP), 0x7ffc_0000_1000);
        assert_eq!(greg(&f, libc::REG_RAX), 7);
        assert_eq!(greg(&f, libc::REG_RBX), 0xb);
        assert_eq!(greg(&f, libc::REG_R15), 0xf15);
        assert_eq!(greg(&f, libc::REG_EFL), 0x246);
        assert_eq!(greg(&f, libc::REG_CSGSFS), 0x33 | 0x2b << 48);
        // fpstate pointer after the 23 gregs.
        assert_eq!(
            u64::from_le_bytes(f[8 + 40 + 184..8 + 40 + 192].try_into().unwrap()),
            0x7ffc_0000_0040
        );
        assert_eq!(
            u64::from_le_bytes(f[8 + 296..8 + 304].try_into().unwrap()),
            0x8000_0001
        );
    }

    #[test]
    fn interrupted_system_calls_are_restarted() {
        let mut r = regs();
        r.orig_rax = 0; // read
        for e in [512i64, 513, 514, 516] {
            r.rax = (-e) as u64;
            assert_eq!(resume_point(&r), (0x40_1000 - 2, 0), "error {e}");
        }
        // A finished call (its result), or no call at all: as they are.
        r.rax = 5;
        assert_eq!(resume_point(&r), (0x40_1000, 5));
        r.orig_rax = u64::MAX;
        r.rax = (-512i64) as u64;
        assert_eq!(resume_point(&r), (0x40_1000, (-512i64) as u64));
    }

    #[test]
    fn xsave_area_gets_the_signal_frame_markers() {
        // This machine's own area, as ptrace would give it: XCR0 from xgetbv.
        let xcr0 = {
            let (lo, hi): (u32, u32);
            if core::arch::x86_64::__cpuid(1).ecx & (1 << 27) == 0 {
                return;
            }
            // SAFETY: xgetbv(0) is allowed in user mode where XSAVE is
            // enabled (the OSXSAVE bit, checked above).
            unsafe {
                std::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi);
            }
            u64::from(lo) | u64::from(hi) << 32
        };
        let full = xstate_size(xcr0);
        let mut area = vec![0u8; full];
        area[SW_RESERVED..SW_RESERVED + 8].copy_from_slice(&xcr0.to_le_bytes());
        let f = fpstate(&area, true);
        let size = u32::from_le_bytes(f[SW_RESERVED + 16..SW_RESERVED + 20].try_into().unwrap());
        assert_eq!(
            &f[SW_RESERVED..SW_RESERVED + 4],
            &FP_XSTATE_MAGIC1.to_le_bytes()
        );
        assert_eq!(f.len(), size as usize + 4);
        assert_eq!(&f[size as usize..], &FP_XSTATE_MAGIC2.to_le_bytes());
        if xcr0 & AMX_FEATURES == 0 {
            assert_eq!(size as usize, full, "every feature of this CPU fits");
        }
        // A bare FXSAVE area is left as it is.
        assert_eq!(fpstate(&area[..512], false), area[..512].to_vec());
    }
}
