//! Keeping the profiler in the programs a profiled process starts.
//!
//! `record -- CMD` profiles CMD "and the programs it starts": every exec'd
//! image must load the client again (`LD_PRELOAD`) and find the daemon
//! (`HEAPPROFD_SOCKET`, `HEAPPROFD_BLOCKING_INIT`). A program that replaces
//! `LD_PRELOAD` (`env LD_PRELOAD=libjemalloc.so.2 ./prog`) or clears the
//! environment (`env -i`) would lose it. So when the process was started
//! with `HEAPPROFD_SOCKET` set, the constructor [`capture`]s the library's
//! path and every `HEAPPROFD_*` variable, and the exec hooks (`exechooks`)
//! pass the new image an environment that has them: the client first in
//! `LD_PRELOAD` (unless some copy of the client is already listed; the
//! program's own entries follow, so a preloaded allocator comes after the
//! client) and each captured variable the environment lacks (one it sets
//! itself is left alone: a nested `record` wins).
//!
//! Nothing here allocates through the hooks, and the exec hooks may run in
//! a `vfork` child that shares the parent's memory: the repaired array is
//! built on the stack ([`Scratch`], up to 256 entries and 4 KiB of text;
//! larger ones are `mmap`ed, a mapping the parent keeps if that child's
//! exec succeeds). The captured strings live in static buffers: the
//! program may rewrite its initial environment block (`setproctitle`).
//!
//! A new image that cannot load the client whatever its environment says
//! is `unprofilable`'s business.

use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, Ordering};

use heapprofd_client_core::env;
use heapprofd_client_core::socket_path::{SOCKET_ENV, SocketPath};

unsafe extern "C" {
    /// The process's environment (glibc's `environ`).
    static mut environ: *const *const c_char;
}

/// Whether exec'd images must keep the client ([`capture`] ran).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Bytes of the captured strings: the library's path, then the
/// `HEAPPROFD_*` entries, each NUL-terminated.
const TEXT: usize = 4096;
/// Most `HEAPPROFD_*` variables kept.
const MAX_VARS: usize = 16;

/// What [`capture`] saved. Written once by the constructor, before any
/// thread of the program can exec; read-only afterwards.
struct Captured {
    text: [u8; TEXT],
    /// Length of the library's path in `text` (0 = none).
    path_len: usize,
    /// Offsets in `text` of the `NAME=value` entries.
    vars: [usize; MAX_VARS],
    nvars: usize,
}

static mut CAPTURED: Captured = Captured {
    text: [0; TEXT],
    path_len: 0,
    vars: [0; MAX_VARS],
    nvars: 0,
};

fn captured() -> &'static Captured {
    // SAFETY: written only by `capture` (in the constructor, before
    // `ACTIVE` is set), read-only once `ACTIVE` is seen.
    unsafe { &*core::ptr::addr_of!(CAPTURED) }
}

/// Whether exec'd images get the repaired environment.
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Saves the library's path and the `HEAPPROFD_*` variables if the process
/// was started to be profiled with its children (`HEAPPROFD_SOCKET` set).
/// Called once by the constructor.
pub(crate) fn capture() {
    if !addressed_to_us() {
        return;
    }
    // SAFETY: the constructor runs before the program's threads; nothing
    // reads CAPTURED until ACTIVE is set below.
    let c = unsafe { &mut *core::ptr::addr_of_mut!(CAPTURED) };
    let Some(path) = own_path() else { return };
    let path = path.to_bytes_with_nul();
    let Some(dst) = c.text.get_mut(..path.len()) else {
        return;
    };
    dst.copy_from_slice(path);
    c.path_len = path.len() - 1;
    let mut at = path.len();
    // SAFETY: environ is a NULL-terminated array of C strings.
    unsafe {
        let mut e = environ;
        while !e.is_null() && !(*e).is_null() && c.nvars < MAX_VARS {
            let s = CStr::from_ptr(*e).to_bytes_with_nul();
            if s.starts_with(b"HEAPPROFD_")
                && let Some(dst) = c.text.get_mut(at..at + s.len())
            {
                dst.copy_from_slice(s);
                c.vars[c.nvars] = at;
                c.nvars += 1;
                at += s.len();
            }
            e = e.add(1);
        }
    }
    ACTIVE.store(true, Ordering::Release);
}

