//! The service's watch for programs that cannot load the client: a
//! statically linked program (or a 32-bit one) that a startup profile
//! wants (`-n NAME`, `--all`) sends nothing to the service, so it would be
//! silently missing from the trace. While such a profile runs, the
//! service lists `/proc` once a second; a process that appeared since the
//! last look, that a startup profile wants by name (or every process) and
//! may see (its requester may profile that user), has no session, and
//! whose executable has no dynamic loader (or is 32-bit) is named and
//! flagged in those profiles' traces as not profiled, with the reason
//! (as `record -- CMD` does for a static CMD), and `record`'s summary says
//! so.
//!
//! A process that lives less than the time between two looks (a second at
//! most) can still be missed: the watch samples, it does not trace
//! process creation.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use heapprofd_model::messages::Unprofilable;
use heapprofd_proto::triggers::process_name;
use tokio::sync::watch;

use super::BookMsg;
use super::book_msg::ServiceMsg;
use super::service_state::Service;
use crate::service::running;

/// Time between two looks at `/proc`.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Now, in clock ticks since boot (the unit of a process's start time in
/// `/proc/PID/stat`).
pub fn boot_ticks() -> u64 {
    let hz = ticks_per_second();
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        t.tv_sec() as u64 * hz + t.tv_nsec() as u64 * hz / 1_000_000_000
    })
}

/// Clock ticks per second (`CLK_TCK`).
fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |h| (h as u64).max(1))
}

/// How long ago process `pid` started, to the clock tick; `None` if it is
/// gone.
pub fn age(pid: u32) -> Option<Duration> {
    let ticks = boot_ticks().saturating_sub(start_ticks(pid)?);
    Some(Duration::from_millis(ticks * 1000 / ticks_per_second()))
}

/// Process `pid`'s start time in clock ticks since boot (field 22 of
/// `/proc/PID/stat`, counted after the command name's closing parenthesis).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Watches until the service stops.
pub(super) async fn watch(service: Arc<Service>, mut stop: watch::Receiver<bool>) {
    let mut known: Option<HashSet<u32>> = None;
    let mut tick = tokio::time::interval(PERIOD);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if !service.hub.wants_startup() {
            known = None;
            continue;
        }
        let s = Arc::clone(&service);
        let before = known.take();
        match tokio::task::spawn_blocking(move || look(&s, before)).await {
            Ok(now) => known = Some(now),
            Err(_) => return,
        }
    }
}

/// Lists the processes; those not in `before` (all on a first look) are
/// checked. What runs now.
fn look(service: &Service, before: Option<HashSet<u32>>) -> HashSet<u32> {
    let now = pids();
    let before = before.unwrap_or_default();
    for &pid in now.difference(&before) {
        check(service, pid);
    }
    now
}

/// Every process id in `/proc`.
fn pids() -> HashSet<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashSet::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Names process `pid` in the profiles that want it, if it cannot load
/// the client.
fn check(service: &Service, pid: u32) {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return;
    };
    if raw.is_empty() {
        // A kernel thread, or gone.
        return;
    }
    let name = String::from_utf8_lossy(process_name(&raw)).into_owned();
    let Some(uid) = running::effective_uid(pid) else {
        return;
    };
    let Some(start) = start_ticks(pid) else {
        return;
    };
    let profiles = service.hub.wanting_at_start(&name, uid, start);
    if profiles.is_empty() || service.hub.has_session(pid) {
        return;
    }
    let why = match super::program::check_file(Path::new(&format!("/proc/{pid}/exe"))) {
        // Set-user-ID programs do load /etc/ld.so.preload; only what no
        // loader runs for is certain.
        Some(w @ (Unprofilable::StaticProgram | Unprofilable::Program32Bit)) => w,
        _ => return,
    };
    let cmdline: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    log::warn!(
        "pid {pid} (`{}`) runs unprofiled: {}",
        cmdline.join(" "),
        why.describe()
    );
    let _ = service.book.send(BookMsg::Service(ServiceMsg::Unprofilable(
        profiles, pid, cmdline, why,
    )));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_started_before_now() {
        let me = start_ticks(std::process::id()).expect("our start time");
        let now = boot_ticks();
        assert!(me <= now + 1, "started at {me}, now {now}");
        assert!(now > 0);
        let mine = age(std::process::id()).expect("our age");
        assert!(mine < Duration::from_secs(24 * 3600), "{mine:?}");
        assert_eq!(age(u32::MAX), None);
    }
}
