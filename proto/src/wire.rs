//! Client/daemon wire format: fixed, explicit little-endian layouts.
//!
//! Two kinds of messages cross the process boundary:
//!
//! * **Socket messages**, exchanged once per session over the UNIX socket:
//!   [`Handshake`] (client -> daemon, together with the client's
//!   `/proc/self/maps` and `/proc/self/mem` descriptors) and [`ClientConfig`]
//!   (daemon -> client, together with the ring-buffer memfd).
//! * **Ring-buffer records**, written by the client into the shared-memory
//!   ring buffer: [`MallocHeader`] followed by raw stack bytes, [`FreeRecord`]
//!   and [`HeapNameRecord`]. Every record starts with a `u32` [`RecordKind`]
//!   and a `u32` of flags.
//!
//! Every layout is pinned: each type has an `ENCODED_LEN` constant checked at
//! compile time against the field list, encoding writes every byte (padding
//! included) so nothing uninitialised ever reaches shared memory, and decoding
//! returns a typed [`DecodeError`] for every malformed input instead of
//! panicking. The daemon decodes bytes the client (or anything else that got
//! hold of the memfd) wrote, so decoding must treat its input as hostile.
//!
//! Layouts are little-endian on every architecture. All 64-bit fields sit at
//! 8-byte offsets so a 32-bit client would produce the same bytes.

use core::fmt;

/// `b"HPRS"` read as a little-endian `u32`; first field of the socket messages.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HPRS");

/// Protocol versions. Bump [`version::CURRENT`] on any layout change; the
/// daemon refuses clients whose version it does not speak.
pub mod version {
    /// The first protocol version.
    pub const V1: u32 = 1;
    /// The version this build speaks.
    pub const CURRENT: u32 = V1;
}

/// Longest heap name in bytes (including no terminator; names are padded with NUL).
pub const HEAP_NAME_LEN: usize = 64;
/// Number of heap slots in [`ClientConfig`].
pub const MAX_HEAPS: usize = 16;
/// Number of 64-bit register slots carried by a malloc sample.
pub const MAX_REGS: usize = 34;
/// Heap id of the glibc malloc family.
pub const HEAP_LIBC_MALLOC: u32 = 0;
/// Name of heap [`HEAP_LIBC_MALLOC`], as heapprofd and the Perfetto UI call it.
pub const HEAP_LIBC_MALLOC_NAME: &str = "libc.malloc";

