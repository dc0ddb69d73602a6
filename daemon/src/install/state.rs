//! The install state: what `heapprofd-rs install` changed, so that
//! `uninstall` can put the system back byte for byte. Kept as JSON in a
//! root-owned file (mode 0644, [`super::layout::Layout::state`]), written
//! before `/etc/ld.so.preload` is touched, so an install interrupted at any
//! point leaves either nothing to undo or a state that undoes it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// The version of the state file's format.
pub const VERSION: u32 = 1;

/// `/etc/ld.so.preload` as it was before the install.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileBefore {
    /// Its bytes, as hex (the file may hold anything).
    pub hex: String,
    /// Its permission bits.
    pub mode: u32,
    /// Its owner.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
}

/// What an install changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallState {
    /// [`VERSION`].
    pub version: u32,
    /// The build tag of the library that was installed.
    pub build_tag: String,
    /// The path written into the preload file (as the system sees it).
    pub library: String,
    /// The preload file before the install; `None` if there was none.
    pub preload_before: Option<FileBefore>,
    /// The preload file as the install wrote it (hex): uninstall restores
    /// [`Self::preload_before`] exactly only if the file still holds this.
    pub preload_written: String,
    /// Directories the install created (innermost last), removed again by
    /// uninstall if empty.
    pub created_dirs: Vec<PathBuf>,
}

impl InstallState {
    /// The saved preload bytes before the install (`None`: no file).
    pub fn before_bytes(&self) -> Result<Option<Vec<u8>>> {
        self.preload_before
            .as_ref()
            .map(|b| from_hex(&b.hex))
            .transpose()
    }

    /// The bytes the install wrote.
    pub fn written_bytes(&self) -> Result<Vec<u8>> {
        from_hex(&self.preload_written)
    }

    /// The state's JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Reads the state at `path`; `None` if there is none.
    pub fn load(path: &Path) -> Result<Option<InstallState>> {
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let s: InstallState = serde_json::from_slice(&data)
            .with_context(|| format!("{} is not an install state", path.display()))?;
        if s.version != VERSION {
            bail!(
                "{} has format version {}, this binary knows {VERSION}",
                path.display(),
                s.version
            );
        }
        Ok(Some(s))
    }
}

/// Lower-case hex of `b`.
pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Result<Vec<u8>> {
    if s.len() % 2 != 0 {
        bail!("odd hex length in the install state");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .context("bad hex in the install state")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_arbitrary_bytes() {
        let raw: Vec<u8> = (0..=255u8).collect();
        let s = InstallState {
            version: VERSION,
            build_tag: "t".into(),
            library: "/x.so".into(),
            preload_before: Some(FileBefore {
                hex: to_hex(&raw),
                mode: 0o600,
                uid: 0,
                gid: 0,
            }),
            preload_written: to_hex(b"/x.so\n"),
            created_dirs: vec![PathBuf::from("/a")],
        };
        let back: InstallState = serde_json::from_slice(&s.to_json()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.before_bytes().unwrap(), Some(raw));
        assert_eq!(back.written_bytes().unwrap(), b"/x.so\n");
    }
}
