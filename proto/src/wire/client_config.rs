//! [`ClientConfig`], the daemon's answer on the socket: sampling settings,
//! ring size, blocking mode, fork policy and the per-heap intervals.

use super::codec::{
    DecodeError, Get, HEAP_NAME_LEN, Put, encode_name, heap_name_field, heap_name_str,
};
use super::context_filter::{CONTEXT_FILTER_LEN, ContextFilter, MAX_CONTEXT_FILTERS};
use super::{HEAP_LIBC_MALLOC_NAME, MAGIC, MAX_HEAPS, version};

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
    /// Number of valid entries in `context_filters`; 0 = sample whatever
    /// context is installed (Since [`version::V4`]).
    pub num_context_filters: u32,
    /// Sample only while a context passing one of these is installed.
    pub context_filters: [ContextFilter; MAX_CONTEXT_FILTERS],
    /// CPU-time profiling: one stack sample per this many nanoseconds of
    /// CPU each thread uses; 0 = off (Since [`version::V5`]; the field was
    /// reserved before).
    pub cpu_period_ns: u64,
    /// A software perf event each thread samples on overflow
    /// ([`PerfEvent`] as a number; 0 = none) (Since [`version::V5`]).
    pub perf_event: u32,
    /// Its sampling period (events per sample).
    pub perf_period: u64,
}

/// The software perf events `record --event` samples on (Since
/// [`version::V5`]); their samples carry tag [`PerfEvent::tag`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PerfEvent {
    /// `PERF_COUNT_SW_PAGE_FAULTS`.
    PageFaults = 1,
    /// `PERF_COUNT_SW_CONTEXT_SWITCHES`.
    ContextSwitches = 2,
    /// `PERF_COUNT_SW_CPU_CLOCK` (nanoseconds).
    CpuClock = 3,
    /// `PERF_COUNT_SW_TASK_CLOCK` (nanoseconds).
    TaskClock = 4,
}

impl PerfEvent {
    /// Every event, by number.
    pub const ALL: [PerfEvent; 4] = [
        PerfEvent::PageFaults,
        PerfEvent::ContextSwitches,
        PerfEvent::CpuClock,
        PerfEvent::TaskClock,
    ];
    /// Tags of perf-event samples: this bit and the event's number (the
    /// program's tags are below it).
    pub const TAG_BIT: u64 = 1 << 63;

    /// The event of number `n`.
    pub fn from_u32(n: u32) -> Option<PerfEvent> {
        Self::ALL.into_iter().find(|e| *e as u32 == n)
    }

    /// Its name, as `perf` spells it.
    pub fn name(self) -> &'static str {
        match self {
            PerfEvent::PageFaults => "page-faults",
            PerfEvent::ContextSwitches => "context-switches",
            PerfEvent::CpuClock => "cpu-clock",
            PerfEvent::TaskClock => "task-clock",
        }
    }

    /// The event called `name`.
    pub fn from_name(name: &str) -> Option<PerfEvent> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The tag of its samples.
    pub fn tag(self) -> u64 {
        Self::TAG_BIT | self as u64
    }

    /// The event a sample tag names, if it is a perf event's.
    pub fn of_tag(tag: u64) -> Option<PerfEvent> {
        if tag & Self::TAG_BIT == 0 {
            return None;
        }
        u32::try_from(tag & !Self::TAG_BIT)
            .ok()
            .and_then(Self::from_u32)
    }

    /// `perf_event_attr.config` (`PERF_TYPE_SOFTWARE`).
    pub fn sw_config(self) -> u64 {
        match self {
            PerfEvent::CpuClock => 0,
            PerfEvent::TaskClock => 1,
            PerfEvent::PageFaults => 2,
            PerfEvent::ContextSwitches => 3,
        }
    }
}

