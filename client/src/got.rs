//! GOT patching: reaching the program's malloc calls when the library was
//! loaded after start-up (attach) instead of with `LD_PRELOAD`.
//!
//! A library `dlopen`ed into a running program does not interpose anything:
//! every object already bound its `malloc` references to glibc's. So when a
//! session starts and the library is not the global `malloc` (decided once
//! in the constructor, [`interposing`]), the watcher thread rewrites the
//! resolved addresses in the global offset tables of every loaded object:
//!
//! * which objects: all of `dl_iterate_phdr`'s, except this library, the
//!   dynamic linker (its own allocations go through pointers it set up at
//!   start-up) and the vDSO;
//! * which entries: `JUMP_SLOT` (calls through the PLT) and `GLOB_DAT`
//!   (`-fno-plt` calls and function pointers) relocations, in `DT_JMPREL` and
//!   `DT_RELA` (after the `DT_RELACOUNT` relative ones), whose symbol is one
//!   of the malloc family or `dlopen`;
//! * which values: only a slot that holds glibc's function (what a global
//!   lookup of the name finds, checked to be in libc) or a lazy-binding stub
//!   inside its own object is changed; anything else (another interposer, an
//!   object that defines its own `malloc`) is left alone. If the global
//!   `malloc`/`free`/`calloc`/`realloc` are not glibc's, nothing is patched
//!   and the session is refused (our hooks call `__libc_*`, so mixing them
//!   with another allocator would corrupt the heap);
//! * how: pages that `/proc/self/maps` shows read-only (RELRO) are made
//!   writable for the one 8-byte store and given back their protection; the
//!   store itself is atomic, so a thread calling through the slot at that
//!   moment gets either glibc's function or ours, both correct.
//!
//! Every change is remembered (slot, old value, hook). When the session ends
//! the watcher walks the loaded objects again and puts back the old value in
//! every slot that still holds our hook: only objects still loaded are
//! touched (inside `dl_iterate_phdr`, which holds the loader's lock, so none
//! can be unmapped meanwhile), and a slot someone else changed since (lazy
//! binding racing the patch) is left as it is. Afterwards no allocation path
//! goes through the library; its code stays mapped (it is never unloaded),
//! so a thread that read the hook address just before the restore still
//! runs correct pass-through code.
//!
//! Objects loaded later: `dlopen` slots are redirected to
//! `heapprofd_rs_dlopen_hook` (x86_64, `dlhook`). glibc's `dlopen` looks at its return
//! address to find the caller's object (its namespace, `RUNPATH` and
//! `$ORIGIN`), so the hook only wraps calls whose file name has a `/` and
//! no `$` (no search path, no substitution: the result does not depend on
//! the caller); those are patched right after the real `dlopen` returns.
//! Every other call is a tail jump to glibc's `dlopen`, which then sees the
//! caller's own return address; it flags [`NEW_OBJECTS`], and the next
//! sampled allocation patches what the call added ([`catch_up`]). As a
//! safety net (and for glibc's own `dlopen`s: NSS, iconv), the watcher
//! compares `dlpi_adds` every [`POLL_MS`] and patches objects that appeared
//! (a synchronous session has no watcher).
//!
//! Everything here runs with the reentrancy guard held (the watcher holds it
//! for its whole life), so glibc calls that allocate pass through the hooks.
//! One mutex serialises patching; the `dlopen` hook only tries it, so it can
//! never wait on a watcher (or on a lock held by a thread that no longer
//! exists in a forked child).

use core::cell::UnsafeCell;
use core::ffi::{CStr, c_char, c_int, c_void};
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use heapprofd_client_core::frontend::{self, Frontend};
use heapprofd_client_core::procmaps;
use heapprofd_client_core::tls::Guard;

use crate::elfdyn::{Dynamic, Rela, Sym, in_object, is_canonical_plt, read_dynamic};

/// The glibc front-end, registered by the constructor.
pub(crate) static GLIBC: Frontend = Frontend {
    before_connect,
    after_session: on_session_end,
    tick_ms,
    tick: poll_new_objects,
    after_sample: catch_up,
};

fn before_connect() -> Result<(), frontend::Refusal> {
    on_session_start().map_err(|_| frontend::Refusal {
        message: b"the program's malloc is not glibc's; profiling refused",
    })
}

fn tick_ms() -> Option<u16> {
    is_active().then_some(POLL_MS)
}

/// How often the watcher looks for newly loaded objects while patched.
pub(crate) const POLL_MS: u16 = 200;

