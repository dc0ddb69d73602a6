//! How a profile on the device ended, as the workflow tells the user.

use std::path::PathBuf;

/// The end of a profile on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It finished and the trace was pulled to this file.
    Finished(PathBuf),
    /// The connection to the device was lost during the profile (`why`);
    /// what the device had written was pulled to `partial`, if anything.
    Lost {
        /// What adb said.
        why: String,
        /// The partial trace on the host, if one could be pulled.
        partial: Option<PathBuf>,
    },
}