impl ClientConfig {
    /// Bytes on the wire.
    pub const ENCODED_LEN: usize =
        72 + MAX_HEAPS * (HEAP_NAME_LEN + 8) + MAX_CONTEXT_FILTERS * CONTEXT_FILTER_LEN + 16;
    /// When the buffer is full, wait (up to `block_timeout_us`) instead of dropping.
    pub const FLAG_BLOCK_CLIENT: u32 = 1;
    /// Heaps not listed in `heaps` are sampled at `sampling_interval`
    /// (Perfetto's `all_heaps`); without it they are not sampled (Since
    /// [`version::V3`]).
    pub const FLAG_ALL_HEAPS: u32 = 2;
    /// Malloc samples may leave out the top of the stack that the thread's
    /// previous sample sent (`MallocHeader::stack_reused`; Since
    /// [`version::V6`]).
    pub const FLAG_STACK_REUSE: u32 = 4;
    /// The daemon reads and keeps the process's maps when the ring's maps
    /// ask moves (a client about to exit asks, see the shared memory's
    /// `maps_ask`); without it the client never asks. Set by the daemon
    /// for every session (a flag of [`version::V6`]: no layout change).
    pub const FLAG_KEEPS_MAPS: u32 = 8;
    /// The client may raise its `libc.malloc` interval (doubling it, up to
    /// `MallocHeader::MAX_INTERVAL_SHIFT` times) while its ring is filling
    /// faster than the daemon reads it, and lower it again once the ring
    /// has room; each sample says the interval it was drawn at
    /// (`MallocHeader::INTERVAL_SHIFT_MASK`). Without it the interval is
    /// fixed and a full ring blocks or drops. No layout change.
    pub const FLAG_ADAPTIVE_INTERVAL: u32 = 16;
    /// The client faults its free set's slots in (2 MiB) as the session
    /// starts, on its own thread, so that the first sampled allocations
    /// do not on the program's threads. Set for the sessions of `record`
    /// and of a service profile that names its processes; not for one of
    /// every process (`--all`), where most processes may never sample and
    /// the 2 MiB each would be twice their ring. No layout change.
    pub const FLAG_PREFAULT_FREE_SET: u32 = 32;

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
            num_context_filters: 0,
            context_filters: [ContextFilter::EMPTY; MAX_CONTEXT_FILTERS],
            cpu_period_ns: 0,
            perf_event: 0,
            perf_period: 0,
        }
    }

    /// The context filters in use.
    pub fn context_filters(&self) -> &[ContextFilter] {
        let n = (self.num_context_filters as usize).min(MAX_CONTEXT_FILTERS);
        &self.context_filters[..n]
    }

    /// Adds a context filter; false if the list is full.
    pub fn add_context_filter(&mut self, f: ContextFilter) -> bool {
        let n = (self.num_context_filters as usize).min(MAX_CONTEXT_FILTERS);
        if n == MAX_CONTEXT_FILTERS {
            return false;
        }
        self.context_filters[n] = f;
        self.num_context_filters = n as u32 + 1;
        true
    }

    /// Whether writers block when the buffer is full.
    pub fn block_client(&self) -> bool {
        self.flags & Self::FLAG_BLOCK_CLIENT != 0
    }

    /// Whether malloc samples may reuse their thread's last stack.
    pub fn stack_reuse(&self) -> bool {
        self.flags & Self::FLAG_STACK_REUSE != 0
    }

    /// Whether the client may raise its interval under load
    /// ([`Self::FLAG_ADAPTIVE_INTERVAL`]).
    pub fn adaptive_interval(&self) -> bool {
        self.flags & Self::FLAG_ADAPTIVE_INTERVAL != 0
    }

    /// Whether the client faults its free set in as the session starts
    /// ([`Self::FLAG_PREFAULT_FREE_SET`]).
    pub fn prefault_free_set(&self) -> bool {
        self.flags & Self::FLAG_PREFAULT_FREE_SET != 0
    }

    /// Whether the daemon answers the ring's maps ask.
    pub fn keeps_maps(&self) -> bool {
        self.flags & Self::FLAG_KEEPS_MAPS != 0
    }

    /// Whether heaps that `heaps` does not list are sampled.
    pub fn all_heaps(&self) -> bool {
        self.flags & Self::FLAG_ALL_HEAPS != 0
    }

    /// Sampling interval for the heap called `name`: its own entry if
    /// listed (0 = not sampled), else the default interval with
    /// [`Self::FLAG_ALL_HEAPS`], else 0 (Perfetto's rule).
    pub fn interval_for(&self, name: &str) -> u64 {
        let listed = self.heaps[..(self.num_heaps as usize).min(MAX_HEAPS)]
            .iter()
            .find(|h| heap_name_str(&h.name) == Ok(name));
        match listed {
            Some(h) => h.interval,
            None if self.all_heaps() => self.sampling_interval,
            None => 0,
        }
    }

    /// Lists `name` with its own interval (replacing an entry of that
    /// name); false if the name does not fit or the list is full.
    pub fn set_heap(&mut self, name: &str, interval: u64) -> bool {
        let Some(field) = heap_name_field(name) else {
            return false;
        };
        let n = (self.num_heaps as usize).min(MAX_HEAPS);
        if let Some(h) = self.heaps[..n].iter_mut().find(|h| h.name == field) {
            h.interval = interval;
            return true;
        }
        if n == MAX_HEAPS {
            return false;
        }
        self.heaps[n] = HeapConfig {
            name: field,
            interval,
        };
        self.num_heaps = n as u32 + 1;
        true
    }

    /// Empties the heap list (then only [`Self::FLAG_ALL_HEAPS`] or
    /// [`Self::set_heap`] make heaps sampled).
    pub fn clear_heaps(&mut self) {
        for h in self.heaps.iter_mut() {
            *h = HeapConfig {
                name: [0; HEAP_NAME_LEN],
                interval: 0,
            };
        }
        self.num_heaps = 0;
    }

    /// Encodes into exactly [`Self::ENCODED_LEN`] bytes.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let mut p = Put::new(&mut out);
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
        p.u32(self.num_context_filters);
        p.u64(self.cpu_period_ns);
        for h in &self.heaps {
            encode_name(&mut p, &h.name);
            p.u64(h.interval);
        }
        for f in &self.context_filters {
            f.encode(&mut p);
        }
        p.u32(self.perf_event);
        p.u32(0);
        p.u64(self.perf_period);
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
        let num_context_filters = g.u32();
        if num_context_filters as usize > MAX_CONTEXT_FILTERS {
            return Err(DecodeError::InvalidField("num_context_filters"));
        }
        let cpu_period_ns = g.u64();
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
        let mut context_filters = [ContextFilter::EMPTY; MAX_CONTEXT_FILTERS];
        for f in context_filters.iter_mut() {
            *f = ContextFilter::decode(&mut g)?;
        }
        let perf_event = g.u32();
        if perf_event != 0 && PerfEvent::from_u32(perf_event).is_none() {
            return Err(DecodeError::InvalidField("perf_event"));
        }
        let _pad = g.u32();
        let perf_period = g.u64();
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
            num_context_filters,
            context_filters,
            cpu_period_ns,
            perf_event,
            perf_period,
        })
    }
}