/// [`interposing`]: not decided (the constructor did not run).
const INTERPOSE_UNKNOWN: u8 = 0;
const INTERPOSE_YES: u8 = 1;
const INTERPOSE_NO: u8 = 2;
static INTERPOSING: AtomicU8 = AtomicU8::new(INTERPOSE_UNKNOWN);

/// Decides whether the library is the program's `malloc` (`LD_PRELOAD`) or
/// was loaded later without interposing. Called by the constructor with the
/// guard held (`dlsym` may allocate).
pub(crate) fn decide_interposing() {
    // SAFETY: dlsym with a valid NUL-terminated name.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let ours = crate::hooks::malloc as *const () as *mut c_void;
    let v = if global == ours {
        INTERPOSE_YES
    } else {
        INTERPOSE_NO
    };
    INTERPOSING.store(v, Ordering::SeqCst);
}

/// Whether the library interposes the program's malloc (false also when
/// unknown, e.g. the constructor did not run).
pub(crate) fn interposing() -> bool {
    INTERPOSING.load(Ordering::SeqCst) == INTERPOSE_YES
}

/// Whether sessions of this process need GOT patching.
pub(crate) fn needs_patching() -> bool {
    INTERPOSING.load(Ordering::SeqCst) == INTERPOSE_NO
}

#[cfg(target_arch = "x86_64")]
const R_JUMP_SLOT: u32 = 7;
#[cfg(target_arch = "x86_64")]
const R_GLOB_DAT: u32 = 6;
#[cfg(target_arch = "aarch64")]
const R_JUMP_SLOT: u32 = 1026;
#[cfg(target_arch = "aarch64")]
const R_GLOB_DAT: u32 = 1025;

/// Number of symbols redirected.
const N: usize = 11;
/// Index of `dlopen` in [`NAMES`].
const DLOPEN: usize = N - 1;
/// The symbols whose GOT entries are redirected (malloc family + dlopen).
const NAMES: [&CStr; N] = [
    c"malloc",
    c"free",
    c"calloc",
    c"realloc",
    c"reallocarray",
    c"posix_memalign",
    c"memalign",
    c"aligned_alloc",
    c"valloc",
    c"pvalloc",
    c"dlopen",
];

/// Our replacement for each of [`NAMES`] (0 = not redirected).
fn hook_addrs() -> [usize; N] {
    use crate::hooks as h;
    [
        h::malloc as *const () as usize,
        h::free as *const () as usize,
        h::calloc as *const () as usize,
        h::realloc as *const () as usize,
        h::reallocarray as *const () as usize,
        h::posix_memalign as *const () as usize,
        h::memalign as *const () as usize,
        h::aligned_alloc as *const () as usize,
        h::valloc as *const () as usize,
        h::pvalloc as *const () as usize,
        crate::dlhook::dlopen_hook_addr(),
    ]
}

/// Mirrors `PatchState::active` for lock-free readers.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// glibc's `dlopen` (what the hook forwards to), 0 until the first patch.
pub(crate) static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);

/// One redirected slot.
#[derive(Debug, Clone, Copy)]
struct Patched {
    addr: usize,
    old: usize,
}

#[derive(Debug)]
struct PatchState {
    active: bool,
    /// glibc's function for each name (0 = unknown: never patched).
    expected: [usize; N],
    hooks: [usize; N],
    /// Every slot changed in this session, sorted by address after a pass.
    slots: Vec<Patched>,
    /// `dlpi_adds` at the last pass.
    adds: u64,
    /// An address inside each object to leave alone (0 = none).
    skip: [usize; 3],
}

static PATCH: Lock<PatchState> = Lock::new(PatchState {
    active: false,
    expected: [0; N],
    hooks: [0; N],
    slots: Vec::new(),
    adds: 0,
    skip: [0; 3],
});

/// A lock for [`PatchState`]: std's `Mutex` would bring its poisoning
/// check (thread-local panic count) onto the hook paths that try it.
struct Lock<T> {
    held: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, one at a time.
unsafe impl<T: Send> Sync for Lock<T> {}

struct LockGuard<'a, T> {
    lock: &'a Lock<T>,
}

impl<T> Lock<T> {
    const fn new(value: T) -> Self {
        Lock {
            held: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    fn try_lock(&self) -> Option<LockGuard<'_, T>> {
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(LockGuard { lock: self })
    }

    /// Waits (yielding) for the lock; only the watcher and the attach and
    /// detach entries wait, never a hook.
    fn lock(&self) -> LockGuard<'_, T> {
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
}

impl<T> Deref for LockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: we hold the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for LockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: we hold the lock.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for LockGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.held.store(false, Ordering::Release);
    }
}

