//! The injection itself: pick a thread at a safe point, make it call
//! `dlopen` and the client's attach entry, restore it (see the module docs
//! of `inject`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use heapprofd_proto::attach::{AttachStatus, FLAG_SYNC};

use crate::CLIENT_FILE_NAME;
use crate::error::{InjectError, Result};
use crate::permission::permission_hint;
use crate::plan::{Plan, make_plan};
use crate::probe::{Target, threads};
use crate::ptrace::{CallError, Regs, Stop, Tracee};
use crate::safety::{SafetyModel, Verdict};
use crate::status::{first_number, status_field};

/// Bytes below the stack pointer a leaf function may use (System V).
const RED_ZONE: u64 = 128;

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
    .map_err(|e| InjectError::io(format!("reading the memory map of process {pid}"), e))?;
    let prepare = t0.elapsed();
    log::debug!("attach: plan {:?}, model {:?}", t_plan, prepare - t_plan);
    let deadline = Instant::now() + opts.safe_point_timeout;
    let mut attempts = 0;
    let mut refused: Vec<(u32, String)> = Vec::new();
    loop {
        let tids = threads(pid);
        if tids.is_empty() {
            return Err(InjectError::Exited { pid });
        }
        for tid in tids {
            if exiting(pid) {
                return Err(InjectError::Exited { pid });
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
            return Err(InjectError::Exited { pid });
        }
        if Instant::now() >= deadline {
            let list: Vec<String> = refused
                .iter()
                .map(|(t, why)| format!("thread {t}: {why}"))
                .collect();
            return Err(InjectError::NoSafePoint {
                pid,
                timeout: opts.safe_point_timeout,
                last_seen: list.join("; "),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the process is gone, a zombie, or exiting (ptrace then fails
/// with EPERM or ESRCH).
fn exiting(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Err(_) => true,
        Ok(s) => {
            status_field(&s, "State").is_some_and(|st| st.starts_with('Z') || st.starts_with('X'))
        }
    }
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
        Err(_) if exiting(pid) => Err(InjectError::Exited { pid }),
        Err(e) if e.thread_gone() => Ok(Attempt::Refused("exited".into())),
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
            return Err(InjectError::Exited { pid });
        }
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let traced = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
                .ok()
                .and_then(|s| first_number(status_field(&s, "TracerPid")))
                .filter(|&t| t != 0);
            if let Some(t) = traced {
                return Err(InjectError::Refused(format!(
                    "thread {tid} of process {pid} is already being traced by pid {t} (a \
                     debugger?); detach it first"
                )));
            }
            return Err(InjectError::Permission(format!(
                "no permission to ptrace process {pid} ({}): {}",
                target.comm,
                permission_hint(pid, Some(target.uid))
            )));
        }
        Err(e) => {
            return Err(InjectError::CallFailed(format!(
                "PTRACE_SEIZE of thread {tid} failed: {e}"
            )));
        }
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
    let cx = Hijack {
        tr: &tr,
        saved: &saved,
        plan,
        target,
        opts,
    };
    let result = run_calls(&cx, sync, &mut steps);
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
    restored.map_err(|e| {
        InjectError::CallFailed(format!("restoring the registers of thread {tid}: {e}"))
    })?;
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
        Err(CallError::Gone) => Err(InjectError::Exited { pid }),
        Err(CallError::Timeout) => Err(InjectError::CallFailed(format!(
            "a call into process {pid} did not return within {:.0}s; thread {tid} got its \
             registers back, but the target may now hold the dynamic loader's lock",
            opts.call_timeout.as_secs_f64()
        ))),
        Err(e @ CallError::Crashed { .. }) => Err(InjectError::CallFailed(format!(
            "loading the profiler into process {pid} failed: {e}; thread {tid} got its \
             registers back"
        ))),
        Err(CallError::Io(e)) => Err(InjectError::Os(e)),
        Err(CallError::Refused(msg)) => Err(InjectError::Refused(format!(
            "{msg}; the target was left as it was"
        ))),
        Err(CallError::Failed(msg)) if loaded => Err(InjectError::CallFailed(format!(
            "{msg}; thread {tid} got its registers back (the library stays loaded, dormant)"
        ))),
        Err(CallError::Failed(msg)) => Err(InjectError::CallFailed(format!(
            "{msg}; thread {tid} got its registers back"
        ))),
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

/// A stopped thread with its saved registers, and what to call in it.
#[derive(Clone, Copy)]
struct Hijack<'a> {
    tr: &'a Tracee,
    saved: &'a Regs,
    plan: &'a Plan,
    target: &'a Target,
    opts: &'a InjectOptions,
}

/// Where the calls' data lives on the hijacked thread's stack.
#[derive(Clone, Copy)]
struct Scratch {
    /// Stack pointer of each call (a 0 return address is stored there).
    sp: u64,
    /// The library path.
    data: u64,
    /// The string "malloc".
    name_malloc: u64,
}

/// The call sequence on a stopped, saved thread.
fn run_calls(cx: &Hijack<'_>, sync: bool, steps: &mut Steps) -> Result<(), CallError> {
    let Hijack {
        tr, saved, plan, ..
    } = *cx;
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
        detach_call(cx, sp, steps)
    } else {
        let scratch = Scratch {
            sp,
            data,
            name_malloc,
        };
        calls_after_errno(cx, scratch, sync, steps)
    };
    if errno_ok {
        tr.write(errno_addr, &errno)?;
    }
    result
}

/// The client's detach entry (a synchronous session ends).
fn detach_call(cx: &Hijack<'_>, sp: u64, steps: &mut Steps) -> Result<(), CallError> {
    let Hijack {
        tr,
        saved,
        plan,
        target,
        opts,
    } = *cx;
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

/// The calls after `__errno_location()`: the allocator check, `dlopen`
/// (unless loaded), the client's attach entry.
fn calls_after_errno(
    cx: &Hijack<'_>,
    Scratch {
        sp,
        data,
        name_malloc,
    }: Scratch,
    sync: bool,
    steps: &mut Steps,
) -> Result<(), CallError> {
    let Hijack {
        tr,
        saved,
        plan,
        target,
        opts,
    } = *cx;
    let pid = target.pid;
    let short = Duration::from_secs(5);
    // Attaching stops a thread at a safe point, which is checked against
    // glibc's malloc code only: a thread inside another allocator's
    // internals could hold its lock while our calls allocate. Refuse
    // before loading anything (`record -- CMD` profiles other allocators).
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
                 `record --pid` attaches to glibc's allocator only (`record -- CMD` profiles \
                 jemalloc, tcmalloc, mimalloc... from the start)",
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
            "process {pid} cannot be profiled: its executable defines malloc itself (a \
             statically linked allocator), whose calls cannot be intercepted"
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
    crate::elf::bias_in_maps(&maps, CLIENT_FILE_NAME, segments)
}

fn read_c_string(tr: &Tracee, addr: u64) -> String {
    let mut buf = vec![0u8; 1024];
    let n = tr.read_some(addr, &mut buf);
    buf.truncate(n);
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
