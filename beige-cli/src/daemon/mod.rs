//! The gateway daemon: the process `beige gateway start` leaves running.
//!
//! Owns the pid file (`<BEIGE_HOME>/gateway.pid`: the pid and a newline, as in the
//! original, so `kill "$(cat gateway.pid)"` works; the URL the daemon serves is kept in
//! `<BEIGE_HOME>/run/gateway.url` — [`PidFile`]), the foreground server
//! ([`foreground`]: the `LocalGateway` with its channels, served by beige-core, which
//! handles signals, graceful stop and in-place restart) and the record of restarts
//! ([`http::RestartRecord`]). Launching and stopping the daemon
//! from another process is in [`crate::cmd::gateway`].

pub mod foreground;
pub mod http;

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use beige_core::home::BeigeHome;
use beige_core::sandbox::{check_static, locate_shim, SandboxError, BEIGE_SHIM_ENV};

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

/// `<BEIGE_HOME>/gateway.pid` (the pid only) and `<BEIGE_HOME>/run/gateway.url`.
#[derive(Debug, Clone)]
pub struct PidFile {
    path: PathBuf,
    url_path: PathBuf,
}

impl PidFile {
    pub fn new(home: &BeigeHome) -> Self {
        Self {
            path: home.pid_path(),
            url_path: home.gateway_url_path(),
        }
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

    /// Write the URL the daemon serves to `run/gateway.url`, then the pid (and a
    /// newline, nothing else) to `gateway.pid`; each file appears whole (written
    /// beside it, then renamed into place), mode 0600.
    pub fn write(&self, pid: u32, url: &str) -> std::io::Result<()> {
        if let Some(dir) = self.url_path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        write_whole(&self.url_path, format!("{url}\n").as_bytes())?;
        write_whole(&self.path, format!("{pid}\n").as_bytes())
    }

    /// The URL of a running daemon, from `run/gateway.url` — or, for a daemon started by
    /// an earlier beige, from the second line of its pid file — so commands find the
    /// gateway even when the config on disk no longer loads.
    pub fn url(&self) -> Option<String> {
        let PidState::Running(_) = self.state() else {
            return None;
        };
        let first_line = |text: String, line: usize| {
            text.lines()
                .nth(line)
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_string)
        };
        std::fs::read_to_string(&self.url_path)
            .ok()
            .and_then(|t| first_line(t, 0))
            .or_else(|| {
                std::fs::read_to_string(&self.path)
                    .ok()
                    .and_then(|t| first_line(t, 1))
            })
    }

    /// Remove both files; missing files are fine.
    pub fn remove(&self) {
        for path in [&self.path, &self.url_path] {
            if let Err(e) = std::fs::remove_file(path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove the pid file");
                }
            }
        }
    }
}

/// Write `bytes` to `path` through a file beside it renamed into place (mode 0600).
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
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

/// Find the static shim like [`locate_shim`], but when neither `BEIGE_SHIM` nor the
/// config names one, skip a dynamically linked `beige-shim` next to the executable (the
/// one `cargo build` leaves in `target/debug/`) in favour of a static one further up
/// (`target/shim/beige-shim` from `scripts/build-shim`).
pub fn find_shim(configured: Option<&Path>) -> Result<PathBuf, SandboxError> {
    let explicit =
        std::env::var_os(BEIGE_SHIM_ENV).is_some_and(|v| !v.is_empty()) || configured.is_some();
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
                .find(|p| p.is_file() && check_static(p).is_ok())
            {
                return Ok(found);
            }
        }
    }
    locate_shim(configured)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn pid_file_holds_the_pid_only_and_the_url_is_kept_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path());
        let pid_file = PidFile::new(&home);
        pid_file.write(4242, "http://127.0.0.1:7433").unwrap();
        assert_eq!(std::fs::read_to_string(home.pid_path()).unwrap(), "4242\n");
        assert_eq!(
            std::fs::read_to_string(home.gateway_url_path()).unwrap(),
            "http://127.0.0.1:7433\n"
        );
        for p in [home.pid_path(), home.gateway_url_path()] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", p.display());
        }
        pid_file.remove();
        assert!(!home.pid_path().exists());
        assert!(!home.gateway_url_path().exists());
    }

    #[test]
    fn url_is_read_from_the_new_place_and_from_an_old_pid_file() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path());
        // A process that looks like a running gateway (a shell waiting on its stdin,
        // with no child of its own).
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read line", "gateway", "--foreground"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let pid_file = PidFile::new(&home);
        // As an earlier beige wrote it: the URL on the second line.
        std::fs::write(home.pid_path(), format!("{pid}\nhttp://127.0.0.1:1111\n")).unwrap();
        assert_eq!(pid_file.state(), PidState::Running(pid as i32));
        assert_eq!(pid_file.url().as_deref(), Some("http://127.0.0.1:1111"));
        // As this one writes it.
        pid_file.write(pid, "http://127.0.0.1:2222").unwrap();
        assert_eq!(pid_file.url().as_deref(), Some("http://127.0.0.1:2222"));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(pid_file.url(), None);
    }
}
