//! Programs run by a user-mode emulator (`qemu-aarch64`, `qemu-aarch64-static`,
//! ...): how the aarch64 client is tested on an x86_64 machine.
//!
//! qemu-user runs the guest in the emulator's own process, with guest
//! addresses equal to host ones on a 64-bit host (the guest's stack and
//! libraries are readable at their guest addresses through
//! `/proc/PID/mem`). Two things differ from a native process, and only
//! these are allowed for:
//!
//! * `record -- qemu-aarch64-static ... PROG`: the emulator binary is
//!   statically linked, but it is not what loads the client: the guest's
//!   own loader does (`LD_PRELOAD` reaches the guest). [`is_user_emulator`]
//!   keeps `record` from calling such a command unprofiled.
//! * qemu answers the guest's `open("/proc/self/maps")` with a file it
//!   writes itself: the guest's view (guest code `r-x`, no emulator
//!   mappings), where the host's `/proc/PID/maps` shows the emulator's
//!   view (guest code mapped `r--`, the emulator's own binary). The
//!   client's maps descriptor is then a regular file that is not
//!   `/proc/PID/maps`; the handshake accepts it only from a process whose
//!   executable is such an emulator ([`runs_under_emulator`]). It is a
//!   snapshot: objects the guest maps later (`dlopen`) are not seen.

use std::ffi::OsStr;
use std::path::Path;

/// Whether `path` names a qemu user-mode emulator (`qemu-<arch>` or
/// `qemu-<arch>-static`; not `qemu-system-*`, which runs a whole machine).
pub fn is_user_emulator(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(OsStr::to_str) else {
        return false;
    };
    let Some(rest) = name.strip_prefix("qemu-") else {
        return false;
    };
    let arch = rest.strip_suffix("-static").unwrap_or(rest);
    !arch.is_empty()
        && !arch.starts_with("system")
        && arch.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether process `pid` runs a qemu user-mode emulator (its
/// `/proc/PID/exe`).
pub fn runs_under_emulator(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| is_user_emulator(&exe))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_user_mode_emulators() {
        for yes in [
            "/usr/bin/qemu-aarch64-static",
            "qemu-aarch64",
            "/usr/libexec/qemu-binfmt/qemu-x86_64",
            "qemu-arm",
        ] {
            assert!(is_user_emulator(Path::new(yes)), "{yes}");
        }
        for no in [
            "/usr/bin/qemu-system-aarch64",
            "qemu-",
            "qemu-aarch64-static.sh",
            "/usr/bin/python3",
            "/bin/qemu",
        ] {
            assert!(!is_user_emulator(Path::new(no)), "{no}");
        }
    }

    #[test]
    fn this_process_is_not_emulated() {
        assert!(!runs_under_emulator(std::process::id()));
    }
}
