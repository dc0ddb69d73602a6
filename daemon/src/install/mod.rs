//! `heapprofd-rs install` / `uninstall`: the dormant client in every new
//! process of the machine, the Linux analogue of bionic loading heapprofd
//! into every app.
//!
//! `install` copies the client library of this build to
//! [`layout::LIB_DIR`] (`/usr/lib/heapprofd-rs/preload/`, root's, 0644) and
//! adds that path as a line of `/etc/ld.so.preload` (after whatever the file
//! already holds), so the dynamic linker loads it into every dynamically
//! linked program that starts from then on, set-user-ID ones included. The
//! client stays dormant (one branch per allocation call) unless a profile of
//! the service wants the process. What `uninstall` needs to put the system
//! back byte for byte (the preload file as it was, or that there was none;
//! the directories created) is kept in [`layout::STATE_DIR`]`/install.json`
//! ([`state`]). Installing again changes nothing; an installed library of
//! another build (its `.heapprofd_rs_build` tag, [`build_tag`]) is refused
//! unless `--force`. The changes are [`plan`]ned first, then printed
//! (`--dry-run`) or applied ([`action`]).

pub mod action;
pub mod build_tag;
pub mod installed;
pub mod layout;
pub mod plan;
pub mod preload;
pub mod state;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::fcntl::{Flock, FlockArg};

use self::action::Action;
use self::layout::Layout;

/// `heapprofd-rs install`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Print what would change and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Replace an installed client library of another build (and install a
    /// library whose build tag is not this binary's).
    #[arg(long)]
    pub force: bool,
    /// The client library to install [default: libheapprofd_client.so next
    /// to this binary, else in ../lib/heapprofd-rs/].
    #[arg(long, value_name = "PATH")]
    pub client_lib: Option<PathBuf>,
    /// Install below this directory instead of / (tests, staging; root is not
    /// required then).
    #[arg(long, value_name = "DIR", hide = true)]
    pub root: Option<PathBuf>,
}

/// `heapprofd-rs uninstall`.
#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Print what would change and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Uninstall below this directory instead of / (see `install --root`).
    #[arg(long, value_name = "DIR", hide = true)]
    pub root: Option<PathBuf>,
}

/// Runs `install`; returns the exit code.
pub fn install(args: &InstallArgs) -> Result<i32> {
    let layout = layout_for(args.root.as_deref(), "install")?;
    let _lock = lock(&layout)?;
    let source = crate::runtime::setup::find_client_lib(args.client_lib.as_deref())?;
    let actions = plan::install(&layout, &source, args.force)?;
    if actions.is_empty() {
        println!(
            "heapprofd-rs is installed already ({} in {}): nothing changed",
            Layout::library_entry(),
            layout.preload().display()
        );
        return Ok(0);
    }
    run(&actions, args.dry_run)?;
    if !args.dry_run {
        println!(
            "installed: every program that starts from now on loads {} (dormant until a \
             profile wants it); `heapprofd-rs uninstall` undoes it",
            Layout::library_entry()
        );
    }
    Ok(0)
}

/// Runs `uninstall`; returns the exit code.
pub fn uninstall(args: &UninstallArgs) -> Result<i32> {
    let layout = layout_for(args.root.as_deref(), "uninstall")?;
    let _lock = lock(&layout)?;
    let (actions, warnings) = plan::uninstall(&layout)?;
    for w in &warnings {
        log::warn!("{w}");
    }
    if actions.is_empty() {
        println!("heapprofd-rs is not installed: nothing changed");
        return Ok(0);
    }
    run(&actions, args.dry_run)?;
    if !args.dry_run {
        println!("uninstalled: new programs no longer load the client");
    }
    Ok(0)
}

/// Serializes installs and uninstalls (two at once would plan from the same
/// state and race on the temporary files): an exclusive `flock` of the
/// preload file's directory, held until the returned descriptor is closed.
fn lock(layout: &Layout) -> Result<Flock<std::fs::File>> {
    let dir = layout.preload();
    let dir = dir.parent().unwrap_or(Path::new("/"));
    let f = std::fs::File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    Flock::lock(f, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .with_context(|| format!("locking {}", dir.display()))
}

fn layout_for(root: Option<&Path>, command: &str) -> Result<Layout> {
    match root {
        Some(r) => Ok(Layout::new(r)),
        None if !nix::unistd::geteuid().is_root() => bail!(
            "`heapprofd-rs {command}` needs root (it changes {} and {}); run it with sudo",
            layout::PRELOAD,
            layout::LIB_DIR
        ),
        None => Ok(Layout::new(Path::new("/"))),
    }
}

fn run(actions: &[Action], dry_run: bool) -> Result<()> {
    for a in actions {
        if dry_run {
            println!("would {a}");
        } else {
            a.apply()?;
            println!("{a}: done");
        }
    }
    Ok(())
}
