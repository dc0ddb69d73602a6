//! The watcher thread: connects (unless the caller already did), then
//! stays as the session's watcher.
//!
//! It sleeps in `poll` on the session's socket and tears the session down
//! when the daemon closes it or dies, so the hooks go back to pass-through
//! even if the program never allocates again (and a writer blocked on a
//! full buffer is released). Before connecting it asks the front-end to
//! make the program's allocations reach the hooks
//! ([`Frontend::before_connect`](crate::frontend::Frontend)), gives the
//! front-end its periodic turn while the session runs, and lets it undo its
//! work when the session ends, before the thread exits.
//!
//! Threads are created with `pthread_create` directly, not `std::thread`:
//! std's thread bookkeeping uses global-dynamic TLS, which must not be linked
//! into the library (see `tls`).

use core::ffi::c_void;
use core::sync::atomic::Ordering;

use heapprofd_proto::attach::CLIENT_THREAD_NAME_C;

use crate::connect::connect;
use crate::session::{self, Session};
use crate::socket_path::SocketPath;
use crate::state::{CONNECTING, IDLE, STATE};
use crate::tls::Guard;
use crate::{cputimer, frontend};

/// Waits on the session's socket until the daemon closes it (or the session
/// ends some other way), then tears down and drops the watcher's reference.
fn watch(s: &'static Session) {
    // The part of the ring past `connect::PREFAULT_HEAD` (a no-op for the
    // pages already in). Best effort: without it, writers fault pages in.
    s.rb().prefault();
    // The free set's slots, likewise, if the daemon asks (see
    // `FreeSet::prefault` and `ClientConfig::FLAG_PREFAULT_FREE_SET`).
    if s.config().prefault_free_set() {
        let _ = crate::state::free_set().prefault();
    }
    let mut sink = [0u8; 64];
    // CPU-time profiling and perf events: the watcher arms the threads'
    // timers and events now and looks for new threads every
    // `cputimer::SCAN_MS` (see `cputimer`).
    // SAFETY: gettid has no preconditions.
    let own_tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    let (event, event_period) = s.perf_event();
    let plan = cputimer::Plan::of(s.cpu_period_ns(), event, event_period);
    let cpu = plan.is_some_and(|p| cputimer::scan(&p, own_tid));
    let mut ticks = Ticks::default();
    while !session::is_retired(s) {
        let mut pfd = libc::pollfd {
            fd: s.sock,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // The front-end's periodic work (glibc, patched: objects loaded
        // meanwhile) runs on every timeout.
        let fe_ms = (frontend::get().tick_ms)().unwrap_or(1000);
        let timeout = i32::from(if cpu {
            fe_ms.min(cputimer::SCAN_MS)
        } else {
            fe_ms
        });
        // SAFETY: one valid pollfd; the socket stays open while we hold our
        // writer reference. The timeout bounds how long a retired session
        // keeps this thread.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout) };
        if n < 0 {
            if crate::errno::get() == libc::EINTR {
                continue;
            }
            s.teardown(None);
            break;
        }
        if n == 0 {
            if let Some(p) = plan.filter(|_| cpu) {
                cputimer::scan(&p, own_tid);
            }
            if ticks.due(fe_ms) {
                (frontend::get().tick)();
            }
            continue;
        }
        if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP | libc::POLLNVAL) != 0 {
            s.teardown(None);
            break;
        }
        // The daemon sends nothing after the configuration: EOF or junk.
        // SAFETY: reading into our own buffer.
        let r = unsafe {
            libc::recv(
                s.sock,
                sink.as_mut_ptr().cast(),
                sink.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r == 0 || (r < 0 && !matches!(crate::errno::get(), libc::EAGAIN | libc::EINTR)) {
            s.teardown(None);
            break;
        }
    }
    if cpu {
        cputimer::disarm_all();
    }
    // The custom heaps' disabled callbacks (still holding our reference).
    crate::heaps::session_ended(s.mode_word());
    session::release(s);
}

/// When the front-end's periodic turn is due (the poll may time out more
/// often, for the CPU timers' scans).
#[derive(Debug, Default)]
struct Ticks {
    last_ms: u64,
}

impl Ticks {
    fn due(&mut self, every_ms: u16) -> bool {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let now = ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000;
        if now.saturating_sub(self.last_ms) + 1 < u64::from(every_ms) {
            return false;
        }
        self.last_ms = now;
        true
    }
}

/// What a connecting thread is asked to do.
#[derive(Debug, Clone, Copy)]
struct Job {
    path: SocketPath,
    flags: u32,
    /// The session to watch, already connected by the constructor (its
    /// watcher reference passes to the thread); `None`: connect first.
    session: Option<&'static Session>,
}

/// Starts a thread that connects (if `session` is `None`) and then watches
/// the session. Call with the guard held: `pthread_create` allocates.
/// Returns false if the thread could not be created.
pub fn spawn(path: SocketPath, flags: u32, session: Option<&'static Session>) -> bool {
    debug_assert!(Guard::held());
    let job: Box<Job> = Box::new(Job {
        path,
        flags,
        session,
    });
    let arg = Box::into_raw(job);
    // SAFETY: standard pthread creation; the thread takes ownership of `arg`.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
        // Block every signal in the new thread: the program's handlers must
        // not run on it (it holds the guard, so they could not be profiled).
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut th: libc::pthread_t = 0;
        let rc = libc::pthread_create(&mut th, &attr, thread_main, arg.cast());
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 {
            drop(Box::from_raw(arg));
            return false;
        }
    }
    true
}

extern "C" fn thread_main(arg: *mut c_void) -> *mut c_void {
    // Everything this thread does passes through the hooks untouched.
    let _g = Guard::enter();
    // SAFETY: `spawn` passed a leaked Box<Job> that we now own.
    let job = unsafe { Box::from_raw(arg.cast::<Job>()) };
    // SAFETY: naming our own thread with a short NUL-terminated name.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), CLIENT_THREAD_NAME_C.as_ptr()) };
    // Before connecting (the hooks pass through until the session is
    // active), so that when the daemon sees the session, the front-end has
    // made every allocation reach the hooks (glibc, attached: the GOTs are
    // patched; they are put back after the session).
    let fe = frontend::get();
    let session = match (fe.before_connect)() {
        Ok(()) => job.session.or_else(|| connect(&job.path, job.flags)),
        Err(refusal) => {
            if let Some(s) = job.session {
                s.teardown(None);
                session::release(s);
            }
            let pid = nix::unistd::getpid().as_raw() as u32;
            let told = refusal.unprofilable != heapprofd_proto::wire::Unprofilable::None
                && crate::connect::notify_unprofilable(&job.path, pid, refusal.unprofilable);
            if !told {
                crate::log::log(b"heapprofd-rs: ", refusal.message);
            }
            None
        }
    };
    match session {
        Some(s) => watch(s),
        None => {
            let _ = STATE.compare_exchange(CONNECTING, IDLE, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
    (fe.after_session)();
    core::ptr::null_mut()
}
