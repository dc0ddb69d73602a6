//! The control protocol between the command line and the profiling
//! service (`heapprofd-rs daemon`), and where the service lives.
//!
//! On the control socket ([`heapprofd_proto::service::CONTROL_SOCKET`] in
//! the [service directory](service_dir)) a `record -n NAME` sends one
//! [`Request`]: a little-endian `u32` length, then that many bytes of JSON,
//! with the trace file's descriptor attached to the first bytes
//! (`SCM_RIGHTS`; the command line creates the file, so the trace belongs
//! to the user who asked). The service starts the profile, and ends it when
//! the request's duration passes or when the command line shuts down its
//! side of the connection (Ctrl-C), then answers with one [`Reply`] in the
//! same framing and closes. A `record -- CMD` profile first gets
//! [`Reply::Started`] once the service takes its processes: only then does
//! `record` start CMD.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use heapprofd_proto::service::SYSTEM_DIR;

use super::spec::ProfileSpec;

/// Longest message either side accepts.
pub const MAX_MESSAGE: u32 = 1 << 20;

/// A profile request from the command line: the profile (checked again by
/// the service) and the trace's path as the command line names it (for
/// messages; the trace itself is the descriptor sent with the request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The profile.
    pub spec: ProfileSpec,
    /// The trace's path.
    pub output_path: PathBuf,
}

/// The service's answer once the profile ended (and, for a command's
/// profile, [`Reply::Started`] first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// A command's profile ([`super::spec::Targets::command`]) is in
    /// place: processes carrying its token are taken from now on, so
    /// `record` may start the command. The final reply follows.
    Started,
    /// The trace is written; the summary to show.
    Done {
        /// The end-of-run summary, as `record` prints it.
        summary: String,
        /// Processes profiled.
        processes: usize,
    },
    /// The profile could not run; why.
    Failed(String),
}

/// The service directory: `from_env` (`$HEAPPROFD_SERVICE_DIR`, see
/// [`crate::env::Env::service_dir`]), else [`SYSTEM_DIR`] for root, else
/// `/tmp/heapprofd-rs-<uid>` (the user's private runtime directory).
pub fn service_dir(from_env: Option<&Path>) -> PathBuf {
    if let Some(d) = from_env {
        return d.to_path_buf();
    }
    let uid = nix::unistd::geteuid().as_raw();
    if uid == 0 {
        PathBuf::from(SYSTEM_DIR)
    } else {
        PathBuf::from(heapprofd_proto::attach::runtime_dir_for_uid(uid).as_str())
    }
}

/// The service the command line asks: [`service_dir`], except that a user
/// without a service of their own uses root's ([`SYSTEM_DIR`]) if one runs
/// (it serves every user, [`super::access`]).
pub fn service_dir_to_ask(from_env: Option<&Path>) -> PathBuf {
    let own = service_dir(from_env);
    let control = heapprofd_proto::service::CONTROL_SOCKET;
    if from_env.is_some() || own.join(control).exists() {
        return own;
    }
    let system = PathBuf::from(SYSTEM_DIR);
    if system.join(control).exists() {
        system
    } else {
        own
    }
}

/// Writes one framed JSON message.
pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    w.write_all(&frame(msg)?)
}

/// One framed JSON message: its length prefix and body.
pub fn frame<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let mut out = frame_header(body.len())?.to_vec();
    out.extend_from_slice(&body);
    Ok(out)
}

/// The length prefix of a message of `len` bytes.
pub fn frame_header(len: usize) -> io::Result<[u8; 4]> {
    match u32::try_from(len) {
        Ok(n) if n <= MAX_MESSAGE => Ok(n.to_le_bytes()),
        _ => Err(io::Error::other(format!("message of {len} bytes too long"))),
    }
}

/// Reads one framed JSON message whose 4-byte length prefix was already
/// read into `header`.
pub fn read_body<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    header: [u8; 4],
) -> io::Result<T> {
    let len = u32::from_le_bytes(header);
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message of {len} bytes is longer than {MAX_MESSAGE}"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Reads one framed JSON message.
pub fn read_message<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> io::Result<T> {
    let mut header = [0u8; 4];
    r.read_exact(&mut header)?;
    read_body(r, header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_frames_are_errors() {
        let mut spec = ProfileSpec::default();
        spec.targets.names = vec!["python3".into()];
        spec.targets.startup = true;
        spec.duration_ms = Some(3000);
        let req = Request {
            spec,
            output_path: "x.pftrace".into(),
        };
        let mut buf = Vec::new();
        write_message(&mut buf, &req).unwrap();
        let back: Request = read_message(&mut buf.as_slice()).unwrap();
        assert_eq!(back, req);
        // Truncated, too long, not JSON: errors, no panic.
        assert!(read_message::<Request>(&mut &buf[..buf.len() - 1]).is_err());
        let mut long = (MAX_MESSAGE + 1).to_le_bytes().to_vec();
        long.extend_from_slice(b"{}");
        assert!(read_message::<Request>(&mut long.as_slice()).is_err());
        let mut junk = 3u32.to_le_bytes().to_vec();
        junk.extend_from_slice(b"{x}");
        assert!(read_message::<Reply>(&mut junk.as_slice()).is_err());
    }
}
