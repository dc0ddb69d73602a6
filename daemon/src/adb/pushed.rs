//! The profile with heapprofd-rs pushed to the device: push the build and
//! the config to `/data/local/tmp/heapprofd-rs`, run the run's command
//! ([`on_device`](super::on_device)) in the foreground with its messages
//! forwarded to stderr, end it on Ctrl-C (`record` is sent SIGINT on the
//! device, so the trace is written), and pull the trace. A connection
//! lost mid-profile (no last line from the device) pulls what the device
//! wrote, if anything, as a partial trace.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::device::Device;
use super::device_build::{Build, FILES};
use super::on_device::{DEVICE_DIR, DeviceRun, finished};
use super::outcome::Outcome;
use super::progress::Progress;
use super::stop;

/// Pushes `build` and `config` for the run `run`.
pub fn push(dev: &Device, build: &Build, run: &DeviceRun, config: &Path) -> Result<()> {
    eprintln!(
        "pushing the {} build in {} to {}:{DEVICE_DIR}",
        build.arch,
        build.dir.display(),
        dev.serial
    );
    dev.shell(&format!("mkdir -p {}", run.dir)).with_context(|| {
        format!(
            "cannot create {} on {}; check that /data/local/tmp is writable (`adb shell ls -ld /data/local/tmp`)",
            run.dir, dev.serial
        )
    })?;
    for f in FILES {
        dev.push(&build.dir.join(f), &format!("{DEVICE_DIR}/{f}"))?;
    }
    dev.push(config, &run.config())?;
    dev.shell(&format!("chmod 755 {DEVICE_DIR}/heapprofd-rs"))
        .context("making the pushed heapprofd-rs executable")?;
    Ok(())
}

/// Runs the profile to its end; the trace (or a partial one) pulled to
/// `raw` (or `partial`).
pub fn record(
    dev: &Device,
    run: &DeviceRun,
    progress: &mut Progress,
    raw: &Path,
    partial: &Path,
) -> Result<Outcome> {
    let mut child = dev
        .cmd()
        .arg("shell")
        .arg(run.command())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("running adb shell")?;
    let mut out = child.stdout.take().context("adb's stdout")?;
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = child.stderr.take().context("adb's stderr")?;
    let stderr = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("device: {l}");
            lines.push(l);
        }
        lines
    });
    // Ctrl-C: SIGINT to `record` on the device, retried until it is
    // delivered (before `record` has started there is no pid to send it to).
    let (mut stopping, mut stopped) = (false, false);
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for adb shell")? {
            break st;
        }
        if stop::requested() && !stopped {
            if !stopping {
                stopping = true;
                progress.stopping();
            }
            stopped = dev.shell(&run.stop_command()).is_ok();
        }
        progress.tick();
        std::thread::sleep(Duration::from_millis(100));
    };
    progress.end_line();
    let stdout = stdout.join().unwrap_or_default();
    let err_lines = stderr.join().unwrap_or_default();
    match finished(&stdout) {
        Some(0) => {
            dev.pull(&run.trace(), raw).with_context(|| {
                format!(
                    "the profile finished but pulling its trace {} failed; \
                     it stays on the device: `adb pull {} .`",
                    run.trace(),
                    run.trace()
                )
            })?;
            Ok(Outcome::Finished(raw.to_path_buf()))
        }
        Some(rc) => bail!(
            "the profile failed on the device (exit {rc}): its messages are above \
             (`device: ...`), the service's log is {}/daemon.log there",
            run.dir
        ),
        None => {
            let why = err_lines
                .last()
                .cloned()
                .unwrap_or_else(|| format!("adb shell ended ({status}) before the profile did"));
            let pulled = dev.pull(&run.trace(), partial).is_ok()
                && std::fs::metadata(partial).is_ok_and(|m| m.len() > 0);
            if !pulled {
                let _ = std::fs::remove_file(partial);
            }
            let partial = pulled.then(|| partial.to_path_buf());
            Ok(Outcome::Lost { why, partial })
        }
    }
}
