//! [`Handshake`], the client's first message on the socket.

use super::arch::Arch;
use super::codec::{DecodeError, Get, Put};
use super::{MAGIC, version};

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
        let mut p = Put::new(&mut out);
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
}
