//! GOT patching: reaching the program's malloc calls when the library was
//! loaded after start-up (attach) instead of with `LD_PRELOAD`.
//!
//! A library `dlopen`ed into a running program does not interpose anything:
//! every object already bound its `malloc` references to glibc's. So when a
//! session starts and the library does not interpose (`interpose`), the
//! connecting thread rewrites the resolved addresses in the global offset
//! tables of every loaded object, for the records of a hook table:
//!
//! * which objects: all of `dl_iterate_phdr`'s, except this library, the
//!   dynamic linker (its own allocations go through pointers it set up at
//!   start-up) and the vDSO;
//! * which entries: `JUMP_SLOT` (calls through the PLT) and `GLOB_DAT`
//!   (`-fno-plt` calls and function pointers) relocations, in `DT_JMPREL` and
//!   `DT_RELA` (after the `DT_RELACOUNT` relative ones), whose symbol is the
//!   name of a record;
//! * which values: only a slot that holds the record's original (glibc's
//!   function, see `originals`) or a lazy-binding stub inside its own
//!   object is changed; anything else is left alone;
//! * how: with `protections::Protections::store` (RELRO pages are made
//!   writable for the one atomic store).
//!
//! Every change is remembered (slot, old value). When the session ends
//! every loaded object is walked again and every slot that still holds our
//! hook gets its old value back: only objects still loaded are touched
//! (inside `dl_iterate_phdr`, which holds the loader's lock, so none can be
//! unmapped meanwhile), and a slot someone else changed since (lazy binding
//! racing the patch) is left as it is. Afterwards no allocation path goes
//! through the library; its code stays mapped (it is never unloaded), so a
//! thread that read the hook address just before the restore still runs
//! correct pass-through code.
//!
//! Everything here runs with the reentrancy guard held, so glibc calls that
//! allocate pass through the hooks. One mutex serialises the passes; the
//! paths that run inside the program's calls (`newobjects`) only try it,
//! so they never wait on the watcher (or on a lock held by a thread that no
//! longer exists in a forked child). std's `Mutex` is a futex word: its
//! poisoning check reads the thread-local panic count only while a panic
//! is in flight (the global count is zero otherwise), which with
//! `panic = "abort"` means never before the process dies.

use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use crate::elfdyn::{Dynamic, Rela, Sym, in_object, read_dynamic};
use crate::hook::Hook;
use crate::protections::Protections;

#[cfg(target_arch = "x86_64")]
const R_JUMP_SLOT: u32 = 7;
#[cfg(target_arch = "x86_64")]
const R_GLOB_DAT: u32 = 6;
#[cfg(target_arch = "aarch64")]
const R_JUMP_SLOT: u32 = 1026;
#[cfg(target_arch = "aarch64")]
const R_GLOB_DAT: u32 = 1025;

/// One redirected slot.
#[derive(Debug, Clone, Copy)]
struct Patched {
    addr: usize,
    old: usize,
}

/// The patching of one session.
#[derive(Debug)]
pub(crate) struct PatchState {
    /// The records patched (empty: no session is patched).
    table: &'static [&'static Hook],
    /// Every slot changed in this session, sorted by address after a pass.
    slots: Vec<Patched>,
    /// `dlpi_adds` at the last pass.
    adds: u64,
    /// An address inside each object to leave alone (0 = none).
    skip: [usize; 4],
}

static PATCH: Mutex<PatchState> = Mutex::new(PatchState {
    table: &[],
    slots: Vec::new(),
    adds: 0,
    skip: [0; 4],
});

/// An address inside the object whose own slots [`bypass`] pointed at the
/// originals (0 = none): sessions leave that object alone.
static BYPASSED: AtomicUsize = AtomicUsize::new(0);

