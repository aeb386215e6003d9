//! `write`: creates or replaces a file with exactly the given content.
//!
//! Parent directories are created; the file is replaced atomically (see
//! [`crate::fsutil`]); an existing file keeps its mode and must be writable by the
//! sandbox user; a symlink is written through, not replaced. The path is only ever
//! passed to system calls, never to a shell.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;

use beige_protocol::op::{OpError, OpErrorKind, WriteReply, WriteRequest};

use super::{check_writable, fs_error, not_regular, op_error, Context};
use crate::fsutil;

/// Performs a `write` request.
pub fn write(ctx: &Context, req: &WriteRequest) -> Result<WriteReply, OpError> {
    let path = ctx.resolve(&req.path)?;
    if names_directory(&req.path) {
        return Err(op_error(
            OpErrorKind::BadRequest,
            format!(
                "{} names a directory, not a file; give a file name to write.",
                req.path
            ),
        ));
    }
    let target =
        fsutil::resolve_final_symlinks(&path).map_err(|e| fs_error(&e, &req.path, "write"))?;
    let mode = existing_mode(&target, &req.path)?;
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| fs_error(&e, &req.path, "create the directories of"))?;
    }
    fsutil::atomic_write(&target, req.content.as_bytes(), mode)
        .map_err(|e| fs_error(&e, &req.path, "write"))?;
    Ok(WriteReply {
        bytes: u64::try_from(req.content.len()).unwrap_or(u64::MAX),
    })
}

/// The mode of the existing regular file at `target` (checked writable), `None` when
/// there is no file yet.
pub(super) fn existing_mode(target: &std::path::Path, path: &str) -> Result<Option<u32>, OpError> {
    match fs::metadata(target) {
        Ok(meta) if meta.is_dir() => Err(op_error(
            OpErrorKind::IsDirectory,
            format!("{path} is a directory, not a file."),
        )),
        Ok(meta) if !meta.is_file() => Err(not_regular(path, &meta.file_type())),
        Ok(meta) => {
            check_writable(target, path)?;
            Ok(Some(meta.permissions().mode() & 0o7777))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fs_error(&e, path, "write")),
    }
}

/// Whether the path's last segment cannot be a file name (`dir/`, `.`, `..`).
fn names_directory(path: &str) -> bool {
    matches!(path.rsplit('/').next(), None | Some("" | "." | ".."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn req(path: &str, content: &str) -> WriteRequest {
        WriteRequest {
            path: path.into(),
            content: content.into(),
        }
    }

    #[test]
    fn creates_parents_and_writes_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new(dir.path());
        let reply = write(&ctx, &req("a/b/c.txt", "héllo\0")).unwrap();
        assert_eq!(reply.bytes, 7);
        assert_eq!(
            fs::read(dir.path().join("a/b/c.txt")).unwrap(),
            "héllo\0".as_bytes()
        );
    }

    #[test]
    fn keeps_mode_of_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new(dir.path());
        let p = dir.path().join("run.sh");
        fs::write(&p, "old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        write(&ctx, &req("run.sh", "new")).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o755
        );
    }

    #[test]
    fn new_file_mode_is_0644_minus_umask() {
        let dir = tempfile::tempdir().unwrap();
        write(&Context::new(dir.path()), &req("n", "x")).unwrap();
        let mode = fs::metadata(dir.path().join("n"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode & !0o644, 0, "mode {mode:o}");
        assert_ne!(mode & 0o600, 0);
    }

    #[test]
    fn writes_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new(dir.path());
        fs::write(dir.path().join("real"), "old").unwrap();
        symlink("real", dir.path().join("link")).unwrap();
        write(&ctx, &req("link", "new")).unwrap();
        assert!(fs::symlink_metadata(dir.path().join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(dir.path().join("real")).unwrap(), "new");
    }

    #[test]
    fn weird_names_are_just_names() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new(dir.path());
        let marker = dir.path().join("pwned");
        let names = [
            "it's.txt".to_owned(),
            "say \"hi\".txt".to_owned(),
            format!("$(touch {}).txt", marker.display()),
            format!("`touch {}`.txt", marker.display()),
            "with space/and\nnewline.txt".to_owned(),
            "ünï cødé ✓.txt".to_owned(),
        ];
        for name in &names {
            write(&ctx, &req(name, name)).unwrap();
        }
        assert!(!marker.exists());
        for name in &names {
            assert_eq!(&fs::read_to_string(dir.path().join(name)).unwrap(), name);
        }
    }

    #[test]
    fn refuses_directories() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new(dir.path());
        fs::create_dir(dir.path().join("d")).unwrap();
        assert_eq!(
            write(&ctx, &req("d", "x")).unwrap_err().kind,
            OpErrorKind::IsDirectory
        );
        assert_eq!(
            write(&ctx, &req("d/", "x")).unwrap_err().kind,
            OpErrorKind::BadRequest
        );
        assert_eq!(
            write(&ctx, &req("d/..", "x")).unwrap_err().kind,
            OpErrorKind::BadRequest
        );
    }

    #[test]
    fn read_only_file_is_permission_denied() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ro");
        fs::write(&p, "keep").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o444)).unwrap();
        if fs::OpenOptions::new().write(true).open(&p).is_ok() {
            return; // running as root
        }
        let err = write(&Context::new(dir.path()), &req("ro", "x")).unwrap_err();
        assert_eq!(err.kind, OpErrorKind::PermissionDenied);
        assert_eq!(err.message, "Permission denied: ro");
        assert_eq!(fs::read_to_string(&p).unwrap(), "keep");
    }
}
