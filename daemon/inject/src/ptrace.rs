//! The ptrace operations the injection needs, on one thread of the target.
//!
//! A [`Tracee`] is attached with `PTRACE_SEIZE` (no `SIGSTOP` is sent, the
//! rest of the process keeps running) and stopped with `PTRACE_INTERRUPT`.
//! ptrace requests must all come from the thread that attached, so a
//! `Tracee` is used on one thread only (it is not `Send`).
//!
//! [`Tracee::call`] runs one function in the stopped thread: registers set
//! for the SysV call (arguments in `rdi`, `rsi`, ...; `rsp` 16-byte aligned
//! below the red zone, where the return address, the stub of
//! [`crate::sigframe`], is stored), `orig_rax = -1` so the kernel does not
//! treat the new registers as an interrupted system call to restart (nor
//! run the system call the thread was stopped at), then `PTRACE_SYSCALL`
//! until the stub's `rt_sigreturn` reaches its system-call entry stop,
//! where `rdi` holds the result. The function's own system calls stop too
//! and are let through. Other signals that arrive meanwhile are delivered
//! normally; a fault is reported as a crash of the call. Seized with
//! `PTRACE_O_TRACESYSGOOD`: system-call stops are told from real SIGTRAPs,
//! and a tracer that dies at one leaves no SIGTRAP behind (the kernel would
//! send the stop's signal to a tracee left without its tracer; `SIGTRAP |
//! 0x80` is no signal).
//!
//! Seizing, interrupting and the general registers go through nix's safe
//! wrappers. The other requests stay raw `libc` calls, because nix cannot
//! express them: `PTRACE_CONT`/`PTRACE_SYSCALL`/`PTRACE_DETACH` with a
//! signal to deliver and `waitpid` (nix's `Signal` has no real-time
//! signals, so a program's signal 34-64 could be neither reported nor
//! passed on), `PTRACE_GETSIGMASK` (nix has no wrapper), and the XSAVE
//! area (`PTRACE_GETREGSET NT_X86_XSTATE`, whose size nix's fixed
//! register sets cannot hold).
//!
//! On Android (type-checked, never run: there is no device here) the
//! `libc` crate takes the request as `c_int` and lacks `PTRACE_SEIZE`,
//! `PTRACE_INTERRUPT` and `PTRACE_GETSIGMASK`, and nix has none of the
//! four wrappers; [`bionic`] makes the same requests raw, with the
//! kernel's request numbers. Linux builds do exactly what they did.

use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

#[cfg(not(target_os = "android"))]
use nix::sys::ptrace as nix_ptrace;
#[cfg(not(target_os = "android"))]
use nix::unistd::Pid;

/// A ptrace request as the target's `libc` declares it.
#[cfg(not(target_os = "android"))]
type Request = libc::c_uint;
/// A ptrace request as the target's `libc` declares it.
#[cfg(target_os = "android")]
type Request = libc::c_int;

#[cfg(not(target_os = "android"))]
const PTRACE_GETSIGMASK: Request = libc::PTRACE_GETSIGMASK;
#[cfg(target_os = "android")]
const PTRACE_GETSIGMASK: Request = bionic::PTRACE_GETSIGMASK;

/// `NT_X86_XSTATE`: the whole XSAVE area (x87, SSE, AVX, AVX-512...).
pub(crate) const NT_X86_XSTATE: libc::c_int = 0x202;
/// `NT_PRFPREG`: the FXSAVE area (fallback without XSAVE).
const NT_PRFPREG: libc::c_int = 2;
/// Room for the largest XSAVE area (AMX tiles included).
const XSTATE_MAX: usize = 16 * 1024;

/// `rflags` bits cleared for a call: trap flag and direction flag (the
/// SysV ABI requires DF = 0 on function entry).
const RFLAGS_TF: u64 = 1 << 8;
const RFLAGS_DF: u64 = 1 << 10;

/// The general registers.
pub(crate) type Regs = libc::user_regs_struct;

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Signal-delivery stop of this signal.
    Signal(i32),
    /// A ptrace event stop (`PTRACE_EVENT_STOP` after an interrupt, or a
    /// group stop) with its signal.
    Event(i32),
    /// A system-call entry or exit stop.
    Syscall,
    /// The thread (or the whole process) is gone.
    Gone,
}