/// Why patching was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The global malloc family is not glibc's (another allocator interposes).
    OtherAllocator,
}

fn global_symbol(name: &CStr) -> usize {
    // SAFETY: dlsym with a valid NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

/// glibc's own functions for [`NAMES`] (looked up in libc itself, not in
/// the global scope), or a refusal if a global lookup of the core of the
/// malloc family finds someone else's.
///
/// A non-PIE program that takes the address of `malloc` makes its own PLT
/// entry the canonical address (a global lookup returns it, and other
/// objects' `GLOB_DAT` slots hold it); that entry jumps through the
/// program's own `JUMP_SLOT`, which is patched, so it counts as glibc's.
fn resolve_expected() -> Result<[usize; N], Refusal> {
    let mut out = [0usize; N];
    let handle = libc_handle();
    for (i, name) in NAMES.iter().enumerate() {
        let own = if handle.is_null() {
            0
        } else {
            // SAFETY: dlsym on a valid handle with a NUL-terminated name.
            unsafe { libc::dlsym(handle, name.as_ptr()) as usize }
        };
        let global = global_symbol(name);
        // dlopen lived in libdl before glibc 2.34: take it wherever a
        // global lookup finds it.
        out[i] = if own == 0 && i == DLOPEN { global } else { own };
        if i < 4 && (own == 0 || (global != own && !is_canonical_plt(name, global))) {
            close_handle(handle);
            return Err(Refusal::OtherAllocator);
        }
    }
    close_handle(handle);
    Ok(out)
}

/// A handle of the libc our `__libc_malloc` comes from (`RTLD_NOLOAD`).
fn libc_handle() -> *mut c_void {
    // SAFETY: dladdr fills the zeroed struct; dlopen with RTLD_NOLOAD only
    // returns an already loaded object (and takes a reference we drop in
    // `close_handle`).
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        let f = crate::real::__libc_malloc as *const () as *const c_void;
        if libc::dladdr(f, &mut info) == 0 || info.dli_fname.is_null() {
            return core::ptr::null_mut();
        }
        libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD)
    }
}

fn close_handle(h: *mut c_void) {
    if !h.is_null() {
        // SAFETY: a handle from our own dlopen.
        unsafe { libc::dlclose(h) };
    }
}

/// Whether the program's global malloc family is glibc's (so that
/// patching can work). Call with the guard held.
pub(crate) fn glibc_allocator() -> bool {
    resolve_expected().is_ok()
}

/// Patches every loaded object for a new session. Call on the watcher
/// thread (guard held) after the session is active. No-op if the library
/// interposes.
pub(crate) fn on_session_start() -> Result<(), Refusal> {
    if !needs_patching() {
        return Ok(());
    }
    let expected = resolve_expected()?;
    let mut st = PATCH.lock();
    st.expected = expected;
    st.hooks = hook_addrs();
    if expected[DLOPEN] == 0 || st.hooks[DLOPEN] == 0 {
        st.hooks[DLOPEN] = 0;
    }
    REAL_DLOPEN.store(expected[DLOPEN], Ordering::SeqCst);
    st.skip = [
        // This library, the dynamic linker, the vDSO.
        on_session_start as *const () as usize,
        global_symbol(c"__tls_get_addr"),
        // SAFETY: getauxval has no preconditions.
        unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize,
    ];
    st.slots.clear();
    st.active = true;
    ACTIVE.store(true, Ordering::SeqCst);
    pass(&mut st, Pass::Patch);
    Ok(())
}

/// Puts every patched slot back. Call on the watcher thread after the
/// session is retired.
pub(crate) fn on_session_end() {
    let mut st = PATCH.lock();
    if !st.active {
        return;
    }
    st.active = false;
    ACTIVE.store(false, Ordering::SeqCst);
    pass(&mut st, Pass::Restore);
    st.slots.clear();
    st.slots.shrink_to_fit();
}

/// Whether a patched session is running (the watcher polls for new objects).
pub(crate) fn is_active() -> bool {
    ACTIVE.load(Ordering::SeqCst)
}

/// Patches objects loaded since the last pass, if any (watcher, every
/// [`POLL_MS`]).
pub(crate) fn poll_new_objects() {
    let mut st = PATCH.lock();
    if st.active && current_adds() != st.adds {
        pass(&mut st, Pass::Patch);
    }
}

