//! A session: the ring buffer and socket the handshake produced, and
//! writing samples and frees into the ring.
//!
//! [`activate`] publishes a session and turns the hooks on (see
//! `state` for the switches); [`Session::teardown`] turns them off again.
//!
//! # Teardown and memory safety
//! A [`Session`] struct is allocated once per session and never freed (a few
//! KiB). Its ring-buffer mapping and socket are released only when
//! the session is retired *and* no writer is inside it: a writer increments
//! `writers`, then re-checks that the session is still the current one
//! (sequentially consistent), and only then touches the ring or the socket.
//! The retiring thread unpublishes the session first and sets `retired`
//! afterwards, so either it sees the writer, or the writer sees that the
//! session is gone. Each release on a retired session adds up `writers`;
//! the one that finds 0 (the last one out, in the sequentially consistent
//! order of the decrements) unmaps the ring and closes the socket. The
//! watcher thread counts as a writer for its whole life, so the socket is
//! never closed under it.
//!
//! `writers` is striped: each thread counts on the stripe its thread
//! pointer picks, a cache line of its own, and only the sum means anything
//! (a reference may be released by another thread than took it: a stripe
//! may wrap, the sum does not). One shared counter was a line every sample
//! and every sampled free of every thread moved between cores: in `record`
//! of 4 threads at 4 KiB its two read-modify-writes were most of
//! `sampled_free`'s time.

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::mem::ManuallyDrop;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::os::fd::RawFd;

use heapprofd_proto::socket::WAKE_BYTE;
use heapprofd_proto::wire::{
    self, CapturedRegs, ClientConfig, FreeRecord, HEAP_NAME_LEN, HeapNameRecord, MallocHeader,
};
use heapprofd_shmem::{ClientError, RingBuffer, WriteError, WriteMode};

use crate::adaptive::{self, AdaptiveInterval};
use crate::freeset::Removal;
use crate::state::{ACTIVE, IDLE, STATE, free_set, mode};
use crate::tls::{Guard, ThreadState};
use crate::{capture, contexts, stackreuse, thinning};

/// The active session, or null.
static SESSION: AtomicPtr<Session> = AtomicPtr::new(core::ptr::null_mut());
/// Source of unique session mode words (even, >= 2).
static NEXT_MODE_WORD: AtomicU64 = AtomicU64::new(2);

/// Counters for tests and debugging (never shared with the daemon).
pub(crate) static SAMPLES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// Everything a writer needs; the writer count striped on lines of its own.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Session {
    /// The writers inside, striped by thread (see the module docs).
    writers: [WriterStripe; WRITER_STRIPES],
    // Read-mostly.
    pub(crate) mode_word: u64,
    pub(crate) pid: i32,
    pub(crate) sock: RawFd,
    pub(crate) interval: u64,
    pub(crate) seed_base: u64,
    pub(crate) next_thread: AtomicU64,
    /// The daemon's configuration (the custom heaps' intervals).
    config: ClientConfig,
    pub(crate) max_stack: usize,
    write_mode: WriteMode,
    /// The `libc.malloc` interval under load (see `adaptive`).
    pub(crate) adaptive: AdaptiveInterval,
    rb: UnsafeCell<ManuallyDrop<RingBuffer>>,
    retired: AtomicBool,
    reclaimed: AtomicBool,
}

// SAFETY: the ring buffer is shared-memory plumbing built for concurrent
// writers; `rb` is only dropped once, by `reclaim`, when no writer is inside.
unsafe impl Sync for Session {}
// SAFETY: as above.
unsafe impl Send for Session {}

/// Stripes of [`Session::writers`].
const WRITER_STRIPES: usize = 16;

/// One stripe of the writer count, on a line pair of its own (adjacent-line
/// prefetch moves 128 bytes).
#[repr(C, align(128))]
#[derive(Debug)]
struct WriterStripe(AtomicU64);

