//! The messages to a bookkeeping thread (record's, [`super::book_thread`],
//! and the service's, [`super::service_book`]), in one place: the threads
//! that send them and the threads that receive them depend on this file,
//! never on each other.

use std::sync::mpsc::Sender;

use heapprofd_model::messages::SessionEvent;

use super::bookkeeper::BookkeeperOptions;
use super::hub::ProfileId;
use super::summary::Summary;
use crate::service::spec::Guardrails;

/// Messages to the bookkeeping thread.
#[derive(Debug)]
pub enum BookMsg {
    /// Something happened to a session (started, a batch of records, ended).
    Session(Box<SessionEvent>),
    /// Write a dump of every process now.
    Dump,
    /// Write the final dump, close the trace and report back.
    Finish(Sender<anyhow::Result<Summary>>),
    /// The service's profiles ([`super::service_book`]; ignored elsewhere).
    Service(ServiceMsg),
}

/// The service's own messages to its bookkeeping thread.
#[derive(Debug)]
pub enum ServiceMsg {
    /// A profile starts, writing to this trace, with these guardrails.
    Add(ProfileId, BookkeeperOptions, Guardrails),
    /// Process `pid` is flagged `rejected_concurrent` in profile's trace.
    Rejected(ProfileId, u32, Vec<String>),
    /// A dump of one profile now.
    Dump(ProfileId),
    /// The profile ends (already out of the hub): its summary, once written.
    End(ProfileId, Sender<anyhow::Result<Summary>>),
}
