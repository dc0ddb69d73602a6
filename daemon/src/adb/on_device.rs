//! What runs on the device when heapprofd-rs is pushed: where the files
//! live under `/data/local/tmp`, and the one `adb shell` command line of a
//! run. The pushed binary is the same `heapprofd-rs` as on the host: the
//! command starts `heapprofd-rs daemon` (the profiling service, its
//! directory in `HEAPPROFD_SERVICE_DIR`), runs `heapprofd-rs record
//! --config` (the profile as a Perfetto config, no symbolization: that is
//! done on the host), then stops the service and prints a last line with
//! the exit code, so the host can tell a finished run from a lost
//! connection.

/// Where the pushed files live.
pub const DEVICE_DIR: &str = "/data/local/tmp/heapprofd-rs";

/// The service's directory on the device (the programs to profile find
/// it through `HEAPPROFD_SERVICE_DIR`).
pub fn service_dir() -> String {
    format!("{DEVICE_DIR}/service")
}

/// The client library to preload into programs on the device.
pub fn client_lib() -> String {
    format!("{DEVICE_DIR}/libheapprofd_client.so")
}

/// The last line of a run's output whenever the script reaches an end
/// (so not when the connection is lost): this, then the exit code
/// (`record`'s, or 1 when the service could not be started).
pub const DONE: &str = "heapprofd-rs-android: exit";

/// One run's files on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRun {
    /// Its directory.
    pub dir: String,
}

impl DeviceRun {
    /// The run named `stamp`.
    pub fn new(stamp: &str) -> DeviceRun {
        DeviceRun {
            dir: format!("{DEVICE_DIR}/runs/{stamp}"),
        }
    }

    /// The config `record --config` reads.
    pub fn config(&self) -> String {
        format!("{}/config.txt", self.dir)
    }

    /// The trace `record` writes.
    pub fn trace(&self) -> String {
        format!("{}/trace.pftrace", self.dir)
    }

    /// `record`'s pid, for stopping it.
    pub fn record_pid(&self) -> String {
        format!("{}/record.pid", self.dir)
    }

    /// The `adb shell` command (a shell script, one command a line) that
    /// runs the profile to its end.
    pub fn command(&self) -> String {
        let (d, r, s) = (DEVICE_DIR, &self.dir, service_dir());
        [
            format!("export HEAPPROFD_SERVICE_DIR={s}"),
            format!("mkdir -p {s} {r} || {{ echo \"{DONE} 1\"; exit 1; }}"),
            format!("rm -f {s}/control.sock"),
            format!("{d}/heapprofd-rs daemon </dev/null >{r}/daemon.log 2>&1 &"),
            "DPID=$!".into(),
            "n=0".into(),
            format!(
                "while [ ! -S {s}/control.sock ]; do \
                 if ! kill -0 $DPID 2>/dev/null || [ $n -gt 600 ]; then \
                 echo 'heapprofd-rs: the profiling service did not start on the device; its log:' >&2; \
                 cat {r}/daemon.log >&2; kill $DPID 2>/dev/null; echo \"{DONE} 1\"; exit 1; fi; \
                 n=$((n+1)); sleep 0.1; done"
            ),
            format!(
                "{d}/heapprofd-rs record --config {} --no-symbolize -o {} </dev/null &",
                self.config(),
                self.trace()
            ),
            "RPID=$!".into(),
            format!("echo $RPID >{}", self.record_pid()),
            "wait $RPID".into(),
            "RC=$?".into(),
            "kill -TERM $DPID".into(),
            "wait $DPID".into(),
            format!("echo \"{DONE} $RC\""),
            "exit $RC".into(),
        ]
        .join("\n")
    }

    /// The `adb shell` command line that ends the profile now (as Ctrl-C
    /// does to `record`: the trace is written).
    pub fn stop_command(&self) -> String {
        format!("kill -INT $(cat {})", self.record_pid())
    }
}

/// `record`'s exit code from a run's output, if the run finished (its
/// last line is [`DONE`]).
pub fn finished(stdout: &str) -> Option<i32> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(DONE)?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_and_its_end() {
        let r = DeviceRun::new("20261202-210000");
        let c = r.command();
        assert!(c.contains(
            "/data/local/tmp/heapprofd-rs/heapprofd-rs record --config \
             /data/local/tmp/heapprofd-rs/runs/20261202-210000/config.txt --no-symbolize"
        ));
        assert!(c.contains("export HEAPPROFD_SERVICE_DIR=/data/local/tmp/heapprofd-rs/service"));
        assert_eq!(finished(&format!("x\n{DONE} 0\n")), Some(0));
        assert_eq!(finished(&format!("{DONE} 1")), Some(1));
        assert_eq!(finished("profiling...\n"), None);
    }
}
