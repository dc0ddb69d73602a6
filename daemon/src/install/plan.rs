//! What `install` and `uninstall` would change, as a list of [`Action`]s
//! computed from the file system as it is (no change made here), in the
//! order that keeps the machine working if it stops half-way: install
//! copies the library and saves the state before the preload file names
//! the library; uninstall restores the preload file before it removes the
//! library.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use heapprofd_proto::BUILD_TAG;

use super::action::{Action, Owner, ROOT_0644};
use super::build_tag::{self, Tag};
use super::layout::Layout;
use super::preload;
use super::state::{FileBefore, InstallState, VERSION, to_hex};

/// A file's bytes and owner, or `None` if it does not exist.
fn read_file(path: &Path) -> Result<Option<(Vec<u8>, Owner)>> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let m = std::fs::metadata(path)
                .with_context(|| format!("reading the metadata of {}", path.display()))?;
            Ok(Some((
                bytes,
                Owner {
                    mode: m.mode() & 0o7777,
                    uid: m.uid(),
                    gid: m.gid(),
                },
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// A preload file that is a symbolic link is left alone: replacing it would
/// change what it is, and writing through it would change another file.
fn refuse_symlink(path: &Path) -> Result<()> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        bail!(
            "{} is a symbolic link; add {} to the file it points to by hand",
            path.display(),
            Layout::library_entry()
        );
    }
    Ok(())
}

/// The changes that install `source` (the client library of this build).
pub fn install(layout: &Layout, source: &Path, force: bool) -> Result<Vec<Action>> {
    let entry = Layout::library_entry();
    let source_tag = build_tag::read(source)?;
    if source_tag != Tag::Same && !force {
        bail!(
            "the client library {} has {source_tag}: it was not built with this binary; \
             rebuild both (`cargo build --release`), or pass --force",
            source.display()
        );
    }
    let lib = layout.library();
    let installed = read_file(&lib)?;
    if let Some((bytes, _)) = &installed {
        let tag = build_tag::of_bytes(bytes);
        if tag != Tag::Same && !force {
            bail!(
                "an installed client library {} has {tag}; run `heapprofd-rs uninstall` \
                 first, or pass --force to replace it (running programs keep the old one)",
                lib.display()
            );
        }
    }
    let old_state = InstallState::load(&layout.state())?;
    refuse_symlink(&layout.preload())?;
    let current = read_file(&layout.preload())?;

    let mut actions = Vec::new();
    let mut created = Vec::new();
    for d in layout.dirs() {
        if !d.exists() {
            actions.push(Action::CreateDir(d.clone()));
            created.push(d);
        }
    }
    let source_bytes =
        std::fs::read(source).with_context(|| format!("reading {}", source.display()))?;
    let copy = installed
        .as_ref()
        .is_none_or(|(bytes, owner)| *bytes != source_bytes || *owner != ROOT_0644);
    if copy {
        actions.push(Action::CopyLibrary {
            from: source.to_path_buf(),
            to: lib.clone(),
        });
    }

    let current_bytes = current.as_ref().map(|(b, _)| b.as_slice());
    let new_preload = preload::with_entry(current_bytes.unwrap_or(&[]), entry.as_bytes());
    let state = match &old_state {
        Some(s) => InstallState {
            build_tag: BUILD_TAG.to_owned(),
            preload_written: to_hex(&new_preload),
            created_dirs: [s.created_dirs.clone(), created].concat(),
            ..s.clone()
        },
        None => InstallState {
            version: VERSION,
            build_tag: BUILD_TAG.to_owned(),
            library: entry.clone(),
            // A preload file that names the library without a state (a
            // state lost): what it was before is it without that line.
            preload_before: current.as_ref().map(|(b, o)| FileBefore {
                hex: to_hex(&preload::without_entry(b, entry.as_bytes())),
                mode: o.mode,
                uid: o.uid,
                gid: o.gid,
            }),
            preload_written: to_hex(&new_preload),
            created_dirs: created,
        },
    };
    if old_state.as_ref() != Some(&state) {
        actions.push(Action::WriteState {
            path: layout.state(),
            state: Box::new(state),
        });
    }
    if current_bytes != Some(new_preload.as_slice()) {
        actions.push(Action::CheckLoads(lib));
        let what = match current_bytes {
            None => format!("create, with the line `{entry}`,"),
            Some(_) => format!("add the line `{entry}` to"),
        };
        actions.push(Action::WritePreload {
            path: layout.preload(),
            bytes: new_preload,
            owner: current.map_or(ROOT_0644, |(_, o)| o),
            what,
        });
    }
    Ok(actions)
}

/// The changes that undo an install, and warnings for what cannot be put
/// back exactly.
pub fn uninstall(layout: &Layout) -> Result<(Vec<Action>, Vec<String>)> {
    let entry = Layout::library_entry();
    let state = InstallState::load(&layout.state())?;
    let preload_path = layout.preload();
    refuse_symlink(&preload_path)?;
    let current = read_file(&preload_path)?;
    let mut actions = Vec::new();
    let mut warnings = Vec::new();

    let remove_line = |bytes: &[u8], owner: Owner| Action::WritePreload {
        path: preload_path.clone(),
        bytes: preload::without_entry(bytes, entry.as_bytes()),
        owner,
        what: format!("remove the line `{entry}` from"),
    };
    match (&state, &current) {
        (Some(s), Some((bytes, _))) if *bytes == s.written_bytes()? => {
            match (s.before_bytes()?, &s.preload_before) {
                (Some(before), Some(b)) => actions.push(Action::WritePreload {
                    path: preload_path.clone(),
                    bytes: before,
                    owner: Owner {
                        mode: b.mode,
                        uid: b.uid,
                        gid: b.gid,
                    },
                    what: "restore, as it was before the install,".to_owned(),
                }),
                _ => actions.push(Action::RemoveFile {
                    path: preload_path.clone(),
                    what: "the preload file (there was none before the install)",
                }),
            }
        }
        (_, Some((bytes, owner))) if preload::names(bytes, entry.as_bytes()) => {
            if state.is_some() {
                warnings.push(format!(
                    "{} changed since the install: only the line `{entry}` is removed",
                    preload_path.display()
                ));
            }
            actions.push(remove_line(bytes, *owner));
        }
        (Some(_), _) => warnings.push(format!(
            "{} no longer names {entry}: left as it is",
            preload_path.display()
        )),
        (None, _) => {}
    }
    let lib = layout.library();
    if lib.exists() {
        actions.push(Action::RemoveFile {
            path: lib,
            what: "the client library",
        });
    }
    if let Some(s) = &state {
        actions.push(Action::RemoveFile {
            path: layout.state(),
            what: "the install state",
        });
        let mut dirs: Vec<PathBuf> = s.created_dirs.clone();
        dirs.reverse();
        actions.extend(dirs.into_iter().map(Action::RemoveDir));
    }
    Ok((actions, warnings))
}