/// How a call returns (see [`Tracee::call`]).
#[derive(Clone, Copy)]
pub(crate) struct CallReturn<'a> {
    /// The address just after the stub's `syscall`.
    pub(crate) stub_end: u64,
    /// The stub's system call (`rt_sigreturn`).
    pub(crate) stub_nr: u64,
    /// How long the call may take.
    pub(crate) timeout: Duration,
    /// Told "ready" (registers set) and "running" (resumed): the test
    /// hook's stall points.
    pub(crate) on_step: &'a dyn Fn(&str),
}

/// Why a remote call failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The function did not return in time (the thread was stopped again).
    Timeout,
    /// The call faulted at this pc with this signal.
    Crashed { signal: i32, pc: u64 },
    /// The target exited.
    Gone,
    /// A ptrace request failed.
    Io(io::Error),
    /// Refused before anything was changed in the target (message).
    Refused(String),
    /// A step of the sequence failed (message).
    Failed(String),
}

impl From<io::Error> for CallError {
    fn from(e: io::Error) -> Self {
        if e.raw_os_error() == Some(libc::ESRCH) {
            CallError::Gone
        } else {
            CallError::Io(e)
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Timeout => f.write_str("the function did not return in time"),
            CallError::Crashed { signal, pc } => {
                write!(f, "the function crashed (signal {signal} at {pc:#x})")
            }
            CallError::Gone => f.write_str("the target exited"),
            CallError::Io(e) => write!(f, "ptrace failed: {e}"),
            CallError::Refused(m) | CallError::Failed(m) => f.write_str(m),
        }
    }
}

