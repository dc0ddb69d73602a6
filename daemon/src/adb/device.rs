//! The device, through `adb`: finding `adb` on `PATH`, choosing the one
//! device (or `ANDROID_SERIAL`'s), the Android version check, and the
//! `adb -s SERIAL` commands the workflow runs (`getprop`, `shell`, `push`,
//! `pull`). Every error names what failed and what to do.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, anyhow, bail};

/// Android 10, the first with heapprofd.
pub const MIN_SDK: u32 = 29;

/// `adb` found on `PATH`.
pub fn find_adb(path: Option<&OsStr>) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    for dir in std::env::split_paths(path.unwrap_or_default()) {
        let adb = dir.join("adb");
        if std::fs::metadata(&adb).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        {
            return Ok(adb);
        }
    }
    bail!(
        "adb was not found on PATH: install Android's platform-tools \
         (https://developer.android.com/tools/releases/platform-tools, or your \
         distribution's `adb` package) and put the directory holding `adb` on PATH"
    )
}

/// One line of `adb devices`: serial and state (`device`, `offline`,
/// `unauthorized`...).
pub fn parse_devices(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter(|l| !l.starts_with("List of devices") && !l.starts_with('*'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect()
}

/// The device to use: `serial` (from `ANDROID_SERIAL`) if given, else
/// the only one `adb devices` lists.
pub fn choose(devices: &[(String, String)], serial: Option<&str>) -> Result<String> {
    let (s, state) = match (serial, devices) {
        (Some(want), _) => devices.iter().find(|(s, _)| s == want).ok_or_else(|| {
            anyhow!(
                "ANDROID_SERIAL={want} is not among the devices adb lists ({}): \
                     connect it, or set ANDROID_SERIAL to one of them",
                list(devices)
            )
        })?,
        (None, []) => bail!(
            "no device: `adb devices` lists none; connect a device with USB debugging \
             enabled (or start an emulator) and check that `adb devices` shows it"
        ),
        (None, [one]) => one,
        (None, more) => bail!(
            "{} devices are connected ({}): choose one with ANDROID_SERIAL=SERIAL",
            more.len(),
            list(more)
        ),
    };
    if state != "device" {
        bail!(
            "device {s} is {state}: {}",
            match state.as_str() {
                "unauthorized" => "accept the USB debugging prompt on the device, then run again",
                _ => "reconnect it (check `adb devices`), then run again",
            }
        );
    }
    Ok(s.clone())
}

fn list(devices: &[(String, String)]) -> String {
    if devices.is_empty() {
        return "none".into();
    }
    let v: Vec<String> = devices.iter().map(|(s, st)| format!("{s} {st}")).collect();
    v.join(", ")
}

/// A chosen device.
#[derive(Debug, Clone)]
pub struct Device {
    /// The `adb` binary.
    pub adb: PathBuf,
    /// Its serial.
    pub serial: String,
}

impl Device {
    /// Finds the device: `adb devices`, then [`choose`].
    pub fn connect(adb: PathBuf, serial: Option<&str>) -> Result<Device> {
        let out = Command::new(&adb)
            .arg("devices")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {} devices", adb.display()))?;
        if !out.status.success() {
            bail!(
                "`adb devices` failed ({}): {}; check that adb works (`adb devices`)",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let devices = parse_devices(&String::from_utf8_lossy(&out.stdout));
        let serial = choose(&devices, serial)?;
        Ok(Device { adb, serial })
    }

    /// `adb -s SERIAL`.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(&self.adb);
        c.arg("-s").arg(&self.serial).stdin(Stdio::null());
        c
    }

    /// `adb shell getprop KEY`, trimmed.
    pub fn getprop(&self, key: &str) -> Result<String> {
        let out = self.run(self.cmd().args(["shell", "getprop", key]), "getprop")?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Android 10 or later, or an error saying which it is.
    pub fn check_android_version(&self) -> Result<u32> {
        let v = self.getprop("ro.build.version.sdk")?;
        let sdk: u32 = v.parse().map_err(|_| {
            anyhow!(
                "device {}: ro.build.version.sdk is `{v}`, not a number; is this an Android device?",
                self.serial
            )
        })?;
        if sdk < MIN_SDK {
            bail!(
                "device {} runs Android SDK {sdk}; heap profiling needs Android 10 (SDK {MIN_SDK}) \
                 or later: use a newer device or emulator image",
                self.serial
            );
        }
        Ok(sdk)
    }

    /// `adb push LOCAL REMOTE`.
    pub fn push(&self, local: &Path, remote: &str) -> Result<()> {
        self.run(self.cmd().arg("push").arg(local).arg(remote), "push")
            .map(drop)
            .with_context(|| {
                format!(
                    "pushing {} to {}:{remote} failed; check that the device has space \
                     in /data/local/tmp and that `adb push` works",
                    local.display(),
                    self.serial
                )
            })
    }

    /// `adb pull REMOTE LOCAL`.
    pub fn pull(&self, remote: &str, local: &Path) -> Result<()> {
        self.run(self.cmd().arg("pull").arg(remote).arg(local), "pull")
            .map(drop)
    }

    /// `adb shell SCRIPT`, its output (an error if adb fails to run or
    /// the command exits non-zero).
    pub fn shell(&self, script: &str) -> Result<Output> {
        self.run(self.cmd().arg("shell").arg(script), "shell")
    }

    fn run(&self, c: &mut Command, what: &str) -> Result<Output> {
        let out = c
            .output()
            .with_context(|| format!("running adb {what} on {}", self.serial))?;
        if !out.status.success() {
            bail!(
                "adb {what} on {} failed ({}): {}",
                self.serial,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
    }

    #[test]
    fn devices_output() {
        let out = "* daemon started successfully\nList of devices attached\n\
                   emulator-5554\tdevice\nR58M\tunauthorized\n\n";
        assert_eq!(
            parse_devices(out),
            d(&[("emulator-5554", "device"), ("R58M", "unauthorized")])
        );
    }

    #[test]
    fn choosing() {
        let one = d(&[("a", "device")]);
        let two = d(&[("a", "device"), ("b", "device")]);
        assert_eq!(choose(&one, None).unwrap(), "a");
        assert_eq!(choose(&two, Some("b")).unwrap(), "b");
        let e = choose(&two, None).unwrap_err().to_string();
        assert!(
            e.contains("2 devices") && e.contains("ANDROID_SERIAL"),
            "{e}"
        );
        let e = choose(&[], None).unwrap_err().to_string();
        assert!(e.contains("no device"), "{e}");
        let e = choose(&two, Some("c")).unwrap_err().to_string();
        assert!(e.contains("ANDROID_SERIAL=c"), "{e}");
        let e = choose(&d(&[("a", "unauthorized")]), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("USB debugging prompt"), "{e}");
    }
}
