//! The server's [`Admit`] seam for the service: the [`Hub`] decides which
//! connecting process is wanted and with what configuration.

use std::sync::Arc;

use heapprofd_model::messages::SessionId;
use heapprofd_proto::triggers::process_name;
use heapprofd_proto::wire::ClientConfig;

use super::hub::Hub;
use super::server::Admit;

/// The service's [`Admit`]: the hub decides.
#[derive(Debug)]
pub struct HubAdmit(pub Arc<Hub>);

impl Admit for HubAdmit {
    fn admit(
        &self,
        session: SessionId,
        pid: u32,
        uid: u32,
        from_startup: bool,
    ) -> Option<ClientConfig> {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let name = String::from_utf8_lossy(process_name(&cmdline)).into_owned();
        let token = if self.0.wants_commands() {
            command_token(pid)
        } else {
            None
        };
        self.0
            .admit(session, pid, uid, &name, from_startup, token.as_deref())
            .map(|a| a.client)
    }

    fn reached_worker(&self, session: SessionId) -> bool {
        self.0.reached_worker(session)
    }

    fn abandoned(&self, session: SessionId) {
        self.0.session_ended(session);
    }
}

/// The command token in process `pid`'s environment
/// ([`crate::service::spec::PROFILE_ENV`]), if any (readable: our own
/// user's processes, or anyone's for root).
fn command_token(pid: u32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let key = format!("{}=", crate::service::spec::PROFILE_ENV);
    environ
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(key.as_bytes()))
        .and_then(|v| std::str::from_utf8(v).ok())
        .filter(|v| crate::service::spec::valid_token(v))
        .map(str::to_owned)
}