/// Whether the process was started with `HEAPPROFD_SOCKET` for this
/// library: set, and this library was `dlopen`ed (the program loads it to
/// be profiled) or `LD_PRELOAD` names this library's own path (`record
/// --client-lib` takes a file of any name) or a copy of the client by its
/// file name (`record` preloads one; the exec hooks keep it there). A copy that only
/// `/etc/ld.so.preload` loaded, in a process `record --client-lib` started
/// with another library first (the emulated bionic libc, whose front-end
/// the socket is for), leaves the variables to that library: it neither
/// connects nor puts itself into the `LD_PRELOAD` of the programs the
/// process starts.
pub(crate) fn addressed_to_us() -> bool {
    if env::get(SOCKET_ENV).is_none() {
        return false;
    }
    if !crate::originals::preloaded() {
        return true;
    }
    let name = heapprofd_proto::attach::CLIENT_FILE_NAME.as_bytes();
    let own = own_path().map_or(&[][..], CStr::to_bytes);
    env::get(c"LD_PRELOAD").is_some_and(|v| {
        v.split(|&b| b == b':' || b == b' ')
            .any(|e| (!e.is_empty() && e == own) || e.rsplit(|&b| b == b'/').next() == Some(name))
    })
}

/// The path this library was loaded from (as `LD_PRELOAD` named it).
fn own_path() -> Option<&'static CStr> {
    struct Q {
        ours: usize,
        name: *const c_char,
    }
    unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: glibc passes a valid info and our query.
        unsafe {
            let q = &mut *data.cast::<Q>();
            if crate::elfdyn::in_object(&*info, q.ours) {
                q.name = (*info).dlpi_name;
                return 1;
            }
        }
        0
    }
    let mut q = Q {
        ours: own_path as *const () as usize,
        name: core::ptr::null(),
    };
    // SAFETY: the callback only reads what glibc passes.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut q as *mut Q).cast()) };
    // SAFETY: the loader keeps an object's name for as long as it is
    // loaded, and this library is never unloaded.
    let name = unsafe { q.name.as_ref().map(|p| CStr::from_ptr(p)) }?;
    (!name.is_empty()).then_some(name)
}

/// The daemon's socket, as the process was started with it (captured).
pub(crate) fn socket_path() -> Option<SocketPath> {
    vars().find_map(|v| {
        let b = v.to_bytes().strip_prefix(b"HEAPPROFD_SOCKET=")?;
        SocketPath::from_bytes(b)
    })
}

/// The captured path of the library.
fn path() -> &'static [u8] {
    let c = captured();
    &c.text[..c.path_len]
}

/// The captured `NAME=value` entries.
fn vars() -> impl Iterator<Item = &'static CStr> {
    let c = captured();
    c.vars[..c.nvars]
        .iter()
        .filter_map(|&at| CStr::from_bytes_until_nul(c.text.get(at..)?).ok())
}

/// The value of `LD_PRELOAD` in `s` if it is that entry.
fn preload_value(s: &[u8]) -> Option<&[u8]> {
    s.strip_prefix(b"LD_PRELOAD=")
}

/// Whether an `LD_PRELOAD` value names a copy of this library (same file
/// name, any directory).
fn lists_client(value: &[u8]) -> bool {
    let own = path();
    let own_name = own.rsplit(|&b| b == b'/').next().unwrap_or(own);
    value
        .split(|&b| b == b':' || b == b' ')
        .any(|e| e == own || e.rsplit(|&b| b == b'/').next() == Some(own_name))
}

/// Whether `entry` (`NAME=value`) sets the variable of `var` (`NAME=...`).
fn same_name(entry: &[u8], var: &[u8]) -> bool {
    let n = var
        .iter()
        .position(|&b| b == b'=')
        .map_or(var.len(), |i| i + 1);
    entry.len() >= n && entry[..n] == var[..n]
}

