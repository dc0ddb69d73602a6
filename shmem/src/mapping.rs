//! Creating the sealed memfd and mapping it with the data area twice.
//!
//! Only the daemon creates buffers. It seals the size (`F_SEAL_SHRINK |
//! F_SEAL_GROW | F_SEAL_SEAL`), so no peer can truncate the file under a
//! mapping and turn a read into a SIGBUS. The client checks the seals when it
//! attaches for the same reason.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Largest data area we create or accept (1 GiB).
pub const MAX_DATA_SIZE: usize = 1 << 30;

/// How much of the mirror mapping [`Mapping::prefault`] faults in: records
/// that cross the end of the data area are rarely larger.
const MIRROR_PREFAULT: usize = 64 << 10;

/// Error type of this crate's setup functions.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetupError {
    /// The requested or found data size is not a power of two multiple of the page size.
    BadSize {
        /// The offending size in bytes.
        size: u64,
        /// The page size it must be a multiple of.
        page_size: usize,
    },
    /// The memfd is missing the seals that make it safe to map.
    NotSealed,
    /// A system call failed.
    Sys {
        /// Which call.
        call: &'static str,
        /// The OS error.
        err: io::Error,
    },
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::BadSize { size, page_size } => write!(
                f,
                "ring buffer size {size} is invalid: it must be a power of two, at least \
                 {page_size} and at most {MAX_DATA_SIZE} bytes"
            ),
            SetupError::NotSealed => {
                write!(f, "ring buffer memfd is not sealed against resizing")
            }
            SetupError::Sys { call, err } => write!(f, "{call} failed: {err}"),
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::Sys { err, .. } => Some(err),
            _ => None,
        }
    }
}

fn sys(call: &'static str) -> SetupError {
    SetupError::Sys {
        call,
        err: io::Error::last_os_error(),
    }
}

/// The OS page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p <= 0 { 4096 } else { p as usize }
}

/// Checks a data-area size: a power of two, a multiple of the page, bounded.
pub fn check_data_size(size: u64) -> Result<usize, SetupError> {
    let page = page_size();
    let ok = size.is_power_of_two() && size >= page as u64 && size <= MAX_DATA_SIZE as u64;
    if ok {
        Ok(size as usize)
    } else {
        Err(SetupError::BadSize {
            size,
            page_size: page,
        })
    }
}

/// A live double mapping: `[meta][data][data]`. Unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    total_len: usize,
    page: usize,
    data_size: usize,
}

// SAFETY: the mapping is plain shared memory; all access through it is via
// atomics or raw copies that the ring-buffer code synchronises.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates a sealed memfd with a data area of `data_size` bytes and maps
    /// it. With `allocate`, its pages are allocated (zeroed) now
    /// (`fallocate`), so the first touch of a page by either side only maps
    /// it: for 1 MiB, a client's `MADV_POPULATE_WRITE` took 0.29 ms instead
    /// of 0.59 ms (measured here, with a C program doing the same calls).
    pub(crate) fn create(data_size: u64, allocate: bool) -> Result<(Mapping, OwnedFd), SetupError> {
        let data_size = check_data_size(data_size)?;
        let page = page_size();
        // SAFETY: the name is a valid NUL-terminated string.
        let fd = unsafe {
            libc::memfd_create(
                c"heapprofd-rs-ring".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(sys("memfd_create"));
        }
        // SAFETY: memfd_create returned a fresh descriptor that we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let file_len = (page + data_size) as libc::off_t;
        // SAFETY: plain syscalls on a descriptor we own.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), file_len) != 0 {
                return Err(sys("ftruncate"));
            }
            // Best effort: without it, pages are allocated on first touch.
            if allocate {
                libc::fallocate(fd.as_raw_fd(), 0, 0, file_len);
            }
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
                return Err(sys("fcntl(F_ADD_SEALS)"));
            }
        }
        let mapping = Mapping::map(&fd, data_size, page)?;
        Ok((mapping, fd))
    }

    /// Maps an existing ring-buffer memfd after checking its size and seals.
    pub(crate) fn attach(fd: &OwnedFd) -> Result<Mapping, SetupError> {
        let page = page_size();
        // SAFETY: fstat writes into the zeroed struct we pass.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(sys("fstat"));
        }
        let file_len = st.st_size as u64;
        let data_size = check_data_size(file_len.saturating_sub(page as u64))?;
        // SAFETY: F_GET_SEALS takes no pointer argument.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if seals < 0 || seals & need != need {
            return Err(SetupError::NotSealed);
        }
        Mapping::map(fd, data_size, page)
    }

    fn map(fd: &OwnedFd, data_size: usize, page: usize) -> Result<Mapping, SetupError> {
        let total_len = page + 2 * data_size;
        // SAFETY: reserving fresh address space; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(sys("mmap(reserve)"));
        }
        let mapping = Mapping {
            // SAFETY: mmap never returns null on success.
            base: unsafe { NonNull::new_unchecked(base.cast()) },
            total_len,
            page,
            data_size,
        };
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_SHARED | libc::MAP_FIXED;
        // SAFETY: both fixed mappings land inside the reservation we own.
        unsafe {
            let first = libc::mmap(base, page + data_size, rw, flags, fd.as_raw_fd(), 0);
            if first == libc::MAP_FAILED {
                return Err(sys("mmap(ring)"));
            }
            let second_addr = base.cast::<u8>().add(page + data_size).cast();
            let second = libc::mmap(
                second_addr,
                data_size,
                rw,
                flags,
                fd.as_raw_fd(),
                page as libc::off_t,
            );
            if second == libc::MAP_FAILED {
                return Err(sys("mmap(ring mirror)"));
            }
        }
        Ok(mapping)
    }

    /// Start of the metadata page.
    pub(crate) fn meta_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Start of the first copy of the data area.
    pub(crate) fn data_ptr(&self) -> *mut u8 {
        // SAFETY: within the mapping.
        unsafe { self.base.as_ptr().add(self.page) }
    }

    /// Size of the data area.
    pub(crate) fn data_size(&self) -> usize {
        self.data_size
    }

    /// Faults the pages of the mapping in, writable, without changing their
    /// contents (`MADV_POPULATE_WRITE`, Linux 5.14+). False if unsupported.
    ///
    /// The mirror is only written by records that cross the end of the data
    /// area, so only its first [`MIRROR_PREFAULT`] bytes are faulted in: the
    /// rest would only cost page-table set-up at start (8 MiB ring: 2.7-3.3
    /// ms for both halves against 1.8-2.0 ms without the mirror, measured
    /// with a C program doing the same calls).
    pub(crate) fn prefault(&self) -> bool {
        self.prefault_head(self.data_size + self.data_size.min(MIRROR_PREFAULT))
    }

    /// [`Mapping::prefault`] of the metadata page and the first `bytes` of
    /// the data area (past its end: of the mirror) only.
    pub(crate) fn prefault_head(&self, bytes: usize) -> bool {
        let bytes = bytes.min(self.data_size + self.data_size.min(MIRROR_PREFAULT));
        let len = self.page + bytes;
        // SAFETY: advice on our own mapping (`len <= total_len`); contents
        // are not modified.
        unsafe { libc::madvise(self.base.as_ptr().cast(), len, libc::MADV_POPULATE_WRITE) == 0 }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the whole reservation.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.total_len);
        }
    }
}
