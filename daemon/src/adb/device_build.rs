//! Which heapprofd-rs build to push: the device's ABI
//! (`ro.product.cpu.abi`) names an architecture, and a build for it is a
//! directory holding `heapprofd-rs` and `libheapprofd_client.so` of that
//! architecture (checked in the ELF header), given with `--device-build`
//! or found in this build's target directory.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The binary and the client library a build holds.
pub const FILES: [&str; 2] = ["heapprofd-rs", "libheapprofd_client.so"];

/// A build to push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// The directory holding [`FILES`].
    pub dir: PathBuf,
    /// The architecture (Rust's name: `aarch64`, `x86_64`).
    pub arch: &'static str,
}

/// Rust's architecture for an Android ABI, if heapprofd-rs builds for it.
pub fn arch_of_abi(abi: &str) -> Option<&'static str> {
    match abi {
        "arm64-v8a" => Some("aarch64"),
        "x86_64" => Some("x86_64"),
        _ => None,
    }
}

/// ELF `e_machine` of an architecture.
fn machine(arch: &str) -> u16 {
    match arch {
        "aarch64" => 183,
        _ => 62,
    }
}

/// The ELF machine of a file, if it is a 64-bit little-endian ELF.
fn elf_machine(path: &Path) -> Option<u16> {
    let mut head = [0u8; 20];
    let mut f = std::fs::File::open(path).ok()?;
    std::io::Read::read_exact(&mut f, &mut head).ok()?;
    (head[..4] == *b"\x7fELF" && head[4] == 2 && head[5] == 1)
        .then(|| u16::from_le_bytes([head[18], head[19]]))
}

/// Whether `dir` holds a build for `arch`.
fn holds_build(dir: &Path, arch: &str) -> bool {
    FILES
        .iter()
        .all(|f| elf_machine(&dir.join(f)) == Some(machine(arch)))
}

/// Where builds for `arch` are looked for, best first, next to this
/// binary (`exe_dir`, e.g. `target/release`): the Android target's
/// release build, the Linux one, and this binary's own directory when the
/// host has the same architecture.
pub fn candidates(exe_dir: &Path, arch: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(target) = exe_dir.parent() {
        for triple in [
            format!("{arch}-linux-android"),
            format!("{arch}-unknown-linux-gnu"),
        ] {
            v.push(target.join(triple).join("release"));
        }
    }
    if std::env::consts::ARCH == arch {
        v.push(exe_dir.to_path_buf());
    }
    v
}

/// The build to push for a device of ABI `abi`.
pub fn find(abi: &str, given: Option<&Path>, exe_dir: &Path) -> Result<Build> {
    let Some(arch) = arch_of_abi(abi) else {
        bail!(
            "the device's ABI is {abi}: heapprofd-rs builds only for arm64-v8a (aarch64) \
             and x86_64 devices; use --perfetto to profile with the device's own heapprofd"
        );
    };
    if let Some(dir) = given {
        if holds_build(dir, arch) {
            return Ok(Build {
                dir: dir.to_path_buf(),
                arch,
            });
        }
        bail!(
            "--device-build {}: it does not hold {} built for {arch} (the device's ABI is {abi}); \
             build them with `cargo build --release --target {arch}-linux-android` \
             and give target/{arch}-linux-android/release",
            dir.display(),
            FILES.join(" and ")
        );
    }
    let looked = candidates(exe_dir, arch);
    if let Some(dir) = looked.iter().find(|d| holds_build(d, arch)) {
        return Ok(Build {
            dir: dir.clone(),
            arch,
        });
    }
    let list: Vec<String> = looked.iter().map(|d| d.display().to_string()).collect();
    bail!(
        "no heapprofd-rs build for the device's ABI {abi} ({arch}): looked in {}; build one with \
         `cargo build --release --target {arch}-linux-android` (needs the Android NDK's linker; \
         `--target {arch}-unknown-linux-gnu` for a device with glibc), or give one with \
         --device-build DIR, or use --perfetto (the device's own heapprofd)",
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abis() {
        assert_eq!(arch_of_abi("arm64-v8a"), Some("aarch64"));
        assert_eq!(arch_of_abi("x86_64"), Some("x86_64"));
        assert_eq!(arch_of_abi("armeabi-v7a"), None);
        let e = find("armeabi-v7a", None, Path::new("/nonexistent/release")).unwrap_err();
        assert!(e.to_string().contains("--perfetto"), "{e}");
    }

    #[test]
    fn builds_are_told_by_their_elf_machine() {
        let dir = tempfile::tempdir().unwrap();
        let mut x86 = [0u8; 64];
        x86[..6].copy_from_slice(b"\x7fELF\x02\x01");
        x86[18..20].copy_from_slice(&62u16.to_le_bytes());
        for f in FILES {
            std::fs::write(dir.path().join(f), x86).unwrap();
        }
        let got = find("x86_64", Some(dir.path()), Path::new("/x/release")).unwrap();
        assert_eq!(got.arch, "x86_64");
        let e = find("arm64-v8a", Some(dir.path()), Path::new("/x/release")).unwrap_err();
        assert!(e.to_string().contains("aarch64-linux-android"), "{e}");
        let e = find("arm64-v8a", None, Path::new("/nonexistent/target/release")).unwrap_err();
        assert!(
            e.to_string()
                .contains("/nonexistent/target/aarch64-linux-android/release"),
            "{e}"
        );
    }
}