/// Iterates a NULL-terminated `envp` (null = empty).
///
/// # Safety
/// `envp` is null or a NULL-terminated array of C strings.
unsafe fn entries(envp: *const *const c_char) -> impl Iterator<Item = &'static [u8]> {
    let mut e = envp;
    core::iter::from_fn(move || {
        // SAFETY: the caller's contract.
        unsafe {
            if e.is_null() || (*e).is_null() {
                return None;
            }
            let s = CStr::from_ptr(*e).to_bytes();
            e = e.add(1);
            Some(s)
        }
    })
}

/// What `envp` lacks: the client in `LD_PRELOAD`, and how many captured
/// variables. `None` if nothing.
///
/// # Safety
/// As [`entries`].
unsafe fn missing(envp: *const *const c_char) -> Option<(bool, usize)> {
    let mut preload_ok = false;
    // SAFETY: the caller's contract.
    for s in unsafe { entries(envp) } {
        if let Some(v) = preload_value(s) {
            preload_ok |= lists_client(v);
        }
    }
    let vars_missing = vars()
        // SAFETY: the caller's contract.
        .filter(|v| !unsafe { entries(envp) }.any(|s| same_name(s, v.to_bytes())))
        .count();
    (!preload_ok || vars_missing > 0).then_some((!preload_ok, vars_missing))
}

/// Room for a repaired environment: on the stack when it fits.
pub(crate) struct Scratch {
    ptrs: [*const c_char; 256],
    text: [u8; TEXT],
    /// A larger block from `mmap` (null = none) and its length.
    map: *mut c_void,
    map_len: usize,
}

impl Scratch {
    pub(crate) fn new() -> Scratch {
        Scratch {
            ptrs: [core::ptr::null(); 256],
            text: [0; TEXT],
            map: core::ptr::null_mut(),
            map_len: 0,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.map.is_null() {
            // SAFETY: our own mapping, no longer referenced (the exec that
            // used it failed and returned).
            unsafe { libc::munmap(self.map, self.map_len) };
        }
    }
}

/// The environment to pass to an exec'd image: `envp` itself when nothing
/// is missing (or inheritance is off), else a repaired copy in `s` (see
/// the module docs). `envp` may be null (an empty environment). Never
/// allocates through the hooks.
///
/// # Safety
/// `envp` is null or a NULL-terminated array of C strings that outlives
/// the returned array's use.
pub(crate) unsafe fn repaired(envp: *const *const c_char, s: &mut Scratch) -> *const *const c_char {
    if !active() {
        return envp;
    }
    // SAFETY: the caller's contract.
    let Some((add_preload, _)) = (unsafe { missing(envp) }) else {
        return envp;
    };
    // SAFETY: the caller's contract.
    let n = unsafe { entries(envp) }.count();
    let old_preload = if add_preload {
        // SAFETY: the caller's contract.
        unsafe { entries(envp) }.find_map(preload_value)
    } else {
        None
    };
    let ptr_slots = n + MAX_VARS + 2;
    let text_len = b"LD_PRELOAD=".len() + path().len() + 2 + old_preload.map_or(0, <[u8]>::len);
    let (ptrs, text): (&mut [*const c_char], &mut [u8]) =
        if ptr_slots <= s.ptrs.len() && text_len <= s.text.len() {
            (&mut s.ptrs[..], &mut s.text[..])
        } else {
            let ptr_bytes = ptr_slots * core::mem::size_of::<*const c_char>();
            let len = ptr_bytes + text_len;
            // SAFETY: an anonymous private mapping.
            let m = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if m == libc::MAP_FAILED {
                heapprofd_client_core::log::log(
                    b"heapprofd-rs: no memory to repair the environment of an exec'd program; ",
                    b"it runs unprofiled",
                );
                return envp;
            }
            s.map = m;
            s.map_len = len;
            // SAFETY: the fresh mapping holds `ptr_slots` pointers, then
            // `text_len` bytes.
            unsafe {
                (
                    core::slice::from_raw_parts_mut(m.cast(), ptr_slots),
                    core::slice::from_raw_parts_mut(m.cast::<u8>().add(ptr_bytes), text_len),
                )
            }
        };
    let mut k = 0;
    if add_preload {
        let mut w = Writer { buf: text, at: 0 };
        w.put(b"LD_PRELOAD=");
        w.put(path());
        if let Some(v) = old_preload.filter(|v| !v.is_empty()) {
            w.put(b":");
            w.put(v);
        }
        w.put(b"\0");
        ptrs[k] = text.as_ptr().cast();
        k += 1;
    }
    for v in vars() {
        // SAFETY: the caller's contract.
        if !unsafe { entries(envp) }.any(|e| same_name(e, v.to_bytes())) {
            ptrs[k] = v.as_ptr();
            k += 1;
        }
    }
    let mut e = envp;
    // SAFETY: the caller's contract; `k` stays below `ptr_slots - 1`.
    unsafe {
        while !e.is_null() && !(*e).is_null() {
            let skip = add_preload && preload_value(CStr::from_ptr(*e).to_bytes()).is_some();
            if !skip {
                ptrs[k] = *e;
                k += 1;
            }
            e = e.add(1);
        }
    }
    ptrs[k] = core::ptr::null();
    ptrs.as_ptr()
}

/// Appends to a byte buffer sized by the caller (bytes beyond it are
/// dropped).
pub(crate) struct Writer<'a> {
    pub(crate) buf: &'a mut [u8],
    pub(crate) at: usize,
}

