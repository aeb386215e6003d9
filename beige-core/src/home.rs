//! The runtime home (`BEIGE_HOME`, default `~/.beige`) and every path inside it.
//!
//! This module owns the *layout* of the home directory — where the config, token,
//! database, agent workspaces, launchers, sockets, plugins and logs live — and the
//! short hash that names this home's containers. It creates nothing by itself except
//! through the explicit `ensure_*` helpers; `setup` decides what to create.

use std::path::{Path, PathBuf};

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

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn config_path(&self) -> PathBuf {
        self.root.join("config.json5")
    }
    pub fn token_path(&self) -> PathBuf {
        self.root.join("gateway.token")
    }
    pub fn pid_path(&self) -> PathBuf {
        self.root.join("gateway.pid")
    }
    pub fn db_path(&self) -> PathBuf {
        self.root.join("beige.db")
    }
    pub fn agents_dir(&self) -> PathBuf {
        self.root.join("agents")
    }
    pub fn agent_dir(&self, agent: &str) -> PathBuf {
        self.agents_dir().join(agent)
    }
    /// The default workspace of an agent (config `workspaceDir` overrides it).
    pub fn default_workspace(&self, agent: &str) -> PathBuf {
        self.agent_dir(agent).join("workspace")
    }
    pub fn launchers_dir(&self, agent: &str) -> PathBuf {
        self.agent_dir(agent).join("launchers")
    }
    /// `run/<agent>/`, mounted at `/beige/run` in the agent's sandbox.
    pub fn run_dir(&self, agent: &str) -> PathBuf {
        self.root.join("run").join(agent)
    }
    pub fn socket_path(&self, agent: &str) -> PathBuf {
        self.run_dir(agent).join("gateway.sock")
    }
    pub fn plugins_dir(&self) -> PathBuf {
        self.root.join("plugins")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn audit_log_path(&self) -> PathBuf {
        self.logs_dir().join("audit.jsonl")
    }
    pub fn gateway_log_path(&self) -> PathBuf {
        self.logs_dir().join("gateway.log")
    }

    /// Eight hex digits identifying this home on a shared Docker engine.
    pub fn hash(&self) -> String {
        let digest = Sha256::digest(self.root.to_string_lossy().as_bytes());
        hex::encode(&digest[..4])
    }
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
}
