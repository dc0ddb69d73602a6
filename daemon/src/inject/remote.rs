//! The injection itself: pick a thread at a safe point, make it call
//! `dlopen` and the client's attach entry, restore it (see the module docs
//! of `inject`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use heapprofd_proto::attach::{AttachStatus, FLAG_SYNC};

use super::elf::{LoadedObject, Symbols};
use super::ptrace::{CallError, Regs, Stop, Tracee};
use super::safety::{SafetyModel, Verdict};
use super::{
    ATTACH_ENTRY, CLIENT_FILE_NAME, DETACH_ENTRY, RED_ZONE, RTLD_DLOPEN_PRIVATE, RTLD_NODELETE,
    RTLD_NOW, Target, permission_hint, threads,
};

/// How to inject.
#[derive(Debug, Clone)]
pub struct InjectOptions {
    /// The client library (absolute path; loaded unless already mapped).
    pub lib: PathBuf,
    /// The socket id passed to the client (`/tmp/heapprofd-rs-<id>.sock`).
    pub id: u32,
    /// How long to look for a thread at a safe point.
    pub safe_point_timeout: Duration,
    /// How long `dlopen` and the attach entry may take before we give up.
    pub call_timeout: Duration,
    /// Unwind tables of the target's modules (the daemon's cache, so its
    /// sessions reuse what the safe-point checks parsed).
    pub module_cache: std::sync::Arc<heapprofd_unwinder::ModuleCache>,
}

