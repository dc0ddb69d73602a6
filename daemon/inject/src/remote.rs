//! The injection itself: pick a thread at a safe point, make it call
//! `dlopen` and the client's attach entry, restore it (see the module docs
//! of `inject`).

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::calls::{Hijack, run_calls};
use crate::error::{InjectError, Result};
use crate::options::{InjectOptions, InjectReport};
use crate::permission::permission_hint;
use crate::plan::{Plan, make_plan};
use crate::probe::{Target, threads};
use crate::ptrace::{CallError, Stop, Tracee};
use crate::restore::{Ended, Restored, ReturnPath};
use crate::safety::{SafetyModel, Verdict};
use crate::stall::Stall;
use crate::status::{first_number, status_field};
use crate::steps::Steps;

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
    match tr.wait(Duration::from_secs(2))? {
        Some(Stop::Event(_)) => {}
        // A signal being delivered: let it be (detaching delivers it), and
        // try this thread again later.
        Some(Stop::Signal(sig)) => {
            tr.detach(sig)?;
            return Ok(Attempt::Refused(format!(
                "signal {sig} was being delivered"
            )));
        }
        Some(Stop::Syscall) => {
            tr.detach(0)?;
            return Ok(Attempt::Refused("stopped at a system call".into()));
        }
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
        tr.detach(0)?;
        return Ok(Attempt::Refused(reason));
    }
    steps.done("safe-point check");
    let (fp_note, fp) = tr.fpstate()?;
    let sigmask = tr.sigmask()?;
    // A single-threaded process (this thread, stopped, is all of it) gets
    // no client thread: glibc would consider it multi-threaded for good.
    // Not for a profile of threads: only the client's thread would find
    // (and arm) the threads the program starts later.
    let sync = !plan.detach && !opts.samples_threads && threads(pid).len() == 1;
    let stall = Stall::new(opts.test_stall.as_deref(), plan.detach);
    // From here on the thread can always get back without us (see
    // `restore`): the return path is in place before the first call.
    let path = ReturnPath::install(&tr, &saved, plan, (fp_note, &fp), sigmask)?;
    steps.done("return path");
    let cx = Hijack {
        tr: &tr,
        saved: &saved,
        plan,
        target,
        id: opts.id,
        call_timeout: opts.call_timeout,
        path: &path,
        stall,
        calls: Cell::new(0),
    };
    let result = run_calls(&cx, sync, &mut steps);
    let ended = match &result {
        Ok(()) | Err(CallError::Failed(_) | CallError::Refused(_)) => Ended::AtStub,
        Err(CallError::Gone) => Ended::Gone,
        // It is still running our call: stop it before restoring.
        Err(CallError::Timeout) => match tr.stop_again(Duration::from_secs(2)) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ended::Gone,
            _ => Ended::Stopped,
        },
        Err(CallError::Crashed { .. } | CallError::Io(_)) => Ended::Stopped,
    };
    // Whatever happened, the thread gets its own registers back.
    let restored = path.restore(tr, &saved, (fp_note, &fp), ended, stall);
    let pause = stopped_at.elapsed();
    steps.done("restore and detach");
    let restored = restored.map_err(|e| {
        InjectError::CallFailed(format!("restoring the registers of thread {tid}: {e}"))
    })?;
    if restored == Restored::ByFrame {
        log::debug!("attach: thread {tid} was restored by its signal frame (a signal came first)");
    }
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
