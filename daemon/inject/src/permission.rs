//! What is needed to ptrace a process, for the messages of refusals.

use crate::status::status_field;

/// Whether we have `CAP_SYS_PTRACE` (bit 19 of `CapEff`).
fn have_cap_sys_ptrace() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| status_field(&s, "CapEff").and_then(|v| u64::from_str_radix(v, 16).ok()))
        .is_some_and(|caps| caps & (1 << 19) != 0)
}

fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What is needed to ptrace `pid`, for error messages.
pub(crate) fn permission_hint(pid: u32, target_uid: Option<u32>) -> String {
    let me = nix::unistd::geteuid().as_raw();
    let mut hint = String::from(
        "attaching needs ptrace permission: the same user as the target \
         (and a target that is not setuid/non-dumpable), with ptrace allowed \
         by Yama, or CAP_SYS_PTRACE (e.g. run with sudo)",
    );
    if let Some(u) = target_uid
        && u != me
        && me != 0
    {
        hint.push_str(&format!(
            "; process {pid} belongs to uid {u}, you are uid {me}"
        ));
    }
    if have_cap_sys_ptrace() {
        hint.push_str(
            "; heapprofd-rs has CAP_SYS_PTRACE, so the target is protected some other way \
             (non-dumpable, a security module, or it is traced already)",
        );
        return hint;
    }
    match ptrace_scope() {
        Some(1) => hint.push_str(
            "; /proc/sys/kernel/yama/ptrace_scope is 1 (only descendants may be traced): \
             use sudo, or `echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope`",
        ),
        Some(2) => hint.push_str(
            "; /proc/sys/kernel/yama/ptrace_scope is 2 (only CAP_SYS_PTRACE may trace): use sudo",
        ),
        Some(3) => hint.push_str(
            "; /proc/sys/kernel/yama/ptrace_scope is 3: ptrace is disabled on this system \
             until reboot",
        ),
        _ => {}
    }
    hint
}
