//! Host-side preparation of an agent's folders before its sandbox starts.
//!
//! Owns creating the workspace with the right owner, and deciding which uid:gid the
//! sandbox runs as (the workspace's owner, or `1000:1000` with the workspace handed over
//! once when the gateway runs as root); and, for backends that mount them (Docker), the
//! launcher and socket folders.

use std::os::unix::fs::MetadataExt;
#[cfg(feature = "docker")]
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{SandboxError, SandboxUser};
#[cfg(feature = "docker")]
use crate::home::BeigeHome;

fn host_err(path: &Path, e: std::io::Error) -> SandboxError {
    SandboxError::host(path, e)
}

/// Create the agent's launcher folder (`agents/<agent>/launchers`) and socket folder
/// (`run/<agent>`), mode 0755: what the Docker backend mounts besides the workspace.
#[cfg(feature = "docker")]
pub(crate) fn prepare_run_dirs(home: &BeigeHome, agent: &str) -> Result<(), SandboxError> {
    for dir in [home.launchers_dir(agent), home.run_dir(agent)] {
        std::fs::create_dir_all(&dir).map_err(|e| host_err(&dir, e))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| host_err(&dir, e))?;
    }
    Ok(())
}

/// Create the agent's workspace and return the user the sandbox runs as. `configured`
/// is the config's `sandbox.user`.
pub(crate) fn prepare_workspace(
    workspace: &Path,
    configured: Option<SandboxUser>,
) -> Result<SandboxUser, SandboxError> {
    let fresh = !workspace.exists();
    std::fs::create_dir_all(workspace).map_err(|e| host_err(workspace, e))?;
    let meta = std::fs::metadata(workspace).map_err(|e| host_err(workspace, e))?;
    if let Some(user) = configured {
        if let SandboxUser::Id { uid, gid } = user {
            if fresh && is_root() {
                chown_tree(workspace, uid, gid)?;
            }
        }
        return Ok(user);
    }
    if meta.uid() != 0 {
        return Ok(SandboxUser::Id {
            uid: meta.uid(),
            gid: meta.gid(),
        });
    }
    if is_root() {
        // The gateway runs as root and the workspace is root's: hand it to the default
        // sandbox user once (later starts find it owned by 1000 and keep it).
        if let SandboxUser::Id { uid, gid } = SandboxUser::DEFAULT {
            chown_tree(workspace, uid, gid)?;
        }
        return Ok(SandboxUser::DEFAULT);
    }
    Ok(SandboxUser::Id {
        uid: meta.uid(),
        gid: meta.gid(),
    })
}

fn is_root() -> bool {
    // Effective uid of the gateway; read from /proc to avoid unsafe FFI.
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// `chown -R` of the workspace without following links: the workspace may hold what an
/// earlier sandbox wrote, so this goes through [`crate::fsutil::Beneath::chown_tree`].
fn chown_tree(root: &Path, uid: u32, gid: u32) -> Result<(), SandboxError> {
    crate::fsutil::Beneath::open(root)
        .and_then(|ws| ws.chown_tree(uid, gid))
        .map_err(|e| host_err(root, std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepares_folders() {
        let tmp = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(tmp.path());
        let ws = home.default_workspace("a");
        prepare_run_dirs(&home, "a").unwrap();
        let user = prepare_workspace(&ws, None).unwrap();
        assert!(ws.is_dir());
        assert!(home.launchers_dir("a").is_dir());
        assert!(home.run_dir("a").is_dir());
        let owner = std::fs::metadata(&ws).unwrap().uid();
        if is_root() {
            assert_eq!(user, SandboxUser::DEFAULT);
            assert_eq!(owner, 1000);
        } else {
            assert_eq!(
                user,
                SandboxUser::Id {
                    uid: owner,
                    gid: std::fs::metadata(&ws).unwrap().gid()
                }
            );
        }
    }
}
