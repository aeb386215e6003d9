//! Path resolution: relative paths against the config file's folder, `~` to the user's
//! home.
//!
//! Owns [`Resolver`] (one rule for every path field) and [`resolve_paths`], the last
//! step of loading, which rewrites `plugins.*.path`, `skills.*.path`,
//! `agents.*.workspaceDir`, the `extraMounts` host keys, `sandbox.shim` and
//! `gateway.logFile` to absolute, lexically normalised paths. It does not touch the
//! file system.

use std::path::{Path, PathBuf};

use crate::home::normalize;

use super::types::Config;

/// Turns a path as written in the config into an absolute one.
#[derive(Debug, Clone)]
pub(crate) struct Resolver {
    /// The config file's folder.
    pub(crate) base: PathBuf,
    /// What `~` stands for.
    pub(crate) user_home: PathBuf,
}

impl Resolver {
    pub(crate) fn resolve(&self, path: &Path) -> PathBuf {
        let expanded = match path.strip_prefix("~") {
            Ok(rest) => self.user_home.join(rest),
            Err(_) => path.to_path_buf(),
        };
        normalize(&self.base.join(expanded))
    }

    pub(crate) fn resolve_str(&self, path: &str) -> String {
        self.resolve(Path::new(path)).to_string_lossy().into_owned()
    }
}

/// Rewrite every path field of `config` through `resolver`.
pub(crate) fn resolve_paths(config: &mut Config, resolver: &Resolver) {
    for plugin in config.plugins.values_mut() {
        if let Some(path) = &mut plugin.path {
            *path = resolver.resolve(path);
        }
    }
    for skill in config.skills.values_mut() {
        skill.path = resolver.resolve(&skill.path);
    }
    for agent in config.agents.values_mut() {
        if let Some(dir) = &mut agent.workspace_dir {
            *dir = resolver.resolve(dir);
        }
        let mounts = std::mem::take(&mut agent.sandbox.extra_mounts);
        agent.sandbox.extra_mounts = mounts
            .into_iter()
            .map(|(host, container)| (resolver.resolve_str(&host), container))
            .collect();
    }
    if let Some(shim) = &mut config.sandbox.shim {
        *shim = resolver.resolve(shim);
    }
    if let Some(log_file) = &mut config.gateway.log_file {
        *log_file = resolver.resolve(log_file);
    }
    if let Some(file) = config.store.as_mut().and_then(|s| s.password_file.as_mut()) {
        *file = resolver.resolve(file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_absolute_and_tilde() {
        let r = Resolver {
            base: "/etc/beige".into(),
            user_home: "/home/u".into(),
        };
        assert_eq!(
            r.resolve(Path::new("./skills/x")),
            Path::new("/etc/beige/skills/x")
        );
        assert_eq!(r.resolve(Path::new("../data")), Path::new("/etc/data"));
        assert_eq!(r.resolve(Path::new("/abs/./p")), Path::new("/abs/p"));
        assert_eq!(r.resolve(Path::new("~")), Path::new("/home/u"));
        assert_eq!(
            r.resolve(Path::new("~/logs/g.log")),
            Path::new("/home/u/logs/g.log")
        );
        // Only a leading `~` component expands; `~user` and `a/~` are ordinary names.
        assert_eq!(
            r.resolve(Path::new("~bob/x")),
            Path::new("/etc/beige/~bob/x")
        );
        assert_eq!(r.resolve(Path::new("a/~")), Path::new("/etc/beige/a/~"));
    }
}
