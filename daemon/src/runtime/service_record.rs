//! `heapprofd-rs record -n NAME[,NAME...]`: ask the running service
//! (`heapprofd-rs daemon`) to profile the programs of those names that
//! start from now on, from their first allocation (startup profiling; the
//! programs need the dormant client preloaded, e.g. through `LD_PRELOAD`).
//!
//! `record` creates the trace file itself (so it belongs to the user who
//! asked) and sends its descriptor with the request over the control socket
//! ([`crate::service::control`]); the profile ends after `--duration`, or on
//! Ctrl-C / SIGTERM of `record` (it shuts down its side of the connection),
//! and `record` prints the summary the service answers with. Without a
//! running service this is an error that says to start one.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use heapprofd_proto::service::CONTROL_SOCKET;

use super::supervise::{Signals, block_on};
use crate::cli::record_args::RecordArgs;
use crate::cli::usage_error::UsageError;
use crate::service::control::{Reply, Request, frame_header, read_message, service_dir};

/// Runs `record -n`; returns the exit code.
pub fn run(args: RecordArgs, names: Vec<String>) -> Result<i32> {
    if let Some(bad) = names
        .iter()
        .find(|n| !heapprofd_proto::triggers::valid_name(n.as_bytes()))
    {
        return Err(UsageError(format!(
            "`{bad}` is not a process name (1 to 255 bytes, no NUL, no newline)"
        ))
        .into());
    }
    let output = args.output.clone().unwrap_or_else(|| {
        super::setup::default_output(names.first().map_or("names", String::as_str))
    });
    let dir = service_dir();
    let control = dir.join(CONTROL_SOCKET);
    let sock = UnixStream::connect(&control).with_context(|| {
        format!(
            "no profiling service at {}; start one with `heapprofd-rs daemon` \
             (with the same HEAPPROFD_SERVICE_DIR)",
            control.display()
        )
    })?;
    let file = std::fs::File::create(&output).map_err(|e| {
        UsageError(format!(
            "cannot create the trace file {}: {e}; choose another path with -o",
            output.display()
        ))
    })?;
    let request = Request {
        names: names.clone(),
        interval: args.interval,
        shmem_size: args.shmem_size,
        block_timeout_us: (!args.no_block_client).then(|| {
            args.block_client
                .unwrap_or(Duration::from_secs(5))
                .as_micros() as u64
        }),
        seed: args.seed,
        symbolize: !args.no_symbolize,
        duration_ms: args.duration.map(|d| d.as_millis() as u64),
        output_path: output.clone(),
    };
    let body = serde_json::to_vec(&request)?;
    heapprofd_proto::socket::send_with_fds(
        sock.as_raw_fd(),
        &frame_header(body.len())?,
        &[file.as_raw_fd()],
    )
    .context("sending the request to the service")?;
    std::io::Write::write_all(&mut &sock, &body).context("sending the request to the service")?;
    drop(file);
    log::info!(
        "profiling {} from their start{}; Ctrl-C to stop",
        names.join(","),
        args.duration
            .map_or(String::new(), |d| format!(" for {}ms", d.as_millis()))
    );
    let reply = block_on(wait_reply(sock))??;
    match reply {
        Reply::Done { summary, .. } => {
            log::info!("{summary}");
            Ok(0)
        }
        Reply::Failed(why) => bail!("the service could not run the profile: {why}"),
    }
}

/// Waits for the reply; on Ctrl-C or SIGTERM first tells the service to
/// end the profile (shutting down our side), then waits for the reply.
async fn wait_reply(sock: UnixStream) -> Result<Reply> {
    let mut signals = Signals::install()?;
    let reader = sock.try_clone()?;
    let mut reply = tokio::task::spawn_blocking(move || read_message::<Reply>(&mut &reader));
    tokio::select! {
        r = &mut reply => return answered(r),
        _ = signals.interrupt.recv() => {}
        _ = signals.terminate.recv() => {}
    }
    log::info!("stopping; the service writes the trace");
    let _ = sock.shutdown(std::net::Shutdown::Write);
    answered(reply.await)
}

/// The reply, or an error that says the service went away.
fn answered(
    r: std::result::Result<std::io::Result<Reply>, tokio::task::JoinError>,
) -> Result<Reply> {
    r.context("waiting for the service")?.context(
        "the service ended the connection without an answer (was it killed?); \
         the trace is incomplete",
    )
}
