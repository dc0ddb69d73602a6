//! Is a stopped thread at a safe point to run `dlopen`?
//!
//! The hijacked thread runs `dlopen` and `pthread_create` (in the client's
//! attach entry) on top of whatever it was doing. Locks held by *other*
//! threads are harmless (they keep running and release them), but a
//! non-recursive lock held by the stopped thread itself deadlocks the call:
//! malloc's arena locks, the atfork lock, the thread-stack cache lock. And
//! the dynamic loader's data must not be caught halfway through an update.
//! So the thread's stack is unwound (framehop over a copy of its stack, the
//! same unwinder the daemon uses for samples) and refused if any frame is:
//!
//! * in the dynamic linker (found from `AT_BASE` in `/proc/PID/auxv`);
//! * in the client library (a hook is running);
//! * in a libc function on the deny list (malloc internals and API, `dl*`,
//!   fork and spawn, thread creation and exit, process exit, `setxid`, and
//!   `__restore_rt`, which means a signal handler interrupted something we
//!   cannot see well); names come from libc's `.dynsym`, `.symtab` and its
//!   separate debug file when installed;
//! * inside the span of glibc's malloc code, which is one translation unit:
//!   from the end of the exported function before the first exported malloc
//!   function to the start of the one after the last (this covers the
//!   static `_int_malloc`, `malloc_consolidate`, ... even without symbols).
//!
//! The deny ranges are computed before any thread is stopped, so checking a
//! stopped thread costs a stack copy and an unwind (tens of microseconds).

use std::ops::Range;
use std::sync::Arc;

use heapprofd_unwinder::{Arch, FdMaps, FdMemory, ModuleCache, ProcessContext, RegisterFile};

use crate::elf::{LoadedObject, Symbols, debug_file_for};
use crate::ptrace::Regs;

/// Most stack bytes copied for the check.
const MAX_STACK: usize = 512 * 1024;

/// The `rt_sigreturn` trampoline (`mov $15, %rax; syscall`), found by its
/// bytes when libc has no symbol for it.
const RESTORE_RT_X86_64: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// What a thread is doing, for the decision and the messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No frame in a denied range (`frames` were seen).
    Safe { frames: usize },
    /// A frame is in a denied range.
    Unsafe { reason: String },
}

/// The deny ranges and the unwinding state of one target.
pub(crate) struct SafetyModel {
    ctx: ProcessContext,
    /// Absolute ranges with what they are.
    deny: Vec<(Range<u64>, String)>,
}

impl std::fmt::Debug for SafetyModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetyModel")
            .field("deny", &self.deny.len())
            .finish_non_exhaustive()
    }
}

impl SafetyModel {
    /// Builds the model: unwind tables of every mapped module, deny ranges.
    pub(crate) fn build(
        pid: u32,
        cache: Arc<ModuleCache>,
        libc: &LoadedObject,
        mut syms: Symbols,
        loader: Option<&LoadedObject>,
        client: Option<&LoadedObject>,
    ) -> std::io::Result<SafetyModel> {
        let ctx = ProcessContext::new(
            pid,
            Box::new(FdMaps::open_pid(pid)?),
            Box::new(FdMemory::open_pid(pid)?),
            cache,
        );
        let mut deny = Vec::new();
        for (obj, what) in [
            (loader, "the dynamic linker"),
            (client, "heapprofd-rs's client"),
        ] {
            if let Some(o) = obj {
                for &(s, e) in &o.ranges {
                    deny.push((s..e, what.to_string()));
                }
            }
        }
        // The malloc span and the trampoline search use the file's own
        // symbols; the debug file only adds names.
        let span = malloc_span(&syms);
        let restore_rt = syms.find_bytes(&RESTORE_RT_X86_64);
        if let Some(dbg) = syms.build_id.as_deref().and_then(debug_file_for) {
            syms.merge_debug_file(&dbg);
        }
        for (addr, size, name, _) in &syms.funcs {
            if denied_name(name) {
                let start = libc.bias.wrapping_add(*addr);
                deny.push((start..start + (*size).max(1), format!("{name} (libc)")));
            }
        }
        if let Some(span) = span {
            let r = libc.bias + span.start..libc.bias + span.end;
            deny.push((r, "glibc's malloc code".to_string()));
        }
        if syms.address_of("__restore_rt").is_none()
            && cfg!(target_arch = "x86_64")
            && let Some(a) = restore_rt
        {
            let start = libc.bias + a;
            deny.push((start..start + 9, "__restore_rt (libc)".to_string()));
        }
        deny.sort_by_key(|d| d.0.start);
        Ok(SafetyModel { ctx, deny })
    }