/// Error returned when bytes do not form a valid message.
///
/// `Copy` and allocation-free so the client can use it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the fixed layout needs.
    Truncated {
        /// Bytes the layout needs.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The first word is not [`MAGIC`].
    BadMagic(u32),
    /// The peer speaks a protocol version we do not.
    UnsupportedVersion(u32),
    /// The record kind is not one of [`RecordKind`].
    UnknownKind(u32),
    /// The record kind is valid but not the one the caller asked for.
    WrongKind {
        /// Kind the caller expected.
        expected: u32,
        /// Kind found in the bytes.
        found: u32,
    },
    /// The architecture tag is not one of [`Arch`].
    UnknownArch(u32),
    /// The declared stack length disagrees with the bytes that follow.
    StackLength {
        /// Length declared in the header.
        declared: u64,
        /// Bytes actually present after the header.
        available: usize,
    },
    /// A heap name is not UTF-8 or has bytes after its NUL terminator.
    BadHeapName,
    /// More heaps declared than [`MAX_HEAPS`].
    TooManyHeaps(u32),
    /// A field has a value outside its documented range.
    InvalidField(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated { need, have } => {
                write!(f, "message truncated: need {need} bytes, have {have}")
            }
            Self::BadMagic(m) => write!(f, "bad magic {m:#010x} (not a heapprofd-rs peer)"),
            Self::UnsupportedVersion(v) => write!(
                f,
                "unsupported protocol version {v} (this build speaks {})",
                version::CURRENT
            ),
            Self::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            Self::WrongKind { expected, found } => {
                write!(f, "expected record kind {expected}, found {found}")
            }
            Self::UnknownArch(a) => write!(f, "unknown architecture tag {a}"),
            Self::StackLength {
                declared,
                available,
            } => write!(
                f,
                "stack length {declared} does not match the {available} bytes present"
            ),
            Self::BadHeapName => write!(f, "heap name is not NUL-padded UTF-8"),
            Self::TooManyHeaps(n) => write!(f, "{n} heaps declared, at most {MAX_HEAPS} allowed"),
            Self::InvalidField(name) => write!(f, "field `{name}` out of range"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// CPU architecture of the client, which decides how [`RegisterFile`] is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Arch {
    /// x86_64: DWARF register numbers 0..=16 (rax, rdx, rcx, rbx, rsi, rdi,
    /// rbp, rsp, r8..r15, rip).
    X86_64 = 1,
    /// AArch64: DWARF register numbers 0..=31 (x0..x30, sp), and the pc in slot 32.
    Aarch64 = 2,
}

impl Arch {
    /// The architecture this code is compiled for, if supported.
    pub const fn native() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    /// Decodes an architecture tag.
    pub fn from_u32(v: u32) -> Result<Arch, DecodeError> {
        match v {
            1 => Ok(Arch::X86_64),
            2 => Ok(Arch::Aarch64),
            other => Err(DecodeError::UnknownArch(other)),
        }
    }

    /// Register slots that hold the stack pointer and instruction pointer.
    pub const fn sp_ip_slots(self) -> (usize, usize) {
        match self {
            Arch::X86_64 => (x86_64::RSP, x86_64::RIP),
            Arch::Aarch64 => (aarch64::SP, aarch64::PC),
        }
    }
}

/// Register slot numbers for x86_64 (DWARF numbering).
pub mod x86_64 {
    /// rbx.
    pub const RBX: usize = 3;
    /// Frame pointer.
    pub const RBP: usize = 6;
    /// Stack pointer.
    pub const RSP: usize = 7;
    /// Instruction pointer.
    pub const RIP: usize = 16;
}

/// Register slot numbers for AArch64 (DWARF numbering, pc in slot 32).
pub mod aarch64 {
    /// Frame pointer (x29).
    pub const FP: usize = 29;
    /// Link register (x30).
    pub const LR: usize = 30;
    /// Stack pointer.
    pub const SP: usize = 31;
    /// Program counter.
    pub const PC: usize = 32;
}

/// Raw register values captured at the allocation site; layout by [`Arch`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RegisterFile(pub [u64; MAX_REGS]);

impl Default for RegisterFile {
    fn default() -> Self {
        RegisterFile([0; MAX_REGS])
    }
}

impl fmt::Debug for RegisterFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for r in &self.0 {
            l.entry(&format_args!("{r:#x}"));
        }
        l.finish()
    }
}

/// Kind tag at the start of every ring-buffer record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum RecordKind {
    /// [`MallocHeader`] + stack bytes.
    Malloc = 1,
    /// [`FreeRecord`].
    Free = 2,
    /// [`HeapNameRecord`].
    HeapName = 3,
}

impl RecordKind {
    /// Decodes a kind tag.
    pub fn from_u32(v: u32) -> Result<RecordKind, DecodeError> {
        match v {
            1 => Ok(RecordKind::Malloc),
            2 => Ok(RecordKind::Free),
            3 => Ok(RecordKind::HeapName),
            other => Err(DecodeError::UnknownKind(other)),
        }
    }
}

/// Bounds-checked little-endian writer over a byte slice.
///
/// Callers size the slice with the type's `ENCODED_LEN`, so the checks never
/// fail in practice; they exist so that a mistake is a short write, not UB.
struct Put<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Put<'_> {
    #[inline(always)]
    fn bytes(&mut self, b: &[u8]) {
        if let Some(dst) = self.buf.get_mut(self.pos..self.pos + b.len()) {
            dst.copy_from_slice(b);
        }
        self.pos += b.len();
    }
    #[inline(always)]
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    #[inline(always)]
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// Little-endian reader that has already checked the total length.
struct Get<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Get<'a> {
    fn new(buf: &'a [u8], need: usize) -> Result<Self, DecodeError> {
        if buf.len() < need {
            return Err(DecodeError::Truncated {
                need,
                have: buf.len(),
            });
        }
        Ok(Get { buf, pos: 0 })
    }
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        // The constructor checked the length; a short read here would be a bug
        // in a layout constant, and yields zeros rather than a panic.
        if let Some(src) = self.buf.get(self.pos..self.pos + N) {
            out.copy_from_slice(src);
        }
        self.pos += N;
        out
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}

