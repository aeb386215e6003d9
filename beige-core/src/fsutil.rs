//! Host-side path safety for handlers that touch an agent's workspace.
//!
//! Owns two checks: [`validate_cwd`] (a caller's working directory must be a relative
//! path that stays inside the workspace after normalisation) and [`safe_join`] (resolve a
//! path below the workspace, following symlinks the agent may have planted, and refuse
//! any result outside it).

use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PathError(pub String);

/// Normalise a caller-supplied `cwd` relative to the workspace. `None` or `""` is the
/// workspace itself. Absolute paths, `..` that leaves the workspace and NUL bytes are
/// rejected.
pub fn validate_cwd(cwd: Option<&str>) -> Result<Option<String>, PathError> {
    let Some(cwd) = cwd.filter(|c| !c.is_empty() && *c != ".") else {
        return Ok(None);
    };
    let reject = |why: &str| {
        PathError(format!(
            "invalid cwd {cwd:?}: {why}; it must be a path relative to /workspace that stays inside it"
        ))
    };
    if cwd.contains('\0') {
        return Err(reject("it contains a NUL byte"));
    }
    let p = Path::new(cwd);
    if p.is_absolute() {
        return Err(reject("it is absolute"));
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => {
                parts.push(s.to_str().ok_or_else(|| reject("it is not UTF-8"))?)
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(reject("it leaves the workspace"));
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err(reject("it is absolute")),
        }
    }
    Ok(if parts.is_empty() {
        None
    } else {
        Some(parts.join("/"))
    })
}

/// Resolve `rel` below `root`, following symlinks, and refuse a result outside `root`.
/// The file need not exist; its deepest existing ancestor is resolved.
pub fn safe_join(root: &Path, rel: &str) -> Result<PathBuf, PathError> {
    let root = root
        .canonicalize()
        .map_err(|e| PathError(format!("workspace {} is not usable: {e}", root.display())))?;
    let rel_path = Path::new(rel);
    if rel_path.is_absolute() {
        return Err(PathError(format!(
            "{rel:?} is absolute; give a path relative to the workspace"
        )));
    }
    let joined = root.join(rel_path);
    // Resolve the deepest existing ancestor, then append the rest lexically.
    let mut existing = joined.clone();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    let resolved = loop {
        match existing.canonicalize() {
            Ok(p) => break p,
            Err(_) => {
                let Some(name) = existing.file_name().map(|n| n.to_os_string()) else {
                    return Err(PathError(format!("{rel:?} cannot be resolved")));
                };
                rest.push(name);
                if !existing.pop() {
                    return Err(PathError(format!("{rel:?} cannot be resolved")));
                }
            }
        }
    };
    let mut out = resolved;
    for part in rest.iter().rev() {
        if part == ".." {
            out.pop();
        } else if part != "." {
            out.push(part);
        }
    }
    if out.starts_with(&root) {
        Ok(out)
    } else {
        Err(PathError(format!(
            "{rel:?} resolves to a place outside the workspace (through '..' or a symlink); refused"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwd_rules() {
        assert_eq!(validate_cwd(None).unwrap(), None);
        assert_eq!(
            validate_cwd(Some("a/./b/../c")).unwrap().as_deref(),
            Some("a/c")
        );
        assert_eq!(validate_cwd(Some("a/..")).unwrap(), None);
        assert!(validate_cwd(Some("../../etc")).is_err());
        assert!(validate_cwd(Some("a/../../etc")).is_err());
        assert!(validate_cwd(Some("/etc")).is_err());
    }

    #[test]
    fn symlinks_cannot_escape() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), ws.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", ws.join("etc")).unwrap();
        std::os::unix::fs::symlink("sub", ws.join("inside")).unwrap();
        assert!(safe_join(&ws, "link").is_err());
        assert!(safe_join(&ws, "etc/passwd").is_err());
        assert!(safe_join(&ws, "../secret").is_err());
        assert!(safe_join(&ws, "/etc/passwd").is_err());
        let ok = safe_join(&ws, "inside/new.txt").unwrap();
        assert_eq!(ok, ws.canonicalize().unwrap().join("sub/new.txt"));
        assert!(safe_join(&ws, "sub/../sub/x").is_ok());
    }
}
