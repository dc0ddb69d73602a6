//! A prefetch-for-write hint: starts bringing a cache line into this core's
//! cache in a state it can write, so that the stores that follow do not
//! wait for it. Used by the client's sample path for the ring's next record
//! and the free set's lines, which the other side (the daemon's reader) or
//! a long stretch of the program's own work has usually taken away.

/// Hints that the line holding `p` is about to be written. Never faults and
/// changes nothing architecturally, whatever the address.
#[inline(always)]
pub fn prefetch_for_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_prefetchw() {
            // SAFETY: PREFETCHW, which this processor has (CPUID says so),
            // is a hint: it reads and writes nothing architecturally and
            // never faults, whatever the address. Spelled out because
            // `_mm_prefetch` with `_MM_HINT_ET0` compiles to a read prefetch
            // (PREFETCHT0) unless the build enables the `prfchw` feature,
            // and a read prefetch leaves the line shared: the store still
            // waits for ownership.
            unsafe {
                core::arch::asm!(
                    "prefetchw [{p}]",
                    p = in(reg) p,
                    options(nostack, preserves_flags, readonly)
                );
            }
        } else {
            // SAFETY: PREFETCHT0 (SSE, in every x86_64) is a hint, as above.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
            };
        }
    }
    // SAFETY: PRFM is a hint: never faults, whatever the address.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!(
            "prfm pstl1keep, [{p}]",
            p = in(reg) p,
            options(nostack, preserves_flags, readonly)
        );
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// Whether the processor has PREFETCHW (CPUID leaf 0x8000_0001, ECX bit 8:
/// every AMD processor since the K6-2, Intel's since Broadwell). Asked once
/// (CPUID is slow, and a VM exit in a guest), then one relaxed load: 0 =
/// not asked yet, 1 = yes, 2 = no. Nothing here allocates or locks, so it
/// may run in any hook.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_prefetchw() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    static KNOWN: AtomicU8 = AtomicU8::new(0);
    match KNOWN.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let yes = cpuid_prefetchw();
            KNOWN.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
            yes
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[cold]
#[inline(never)]
fn cpuid_prefetchw() -> bool {
    use core::arch::x86_64::__cpuid;
    // Leaf 0x8000_0000 gives the highest extended leaf, so 0x8000_0001 is
    // asked only if it exists.
    __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_never_faults() {
        let x = [0u8; 64];
        // Null, unmapped, kernel and non-canonical addresses: no fault.
        for p in [
            core::ptr::null(),
            8 as *const u8,
            usize::MAX as *const u8,
            x.as_ptr(),
        ] {
            prefetch_for_write(p);
        }
        assert_eq!(x, [0u8; 64]);
    }

    /// The CPUID check agrees with the kernel's, which lists PREFETCHW as
    /// `3dnowprefetch` among the flags of `/proc/cpuinfo`.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn prefetchw_is_used_exactly_where_the_processor_has_it() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let flags = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .expect("a flags line");
        let kernel_says = flags.split_whitespace().any(|f| f == "3dnowprefetch");
        assert_eq!(has_prefetchw(), kernel_says, "{flags}");
        // Asked once, then remembered.
        assert_eq!(has_prefetchw(), cpuid_prefetchw());
    }
}