fn encode_name(p: &mut Put<'_>, name: &[u8; HEAP_NAME_LEN]) {
    p.bytes(name);
}

/// Turns a string into a NUL-padded name field; `None` if it is too long or has a NUL.
pub fn heap_name_field(name: &str) -> Option<[u8; HEAP_NAME_LEN]> {
    let b = name.as_bytes();
    if b.len() > HEAP_NAME_LEN || b.contains(&0) {
        return None;
    }
    let mut out = [0u8; HEAP_NAME_LEN];
    out[..b.len()].copy_from_slice(b);
    Some(out)
}

/// Validates a NUL-padded name field and returns it as a string.
pub fn heap_name_str(field: &[u8; HEAP_NAME_LEN]) -> Result<&str, DecodeError> {
    let len = field.iter().position(|&b| b == 0).unwrap_or(HEAP_NAME_LEN);
    if field[len..].iter().any(|&b| b != 0) {
        return Err(DecodeError::BadHeapName);
    }
    core::str::from_utf8(&field[..len]).map_err(|_| DecodeError::BadHeapName)
}

fn check_kind(g: &mut Get<'_>, expected: RecordKind) -> Result<u32, DecodeError> {
    let kind = g.u32();
    let kind_ok = RecordKind::from_u32(kind)?;
    if kind_ok != expected {
        return Err(DecodeError::WrongKind {
            expected: expected as u32,
            found: kind,
        });
    }
    Ok(g.u32())
}

// ---------------------------------------------------------------------------
// Socket messages.
// ---------------------------------------------------------------------------

/// Client -> daemon, first message on the socket (Since [`version::V1`]).
///
/// Sent with two descriptors attached (SCM_RIGHTS), in this order: the
/// client's `/proc/self/maps` and `/proc/self/mem`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshake {
    /// Protocol version the client speaks.
    pub version: u32,
    /// Client process id (as the client sees it).
    pub pid: u32,
    /// Client architecture.
    pub arch: Arch,
    /// Client page size in bytes.
    pub page_size: u32,
    /// [`Handshake::FLAG_FROM_STARTUP`] and friends.
    pub flags: u32,
    /// Start of the client library's executable code, so the daemon can drop
    /// its frames whatever the library file is called (0 if unknown).
    pub client_text_start: u64,
    /// End (exclusive) of the client library's executable code.
    pub client_text_end: u64,
}

impl Handshake {
    /// Bytes on the wire.
    pub const ENCODED_LEN: usize = 64;
    /// The client connected from its constructor (profiling from process start).
    pub const FLAG_FROM_STARTUP: u32 = 1;
    /// The client was woken by the activation signal (attach to a running process).
    pub const FLAG_FROM_SIGNAL: u32 = 2;
    /// The client was injected by `record --pid` and patched GOT entries.
    pub const FLAG_INJECTED: u32 = 4;

    /// Encodes into exactly [`Self::ENCODED_LEN`] bytes.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let mut p = Put {
            buf: &mut out,
            pos: 0,
        };
        p.u32(MAGIC);
        p.u32(self.version);
        p.u32(self.pid);
        p.u32(self.arch as u32);
        p.u32(self.page_size);
        p.u32(self.flags);
        p.u64(self.client_text_start);
        p.u64(self.client_text_end);
        // 40 bytes used; the rest is reserved and zero.
        out
    }

    /// Decodes and validates magic, version and architecture.
    pub fn decode(buf: &[u8]) -> Result<Handshake, DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let magic = g.u32();
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        let version = g.u32();
        if version != version::CURRENT {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let pid = g.u32();
        let arch = Arch::from_u32(g.u32())?;
        let page_size = g.u32();
        if !page_size.is_power_of_two() || page_size < 1024 {
            return Err(DecodeError::InvalidField("page_size"));
        }
        let flags = g.u32();
        let client_text_start = g.u64();
        let client_text_end = g.u64();
        if client_text_end < client_text_start {
            return Err(DecodeError::InvalidField("client_text_end"));
        }
        Ok(Handshake {
            version,
            pid,
            arch,
            page_size,
            flags,
            client_text_start,
            client_text_end,
        })
    }
}

