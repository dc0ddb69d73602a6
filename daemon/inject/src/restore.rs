//! Putting the hijacked thread back: the return path written before the
//! first call (the stub at the entry point, the signal frame and the
//! call's data below the red zone; see [`crate::sigframe`]), and the
//! restore after the last call.
//!
//! ```text
//!  saved rsp
//!  - 128          red zone (the interrupted function may use it)
//!  data           library path, "malloc"
//!  fpstate        the saved XSAVE area, signal-frame format (64-aligned)
//!  frame          sp -> [stub address][ucontext: saved registers, mask]
//!  below sp       the calls' own stack
//! ```
//!
//! After the last call the thread sits at the system-call entry stop of
//! the stub's `rt_sigreturn`. Rather than let the frame restore it (which
//! would turn a pending `restart_syscall` into EINTR), the tracer skips
//! that system call and asks for a stop (`PTRACE_INTERRUPT`) with the
//! thread's `rip` on the stub's `rt_sigreturn` again and `rsp` on the
//! frame; the thread stops before it returns to user space, and there its
//! vector state, then its registers are put back and it is detached, as
//! from any stop: the kernel restarts an interrupted system call exactly as
//! it would have without us. At every moment of this the thread, if the
//! tracer vanished, would resume either with its own registers or at the
//! stub with the frame above it: never at an address of ours without a
//! way back. The entry point's bytes are put back once no register of the
//! thread refers to the stub any more.

use std::io;
use std::time::Duration;

use crate::plan::Plan;
use crate::ptrace::{Regs, Stop, Tracee};
use crate::sigframe::{self, FRAME_LEN, STUB, STUB_SIGRETURN};
use crate::stall::Stall;

/// Bytes below the stack pointer a leaf function may use (System V).
const RED_ZONE: u64 = 128;

/// Where the calls' return path and data are in the target.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReturnPath {
    /// The stub (the program's entry point).
    pub(crate) stub: u64,
    /// What the stub replaced (`None`: unknown, the stub stays).
    original: Option<[u8; STUB.len()]>,
    /// The calls' stack pointer: the return-address slot, the frame above.
    pub(crate) sp: u64,
    /// The library path.
    pub(crate) data: u64,
    /// The string "malloc".
    pub(crate) name_malloc: u64,
}

/// Where the thread is once the calls are over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// At the stub's `rt_sigreturn` stop (every call returned).
    AtStub,
    /// At some other stop (a crash of a call, stopped again after a timeout).
    Stopped,
    /// The thread or process is gone.
    Gone,
}

/// How the thread was put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Restored {
    /// Its registers and vector state were written back and it was detached.
    Exactly,
    /// A signal came first: it was delivered, and the handler returns
    /// into the stub, whose frame restores the thread (the stub stays).
    ByFrame,
    /// Nothing to restore.
    Gone,
}

impl ReturnPath {
    /// Writes the data, the saved vector state and the frame below the
    /// thread's red zone, then the stub at the entry point. The thread is
    /// stopped with its own registers: until a call starts, none of this
    /// is used.
    pub(crate) fn install(
        tr: &Tracee,
        saved: &Regs,
        plan: &Plan,
        fp: (libc::c_int, &[u8]),
        sigmask: u64,
    ) -> io::Result<ReturnPath> {
        let lib = &plan.lib;
        let data = (saved.rsp - RED_ZONE - 256 - lib.len() as u64) & !15;
        let name_malloc = data + lib.len() as u64 + 16;
        let mut bytes = lib.clone();
        bytes.resize(lib.len() + 16, 0);
        bytes.extend_from_slice(b"malloc\0");
        tr.write(data, &bytes)?;
        let xsave = fp.0 == crate::ptrace::NT_X86_XSTATE;
        let fpstate = sigframe::fpstate(fp.1, xsave);
        let fp_addr = (data - fpstate.len() as u64) & !63;
        tr.write(fp_addr, &fpstate)?;
        let sp = ((fp_addr - FRAME_LEN as u64) & !15) - 8;
        let frame = sigframe::frame(saved, sigmask, fp_addr, xsave, plan.entry);
        tr.write(sp, &frame)?;
        let mut now = [0u8; STUB.len()];
        tr.read(plan.entry, &mut now)?;
        // A stub found there was left by an injector that was killed: the
        // file has the original bytes.
        let original = if now == STUB {
            plan.entry_bytes
        } else {
            Some(now)
        };
        tr.write(plan.entry, &STUB)?;
        Ok(ReturnPath {
            stub: plan.entry,
            original,
            sp,
            data,
            name_malloc,
        })
    }

    /// Puts the thread back (see the module docs) and detaches it.
    pub(crate) fn restore(
        &self,
        tr: Tracee,
        saved: &Regs,
        fp: (libc::c_int, &[u8]),
        ended: Ended,
        stall: Stall<'_>,
    ) -> io::Result<Restored> {
        match ended {
            Ended::Gone => return Ok(Restored::Gone),
            Ended::Stopped => {}
            Ended::AtStub => {
                tr.interrupt()?;
                let mut r = tr.regs()?;
                r.orig_rax = u64::MAX;
                r.rip = self.stub + STUB_SIGRETURN;
                r.rsp = self.sp + 8;
                tr.set_regs(&r)?;
                stall.at("restore-ready");
                tr.cont(0)?;
                match tr.wait(Duration::from_secs(2))? {
                    Some(Stop::Event(_) | Stop::Syscall) => {}
                    Some(Stop::Gone) => return Ok(Restored::Gone),
                    Some(Stop::Signal(sig)) => {
                        tr.detach(sig)?;
                        return Ok(Restored::ByFrame);
                    }
                    // Not stopped (it cannot be, the interrupt was pending):
                    // it runs the frame's rt_sigreturn by itself.
                    None => return Ok(Restored::ByFrame),
                }
                stall.at("restore-stopped");
            }
        }
        tr.set_fpstate(fp.0, fp.1)?;
        stall.at("restore-fp");
        tr.set_regs(saved)?;
        stall.at("restore-regs");
        if let Some(orig) = self.original {
            let _ = tr.write(self.stub, &orig);
        }
        tr.detach(0)?;
        Ok(Restored::Exactly)
    }
}