/// What an injection did.
#[derive(Debug, Clone)]
pub struct InjectReport {
    /// The thread that ran the calls.
    pub tid: u32,
    /// How long that thread was stopped (from the interrupt's stop to the
    /// detach), including the calls.
    pub pause: Duration,
    /// Threads stopped and checked before one was safe (1 = the first).
    pub attempts: u32,
    /// Whether `dlopen` was called (false: the client was already loaded).
    pub loaded: bool,
    /// Time spent preparing (symbols, unwind tables) before stopping anything.
    pub prepare: Duration,
    /// Why the threads that were refused were refused (the last reason of each).
    pub refused: Vec<(u32, String)>,
    /// Where the pause went: (step, duration), in order.
    pub steps: Vec<(&'static str, Duration)>,
    /// The session was started synchronously, without a client thread (the
    /// target had one thread): end it with [`detach`].
    pub sync: bool,
}

/// Addresses in the target, all resolved before any thread is stopped.
struct Plan {
    errno_location: u64,
    dlsym: Option<u64>,
    /// `dlopen` (or `__libc_dlopen_mode`) and its mode; `None` when the
    /// client is already loaded.
    dlopen: Option<(u64, u64)>,
    dlerror: Option<u64>,
    /// glibc's `malloc` in the target.
    libc_malloc: u64,
    /// The program's canonical PLT entry for `malloc` (non-PIE programs
    /// that take its address), which is glibc's malloc too.
    canonical_malloc: Option<u64>,
    /// The client's attach entry: its svma, and the bias when already loaded.
    entry_svma: u64,
    /// The client's detach entry (svma).
    detach_svma: u64,
    /// This run ends a synchronous session instead of starting one.
    detach: bool,
    client_bias: Option<u64>,
    /// The client file's segments (its bias once loaded).
    client_segments: Vec<heapprofd_unwinder::LoadSegment>,
    lib: Vec<u8>,
}

/// Outcome of one thread.
enum Attempt {
    Done(InjectReport),
    /// Not at a safe point (or gone): try another thread.
    Refused(String),
}

/// Loads the client into `target` (unless already loaded) and calls its
/// attach entry. See the module docs of `inject` for the protocol.
pub fn inject(target: &Target, opts: &InjectOptions) -> Result<InjectReport> {
    run(target, opts, false)
}

/// Ends a synchronous session (see [`InjectReport::sync`]): the same
/// hijack, calling the client's detach entry (teardown, GOTs restored).
/// `target` must be probed again (the client is loaded now).
pub fn detach(target: &Target, opts: &InjectOptions) -> Result<InjectReport> {
    run(target, opts, true)
}

fn run(target: &Target, opts: &InjectOptions, detach: bool) -> Result<InjectReport> {
    let t0 = Instant::now();
    let pid = target.pid;
    let libc_syms = target.libc.symbols()?;
    let plan = make_plan(target, &libc_syms, &opts.lib, detach)?;
    let t_plan = t0.elapsed();
    let mut model = SafetyModel::build(
        pid,
        std::sync::Arc::clone(&opts.module_cache),
        &target.libc,
        libc_syms,
        target.loader.as_ref(),
        target.client.as_ref(),
    )
    .map_err(|e| anyhow!("reading the memory map of process {pid}: {e}"))?;
    let prepare = t0.elapsed();
    if std::env::var_os("HEAPPROFD_DEBUG").is_some() {
        eprintln!(
            "heapprofd-rs: attach: plan {:?}, model {:?}",
            t_plan,
            prepare - t_plan
        );
    }
    let deadline = Instant::now() + opts.safe_point_timeout;
    let mut attempts = 0;
    let mut refused: Vec<(u32, String)> = Vec::new();
    loop {
        let tids = threads(pid);
        if tids.is_empty() {
            bail!("process {pid} exited during the attach");
        }
        for tid in tids {
            if exiting(pid) {
                bail!("process {pid} exited during the attach");
            }
            attempts += 1;
            match attempt(target, tid, &plan, &mut model, opts)? {
                Attempt::Done(mut r) => {
                    r.attempts = attempts;
                    r.prepare = prepare;
                    refused.retain(|(t, _)| *t != tid);
                    r.refused = refused;
                    return Ok(r);
                }
                Attempt::Refused(why) => match refused.iter_mut().find(|(t, _)| *t == tid) {
                    Some(e) => e.1 = why,
                    None => refused.push((tid, why)),
                },
            }
        }
        if exiting(pid) {
            bail!("process {pid} exited during the attach");
        }
        if Instant::now() >= deadline {
            let list: Vec<String> = refused
                .iter()
                .map(|(t, why)| format!("thread {t}: {why}"))
                .collect();
            bail!(
                "no thread of process {pid} was at a safe point to load the profiler within \
                 {:.1}s (a thread inside malloc, the dynamic loader, fork or thread creation \
                 could deadlock); the target was left as it was. Last seen: {}",
                opts.safe_point_timeout.as_secs_f64(),
                list.join("; ")
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the process is gone, a zombie, or exiting (ptrace then fails
/// with EPERM or ESRCH).
fn exiting(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Err(_) => true,
        Ok(s) => super::status_field(&s, "State")
            .is_some_and(|st| st.starts_with('Z') || st.starts_with('X')),
    }
}

fn make_plan(target: &Target, libc_syms: &Symbols, lib: &Path, detach: bool) -> Result<Plan> {
    let pid = target.pid;
    let at = |s: &Symbols, o: &LoadedObject, name: &str| s.address_of(name).map(|a| o.bias + a);
    let errno_location = at(libc_syms, &target.libc, "__errno_location")
        .ok_or_else(|| anyhow!("no __errno_location in {}: not glibc?", target.libc.path))?;
    let libc_malloc = at(libc_syms, &target.libc, "malloc")
        .ok_or_else(|| anyhow!("no malloc in {}: not glibc?", target.libc.path))?;
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
        None if detach => bail!("the profiler is not loaded in process {pid}"),
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
                    anyhow!(
                        "found no dlopen in the target's {} (nor libdl): cannot load the \
                         profiler into it",
                        target.libc.path
                    )
                })?,
        )
    };
    let client_syms = Symbols::read(&client_path)?;
    let entry_svma = client_syms.unique_containing(ATTACH_ENTRY).ok_or_else(|| {
        anyhow!(
            "{} has no symbol {ATTACH_ENTRY} in its symbol table (stripped, or another \
             version of heapprofd-rs?): rebuild it with `cargo build --release`",
            client_path.display()
        )
    })?;
    let detach_svma = client_syms
        .unique_containing(DETACH_ENTRY)
        .ok_or_else(|| anyhow!("{} has no symbol {DETACH_ENTRY}", client_path.display()))?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let exe_path = exe.to_string_lossy().into_owned();
    // Only a non-PIE program (ET_EXEC) can have one.
    let canonical_malloc = match LoadedObject::find(pid, &target.maps, |p| p == exe_path)? {
        Some(o) if super::elf::read_program_headers(&o.read_from).is_ok_and(|(_, t)| t == 2) => {
            super::elf::canonical_plt_entry(&o.read_from, "malloc").map(|a| o.bias + a)
        }
        _ => None,
    };
    let mut lib_bytes = lib.as_os_str().as_encoded_bytes().to_vec();
    lib_bytes.push(0);
    if lib_bytes.len() > 4096 {
        bail!("the client library path is too long");
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
    })
}

