//! The client's CPU architecture and the registers a malloc sample carries.

use core::fmt;

use super::codec::DecodeError;

/// Number of 64-bit register slots of a [`RegisterFile`] (DWARF numbering).
pub const MAX_REGS: usize = 34;

/// Register values a malloc sample carries on the wire since
/// [`version::V8`](super::version::V8): [`Arch::unwind_slots`]' registers
/// in that order, then zeros.
pub const UNWIND_REGS: usize = 14;

/// CPU architecture of the client, which decides how [`RegisterFile`] is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Arch {
    /// x86_64: DWARF register numbers 0..=16 (rax, rdx, rcx, rbx, rsi, rdi,
    /// rbp, rsp, r8..r15, rip).
    X86_64 = 1,
    /// AArch64: DWARF register numbers 0..=31 (x0..x30, sp), and the pc in slot 32.
    Aarch64 = 2,
}

impl Arch {
    /// The architecture this code is compiled for, if supported.
    pub const fn native() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    /// Decodes an architecture tag.
    pub fn from_u32(v: u32) -> Result<Arch, DecodeError> {
        match v {
            1 => Ok(Arch::X86_64),
            2 => Ok(Arch::Aarch64),
            other => Err(DecodeError::UnknownArch(other)),
        }
    }

    /// The [`RegisterFile`] slots an unwinder starts from, which a malloc
    /// sample carries (see [`UNWIND_REGS`]): the stack and frame pointers,
    /// the instruction pointer and the callee-saved registers.
    pub const fn unwind_slots(self) -> &'static [usize] {
        match self {
            // rbx, rbp, rsp, r12..r15, rip.
            Arch::X86_64 => &[3, 6, 7, 12, 13, 14, 15, 16],
            // x19..x30, sp, pc.
            Arch::Aarch64 => &[19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32],
        }
    }

    /// Puts `values`, the arch's unwind registers in [`Arch::unwind_slots`]'
    /// order, into their slots of `regs` (values beyond those slots are
    /// ignored, the other slots left as they are).
    #[inline]
    pub fn place_unwind_regs(self, values: &[u64], regs: &mut [u64; MAX_REGS]) {
        for (v, &slot) in values.iter().zip(self.unwind_slots()) {
            if let Some(r) = regs.get_mut(slot) {
                *r = *v;
            }
        }
    }

    /// Register slots that hold the stack pointer and instruction pointer.
    pub const fn sp_ip_slots(self) -> (usize, usize) {
        match self {
            Arch::X86_64 => (x86_64::RSP, x86_64::RIP),
            Arch::Aarch64 => (aarch64::SP, aarch64::PC),
        }
    }
}

/// Register slot numbers for x86_64 (DWARF numbering).
pub mod x86_64 {
    /// rbx.
    pub const RBX: usize = 3;
    /// Frame pointer.
    pub const RBP: usize = 6;
    /// Stack pointer.
    pub const RSP: usize = 7;
    /// Instruction pointer.
    pub const RIP: usize = 16;
}

/// Register slot numbers for AArch64 (DWARF numbering, pc in slot 32).
pub mod aarch64 {
    /// Frame pointer (x29).
    pub const FP: usize = 29;
    /// Link register (x30).
    pub const LR: usize = 30;
    /// Stack pointer.
    pub const SP: usize = 31;
    /// Program counter.
    pub const PC: usize = 32;
}

/// Raw register values captured at the allocation site; layout by [`Arch`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RegisterFile(pub [u64; MAX_REGS]);

impl Default for RegisterFile {
    fn default() -> Self {
        RegisterFile([0; MAX_REGS])
    }
}

impl fmt::Debug for RegisterFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for r in &self.0 {
            l.entry(&format_args!("{r:#x}"));
        }
        l.finish()
    }
}
