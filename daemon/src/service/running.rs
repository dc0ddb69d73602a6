//! Finding the running processes a profile wants: by name (bionic's
//! normalized name of `/proc/PID/cmdline`, [`process_name`]; `*` and `?`
//! globs, a leading `/` matching the whole first argument), by pid, or
//! every process that has the client loaded (`--all`). Processes we may not
//! read (another user's, gone meanwhile) are skipped.

use heapprofd_proto::triggers::process_name;

use super::spec::{Targets, is_glob};

/// The client library's file name, as it appears in `/proc/PID/maps`.
pub const CLIENT_FILE: &str = heapprofd_proto::attach::CLIENT_FILE_NAME;

/// A running process a profile wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Process id.
    pub pid: u32,
    /// Its name (bionic's rule).
    pub name: String,
}

/// Every process id in `/proc`, but ours.
fn pids() -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut v: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&p| p != me)
        .collect();
    v.sort_unstable();
    v
}

/// The first argument and the name of process `pid`.
fn names_of(pid: u32) -> Option<(String, String)> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let first = cmdline.split(|&b| b == 0).next().unwrap_or(&[]);
    let name = process_name(&cmdline);
    if name.is_empty() {
        return None;
    }
    Some((
        String::from_utf8_lossy(first).into_owned(),
        String::from_utf8_lossy(name).into_owned(),
    ))
}

/// The effective user of process `pid` (`Uid:` of its status, second
/// field), if it still exists.
pub fn effective_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// What decides whether the client may be loaded into process `pid` for a
/// user ([`super::access::may_inject`]), if it still exists.
pub fn ptrace_identity(pid: u32) -> Option<super::access::PtraceIdentity> {
    use std::os::unix::fs::MetadataExt;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ids = |key: &str| -> Option<[u32; 4]> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        let v: Vec<u32> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|n| n.parse().ok())
            .collect();
        v.try_into().ok()
    };
    Some(super::access::PtraceIdentity {
        uids: ids("Uid:")?,
        gids: ids("Gid:")?,
        proc_owner: std::fs::metadata(format!("/proc/{pid}")).ok()?.uid(),
    })
}

/// Whether process `pid` catches the activation signal (`SigCgt` of its
/// status): a preloaded client does; a client loaded with ptrace does not,
/// and the signal's default action would end the process.
pub fn catches_activation_signal(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (heapprofd_proto::attach::ACTIVATION_SIGNAL - 1)) != 0)
}

/// The bionic front-end's file names (as built, as installed on a device):
/// a process that has it mapped re-initializes it on the activation signal
/// with value 0, as bionic does.
pub const BIONIC_CLIENT_FILES: [&str; 2] = [
    heapprofd_proto::attach::BIONIC_CLIENT_FILE_NAME,
    heapprofd_proto::attach::ANDROID_CLIENT_FILE_NAME,
];

/// Whether process `pid` has the client library (or the bionic front-end)
/// mapped.
pub fn has_client(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.lines().any(maps_client))
}

/// Whether process `pid` loads the client from its start: it has it
/// mapped, or its `LD_PRELOAD` or `/etc/ld.so.preload` names it (a program
/// the loader is still starting has not mapped it yet).
pub fn preloads_client(pid: u32) -> bool {
    let names_client = preload_list_names_client;
    let in_env = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
        env.split(|&b| b == 0)
            .filter_map(|kv| kv.strip_prefix(b"LD_PRELOAD="))
            .any(names_client)
    });
    in_env || has_client(pid) || std::fs::read("/etc/ld.so.preload").is_ok_and(|l| names_client(&l))
}

/// Whether a preload list (`LD_PRELOAD`'s value, `/etc/ld.so.preload`'s
/// text: paths or file names split by colons or white space) names the
/// client.
fn preload_list_names_client(list: &[u8]) -> bool {
    list.split(|&b| b == b':' || b.is_ascii_whitespace())
        .filter_map(|p| std::str::from_utf8(p).ok())
        .any(|p| mapped_file(p).unwrap_or(p) == CLIENT_FILE)
}

/// Whether process `pid` has the glibc client mapped (the one with the
/// attach entry that ptrace can call), not only the bionic front-end.
pub fn has_glibc_client(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.lines().any(|l| mapped_file(l) == Some(CLIENT_FILE)))
}

/// The file name a line of `/proc/PID/maps` maps, if any.
fn mapped_file(line: &str) -> Option<&str> {
    line.rsplit_once('/').map(|(_, file)| file)
}

/// Whether a line of `/proc/PID/maps` maps the client or the bionic
/// front-end (by file name, not a suffix of another name).
fn maps_client(line: &str) -> bool {
    mapped_file(line).is_some_and(|file| file == CLIENT_FILE || BIONIC_CLIENT_FILES.contains(&file))
}

/// Whether a client in process `pid`, woken with signal value 0, would
/// connect to the service in `dir`: its `HEAPPROFD_SOCKET` (if set) is
/// `dir`'s client socket and its `HEAPPROFD_SERVICE_DIR` (if set) is `dir`;
/// with neither, `dir` must be the default service directory (`default`).
/// A process whose environment we may not read is not.
pub fn directed_here(pid: u32, dir: &std::path::Path, default: bool) -> bool {
    use heapprofd_proto::service::{CLIENT_SOCKET, DIR_ENV};
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let get = |key: &str| {
        env.split(|&b| b == 0).find_map(|kv| {
            kv.strip_prefix(key.as_bytes())?
                .strip_prefix(b"=")
                .map(|v| String::from_utf8_lossy(v).into_owned())
        })
    };
    if let Some(sock) = get("HEAPPROFD_SOCKET").filter(|s| !s.is_empty())
        && std::path::Path::new(&sock) != dir.join(CLIENT_SOCKET)
    {
        return false;
    }
    match get(DIR_ENV).filter(|d| !d.is_empty()) {
        Some(d) => std::path::Path::new(&d) == dir,
        None => default,
    }
}

