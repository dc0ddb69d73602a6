//! A prefetch-for-write hint: starts bringing a cache line into this core's
//! cache in a state it can write, so that the stores that follow do not
//! wait for it. Used by the client's sample path for the ring's next record
//! and the free set's lines, which the other side (the daemon's reader) or
//! a long stretch of the program's own work has usually taken away.

/// Hints that the line holding `p` is about to be written. Never faults and
/// changes nothing architecturally, whatever the address.
#[inline(always)]
pub fn prefetch_for_write(p: *const u8) {
    // SAFETY: a prefetch reads and writes nothing architecturally and never
    // faults, whatever the address.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        // PREFETCHW, spelled out: `_mm_prefetch` with `_MM_HINT_ET0` becomes
        // a read prefetch (PREFETCHT0) unless the build enables the `prfchw`
        // feature, and a read prefetch leaves the line shared, so the store
        // still waits for ownership. Processors without it (Intel before
        // Broadwell) execute it as a no-op.
        core::arch::asm!(
            "prefetchw [{p}]",
            p = in(reg) p,
            options(nostack, preserves_flags, readonly)
        );
    }
    // SAFETY: as above (PRFM is a hint).
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
}
