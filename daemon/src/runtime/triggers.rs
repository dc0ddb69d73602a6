//! How the service tells processes that a profile wants them, behind one
//! interface ([`Triggers`]): the startup triggers a process checks when it
//! starts, and the wake-up of a running process.
//!
//! * Linux ([`TriggerStore`]): the trigger store in the service directory
//!   (`heapprofd_proto::triggers`, read by the client's constructor), and
//!   `sigqueue(pid, 36, 0)` (signal value 0: "the service") to processes
//!   that have the client or the bionic front-end mapped.
//! * Android ([`PropertyTriggers`] over [`SystemProperties`]): the system
//!   properties bionic's libc reads at start-up, set and cleared by
//!   reference count as Perfetto's heapprofd does: `heapprofd.enable.<name>`
//!   = `1` while at least one profile wants the name, `heapprofd.enable` =
//!   `all` while one wants every process, else `1` while any name is
//!   wanted, else cleared; and `sigqueue(pid, __SIGRTMIN + 4, {sival_int =
//!   0})`, which bionic's profiling handler takes for heapprofd, to any
//!   process (bionic loads the client itself).
//!   Only type-checked here (`cargo check --target aarch64-linux-android`);
//!   the reference counting is tested on Linux with a recording setter.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
use heapprofd_proto::service::TRIGGERS_FILE;

/// What the running profiles want from start-up (the hub's view).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Whether any profile runs at all (a woken process needs to find the
    /// service even when no profile wants start-ups).
    pub any_profile: bool,
    /// How many profiles want every process from start-up.
    pub all: u32,
    /// How many profiles want each process name from start-up.
    pub names: BTreeMap<String, u32>,
}

/// Where startup triggers are published and how a running process is woken.
pub trait Triggers: Send + Sync + std::fmt::Debug {
    /// Publishes what the profiles now want (called whenever one starts or
    /// ends; the last call, with nothing wanted, clears everything).
    fn publish(&self, wanted: &Wanted) -> Result<()>;
    /// Whether running process `pid` would answer [`Self::wake`]: on Linux
    /// only with the client (or the bionic front-end) mapped and the
    /// activation signal caught; on Android
    /// every process, bionic's libc handles the signal itself.
    fn can_wake(&self, pid: u32) -> bool;
    /// Wakes running process `pid`: it connects to the service.
    fn wake(&self, pid: u32) -> Result<()>;
    /// Whether the dormant client of running process `pid` (one
    /// [`Self::can_wake`] says the signal wakes) can also be activated at
    /// once with ptrace, a call of its attach entry: only the glibc client
    /// has one (not the bionic front-end, nor bionic's own loading on
    /// Android).
    fn ptrace_activates(&self, pid: u32) -> bool {
        let _ = pid;
        false
    }
}

/// `sigqueue(pid, __SIGRTMIN + 4, {sival_int = 0})`: the profiling signal
/// with bionic's value for heapprofd (our glibc client's "the service").
fn wake_with_signal(pid: u32) -> Result<()> {
    heapprofd_inject::signal_activate(pid, 0).map_err(anyhow::Error::from)
}

/// Linux: the trigger store file in the service directory.
#[derive(Debug)]
pub struct TriggerStore {
    dir: PathBuf,
}

impl TriggerStore {
    /// The store of the service in `dir`.
    pub fn new(dir: &Path) -> TriggerStore {
        TriggerStore {
            dir: dir.to_path_buf(),
        }
    }
}

impl Triggers for TriggerStore {
    fn publish(&self, wanted: &Wanted) -> Result<()> {
        let path = self.dir.join(TRIGGERS_FILE);
        if !wanted.any_profile {
            let _ = std::fs::remove_file(&path);
            return Ok(());
        }
        let bytes = heapprofd_proto::triggers::encode(
            wanted.all,
            wanted.names.iter().map(|(n, c)| (n.as_str(), *c)),
        );
        write_triggers(&self.dir, &bytes)
    }

    fn can_wake(&self, pid: u32) -> bool {
        // A client loaded with ptrace (an earlier `record --pid`) is mapped
        // but takes no signal: it would die of it.
        crate::service::running::has_client(pid)
            && crate::service::running::catches_activation_signal(pid)
    }

    fn wake(&self, pid: u32) -> Result<()> {
        wake_with_signal(pid)
    }

    fn ptrace_activates(&self, pid: u32) -> bool {
        crate::service::running::has_glibc_client(pid)
    }
}

/// Replaces the trigger store atomically (write, then rename), mode 0644
/// (clients of every user read it; only we write it).
fn write_triggers(dir: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{TRIGGERS_FILE}.tmp"));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, dir.join(TRIGGERS_FILE))
        .with_context(|| format!("installing {}", dir.join(TRIGGERS_FILE).display()))
}

/// Sets one system property (`""` clears it).
pub trait PropertySetter: Send + Sync + std::fmt::Debug {
    /// `setprop name value`.
    fn set(&self, name: &str, value: &str) -> Result<()>;
}

/// bionic's `heapprofd.enable` property.
pub const ENABLE_PROPERTY: &str = "heapprofd.enable";

/// Android: the startup properties, set while wanted (see the module doc).
#[derive(Debug)]
pub struct PropertyTriggers<S: PropertySetter> {
    setter: S,
    /// What is set now: `heapprofd.enable`'s value and the names whose
    /// property is `1`.
    set: Mutex<(String, Vec<String>)>,
}

