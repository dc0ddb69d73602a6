//! Loading the client library into a running process and starting a
//! session in it (`record --pid`), without a debugger.
//!
//! [`probe`] reads what `/proc` says about the target and refuses, with a
//! hint and before touching anything, what cannot work: no such process, a
//! zombie or stopped process, another tracer, another architecture, a
//! statically linked program (no `libc.so`, so no `dlopen`), a target
//! already being profiled. It also tells whether the client is already
//! loaded and interposing (preloaded), in which case the activation signal
//! is enough ([`signal_activate`]).
//!
//! Otherwise [`inject`] does, on one thread of the target at a time:
//!
//! 1. before stopping anything: find `dlopen`, `dlsym`, `__errno_location`
//!    in the target's own libc (its `.dynsym` + the mapping's load bias),
//!    the client's attach entry in the client's `.symtab`, and build the
//!    [`safety`] model (unwind tables, deny ranges);
//! 2. `PTRACE_SEIZE` + `PTRACE_INTERRUPT` one thread (the others keep
//!    running), copy its stack and unwind it; if it is not at a safe point,
//!    detach at once and try the next thread, round after round, until the
//!    timeout;
//! 3. save its general registers and its XSAVE area; write the library path
//!    and a zero return address below the red zone; call, each returning to
//!    address 0: `__errno_location()` (the thread's errno is saved and
//!    written back at the end: the thread may have been stopped between a
//!    failing call and its read of errno), `dlsym(RTLD_DEFAULT, "malloc")`
//!    (must be glibc's or the client's: another allocator is refused before
//!    anything is loaded), `dlopen(path, RTLD_NOW | RTLD_NODELETE)` (not
//!    `RTLD_GLOBAL`: the library must not interpose later lookups; skipped
//!    when already loaded), `dlerror()` if that failed, and the client's
//!    attach entry with our socket id, which starts the client's connecting
//!    thread, or, in a single-threaded process, connects right there
//!    (glibc would treat the process as multi-threaded for good after a
//!    `pthread_create`, with slower malloc); such a synchronous session is
//!    ended by [`detach`], the same hijack calling the client's detach
//!    entry;
//! 4. restore every register (including `orig_rax`: a thread stopped inside
//!    a blocking system call resumes it, the kernel restarts it as after any
//!    signal) and the vector state, and detach, delivering any signal that
//!    was pending at the stop.
//!
//! Every failure after the stop restores the registers before detaching.

pub(crate) mod elf;
mod ptrace;
pub(crate) mod safety;

use anyhow::{Context, Result, bail};
use heapprofd_unwinder::MapEntry;

use self::elf::LoadedObject;

/// File name of the client library.
pub const CLIENT_FILE_NAME: &str = "libheapprofd_client.so";
// The attach ABI (entry names, the activation signal, the client's thread name).
pub use heapprofd_proto::attach::{ACTIVATION_SIGNAL, CLIENT_THREAD_NAME};
use heapprofd_proto::attach::{ATTACH_ENTRY, DETACH_ENTRY};

const RTLD_NOW: u64 = 2;
const RTLD_NODELETE: u64 = 0x1000;
/// glibc's private flag for `__libc_dlopen_mode` (glibc < 2.34 without libdl).
const RTLD_DLOPEN_PRIVATE: u64 = 0x8000_0000;
/// Bytes below the stack pointer a leaf function may use (System V).
const RED_ZONE: u64 = 128;

/// What `/proc` says about the target.
#[derive(Debug, Clone)]
pub struct Target {
    /// Process id.
    pub pid: u32,
    /// `comm` (program name).
    pub comm: String,
    /// Real user id.
    pub uid: u32,
    /// Real group id.
    pub gid: u32,
    /// Its mappings.
    pub maps: Vec<MapEntry>,
    pub(crate) libc: LoadedObject,
    pub(crate) loader: Option<LoadedObject>,
    pub(crate) client: Option<LoadedObject>,
    /// The client is preloaded (`LD_PRELOAD` or `/etc/ld.so.preload`).
    pub preloaded: bool,
    /// The process catches the activation signal (`SigCgt`).
    pub catches_signal: bool,
}

impl Target {
    /// Whether the client library is mapped.
    pub fn client_loaded(&self) -> bool {
        self.client.is_some()
    }
}

/// `Key:\tvalue` fields of `/proc/PID/status`.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

fn first_number(s: Option<&str>) -> Option<u32> {
    s?.split_whitespace().next()?.parse().ok()
}

/// Whether we have `CAP_SYS_PTRACE` (bit 19 of `CapEff`).
fn have_cap_sys_ptrace() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| status_field(&s, "CapEff").and_then(|v| u64::from_str_radix(v, 16).ok()))
        .is_some_and(|caps| caps & (1 << 19) != 0)
}

fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What is needed to ptrace `pid`, for error messages.
pub(crate) fn permission_hint(pid: u32, target_uid: Option<u32>) -> String {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut hint = String::from(
        "attaching needs ptrace permission: the same user as the target \
         (and a target that is not setuid/non-dumpable), with ptrace allowed \
         by Yama, or CAP_SYS_PTRACE (e.g. run with sudo)",
    );
    if let Some(u) = target_uid
        && u != me
        && me != 0
    {
        hint.push_str(&format!(
            "; process {pid} belongs to uid {u}, you are uid {me}"
        ));
    }
    if have_cap_sys_ptrace() {
        hint.push_str(
            "; heapprofd-rs has CAP_SYS_PTRACE, so the target is protected some other way \
             (non-dumpable, a security module, or it is traced already)",
        );
        return hint;
    }
    match ptrace_scope() {
        Some(1) => hint.push_str(
            "; /proc/sys/kernel/yama/ptrace_scope is 1 (only descendants may be traced): \
             use sudo, or `echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope`",
        ),
        Some(2) => hint.push_str(
            "; /proc/sys/kernel/yama/ptrace_scope is 2 (only CAP_SYS_PTRACE may trace): use sudo",
        ),
        Some(3) => hint.push_str(
            "; /proc/sys/kernel/yama/ptrace_scope is 3: ptrace is disabled on this system \
             until reboot",
        ),
        _ => {}
    }
    hint
}

/// Reads `/proc/PID/…` and checks that attaching can work (see the module
/// docs). Touches nothing.
pub fn probe(pid: u32) -> Result<Target> {
    probe_with(pid, false)
}

fn probe_with(pid: u32, ending: bool) -> Result<Target> {
    if pid == 0 || pid > i32::MAX as u32 {
        bail!("{pid} is not a process id");
    }
    if pid == std::process::id() {
        bail!("cannot attach to heapprofd-rs itself");
    }
    let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no process with pid {pid} (check the number with `ps` or `pgrep`)")
        }
        Err(e) => return Err(e).with_context(|| format!("reading /proc/{pid}/status")),
    };
    let comm = status_field(&status, "Name").unwrap_or("?").to_string();
    let tgid = first_number(status_field(&status, "Tgid")).unwrap_or(pid);
    if tgid != pid {
        bail!("{pid} is a thread of process {tgid} ({comm}): use --pid {tgid}");
    }
    let state = status_field(&status, "State").unwrap_or("");
    if state.starts_with('Z') || state.starts_with('X') {
        bail!("process {pid} ({comm}) has exited (it is a zombie waiting for its parent)");
    }
    if state.starts_with('T') {
        bail!(
            "process {pid} ({comm}) is stopped (state {state}); resume it with \
             `kill -CONT {pid}` and try again"
        );
    }
    let tracer = first_number(status_field(&status, "TracerPid")).unwrap_or(0);
    if tracer != 0 {
        let tcomm = std::fs::read_to_string(format!("/proc/{tracer}/comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        bail!(
            "process {pid} ({comm}) is already being traced by pid {tracer} ({tcomm}), \
             a debugger or another tracer; detach it first (only one tracer at a time)"
        );
    }
    let uid = first_number(status_field(&status, "Uid")).unwrap_or(0);
    let gid = first_number(status_field(&status, "Gid")).unwrap_or(0);
    let catches_signal = status_field(&status, "SigCgt")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .is_some_and(|m| m & (1 << (ACTIVATION_SIGNAL - 1)) != 0);

    check_architecture(pid, &comm, uid)?;
    let maps_text = match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            bail!(
                "no permission to read the memory map of process {pid} ({comm}): {}",
                permission_hint(pid, Some(uid))
            )
        }
        Err(e) => return Err(e).with_context(|| format!("reading /proc/{pid}/maps")),
    };
    let maps = heapprofd_unwinder::parse_maps(&maps_text).entries;
    if maps.is_empty() {
        bail!("process {pid} ({comm}) has no memory map (a kernel thread, or it is exiting)");
    }
    let file_name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let libc = LoadedObject::find(pid, &maps, |p| {
        let f = file_name(p);
        f.starts_with("libc.so") || (f.starts_with("libc-2.") && f.ends_with(".so"))
    })?;
    let Some(libc) = libc else {
        let musl = maps
            .iter()
            .any(|m| file_name(&m.path).starts_with("ld-musl"));
        if musl {
            bail!(
                "process {pid} ({comm}) uses musl libc: attaching needs glibc (its dlopen \
                 and malloc); start the program under `heapprofd-rs record -- CMD` instead"
            );
        }
        bail!(
            "process {pid} ({comm}) is statically linked (there is no libc.so in its memory \
             map, so there is no dlopen to load the profiler with and no malloc to \
             intercept); attaching needs a dynamically linked glibc program"
        );
    };
    let loader = match interpreter_base(pid) {
        Some(base) => {
            let path = maps
                .iter()
                .find(|m| m.start == base)
                .map(|m| m.path.clone())
                .unwrap_or_default();
            LoadedObject::find(pid, &maps, |p| p == path)?
        }
        None => LoadedObject::find(pid, &maps, |p| file_name(p).starts_with("ld-linux"))?,
    };
    let client = LoadedObject::find(pid, &maps, |p| file_name(p) == CLIENT_FILE_NAME)?;
    let preloaded = client.is_some() && is_preloaded(pid);
    if let Some(tid) = client_thread(pid).filter(|_| !ending) {
        bail!(
            "process {pid} ({comm}) is already being profiled by heapprofd-rs (its thread \
             {tid} is named {CLIENT_THREAD_NAME}); stop that session first"
        );
    }
    Ok(Target {
        pid,
        comm,
        uid,
        gid,
        maps,
        libc,
        loader,
        client,
        preloaded,
        catches_signal,
    })
}

