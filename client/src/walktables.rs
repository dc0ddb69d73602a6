//! The unwind tables of the in-process stack walk (`heapprofd_walk_stack`,
//! `walkstack`): one framehop unwinder over the `.eh_frame_hdr` and
//! `.eh_frame` of every loaded object, read in place (nothing is copied),
//! and the sorted executable ranges of those objects.
//!
//! Built outside signal handlers only: when the program prepares the API
//! (`heapprofd_walk_prepare`, which the header and the Rust crate call
//! before any walk, and again after a `dlopen`), after a `dlopen` of a
//! path through the `dlopen` hook (`dlhook`: only a patched client's, a
//! preloaded one does not interpose `dlopen`) and around every `dlclose`
//! (`dlclosehook`). Building allocates through the library's own
//! allocator with the reentrancy guard held; a walk only reads.
//!
//! Double buffering: two slots, each a table pointer and a count of the
//! walks reading it, and the index of the current slot. A walk counts
//! itself into the current slot, then checks that the slot is still
//! current (else it backs off and retries, a bounded number of times),
//! and only then reads the slot's pointer. An update (one at a time, under
//! a mutex) waits until nobody reads the other slot, frees its table,
//! installs the new one there and makes it current; so a table is never
//! freed while a walk reads it, and a walk never waits. Before a
//! `dlclose`, the object is taken out of the tables and the update also
//! waits for the walks still reading the previous table: after that no
//! walk reads the object's sections, and glibc may unmap them.

use core::ffi::{c_int, c_void};
use core::ops::Deref;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use framehop::{ExplicitModuleSectionInfo, Module, MustNotAllocateDuringUnwind, Unwinder};
use heapprofd_client_core::tls::Guard;

#[cfg(target_arch = "aarch64")]
pub(crate) use framehop::aarch64::{
    CacheAarch64 as ArchCache, UnwindRegsAarch64 as ArchRegs, UnwinderAarch64 as ArchUnwinder,
};
#[cfg(target_arch = "x86_64")]
pub(crate) use framehop::x86_64::{
    CacheX86_64 as ArchCache, UnwindRegsX86_64 as ArchRegs, UnwinderX86_64 as ArchUnwinder,
};

/// Bytes of a loaded object, in place. The object stays mapped while a
/// table holding it can be read (see the module doc).
#[derive(Debug, Clone, Copy)]
pub(crate) struct InPlace {
    ptr: *const u8,
    len: usize,
}

impl Default for InPlace {
    fn default() -> Self {
        InPlace {
            ptr: core::ptr::NonNull::dangling().as_ptr(),
            len: 0,
        }
    }
}

impl Deref for InPlace {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: a range of a loaded object's readable segment, mapped
        // while any table that holds it is readable.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// The walk's unwinder: never allocates while unwinding.
pub(crate) type WalkUnwinder = ArchUnwinder<InPlace, MustNotAllocateDuringUnwind>;
/// A walk's rule cache (per walk in progress, see `walkstack`).
pub(crate) type WalkCache = ArchCache<MustNotAllocateDuringUnwind>;

/// One complete set of tables.
pub(crate) struct Tables {
    /// framehop's modules.
    pub(crate) unwinder: WalkUnwinder,
    /// Executable ranges `[start, end)` of the objects, sorted, with the
    /// object's load bias.
    pub(crate) ranges: Vec<(u64, u64, u64)>,
    /// JIT code ranges from the process's perf map, sorted (`perfmap`).
    pub(crate) jit: Vec<(u64, u64)>,
}

impl Tables {
    /// Whether `pc` is inside a loaded object's executable segment.
    pub(crate) fn contains(&self, pc: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.0 <= pc);
        i > 0 && self.ranges.get(i - 1).is_some_and(|r| pc < r.1)
    }