/// Set by the `dlopen` hook when glibc's `dlopen` ran unwrapped: objects
/// may have been added since the last pass.
pub(crate) static NEW_OBJECTS: AtomicBool = AtomicBool::new(false);

/// On a sampled allocation (guard held): if a bare-name `dlopen` ran since
/// the last pass and the set of objects changed, patch the new ones. One
/// relaxed load otherwise. Never waits for the patch lock.
#[inline]
pub(crate) fn catch_up() {
    if !NEW_OBJECTS.load(Ordering::Relaxed) {
        return;
    }
    catch_up_slow();
}

#[cold]
fn catch_up_slow() {
    let errno = heapprofd_client_core::errno::get();
    if let Some(mut st) = PATCH.try_lock() {
        if !st.active {
            NEW_OBJECTS.store(false, Ordering::Relaxed);
        } else if current_adds() != st.adds {
            // (Still set if the dlopen has not added its objects yet.)
            NEW_OBJECTS.store(false, Ordering::Relaxed);
            pass(&mut st, Pass::Patch);
        }
    }
    // SAFETY: restoring this thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// After a wrapped `dlopen` succeeded: patch the new objects now, unless
/// someone else is patching (the watcher's poll catches up).
pub(crate) fn after_dlopen() {
    let Some(_g) = Guard::enter() else { return };
    let errno = heapprofd_client_core::errno::get();
    if let Some(mut st) = PATCH.try_lock()
        && st.active
    {
        pass(&mut st, Pass::Patch);
    }
    // SAFETY: restoring this thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

fn current_adds() -> u64 {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        let need = core::mem::offset_of!(libc::dl_phdr_info, dlpi_subs);
        if size >= need {
            // SAFETY: glibc passes a valid info of `size` bytes and our u64.
            unsafe { *data.cast::<u64>() = (*info).dlpi_adds };
        }
        1
    }
    let mut adds = 0u64;
    // SAFETY: the callback only reads what glibc passes.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut adds as *mut u64).cast()) };
    adds
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Patch,
    Restore,
}

struct PassCtx<'a> {
    st: &'a mut PatchState,
    maps: Protections,
    kind: Pass,
    adds: u64,
}

fn pass(st: &mut PatchState, kind: Pass) {
    let maps = Protections::read();
    let mut ctx = PassCtx {
        st,
        maps,
        kind,
        adds: 0,
    };
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: glibc passes a valid info and our context; the object
        // stays mapped while the callback runs (the loader's lock is held).
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
    // SAFETY: the callback only touches the objects glibc reports.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut ctx as *mut PassCtx<'_>).cast()) };
    let adds = ctx.adds;
    st.adds = adds;
    st.slots.sort_unstable_by_key(|p| p.addr);
}

/// # Safety
/// `info` describes a loaded object that stays mapped during the call.
unsafe fn visit_object(ctx: &mut PassCtx<'_>, info: &libc::dl_phdr_info) {
    if ctx.st.skip.iter().any(|&a| a != 0 && in_object(info, a)) {
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
        let Some(k) = NAMES.iter().position(|n| *n == name) else {
            continue;
        };
        let slot = base.wrapping_add(r.offset as usize);
        // SAFETY: the slot is this object's GOT entry for `name`.
        unsafe { visit_slot(ctx, info, k, slot) };
    }
}

/// # Safety
/// `slot` is a GOT entry of the loaded object `info`.
unsafe fn visit_slot(ctx: &mut PassCtx<'_>, info: &libc::dl_phdr_info, k: usize, slot: usize) {
    let (hook, expected) = match (ctx.st.hooks.get(k), ctx.st.expected.get(k)) {
        (Some(&h), Some(&e)) if h != 0 && e != 0 => (h, e),
        _ => return,
    };
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

/// Page protections from `/proc/self/maps` (read once per pass).
struct Protections {
    /// (start, end, PROT_*) sorted by start.
    ranges: Vec<(usize, usize, c_int)>,
    page: usize,
}

impl Protections {
    fn read() -> Protections {
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
    fn store(&self, slot: usize, value: usize) -> bool {
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

    #[test]
    fn glibc_is_the_allocator_of_the_test_binary() {
        // The hooks are not exported in the test build: glibc's malloc is global.
        assert!(glibc_allocator());
        assert_eq!(resolve_expected().unwrap()[0], global_symbol(c"malloc"));
        assert_eq!(
            resolve_expected().unwrap()[0],
            crate::real::__libc_malloc as *const () as usize
        );
    }
}
