//! Page protections of this process, from `/proc/self/maps`, and the
//! store into a possibly read-only (RELRO) GOT slot.
//!
//! A GOT slot in a page the maps show read-only is made writable for the
//! one aligned 8-byte store and given back its protection right after; the
//! store itself is atomic, so a thread calling through the slot at that
//! moment gets either the old function or the new one.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use heapprofd_client_core::procmaps;

/// Page protections from `/proc/self/maps` (read once per pass).
pub(crate) struct Protections {
    /// (start, end, PROT_*) sorted by start.
    ranges: Vec<(usize, usize, c_int)>,
    page: usize,
}

impl Protections {
    pub(crate) fn read() -> Protections {
        let text = read_self_maps();
        let mut ranges = Vec::new();
        for line in text.split(|&b| b == b'\n') {
            let Some((start, end)) = procmaps::parse_range(line) else {
                continue;
            };
            let perms = line
                .iter()
                .position(|&b| b == b' ')
                .and_then(|i| line.get(i + 1..i + 4));
            let Some(p) = perms else { continue };
            let mut prot = 0;
            if p.first() == Some(&b'r') {
                prot |= libc::PROT_READ;
            }
            if p.get(1) == Some(&b'w') {
                prot |= libc::PROT_WRITE;
            }
            if p.get(2) == Some(&b'x') {
                prot |= libc::PROT_EXEC;
            }
            ranges.push((start as usize, end as usize, prot));
        }
        ranges.sort_unstable_by_key(|r| r.0);
        Protections {
            ranges,
            page: heapprofd_shmem::page_size(),
        }
    }

    fn prot_of(&self, addr: usize) -> Option<c_int> {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        let r = self.ranges.get(i.checked_sub(1)?)?;
        (addr < r.1).then_some(r.2)
    }

    /// Stores `value` at `slot`, making its page writable for the moment if
    /// it is not. False if the page is unknown or cannot be made writable.
    pub(crate) fn store(&self, slot: usize, value: usize) -> bool {
        let page = slot & !(self.page - 1);
        let Some(prot) = self.prot_of(slot) else {
            return false;
        };
        let read_only = prot & libc::PROT_WRITE == 0;
        if read_only {
            // SAFETY: changing the protection of one mapped page of a
            // loaded object, restored right after the store.
            let rc =
                unsafe { libc::mprotect(page as *mut c_void, self.page, prot | libc::PROT_WRITE) };
            if rc != 0 {
                return false;
            }
        }
        // SAFETY: an aligned GOT entry, now writable; an atomic store so a
        // concurrent call through it sees the old or the new function.
        unsafe { (*(slot as *const AtomicUsize)).store(value, Ordering::SeqCst) };
        if read_only {
            // SAFETY: as above.
            unsafe { libc::mprotect(page as *mut c_void, self.page, prot) };
        }
        true
    }
}

/// The whole of `/proc/self/maps` (raw reads; allocates through our own
/// allocator, which bypasses the hooks). Empty on error.
fn read_self_maps() -> Vec<u8> {
    let mut out = Vec::new();
    procmaps::read_self_maps(&mut [0u8; 4096], |chunk| {
        out.extend_from_slice(chunk);
        true
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protections_parse_this_process() {
        let p = Protections::read();
        let here = protections_parse_this_process as *const () as usize;
        let prot = p.prot_of(here).expect("our text is mapped");
        assert_ne!(prot & libc::PROT_EXEC, 0);
        assert_eq!(prot & libc::PROT_WRITE, 0);
        assert!(p.prot_of(0).is_none());
    }
}
