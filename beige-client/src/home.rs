//! The runtime home (`BEIGE_HOME`, default `~/.beige`) and every path inside it.
//!
//! This module owns the *layout* of the home directory — where the config, token,
//! database, agent workspaces, launchers, sockets, plugins and logs live — and the
//! [`InstallationId`] that names and labels this installation's containers on a shared
//! Docker engine (`installation.id`, random, made once by `beige setup` or at the first
//! gateway start). It creates nothing by itself except through the explicit `ensure_*`
//! helpers; `setup` decides what to create.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rand::RngCore;
use sha2::{Digest, Sha256};

/// Environment variable that overrides the home directory.
pub const BEIGE_HOME_ENV: &str = "BEIGE_HOME";

/// A resolved, absolute `BEIGE_HOME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeigeHome {
    root: PathBuf,
}

impl BeigeHome {
    /// Use `root` as the home. Relative paths are made absolute against the current
    /// directory; the directory need not exist yet.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let root = if root.is_absolute() {
            root
        } else {
            std::env::current_dir()
                .map(|d| d.join(&root))
                .unwrap_or(root)
        };
        Self {
            root: normalize(&root),
        }
    }

    /// `BEIGE_HOME` if set and non-empty, otherwise `~/.beige`.
    pub fn from_env() -> Self {
        match std::env::var_os(BEIGE_HOME_ENV) {
            Some(v) if !v.is_empty() => Self::new(PathBuf::from(v)),
            _ => Self::new(user_home().join(".beige")),
        }
    }

    /// The home folder itself.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// `config.json5`: the gateway's configuration.
    pub fn config_path(&self) -> PathBuf {
        self.root.join("config.json5")
    }
    /// `gateway.token`: the bearer token of the HTTP API.
    pub fn token_path(&self) -> PathBuf {
        self.root.join("gateway.token")
    }
    /// `gateway.pid`: the daemon's pid and a newline, nothing else.
    pub fn pid_path(&self) -> PathBuf {
        self.root.join("gateway.pid")
    }
    /// `run/gateway.url`: the URL the daemon serves (next to the agents' run folders,
    /// none of which is called `gateway.url`).
    pub fn gateway_url_path(&self) -> PathBuf {
        self.root.join("run").join("gateway.url")
    }
    /// `installation.id`: the random id of this installation.
    pub fn installation_id_path(&self) -> PathBuf {
        self.root.join(INSTALLATION_ID_FILE)
    }
    /// `beige.db`: the default (SQLite) store.
    pub fn db_path(&self) -> PathBuf {
        self.root.join("beige.db")
    }
    /// `agents/`: one folder per agent.
    pub fn agents_dir(&self) -> PathBuf {
        self.root.join("agents")
    }
    /// `agents/<agent>/`.
    pub fn agent_dir(&self, agent: &str) -> PathBuf {
        self.agents_dir().join(agent)
    }
    /// The default workspace of an agent (config `workspaceDir` overrides it).
    pub fn default_workspace(&self, agent: &str) -> PathBuf {
        self.agent_dir(agent).join("workspace")
    }
    /// `agents/<agent>/launchers/`: one link to the shim per plugin tool.
    pub fn launchers_dir(&self, agent: &str) -> PathBuf {
        self.agent_dir(agent).join("launchers")
    }
    /// `run/<agent>/`, mounted at `/beige/run` in the agent's sandbox.
    pub fn run_dir(&self, agent: &str) -> PathBuf {
        self.root.join("run").join(agent)
    }
    /// `run/<agent>/gateway.sock`: the agent's tool socket.
    pub fn socket_path(&self, agent: &str) -> PathBuf {
        self.run_dir(agent).join("gateway.sock")
    }
    /// `plugins/`: installed plugins.
    pub fn plugins_dir(&self) -> PathBuf {
        self.root.join("plugins")
    }
    /// `logs/`.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    /// `logs/audit.jsonl`: the audit log.
    pub fn audit_log_path(&self) -> PathBuf {
        self.logs_dir().join("audit.jsonl")
    }
    /// `logs/gateway.log`: the daemon's log.
    pub fn gateway_log_path(&self) -> PathBuf {
        self.logs_dir().join("gateway.log")
    }

    /// Eight hex digits of a hash of the home's *path*: what containers made before
    /// installation ids were named and labelled with (`io.beige.home`). Two homes with
    /// the same path (two machines or dev containers sharing one engine) have the same
    /// hash, so it identifies nothing; it is only used to find those old containers
    /// and migrate them ([`InstallationId`] is the identity).
    pub fn hash(&self) -> String {
        let digest = Sha256::digest(self.root.to_string_lossy().as_bytes());
        hex::encode(&digest[..4])
    }

    /// The installation id in `installation.id`, or `None` when there is no such file.
    pub fn read_installation_id(&self) -> Result<Option<InstallationId>, HomeError> {
        let path = self.installation_id_path();
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path);
        let file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(HomeError::ReadId { path, source }),
        };
        let mut text = String::new();
        file.take(256)
            .read_to_string(&mut text)
            .map_err(|source| HomeError::ReadId {
                path: path.clone(),
                source,
            })?;
        InstallationId::parse(text.trim())
            .map(Some)
            .ok_or(HomeError::InvalidId { path })
    }

    /// The installation id, creating `installation.id` (mode 0600, and the home folder,
    /// 0700, if missing) when there is none yet. Creation is atomic: the file appears
    /// complete or not at all, and when two processes race, both end up with the one
    /// that was linked into place first. The flag says whether this call created it.
    pub fn ensure_installation_id(&self) -> Result<(InstallationId, bool), HomeError> {
        if let Some(id) = self.read_installation_id()? {
            return Ok((id, false));
        }
        let path = self.installation_id_path();
        let create = |source| HomeError::CreateId {
            path: path.clone(),
            source,
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)
            .map_err(create)?;
        let id = InstallationId::generate();
        let tmp = self.root.join(format!(
            ".{INSTALLATION_ID_FILE}.{}.tmp",
            InstallationId::generate().short()
        ));
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            writeln!(f, "{id}")?;
            f.sync_all()?;
            // `link` never replaces an existing file: the first id linked wins.
            std::fs::hard_link(&tmp, &path)
        })();
        let _ = std::fs::remove_file(&tmp);
        match written {
            Ok(()) => Ok((id, true)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => self
                .read_installation_id()?
                .map(|id| (id, false))
                .ok_or(HomeError::InvalidId { path }),
            Err(e) => Err(create(e)),
        }
    }
}

