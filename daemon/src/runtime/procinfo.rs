//! What the trace says about a profiled process besides its heap: its
//! parent, its threads' names and its memory counters, read from `/proc`
//! by the bookkeeping thread (the model does no I/O) when its session
//! starts, when samples name a new thread, and before every dump.
//!
//! Only kernel-made files are read (`stat`, `status`, `task/*/comm`),
//! each bounded in size, so a hostile peer cannot make these reads block
//! or grow. A process that has exited simply has nothing to read.

use std::collections::BTreeMap;
use std::io::Read;

use heapprofd_model::trace::ProcessMemory;

/// Most threads named per process and read (a runaway process is cut).
const MAX_THREADS: usize = 4096;

fn read_small(path: &str, limit: u64) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    let mut s = String::new();
    f.take(limit).read_to_string(&mut s).ok()?;
    Some(s)
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

/// A thread's name (`comm`), if it still exists.
pub fn read_thread_name(pid: u32, tid: u32) -> Option<String> {
    let s = read_small(&format!("/proc/{pid}/task/{tid}/comm"), 64)?;
    Some(s.trim_end_matches('\n').to_owned())
}

/// Names of the process's current threads.
pub fn read_threads(pid: u32) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
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
    let status = read_small(&format!("/proc/{pid}/status"), 16 * 1024)?;
    parse_memory(pid, &status)
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
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert_eq!(read_ppid(me), Some(nix::unistd::getppid().as_raw() as u32));
        assert!(read_memory(me).is_some_and(|m| m.vm_rss_kb > 0));
        let threads = read_threads(me);
        assert!(threads.contains_key(&me), "{threads:?}");
    }
}
