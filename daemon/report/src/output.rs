//! Where `convert` writes: a file, or stdout for `-`.
//!
//! A path that cannot be created is a bad argument (exit 2, like `record
//! -o` into a missing directory), found before anything is written; a
//! write that fails later (disk full) is a failure (exit 1).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// A bad argument found after parsing: the binary exits with 2, like
/// clap's usage errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Whether `path` means stdout.
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// An output being written.
pub struct Output {
    path: PathBuf,
    w: BufWriter<Box<dyn Write>>,
    file: Option<File>,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output").field("path", &self.path).finish()
    }
}

impl Output {
    /// Opens `path` (`-`: stdout); an uncreatable path is a [`UsageError`].
    pub fn create(path: &Path) -> anyhow::Result<Output> {
        if is_stdout(path) {
            return Ok(Output {
                path: path.to_owned(),
                w: BufWriter::new(Box::new(io::stdout())),
                file: None,
            });
        }
        let f = File::create(path).map_err(|e| {
            UsageError(format!(
                "cannot create {}: {e}; check the directory exists and is writable",
                path.display()
            ))
        })?;
        let clone = f.try_clone().ok();
        Ok(Output {
            path: path.to_owned(),
            w: BufWriter::new(Box::new(f)),
            file: clone,
        })
    }

    /// Whether this output is stdout.
    pub fn is_stdout(&self) -> bool {
        is_stdout(&self.path)
    }

    /// The writer.
    pub fn writer(&mut self) -> &mut impl Write {
        &mut self.w
    }

    /// The error of a failed write to this output.
    pub fn write_error(&self) -> String {
        format!("cannot write {} (disk full?)", self.display())
    }

    /// `stdout` or the path, for messages.
    pub fn display(&self) -> String {
        if is_stdout(&self.path) {
            "stdout".to_owned()
        } else {
            self.path.display().to_string()
        }
    }

    /// Flushes (and syncs a file).
    pub fn finish(mut self) -> anyhow::Result<()> {
        let what = self.write_error();
        match self.w.flush() {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe && self.is_stdout() => Ok(()),
            r => r.with_context(|| what.clone()),
        }?;
        if let Some(f) = &self.file {
            f.sync_all().with_context(|| what)?;
        }
        Ok(())
    }
}

/// Checks that at most one of `paths` is stdout.
pub fn check_outputs(paths: &[&PathBuf]) -> Result<(), UsageError> {
    if paths.iter().filter(|p| is_stdout(p)).count() > 1 {
        return Err(UsageError(
            "only one output can be `-` (stdout); give the others file names".into(),
        ));
    }
    Ok(())
}
