//! The environment variables the daemon and `record` read, parsed once at
//! start-up into one struct (nothing else reads the environment).
//!
//! * `HEAPPROFD_DEBUG` (any value): debug messages (timings, cache and
//!   session statistics, the daemon's own CPU time and peak RSS, and
//!   where its time went: the `costs:` line, `runtime/costs.rs`).
//! * `HEAPPROFD_ATTACH=signal|ptrace`: how `record --pid` activates the
//!   client (default: the signal when the client is preloaded and catches
//!   it, else ptrace).
//! * `HEAPPROFD_ATTACH_TIMEOUT_MS`: how long `record --pid` looks for a
//!   thread at a safe point (default 10 s; not a number: the default).
//! * `LD_PRELOAD`: kept after the client library when `record` starts CMD.
//! * `HEAPPROFD_ATTACH_TEST_STALL=<step>`: tests only; `record --pid`'s
//!   injection stops for good at that step, for a test to kill it there
//!   (`heapprofd-inject`'s `stall.rs` lists the steps).
//! * `XDG_RUNTIME_DIR`: where `record -- CMD` makes its private runtime
//!   directory (`heapprofd-rs` inside it) when it is a usable directory of
//!   ours; otherwise `/tmp/heapprofd-rs-<uid>` (see `runtime::rundir`).
//! * `HEAPPROFD_SERVICE_DIR`: the profiling service's directory, for
//!   `heapprofd-rs daemon` and `record -n` alike (see
//!   `service::control::service_dir`).
//! * `ANDROID_SERIAL`: the device `android` uses when adb lists several
//!   (as adb itself reads it).
//! * `PATH`: where `android` looks for `adb`, and where `record -- CMD` looks for CMD, to tell whether it can
//!   load the client (`runtime::program`; the spawn itself searches `PATH`
//!   as exec does).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use heapprofd_proto::service::DIR_ENV;

/// How `record --pid` activates the client (`HEAPPROFD_ATTACH`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AttachChoice {
    /// Unset or empty: the signal when it works, else ptrace.
    #[default]
    Auto,
    /// `signal`.
    Signal,
    /// `ptrace`.
    Ptrace,
    /// Anything else (an error when `record --pid` runs).
    Invalid(String),
}

/// The environment, as the daemon uses it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    /// `HEAPPROFD_DEBUG` is set.
    pub debug: bool,
    /// `HEAPPROFD_ATTACH`.
    pub attach: AttachChoice,
    /// `HEAPPROFD_ATTACH_TIMEOUT_MS`, if it is a number.
    pub attach_timeout: Option<Duration>,
    /// `LD_PRELOAD`, if set and not empty.
    pub ld_preload: Option<OsString>,
    /// `XDG_RUNTIME_DIR`, if set and not empty.
    pub xdg_runtime_dir: Option<PathBuf>,
    /// `HEAPPROFD_ATTACH_TEST_STALL`, if set and not empty.
    pub attach_test_stall: Option<String>,
    /// `HEAPPROFD_SERVICE_DIR`, if set and not empty.
    pub service_dir: Option<PathBuf>,
    /// `PATH`, if set.
    pub path: Option<OsString>,
    /// `ANDROID_SERIAL`, if set and not empty.
    pub android_serial: Option<String>,
}

impl Env {
    /// Reads this process's environment.
    pub fn from_process() -> Env {
        Env::from_vars(|name| std::env::var_os(name))
    }

    /// Parses the variables `get` returns (tests pass their own).
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Env {
        let attach = match get("HEAPPROFD_ATTACH") {
            None => AttachChoice::Auto,
            Some(v) => match v.to_string_lossy().as_ref() {
                "" => AttachChoice::Auto,
                "signal" => AttachChoice::Signal,
                "ptrace" => AttachChoice::Ptrace,
                other => AttachChoice::Invalid(other.to_owned()),
            },
        };
        Env {
            debug: get("HEAPPROFD_DEBUG").is_some(),
            attach,
            attach_timeout: get("HEAPPROFD_ATTACH_TIMEOUT_MS")
                .and_then(|v| v.to_str()?.parse().ok())
                .map(Duration::from_millis),
            ld_preload: get("LD_PRELOAD").filter(|v| !v.is_empty()),
            xdg_runtime_dir: get("XDG_RUNTIME_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            attach_test_stall: get("HEAPPROFD_ATTACH_TEST_STALL")
                .map(|v| v.to_string_lossy().into_owned())
                .filter(|v| !v.is_empty()),
            service_dir: get(DIR_ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
            path: get("PATH"),
            android_serial: get("ANDROID_SERIAL")
                .map(|v| v.to_string_lossy().into_owned())
                .filter(|v| !v.is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Env {
        Env::from_vars(|n| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn parses_every_variable() {
        assert_eq!(env(&[]), Env::default());
        let e = env(&[
            ("HEAPPROFD_DEBUG", ""),
            ("HEAPPROFD_ATTACH", "ptrace"),
            ("HEAPPROFD_ATTACH_TIMEOUT_MS", "250"),
            ("LD_PRELOAD", "/x.so"),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ("HEAPPROFD_ATTACH_TEST_STALL", "call-0-ready"),
            ("HEAPPROFD_SERVICE_DIR", "/run/svc"),
            ("PATH", "/opt/bin:/bin"),
        ]);
        assert_eq!(
            e.service_dir.as_deref(),
            Some(std::path::Path::new("/run/svc"))
        );
        assert_eq!(e.path.as_deref(), Some("/opt/bin:/bin".as_ref()));
        assert_eq!(e.attach_test_stall.as_deref(), Some("call-0-ready"));
        assert!(e.debug);
        assert_eq!(e.attach, AttachChoice::Ptrace);
        assert_eq!(e.attach_timeout, Some(Duration::from_millis(250)));
        assert_eq!(e.ld_preload.as_deref(), Some("/x.so".as_ref()));
        assert_eq!(
            e.xdg_runtime_dir.as_deref(),
            Some(std::path::Path::new("/run/user/1000"))
        );
        let e = env(&[
            ("HEAPPROFD_ATTACH", "gdb"),
            ("HEAPPROFD_ATTACH_TIMEOUT_MS", "soon"),
            ("LD_PRELOAD", ""),
            ("XDG_RUNTIME_DIR", ""),
            ("HEAPPROFD_SERVICE_DIR", ""),
        ]);
        assert_eq!(e.service_dir, None);
        assert_eq!(e.attach, AttachChoice::Invalid("gdb".into()));
        assert_eq!(e.xdg_runtime_dir, None);
        assert_eq!((e.attach_timeout, e.ld_preload), (None, None));
        assert_eq!(env(&[("HEAPPROFD_ATTACH", "")]).attach, AttachChoice::Auto);
    }
}