// Layout pin: a change to the field list must change this number on purpose.
const _: () = assert!(ClientConfig::ENCODED_LEN == 4680 + 8 * 328 + 16);

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(c.add_context_filter(ContextFilter::parse("endpoint=/a").unwrap()));
        let d = ClientConfig::decode(&c.encode()).unwrap();
        assert_eq!(d, c);
        assert!(d.block_client());
        assert_eq!(d.context_filters().len(), 1);
        assert_eq!(d.interval_for("libc.malloc"), 4096);
        assert_eq!(d.interval_for("custom"), 0);
        assert_eq!(d.interval_for("other"), 0);
        let mut all = d;
        all.flags |= ClientConfig::FLAG_ALL_HEAPS;
        assert_eq!(all.interval_for("other"), 4096);
        assert_eq!(all.interval_for("custom"), 0);
        let mut e = ClientConfig::new(4096, 8 << 20);
        e.clear_heaps();
        assert_eq!(e.interval_for("libc.malloc"), 0);
        assert!(e.set_heap("pool", 1) && e.set_heap("pool", 2) && e.set_heap("libc.malloc", 8));
        assert_eq!((e.num_heaps, e.interval_for("pool")), (2, 2));
        assert_eq!(e.interval_for("libc.malloc"), 8);
        assert!(!e.set_heap(&"x".repeat(65), 1));
        for i in 2..MAX_HEAPS {
            assert!(e.set_heap(&format!("h{i}"), 1));
        }
        assert!(!e.set_heap("one too many", 1));
        assert_eq!(ClientConfig::decode(&e.encode()), Ok(e));
        let mut b = c.encode();
        b[8..16].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(
            ClientConfig::decode(&b),
            Err(DecodeError::InvalidField("sampling_interval"))
        );
    }
}
