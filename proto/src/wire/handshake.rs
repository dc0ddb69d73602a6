//! [`Handshake`], the client's first message on the socket, and
//! [`Unprofilable`], what a client says instead of a session when its
//! process cannot be profiled.

use super::arch::Arch;
use super::codec::{DecodeError, Get, Put};
use super::{MAGIC, version};

/// Client -> daemon, first message on the socket (Since [`version::V1`];
/// `unprofilable` since [`version::V2`]).
///
/// Sent with two descriptors attached (SCM_RIGHTS), in this order: the
/// client's `/proc/self/maps` and `/proc/self/mem`. A handshake with
/// `unprofilable` set is a notice instead: no descriptors, no session; the
/// daemon records that process `pid` runs unprofiled and why, and closes
/// the connection.
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
    /// [`Unprofilable::None`] for a session; otherwise process `pid` (the
    /// sender, or a child it just spawned) cannot be profiled, and why.
    pub unprofilable: Unprofilable,
}

/// Why a process cannot be profiled, as a client tells the daemon
/// ([`Handshake::unprofilable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Unprofilable {
    /// Not a notice: a session.
    None = 0,
    /// The executable defines `malloc` itself (an allocator linked into
    /// it): its calls cannot be intercepted.
    BuiltInAllocator = 1,
    /// The process exec'd (or spawned) a statically linked program, which
    /// cannot load the client.
    StaticProgram = 2,
    /// The process exec'd (or spawned) a 32-bit program.
    Program32Bit = 3,
    /// The process exec'd (or spawned) a set-user-ID or set-group-ID
    /// program: the loader ignores `LD_PRELOAD` there.
    SecureExec = 4,
    /// A library loaded before the client (in `LD_PRELOAD`, before the
    /// client installed in `/etc/ld.so.preload`) defines the `malloc` the
    /// program calls: the client's hooks forward past it.
    EarlierAllocator = 5,
}

impl Unprofilable {
    /// The value on the wire.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The reason of a wire value.
    pub fn from_code(v: u32) -> Result<Unprofilable, DecodeError> {
        Ok(match v {
            0 => Unprofilable::None,
            1 => Unprofilable::BuiltInAllocator,
            2 => Unprofilable::StaticProgram,
            3 => Unprofilable::Program32Bit,
            4 => Unprofilable::SecureExec,
            5 => Unprofilable::EarlierAllocator,
            _ => return Err(DecodeError::InvalidField("unprofilable")),
        })
    }

    /// Why, in words (completes "pid N runs unprofiled: ").
    pub const fn describe(self) -> &'static str {
        match self {
            Unprofilable::None => "it is profiled",
            Unprofilable::BuiltInAllocator => {
                "its executable defines malloc itself (a statically linked allocator), \
                 whose calls cannot be intercepted"
            }
            Unprofilable::StaticProgram => {
                "it runs a statically linked program, which cannot load the profiler"
            }
            Unprofilable::Program32Bit => {
                "it runs a 32-bit program, which cannot load the 64-bit profiler"
            }
            Unprofilable::SecureExec => {
                "it runs a set-user-ID or set-group-ID program, where the loader ignores \
                 LD_PRELOAD"
            }
            Unprofilable::EarlierAllocator => {
                "a library loaded before the profiler (LD_PRELOAD, before the profiler \
                 installed in /etc/ld.so.preload) defines the malloc it calls"
            }
        }
    }
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
        let mut p = Put::new(&mut out);
        p.u32(MAGIC);
        p.u32(self.version);
        p.u32(self.pid);
        p.u32(self.arch as u32);
        p.u32(self.page_size);
        p.u32(self.flags);
        p.u64(self.client_text_start);
        p.u64(self.client_text_end);
        p.u32(self.unprofilable.code());
        // 44 bytes used; the rest is reserved and zero.
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
        let unprofilable = Unprofilable::from_code(g.u32())?;
        Ok(Handshake {
            version,
            pid,
            arch,
            page_size,
            flags,
            client_text_start,
            client_text_end,
            unprofilable,
        })
    }
}

// Layout pin: a change to the field list must change this number on purpose.
const _: () = assert!(Handshake::ENCODED_LEN == 64);

#[cfg(test)]
mod tests {
    use super::*;

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
            unprofilable: Unprofilable::None,
        };
        assert_eq!(Handshake::decode(&h.encode()), Ok(h));
        let notice = Handshake {
            unprofilable: Unprofilable::StaticProgram,
            ..h
        };
        assert_eq!(Handshake::decode(&notice.encode()), Ok(notice));
        let mut b = h.encode();
        b[40] = 9;
        assert_eq!(
            Handshake::decode(&b),
            Err(DecodeError::InvalidField("unprofilable"))
        );
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
}
