//! What the trace says about a profiled process besides its heap: its
//! parent, its threads' names and its memory counters, read from `/proc`
//! (the model does no I/O): at the handshake, while the client waits for
//! the answer ([`read_identity`], [`read_memory`]: a process that exits
//! right after still has its parent and main thread named), then by the
//! bookkeeping thread when samples name a new thread and before every dump.
//!
//! Only kernel-made files are read (`stat`, `status`, `comm`), each
//! bounded in size, so a hostile peer cannot make these reads block or
//! grow. A process that has exited simply has nothing to read.
//!
//! A thread's name is read as `/proc/TID/comm`, not
//! `/proc/PID/task/TID/comm`, and `/proc/PID/task` is listed only when
//! the process has more than one thread: every entry looked up under
//! `/proc/PID/task/TID` is torn down twice at the process's exit, by its
//! last thread and by the parent's reap of the main one, and the reap
//! spins while the other teardown runs (`record`'s wait for its command
//! took 1.4-5.8 ms in 9 of 30 runs of `record -- /bin/true`, its client's
//! thread named that way; under 0.11 ms in 59 of 59 since).

use std::collections::BTreeMap;
use std::io::Read;

use heapprofd_model::profile::{ParentProcess, ProcessIdentity};
use heapprofd_model::trace::ProcessMemory;

/// Most threads named per process and read (a runaway process is cut).
const MAX_THREADS: usize = 4096;

/// At most `limit` bytes of a file, in as few reads as fit: a `/proc`
/// file reports no size, so reading it into an empty buffer starts with
/// 32-byte probes and doubles (6 to 8 reads of `/proc/PID/status`, each
/// generating the whole text, while the handshake's client waits).
fn read_bytes(path: &str, limit: u64) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::with_capacity(limit.min(4096) as usize);
    f.take(limit).read_to_end(&mut buf).ok()?;
    Some(buf)
}

fn read_small(path: &str, limit: u64) -> Option<String> {
    String::from_utf8(read_bytes(path, limit)?).ok()
}

/// The parent pid from `/proc/PID/stat` (after the last `)`: the command
/// name may hold spaces and parentheses).
pub fn read_ppid(pid: u32) -> Option<u32> {
    let stat = read_small(&format!("/proc/{pid}/stat"), 4096)?;
    parse_ppid(&stat)
}

fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// The process's command line (`/proc/PID/cmdline`; empty if it is gone).
pub fn read_cmdline(pid: u32) -> Vec<String> {
    let Some(bytes) = read_bytes(&format!("/proc/{pid}/cmdline"), u64::MAX) else {
        return Vec::new();
    };
    let mut args: Vec<String> = bytes
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    while args.last().is_some_and(|a| a.is_empty()) {
        args.pop();
    }
    args
}

/// The process's parent, its threads' names and its parent's pid, parent
/// and command line, as of now (read while the process is certainly
/// alive: its client waits in the handshake).
pub fn read_identity(pid: u32) -> ProcessIdentity {
    let status = read_status(pid);
    identity_with(pid, status.as_deref())
}

/// [`read_identity`] and [`read_memory`] from one read of
/// `/proc/PID/status`.
pub fn read_identity_and_memory(pid: u32) -> (ProcessIdentity, Option<ProcessMemory>) {
    let status = read_status(pid);
    let memory = status.as_deref().and_then(|s| parse_memory(pid, s));
    (identity_with(pid, status.as_deref()), memory)
}

fn read_status(pid: u32) -> Option<String> {
    read_small(&format!("/proc/{pid}/status"), 16 * 1024)
}

fn identity_with(pid: u32, status: Option<&str>) -> ProcessIdentity {
    let ppid = read_ppid(pid);
    let parent = ppid.filter(|&pp| pp != 0).map(|pp| ParentProcess {
        pid: pp,
        ppid: read_ppid(pp),
        cmdline: read_cmdline(pp),
    });
    ProcessIdentity {
        ppid,
        threads: threads_with(pid, status),
        parent,
    }
}

/// A thread's name (`comm`), if it still exists in process `pid` (see
/// the module docs for why not through `/proc/PID/task`).
pub fn read_thread_name(pid: u32, tid: u32) -> Option<String> {
    if tid != pid {
        // A tid that left the process may have been given to another.
        let status = read_small(&format!("/proc/{tid}/status"), 16 * 1024)?;
        if parse_status_field(&status, "Tgid") != Some(pid) {
            return None;
        }
    }
    let s = read_small(&format!("/proc/{tid}/comm"), 64)?;
    Some(s.trim_end_matches('\n').to_owned())
}

/// A numeric field (`Tgid`, `Threads`) of a `/proc/PID/status` text.
fn parse_status_field(status: &str, key: &str) -> Option<u32> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// Names of the process's current threads: the main thread alone when it
/// is the only one, else every one `/proc/PID/task` lists.
pub fn read_threads(pid: u32) -> BTreeMap<u32, String> {
    threads_with(pid, read_status(pid).as_deref())
}

