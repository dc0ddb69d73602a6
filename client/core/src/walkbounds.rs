//! The memory an in-process stack walk may read: the stack the walk starts
//! on, from its stack pointer up (the front-end's `heapprofd_walk_stack`).
//!
//! Async-signal-safe: no allocation, no lock. In order: the thread's
//! cached bounds (its TLS block, if a sample or an earlier walk found
//! them), the main thread's stack (found by the constructor), the
//! thread's alternate signal stack, and otherwise the readable mapping
//! that holds the stack pointer in `/proc/self/maps` (raw system calls);
//! when that mapping is the thread's own stack (it holds the thread's TLS
//! block, as glibc lays out thread stacks) it is cached in the TLS block,
//! if the walk can take the reentrancy guard (not while it interrupts the
//! client's own code). Reads are bounded below by the starting stack
//! pointer: everything from there to the top of a stack is mapped (a
//! stack grows down), so a corrupt frame cannot point the walk at an
//! unmapped page of the main thread's growable stack.

use crate::capture::{frames_top, main_stack_bounds};
use crate::procmaps::{parse_range, read_self_maps};
use crate::tls::{Guard, STACK_KNOWN, STACK_UNKNOWN, state};

/// `[lo, hi)`: the bytes a walk starting at `sp` may read, or None when
/// `sp` is on no stack (and no readable mapping) known.
pub fn walk_bounds(sp: u64) -> Option<(u64, u64)> {
    let sp = sp & !7;
    let within = |(lo, hi): (u64, u64)| (sp >= lo && sp < hi).then_some((sp, hi));
    let st = state();
    // SAFETY: `st` is this thread's TLS block; reading plain fields a
    // handler on this thread cannot see half-written in a way that matters
    // (a torn read gives bounds that fail the check below).
    let cached =
        unsafe { ((*st).stack_state == STACK_KNOWN).then(|| ((*st).stack_lo, (*st).stack_hi)) };
    if let Some(b) = cached.and_then(within) {
        return Some(b);
    }
    if let Some(b) = main_stack_bounds().and_then(within) {
        return Some(b);
    }
    // SAFETY: sigaltstack with a null new stack only reads the current one.
    unsafe {
        let mut ss: libc::stack_t = core::mem::zeroed();
        if libc::sigaltstack(core::ptr::null(), &mut ss) == 0 && ss.ss_flags & libc::SS_ONSTACK != 0
        {
            let lo = ss.ss_sp as u64;
            if let Some(b) = within((lo, lo.saturating_add(ss.ss_size as u64))) {
                return Some(b);
            }
        }
    }
    let (lo, end) = readable_mapping(sp)?;
    let hi = frames_top(lo, end);
    // glibc keeps a thread's static TLS (our block in it) at the top of its
    // stack block: then this mapping is the thread's own stack, worth
    // caching. (A coroutine's stack elsewhere is not.)
    let own = st as u64 >= lo && (st as u64) < end;
    if own && let Some(_g) = Guard::enter() {
        // SAFETY: this thread's TLS block, guard held: no sampled path of
        // ours is computing the bounds under us.
        unsafe {
            if (*st).stack_state == STACK_UNKNOWN {
                (*st).stack_lo = lo;
                (*st).stack_hi = hi;
                (*st).stack_state = STACK_KNOWN;
            }
        }
    }
    within((lo, hi))
}

/// The readable mapping of `/proc/self/maps` that holds `addr`.
fn readable_mapping(addr: u64) -> Option<(u64, u64)> {
    let mut found: Option<Option<(u64, u64)>> = None;
    let mut line = [0u8; 64];
    let mut len = 0usize;
    read_self_maps(&mut [0u8; 1024], |chunk| {
        for &b in chunk {
            if b == b'\n' {
                let l = line.get(..len).unwrap_or(&[]);
                if let Some((lo, hi)) = parse_range(l)
                    && addr >= lo
                    && addr < hi
                {
                    let perms = l.iter().position(|&b| b == b' ').and_then(|i| l.get(i + 1));
                    found = Some((perms == Some(&b'r')).then_some((lo, hi)));
                }
                len = 0;
            } else if let Some(s) = line.get_mut(len) {
                *s = b;
                len += 1;
            }
        }
        found.is_none()
    });
    found.flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_is_within_the_bounds_of_its_stack() {
        let local = 7u64;
        let sp = &local as *const u64 as u64;
        let (lo, hi) = walk_bounds(sp).expect("on a stack");
        assert_eq!(lo, sp);
        assert!(hi > sp && hi - sp < (64 << 20));
        std::thread::spawn(|| {
            let l = 1u64;
            let sp = &l as *const u64 as u64;
            let (lo, hi) = walk_bounds(sp).expect("thread stack");
            assert_eq!(lo, sp);
            assert!(hi > sp);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_unmapped_address_has_no_bounds() {
        assert_eq!(readable_mapping(0x1000), None);
        assert_eq!(walk_bounds(0x1000), None);
    }
}