/// Seizes `tid`, and if it is at a safe point, runs the calls. A thread or
/// process that vanishes meanwhile is reported as such, whatever request
/// noticed it.
fn attempt(
    target: &Target,
    tid: u32,
    plan: &Plan,
    model: &mut SafetyModel,
    opts: &InjectOptions,
) -> Result<Attempt> {
    let pid = target.pid;
    match attempt_inner(target, tid, plan, model, opts) {
        Err(_) if exiting(pid) => bail!("process {pid} exited during the attach"),
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.raw_os_error() == Some(libc::ESRCH)) =>
        {
            Ok(Attempt::Refused("exited".into()))
        }
        r => r,
    }
}

fn attempt_inner(
    target: &Target,
    tid: u32,
    plan: &Plan,
    model: &mut SafetyModel,
    opts: &InjectOptions,
) -> Result<Attempt> {
    let pid = target.pid;
    let tr = match Tracee::seize(pid, tid as i32) {
        Ok(t) => t,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
            return Ok(Attempt::Refused("exited".into()));
        }
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && exiting(pid) => {
            bail!("process {pid} exited during the attach");
        }
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let traced = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
                .ok()
                .and_then(|s| super::first_number(super::status_field(&s, "TracerPid")))
                .filter(|&t| t != 0);
            if let Some(t) = traced {
                bail!(
                    "thread {tid} of process {pid} is already being traced by pid {t} (a \
                     debugger?); detach it first"
                );
            }
            bail!(
                "no permission to ptrace process {pid} ({}): {}",
                target.comm,
                permission_hint(pid, Some(target.uid))
            );
        }
        Err(e) => return Err(anyhow!("PTRACE_SEIZE of thread {tid} failed: {e}")),
    };
    tr.interrupt()?;
    // The first stop: the interrupt's, or a signal that was on its way.
    let mut pending_signal = 0;
    match tr.wait(Duration::from_secs(2))? {
        Some(Stop::Event(_)) => {}
        Some(Stop::Signal(sig)) => pending_signal = sig,
        Some(Stop::Gone) => return Ok(Attempt::Refused("exited".into())),
        // Not stoppable now (uninterruptible sleep): leave it; dropping the
        // tracee detaches once it stops (or when this thread exits).
        None => return Ok(Attempt::Refused("did not stop within 2s".into())),
    }
    let stopped_at = Instant::now();
    let mut steps = Steps::new();
    let saved = tr.regs()?;
    let mut stack = vec![0u8; model.stack_len(saved.rsp)];
    let n = tr.read_some(saved.rsp, &mut stack);
    stack.truncate(n);
    steps.done("registers and stack copy");
    if let Verdict::Unsafe { reason } = model.check(&saved, &stack) {
        tr.detach(pending_signal)?;
        return Ok(Attempt::Refused(reason));
    }
    steps.done("safe-point check");
    let (fp_note, fp) = tr.fpstate()?;
    // A single-threaded process (this thread, stopped, is all of it) gets
    // no client thread: glibc would consider it multi-threaded for good.
    let sync = !plan.detach && threads(pid).len() == 1;
    let result = run_calls(&tr, &saved, plan, target, opts, sync, &mut steps);
    // Whatever happened, the thread gets its own registers back.
    if let Err(CallError::Timeout) = &result {
        // It is still running our call: stop it before restoring.
        let _ = tr.stop_again(Duration::from_secs(2));
    }
    let restored = tr
        .set_regs(&saved)
        .and_then(|_| tr.set_fpstate(fp_note, &fp));
    let gone = matches!(result, Err(CallError::Gone));
    if !gone {
        tr.detach(pending_signal)?;
    }
    let pause = stopped_at.elapsed();
    steps.done("restore and detach");
    restored.map_err(|e| anyhow!("restoring the registers of thread {tid}: {e}"))?;
    let loaded = plan.dlopen.is_some();
    match result {
        Ok(()) => Ok(Attempt::Done(InjectReport {
            tid,
            pause,
            attempts: 0,
            loaded,
            prepare: Duration::ZERO,
            refused: Vec::new(),
            steps: steps.list,
            sync,
        })),
        Err(CallError::Gone) => bail!("process {pid} exited during the attach"),
        Err(CallError::Timeout) => bail!(
            "a call into process {pid} did not return within {:.0}s; thread {tid} got its \
             registers back, but the target may now hold the dynamic loader's lock",
            opts.call_timeout.as_secs_f64()
        ),
        Err(e @ CallError::Crashed { .. }) => bail!(
            "loading the profiler into process {pid} failed: {e}; thread {tid} got its \
             registers back"
        ),
        Err(CallError::Io(e)) => Err(e.into()),
        Err(CallError::Refused(msg)) => bail!("{msg}; the target was left as it was"),
        Err(CallError::Failed(msg)) if loaded => {
            bail!("{msg}; thread {tid} got its registers back (the library stays loaded, dormant)")
        }
        Err(CallError::Failed(msg)) => bail!("{msg}; thread {tid} got its registers back"),
    }
}