/// Mirrors "a session is patched" for lock-free readers.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Waits for the patch state (the watcher and the attach and detach
/// entries; never a hook).
pub(crate) fn lock() -> MutexGuard<'static, PatchState> {
    PATCH.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The patch state, unless someone holds it (the paths inside the
/// program's calls).
pub(crate) fn try_lock() -> Option<MutexGuard<'static, PatchState>> {
    match PATCH.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Whether a patched session is running.
pub(crate) fn is_active() -> bool {
    ACTIVE.load(Ordering::SeqCst)
}

impl PatchState {
    /// Whether a session is patched.
    pub(crate) fn active(&self) -> bool {
        !self.table.is_empty()
    }

    /// `dlpi_adds` when the last pass ran.
    pub(crate) fn adds(&self) -> u64 {
        self.adds
    }

    /// Patches every loaded object for a new session, redirecting the slots
    /// of `table`'s records (their originals must be resolved).
    pub(crate) fn start(&mut self, table: &'static [&'static Hook]) {
        self.table = table;
        self.skip = [
            // This library, the dynamic linker, the vDSO.
            patch_pass as *const () as usize,
            global_symbol(c"__tls_get_addr"),
            // SAFETY: getauxval has no preconditions.
            unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize,
            // An allocator calling its own entry points (see `bypass`).
            BYPASSED.load(Ordering::SeqCst),
        ];
        self.slots.clear();
        ACTIVE.store(true, Ordering::SeqCst);
        self.pass(Pass::Patch);
    }

    /// Puts every patched slot back (the session ended). No-op if no
    /// session is patched.
    pub(crate) fn end(&mut self) {
        if !self.active() {
            return;
        }
        ACTIVE.store(false, Ordering::SeqCst);
        self.pass(Pass::Restore);
        self.table = &[];
        self.slots.clear();
        self.slots.shrink_to_fit();
    }

    /// Patches the objects loaded since the last pass (a pass over every
    /// object: the ones already patched hold our hooks and are skipped).
    pub(crate) fn patch_new(&mut self) {
        if self.active() {
            self.pass(Pass::Patch);
        }
    }

    fn pass(&mut self, kind: Pass) {
        self.pass_over(kind, 0);
    }

    /// A pass over every object (`only` = 0) or over the object containing
    /// `only`.
    fn pass_over(&mut self, kind: Pass, only: usize) {
        let maps = Protections::read();
        let mut ctx = PassCtx {
            st: self,
            maps,
            kind,
            adds: 0,
            only,
        };
        // SAFETY: the callback only touches the objects glibc reports.
        unsafe { libc::dl_iterate_phdr(Some(patch_pass), (&mut ctx as *mut PassCtx<'_>).cast()) };
        let adds = ctx.adds;
        self.adds = adds;
        self.slots.sort_unstable_by_key(|p| p.addr);
    }
}

/// Points the slots that the object containing `object` has for the
/// records of `table` at the records' originals, for good: that object's
/// own calls to those names no longer reach the hooks.
///
/// For an allocator that defines `operator new`/`delete` as well as
/// `malloc`/`free` (jemalloc, tcmalloc, mimalloc), whose operators the C++
/// hooks record: jemalloc's `operator delete` jumps to `free` through its
/// PLT, its aligned `operator new` calls `aligned_alloc`, and with the
/// client ahead of it in lookup order those calls would land in our hooks
/// and be recorded a second time. Calls the allocator makes for its own
/// bookkeeping (tcmalloc's `new` of its internal tables) are not the
/// program's and are not recorded either. Call with the guard held; later
/// sessions leave the object alone.
pub(crate) fn bypass(table: &'static [&'static Hook], object: usize) {
    if object == 0 {
        return;
    }
    BYPASSED.store(object, Ordering::SeqCst);
    let mut st = PatchState {
        table,
        slots: Vec::new(),
        adds: 0,
        skip: [0; 4],
    };
    st.pass_over(Pass::Bypass, object);
}

/// What a global lookup of `name` finds (0 = nothing). Call with the guard
/// held (`dlsym` may allocate).
fn global_symbol(name: &CStr) -> usize {
    // SAFETY: dlsym with a valid NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Patch,
    Restore,
    /// Slots holding our hook (or a lazy stub) get the original, for good.
    Bypass,
}

struct PassCtx<'a> {
    st: &'a mut PatchState,
    maps: Protections,
    kind: Pass,
    adds: u64,
    /// An address inside the one object to visit (0 = every object).
    only: usize,
}

/// The `dl_iterate_phdr` callback of a pass.
unsafe extern "C" fn patch_pass(
    info: *mut libc::dl_phdr_info,
    size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: glibc passes a valid info and our context; the object stays
    // mapped while the callback runs (the loader's lock is held).
    unsafe {
        let ctx = &mut *data.cast::<PassCtx<'_>>();
        let info = &*info;
        if size >= core::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) {
            ctx.adds = info.dlpi_adds;
        }
        visit_object(ctx, info);
    }
    0
}