impl Writer<'_> {
    pub(crate) fn put(&mut self, b: &[u8]) {
        if let Some(dst) = self.buf.get_mut(self.at..self.at + b.len()) {
            dst.copy_from_slice(b);
            self.at += b.len();
        }
    }
}

/// Before `system`/`popen` (which pass the process's own environment and
/// take no other): if `environ` lacks what the child needs, replace it
/// with a repaired copy, for good (the program then sees the client back
/// in its `LD_PRELOAD`). The copy is allocated from glibc's heap through
/// the library's own allocator and never freed (the old array may still be
/// referenced). Like any assignment to `environ`, this races with a
/// `setenv` on another thread.
pub(crate) fn repair_environ() {
    if !active() {
        return;
    }
    // SAFETY: environ is the process's NULL-terminated environment.
    let envp = unsafe { environ };
    // SAFETY: as above.
    if unsafe { missing(envp) }.is_none() {
        return;
    }
    let mut s = Scratch::new();
    // SAFETY: as above.
    let fixed = unsafe { repaired(envp, &mut s) };
    if fixed == envp {
        return;
    }
    // Copy the array (and the new LD_PRELOAD entry) out of the scratch.
    // SAFETY: `fixed` is a NULL-terminated array of C strings.
    let n = unsafe { entries(fixed) }.count();
    let mut arr: Vec<*const c_char> = Vec::with_capacity(n + 1);
    // SAFETY: as above.
    for s in unsafe { entries(fixed) } {
        if s.starts_with(b"LD_PRELOAD=") {
            let mut owned = Vec::with_capacity(s.len() + 1);
            owned.extend_from_slice(s);
            owned.push(0);
            arr.push(owned.leak().as_ptr().cast());
        } else {
            arr.push(s.as_ptr().cast());
        }
    }
    arr.push(core::ptr::null());
    // SAFETY: assigning the process's environment, as setenv does.
    unsafe { environ = arr.leak().as_ptr() };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_lists() {
        assert!(same_name(b"HEAPPROFD_SOCKET=/a", b"HEAPPROFD_SOCKET=/b"));
        assert!(!same_name(b"HEAPPROFD_SOCKETX=/a", b"HEAPPROFD_SOCKET=/b"));
        assert!(!same_name(b"HEAPPROFD_SOCK", b"HEAPPROFD_SOCKET=/b"));
        assert_eq!(preload_value(b"LD_PRELOAD=a:b"), Some(&b"a:b"[..]));
    }
}