/// What a forked child of a profiled process does with the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum ForkPolicy {
    /// The child turns its hooks into pass-through and never writes to the
    /// parent's ring buffer (default).
    #[default]
    Teardown = 0,
}

/// Sampling settings for one named heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapConfig {
    /// NUL-padded heap name (see [`heap_name_field`]).
    pub name: [u8; HEAP_NAME_LEN],
    /// Mean bytes between samples; 0 disables the heap.
    pub interval: u64,
}

/// Daemon -> client, the session configuration (Since [`version::V1`]).
///
/// Sent with one descriptor attached: the ring-buffer memfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// Protocol version the daemon speaks.
    pub version: u32,
    /// Default mean sampling interval in bytes (1 = every allocation).
    pub sampling_interval: u64,
    /// With [`ClientConfig::FLAG_BLOCK_CLIENT`]: how long a writer waits for
    /// space before the session ends with an error; 0 = wait forever.
    pub block_timeout_us: u64,
    /// Size in bytes of the ring buffer's data area (the memfd is one page larger).
    pub shmem_size: u64,
    /// Seed for the sampler; 0 = pick one at random. Non-zero seeds make
    /// sampling reproducible (tests).
    pub seed: u64,
    /// Largest stack copy per sample in bytes; 0 = the whole stack.
    pub max_stack_bytes: u64,
    /// Bit set of `FLAG_*`.
    pub flags: u32,
    /// What forked children do.
    pub fork_policy: ForkPolicy,
    /// Number of valid entries in `heaps`.
    pub num_heaps: u32,
    /// Per-heap settings; only the first `num_heaps` are meaningful.
    pub heaps: [HeapConfig; MAX_HEAPS],
}

impl ClientConfig {
    /// Bytes on the wire.
    pub const ENCODED_LEN: usize = 72 + MAX_HEAPS * (HEAP_NAME_LEN + 8);
    /// When the buffer is full, wait (up to `block_timeout_us`) instead of dropping.
    pub const FLAG_BLOCK_CLIENT: u32 = 1;

    /// A configuration sampling `libc.malloc` every `interval` bytes.
    pub fn new(sampling_interval: u64, shmem_size: u64) -> ClientConfig {
        let empty = HeapConfig {
            name: [0; HEAP_NAME_LEN],
            interval: 0,
        };
        let mut heaps = [empty; MAX_HEAPS];
        heaps[0] = HeapConfig {
            name: heap_name_field(HEAP_LIBC_MALLOC_NAME).unwrap_or([0; HEAP_NAME_LEN]),
            interval: sampling_interval,
        };
        ClientConfig {
            version: version::CURRENT,
            sampling_interval,
            block_timeout_us: 0,
            shmem_size,
            seed: 0,
            max_stack_bytes: 0,
            flags: 0,
            fork_policy: ForkPolicy::Teardown,
            num_heaps: 1,
            heaps,
        }
    }

    /// Whether writers block when the buffer is full.
    pub fn block_client(&self) -> bool {
        self.flags & Self::FLAG_BLOCK_CLIENT != 0
    }

    /// Sampling interval for the heap called `name`: its own entry if listed,
    /// else the default interval.
    pub fn interval_for(&self, name: &str) -> u64 {
        self.heaps[..self.num_heaps as usize]
            .iter()
            .find(|h| heap_name_str(&h.name) == Ok(name))
            .map_or(self.sampling_interval, |h| h.interval)
    }

