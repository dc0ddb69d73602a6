//! The profile with the device's own heapprofd (`--perfetto`), as
//! `tools/heap_profile` runs it: the config on the stdin of `adb shell
//! perfetto --txt -c - -o /data/misc/perfetto-traces/... -d` (detached: it
//! prints the session's pid), polled until that process is gone (SIGINT
//! to it on Ctrl-C: perfetto ends the session and writes the trace), then
//! the trace pulled.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use super::device::Device;
use super::outcome::Outcome;
use super::progress::Progress;
use super::stop;

/// Where the device's perfetto may write traces.
pub const TRACE_DIR: &str = "/data/misc/perfetto-traces";

/// The trace of the run `stamp` on the device.
pub fn remote_trace(stamp: &str) -> String {
    format!("{TRACE_DIR}/heapprofd-rs-{stamp}.pftrace")
}

/// The `adb shell` command line that starts the session (config on stdin).
pub fn command(remote: &str) -> String {
    format!("perfetto --txt -c - -o {remote} -d")
}

/// Starts the session: its pid.
fn start(dev: &Device, config: &str, remote: &str) -> Result<u32> {
    let mut child = dev
        .cmd()
        .arg("shell")
        .arg(command(remote))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running adb shell perfetto")?;
    let mut stdin = child.stdin.take().context("adb's stdin")?;
    stdin
        .write_all(config.as_bytes())
        .context("writing the config to adb shell perfetto")?;
    drop(stdin);
    let out = child
        .wait_with_output()
        .context("waiting for adb shell perfetto")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "`perfetto` on {} refused the profile ({}): {}; run with --print-config to see \
             the config, and check that the device's heapprofd can profile the targets \
             (debuggable or profileable apps; all native processes on userdebug builds)",
            dev.serial,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    text.lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .ok_or_else(|| {
            anyhow!(
                "`perfetto -d` on {} printed no session pid: `{}`",
                dev.serial,
                text.trim()
            )
        })
}

/// Whether the process `pid` still runs on the device.
fn running(dev: &Device, pid: u32) -> Result<bool> {
    let out = dev.shell(&format!(
        "if [ -d /proc/{pid} ]; then echo running; else echo ended; fi"
    ))?;
    Ok(String::from_utf8_lossy(&out.stdout).contains("running"))
}

/// Runs the profile to its end; the trace pulled to `raw` (or a partial
/// one to `partial` when the device is lost while polling).
pub fn record(
    dev: &Device,
    config: &str,
    remote: &str,
    progress: &mut Progress,
    raw: &Path,
    partial: &Path,
) -> Result<Outcome> {
    let pid = start(dev, config, remote)?;
    let mut stop_sent = false;
    let mut polled = Instant::now();
    loop {
        if stop::requested() && !stop_sent {
            stop_sent = true;
            progress.stopping();
            if let Err(e) = dev.shell(&format!("kill -INT {pid}")) {
                eprintln!("could not stop perfetto on the device: {e:#}");
            }
        }
        if polled.elapsed() >= Duration::from_millis(500) {
            polled = Instant::now();
            match running(dev, pid) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    progress.end_line();
                    let pulled = dev.pull(remote, partial).is_ok()
                        && std::fs::metadata(partial).is_ok_and(|m| m.len() > 0);
                    return Ok(Outcome::Lost {
                        why: format!("{e:#}"),
                        partial: pulled.then(|| partial.to_path_buf()),
                    });
                }
            }
        }
        progress.tick();
        std::thread::sleep(Duration::from_millis(100));
    }
    progress.end_line();
    dev.pull(remote, raw).with_context(|| {
        format!(
            "the session ended but pulling {remote} failed; did perfetto write it? \
             (`adb shell ls -l {TRACE_DIR}`)"
        )
    })?;
    Ok(Outcome::Finished(raw.to_path_buf()))
}