    fn denied(&self, addr: u64) -> Option<&str> {
        self.deny
            .iter()
            .take_while(|d| d.0.start <= addr)
            .find(|d| d.0.contains(&addr))
            .map(|d| d.1.as_str())
    }

    /// Checks a stopped thread, given its registers and a copy of its stack
    /// from `regs.rsp`.
    pub(crate) fn check(&mut self, regs: &Regs, stack: &[u8]) -> Verdict {
        if let Some(what) = self.denied(regs.rip) {
            return Verdict::Unsafe {
                reason: format!("in {what}"),
            };
        }
        let rf = register_file(regs);
        let result = self.ctx.unwind(Arch::X86_64, &rf, regs.rsp, stack, 0..0);
        let frames = result.real_frames();
        for f in frames {
            // A return address is checked at itself and one byte before
            // (the call instruction), which catches a return into the first
            // byte of a function (`__restore_rt`).
            for a in [f.pc, f.lookup_pc] {
                if let Some(what) = self.denied(a) {
                    return Verdict::Unsafe {
                        reason: format!("called from {what}"),
                    };
                }
            }
        }
        Verdict::Safe {
            frames: frames.len(),
        }
    }

    /// How many bytes of stack to copy for a thread with this stack pointer:
    /// up to the end of its mapping, at most [`MAX_STACK`].
    pub(crate) fn stack_len(&self, sp: u64) -> usize {
        let end = self.ctx.mapping_for(sp).map_or(sp + 64 * 1024, |m| m.end);
        (end.saturating_sub(sp) as usize).min(MAX_STACK)
    }
}

/// The registers an unwinder starts from, in DWARF numbering.
fn register_file(r: &Regs) -> RegisterFile {
    use heapprofd_proto::wire::x86_64 as x;
    let mut rf = RegisterFile::default();
    rf.0[x::RSP] = r.rsp;
    rf.0[x::RIP] = r.rip;
    rf.0[6] = r.rbp;
    rf.0[3] = r.rbx;
    rf.0[12] = r.r12;
    rf.0[13] = r.r13;
    rf.0[14] = r.r14;
    rf.0[15] = r.r15;
    rf.0[0] = r.rax;
    rf.0[1] = r.rdx;
    rf.0[2] = r.rcx;
    rf.0[4] = r.rsi;
    rf.0[5] = r.rdi;
    rf.0[8] = r.r8;
    rf.0[9] = r.r9;
    rf.0[10] = r.r10;
    rf.0[11] = r.r11;
    rf
}

/// The name without glibc's internal prefixes and compiler suffixes:
/// `__GI___libc_malloc` -> `malloc`, `_int_free.part.0` -> `int_free`.
fn normalize(name: &str) -> &str {
    let mut n = name.split('.').next().unwrap_or(name);
    while let Some(rest) = n.strip_prefix("__GI_") {
        n = rest;
    }
    n = n.trim_start_matches('_');
    if let Some(rest) = n.strip_prefix("libc_") {
        n = rest.trim_start_matches('_');
    }
    n
}

/// The exported malloc family (what bounds glibc's malloc translation unit).
const MALLOC_API: &[&str] = &[
    "malloc",
    "free",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "malloc_usable_size",
    "malloc_trim",
    "mallopt",
    "mallinfo",
    "mallinfo2",
    "malloc_stats",
    "malloc_info",
    "cfree",
    // morecore.c is part of malloc.c's translation unit.
    "default_morecore",
];