/// Whether `pattern` (a name, a glob, or a `/`-path) matches a process.
pub fn name_matches(pattern: &str, first_arg: &str, name: &str) -> bool {
    let text = if pattern.starts_with('/') {
        first_arg
    } else {
        name
    };
    if is_glob(pattern) {
        glob(pattern.as_bytes(), text.as_bytes())
    } else {
        pattern == text
    }
}

/// `*` (any run) and `?` (any one byte); `[` is taken literally.
fn glob(p: &[u8], t: &[u8]) -> bool {
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some(pi);
                mark = ti;
                pi += 1;
            }
            Some(&c) if c == b'?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some(s) => {
                    pi = s + 1;
                    mark += 1;
                    ti = mark;
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The running processes `targets` wants (its pids that exist, the
/// processes of its names, or every one with the client for `all`).
pub fn find(targets: &Targets) -> Vec<Found> {
    let mut out = Vec::new();
    for &pid in &targets.pids {
        let name = names_of(pid).map_or_else(String::new, |(_, n)| n);
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            out.push(Found { pid, name });
        }
    }
    if targets.names.is_empty() && !targets.all {
        return out;
    }
    for pid in pids() {
        if targets.pids.contains(&pid) {
            continue;
        }
        let Some((first, name)) = names_of(pid) else {
            continue;
        };
        let wanted = if targets.all {
            has_client(pid)
        } else {
            targets.names.iter().any(|p| name_matches(p, &first, &name))
        };
        if wanted {
            out.push(Found { pid, name });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preload_list_names_the_client_by_path_or_file_name() {
        let yes = |l: &str| preload_list_names_client(l.as_bytes());
        assert!(yes(&format!(
            "/usr/lib/heapprofd-rs/preload/{CLIENT_FILE}\n"
        )));
        assert!(yes(&format!("libjemalloc.so.2:{CLIENT_FILE}")));
        assert!(yes(&format!("/lib/a.so /opt/{CLIENT_FILE}")));
        assert!(!yes(&format!("/opt/x{CLIENT_FILE}")));
        assert!(!yes(&format!("/opt/{CLIENT_FILE}.bak")));
        assert!(!yes(""));
    }

    #[test]
    fn this_process_preloads_the_client_only_if_told_to() {
        // The test binary runs without the client (a system-wide install
        // aside: then /etc/ld.so.preload names it).
        let system =
            std::fs::read("/etc/ld.so.preload").is_ok_and(|l| preload_list_names_client(&l));
        let env =
            std::env::var("LD_PRELOAD").is_ok_and(|l| preload_list_names_client(l.as_bytes()));
        assert_eq!(preloads_client(std::process::id()), system || env);
    }

    #[test]
    fn the_client_and_the_bionic_front_end_count_as_loaded() {
        let line = |f: &str| format!("7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/{f}");
        assert!(maps_client(&line("libheapprofd_client.so")));
        assert!(maps_client(&line("libheapprofd_bionic.so")));
        assert!(maps_client(&line("heapprofd_client.so")));
        assert!(!maps_client(&line("libc.so.6")));
        assert!(!maps_client(&line("notheapprofd_client.so")));
        assert!(!maps_client(
            "7f00-7f10 rw-p 00000000 00:00 0 heapprofd_client.so"
        ));
    }

    #[test]
    fn names_and_globs() {
        assert!(name_matches("python3", "/usr/bin/python3", "python3"));
        assert!(!name_matches("python", "/usr/bin/python3", "python3"));
        assert!(name_matches("py*", "/usr/bin/python3", "python3"));
        assert!(name_matches("python?", "/usr/bin/python3", "python3"));
        assert!(!name_matches("python?", "/usr/bin/python", "python"));
        assert!(name_matches("/usr/bin/*", "/usr/bin/python3", "python3"));
        assert!(!name_matches("/usr/bin/*", "python3", "python3"));
        // Ourselves: never found, even by our own name.
        let me = std::process::id();
        let (_, name) = names_of(me).expect("our own cmdline");
        let t = Targets {
            names: vec![name],
            running: true,
            ..Targets::default()
        };
        assert!(find(&t).iter().all(|f| f.pid != me));
    }

    #[test]
    fn our_own_identity_is_read() {
        let me = std::process::id();
        let id = ptrace_identity(me).expect("our status");
        let uid = nix::unistd::geteuid().as_raw();
        assert_eq!(id.uids[1], uid);
        assert_eq!(id.proc_owner, uid);
    }

    #[test]
    fn a_process_that_ignores_the_activation_signal_does_not_catch_it() {
        // Ignored stays ignored across exec (a client installed
        // system-wide leaves it so); a shell trap catches it.
        let spawn = |script: &str| {
            std::process::Command::new("sh")
                .args(["-c", script])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .expect("sh")
        };
        let mut ignores = spawn("trap '' 36; exec cat");
        let mut catches = spawn("trap ':' 36; read x");
        // Each shell has run its trap once its status says so.
        let bit = 1u64 << (heapprofd_proto::attach::ACTIVATION_SIGNAL - 1);
        let mask = |pid: u32, key: &str| -> u64 {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix(key))
                        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                })
                .unwrap_or(0)
        };
        let start = std::time::Instant::now();
        while (mask(ignores.id(), "SigIgn:") & bit == 0 || mask(catches.id(), "SigCgt:") & bit == 0)
            && start.elapsed() < std::time::Duration::from_secs(60)
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!catches_activation_signal(ignores.id()));
        assert!(catches_activation_signal(catches.id()));
        for c in [&mut ignores, &mut catches] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
