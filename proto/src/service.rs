//! Where the profiling service lives: its directory and the files in it,
//! shared by the daemon, the command line and the client library.
//!
//! A service (`heapprofd-rs daemon`, or the one `record` starts for itself)
//! keeps three files in its directory:
//!
//! * [`CLIENT_SOCKET`]: where profiled processes connect (the session
//!   protocol of [`crate::socket`]);
//! * [`CONTROL_SOCKET`]: where the command line asks for profiles;
//! * [`TRIGGERS_FILE`]: the startup-trigger store ([`crate::triggers`]),
//!   which a dormant client reads in its constructor to learn whether a
//!   profile wants it from its start (the role of bionic's
//!   `heapprofd.enable` properties).
//!
//! The directory of a service run by root is [`SYSTEM_DIR`]
//! (`/run/heapprofd-rs`, mode 0755, owned by root). A service run by
//! another user lives in that user's private runtime directory
//! (`/tmp/heapprofd-rs-<uid>`, mode 0700). [`DIR_ENV`] overrides both (tests,
//! and a service in a non-standard place); a client ignores it in a
//! set-user-ID program, as it ignores every environment variable there.
//!
//! A client looks for a trigger store in [`DIR_ENV`]'s directory if it is
//! set, else in [`SYSTEM_DIR`], then in its user's runtime directory; it
//! trusts a store only if it is a regular file owned by root or by the
//! client's own effective user and writable by nobody else.

/// The directory of a service run by root.
pub const SYSTEM_DIR: &str = "/run/heapprofd-rs";
/// Environment variable naming the service directory (daemon, command
/// line and client alike).
pub const DIR_ENV: &str = "HEAPPROFD_SERVICE_DIR";
/// The socket profiled processes connect to, in the service directory.
pub const CLIENT_SOCKET: &str = "client.sock";
/// The socket the command line sends profile requests to.
pub const CONTROL_SOCKET: &str = "control.sock";
/// The startup-trigger store.
pub const TRIGGERS_FILE: &str = "triggers";

/// The `sigqueue` value that wakes a preloaded client for the service
/// (connect to the service's [`CLIENT_SOCKET`]), as bionic's
/// `sival_int = 0` asks for heapprofd.
pub const SIGNAL_VALUE_SERVICE: i32 = 0;