fn ptrace(req: Request, tid: i32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: the requests used here read or write only the buffers their
    // callers pass (registers, iovecs, siginfo) or none.
    let r = unsafe { libc::ptrace(req, tid, addr, data) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// One seized thread of the target.
#[derive(Debug)]
pub(crate) struct Tracee {
    /// Kernel thread id.
    pub tid: i32,
    mem: File,
    attached: bool,
    /// ptrace requests must come from the attaching thread.
    _not_send: PhantomData<*const ()>,
}

impl Tracee {
    /// `PTRACE_SEIZE`s thread `tid` of process `pid` (the thread keeps
    /// running) and opens the process's memory.
    pub(crate) fn seize(pid: u32, tid: i32) -> io::Result<Tracee> {
        #[cfg(not(target_os = "android"))]
        nix_ptrace::seize(
            Pid::from_raw(tid),
            nix_ptrace::Options::PTRACE_O_TRACESYSGOOD,
        )?;
        #[cfg(target_os = "android")]
        bionic::seize(tid)?;
        let mem = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
        {
            Ok(f) => f,
            Err(e) => {
                let _ = ptrace(libc::PTRACE_DETACH, tid, 0, 0);
                return Err(e);
            }
        };
        Ok(Tracee {
            tid,
            mem,
            attached: true,
            _not_send: PhantomData,
        })
    }

    /// Asks the thread to stop (`PTRACE_INTERRUPT`); see [`Tracee::wait`].
    pub(crate) fn interrupt(&self) -> io::Result<()> {
        #[cfg(not(target_os = "android"))]
        return Ok(nix_ptrace::interrupt(self.pid())?);
        #[cfg(target_os = "android")]
        return bionic::interrupt(self.tid);
    }

    #[cfg(not(target_os = "android"))]
    fn pid(&self) -> Pid {
        Pid::from_raw(self.tid)
    }

    /// Waits for the next stop of the thread, up to `timeout` (`None` then).
    /// Polls with short sleeps: a blocking `waitpid` could not time out.
    pub(crate) fn wait(&self, timeout: Duration) -> io::Result<Option<Stop>> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a valid out-pointer.
            let r = unsafe { libc::waitpid(self.tid, &mut status, libc::__WALL | libc::WNOHANG) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                if e.raw_os_error() == Some(libc::ECHILD) {
                    return Ok(Some(Stop::Gone));
                }
                return Err(e);
            }
            if r == self.tid {
                if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                    return Ok(Some(Stop::Gone));
                }
                if libc::WIFSTOPPED(status) {
                    let sig = libc::WSTOPSIG(status);
                    let event = (status >> 16) & 0xff;
                    return Ok(Some(if event != 0 {
                        Stop::Event(sig)
                    } else if sig == libc::SIGTRAP | 0x80 {
                        Stop::Syscall
                    } else {
                        Stop::Signal(sig)
                    }));
                }
                continue;
            }
            if start.elapsed() >= timeout {
                return Ok(None);
            }
            // Spin briefly (a stop usually comes within microseconds), then
            // sleep in growing steps up to 1 ms.
            spins += 1;
            if spins < 50 {
                std::thread::yield_now();
            } else {
                let us = (spins - 50).clamp(20, 1000) as u64;
                std::thread::sleep(Duration::from_micros(us));
            }
        }
    }

    /// Resumes the thread, delivering `sig` (0 = none).
    pub(crate) fn cont(&self, sig: i32) -> io::Result<()> {
        ptrace(libc::PTRACE_CONT, self.tid, 0, sig as usize).map(|_| ())
    }

    /// Resumes the thread until its next system-call stop (or another
    /// stop), delivering `sig` (0 = none).
    pub(crate) fn cont_syscall(&self, sig: i32) -> io::Result<()> {
        ptrace(libc::PTRACE_SYSCALL, self.tid, 0, sig as usize).map(|_| ())
    }

    /// The thread's blocked-signal mask (`PTRACE_GETSIGMASK`).
    pub(crate) fn sigmask(&self) -> io::Result<u64> {
        let mut mask = 0u64;
        ptrace(
            PTRACE_GETSIGMASK,
            self.tid,
            std::mem::size_of::<u64>(),
            &mut mask as *mut u64 as usize,
        )?;
        Ok(mask)
    }

    /// Reads the general registers.
    pub(crate) fn regs(&self) -> io::Result<Regs> {
        #[cfg(not(target_os = "android"))]
        return Ok(nix_ptrace::getregs(self.pid())?);
        #[cfg(target_os = "android")]
        return bionic::regs(self.tid);
    }

    /// Writes the general registers.
    pub(crate) fn set_regs(&self, r: &Regs) -> io::Result<()> {
        #[cfg(not(target_os = "android"))]
        return Ok(nix_ptrace::setregs(self.pid(), *r)?);
        #[cfg(target_os = "android")]
        return bionic::set_regs(self.tid, r);
    }

    /// Reads the extended (FPU/vector) state: the XSAVE area, or the FXSAVE
    /// area where XSAVE is not available. Returns the note type and bytes.
    pub(crate) fn fpstate(&self) -> io::Result<(libc::c_int, Vec<u8>)> {
        let mut last = io::Error::from_raw_os_error(libc::EINVAL);
        for note in [NT_X86_XSTATE, NT_PRFPREG] {
            let mut buf = vec![0u8; XSTATE_MAX];
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            match ptrace(
                libc::PTRACE_GETREGSET,
                self.tid,
                note as usize,
                &mut iov as *mut libc::iovec as usize,
            ) {
                Ok(_) => {
                    buf.truncate(iov.iov_len);
                    return Ok((note, buf));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Writes back what [`Tracee::fpstate`] read.
    pub(crate) fn set_fpstate(&self, note: libc::c_int, bytes: &[u8]) -> io::Result<()> {
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        ptrace(
            libc::PTRACE_SETREGSET,
            self.tid,
            note as usize,
            &mut iov as *mut libc::iovec as usize,
        )
        .map(|_| ())
    }

    /// Reads target memory.
    pub(crate) fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.mem.read_exact_at(buf, addr)
    }

    /// Reads up to `buf.len()` bytes; returns how many could be read.
    pub(crate) fn read_some(&self, addr: u64, buf: &mut [u8]) -> usize {
        self.mem.read_at(buf, addr).unwrap_or(0)
    }

    /// Writes target memory.
    pub(crate) fn write(&self, addr: u64, bytes: &[u8]) -> io::Result<()> {
        self.mem.write_all_at(bytes, addr)
    }

    /// Calls `func(args...)` in the stopped thread, starting from `base`
    /// (the thread's saved registers) with the stack pointer `sp` (16-byte
    /// aligned minus 8, the return address into the stub stored at `sp`,
    /// the signal frame above it). Returns the result; the thread is then
    /// at the system-call entry stop of the stub's `rt_sigreturn`, whose
    /// end is `stub_end`.
    pub(crate) fn call(
        &self,
        base: &Regs,
        sp: u64,
        func: u64,
        args: &[u64],
        ret: CallReturn,
    ) -> Result<u64, CallError> {
        let mut r = *base;
        r.rip = func;
        r.rsp = sp;
        r.rax = 0;
        r.orig_rax = u64::MAX;
        r.eflags &= !(RFLAGS_TF | RFLAGS_DF);
        let slots = [&mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx];
        for (slot, &a) in slots.into_iter().zip(args) {
            *slot = a;
        }
        self.set_regs(&r)?;
        (ret.on_step)("ready");
        self.cont_syscall(0)?;
        (ret.on_step)("running");
        let deadline = Instant::now() + ret.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(stop) = self.wait(left)? else {
                return Err(CallError::Timeout);
            };
            match stop {
                Stop::Gone => return Err(CallError::Gone),
                Stop::Event(_) => self.cont_syscall(0)?,
                Stop::Syscall => {
                    let now = self.regs()?;
                    if now.rip == ret.stub_end && now.orig_rax == ret.stub_nr {
                        return Ok(now.rdi);
                    }
                    // One of the function's own system calls.
                    self.cont_syscall(0)?;
                }
                Stop::Signal(sig) => {
                    let faults = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];
                    if !faults.contains(&sig) {
                        // Someone else's signal: deliver it (its handler runs
                        // on top of our call, as during any call).
                        self.cont_syscall(sig)?;
                        continue;
                    }
                    let now = self.regs()?;
                    return Err(CallError::Crashed {
                        signal: sig,
                        pc: now.rip,
                    });
                }
            }
        }
    }

    /// Stops a running thread again (after a timed-out call).
    pub(crate) fn stop_again(&self, timeout: Duration) -> io::Result<bool> {
        self.interrupt()?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.wait(left)? {
                None => return Ok(false),
                Some(Stop::Gone) => return Err(io::Error::from_raw_os_error(libc::ESRCH)),
                Some(Stop::Event(_)) => return Ok(true),
                // A system call on the way: let it run.
                Some(Stop::Syscall) => self.cont_syscall(0)?,
                // A signal arrived first: deliver it and keep waiting for
                // the interrupt's stop.
                Some(Stop::Signal(sig)) => self.cont_syscall(sig)?,
            }
        }
    }

    /// Detaches (the thread resumes), delivering `sig` (0 = none).
    /// (On failure, dropping the tracee tries again.)
    pub(crate) fn detach(mut self, sig: i32) -> io::Result<()> {
        ptrace(libc::PTRACE_DETACH, self.tid, 0, sig as usize)?;
        self.attached = false;
        Ok(())
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        if !self.attached {
            return;
        }
        // Detaching needs a stopped tracee. One that has not stopped yet (in
        // an uninterruptible sleep when we interrupted it) would stop later
        // and stay stopped while we trace it: wait for that stop (up to a
        // few seconds) and detach then. After that the kernel detaches it
        // when this thread exits.
        if ptrace(libc::PTRACE_DETACH, self.tid, 0, 0).is_ok() {
            return;
        }
        let _ = self.interrupt();
        let deadline = Instant::now() + Duration::from_secs(5);
        if let Ok(Some(stop)) = self.wait(deadline.saturating_duration_since(Instant::now())) {
            let sig = match stop {
                Stop::Gone => return,
                // A signal on its way: detaching delivers it.
                Stop::Signal(sig) => sig,
                Stop::Event(_) | Stop::Syscall => 0,
            };
            let _ = ptrace(libc::PTRACE_DETACH, self.tid, 0, sig as usize);
        }
    }
}