/// [`read_threads`] with the process's `status` text already read.
fn threads_with(pid: u32, status: Option<&str>) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    if status.is_some_and(|s| parse_status_field(s, "Threads") == Some(1)) {
        if let Some(name) = read_thread_name(pid, pid) {
            out.insert(pid, name);
        }
        return out;
    }
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten().take(MAX_THREADS) {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        if let Some(name) = read_thread_name(pid, tid) {
            out.insert(tid, name);
        }
    }
    out
}

/// Memory counters from `/proc/PID/status`.
pub fn read_memory(pid: u32) -> Option<ProcessMemory> {
    parse_memory(pid, &read_status(pid)?)
}

fn parse_memory(pid: u32, status: &str) -> Option<ProcessMemory> {
    let mut m = ProcessMemory {
        pid,
        ..Default::default()
    };
    let mut seen = false;
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let kb = value
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or(0);
        let slot = match key {
            "VmSize" => &mut m.vm_size_kb,
            "VmRSS" => {
                seen = true;
                &mut m.vm_rss_kb
            }
            "RssAnon" => &mut m.rss_anon_kb,
            "RssFile" => &mut m.rss_file_kb,
            "RssShmem" => &mut m.rss_shmem_kb,
            "VmSwap" => &mut m.vm_swap_kb,
            "VmHWM" => &mut m.vm_hwm_kb,
            _ => continue,
        };
        *slot = kb;
    }
    // Zombies and kernel threads have no VmRSS line.
    seen.then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_and_status() {
        assert_eq!(parse_ppid("42 (a) b) c) S 17 42 42 0"), Some(17));
        assert_eq!(parse_ppid("garbage"), None);
        let m = parse_memory(
            9,
            "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 512 kB\n",
        )
        .unwrap();
        assert_eq!((m.vm_rss_kb, m.vm_hwm_kb, m.rss_anon_kb), (1024, 2048, 512));
        assert!(parse_memory(9, "Name:\tzombie\n").is_none());
        let status = "Name:\tx\nTgid:\t42\nPid:\t43\nThreads:\t3\n";
        assert_eq!(parse_status_field(status, "Tgid"), Some(42));
        assert_eq!(parse_status_field(status, "Threads"), Some(3));
        assert_eq!(parse_status_field(status, "Pid"), Some(43));
        assert_eq!(parse_status_field(status, "Ppid"), None);
        assert_eq!(parse_status_field("Tgid:\tx\n", "Tgid"), None);
    }

    #[test]
    fn names_threads_of_this_process_only() {
        let me = std::process::id();
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("procinfo-test".into())
            .spawn(move || {
                tx.send(nix::unistd::gettid().as_raw() as u32).unwrap();
                let _ = stop_rx.recv();
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        assert_eq!(read_thread_name(me, tid).as_deref(), Some("procinfo-test"));
        // The same tid asked of another process (our parent) is not named.
        let parent = nix::unistd::getppid().as_raw() as u32;
        assert_eq!(read_thread_name(parent, tid), None);
        let threads = read_threads(me);
        assert_eq!(threads.get(&tid).map(String::as_str), Some("procinfo-test"));
        drop(stop_tx);
        t.join().unwrap();
        // A process of one thread: named from /proc/PID/comm alone.
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .expect("start sleep");
        let pid = child.id();
        let mut threads = BTreeMap::new();
        for _ in 0..1000 {
            threads = read_threads(pid);
            if threads.get(&pid).is_some_and(|n| n == "sleep") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(threads, BTreeMap::from([(pid, "sleep".to_string())]));
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert_eq!(read_ppid(me), Some(nix::unistd::getppid().as_raw() as u32));
        assert!(read_memory(me).is_some_and(|m| m.vm_rss_kb > 0));
        let threads = read_threads(me);
        assert!(threads.contains_key(&me), "{threads:?}");
        let id = read_identity(me);
        let parent = id.parent.expect("this process's parent");
        assert_eq!(Some(parent.pid), id.ppid);
        assert_eq!(parent.cmdline, read_cmdline(parent.pid));
        assert!(!parent.cmdline.is_empty());
        assert_eq!(id.threads.get(&me), threads.get(&me));
        let (id2, memory) = read_identity_and_memory(me);
        assert_eq!(
            (id2.ppid, id2.parent.map(|p| p.pid)),
            (id.ppid, Some(parent.pid))
        );
        assert_eq!(id2.threads.get(&me), threads.get(&me));
        assert!(memory.is_some_and(|m| m.pid == me && m.vm_rss_kb > 0));
    }

    /// A command line longer than the first read's 4 KiB is read whole.
    #[test]
    fn a_long_command_line_is_read_whole() {
        let long = "x".repeat(20_000);
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 10", &long])
            .spawn()
            .expect("start sh");
        let want = vec!["sh".to_string(), "-c".into(), "sleep 10".into(), long];
        let mut got = Vec::new();
        for _ in 0..1000 {
            got = read_cmdline(child.id());
            if got == want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(got, want);
    }
}
