//! The plan of an injection: every address in the target the calls need,
//! resolved from the target's own files (its libc's `.dynsym`, the client's
//! `.symtab`) plus the mappings' load biases, before any thread is stopped.

use std::path::Path;

use crate::elf::{LoadedObject, Symbols, canonical_plt_entry, read_program_headers};
use crate::error::{InjectError, Result};
use crate::probe::{Target, auxv_value};
use crate::sigframe::STUB;
use crate::{ATTACH_ENTRY, DETACH_ENTRY};

const RTLD_NOW: u64 = 2;
const RTLD_NODELETE: u64 = 0x1000;
/// glibc's private flag for `__libc_dlopen_mode` (glibc < 2.34 without libdl).
const RTLD_DLOPEN_PRIVATE: u64 = 0x8000_0000;

/// Addresses in the target, all resolved before any thread is stopped.
pub(crate) struct Plan {
    pub(crate) errno_location: u64,
    pub(crate) dlsym: Option<u64>,
    /// `dlopen` (or `__libc_dlopen_mode`) and its mode; `None` when the
    /// client is already loaded.
    pub(crate) dlopen: Option<(u64, u64)>,
    pub(crate) dlerror: Option<u64>,
    /// glibc's `malloc` in the target.
    pub(crate) libc_malloc: u64,
    /// The program's canonical PLT entry for `malloc` (non-PIE programs
    /// that take its address), which is glibc's malloc too.
    pub(crate) canonical_malloc: Option<u64>,
    /// The client's attach entry: its svma, and the bias when already loaded.
    pub(crate) entry_svma: u64,
    /// The client's detach entry (svma).
    pub(crate) detach_svma: u64,
    /// This run ends a synchronous session instead of starting one.
    pub(crate) detach: bool,
    pub(crate) client_bias: Option<u64>,
    /// The client file's segments (its bias once loaded).
    pub(crate) client_segments: Vec<heapprofd_unwinder::LoadSegment>,
    pub(crate) lib: Vec<u8>,
    /// Where the return stub goes: the program's entry point (`AT_ENTRY`).
    pub(crate) entry: u64,
    /// The bytes the stub replaces, from the program's file (`None`: not
    /// readable; the bytes in memory are kept then).
    pub(crate) entry_bytes: Option<[u8; STUB.len()]>,
}

fn refused(what: String) -> InjectError {
    InjectError::Refused(what)
}