    /// Whether `pc` is in JIT code the perf map named when the tables were built.
    pub(crate) fn is_jit(&self, pc: u64) -> bool {
        let i = self.jit.partition_point(|r| r.0 <= pc);
        i > 0 && self.jit.get(i - 1).is_some_and(|r| pc < r.1)
    }
}

/// A slot of the double buffer.
struct Slot {
    tables: AtomicPtr<Tables>,
    readers: AtomicU32,
}

static SLOTS: [Slot; 2] = [const {
    Slot {
        tables: AtomicPtr::new(core::ptr::null_mut()),
        readers: AtomicU32::new(0),
    }
}; 2];
static CURRENT: AtomicUsize = AtomicUsize::new(0);
/// Serialises updates.
static UPDATE: Mutex<()> = Mutex::new(());

/// Why a walk could not read the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// Never built (the API was not prepared).
    NotReady,
    /// Updates kept replacing the current table while the walk tried.
    Updating,
}

/// A walk's hold on the current tables (released on drop).
pub(crate) struct Reading {
    slot: &'static Slot,
    tables: &'static Tables,
}

impl Reading {
    /// The tables read.
    pub(crate) fn tables(&self) -> &Tables {
        self.tables
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.slot.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads the current tables (async-signal-safe: atomics only).
pub(crate) fn read() -> Result<Reading, Unavailable> {
    for _ in 0..16 {
        let i = CURRENT.load(Ordering::SeqCst);
        let slot = &SLOTS[i & 1];
        slot.readers.fetch_add(1, Ordering::SeqCst);
        if CURRENT.load(Ordering::SeqCst) == i {
            let p = slot.tables.load(Ordering::SeqCst);
            if p.is_null() {
                slot.readers.fetch_sub(1, Ordering::SeqCst);
                return Err(Unavailable::NotReady);
            }
            // SAFETY: the slot is current and counts us: no update frees
            // its table until we stop reading.
            let tables = unsafe { &*p };
            return Ok(Reading { slot, tables });
        }
        slot.readers.fetch_sub(1, Ordering::SeqCst);
    }
    Err(Unavailable::Updating)
}

/// The current table (tests).
#[cfg(test)]
pub(crate) fn current_table() -> *const Tables {
    SLOTS[CURRENT.load(Ordering::SeqCst) & 1]
        .tables
        .load(Ordering::SeqCst)
}

/// Whether tables were ever built (the API is prepared).
pub(crate) fn prepared() -> bool {
    !SLOTS[CURRENT.load(Ordering::SeqCst) & 1]
        .tables
        .load(Ordering::SeqCst)
        .is_null()
}

/// Builds the tables from the objects loaded now and makes them current.
pub(crate) fn refresh() {
    update(None);
}

/// In a fork child: walks that other threads of the parent were making
/// do not exist here; their counts would hold back every update.
pub(crate) fn forget_readers() {
    for s in &SLOTS {
        s.readers.store(0, Ordering::SeqCst);
    }
}

/// Refreshes only if the API was prepared (the `dlopen`/`dlclose` hooks:
/// a program that never walks pays nothing).
pub(crate) fn refresh_if_prepared() {
    if prepared() {
        update(None);
    }
}

/// Before `dlclose(handle)`: tables without that object, and no walk still
/// reading the previous ones.
pub(crate) fn before_unload(handle: *mut c_void) {
    if !prepared() || handle.is_null() {
        return;
    }
    // glibc's `dlinfo`; other libcs (bionic: this front-end is only
    // type-checked there) have no link map to read, and the tables keep the
    // object until the next prepare.
    #[cfg(target_env = "gnu")]
    {
        /// The public head of glibc's `struct link_map` (`<link.h>`).
        #[repr(C)]
        struct LinkMap {
            l_addr: usize,
        }
        let mut lm: *mut LinkMap = core::ptr::null_mut();
        // SAFETY: dlinfo on the program's handle, writing the link map pointer.
        let rc = unsafe {
            libc::dlinfo(
                handle,
                libc::RTLD_DI_LINKMAP,
                (&mut lm as *mut *mut LinkMap).cast(),
            )
        };
        if rc != 0 || lm.is_null() {
            return;
        }
        // SAFETY: a valid link map glibc gave us.
        let bias = unsafe { (*lm).l_addr } as u64;
        if bias != 0 {
            update(Some(bias));
        }
    }
}

/// Waits (bounded, 2 s) until nobody reads `slot`. False on timeout.
fn drain(slot: &Slot) -> bool {
    let now = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec we pass.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    let deadline = now() + 2_000_000_000;
    let mut spins = 0u32;
    while slot.readers.load(Ordering::SeqCst) != 0 {
        spins = spins.saturating_add(1);
        if spins > 1000 {
            if now() > deadline {
                return false;
            }
            // SAFETY: no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
    true
}

fn update(without_bias: Option<u64>) {
    let _g = Guard::enter(); // None: already held by this thread's caller.
    let saved = heapprofd_client_core::errno::get();
    let lock = UPDATE.lock().unwrap_or_else(PoisonError::into_inner);
    let new = Box::into_raw(Box::new(build(without_bias)));
    let cur = CURRENT.load(Ordering::SeqCst);
    let other = &SLOTS[(cur + 1) & 1];
    if drain(other) {
        let old = other.tables.swap(new, Ordering::SeqCst);
        if !old.is_null() {
            // SAFETY: made by Box::into_raw here; nobody reads it (drained,
            // and the slot is not current, so no new reader keeps it).
            drop(unsafe { Box::from_raw(old) });
        }
        CURRENT.store((cur + 1) & 1, Ordering::SeqCst);
        if without_bias.is_some() {
            // Walks still reading the previous tables may read the object
            // about to be unmapped.
            drain(&SLOTS[cur & 1]);
        }
    } else {
        // A walk that never ends (stopped thread): keep everything.
        // SAFETY: made by Box::into_raw above, never published.
        drop(unsafe { Box::from_raw(new) });
    }
    drop(lock);
    heapprofd_client_core::errno::set(saved);
}

/// The `dl_iterate_phdr` pass that builds a table.
struct Build {
    tables: Tables,
    skip_bias: Option<u64>,
}

fn build(skip_bias: Option<u64>) -> Tables {
    let mut b = Build {
        tables: Tables {
            unwinder: WalkUnwinder::new(),
            ranges: Vec::with_capacity(64),
            jit: crate::perfmap::jit_ranges(),
        },
        skip_bias,
    };
    // SAFETY: the callback only reads what glibc passes.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut b as *mut Build).cast()) };
    b.tables.ranges.sort_unstable();
    b.tables
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: glibc's info for one object; our Build.
    let (info, b) = unsafe { (&*info, &mut *data.cast::<Build>()) };
    let bias = info.dlpi_addr;
    if b.skip_bias == Some(bias) || info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: glibc's program headers of a loaded object.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    if let Some(m) = module(bias, phdrs) {
        b.tables.ranges.push((m.0.start, m.0.end, bias));
        b.tables.unwinder.add_module(m.1);
    }
    0
}

/// `PF_X` of `<elf.h>` (the libc crate has it for glibc only).
const PF_X: u32 = 1;

/// The module of one loaded object: its executable segment and its unwind
/// sections, in place. None without an executable segment.
fn module(
    bias: u64,
    phdrs: &[libc::Elf64_Phdr],
) -> Option<(core::ops::Range<u64>, Module<InPlace>)> {
    let text = phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_LOAD && p.p_flags & PF_X != 0)?;
    let text_svma = text.p_vaddr..text.p_vaddr.checked_add(text.p_memsz)?;
    let avma = bias.checked_add(text_svma.start)?..bias.checked_add(text_svma.end)?;
    let mut info = ExplicitModuleSectionInfo::<InPlace> {
        base_svma: 0,
        text_svma: Some(text_svma.clone()),
        text: Some(InPlace {
            ptr: avma.start as *const u8,
            len: text.p_filesz.min(text.p_memsz) as usize,
        }),
        ..Default::default()
    };
    if let Some(hdr) = phdrs.iter().find(|p| p.p_type == libc::PT_GNU_EH_FRAME) {
        let hdr_avma = bias.checked_add(hdr.p_vaddr)?;
        // SAFETY: the object's PT_GNU_EH_FRAME segment, mapped.
        let hdr_bytes =
            unsafe { core::slice::from_raw_parts(hdr_avma as *const u8, hdr.p_memsz as usize) };
        if let Some(eh_avma) = eh_frame_ptr(hdr_bytes, hdr_avma) {
            let eh_svma = eh_avma.wrapping_sub(bias);
            // The section ends at most where its segment does.
            if let Some(seg) = phdrs.iter().find(|p| {
                p.p_type == libc::PT_LOAD
                    && eh_svma >= p.p_vaddr
                    && eh_svma < p.p_vaddr + p.p_filesz.min(p.p_memsz)
            }) {
                let len = seg.p_vaddr + seg.p_filesz.min(seg.p_memsz) - eh_svma;
                info.eh_frame_hdr_svma = Some(hdr.p_vaddr..hdr.p_vaddr + hdr.p_memsz);
                info.eh_frame_hdr = Some(InPlace {
                    ptr: hdr_avma as *const u8,
                    len: hdr.p_memsz as usize,
                });
                info.eh_frame_svma = Some(eh_svma..eh_svma + len);
                info.eh_frame = Some(InPlace {
                    ptr: eh_avma as *const u8,
                    len: len as usize,
                });
            }
        }
    }
    let m = Module::new(String::new(), avma.clone(), bias, info);
    Some((avma, m))
}

/// `.eh_frame`'s address from an `.eh_frame_hdr` at `hdr_avma`.
fn eh_frame_ptr(hdr: &[u8], hdr_avma: u64) -> Option<u64> {
    const DW_EH_PE_PCREL: u8 = 0x10;
    const DW_EH_PE_DATAREL: u8 = 0x30;
    let (&version, rest) = hdr.split_first()?;
    let &enc = rest.first()?;
    if version != 1 {
        return None;
    }
    let field = hdr.get(4..)?;
    let value: i64 = match enc & 0x0f {
        0x0b => i64::from(i32::from_le_bytes(field.get(..4)?.try_into().ok()?)),
        0x03 => i64::from(u32::from_le_bytes(field.get(..4)?.try_into().ok()?)),
        0x04 | 0x0c => i64::from_le_bytes(field.get(..8)?.try_into().ok()?),
        _ => return None,
    };
    match enc & 0x70 {
        0 => Some(value as u64),
        DW_EH_PE_PCREL => Some((hdr_avma + 4).wrapping_add(value as u64)),
        DW_EH_PE_DATAREL => Some(hdr_avma.wrapping_add(value as u64)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_cover_this_function_and_libc() {
        refresh();
        let r = read().expect("prepared");
        let here = tables_cover_this_function_and_libc as *const () as usize as u64;
        assert!(r.tables().contains(here));
        assert!(
            r.tables()
                .contains(libc::getpid as *const () as usize as u64)
        );
        assert!(!r.tables().contains(0x1000));
        assert!(r.tables().unwinder.max_known_code_address() > here);
    }

    #[test]
    fn eh_frame_ptr_decodes_pcrel_sdata4() {
        let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b];
        hdr.extend_from_slice(&0x100i32.to_le_bytes());
        assert_eq!(eh_frame_ptr(&hdr, 0x4000), Some(0x4104));
        assert_eq!(eh_frame_ptr(&[2, 0x1b, 0, 0, 0, 0, 0, 0], 0), None);
    }
}