/// The name of the installation id file inside `BEIGE_HOME`.
pub const INSTALLATION_ID_FILE: &str = "installation.id";

/// The random identity of one installation (one `BEIGE_HOME` on one machine): 32
/// lowercase hex digits (128 random bits). Its containers carry it in the
/// `io.beige.installation` label and its first [`InstallationId::SHORT`] digits in their
/// names, and the gateway touches no container that does not carry it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstallationId(String);

impl InstallationId {
    /// How many digits of the id container names carry.
    pub const SHORT: usize = 12;

    /// A new random id from the OS's generator.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        Self(hex::encode(bytes))
    }

    /// `text` if it is 32 lowercase hex digits.
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| Self(text.to_string()))
    }

    /// The 32 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first [`Self::SHORT`] digits, for container names.
    pub fn short(&self) -> &str {
        &self.0[..Self::SHORT]
    }
}

impl std::fmt::Display for InstallationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why the installation id could not be read or made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HomeError {
    /// `installation.id` exists but cannot be read.
    #[error("cannot read the installation id {}: {source}. Check that this user owns BEIGE_HOME.", .path.display())]
    ReadId {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// `installation.id` holds something else than an id.
    #[error("{} does not hold an installation id (32 lowercase hex digits on one line). Restore it from a backup; or, if this BEIGE_HOME has no running sandboxes, delete the file and a new id is made at the next start (sandboxes labelled with the old id are then left alone and must be removed with `docker rm -f`).", .path.display())]
    InvalidId {
        /// The file.
        path: PathBuf,
    },
    /// `installation.id` could not be written.
    #[error("cannot create the installation id {}: {source}. Check that this user may write BEIGE_HOME.", .path.display())]
    CreateId {
        /// The file.
        path: PathBuf,
        /// Why it could not be written.
        #[source]
        source: std::io::Error,
    },
}

/// The home directory of the user running the gateway.
pub fn user_home() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// Lexically normalise a path: drop `.` components and resolve `..` against the parent.
/// Does not touch the file system.
pub fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_hash() {
        let h = BeigeHome::new("/srv/beige/./x/..");
        assert_eq!(h.root(), Path::new("/srv/beige"));
        assert_eq!(
            h.socket_path("a"),
            Path::new("/srv/beige/run/a/gateway.sock")
        );
        assert_eq!(h.hash().len(), 8);
        assert_ne!(h.hash(), BeigeHome::new("/srv/other").hash());
        assert_eq!(h.hash(), BeigeHome::new("/srv/beige").hash());
    }

    #[test]
    fn installation_id_is_made_once_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        assert!(home.read_installation_id().unwrap().is_none());
        let (id, created) = home.ensure_installation_id().unwrap();
        assert!(created);
        assert_eq!(id.as_str().len(), 32);
        assert_eq!(id.short(), &id.as_str()[..12]);
        let meta = std::fs::metadata(home.installation_id_path()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::read_to_string(home.installation_id_path()).unwrap(),
            format!("{id}\n")
        );
        assert_eq!(home.ensure_installation_id().unwrap(), (id.clone(), false));
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(home.root())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [INSTALLATION_ID_FILE]);
        // Another home at another path gets another id.
        let other = BeigeHome::new(dir.path().join("other"));
        assert_ne!(other.ensure_installation_id().unwrap().0, id);
    }

    #[test]
    fn installation_ids_race_to_one() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        let ids: Vec<InstallationId> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| home.ensure_installation_id().unwrap().0))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    }

    #[test]
    fn a_broken_installation_id_is_an_error_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path());
        std::fs::write(home.installation_id_path(), "not an id\n").unwrap();
        let e = home.ensure_installation_id().unwrap_err();
        assert!(matches!(e, HomeError::InvalidId { .. }), "{e}");
        assert!(e.to_string().contains("installation.id"), "{e}");
        assert_eq!(
            std::fs::read_to_string(home.installation_id_path()).unwrap(),
            "not an id\n"
        );
        assert!(InstallationId::parse("0123456789ABCDEF0123456789abcdef").is_none());
        assert!(InstallationId::parse("0123456789abcdef0123456789abcdef").is_some());
    }
}