/// The calling thread's stripe of [`Session::writers`].
#[inline(always)]
fn writer_stripe(s: &Session) -> &AtomicU64 {
    let t = crate::tls::state() as u64;
    let i = (t.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize % WRITER_STRIPES;
    &s.writers[i].0
}

/// What the handshake produced.
#[derive(Debug)]
pub(crate) struct SessionParams {
    pub pid: i32,
    pub sock: RawFd,
    pub interval: u64,
    pub seed: u64,
    pub config: ClientConfig,
    pub max_stack: u64,
    pub write_mode: WriteMode,
    pub rb: RingBuffer,
}

/// Publishes a new session and turns the hooks on. The caller (the watcher)
/// holds one writer reference, released with [`release`].
pub(crate) fn activate(p: SessionParams) -> Option<&'static Session> {
    if !free_set().map() {
        // SAFETY: the socket is ours; nothing else has seen it.
        unsafe { libc::close(p.sock) };
        return None;
    }
    free_set().clear();
    // Every allocation sampled: the set would filter nothing.
    free_set().arm(p.interval == 1);
    let mode_word = NEXT_MODE_WORD.fetch_add(2, Ordering::Relaxed);
    let seed_base = if p.seed != 0 { p.seed } else { random_seed() };
    // Cap a record at half the ring so one sample can never be refused as too large.
    let ring_cap = (p.rb.size() / 2).saturating_sub(MallocHeader::ENCODED_LEN + 64);
    let max_stack = match usize::try_from(p.max_stack) {
        Ok(0) | Err(_) => ring_cap,
        Ok(n) => n.min(ring_cap),
    };
    let s: &'static Session = Box::leak(Box::new(Session {
        writers: core::array::from_fn(|_| WriterStripe(AtomicU64::new(0))),
        mode_word,
        pid: p.pid,
        sock: p.sock,
        interval: p.interval,
        seed_base,
        next_thread: AtomicU64::new(0),
        config: p.config,
        max_stack,
        write_mode: p.write_mode,
        adaptive: AdaptiveInterval::new(p.config.adaptive_interval() && p.interval > 1),
        rb: UnsafeCell::new(ManuallyDrop::new(p.rb)),
        retired: AtomicBool::new(false),
        reclaimed: AtomicBool::new(false),
    }));
    // The caller's (the watcher's) reference.
    writer_stripe(s).fetch_add(1, Ordering::SeqCst);
    contexts::session_started(mode_word, s.config.context_filters());
    SESSION.store(s as *const Session as *mut Session, Ordering::SeqCst);
    STATE.store(ACTIVE, Ordering::SeqCst);
    mode().store(mode_word, Ordering::SeqCst);
    Some(s)
}

fn random_seed() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom fills the 8 bytes we pass.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, libc::GRND_NONBLOCK) };
    if n != 8 {
        let mut ts: libc::timespec = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        v = (ts.tv_sec as u64) << 30 ^ ts.tv_nsec as u64 ^ (std::process::id() as u64) << 48;
    }
    v | 1
}

/// Enters the session `mode_word` belongs to, if it is still the current
/// one. Pair with [`release`].
#[inline]
pub(crate) fn acquire(mode_word: u64) -> Option<&'static Session> {
    let p = SESSION.load(Ordering::Acquire);
    // SAFETY: sessions are never freed.
    let s = unsafe { p.as_ref() }?;
    writer_stripe(s).fetch_add(1, Ordering::SeqCst);
    if SESSION.load(Ordering::SeqCst) != p || s.mode_word != mode_word {
        release(s);
        return None;
    }
    Some(s)
}

/// Leaves a session entered with [`acquire`] (or the watcher's reference).
#[inline]
pub fn release(s: &Session) {
    writer_stripe(s).fetch_sub(1, Ordering::SeqCst);
    if s.retired.load(Ordering::SeqCst) && s.writers_inside() == 0 {
        s.reclaim();
    }
}

impl Session {
    /// How long a writer may wait for the reader: the ring's block timeout
    /// (for ever when writers wait for ever: the watcher's teardown, which
    /// sets the ring's shutdown flag, still ends the wait), or `default`
    /// when a full buffer drops records.
    pub(crate) fn wait_limit(&self, default: core::time::Duration) -> core::time::Duration {
        match self.write_mode {
            WriteMode::Block { timeout: Some(t) } => t,
            WriteMode::Block { timeout: None } => core::time::Duration::MAX,
            WriteMode::Drop => default,
        }
    }

    /// The daemon's configuration.
    pub(crate) fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// CPU-time profiling's period per thread in nanoseconds (0 = off).
    pub fn cpu_period_ns(&self) -> u64 {
        self.config.cpu_period_ns
    }

