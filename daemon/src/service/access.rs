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
}