/// Functions a hijacked thread must not be inside of.
fn denied_name(name: &str) -> bool {
    let n = normalize(name);
    const EXACT: &[&str] = &[
        "sysmalloc",
        "systrim",
        "munmap_chunk",
        "mremap_chunk",
        "unlink_chunk",
        "new_heap",
        "alloc_new_heap",
        "grow_heap",
        "shrink_heap",
        "heap_trim",
        "mtrim",
        "musable",
        "get_free_list",
        "reused_arena",
        "detach_arena",
        "mid_memalign",
        "fork",
        "Fork",
        "vfork",
        "run_fork_handlers",
        "register_atfork",
        "unregister_atfork",
        "posix_spawn",
        "posix_spawnp",
        "spawni",
        "spawnix",
        "pthread_create",
        "create_thread",
        "allocate_stack",
        "free_tcb",
        "exit",
        "Exit",
        "run_exit_handlers",
        "cxa_finalize",
        "call_tls_dtors",
        "restore_rt",
    ];
    const PREFIXES: &[&str] = &[
        "int_", "malloc_", "arena_", "tcache_", "ptmalloc", "dl", "nptl_", "freeres",
    ];
    MALLOC_API.contains(&n)
        || EXACT.contains(&n)
        || PREFIXES.iter().any(|p| n.starts_with(p))
        || n.contains("setxid")
}

/// The address span of glibc's malloc code, from the exported symbols only.
fn malloc_span(syms: &Symbols) -> Option<Range<u64>> {
    type F = (u64, u64, String, bool);
    let is_api = |f: &F| MALLOC_API.contains(&normalize(&f.2));
    let exported = || syms.funcs.iter().filter(|f| f.3);
    let lo = exported().filter(|f| is_api(f)).map(|f| f.0).min()?;
    let hi = exported().filter(|f| is_api(f)).map(|f| f.0 + f.1).max()?;
    // Widen to the neighbouring exported non-malloc functions (static
    // functions of malloc.c sit in between).
    let start = exported()
        .filter(|f| !is_api(f) && f.0 + f.1 <= lo)
        .map(|f| f.0 + f.1)
        .max()
        .unwrap_or(lo);
    let end = exported()
        .filter(|f| !is_api(f) && f.0 >= hi)
        .map(|f| f.0)
        .min()
        .unwrap_or(hi);
    Some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_and_denied() {
        assert_eq!(normalize("__GI___libc_malloc"), "malloc");
        assert_eq!(normalize("_int_free.part.0"), "int_free");
        assert_eq!(normalize("__libc_free"), "free");
        assert_eq!(normalize("__restore_rt"), "restore_rt");
        for n in [
            "malloc",
            "__libc_calloc",
            "_int_malloc",
            "malloc_consolidate",
            "arena_get2.part.0",
            "tcache_init.part.0",
            "dl_iterate_phdr",
            "_dl_catch_error",
            "dlopen",
            "__libc_fork",
            "_Fork",
            "__nptl_deallocate_stack",
            "pthread_create@@GLIBC_2.34",
            "__restore_rt",
            "__nptl_setxid",
            "exit",
        ] {
            assert!(denied_name(n.split('@').next().unwrap()), "{n}");
        }
        for n in [
            "read",
            "__libc_read",
            "epoll_wait",
            "__futex_abstimed_wait_common",
            "pthread_cond_wait",
            "nanosleep",
            "__GI___poll",
            "main",
            "start_thread",
            "pthread_join",
            "memcpy",
        ] {
            assert!(!denied_name(n), "{n}");
        }
    }

    #[test]
    fn malloc_span_of_our_libc_covers_its_internals() {
        let libc = crate::elf::own_libc();
        let syms = libc.symbols().unwrap();
        let span = malloc_span(&syms).expect("malloc is exported");
        let malloc = syms.address_of("malloc").unwrap();
        let free = syms.address_of("free").unwrap();
        assert!(span.contains(&malloc) && span.contains(&free));
        // With the debug file installed, the internals must be inside.
        if let Some(dbg) = syms.build_id.as_deref().and_then(debug_file_for) {
            let mut full = libc.symbols().unwrap();
            full.merge_debug_file(&dbg);
            for internal in [
                "_int_malloc",
                "_int_free",
                "malloc_consolidate",
                "sysmalloc",
            ] {
                if let Some(a) = full.address_of(internal) {
                    assert!(span.contains(&a), "{internal} at {a:#x} outside {span:x?}");
                }
            }
        }
    }
}