/// The requests nix and Android's `libc` crate do not provide, made raw
/// with the numbers of the kernel's `linux/ptrace.h`.
#[cfg(target_os = "android")]
mod bionic {
    use std::io;

    use super::{Regs, Request, ptrace};

    const PTRACE_SEIZE: Request = 0x4206;
    const PTRACE_INTERRUPT: Request = 0x4207;
    pub(super) const PTRACE_GETSIGMASK: Request = 0x420a;
    const PTRACE_O_TRACESYSGOOD: usize = 1;

    pub(super) fn seize(tid: i32) -> io::Result<()> {
        ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACESYSGOOD).map(|_| ())
    }

    pub(super) fn interrupt(tid: i32) -> io::Result<()> {
        ptrace(PTRACE_INTERRUPT, tid, 0, 0).map(|_| ())
    }

    pub(super) fn regs(tid: i32) -> io::Result<Regs> {
        let mut r = std::mem::MaybeUninit::<Regs>::zeroed();
        ptrace(libc::PTRACE_GETREGS, tid, 0, r.as_mut_ptr() as usize)?;
        // SAFETY: zeroed plain-old-data the kernel filled on success.
        Ok(unsafe { r.assume_init() })
    }

    pub(super) fn set_regs(tid: i32, r: &Regs) -> io::Result<()> {
        ptrace(libc::PTRACE_SETREGS, tid, 0, r as *const Regs as usize).map(|_| ())
    }
}