/// # Safety
/// `info` describes a loaded object that stays mapped during the call.
unsafe fn visit_object(ctx: &mut PassCtx<'_>, info: &libc::dl_phdr_info) {
    if ctx.st.skip.iter().any(|&a| a != 0 && in_object(info, a))
        || (ctx.only != 0 && !in_object(info, ctx.only))
    {
        return;
    }
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { read_dynamic(info) }) else {
        return;
    };
    if d.symtab == 0 || d.strtab == 0 {
        return;
    }
    let rela_size = core::mem::size_of::<Rela>();
    if d.jmprel != 0 && d.pltrel_is_rela {
        // SAFETY: the table the loader itself used for this object.
        unsafe { visit_relocs(ctx, info, &d, d.jmprel, d.pltrelsz / rela_size) };
    }
    if d.rela != 0 && (d.relaent == 0 || d.relaent == rela_size) {
        let n = d.relasz / rela_size;
        let skip = d.relacount.min(n);
        let start = d.rela + skip * rela_size;
        // SAFETY: as above (the relative relocations are skipped).
        unsafe { visit_relocs(ctx, info, &d, start, n - skip) };
    }
}

/// # Safety
/// `[start, start + n * 24)` is a relocation table of the object.
unsafe fn visit_relocs(
    ctx: &mut PassCtx<'_>,
    info: &libc::dl_phdr_info,
    d: &Dynamic,
    start: usize,
    n: usize,
) {
    let base = info.dlpi_addr as usize;
    let relas = start as *const Rela;
    for i in 0..n {
        // SAFETY: within the table (caller's contract).
        let r = unsafe { &*relas.add(i) };
        let ty = (r.info & 0xffff_ffff) as u32;
        if ty != R_JUMP_SLOT && ty != R_GLOB_DAT {
            continue;
        }
        let sym_index = (r.info >> 32) as usize;
        if sym_index == 0 {
            continue;
        }
        // SAFETY: the relocation's symbol index is valid in the object's symtab.
        let sym = unsafe { &*(d.symtab as *const Sym).add(sym_index) };
        if d.strsz != 0 && sym.name as usize >= d.strsz {
            continue;
        }
        // SAFETY: a NUL-terminated name inside the string table.
        let name = unsafe { CStr::from_ptr((d.strtab + sym.name as usize) as *const c_char) };
        let Some(&hook) = ctx.st.table.iter().find(|h| h.name == name) else {
            continue;
        };
        let slot = base.wrapping_add(r.offset as usize);
        // SAFETY: the slot is this object's GOT entry for `name`.
        unsafe { visit_slot(ctx, info, hook, slot) };
    }
}

/// # Safety
/// `slot` is a GOT entry of the loaded object `info`.
unsafe fn visit_slot(ctx: &mut PassCtx<'_>, info: &libc::dl_phdr_info, rec: &Hook, slot: usize) {
    let (hook, expected) = (rec.hook_addr(), rec.original());
    if hook == 0 || expected == 0 || !rec.patched() {
        return;
    }
    if slot % 8 != 0 {
        return;
    }
    // SAFETY: an aligned, mapped GOT entry; read atomically.
    let cur = unsafe { (*(slot as *const AtomicUsize)).load(Ordering::SeqCst) };
    match ctx.kind {
        Pass::Patch => {
            if cur == hook || !(cur == expected || in_object(info, cur)) {
                return;
            }
            if ctx.maps.store(slot, hook) {
                match ctx.st.slots.binary_search_by_key(&slot, |p| p.addr) {
                    // A new object at the address of an unloaded one.
                    Ok(i) => {
                        if let Some(p) = ctx.st.slots.get_mut(i) {
                            p.old = cur;
                        }
                    }
                    Err(_) => ctx.st.slots.push(Patched {
                        addr: slot,
                        old: cur,
                    }),
                }
            }
        }
        Pass::Bypass => {
            if cur == hook || (cur != expected && in_object(info, cur)) {
                ctx.maps.store(slot, expected);
            }
        }
        Pass::Restore => {
            if cur != hook {
                return;
            }
            let old = ctx
                .st
                .slots
                .binary_search_by_key(&slot, |p| p.addr)
                .ok()
                .and_then(|i| ctx.st.slots.get(i))
                .map_or(expected, |p| p.old);
            ctx.maps.store(slot, old);
        }
    }
}
