//! The messages to a bookkeeping thread (record's, [`super::book_thread`],
//! and the service's, [`super::service_book`]), in one place: the threads
//! that send them and the threads that receive them depend on this file,
//! never on each other.

use std::sync::mpsc::Sender;

use heapprofd_model::messages::{SessionEvent, Unprofilable};

use super::bookkeeper::BookkeeperOptions;
use super::hub::ProfileId;
use super::summary::Summary;
use crate::service::spec::Guardrails;

/// Messages to the bookkeeping thread.
#[derive(Debug)]
pub enum BookMsg {
    /// Something happened to a session (started, a batch of records, ended).
    Session(Box<SessionEvent>),
    /// Write a dump of every process as of the time it was asked for
    /// (MONOTONIC_COARSE ns): the dump's timestamp. The bookkeeping thread
    /// may get to it later (busy symbolizing the first dump, or behind on
    /// records); its values are those of the records sent before it.
    Dump(u64),
    /// Write the final dump, close the trace and report back (the first
    /// sender). The second is told once every frame of the final dump has
    /// its name, before the trace is written: the symbol store can be
    /// written meanwhile. Dropped unsent when that never happens.
    Finish(Sender<anyhow::Result<Summary>>, Sender<()>),
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
    /// A dump of one profile, as of the time it was asked for
    /// (MONOTONIC_COARSE ns, see [`BookMsg::Dump`]).
    Dump(ProfileId, u64),
    /// A process these profiles want runs unprofiled (it cannot load the
    /// client: [`super::service_scan`]); named and flagged in their traces.
    Unprofilable(Vec<ProfileId>, u32, Vec<String>, Unprofilable),
    /// The service could not load the client into process `pid`
    /// (`super::service_inject`): named in the profile's trace, flagged,
    /// with the reason for the summary.
    NotAttached(ProfileId, u32, Vec<String>, String),
    /// The profile ends (already out of the hub): its summary, once written.
    End(ProfileId, Sender<anyhow::Result<Summary>>),
    /// Answered once every message sent before it is handled: an ending
    /// profile's drained operations reach it while the hub still routes
    /// them to it (the fan-out reads the route as each message is handled).
    Barrier(Sender<()>),
}