    /// Encodes into exactly [`Self::ENCODED_LEN`] bytes.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let mut p = Put {
            buf: &mut out,
            pos: 0,
        };
        p.u32(MAGIC);
        p.u32(self.version);
        p.u64(self.sampling_interval);
        p.u64(self.block_timeout_us);
        p.u64(self.shmem_size);
        p.u64(self.seed);
        p.u64(self.max_stack_bytes);
        p.u32(self.flags);
        p.u32(self.fork_policy as u32);
        p.u32(self.num_heaps);
        p.u32(0);
        p.u64(0); // reserved
        for h in &self.heaps {
            encode_name(&mut p, &h.name);
            p.u64(h.interval);
        }
        out
    }

    /// Decodes and validates every field.
    pub fn decode(buf: &[u8]) -> Result<ClientConfig, DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let magic = g.u32();
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        let version = g.u32();
        if version != version::CURRENT {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let sampling_interval = g.u64();
        if sampling_interval == 0 {
            return Err(DecodeError::InvalidField("sampling_interval"));
        }
        let block_timeout_us = g.u64();
        let shmem_size = g.u64();
        let seed = g.u64();
        let max_stack_bytes = g.u64();
        let flags = g.u32();
        let fork_policy = match g.u32() {
            0 => ForkPolicy::Teardown,
            _ => return Err(DecodeError::InvalidField("fork_policy")),
        };
        let num_heaps = g.u32();
        if num_heaps as usize > MAX_HEAPS {
            return Err(DecodeError::TooManyHeaps(num_heaps));
        }
        let _pad = g.u32();
        let _reserved = g.u64();
        let empty = HeapConfig {
            name: [0; HEAP_NAME_LEN],
            interval: 0,
        };
        let mut heaps = [empty; MAX_HEAPS];
        for h in heaps.iter_mut() {
            h.name = g.array();
            h.interval = g.u64();
            heap_name_str(&h.name)?;
        }
        Ok(ClientConfig {
            version,
            sampling_interval,
            block_timeout_us,
            shmem_size,
            seed,
            max_stack_bytes,
            flags,
            fork_policy,
            num_heaps,
            heaps,
        })
    }
}

// ---------------------------------------------------------------------------
// Ring-buffer records.
// ---------------------------------------------------------------------------

/// Fixed part of a malloc sample; the raw stack bytes follow it directly.
///
/// The stack copy starts at `stack_pointer` and is `stack_len` bytes long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MallocHeader {
    /// [`MallocHeader::FLAG_STACK_TRUNCATED`] and friends.
    pub flags: u32,
    /// Global sequence number shared by mallocs and frees of the process.
    pub sequence: u64,
    /// Size the program asked for.
    pub alloc_size: u64,
    /// Bytes this sample stands for (>= `alloc_size` when sampled below the interval).
    pub sample_size: u64,
    /// Address returned to the program.
    pub address: u64,
    /// CLOCK_MONOTONIC_COARSE, nanoseconds.
    pub timestamp_ns: u64,
    /// User context label (reserved; 0 = none).
    pub context_id: u64,
    /// Kernel thread id of the allocating thread.
    pub tid: u32,
    /// Heap the allocation belongs to.
    pub heap_id: u32,
    /// How to read `regs`.
    pub arch: Arch,
    /// Address of the first stack byte copied.
    pub stack_pointer: u64,
    /// Number of stack bytes that follow the header.
    pub stack_len: u64,
    /// Registers at the capture point.
    pub regs: RegisterFile,
}

impl MallocHeader {
    /// Bytes of the fixed part on the wire.
    pub const ENCODED_LEN: usize = 88 + MAX_REGS * 8;
    /// The stack copy was cut short (cap reached); unwinding may stop early.
    pub const FLAG_STACK_TRUNCATED: u32 = 1;
    /// The stack bounds of the thread were unknown; only registers were sent.
    pub const FLAG_NO_STACK: u32 = 2;

    /// Encodes the fixed part into `out[..ENCODED_LEN]`.
    #[inline]
    pub fn encode_into(&self, out: &mut [u8; Self::ENCODED_LEN]) {
        let mut p = Put { buf: out, pos: 0 };
        p.u32(RecordKind::Malloc as u32);
        p.u32(self.flags);
        p.u64(self.sequence);
        p.u64(self.alloc_size);
        p.u64(self.sample_size);
        p.u64(self.address);
        p.u64(self.timestamp_ns);
        p.u64(self.context_id);
        p.u32(self.tid);
        p.u32(self.heap_id);
        p.u32(self.arch as u32);
        p.u32(0);
        p.u64(self.stack_pointer);
        p.u64(self.stack_len);
        for r in &self.regs.0 {
            p.u64(*r);
        }
    }