    /// The perf event each thread samples on and its period (event 0:
    /// none).
    pub fn perf_event(&self) -> (u32, u64) {
        (self.config.perf_event, self.config.perf_period)
    }

    /// The session's mode word (unique, even, >= 2).
    pub fn mode_word(&self) -> u64 {
        self.mode_word
    }

    /// Sampling interval of the custom heap called `name` (0 = not sampled).
    pub(crate) fn heap_interval(&self, name: &[u8; HEAP_NAME_LEN]) -> u64 {
        match wire::heap_name_str(name) {
            // libc.malloc is the hooks' heap, never a custom one.
            Ok(n) if n != wire::HEAP_LIBC_MALLOC_NAME => self.config.interval_for(n),
            _ => 0,
        }
    }

    /// Whether the calling process owns this session (see [`FORK_PAGE`]).
    #[inline]
    pub(crate) fn owns(&self) -> bool {
        owns_session(self)
    }

    #[inline(always)]
    pub(crate) fn rb(&self) -> &RingBuffer {
        // SAFETY: only `reclaim` drops it, once no writer (we are one) is inside.
        unsafe { &*self.rb.get() }
    }

    /// Ends the session: hooks back to pass-through, writers released, the
    /// daemon told (shutdown flag + socket shutdown). Idempotent.
    pub fn teardown(&self, error: Option<ClientError>) {
        let me = self as *const Session as *mut Session;
        if SESSION
            .compare_exchange(
                me,
                core::ptr::null_mut(),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            return;
        }
        mode().store(0, Ordering::SeqCst);
        free_set().disarm();
        contexts::session_ended();
        STATE.store(IDLE, Ordering::SeqCst);
        if let Some(e) = error {
            self.rb().set_client_error(e);
        }
        // Wakes writers blocked on a full buffer and tells the daemon.
        self.rb().set_shutdown();
        // SAFETY: the socket is open until reclaim, which cannot run before
        // we leave (the caller holds a writer reference or this is the watcher).
        unsafe { libc::shutdown(self.sock, libc::SHUT_RDWR) };
        self.retired.store(true, Ordering::SeqCst);
    }

    /// The writers inside: the sum of the stripes.
    fn writers_inside(&self) -> u64 {
        self.writers
            .iter()
            .fold(0u64, |n, w| n.wrapping_add(w.0.load(Ordering::SeqCst)))
    }

    fn reclaim(&self) {
        if self.reclaimed.swap(true, Ordering::SeqCst) {
            return;
        }
        // SAFETY: retired and no writer inside: nobody touches rb or sock again.
        unsafe {
            ManuallyDrop::drop(&mut *self.rb.get());
            libc::close(self.sock);
        }
    }

    /// The session's socket and ring, released in a forked child without
    /// telling anyone (the parent still owns the session).
    pub(crate) fn abandon_in_child(&self) {
        self.retired.store(true, Ordering::SeqCst);
        self.reclaim();
    }

