//! The gateway daemon: the process `beige gateway start` leaves running.
//!
//! Owns the pid file (`<BEIGE_HOME>/gateway.pid`, [`PidFile`]), the foreground server
//! ([`foreground`]: the `LocalGateway` behind the HTTP API, signal handling, graceful
//! stop and in-place restart) and the [`reload::ReloadableGateway`] that lets a restart
//! swap the gateway under a running HTTP channel. Launching and stopping the daemon
//! from another process is in [`crate::cmd::gateway`].

pub mod foreground;
pub mod http;
pub mod reload;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use beige_core::sandbox::{shim, SandboxError};

use crate::sys;

/// What the pid file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidState {
    /// No pid file.
    Absent,
    /// A gateway process runs with this pid.
    Running(i32),
    /// The pid file names a process that is gone (or is no longer a beige gateway).
    Stale(i32),
}

/// `<BEIGE_HOME>/gateway.pid`.
#[derive(Debug, Clone)]
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read the pid file and check the process.
    pub fn state(&self) -> PidState {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return PidState::Absent;
        };
        let Ok(pid) = text
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .parse::<i32>()
        else {
            return PidState::Stale(0);
        };
        if is_gateway_process(pid) {
            PidState::Running(pid)
        } else {
            PidState::Stale(pid)
        }
    }

    /// Write the pid and, on the second line, the URL the daemon serves.
    pub fn write(&self, pid: u32, url: &str) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&self.path)?;
        writeln!(f, "{pid}\n{url}")
    }

    /// The URL of a running daemon, from the pid file (so commands find the gateway
    /// even when the config on disk no longer loads).
    pub fn url(&self) -> Option<String> {
        let PidState::Running(_) = self.state() else {
            return None;
        };
        let text = std::fs::read_to_string(&self.path).ok()?;
        text.lines()
            .nth(1)
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_string)
    }

    /// Remove the file; a missing file is fine.
    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e, "could not remove the pid file");
            }
        }
    }
}

/// Whether `pid` is alive and (when its command line can be read) a `beige gateway
/// start --foreground` process, so a reused pid is not mistaken for the gateway.
pub fn is_gateway_process(pid: i32) -> bool {
    if !sys::alive(pid) {
        return false;
    }
    let args = sys::cmdline(pid);
    if args.is_empty() {
        return true;
    }
    args.iter().any(|a| a == "gateway") && args.iter().any(|a| a == "--foreground" || a == "-F")
}

/// Find the static shim like [`shim::locate`], but when neither `BEIGE_SHIM` nor the
/// config names one, skip a dynamically linked `beige-shim` next to the executable (the
/// one `cargo build` leaves in `target/debug/`) in favour of a static one further up
/// (`target/shim/beige-shim` from `scripts/build-shim`).
pub fn find_shim(configured: Option<&Path>) -> Result<PathBuf, SandboxError> {
    let explicit = std::env::var_os(shim::BEIGE_SHIM_ENV).is_some_and(|v| !v.is_empty())
        || configured.is_some();
    if !explicit {
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            let mut candidates = vec![dir.join("beige-shim")];
            for anc in dir.ancestors().take(4) {
                candidates.push(anc.join("shim").join("beige-shim"));
                candidates.push(anc.join("target").join("shim").join("beige-shim"));
            }
            if let Some(found) = candidates
                .into_iter()
                .find(|p| p.is_file() && shim::check_static(p).is_ok())
            {
                return Ok(found);
            }
        }
    }
    shim::locate(configured)
}
