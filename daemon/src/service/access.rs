//! Who may use a service, and whom a profile may see: the rules of a
//! service run by root for every user of the machine.
//!
//! * The service directory is root's, mode 0755; the control socket is mode
//!   0666 (every user may ask), the trigger store 0644 (every client reads
//!   it, only the service writes it). A service run by another user keeps
//!   everything private to that user (directory 0700, sockets 0600).
//! * Every control request is attributed with `SO_PEERCRED` (the kernel's
//!   word, not the request's): the requester's user.
//! * A profile sees the processes its requester may profile: every process
//!   for root, else only those whose effective user is the requester's.
//!   Root's service takes every user's clients on its client socket (mode
//!   0666); at each handshake the hub admits a process only into the
//!   profiles whose requester may profile its user (`SO_PEERCRED`), and
//!   wakes a running process only for such a profile. A set-user-ID program
//!   runs with its owner's effective user, so a user cannot profile it
//!   either.
//! * The trace is a file the command line creates itself (mode 0600, owned
//!   by the requester) and sends as a descriptor: the service writes only
//!   to it, so a user reads only their own profiles.

/// Whether a profile asked for by user `requester` may see a process whose
/// effective user is `target`.
pub fn may_profile(requester: u32, target: u32) -> bool {
    requester == 0 || requester == target
}

/// The identity of a process that decides whether a user may have the
/// client loaded into it with ptrace (`/proc/PID/status`'s `Uid:` and
/// `Gid:` lines, the owner of `/proc/PID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtraceIdentity {
    /// Real, effective, saved and filesystem user ids.
    pub uids: [u32; 4],
    /// Real, effective, saved and filesystem group ids.
    pub gids: [u32; 4],
    /// The owner of `/proc/PID`: root for a process that is not dumpable
    /// (it changed its credentials, or said so with `prctl`).
    pub proc_owner: u32,
}

/// Whether a profile of user `requester` may have the service load the
/// client into a running process with ptrace. Stricter than
/// [`may_profile`], as the kernel is for ptrace itself: root may; another
/// user only when every user id of the process is theirs, its group ids
/// agree (no set-group-ID image) and it is dumpable (a process that
/// changed credentials is not, and root's service must not do for a user
/// what the kernel would refuse them).
pub fn may_inject(requester: u32, target: &PtraceIdentity) -> bool {
    requester == 0
        || (target.uids.iter().all(|&u| u == requester)
            && target.gids.iter().all(|&g| g == target.gids[0])
            && target.proc_owner == requester)
}

/// Whether a service whose effective user is `service_uid` serves every
/// user (root's does) or only its own.
pub fn serves_everyone(service_uid: u32) -> bool {
    service_uid == 0
}

/// The service directory's mode when the service creates it.
pub fn dir_mode(service_uid: u32) -> u32 {
    if serves_everyone(service_uid) {
        0o755
    } else {
        0o700
    }
}

/// The control socket's mode.
pub fn control_mode(service_uid: u32) -> u32 {
    if serves_everyone(service_uid) {
        0o666
    } else {
        0o600
    }
}

/// Whether a control request of user `peer` is served by a service of user
/// `service_uid`.
pub fn may_request(service_uid: u32, peer: u32) -> bool {
    serves_everyone(service_uid) || peer == service_uid || peer == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_sees_everyone_a_user_only_themself() {
        assert!(may_profile(0, 0) && may_profile(0, 1000));
        assert!(may_profile(1000, 1000));
        assert!(!may_profile(1000, 0) && !may_profile(1000, 1001));
        assert!(may_request(0, 1000) && may_request(1000, 0) && !may_request(1000, 1001));
        assert_eq!((control_mode(0), control_mode(1000)), (0o666, 0o600));
    }

    #[test]
    fn injection_needs_every_id_and_a_dumpable_process() {
        let own = PtraceIdentity {
            uids: [1000; 4],
            gids: [1000; 4],
            proc_owner: 1000,
        };
        assert!(may_inject(1000, &own) && may_inject(0, &own));
        assert!(!may_inject(1001, &own));
        // A set-user-ID image run by the user: its saved id is another's.
        let setuid = PtraceIdentity {
            uids: [1000, 1000, 0, 1000],
            ..own
        };
        assert!(!may_inject(1000, &setuid) && may_inject(0, &setuid));
        let setgid = PtraceIdentity {
            gids: [1000, 50, 50, 50],
            ..own
        };
        assert!(!may_inject(1000, &setgid));
        // Not dumpable: /proc/PID is root's.
        let undumpable = PtraceIdentity {
            proc_owner: 0,
            ..own
        };
        assert!(!may_inject(1000, &undumpable) && may_inject(0, &undumpable));
    }
}
