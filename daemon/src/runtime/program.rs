//! Whether the program `record` is about to start can load the client:
//! a statically linked program (no `PT_INTERP`: the loader never runs), a
//! 32-bit one, or a set-user-ID / set-group-ID one (the loader ignores
//! `LD_PRELOAD` paths in secure mode) runs unprofiled. `record` still runs
//! it, and says so ([`Daemon::note_unprofilable`](super::server::Daemon::note_unprofilable)).
//! Children such programs are exec'd into are checked by the client's exec
//! hooks instead.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use heapprofd_model::messages::Unprofilable;

/// `PT_INTERP`.
const PT_INTERP: u32 = 3;

/// The file exec would run for `cmd`: itself if it names a path, else the
/// first executable file of that name on `path` (`$PATH`, see
/// [`crate::env::Env::path`]; unset: `/bin:/usr/bin`).
fn resolve(cmd: &OsStr, path: Option<&OsStr>) -> Option<PathBuf> {
    if cmd.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(cmd));
    }
    let path = path.unwrap_or(OsStr::new("/bin:/usr/bin"));
    std::env::split_paths(path)
        .map(|d| {
            if d.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                d
            }
            .join(cmd)
        })
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Why `cmd` (as exec would find it) cannot load the client, if it cannot.
/// Unreadable files and scripts (their interpreter is what runs) say
/// nothing.
/// A qemu user-mode emulator says nothing either: the guest program's own
/// loader loads the client (see `emulation`).
pub fn unprofilable(cmd: &OsStr, path: Option<&OsStr>) -> Option<Unprofilable> {
    let path = resolve(cmd, path)?;
    if super::emulation::is_user_emulator(&path) {
        return None;
    }
    check_file(&path)
}

/// Why the program in `path` cannot load the client, if it cannot (as
/// [`unprofilable`], for a file already found).
pub fn check_file(path: &Path) -> Option<Unprofilable> {
    let meta = std::fs::metadata(path).ok()?;
    let (uid, gid) = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    let mode = meta.mode();
    if (mode & 0o4000 != 0 && meta.uid() != uid) || (mode & 0o2000 != 0 && meta.gid() != gid) {
        return Some(Unprofilable::SecureExec);
    }
    let mut f = std::fs::File::open(path).ok()?;
    // Enough for the ELF header and the program headers of any real program.
    let mut head = Vec::with_capacity(8192);
    f.by_ref().take(8192).read_to_end(&mut head).ok()?;
    if head.len() < 64 || head[..4] != *b"\x7fELF" {
        return None;
    }
    if head[4] != 2 {
        return Some(Unprofilable::Program32Bit);
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(head[32..40].try_into().ok()?) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    if phentsize < 56 {
        return None;
    }
    let mut interp = false;
    for i in 0..phnum {
        let off = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let ty = head.get(off..off + 4)?;
        interp |= u32::from_le_bytes(ty.try_into().ok()?) == PT_INTERP;
    }
    (!interp).then_some(Unprofilable::StaticProgram)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_static_and_scripts() {
        let path = crate::env::Env::from_process().path;
        let path = path.as_deref();
        assert_eq!(
            unprofilable(OsStr::new("sh"), path),
            None,
            "a dynamic program"
        );
        assert_eq!(unprofilable(OsStr::new("/no/such/program"), path), None);
        // ld.so itself has no PT_INTERP: it reads as statically linked.
        assert_eq!(
            check_file(Path::new("/lib64/ld-linux-x86-64.so.2")),
            Some(Unprofilable::StaticProgram)
        );
        let script = std::env::temp_dir().join(format!("hp-script-{}", std::process::id()));
        std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
        assert_eq!(check_file(&script), None, "a script's interpreter runs");
        let _ = std::fs::remove_file(&script);
    }

    #[test]
    fn looks_on_the_path_it_is_given() {
        let sh = OsStr::new("sh");
        assert_eq!(
            resolve(sh, Some(OsStr::new("/no/such/dir:/bin"))),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(resolve(sh, Some(OsStr::new("/no/such/dir"))), None);
        assert_eq!(
            resolve(sh, None),
            Some(PathBuf::from("/bin/sh")),
            "unset: /bin:/usr/bin"
        );
        let exact = OsStr::new("/no/such/sh");
        assert_eq!(
            resolve(exact, Some(OsStr::new("/bin"))),
            Some(PathBuf::from(exact))
        );
    }
}