    /// After a commit: wake the daemon if the commit said so (it sleeps, or
    /// the buffer is filling up). False = socket broken.
    pub(crate) fn wake_if(&self, needed: bool) -> bool {
        if !needed {
            return true;
        }
        let b = WAKE_BYTE;
        // SAFETY: sending one byte from a local on our socket.
        let n = unsafe {
            libc::send(
                self.sock,
                (&b as *const u8).cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        n == 1 || matches!(crate::errno::get(), libc::EAGAIN | libc::EINTR)
    }

    /// Handles a failed reservation. Returns nothing; counts or tears down.
    fn write_failed(&self, e: WriteError) {
        match e {
            WriteError::Full | WriteError::TooLarge => {
                SAMPLES_DROPPED.fetch_add(1, Ordering::Relaxed);
            }
            WriteError::Timeout => self.teardown(Some(ClientError::HitTimeout)),
            _ => self.teardown(None),
        }
    }

    /// Writes a malloc sample. `st` is the calling thread's state.
    ///
    /// Only the registers are taken here; the rest is
    /// [`Session::write_malloc`]'s, in a frame below the stack pointer
    /// taken, so that the record's header, its encoding and the copy's
    /// bookkeeping (900 bytes that change at every sample) are not part of
    /// the stack copied (with stack reuse, a sample sends what changed
    /// from the top of its stack down to its stack pointer).
    #[inline(never)]
    pub(crate) fn record_malloc(
        &self,
        st: *mut ThreadState,
        addr: *mut c_void,
        size: usize,
        sample_size: u64,
        heap_id: u32,
    ) -> bool {
        let mut regs = [0u64; capture::UNWIND_REGS];
        capture::capture_unwind_regs(&mut regs);
        self.write_malloc(st, &regs, addr, size, sample_size, heap_id)
    }

    /// The record of [`Session::record_malloc`], whose registers are `regs`.
    #[inline(never)]
    fn write_malloc(
        &self,
        st: *mut ThreadState,
        regs: &[u64; capture::UNWIND_REGS],
        addr: *mut c_void,
        size: usize,
        sample_size: u64,
        heap_id: u32,
    ) -> bool {
        let sp = regs[capture::SP_INDEX];
        // SAFETY: the calling thread's own block.
        let context_id = unsafe { (*st).context } >> 1;
        if context_id != 0 {
            contexts::ensure_sent(context_id, self.mode_word, |rec| self.write_small(rec));
        }
        let malloc_heap = heap_id == wire::HEAP_LIBC_MALLOC;
        let mut shift = if malloc_heap {
            // SAFETY: the calling thread's own block.
            u32::from(unsafe { (*st).interval_shift })
        } else {
            0
        };
        let mut flags = 0;
        let mut sample_size = sample_size;
        let mut reuse = None;
        let stack_len = match capture::stack_end_for(st, sp) {
            Some(end) => {
                let full = (end - sp) as usize;
                if full > self.max_stack {
                    flags |= MallocHeader::FLAG_STACK_TRUNCATED;
                    self.max_stack
                } else if self.config.stack_reuse()
                    && let Some(plan) =
                        stackreuse::plan(st, self.mode_word, self.rb().stack_resync(), sp, end)
                {
                    flags |= MallocHeader::FLAG_STACK_BASE;
                    let fresh = full - plan.reused;
                    reuse = Some((plan, end));
                    fresh
                } else {
                    full
                }
            }
            None => {
                flags |= MallocHeader::FLAG_NO_STACK;
                0
            }
        };
        if malloc_heap {
            // SAFETY: the calling thread's own block.
            let sampler = unsafe { &mut (*st).sampler };
            let len = MallocHeader::ENCODED_LEN + stack_len;
            let sent = thinning::thin(
                self.rb(),
                &self.adaptive,
                sampler,
                shift,
                size as u64,
                sample_size,
                len,
            );
            // Thinned away: no record, and the block stays out of the free set.
            let Some(sent) = sent else {
                return false;
            };
            (sample_size, shift) = sent;
        }
        flags |= shift << MallocHeader::INTERVAL_SHIFT_BIT;
        let now_ns = coarse_now_ns();
        let mut fixed = [0u8; MallocHeader::ENCODED_LEN];
        MallocHeader {
            flags,
            sequence: 0,
            alloc_size: size as u64,
            sample_size,
            address: addr as u64,
            timestamp_ns: now_ns,
            context_id,
            tid: capture::tid(st),
            heap_id,
            arch: capture::NATIVE_ARCH,
            stack_pointer: sp,
            stack_len: stack_len as u64,
            stack_reused: reuse.as_ref().map_or(0, |(p, _)| p.reused as u32),
            regs: CapturedRegs(regs),
        }
        .encode_into(&mut fixed);
        let mut r = match self
            .rb()
            .begin_write(MallocHeader::ENCODED_LEN + stack_len, self.write_mode)
        {
            Ok(r) => r,
            Err(e) => {
                self.write_failed(e);
                return false;
            }
        };
        if malloc_heap {
            let ring_size = self.rb().size() as u64;
            self.adaptive
                .observe(r.used_after(), ring_size, r.end_pos(), r.waited(), now_ns);
        }
        r.write_at(0, &fixed);
        // SAFETY: [sp, sp + stack_len) (with reuse: [sp, end), of which
        // stack_len bytes are copied) is this thread's live stack (within
        // the bounds found above), and the reservation has room for those
        // bytes after the header.
        unsafe {
            let dst = r.as_mut_ptr().add(MallocHeader::ENCODED_LEN);
            match &reuse {
                Some((plan, end)) => stackreuse::copy(plan, sp, *end, dst),
                None => capture::copy_to_ring(dst, sp as *const u8, stack_len),
            }
        }
        let wake = r.commit();
        if !self.wake_if(wake) {
            self.teardown(None);
        }
        // The next sample of a thread usually has a stack like this one:
        // start owning those ring lines now, while the program runs on.
        // (Large copies use non-temporal stores, which need no ownership;
        // prefetching those would only evict the program's data.)
        if stack_len < capture::NT_COPY_MIN {
            self.rb()
                .prefetch_next(MallocHeader::ENCODED_LEN + stack_len);
        }
        true
    }

    /// Writes a heap declaration; false if it could not be written.
    pub(crate) fn record_heap_name(
        &self,
        heap_id: u32,
        interval: u64,
        name: &[u8; HEAP_NAME_LEN],
    ) -> bool {
        let rec = HeapNameRecord {
            heap_id,
            interval,
            name: *name,
        }
        .encode();
        self.write_small(&rec)
    }

    /// Writes a free record.
    pub(crate) fn record_free(&self, addr: u64, heap_id: u32) {
        let rec = FreeRecord {
            sequence: 0,
            address: addr,
            heap_id,
        }
        .encode();
        self.write_small(&rec);
    }

    /// Writes one small encoded record whole from a signal handler: never
    /// waits for room, never tears down; false if it was not written.
    pub(crate) fn write_small_dropping(&self, rec: &[u8]) -> bool {
        match self.rb().begin_write(rec.len(), WriteMode::Drop) {
            Ok(mut r) => {
                r.write_at(0, rec);
                let _ = self.wake_if(r.commit());
                true
            }
            Err(_) => false,
        }
    }

    /// Writes one small encoded record whole; false if it could not be
    /// written (the failure counted, or the session torn down).
    #[inline]
    fn write_small(&self, rec: &[u8]) -> bool {
        match self.rb().begin_write(rec.len(), self.write_mode) {
            Ok(mut r) => {
                r.write_at(0, rec);
                let wake = r.commit();
                if !self.wake_if(wake) {
                    self.teardown(None);
                    return false;
                }
                true
            }
            Err(e) => {
                self.write_failed(e);
                false
            }
        }
    }
}

fn coarse_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; served by the vDSO.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// One page mapped with `MADV_WIPEONFORK` holding a non-zero byte: it reads
/// non-zero in this process and in anything sharing our memory (threads,
/// vfork and `clone(CLONE_VM)` children, whose allocations really are made
/// in our heap), and zero in a child forked without our atfork handler (a
/// raw `fork` syscall), whose copy of the session must stay silent. Null
/// until first used; `usize::MAX` when the kernel refused the madvise.
static FORK_PAGE: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());

/// Whether the calling process owns the session `s` (see [`FORK_PAGE`]).
/// One load on the sampled paths; a `getpid` system call only on kernels
/// without `MADV_WIPEONFORK` (before 4.14).
#[inline]
fn owns_session(s: &Session) -> bool {
    let mut p = FORK_PAGE.load(Ordering::Acquire);
    if p.is_null() {
        p = init_fork_page();
    }
    if p as usize == usize::MAX {
        // SAFETY: getpid has no preconditions.
        return unsafe { libc::getpid() } == s.pid;
    }
    // SAFETY: a page we mapped and never unmap.
    unsafe { p.read_volatile() != 0 }
}

#[cold]
fn init_fork_page() -> *mut u8 {
    // SAFETY: a fresh anonymous page; madvise on it alone.
    let page = unsafe {
        let p = libc::mmap(
            core::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            usize::MAX as *mut u8
        } else if libc::madvise(p, 4096, libc::MADV_WIPEONFORK) != 0 {
            libc::munmap(p, 4096);
            usize::MAX as *mut u8
        } else {
            p.cast::<u8>().write_volatile(1);
            p.cast::<u8>()
        }
    };
    match FORK_PAGE.compare_exchange(
        core::ptr::null_mut(),
        page,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => page,
        Err(winner) => {
            if page as usize != usize::MAX {
                // SAFETY: our own page, never published.
                unsafe { libc::munmap(page.cast(), 4096) };
            }
            winner
        }
    }
}

/// A sampled allocation on the calling thread (guard held by the caller).
pub(crate) fn sampled_alloc(g: &Guard, mode_word: u64, addr: *mut c_void, size: usize, ss: u64) {
    let insert = !free_set().bypassed();
    if insert {
        free_set().prefetch_insert(addr as u64);
    }
    let Some(s) = acquire(mode_word) else { return };
    if owns_session(s)
        && s.record_malloc(g.thread(), addr, size, ss, wire::HEAP_LIBC_MALLOC)
        && insert
    {
        free_set().insert(addr as u64);
    }
    take_session_interval(g.thread(), s);
    release(s);
}

/// Moves the calling thread's sampler to the session's current interval
/// (see `adaptive`), after its sample was written at the old one.
#[inline(always)]
fn take_session_interval(st: *mut ThreadState, s: &Session) {
    let shift = s.adaptive.shift();
    // SAFETY: the calling thread's own block.
    unsafe {
        // The shift only moves in sessions that adapt (interval > 1).
        if u32::from((*st).interval_shift) != shift {
            (*st).sampler = (*st).sampler.retuned(adaptive::raised(s.interval, shift));
            (*st).interval_shift = shift as u8;
        }
    }
}

/// A free (or the free half of a realloc) of an address the free set may
/// hold. Returns true if a free record was sent for an address of the set
/// (for every address while the set is bypassed).
pub(crate) fn sampled_free(mode_word: u64, addr: u64) -> bool {
    let Some(_g) = Guard::enter() else {
        return false;
    };
    let set = free_set();
    let Some(s) = acquire(mode_word) else {
        return false;
    };
    // Bypassed, every free counts as one of the set's.
    let removal = if !owns_session(s) {
        Removal::Absent
    } else if set.bypassed() {
        Removal::Found
    } else {
        set.remove(addr)
    };
    if removal != Removal::Absent {
        s.record_free(addr, wire::HEAP_LIBC_MALLOC);
    }
    release(s);
    removal == Removal::Found
}

/// Sets a thread's sampler up for the session `mode_word`. False if that
/// session is gone.
#[cold]
#[inline(never)]
pub(crate) fn init_thread(st: *mut ThreadState, mode_word: u64) -> bool {
    let Some(s) = acquire(mode_word) else {
        return false;
    };
    let n = s.next_thread.fetch_add(1, Ordering::Relaxed);
    let seed = crate::sampler::mix64(s.seed_base ^ crate::sampler::mix64(n.wrapping_add(1)));
    // SAFETY: the calling thread's own block.
    unsafe {
        // Interval 0: the configuration leaves libc.malloc out.
        let shift = s.adaptive.shift();
        (*st).sampler = if s.interval == 0 {
            crate::sampler::Sampler::disabled()
        } else {
            crate::sampler::Sampler::new(adaptive::raised(s.interval, shift), seed)
        };
        (*st).interval_shift = shift as u8;
        (*st).mode_seen = mode_word;
    }
    contexts::init_thread(st);
    release(s);
    true
}

/// In a forked child: forget the parent's session without touching it.
pub(crate) fn forget_in_child() {
    let p = SESSION.swap(core::ptr::null_mut(), Ordering::SeqCst);
    mode().store(0, Ordering::SeqCst);
    free_set().disarm();
    STATE.store(IDLE, Ordering::SeqCst);
    // SAFETY: sessions are never freed.
    if let Some(s) = unsafe { p.as_ref() } {
        s.abandon_in_child();
    }
}

/// Ends the current session, if there is one: a front-end starting a new
/// session in its place (bionic re-initializes heapprofd for a new profile
/// while the old session may still be open). Its watcher releases it and
/// exits on its next turn. True if a session was ended.
pub fn end_current() -> bool {
    let p = SESSION.load(Ordering::Acquire);
    // SAFETY: sessions are never freed.
    let Some(s) = (unsafe { p.as_ref() }) else {
        return false;
    };
    writer_stripe(s).fetch_add(1, Ordering::SeqCst);
    let current = SESSION.load(Ordering::SeqCst) == p;
    if current {
        s.teardown(None);
    }
    release(s);
    current
}

/// Whether the session has been retired (the watcher's loop condition).
pub(crate) fn is_retired(s: &Session) -> bool {
    s.retired.load(Ordering::SeqCst)
}