    /// Decodes a whole malloc record: the header and the stack bytes after it.
    ///
    /// Trailing bytes beyond `stack_len` (ring-buffer padding) are allowed up
    /// to 7; anything else is a [`DecodeError::StackLength`].
    pub fn decode(buf: &[u8]) -> Result<(MallocHeader, &[u8]), DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let flags = check_kind(&mut g, RecordKind::Malloc)?;
        let sequence = g.u64();
        let alloc_size = g.u64();
        let sample_size = g.u64();
        let address = g.u64();
        let timestamp_ns = g.u64();
        let context_id = g.u64();
        let tid = g.u32();
        let heap_id = g.u32();
        let arch = Arch::from_u32(g.u32())?;
        let _pad = g.u32();
        let stack_pointer = g.u64();
        let stack_len = g.u64();
        let mut regs = RegisterFile::default();
        for r in regs.0.iter_mut() {
            *r = g.u64();
        }
        let rest = &buf[Self::ENCODED_LEN..];
        let ok_len = usize::try_from(stack_len)
            .ok()
            .filter(|&n| n <= rest.len() && rest.len() - n < 8);
        let Some(n) = ok_len else {
            return Err(DecodeError::StackLength {
                declared: stack_len,
                available: rest.len(),
            });
        };
        if stack_pointer.checked_add(stack_len).is_none() {
            return Err(DecodeError::InvalidField("stack_pointer"));
        }
        let header = MallocHeader {
            flags,
            sequence,
            alloc_size,
            sample_size,
            address,
            timestamp_ns,
            context_id,
            tid,
            heap_id,
            arch,
            stack_pointer,
            stack_len,
            regs,
        };
        Ok((header, &rest[..n]))
    }
}

/// A free (or the free half of a realloc) of a possibly sampled address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeRecord {
    /// Global sequence number shared with mallocs.
    pub sequence: u64,
    /// Address passed to free.
    pub address: u64,
    /// Heap the address belongs to.
    pub heap_id: u32,
}

impl FreeRecord {
    /// Bytes on the wire.
    pub const ENCODED_LEN: usize = 32;

    /// Encodes into exactly [`Self::ENCODED_LEN`] bytes.
    #[inline]
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let mut p = Put {
            buf: &mut out,
            pos: 0,
        };
        p.u32(RecordKind::Free as u32);
        p.u32(0);
        p.u64(self.sequence);
        p.u64(self.address);
        p.u32(self.heap_id);
        p.u32(0);
        out
    }

    /// Decodes a free record (trailing padding allowed).
    pub fn decode(buf: &[u8]) -> Result<FreeRecord, DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let _flags = check_kind(&mut g, RecordKind::Free)?;
        let sequence = g.u64();
        let address = g.u64();
        let heap_id = g.u32();
        Ok(FreeRecord {
            sequence,
            address,
            heap_id,
        })
    }
}

/// Declares (or re-declares, after an interval change) a heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapNameRecord {
    /// Heap id used by later records.
    pub heap_id: u32,
    /// Current sampling interval of the heap.
    pub interval: u64,
    /// NUL-padded name; empty keeps the previous name (interval change only).
    pub name: [u8; HEAP_NAME_LEN],
}

impl HeapNameRecord {
    /// Bytes on the wire.
    pub const ENCODED_LEN: usize = 24 + HEAP_NAME_LEN;

