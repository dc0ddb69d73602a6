//! The calls an injection makes in the hijacked thread, in order:
//! `__errno_location()` (the thread's errno is saved, and written back at
//! the end), then either the client's detach entry (ending a synchronous
//! session), or `dlsym(RTLD_DEFAULT, "malloc")` (another allocator is
//! refused before anything is loaded), `dlopen` of the client (unless it
//! is loaded; `dlerror()` if that failed) and the client's attach entry.
//! Each call returns into the stub of [`crate::sigframe`]
//! ([`crate::restore::ReturnPath`]).

use std::cell::Cell;
use std::time::Duration;

use heapprofd_proto::attach::{AttachStatus, FLAG_SYNC};

use crate::CLIENT_FILE_NAME;
use crate::plan::Plan;
use crate::probe::Target;
use crate::ptrace::{CallError, CallReturn, Regs, Tracee};
use crate::restore::ReturnPath;
use crate::sigframe::{NR_RT_SIGRETURN, STUB_SYSCALL_END};
use crate::stall::Stall;
use crate::steps::Steps;

/// How long the quick calls (`__errno_location`, `dlsym`, `dlerror`) may take.
const SHORT: Duration = Duration::from_secs(5);

/// A stopped thread with its saved registers, its return path, and what
/// to call in it.
pub(crate) struct Hijack<'a> {
    pub(crate) tr: &'a Tracee,
    pub(crate) saved: &'a Regs,
    pub(crate) plan: &'a Plan,
    pub(crate) target: &'a Target,
    /// The socket id passed to the attach entry.
    pub(crate) id: u32,
    /// How long `dlopen` and the entries may take.
    pub(crate) call_timeout: Duration,
    pub(crate) path: &'a ReturnPath,
    pub(crate) stall: Stall<'a>,
    /// Calls made so far (the stall points count them).
    pub(crate) calls: Cell<u32>,
}

impl Hijack<'_> {
    /// Calls `func(args...)`; the thread is back at the stub afterwards.
    fn call(&self, func: u64, args: &[u64], timeout: Duration) -> Result<u64, CallError> {
        let k = self.calls.get();
        self.calls.set(k + 1);
        let on_step = |what: &str| self.stall.at(&format!("call-{k}-{what}"));
        let ret = CallReturn {
            stub_end: self.path.stub + STUB_SYSCALL_END,
            stub_nr: NR_RT_SIGRETURN,
            timeout,
            on_step: &on_step,
        };
        let r = self.tr.call(self.saved, self.path.sp, func, args, ret)?;
        self.stall.at(&format!("call-{k}-returned"));
        Ok(r)
    }
}

/// The whole call sequence (see the module docs).
pub(crate) fn run_calls(cx: &Hijack<'_>, sync: bool, steps: &mut Steps) -> Result<(), CallError> {
    let errno_addr = cx.call(cx.plan.errno_location, &[], SHORT)?;
    let mut errno = [0u8; 4];
    let errno_ok = errno_addr != 0 && cx.tr.read(errno_addr, &mut errno).is_ok();
    steps.done("__errno_location()");
    let result = if cx.plan.detach {
        detach_call(cx, steps)
    } else {
        calls_after_errno(cx, sync, steps)
    };
    if errno_ok {
        cx.tr.write(errno_addr, &errno)?;
    }
    result
}

/// The client's detach entry (a synchronous session ends).
fn detach_call(cx: &Hijack<'_>, steps: &mut Steps) -> Result<(), CallError> {
    let bias = cx.plan.client_bias.unwrap_or(0);
    let status = cx.call(bias + cx.plan.detach_svma, &[], cx.call_timeout)?;
    steps.done("detach entry");
    match AttachStatus::from_code(status as u32 as i32) {
        Some(AttachStatus::Ok) => Ok(()),
        _ => Err(CallError::Failed(format!(
            "the profiler's detach entry in process {} returned {}",
            cx.target.pid, status as u32 as i32
        ))),
    }
}

/// The calls after `__errno_location()`: the allocator check, `dlopen`
/// (unless loaded), the client's attach entry.
fn calls_after_errno(cx: &Hijack<'_>, sync: bool, steps: &mut Steps) -> Result<(), CallError> {
    let Hijack { plan, target, .. } = cx;
    let pid = target.pid;
    // Attaching stops a thread at a safe point, which is checked against
    // glibc's malloc code only: a thread inside another allocator's
    // internals could hold its lock while our calls allocate. Refuse
    // before loading anything (`record -- CMD` profiles other allocators).
    if let (Some(dlsym), None) = (plan.dlsym, &target.client) {
        let global = cx.call(dlsym, &[0, cx.path.name_malloc], SHORT)?;
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
            let handle = cx.call(dlopen, &[cx.path.data, mode], cx.call_timeout)?;
            if handle == 0 {
                let msg = plan
                    .dlerror
                    .and_then(|f| cx.call(f, &[], SHORT).ok())
                    .filter(|&p| p != 0)
                    .map(|p| read_c_string(cx.tr, p))
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
    let flags = if sync { u64::from(FLAG_SYNC) } else { 0 };
    let status = cx.call(
        bias + plan.entry_svma,
        &[u64::from(cx.id), flags],
        cx.call_timeout,
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
