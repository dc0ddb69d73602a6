//! Where a process's memory and maps text come from.
//!
//! In production both are descriptors the client opened on itself and passed
//! to the daemon over the socket: `/proc/self/mem` ([`FdMemory`], read with
//! `pread`) and `/proc/self/maps` ([`FdMaps`], re-read from offset 0). Tests
//! and offline tools use [`SnapshotMemory`] and [`StaticMaps`] instead.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Read access to another process's address space.
///
/// Implementations must be cheap to call and must never panic; a read of an
/// address that is not mapped (or a process that is gone) is an `Err`.
pub trait ProcessMemory: Send + Sync {
    /// Fills `buf` with the bytes at `addr`; all of them or an error.
    fn read_exact_at(&self, addr: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Reads a little-endian `u64` at `addr`.
    fn read_u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read_exact_at(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

impl<T: ProcessMemory + ?Sized> ProcessMemory for Arc<T> {
    fn read_exact_at(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_exact_at(addr, buf)
    }
}

impl<T: ProcessMemory + ?Sized> ProcessMemory for Box<T> {
    fn read_exact_at(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_exact_at(addr, buf)
    }
}

/// Memory read with `pread` from a `/proc/PID/mem` descriptor.
#[derive(Debug)]
pub struct FdMemory {
    file: File,
}

impl FdMemory {
    /// Wraps an open `/proc/PID/mem` file (for example the client's fd).
    pub fn new(file: File) -> Self {
        FdMemory { file }
    }

    /// Opens `/proc/<pid>/mem` (needs ptrace access to the process).
    pub fn open_pid(pid: u32) -> io::Result<Self> {
        Ok(FdMemory::new(File::open(format!("/proc/{pid}/mem"))?))
    }
}

impl ProcessMemory for FdMemory {
    fn read_exact_at(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        // Offsets above i64::MAX make pread fail with EINVAL, which is the
        // error we want; no special case needed.
        self.file.read_exact_at(buf, addr)
    }
}

/// Memory made of a few captured regions (a core-dump-like snapshot).
#[derive(Debug, Clone, Default)]
pub struct SnapshotMemory {
    regions: Vec<(u64, Arc<[u8]>)>,
}

impl SnapshotMemory {
    /// An empty snapshot: every read fails.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the bytes found at `start`. Later regions do not replace earlier
    /// ones where they overlap.
    pub fn add_region(&mut self, start: u64, bytes: impl Into<Arc<[u8]>>) {
        self.regions.push((start, bytes.into()));
        self.regions.sort_by_key(|r| r.0);
    }
}

impl ProcessMemory for SnapshotMemory {
    fn read_exact_at(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        for (start, bytes) in &self.regions {
            let Some(off) = addr.checked_sub(*start) else {
                continue;
            };
            let Ok(off) = usize::try_from(off) else {
                continue;
            };
            if let Some(src) = off
                .checked_add(buf.len())
                .and_then(|end| bytes.get(off..end))
            {
                buf.copy_from_slice(src);
                return Ok(());
            }
        }
        Err(io::Error::from_raw_os_error(libc::EIO))
    }
}

/// Memory of a process that is gone: every read fails.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMemory;

impl ProcessMemory for NoMemory {
    fn read_exact_at(&self, _addr: u64, _buf: &mut [u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ESRCH))
    }
}

/// Source of the maps text of a process, re-readable.
pub trait MapsSource: Send {
    /// Returns the current maps text.
    fn read_maps(&mut self) -> io::Result<String>;
}

/// Maps read from a `/proc/PID/maps` descriptor, from offset 0 each time
/// (`pread`: copies of the descriptor share no file position).
#[derive(Debug)]
pub struct FdMaps {
    file: File,
}

impl FdMaps {
    /// Wraps an open `/proc/PID/maps` file (for example the client's fd).
    pub fn new(file: File) -> Self {
        FdMaps { file }
    }

    /// A second reader of the same descriptor (a `dup`), for another thread.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(FdMaps {
            file: self.file.try_clone()?,
        })
    }

    /// Opens `/proc/<pid>/maps`.
    pub fn open_pid(pid: u32) -> io::Result<Self> {
        Ok(FdMaps::new(File::open(format!("/proc/{pid}/maps"))?))
    }
}

/// Upper bound on the maps text we read (the rest is ignored): 16 MiB holds
/// the kernel's default maximum of 65,530 mappings with 250-byte lines; a
/// hostile process with longer paths only loses its own mappings.
pub const MAX_MAPS_BYTES: u64 = 16 << 20;

impl MapsSource for FdMaps {
    fn read_maps(&mut self) -> io::Result<String> {
        let mut bytes = vec![0u8; 64 << 10];
        let mut len = 0;
        loop {
            if len == bytes.len() {
                if len as u64 >= MAX_MAPS_BYTES {
                    break;
                }
                bytes.resize((len * 2).min(MAX_MAPS_BYTES as usize), 0);
            }
            match self.file.read_at(&mut bytes[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        bytes.truncate(len);
        // Valid text (always, from the kernel) is taken without a copy.
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
}

/// Maps text captured once (tests, offline tools, exited processes).
#[derive(Debug, Clone, Default)]
pub struct StaticMaps(pub String);

impl MapsSource for StaticMaps {
    fn read_maps(&mut self) -> io::Result<String> {
        Ok(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reads_inside_regions_only() {
        let mut m = SnapshotMemory::new();
        m.add_region(0x1000, vec![1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let mut b = [0u8; 4];
        m.read_exact_at(0x1002, &mut b).unwrap();
        assert_eq!(b, [3, 4, 5, 6]);
        assert!(m.read_exact_at(0x1008, &mut b).is_err());
        assert!(m.read_exact_at(0xfff, &mut b).is_err());
        assert!(m.read_exact_at(u64::MAX - 1, &mut b).is_err());
        assert_eq!(m.read_u64(0x1000).unwrap(), 0x0807060504030201);
        assert!(NoMemory.read_u64(0).is_err());
    }

    #[test]
    fn fd_sources_read_own_process() {
        let mut maps = FdMaps::open_pid(std::process::id()).unwrap();
        let a = maps.read_maps().unwrap();
        let b = maps.read_maps().unwrap();
        assert!(a.contains("[stack]"));
        assert!(!b.is_empty());
        let mem = FdMemory::open_pid(std::process::id()).unwrap();
        let x: u64 = 0x1122_3344_5566_7788;
        let v = mem.read_u64(&x as *const u64 as u64).unwrap();
        assert_eq!(v, x);
        assert!(mem.read_u64(8).is_err());
        assert!(mem.read_u64(u64::MAX - 3).is_err());
    }
}
