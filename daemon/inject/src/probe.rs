//! Probing the target before anything is touched: what `/proc` says about
//! it (state, tracer, user, architecture, maps, libc, loader, our client,
//! preload, signal disposition), refusing with a hint what cannot work.

use heapprofd_unwinder::MapEntry;

use crate::elf::{LoadedObject, elf_class_machine, machine_name, native_machine};
use crate::error::{InjectError, Result};
use crate::permission::permission_hint;
use crate::status::{first_number, second_number, status_field};
use crate::{ACTIVATION_SIGNAL, CLIENT_FILE_NAME, CLIENT_THREAD_NAME};

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
    /// Effective user id: the user its client connects as, and whose
    /// runtime directory it looks for the daemon's socket in.
    pub euid: u32,
    /// Effective group id.
    pub egid: u32,
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

/// Reads `/proc/PID/…` and checks that attaching can work (see the module
/// docs). Touches nothing.
pub fn probe(pid: u32) -> Result<Target> {
    probe_with(pid, false)
}

fn probe_with(pid: u32, ending: bool) -> Result<Target> {
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(InjectError::Refused(format!("{pid} is not a process id")));
    }
    if pid == std::process::id() {
        return Err(InjectError::Refused(
            "cannot attach to heapprofd-rs itself".into(),
        ));
    }
    let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(InjectError::Refused(format!(
                "no process with pid {pid} (check the number with `ps` or `pgrep`)"
            )));
        }
        Err(e) => return Err(InjectError::io(format!("reading /proc/{pid}/status"), e)),
    };
    let comm = status_field(&status, "Name").unwrap_or("?").to_string();
    let tgid = first_number(status_field(&status, "Tgid")).unwrap_or(pid);
    if tgid != pid {
        return Err(InjectError::Refused(format!(
            "{pid} is a thread of process {tgid} ({comm}): use --pid {tgid}"
        )));
    }
    let state = status_field(&status, "State").unwrap_or("");
    if state.starts_with('Z') || state.starts_with('X') {
        return Err(InjectError::Refused(format!(
            "process {pid} ({comm}) has exited (it is a zombie waiting for its parent)"
        )));
    }
    if state.starts_with('T') {
        return Err(InjectError::Refused(format!(
            "process {pid} ({comm}) is stopped (state {state}); resume it with \
             `kill -CONT {pid}` and try again"
        )));
    }
    let tracer = first_number(status_field(&status, "TracerPid")).unwrap_or(0);
    if tracer != 0 {
        let tcomm = std::fs::read_to_string(format!("/proc/{tracer}/comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        return Err(InjectError::Refused(format!(
            "process {pid} ({comm}) is already being traced by pid {tracer} ({tcomm}), \
             a debugger or another tracer; detach it first (only one tracer at a time)"
        )));
    }
    let uid = first_number(status_field(&status, "Uid")).unwrap_or(0);
    let gid = first_number(status_field(&status, "Gid")).unwrap_or(0);
    let euid = second_number(status_field(&status, "Uid")).unwrap_or(uid);
    let egid = second_number(status_field(&status, "Gid")).unwrap_or(gid);
    let catches_signal = status_field(&status, "SigCgt")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .is_some_and(|m| m & (1 << (ACTIVATION_SIGNAL - 1)) != 0);

    check_architecture(pid, &comm, uid)?;
    let maps_text = match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(InjectError::Permission(format!(
                "no permission to read the memory map of process {pid} ({comm}): {}",
                permission_hint(pid, Some(uid))
            )));
        }
        Err(e) => return Err(InjectError::io(format!("reading /proc/{pid}/maps"), e)),
    };
    let maps = heapprofd_unwinder::parse_maps(&maps_text).entries;
    if maps.is_empty() {
        return Err(InjectError::Refused(format!(
            "process {pid} ({comm}) has no memory map (a kernel thread, or it is exiting)"
        )));
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
            return Err(InjectError::Refused(format!(
                "process {pid} ({comm}) uses musl libc: attaching needs glibc (its dlopen \
                 and malloc); start the program under `heapprofd-rs record -- CMD` instead"
            )));
        }
        return Err(InjectError::Refused(format!(
            "process {pid} ({comm}) is statically linked (there is no libc.so in its memory \
             map, so there is no dlopen to load the profiler with and no malloc to \
             intercept); attaching needs a dynamically linked glibc program"
        )));
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
        return Err(InjectError::Refused(format!(
            "process {pid} ({comm}) is already being profiled by heapprofd-rs (its thread \
             {tid} is named {CLIENT_THREAD_NAME}); stop that session first"
        )));
    }
    Ok(Target {
        pid,
        comm,
        uid,
        gid,
        euid,
        egid,
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
            return Err(InjectError::Permission(format!(
                "no permission to inspect process {pid} ({comm}): {}",
                permission_hint(pid, Some(uid))
            )));
        }
        // A kernel thread or an exiting process has no exe; later checks say more.
        Err(_) => return Ok(()),
    }
    let Some((class64, machine)) = elf_class_machine(&header) else {
        return Ok(());
    };
    if !class64 || machine != native_machine() {
        return Err(InjectError::Refused(format!(
            "process {pid} ({comm}) is a {} program and this heapprofd-rs is {}: \
             use a heapprofd-rs built for the target's architecture",
            machine_name(class64, machine),
            machine_name(true, native_machine())
        )));
    }
    Ok(())
}

/// `AT_BASE` (the dynamic linker's load address) from `/proc/PID/auxv`.
fn interpreter_base(pid: u32) -> Option<u64> {
    auxv_value(pid, libc::AT_BASE)
}

/// A non-zero value of the target's auxiliary vector.
pub(crate) fn auxv_value(pid: u32, key: u64) -> Option<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    auxv.chunks_exact(16).find_map(|c| {
        let k = u64::from_ne_bytes(c[..8].try_into().ok()?);
        let val = u64::from_ne_bytes(c[8..].try_into().ok()?);
        (k == key && val != 0).then_some(val)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_typed_and_say_what_to_do() {
        let refused = |r: Result<Target>| match r {
            Err(InjectError::Refused(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(refused(probe(0)).contains("not a process id"));
        assert!(refused(probe(std::process::id())).contains("itself"));
        // pid_max is at most 2^22: this pid cannot exist.
        let m = refused(probe((1 << 22) + 12345));
        assert!(m.contains("no process") && m.contains("pgrep"), "{m}");
    }

    #[test]
    fn a_dynamically_linked_child_is_probed() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        // Until exec, the child is a copy of this test binary; wait for it.
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let target = loop {
            let t = probe(pid);
            if matches!(&t, Ok(t) if t.comm == "sleep") || std::time::Instant::now() > deadline {
                break t;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let _ = child.kill();
        let _ = child.wait();
        let t = target.expect("probe of a running sleep");
        assert_eq!((t.pid, t.comm.as_str()), (pid, "sleep"));
        assert!(t.libc.path.contains("libc"), "{}", t.libc.path);
        assert!(!t.client_loaded() && !t.preloaded);
    }
}