impl<S: PropertySetter> PropertyTriggers<S> {
    /// Nothing set yet.
    pub fn new(setter: S) -> PropertyTriggers<S> {
        PropertyTriggers {
            setter,
            set: Mutex::new((String::new(), Vec::new())),
        }
    }
}

impl<S: PropertySetter> Triggers for PropertyTriggers<S> {
    fn publish(&self, wanted: &Wanted) -> Result<()> {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        let names: Vec<String> = wanted
            .names
            .iter()
            .filter(|(_, count)| **count > 0)
            .map(|(n, _)| n.clone())
            .collect();
        // Names first, then the switch: a process starting meanwhile sees
        // `heapprofd.enable` only once its name's property is there.
        for n in names.iter().filter(|n| !set.1.contains(n)) {
            self.setter.set(&format!("{ENABLE_PROPERTY}.{n}"), "1")?;
        }
        let enable = if wanted.all > 0 {
            "all"
        } else if names.is_empty() {
            ""
        } else {
            "1"
        };
        if set.0 != enable {
            self.setter.set(ENABLE_PROPERTY, enable)?;
        }
        for n in set.1.iter().filter(|n| !names.contains(n)) {
            self.setter.set(&format!("{ENABLE_PROPERTY}.{n}"), "")?;
        }
        *set = (enable.to_string(), names);
        Ok(())
    }

    fn can_wake(&self, _pid: u32) -> bool {
        // bionic's libc takes the signal in every profileable process and
        // loads heapprofd_client.so itself.
        true
    }

    fn wake(&self, pid: u32) -> Result<()> {
        wake_with_signal(pid)
    }
}

/// bionic's `__system_property_set`.
#[cfg(target_os = "android")]
#[derive(Debug)]
pub struct SystemProperties;

#[cfg(target_os = "android")]
impl PropertySetter for SystemProperties {
    fn set(&self, name: &str, value: &str) -> Result<()> {
        let n = std::ffi::CString::new(name).context("a property name with a NUL")?;
        let v = std::ffi::CString::new(value).context("a property value with a NUL")?;
        // SAFETY: two NUL-terminated strings.
        let rc = unsafe { libc::__system_property_set(n.as_ptr(), v.as_ptr()) };
        anyhow::ensure!(
            rc == 0,
            "setting the property {name} to {value:?} failed ({rc})"
        );
        Ok(())
    }
}

/// The platform's triggers for the service in `dir`.
pub fn for_platform(dir: &Path) -> Box<dyn Triggers> {
    #[cfg(target_os = "android")]
    {
        let _ = dir;
        Box::new(PropertyTriggers::new(SystemProperties))
    }
    #[cfg(not(target_os = "android"))]
    {
        Box::new(TriggerStore::new(dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<(String, String)>>);

    impl PropertySetter for &Recorder {
        fn set(&self, name: &str, value: &str) -> Result<()> {
            self.0.lock().unwrap().push((name.into(), value.into()));
            Ok(())
        }
    }

    fn wanted(all: u32, names: &[(&str, u32)]) -> Wanted {
        Wanted {
            any_profile: true,
            all,
            names: names.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        }
    }

    fn take(r: &Recorder) -> Vec<(String, String)> {
        std::mem::take(&mut *r.0.lock().unwrap())
    }

    fn p(n: &str, v: &str) -> (String, String) {
        (n.into(), v.into())
    }

    #[test]
    fn properties_are_set_while_wanted_and_cleared_after_the_last() {
        let r = Recorder::default();
        let t = PropertyTriggers::new(&r);
        t.publish(&wanted(0, &[("app", 1)])).unwrap();
        assert_eq!(
            take(&r),
            [p("heapprofd.enable.app", "1"), p("heapprofd.enable", "1")]
        );
        // A second profile of the same name, one of another: only the new
        // name is set.
        t.publish(&wanted(0, &[("app", 2), ("sh", 1)])).unwrap();
        assert_eq!(take(&r), [p("heapprofd.enable.sh", "1")]);
        // One of the two `app` profiles ends: `app` stays set.
        t.publish(&wanted(0, &[("app", 1), ("sh", 1)])).unwrap();
        assert_eq!(take(&r), []);
        // A whole-system profile.
        t.publish(&wanted(1, &[("app", 1), ("sh", 1)])).unwrap();
        assert_eq!(take(&r), [p("heapprofd.enable", "all")]);
        // `app`'s last profile and the whole-system one end.
        t.publish(&wanted(0, &[("app", 0), ("sh", 1)])).unwrap();
        assert_eq!(
            take(&r),
            [p("heapprofd.enable", "1"), p("heapprofd.enable.app", "")]
        );
        // The last profile ends: everything cleared.
        t.publish(&Wanted::default()).unwrap();
        assert_eq!(
            take(&r),
            [p("heapprofd.enable", ""), p("heapprofd.enable.sh", "")]
        );
    }

    #[test]
    fn the_store_exists_while_a_profile_runs() {
        let dir = tempfile::tempdir().unwrap();
        let t = TriggerStore::new(dir.path());
        let store = dir.path().join(TRIGGERS_FILE);
        t.publish(&wanted(0, &[])).unwrap();
        assert!(store.exists());
        t.publish(&wanted(0, &[("app", 1)])).unwrap();
        let text = std::fs::read_to_string(&store).unwrap();
        assert!(text.contains("app"), "{text}");
        t.publish(&Wanted::default()).unwrap();
        assert!(!store.exists());
    }
}
