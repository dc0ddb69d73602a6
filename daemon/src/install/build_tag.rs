//! Reading the build tag of a client library file: the bytes of its
//! `.heapprofd_rs_build` section (`heapprofd_proto::BUILD_TAG_SECTION`),
//! which the library's `build_tag.rs` fills with `heapprofd_proto::BUILD_TAG`
//! of the build that made it.

use std::path::Path;

use anyhow::{Context, Result};
use heapprofd_proto::{BUILD_TAG, BUILD_TAG_SECTION};
use object::{Object, ObjectSection};

/// What a library file's tag says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tag {
    /// The tag of this binary's build.
    Same,
    /// Another build's tag.
    Other(String),
    /// No tag (not an ELF file, or a library without the section).
    Missing,
}

/// The tag of the library at `path` (an error only if it cannot be read).
pub fn read(path: &Path) -> Result<Tag> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(of_bytes(&data))
}

/// The tag of a library's bytes.
pub fn of_bytes(data: &[u8]) -> Tag {
    let Ok(file) = object::File::parse(data) else {
        return Tag::Missing;
    };
    let Some(bytes) = file
        .section_by_name(BUILD_TAG_SECTION)
        .and_then(|s| s.data().ok())
    else {
        return Tag::Missing;
    };
    if bytes == BUILD_TAG.as_bytes() {
        Tag::Same
    } else {
        Tag::Other(String::from_utf8_lossy(bytes).into_owned())
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tag::Same => write!(f, "build tag `{BUILD_TAG}` (this binary's)"),
            Tag::Other(t) => write!(f, "build tag `{t}` (this binary's is `{BUILD_TAG}`)"),
            Tag::Missing => write!(f, "no build tag (this binary's is `{BUILD_TAG}`)"),
        }
    }
}