/// Durations of the steps of a pause.
struct Steps {
    last: Instant,
    list: Vec<(&'static str, Duration)>,
}

impl Steps {
    fn new() -> Steps {
        Steps {
            last: Instant::now(),
            list: Vec::new(),
        }
    }

    fn done(&mut self, what: &'static str) {
        let now = Instant::now();
        self.list.push((what, now - self.last));
        self.last = now;
    }
}

/// The call sequence on a stopped, saved thread.
fn run_calls(
    tr: &Tracee,
    saved: &Regs,
    plan: &Plan,
    target: &Target,
    opts: &InjectOptions,
    sync: bool,
    steps: &mut Steps,
) -> Result<(), CallError> {
    // Scratch area below the red zone: [sp: return address 0][data...].
    let data = (saved.rsp - RED_ZONE - 256 - plan.lib.len() as u64) & !15;
    let sp = data - 8; // rsp % 16 == 8 at function entry (after the "call")
    let name_malloc = data + plan.lib.len() as u64 + 16;
    let mut scratch = plan.lib.clone();
    scratch.resize(plan.lib.len() + 16, 0);
    scratch.extend_from_slice(b"malloc\0");
    tr.write(data, &scratch)?;
    tr.write(sp, &0u64.to_le_bytes())?;
    let short = Duration::from_secs(5);
    let errno_addr = tr.call(saved, sp, plan.errno_location, &[], short)?;
    let mut errno = [0u8; 4];
    let errno_ok = errno_addr != 0 && tr.read(errno_addr, &mut errno).is_ok();
    steps.done("__errno_location()");
    let result = if plan.detach {
        detach_call(tr, saved, sp, plan, target, opts, steps)
    } else {
        let addrs = (sp, data, name_malloc);
        calls_after_errno(tr, saved, addrs, plan, target, opts, sync, steps)
    };
    if errno_ok {
        tr.write(errno_addr, &errno)?;
    }
    result
}

#[allow(clippy::too_many_arguments)]
/// The client's detach entry (a synchronous session ends).
fn detach_call(
    tr: &Tracee,
    saved: &Regs,
    sp: u64,
    plan: &Plan,
    target: &Target,
    opts: &InjectOptions,
    steps: &mut Steps,
) -> Result<(), CallError> {
    let bias = plan.client_bias.unwrap_or(0);
    let status = tr.call(saved, sp, bias + plan.detach_svma, &[], opts.call_timeout)?;
    steps.done("detach entry");
    match AttachStatus::from_code(status as u32 as i32) {
        Some(AttachStatus::Ok) => Ok(()),
        _ => Err(CallError::Failed(format!(
            "the profiler's detach entry in process {} returned {}",
            target.pid, status as u32 as i32
        ))),
    }
}

#[allow(clippy::too_many_arguments)]
fn calls_after_errno(
    tr: &Tracee,
    saved: &Regs,
    (sp, data, name_malloc): (u64, u64, u64),
    plan: &Plan,
    target: &Target,
    opts: &InjectOptions,
    sync: bool,
    steps: &mut Steps,
) -> Result<(), CallError> {
    let pid = target.pid;
    let short = Duration::from_secs(5);
    // Another allocator interposing malloc cannot be mixed with our hooks
    // (they call glibc's): refuse before loading anything.
    if let (Some(dlsym), None) = (plan.dlsym, &target.client) {
        let global = tr.call(saved, sp, dlsym, &[0, name_malloc], short)?;
        if global != 0 && global != plan.libc_malloc && Some(global) != plan.canonical_malloc {
            let owner = target
                .maps
                .iter()
                .find(|m| m.contains(global))
                .map_or("an unknown object".to_string(), |m| m.path.clone());
            return Err(CallError::Refused(format!(
                "process {pid} ({}) does not use glibc's malloc (its malloc is in {owner}); \
                 heapprofd-rs profiles glibc's allocator only",
                target.comm
            )));
        }
        steps.done("dlsym(RTLD_DEFAULT, \"malloc\")");
    }
    let bias = match (plan.client_bias, plan.dlopen) {
        (Some(b), _) => b,
        (None, Some((dlopen, mode))) => {
            let handle = tr.call(saved, sp, dlopen, &[data, mode], opts.call_timeout)?;
            if handle == 0 {
                let msg = plan
                    .dlerror
                    .and_then(|f| tr.call(saved, sp, f, &[], short).ok())
                    .filter(|&p| p != 0)
                    .map(|p| read_c_string(tr, p))
                    .unwrap_or_else(|| "no message".into());
                return Err(CallError::Failed(format!(
                    "dlopen of the profiler in process {pid} failed: {msg}"
                )));
            }
            steps.done("dlopen()");
            let bias = client_bias_after_load(pid, &plan.client_segments).ok_or_else(|| {
                CallError::Failed(format!(
                    "dlopen succeeded but {CLIENT_FILE_NAME} is not in the maps of {pid}"
                ))
            })?;
            steps.done("maps re-read");
            bias
        }
        (None, None) => return Err(CallError::Failed("nothing to load".into())),
    };
    let status = tr.call(
        saved,
        sp,
        bias + plan.entry_svma,
        &[
            u64::from(opts.id),
            if sync { u64::from(FLAG_SYNC) } else { 0 },
        ],
        opts.call_timeout,
    )? as u32 as i32;
    steps.done("attach entry");
    match AttachStatus::from_code(status) {
        Some(AttachStatus::Ok) => Ok(()),
        Some(AttachStatus::Busy) => Err(CallError::Failed(format!(
            "process {pid} is already being profiled (its heapprofd-rs client has a session \
             or is connecting); stop that session first"
        ))),
        Some(AttachStatus::OtherAllocator) => Err(CallError::Failed(format!(
            "process {pid} does not use glibc's malloc (another allocator interposes it); \
             heapprofd-rs profiles glibc's allocator only"
        ))),
        Some(AttachStatus::NoThread) => Err(CallError::Failed(format!(
            "the profiler could not create its thread in process {pid}"
        ))),
        Some(AttachStatus::ConnectFailed) => Err(CallError::Failed(format!(
            "the profiler in process {pid} could not connect to this heapprofd-rs"
        ))),
        Some(AttachStatus::Reentered) | None => Err(CallError::Failed(format!(
            "the profiler's attach entry in process {pid} returned {status}"
        ))),
    }
}

/// The client library's bias, from the target's maps re-read after `dlopen`.
fn client_bias_after_load(pid: u32, segments: &[heapprofd_unwinder::LoadSegment]) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let maps = heapprofd_unwinder::parse_maps(&text).entries;
    super::elf::bias_in_maps(&maps, CLIENT_FILE_NAME, segments)
}

fn read_c_string(tr: &Tracee, addr: u64) -> String {
    let mut buf = vec![0u8; 1024];
    let n = tr.read_some(addr, &mut buf);
    buf.truncate(n);
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