    /// Encodes into exactly [`Self::ENCODED_LEN`] bytes.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let mut p = Put {
            buf: &mut out,
            pos: 0,
        };
        p.u32(RecordKind::HeapName as u32);
        p.u32(0);
        p.u32(self.heap_id);
        p.u32(0);
        p.u64(self.interval);
        encode_name(&mut p, &self.name);
        out
    }

    /// Decodes a heap-name record and validates the name.
    pub fn decode(buf: &[u8]) -> Result<HeapNameRecord, DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let _flags = check_kind(&mut g, RecordKind::HeapName)?;
        let heap_id = g.u32();
        let _pad = g.u32();
        let interval = g.u64();
        let name = g.array();
        heap_name_str(&name)?;
        Ok(HeapNameRecord {
            heap_id,
            interval,
            name,
        })
    }

    /// The heap name as a string (validated by `decode`).
    pub fn name_str(&self) -> &str {
        heap_name_str(&self.name).unwrap_or("")
    }
}

/// Any ring-buffer record, borrowed from the bytes it was decoded from.
// Records are decoded one at a time and consumed at once; boxing the malloc
// header would cost an allocation per sample for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// A sampled allocation and its raw stack.
    Malloc(MallocHeader, &'a [u8]),
    /// A free of a possibly sampled address.
    Free(FreeRecord),
    /// A heap declaration.
    HeapName(HeapNameRecord),
}

impl<'a> Record<'a> {
    /// Decodes any record by its kind tag. Never panics, whatever the bytes.
    pub fn decode(buf: &'a [u8]) -> Result<Record<'a>, DecodeError> {
        let mut g = Get::new(buf, 8)?;
        match RecordKind::from_u32(g.u32())? {
            RecordKind::Malloc => {
                let (h, stack) = MallocHeader::decode(buf)?;
                Ok(Record::Malloc(h, stack))
            }
            RecordKind::Free => Ok(Record::Free(FreeRecord::decode(buf)?)),
            RecordKind::HeapName => Ok(Record::HeapName(HeapNameRecord::decode(buf)?)),
        }
    }

    /// Encodes the record into a new buffer (tests, fuzzers and tools; the
    /// client writes records in place instead).
    pub fn encode_to_vec(&self) -> Vec<u8> {
        match self {
            Record::Malloc(h, stack) => {
                let mut fixed = [0u8; MallocHeader::ENCODED_LEN];
                let mut h = *h;
                h.stack_len = stack.len() as u64;
                h.encode_into(&mut fixed);
                let mut v = Vec::with_capacity(fixed.len() + stack.len());
                v.extend_from_slice(&fixed);
                v.extend_from_slice(stack);
                v
            }
            Record::Free(f) => f.encode().to_vec(),
            Record::HeapName(n) => n.encode().to_vec(),
        }
    }
}

// Layout pins: a change to any field list must change these numbers on purpose.
const _: () = assert!(Handshake::ENCODED_LEN == 64);
const _: () = assert!(ClientConfig::ENCODED_LEN == 1224);
const _: () = assert!(MallocHeader::ENCODED_LEN == 360);
const _: () = assert!(FreeRecord::ENCODED_LEN == 32);
const _: () = assert!(HeapNameRecord::ENCODED_LEN == 88);
const _: () = assert!(MallocHeader::ENCODED_LEN % 8 == 0);

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_header() -> MallocHeader {
        let mut regs = RegisterFile::default();
        for (i, r) in regs.0.iter_mut().enumerate() {
            *r = 0x1000 + i as u64;
        }
        MallocHeader {
            flags: MallocHeader::FLAG_STACK_TRUNCATED,
            sequence: 42,
            alloc_size: 100,
            sample_size: 4096,
            address: 0xdead_beef,
            timestamp_ns: 123_456_789,
            context_id: 7,
            tid: 99,
            heap_id: 0,
            arch: Arch::X86_64,
            stack_pointer: 0x7fff_0000,
            stack_len: 16,
            regs,
        }
    }

