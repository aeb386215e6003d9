//! Atomic file replacement and final-symlink resolution for `write` and `patch`.
//!
//! A file is replaced by writing a uniquely named temporary file in the same directory,
//! fsyncing it and renaming it over the target, so a reader sees either the old or the
//! new content, never half of it. This module knows nothing about requests or replies;
//! it only works on paths and bytes.

use std::ffi::OsString;
use std::fs::{self, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Mode of newly created files, before the umask.
pub const NEW_FILE_MODE: u32 = 0o644;

/// The most symlinks followed for one path (Linux's own limit).
const MAX_SYMLINK_HOPS: usize = 40;

/// How much of the target's file name goes into the temporary name, so the temporary
/// name stays within NAME_MAX (255 bytes).
const TEMP_NAME_KEEP: usize = 160;

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Follows symlinks in the *last* component of `path`, so that replacing the file
/// replaces the link's target (as `cat > link` would) instead of the link itself.
/// A dangling link resolves to the path it points at, which will then be created.
pub fn resolve_final_symlinks(path: &Path) -> io::Result<PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_SYMLINK_HOPS {
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = fs::read_link(&current)?;
                current = if target.is_absolute() {
                    target
                } else {
                    current
                        .parent()
                        .unwrap_or_else(|| Path::new("/"))
                        .join(target)
                };
            }
            _ => return Ok(current),
        }
    }
    Err(io::Error::other(format!(
        "too many levels of symbolic links at {}",
        path.display()
    )))
}

/// Replaces `path` with `bytes` atomically. With `mode`, the file gets exactly that
/// mode (used to keep an existing file's mode); without, [`NEW_FILE_MODE`] minus the
/// umask. The parent directory must exist.
pub fn atomic_write(path: &Path, bytes: &[u8], mode: Option<u32>) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut attempts = 0;
    loop {
        let tmp = dir.join(temp_name(name.as_bytes()));
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode.unwrap_or(NEW_FILE_MODE))
            .open(&tmp);
        match created {
            Ok(file) => return finish(file, &tmp, path, dir, bytes, mode),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 100 => attempts += 1,
            Err(e) => return Err(e),
        }
    }
}

fn finish(
    mut file: fs::File,
    tmp: &Path,
    path: &Path,
    dir: &Path,
    bytes: &[u8],
    mode: Option<u32>,
) -> io::Result<()> {
    let result = (|| {
        file.write_all(bytes)?;
        if let Some(mode) = mode {
            // The umask applied at creation; set the exact mode we want to keep.
            file.set_permissions(Permissions::from_mode(mode))?;
        }
        file.sync_all()?;
        drop(file);
        fs::rename(tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result?;
    // Make the rename itself durable; a failure here does not undo the write.
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// `.<name>.beige-tmp-<pid>-<n>`, with `name` shortened to keep within NAME_MAX.
fn temp_name(name: &[u8]) -> OsString {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let keep = &name[..name.len().min(TEMP_NAME_KEEP)];
    let mut out = Vec::with_capacity(keep.len() + 40);
    out.push(b'.');
    out.extend_from_slice(keep);
    out.extend_from_slice(format!(".beige-tmp-{}-{n}", std::process::id()).as_bytes());
    OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn writes_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        atomic_write(&p, b"one", None).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"one");
        atomic_write(&p, b"two", Some(0o751)).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o751
        );
        // No temporary files left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn long_names_fit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x".repeat(255));
        atomic_write(&p, b"ok", None).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"ok");
    }

    #[test]
    fn failure_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("d")).unwrap();
        fs::write(dir.path().join("d/inner"), "x").unwrap();
        // Renaming a file over a non-empty directory fails.
        assert!(atomic_write(&dir.path().join("d"), b"x", None).is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn follows_final_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        fs::write(&real, "x").unwrap();
        symlink("real", dir.path().join("l1")).unwrap();
        symlink(dir.path().join("l1"), dir.path().join("l2")).unwrap();
        assert_eq!(
            resolve_final_symlinks(&dir.path().join("l2")).unwrap(),
            real
        );
        symlink("nowhere", dir.path().join("dangling")).unwrap();
        assert_eq!(
            resolve_final_symlinks(&dir.path().join("dangling")).unwrap(),
            dir.path().join("nowhere")
        );
        symlink("loop", dir.path().join("loop")).unwrap();
        assert!(resolve_final_symlinks(&dir.path().join("loop")).is_err());
    }
}
