//! What a run leaves on the host, from the pulled trace: the trace
//! symbolized (`heapprofd-rs symbolize`), the `report` text, a pprof file
//! per process and heap (`convert --pprof --pid --heap`), and the
//! `latest` symlink. Each step runs this same binary's subcommand, so the
//! files are exactly what those commands write.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Runs `heapprofd-rs ARGS` (this binary); its stdout.
fn this(args: &[&std::ffi::OsStr], what: &str) -> Result<Vec<u8>> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let out = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running heapprofd-rs {what}"))?;
    if !out.status.success() {
        bail!(
            "heapprofd-rs {what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// `raw` symbolized into `out` with the binaries in `symbols`; on failure
/// (no binary found...) `out` is a copy of `raw`, and the reason is
/// returned as a warning.
pub fn symbolize(raw: &Path, symbols: &[PathBuf], out: &Path) -> Result<Option<String>> {
    let dirs: Vec<&Path> = symbols
        .iter()
        .map(|p| p.as_path())
        .filter(|p| p.is_dir())
        .collect();
    let joined = std::env::join_paths(&dirs).context("the --symbols directories")?;
    let r = if dirs.is_empty() {
        Err(anyhow::anyhow!("no --symbols directory exists"))
    } else {
        this(
            &[
                "symbolize".as_ref(),
                raw.as_os_str(),
                "--symbols".as_ref(),
                &joined,
                "-o".as_ref(),
                out.as_os_str(),
            ],
            "symbolize",
        )
    };
    match r {
        Ok(_) => Ok(None),
        Err(e) => {
            std::fs::copy(raw, out).with_context(|| format!("copying {}", raw.display()))?;
            Ok(Some(format!("{e:#}")))
        }
    }
}

/// The `report` of `trace`, written to `out`.
pub fn report(trace: &Path, out: &Path) -> Result<()> {
    let text = this(&["report".as_ref(), trace.as_os_str()], "report")?;
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))
}

/// The (pid, heap) profiles in `trace`.
pub fn profiles(trace: &Path) -> Result<Vec<(u32, String)>> {
    let f = std::fs::File::open(trace).with_context(|| format!("opening {}", trace.display()))?;
    let data = heapprofd_model::trace::read_trace(std::io::BufReader::new(f))
        .with_context(|| format!("reading {}", trace.display()))?;
    let mut v: Vec<(u32, String)> = data
        .heaps
        .iter()
        .map(|h| (h.pid, h.heap_name.clone()))
        .collect();
    v.sort();
    v.dedup();
    Ok(v)
}

/// `heap_dump.<pid>.<heap>.pb.gz` in `dir` for every profile of `trace`;
/// the files written.
pub fn pprofs(trace: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (pid, heap) in profiles(trace)? {
        let safe: String = heap
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let out = dir.join(format!("heap_dump.{pid}.{safe}.pb.gz"));
        this(
            &[
                "convert".as_ref(),
                trace.as_os_str(),
                "--pprof".as_ref(),
                out.as_os_str(),
                "--pid".as_ref(),
                pid.to_string().as_ref(),
                "--heap".as_ref(),
                heap.as_ref(),
            ],
            "convert --pprof",
        )?;
        written.push(out);
    }
    Ok(written)
}

/// Points `DIR/latest` at `run` (a directory in `DIR`), replacing the
/// link atomically.
pub fn link_latest(dir: &Path, run: &Path) -> Result<()> {
    let name = run.file_name().context("the run's directory name")?;
    let tmp = dir.join(".latest.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(name, &tmp)
        .and_then(|()| std::fs::rename(&tmp, dir.join("latest")))
        .with_context(|| format!("pointing {}/latest at {}", dir.display(), run.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_moves_to_the_newest_run() {
        let d = tempfile::tempdir().unwrap();
        for run in ["heapprofd-1", "heapprofd-2"] {
            std::fs::create_dir(d.path().join(run)).unwrap();
            link_latest(d.path(), &d.path().join(run)).unwrap();
            assert_eq!(
                std::fs::read_link(d.path().join("latest")).unwrap(),
                Path::new(run)
            );
        }
    }
}