    #[test]
    fn malloc_round_trip_with_padding() {
        let stack: Vec<u8> = (0..16).collect();
        let mut bytes = Record::Malloc(sample_header(), &stack).encode_to_vec();
        bytes.extend_from_slice(&[0; 7]);
        match Record::decode(&bytes).unwrap() {
            Record::Malloc(h, s) => {
                assert_eq!(h, sample_header());
                assert_eq!(s, &stack[..]);
            }
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn malloc_rejects_bad_stack_len() {
        let stack = [0u8; 16];
        let mut bytes = Record::Malloc(sample_header(), &stack).encode_to_vec();
        // Declare more stack than present.
        bytes[80..88].copy_from_slice(&1000u64.to_le_bytes());
        assert_eq!(
            Record::decode(&bytes),
            Err(DecodeError::StackLength {
                declared: 1000,
                available: 16
            })
        );
        // 8 or more trailing bytes are not padding.
        let mut bytes = Record::Malloc(sample_header(), &stack).encode_to_vec();
        bytes.extend_from_slice(&[0; 8]);
        assert!(matches!(
            Record::decode(&bytes),
            Err(DecodeError::StackLength { .. })
        ));
    }

    #[test]
    fn every_prefix_of_every_record_is_an_error_not_a_panic() {
        let stack = [1u8; 24];
        let name = heap_name_field("libc.malloc").unwrap();
        let records = [
            Record::Malloc(sample_header(), &stack).encode_to_vec(),
            Record::Free(FreeRecord {
                sequence: 1,
                address: 2,
                heap_id: 0,
            })
            .encode_to_vec(),
            Record::HeapName(HeapNameRecord {
                heap_id: 0,
                interval: 4096,
                name,
            })
            .encode_to_vec(),
        ];
        for bytes in &records {
            assert!(Record::decode(bytes).is_ok());
            for n in 0..bytes.len() {
                assert!(Record::decode(&bytes[..n]).is_err(), "prefix {n} decoded");
            }
        }
    }

    #[test]
    fn unknown_kind_and_arch() {
        let mut bytes = FreeRecord {
            sequence: 1,
            address: 2,
            heap_id: 0,
        }
        .encode()
        .to_vec();
        bytes[0] = 77;
        assert_eq!(Record::decode(&bytes), Err(DecodeError::UnknownKind(77)));
        let mut bytes = Record::Malloc(sample_header(), &[]).encode_to_vec();
        bytes[64] = 9;
        assert_eq!(Record::decode(&bytes), Err(DecodeError::UnknownArch(9)));
    }

    #[test]
    fn handshake_round_trip_and_validation() {
        let h = Handshake {
            version: version::CURRENT,
            pid: 1234,
            arch: Arch::Aarch64,
            page_size: 4096,
            flags: Handshake::FLAG_FROM_STARTUP,
            client_text_start: 0x1000,
            client_text_end: 0x2000,
        };
        assert_eq!(Handshake::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[4] = 99;
        assert_eq!(
            Handshake::decode(&b),
            Err(DecodeError::UnsupportedVersion(99))
        );
        let mut b = h.encode();
        b[0] = b'X';
        assert!(matches!(
            Handshake::decode(&b),
            Err(DecodeError::BadMagic(_))
        ));
    }

    #[test]
    fn config_round_trip_and_heap_lookup() {
        let mut c = ClientConfig::new(4096, 8 << 20);
        c.seed = 5;
        c.flags = ClientConfig::FLAG_BLOCK_CLIENT;
        c.block_timeout_us = 1000;
        c.heaps[1] = HeapConfig {
            name: heap_name_field("custom").unwrap(),
            interval: 0,
        };
        c.num_heaps = 2;
        let d = ClientConfig::decode(&c.encode()).unwrap();
        assert_eq!(d, c);
        assert!(d.block_client());
        assert_eq!(d.interval_for("libc.malloc"), 4096);
        assert_eq!(d.interval_for("custom"), 0);
        assert_eq!(d.interval_for("other"), 4096);
        let mut b = c.encode();
        b[8..16].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(
            ClientConfig::decode(&b),
            Err(DecodeError::InvalidField("sampling_interval"))
        );
    }

    #[test]
    fn heap_names() {
        assert!(heap_name_field(&"x".repeat(65)).is_none());
        assert!(heap_name_field("a\0b").is_none());
        let mut f = heap_name_field("ok").unwrap();
        assert_eq!(heap_name_str(&f), Ok("ok"));
        f[10] = b'z';
        assert_eq!(heap_name_str(&f), Err(DecodeError::BadHeapName));
    }
}