/// Resolves every address the calls need, before any thread is stopped.
pub(crate) fn make_plan(
    target: &Target,
    libc_syms: &Symbols,
    lib: &Path,
    detach: bool,
) -> Result<Plan> {
    let pid = target.pid;
    let at = |s: &Symbols, o: &LoadedObject, name: &str| s.address_of(name).map(|a| o.bias + a);
    let errno_location = at(libc_syms, &target.libc, "__errno_location").ok_or_else(|| {
        refused(format!(
            "no __errno_location in {}: not glibc?",
            target.libc.path
        ))
    })?;
    let libc_malloc = at(libc_syms, &target.libc, "malloc")
        .ok_or_else(|| refused(format!("no malloc in {}: not glibc?", target.libc.path)))?;
    // glibc >= 2.34 has dlopen in libc; older ones in libdl (if the program
    // links it), else the private __libc_dlopen_mode.
    let libdl = LoadedObject::find(pid, &target.maps, |p| {
        p.rsplit('/')
            .next()
            .is_some_and(|f| f.starts_with("libdl.so"))
    })?;
    let libdl_syms = libdl.as_ref().map(LoadedObject::symbols).transpose()?;
    let in_libdl = |name: &str| {
        libdl
            .as_ref()
            .zip(libdl_syms.as_ref())
            .and_then(|(o, s)| at(s, o, name))
    };
    let dlsym = at(libc_syms, &target.libc, "dlsym").or_else(|| in_libdl("dlsym"));
    let dlerror = at(libc_syms, &target.libc, "dlerror").or_else(|| in_libdl("dlerror"));
    let (client_path, client_bias) = match &target.client {
        Some(c) => (c.read_from.clone(), Some(c.bias)),
        None if detach => {
            return Err(refused(format!(
                "the profiler is not loaded in process {pid}"
            )));
        }
        None => (lib.to_path_buf(), None),
    };
    let dlopen = if client_bias.is_some() {
        None
    } else {
        let mode = RTLD_NOW | RTLD_NODELETE;
        Some(
            at(libc_syms, &target.libc, "dlopen")
                .map(|a| (a, mode))
                .or_else(|| in_libdl("dlopen").map(|a| (a, mode)))
                .or_else(|| {
                    at(libc_syms, &target.libc, "__libc_dlopen_mode")
                        .map(|a| (a, mode | RTLD_DLOPEN_PRIVATE))
                })
                .ok_or_else(|| {
                    refused(format!(
                        "found no dlopen in the target's {} (nor libdl): cannot load the \
                         profiler into it",
                        target.libc.path
                    ))
                })?,
        )
    };
    let client_syms = Symbols::read(&client_path)?;
    let entry_svma = client_syms.unique_containing(ATTACH_ENTRY).ok_or_else(|| {
        refused(format!(
            "{} has no symbol {ATTACH_ENTRY} in its symbol table (stripped, or another \
             version of heapprofd-rs?): rebuild it with `cargo build --release`",
            client_path.display()
        ))
    })?;
    let detach_svma = client_syms.unique_containing(DETACH_ENTRY).ok_or_else(|| {
        refused(format!(
            "{} has no symbol {DETACH_ENTRY}",
            client_path.display()
        ))
    })?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let exe_path = exe.to_string_lossy().into_owned();
    // Only a non-PIE program (ET_EXEC) can have one.
    let canonical_malloc = match LoadedObject::find(pid, &target.maps, |p| p == exe_path)? {
        Some(o) if read_program_headers(&o.read_from).is_ok_and(|(_, t)| t == 2) => {
            canonical_plt_entry(&o.read_from, "malloc").map(|a| o.bias + a)
        }
        _ => None,
    };
    let (entry, entry_bytes) = entry_point(target)?;
    let mut lib_bytes = lib.as_os_str().as_encoded_bytes().to_vec();
    lib_bytes.push(0);
    if lib_bytes.len() > 4096 {
        return Err(refused("the client library path is too long".into()));
    }
    Ok(Plan {
        errno_location,
        dlsym,
        dlopen,
        dlerror,
        libc_malloc,
        canonical_malloc,
        entry_svma,
        detach_svma,
        detach,
        client_bias,
        client_segments: client_syms.segments.clone(),
        lib: lib_bytes,
        entry,
        entry_bytes,
    })
}

/// The program's entry point, which must be in an executable file
/// mapping (the return stub is written there), and the bytes of its file
/// there.
fn entry_point(target: &Target) -> Result<(u64, Option<[u8; STUB.len()]>)> {
    let pid = target.pid;
    let entry = auxv_value(pid, libc::AT_ENTRY).ok_or_else(|| {
        refused(format!(
            "process {pid} has no entry point in its auxiliary vector"
        ))
    })?;
    let end = entry + STUB.len() as u64;
    let Some(m) = target
        .maps
        .iter()
        .find(|m| m.contains(entry) && end <= m.end && m.exec && m.is_file())
    else {
        return Err(refused(format!(
            "the entry point {entry:#x} of process {pid} ({}) is not in an executable file \
             mapping (a packed or self-modifying program?): there is nowhere to return to \
             safely from the calls",
            target.comm
        )));
    };
    let offset = entry - m.start + m.offset;
    let from = |path: &str| -> Option<[u8; STUB.len()]> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(path).ok()?;
        let mut b = [0u8; STUB.len()];
        f.read_exact_at(&mut b, offset).ok()?;
        Some(b)
    };
    let bytes =
        from(&format!("/proc/{pid}/map_files/{}", m.map_files_name())).or_else(|| from(&m.path));
    Ok((entry, bytes))
}
