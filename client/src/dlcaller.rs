//! Whether a `dlopen` call loads the same object when the client makes it
//! as when its caller does: only then may the `dlopen` hook (`dlhook`)
//! call glibc's `dlopen` itself and act once it returns.
//!
//! glibc's `dlopen` finds the object its return address is in, the caller
//! (`dl-open.c`; the main program when none), and uses it for three things:
//! the namespace the new object goes to (the caller's), `$ORIGIN` in the
//! name, and, for a name without `/`, the search (`dl-load.c`): unless the
//! caller has `DT_RUNPATH`, the `DT_RPATH` of the caller and of the
//! objects that loaded it, then the main program's `DT_RPATH`; then
//! `LD_LIBRARY_PATH`, the caller's `DT_RUNPATH`, the cache and the default
//! directories. The client has neither tag, so from the client the search
//! is the main program's `DT_RPATH`, `LD_LIBRARY_PATH`, the cache and the
//! defaults. The two agree when the caller is in the base namespace (the
//! client's), the name has no `$`, and either it has a `/` (no search) or
//! the caller has no `DT_RUNPATH` and no object but the main program has a
//! `DT_RPATH` (the chain of objects that loaded the caller is not in the
//! public `link_map`, so every loaded object is checked).

use core::ffi::{c_int, c_void};

use crate::elfdyn;

/// `RTLD_DL_LINKMAP` (`<dlfcn.h>`): `dladdr1` returns the `link_map`.
#[cfg(target_env = "gnu")]
const RTLD_DL_LINKMAP: c_int = 2;

/// Whether glibc's `dlopen(name)` called from the client loads what it
/// loads when called from the code at `caller` (its return address).
pub(crate) fn caller_independent(name: &[u8], caller: usize) -> bool {
    if name.contains(&b'$') || !in_base_namespace(caller) {
        return false;
    }
    if name.contains(&b'/') {
        return true;
    }
    let s = search_paths(caller);
    !s.caller_runpath && !s.rpath_besides_main
}

/// Whether the object holding `caller` (the main program if none does) is
/// in the base namespace.
#[cfg(target_env = "gnu")]
fn in_base_namespace(caller: usize) -> bool {
    // SAFETY: zeroed Dl_info is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let mut map: *mut c_void = core::ptr::null_mut();
    // SAFETY: dladdr1 reads the loader's tables and writes our two
    // out-parameters.
    let found = unsafe {
        libc::dladdr1(
            caller as *const c_void,
            &mut info,
            (&mut map as *mut *mut c_void).cast(),
            RTLD_DL_LINKMAP,
        )
    };
    if found == 0 || map.is_null() {
        return true; // glibc then takes the main program's map
    }
    let mut lmid: libc::Lmid_t = -1;
    // SAFETY: glibc's link map is a valid handle for dlinfo.
    let rc = unsafe {
        libc::dlinfo(
            map,
            libc::RTLD_DI_LMID,
            (&mut lmid as *mut libc::Lmid_t).cast(),
        )
    };
    rc == 0 && lmid == libc::LM_ID_BASE
}

/// Other libcs (bionic: this front-end is only type-checked there) have
/// other rules: never call `dlopen` for the caller.
#[cfg(not(target_env = "gnu"))]
fn in_base_namespace(_caller: usize) -> bool {
    false
}

/// What the search of a name from `caller` depends on.
#[derive(Default)]
struct Search {
    caller: usize,
    /// Objects seen (the first is the main program).
    index: usize,
    caller_found: bool,
    caller_runpath: bool,
    main_runpath: bool,
    rpath_besides_main: bool,
}

fn search_paths(caller: usize) -> Search {
    let mut s = Search {
        caller,
        ..Search::default()
    };
    // SAFETY: the callback only reads the objects glibc reports.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut s as *mut Search).cast()) };
    if !s.caller_found {
        s.caller_runpath = s.main_runpath;
    }
    s
}

unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
    // SAFETY: glibc's info for one object, mapped during the call; our Search.
    let (info, s) = unsafe { (&*info, &mut *data.cast::<Search>()) };
    let main = s.index == 0;
    s.index += 1;
    // SAFETY: as above.
    let Some(d) = (unsafe { elfdyn::read_dynamic(info) }) else {
        return 0;
    };
    if main {
        s.main_runpath = d.runpath;
    } else if d.rpath {
        s.rpath_besides_main = true;
    }
    if !s.caller_found && elfdyn::in_object(info, s.caller) {
        s.caller_found = true;
        s.caller_runpath = d.runpath;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_a_dollar_never_and_paths_from_here_always() {
        let here = caller_independent as *const () as usize;
        assert!(!caller_independent(b"$ORIGIN/libx.so", here));
        assert!(caller_independent(b"/usr/lib/libx.so", here));
        assert!(caller_independent(b"./libx.so", here));
    }

    #[test]
    fn a_bare_name_depends_on_the_search_paths() {
        // The unit-test binary and its libraries: no DT_RUNPATH or
        // DT_RPATH unless the build adds one; the answer follows them.
        let here = caller_independent as *const () as usize;
        let s = search_paths(here);
        assert!(s.caller_found);
        assert_eq!(
            caller_independent(b"libm.so.6", here),
            !s.caller_runpath && !s.rpath_besides_main
        );
        assert!(in_base_namespace(here));
    }
}
