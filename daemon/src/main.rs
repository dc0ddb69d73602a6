//! `heapprofd-rs`: the command-line entry point.
//!
//! Exit codes: 0 on success, 2 on bad usage (clap's, and [`UsageError`]s
//! such as an output path that cannot be created), 1 on failure; `record`
//! exits with the profiled command's own exit code (128 + the signal when
//! it was stopped by Ctrl-C or SIGTERM while the command kept running).

use std::process::ExitCode;

use heapprofd_daemon::cli::{self, Cli, Ran, UsageError};
use heapprofd_daemon::env::Env;
use heapprofd_daemon::logger;

fn main() -> ExitCode {
    let env = Env::from_process();
    logger::init(env.debug);
    let cli: Cli = cli::parse();
    match cli::run(cli.command, &env) {
        Ok(Ran::Exit(code)) => ExitCode::from(code.clamp(0, 255) as u8),
        Ok(Ran::Wrote(files)) => {
            for (path, what) in files {
                eprintln!("wrote {what} to {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            log::error!("error: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