/// Refuses a target built for another architecture than this daemon.
fn check_architecture(pid: u32, comm: &str, uid: u32) -> Result<()> {
    let mut header = [0u8; 64];
    let read = std::fs::File::open(format!("/proc/{pid}/exe")).and_then(|f| {
        use std::os::unix::fs::FileExt;
        f.read_at(&mut header, 0)
    });
    match read {
        Ok(n) if n >= 20 => {}
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            bail!(
                "no permission to inspect process {pid} ({comm}): {}",
                permission_hint(pid, Some(uid))
            )
        }
        // A kernel thread or an exiting process has no exe; later checks say more.
        Err(_) => return Ok(()),
    }
    let Some((class64, machine)) = elf::elf_class_machine(&header) else {
        return Ok(());
    };
    if !class64 || machine != elf::native_machine() {
        bail!(
            "process {pid} ({comm}) is a {} program and this heapprofd-rs is {}: \
             use a heapprofd-rs built for the target's architecture",
            elf::machine_name(class64, machine),
            elf::machine_name(true, elf::native_machine())
        );
    }
    Ok(())
}

/// `AT_BASE` (the dynamic linker's load address) from `/proc/PID/auxv`.
fn interpreter_base(pid: u32) -> Option<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    auxv.chunks_exact(16).find_map(|c| {
        let key = u64::from_ne_bytes(c[..8].try_into().ok()?);
        let val = u64::from_ne_bytes(c[8..].try_into().ok()?);
        (key == libc::AT_BASE && val != 0).then_some(val)
    })
}

/// Whether the target was started with the client preloaded.
fn is_preloaded(pid: u32) -> bool {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let in_env = environ.split(|&b| b == 0).any(|kv| {
        kv.strip_prefix(b"LD_PRELOAD=")
            .is_some_and(|v| String::from_utf8_lossy(v).contains(CLIENT_FILE_NAME))
    });
    in_env
        || std::fs::read_to_string("/etc/ld.so.preload").is_ok_and(|s| s.contains(CLIENT_FILE_NAME))
}

/// A thread of `pid` named like the client's session thread.
pub fn client_thread(pid: u32) -> Option<u32> {
    threads(pid).into_iter().find(|&tid| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
            .is_ok_and(|c| c.trim_end() == CLIENT_THREAD_NAME)
    })
}

/// Thread ids of `pid`, the main thread first.
pub fn threads(pid: u32) -> Vec<u32> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable_by_key(|&t| (t != pid, t));
    tids
}

/// [`probe`] for the end of a session: the target (our client loaded, its
/// thread possibly present) must still be there.
pub fn probe_loaded(pid: u32) -> Result<Target> {
    probe_with(pid, true)
}

/// Wakes a preloaded, dormant client with `sigqueue(pid, 36, id)`.
pub fn signal_activate(pid: u32, id: u32) -> Result<()> {
    // SAFETY: sigqueue with a plain integer value.
    let rc = unsafe {
        let v = libc::sigval {
            sival_ptr: id as usize as *mut libc::c_void,
        };
        libc::sigqueue(pid as i32, ACTIVATION_SIGNAL, v)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            bail!("no permission to signal process {pid}: run as its user (or root); {e}");
        }
        return Err(e).with_context(|| format!("sending the activation signal to {pid}"));
    }
    Ok(())
}

mod remote;
pub use remote::{InjectOptions, InjectReport, detach, inject};
