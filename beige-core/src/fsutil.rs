//! Host-side access to trees an agent can write, and path checks for caller input.
//!
//! The rule (docs/sandbox.md, "The host never follows a path a sandbox can change"): the
//! gateway never opens a path inside an agent-writable tree by name. It either asks PID 1
//! to do the work inside the sandbox, or it goes through [`Beneath`]: a handle on the
//! tree's root directory, below which every open uses `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` (or, on kernels without `openat2`, a walk
//! that opens each component with `O_NOFOLLOW`), refuses anything but regular files and
//! directories without opening it for I/O, caps what it reads and creates files only
//! under a fresh name that is then renamed into place without replacing anything. These
//! calls block; async callers run them with [`blocking`], never on a runtime thread.
//!
//! Also here: [`validate_cwd`] (a caller's working directory is a relative path that
//! stays inside the workspace) and [`safe_join`], which resolves symlinks and is only for
//! trees the agent cannot write (a plugin's own folder, a checkout being installed).

use std::io::Read as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{FileType, Mode, OFlags, RenameFlags, ResolveFlags};

/// How large a file [`Beneath::read`] reads by default: enough for any note or config
/// an agent keeps, small enough that a planted giant cannot fill the gateway's memory.
pub const DEFAULT_READ_CAP: usize = 1024 * 1024;

/// Why a host-side access beneath an agent-writable tree did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostPathError {
    /// The relative path itself is not acceptable (absolute, `..`, NUL, not UTF-8).
    #[error("{path:?}: {why}; give a path relative to the workspace that stays inside it")]
    BadPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Something on the way is a symlink, or the path leaves the tree.
    #[error("{path:?}: refused because it is or passes through a symbolic link, or leaves the workspace; the gateway does not follow links in a workspace (replace the link with the real file)")]
    Link {
        /// The path as given.
        path: String,
    },
    /// The path names something other than what the operation needs.
    #[error("{path:?}: refused because it is a {found}, not a {wanted}")]
    WrongType {
        /// The path as given.
        path: String,
        /// `fifo`, `socket`, `device`, `directory`, ...
        found: &'static str,
        /// `regular file` or `directory`.
        wanted: &'static str,
    },
    /// The root of the tree could not be opened.
    #[error("workspace {root}: cannot be opened: {source}")]
    Root {
        /// The root's host path.
        root: PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// Any other failure of the kernel.
    #[error("{path:?}: {source}")]
    Io {
        /// The path as given.
        path: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

impl HostPathError {
    /// Whether the file simply does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, HostPathError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    fn io(path: &str, e: impl Into<std::io::Error>) -> Self {
        let source: std::io::Error = e.into();
        // ELOOP: a symlink under RESOLVE_NO_SYMLINKS / O_NOFOLLOW; EXDEV: the path left
        // the tree under RESOLVE_BENEATH.
        match source.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::EXDEV) => HostPathError::Link {
                path: path.to_string(),
            },
            _ => HostPathError::Io {
                path: path.to_string(),
                source,
            },
        }
    }
}

/// The bytes of a file read with a cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capped {
    /// At most the cap.
    pub bytes: Vec<u8>,
    /// The file's size when it was opened.
    pub size: u64,
    /// Whether bytes beyond the cap were left unread.
    pub truncated: bool,
}

/// A handle on the root of an agent-writable tree (a workspace). Every access below it
/// goes through the handle, never through a path string; see the module docs.
#[derive(Debug)]
pub struct Beneath {
    root: OwnedFd,
    path: PathBuf,
}

/// `openat2` is missing (old kernel) or refused (a seccomp profile): walk instead.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

impl Beneath {
    /// Open the root of the tree. The root's own path comes from the configuration, not
    /// from the sandbox; everything below it is treated as hostile.
    pub fn open(root: &Path) -> Result<Self, HostPathError> {
        let fd = rustix::fs::open(
            root,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| HostPathError::Root {
            root: root.to_path_buf(),
            source: e.into(),
        })?;
        Ok(Self {
            root: fd,
            path: root.to_path_buf(),
        })
    }

    /// The root's host path, for messages only: never open it by name.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read the regular file `rel`, at most `cap` bytes. Anything but a regular file
    /// (a link, FIFO, socket or device) is refused before it is opened for reading.
    pub fn read(&self, rel: &str, cap: usize) -> Result<Capped, HostPathError> {
        let fd = self.open_regular(rel, OFlags::RDONLY)?;
        let size = rustix::fs::fstat(&fd)
            .map(|st| u64::try_from(st.st_size).unwrap_or(0))
            .map_err(|e| HostPathError::io(rel, e))?;
        let mut file = std::fs::File::from(fd);
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(cap).min(cap));
        let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
        (&mut file)
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(|e| HostPathError::io(rel, e))?;
        let truncated = bytes.len() > cap;
        bytes.truncate(cap);
        Ok(Capped {
            bytes,
            size,
            truncated,
        })
    }

    /// Open the regular file `rel` for reading, e.g. to stream an upload. The type is
    /// checked on a path-only handle first, so a FIFO or device is never opened for I/O.
    pub fn open_file(&self, rel: &str) -> Result<std::fs::File, HostPathError> {
        self.open_regular(rel, OFlags::RDONLY)
            .map(std::fs::File::from)
    }

    /// Open the directory `rel` (`""` is the root) as a handle, e.g. for a child
    /// process's working directory (`fchdir`) or as the base of further `*at` calls.
    pub fn open_dir(&self, rel: &str) -> Result<OwnedFd, HostPathError> {
        let parts = components(rel)?;
        if parts.is_empty() {
            return rustix::io::fcntl_dupfd_cloexec(&self.root, 0)
                .map_err(|e| HostPathError::io(rel, e));
        }
        // A path-only handle, so that a link opens as itself and is named as one; it
        // serves as a working directory (`fchdir`) and as the base of `*at` calls.
        let fd = self.open_at(rel, &parts, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
        match file_type(&fd, rel)? {
            FileType::Directory => Ok(fd),
            other => Err(wrong_type(rel, other, "directory")),
        }
    }

    /// Create `rel` with `contents` unless something (a file, a link, anything) already
    /// has that name. The bytes go to a fresh name first and are renamed into place with
    /// `RENAME_NOREPLACE`, so a reader never sees half a file and nothing planted is
    /// followed or replaced. `owner` hands the file to the sandbox user when the gateway
    /// may (best effort). Returns whether the file was created.
    pub fn create_new(
        &self,
        rel: &str,
        contents: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<bool, HostPathError> {
        let parts = components(rel)?;
        let Some((name, dirs)) = parts.split_last() else {
            return Err(HostPathError::BadPath {
                path: rel.to_string(),
                why: "it names the workspace itself",
            });
        };
        let parent = self.open_dir(&dirs.join("/"))?;
        let tmp = format!(".{name}.beige-{:016x}", rand::random::<u64>());
        let fd = rustix::fs::openat(
            &parent,
            tmp.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| HostPathError::io(rel, e))?;
        let cleanup = |e: HostPathError| {
            let _ = rustix::fs::unlinkat(&parent, tmp.as_str(), rustix::fs::AtFlags::empty());
            e
        };
        let mut file = std::fs::File::from(fd);
        std::io::Write::write_all(&mut file, contents)
            .and_then(|()| file.sync_all())
            .map_err(|e| cleanup(HostPathError::io(rel, e)))?;
        if let Some((uid, gid)) = owner {
            if let Err(e) = rustix::fs::fchown(
                &file,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            ) {
                tracing::debug!(path = rel, error = %e, "could not hand the file to the sandbox user");
            }
        }
        drop(file);
        match rustix::fs::renameat_with(
            &parent,
            tmp.as_str(),
            &parent,
            *name,
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::EXIST) => {
                let _ = rustix::fs::unlinkat(&parent, tmp.as_str(), rustix::fs::AtFlags::empty());
                Ok(false)
            }
            Err(e) => Err(cleanup(HostPathError::io(rel, e))),
        }
    }

    /// `chown -R` of the whole tree without following any link: every directory is
    /// opened beneath its parent's handle with `O_NOFOLLOW`, every entry changed with
    /// `fchownat(AT_SYMLINK_NOFOLLOW)`, so swapping a folder for a link while this runs
    /// changes nothing outside the tree. Blocking.
    pub fn chown_tree(&self, uid: u32, gid: u32) -> Result<(), HostPathError> {
        let (uid, gid) = (
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        );
        rustix::fs::fchown(&self.root, uid, gid).map_err(|e| HostPathError::io("", e))?;
        let root =
            rustix::io::fcntl_dupfd_cloexec(&self.root, 0).map_err(|e| HostPathError::io("", e))?;
        chown_below(root, uid, gid, 0)
    }

    /// Open `rel` as a regular file with `flags`: a path-only handle first, its type
    /// checked, then the same inode reopened for I/O through that handle.
    fn open_regular(&self, rel: &str, flags: OFlags) -> Result<OwnedFd, HostPathError> {
        let parts = components(rel)?;
        if parts.is_empty() {
            return Err(wrong_type(rel, FileType::Directory, "regular file"));
        }
        let path_fd = self.open_at(rel, &parts, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
        match file_type(&path_fd, rel)? {
            FileType::RegularFile => {}
            other => return Err(wrong_type(rel, other, "regular file")),
        }
        reopen(&path_fd, flags).map_err(|e| HostPathError::io(rel, e))
    }

    /// `openat2` beneath the root, refusing every symlink; or the component walk.
    fn open_at(
        &self,
        rel: &str,
        parts: &[&str],
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, HostPathError> {
        // openat2 refuses flags that mean nothing for a path-only handle.
        let flags = if flags.contains(OFlags::PATH) {
            flags | OFlags::CLOEXEC
        } else {
            flags | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK
        };
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            match rustix::fs::openat2(
                &self.root,
                parts.join("/"),
                flags,
                mode,
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            ) {
                Ok(fd) => return Ok(fd),
                Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => {
                    tracing::debug!("openat2 unavailable; walking paths with O_NOFOLLOW");
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                }
                // AGAIN: a concurrent rename under RESOLVE_BENEATH; one retry by walking.
                Err(rustix::io::Errno::AGAIN) => {}
                Err(e) => return Err(HostPathError::io(rel, e)),
            }
        }
        walk(self.root.as_fd(), rel, parts, flags, mode)
    }
}

/// How deep [`Beneath::chown_tree`] descends; deeper folders are left as they are.
const MAX_CHOWN_DEPTH: usize = 256;

fn chown_below(
    dir: OwnedFd,
    uid: Option<rustix::fs::Uid>,
    gid: Option<rustix::fs::Gid>,
    depth: usize,
) -> Result<(), HostPathError> {
    if depth > MAX_CHOWN_DEPTH {
        return Ok(());
    }
    let mut subdirs = Vec::new();
    let entries = rustix::fs::Dir::read_from(&dir).map_err(|e| HostPathError::io("", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| HostPathError::io("", e))?;
        let name = entry.file_name().to_owned();
        if name.as_bytes() == b"." || name.as_bytes() == b".." {
            continue;
        }
        match rustix::fs::chownat(
            &dir,
            name.as_c_str(),
            uid,
            gid,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(HostPathError::io(&name.to_string_lossy(), e)),
        }
        if entry.file_type() == FileType::Directory {
            subdirs.push(name);
        }
    }
    for name in subdirs {
        match rustix::fs::openat(
            &dir,
            name.as_c_str(),
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(sub) => chown_below(sub, uid, gid, depth + 1)?,
            // Swapped for a link or removed since it was listed: nothing to follow.
            Err(rustix::io::Errno::LOOP)
            | Err(rustix::io::Errno::NOTDIR)
            | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(HostPathError::io(&name.to_string_lossy(), e)),
        }
    }
    Ok(())
}

/// Open `parts` below `root` one component at a time, never following a symlink.
fn walk(
    root: BorrowedFd<'_>,
    rel: &str,
    parts: &[&str],
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, HostPathError> {
    let Some((last, dirs)) = parts.split_last() else {
        return Err(HostPathError::BadPath {
            path: rel.to_string(),
            why: "it is empty",
        });
    };
    let mut current: Option<OwnedFd> = None;
    for dir in dirs {
        let at = current.as_ref().map_or(root, |fd| fd.as_fd());
        // Without O_DIRECTORY, so that a link opens as itself and is named as one.
        let next = rustix::fs::openat(
            at,
            *dir,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| HostPathError::io(rel, e))?;
        match file_type(&next, rel)? {
            FileType::Directory => {}
            other => return Err(wrong_type(rel, other, "directory")),
        }
        current = Some(next);
    }
    let at = current.as_ref().map_or(root, |fd| fd.as_fd());
    let fd = rustix::fs::openat(at, *last, flags | OFlags::NOFOLLOW, mode)
        .map_err(|e| HostPathError::io(rel, e))?;
    // O_PATH | O_NOFOLLOW opens a symlink itself: refuse it here.
    if file_type(&fd, rel)? == FileType::Symlink {
        return Err(HostPathError::Link {
            path: rel.to_string(),
        });
    }
    Ok(fd)
}

/// Reopen the inode behind a path-only handle for I/O. `/proc/self/fd/N` names exactly
/// that inode (the link is the handle's own, not the sandbox's), so nothing can be
/// swapped in between.
fn reopen(path_fd: &OwnedFd, flags: OFlags) -> std::io::Result<OwnedFd> {
    let proc_path = format!("/proc/self/fd/{}", path_fd.as_raw_fd());
    let fd = rustix::fs::open(
        proc_path.as_str(),
        flags | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    let (a, b) = (rustix::fs::fstat(path_fd)?, rustix::fs::fstat(&fd)?);
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
        return Err(std::io::Error::other(
            "the file changed while it was opened",
        ));
    }
    Ok(fd)
}

fn file_type(fd: &OwnedFd, rel: &str) -> Result<FileType, HostPathError> {
    rustix::fs::fstat(fd)
        .map(|st| FileType::from_raw_mode(st.st_mode))
        .map_err(|e| HostPathError::io(rel, e))
}

fn wrong_type(rel: &str, found: FileType, wanted: &'static str) -> HostPathError {
    let found = match found {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice | FileType::BlockDevice => "device",
        _ => "special file",
    };
    if found == "symbolic link" {
        return HostPathError::Link {
            path: rel.to_string(),
        };
    }
    HostPathError::WrongType {
        path: rel.to_string(),
        found,
        wanted,
    }
}

/// The normal components of a relative path; `..`, absolute paths and NUL refused.
fn components(rel: &str) -> Result<Vec<&str>, HostPathError> {
    let bad = |why| HostPathError::BadPath {
        path: rel.to_string(),
        why,
    };
    if rel.contains('\0') {
        return Err(bad("it contains a NUL byte"));
    }
    let mut parts = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(s) => parts.push(s.to_str().ok_or_else(|| bad("it is not UTF-8"))?),
            Component::CurDir => {}
            Component::ParentDir => return Err(bad("it contains '..'")),
            Component::RootDir | Component::Prefix(_) => return Err(bad("it is absolute")),
        }
    }
    Ok(parts)
}

/// Run a blocking host-file operation off the async runtime's threads, so a slow disk
/// or a file the kernel holds up never stalls the gateway's other work.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, HostPathError>
where
    F: FnOnce() -> Result<T, HostPathError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(HostPathError::Io {
            path: String::new(),
            source: std::io::Error::other(format!("file task failed: {e}")),
        })
    })
}

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PathError(pub String);

/// Normalise a caller-supplied `cwd` relative to the workspace. `None` or `""` is the
/// workspace itself. Absolute paths, `..` that leaves the workspace and NUL bytes are
/// rejected.
pub(crate) fn validate_cwd(cwd: Option<&str>) -> Result<Option<String>, PathError> {
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

    /// A workspace with one of everything hostile in it, and a host file beside it.
    fn hostile() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join("sub/ok.txt"), "fine").unwrap();
        std::fs::write(dir.path().join("secret"), "host secret").unwrap();
        let link =
            |target: &Path, name: &str| std::os::unix::fs::symlink(target, ws.join(name)).unwrap();
        link(&dir.path().join("secret"), "file-link");
        link(dir.path(), "dir-link");
        link(Path::new("/proc/self/environ"), "environ");
        link(&dir.path().join("missing"), "dangling");
        link(Path::new("sub"), "inside-link");
        assert!(std::process::Command::new("mkfifo")
            .arg(ws.join("fifo"))
            .status()
            .unwrap()
            .success());
        let _sock = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
        (dir, ws)
    }

    #[test]
    fn beneath_refuses_links_and_special_files() {
        let (dir, ws) = hostile();
        let b = Beneath::open(&ws).unwrap();
        assert_eq!(b.read("sub/ok.txt", 100).unwrap().bytes, b"fine");
        assert_eq!(b.read("./sub//ok.txt", 100).unwrap().bytes, b"fine");
        for rel in [
            "file-link",
            "dir-link/secret",
            "environ",
            "dangling",
            "inside-link/ok.txt",
        ] {
            let e = b.read(rel, 100).unwrap_err();
            assert!(matches!(e, HostPathError::Link { .. }), "{rel}: {e:?}");
        }
        for (rel, found) in [("fifo", "FIFO"), ("sock", "socket"), ("sub", "directory")] {
            match b.read(rel, 100).unwrap_err() {
                HostPathError::WrongType { found: f, .. } => assert_eq!(f, found, "{rel}"),
                e => panic!("{rel}: {e:?}"),
            }
        }
        for rel in ["../secret", "/etc/passwd", "sub/../../secret"] {
            assert!(
                matches!(b.read(rel, 100).unwrap_err(), HostPathError::BadPath { .. }),
                "{rel}"
            );
        }
        assert!(b.read("nothing", 100).unwrap_err().is_not_found());
        assert!(b.open_dir("dir-link").is_err());
        assert!(b.open_dir("fifo").is_err());
        assert!(b.open_dir("sub").is_ok());
        assert!(b.open_dir("").is_ok());
        // Nothing was created or changed outside.
        assert_eq!(
            std::fs::read_to_string(dir.path().join("secret")).unwrap(),
            "host secret"
        );
        assert!(!dir.path().join("missing").exists());
    }

    #[test]
    fn device_nodes_are_refused_unopened() {
        let (_dir, ws) = hostile();
        // Tests run as root in CI; elsewhere mknod may be refused, then there is nothing to test.
        let made = std::process::Command::new("mknod")
            .arg(ws.join("null"))
            .args(["c", "1", "3"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !made {
            eprintln!("mknod not permitted here; device case not run");
            return;
        }
        let b = Beneath::open(&ws).unwrap();
        match b.read("null", 10).unwrap_err() {
            HostPathError::WrongType { found, .. } => assert_eq!(found, "device"),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn the_walk_refuses_what_openat2_refuses() {
        let (_dir, ws) = hostile();
        let b = Beneath::open(&ws).unwrap();
        let flags = OFlags::PATH | OFlags::CLOEXEC;
        let ok = walk(
            b.root.as_fd(),
            "sub/ok.txt",
            &["sub", "ok.txt"],
            flags,
            Mode::empty(),
        )
        .unwrap();
        assert_eq!(file_type(&ok, "x").unwrap(), FileType::RegularFile);
        for parts in [
            &["file-link"][..],
            &["dir-link", "secret"],
            &["environ"],
            &["dangling"],
            &["inside-link", "ok.txt"],
        ] {
            let e = walk(b.root.as_fd(), "x", parts, flags, Mode::empty()).unwrap_err();
            assert!(matches!(e, HostPathError::Link { .. }), "{parts:?}: {e:?}");
        }
    }

    #[test]
    fn reads_are_capped_and_creation_never_replaces() {
        let (dir, ws) = hostile();
        std::fs::write(ws.join("big"), vec![b'x'; 10_000]).unwrap();
        let b = Beneath::open(&ws).unwrap();
        let c = b.read("big", 100).unwrap();
        assert_eq!((c.bytes.len(), c.size, c.truncated), (100, 10_000, true));
        let c = b.read("big", 10_000).unwrap();
        assert_eq!((c.bytes.len(), c.truncated), (10_000, false));
        // Existing names of every kind are kept as they are.
        for rel in ["big", "file-link", "dangling", "fifo", "sub"] {
            assert!(!b.create_new(rel, b"new", 0o644, None).unwrap(), "{rel}");
        }
        assert!(!dir.path().join("missing").exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("secret")).unwrap(),
            "host secret"
        );
        // Through a linked folder: refused.
        assert!(b.create_new("dir-link/planted", b"x", 0o644, None).is_err());
        assert!(!dir.path().join("planted").exists());
        assert!(b.create_new("sub/new.txt", b"new", 0o600, None).unwrap());
        assert_eq!(
            std::fs::read_to_string(ws.join("sub/new.txt")).unwrap(),
            "new"
        );
        let leftovers = std::fs::read_dir(ws.join("sub"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains("beige-")
            })
            .count();
        assert_eq!(leftovers, 0);
    }

    #[test]
    fn chown_tree_never_follows_links() {
        let (dir, ws) = hostile();
        if !rustix::process::geteuid().is_root() {
            eprintln!("not root; chown case not run");
            return;
        }
        std::fs::create_dir_all(ws.join("a/b")).unwrap();
        std::fs::write(ws.join("a/b/f"), "x").unwrap();
        Beneath::open(&ws).unwrap().chown_tree(4242, 4243).unwrap();
        use std::os::unix::fs::MetadataExt;
        for p in ["", "a", "a/b", "a/b/f", "sub/ok.txt", "fifo"] {
            let m = std::fs::symlink_metadata(ws.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (4242, 4243), "{p}");
        }
        // The links themselves changed owner; what they point to did not.
        let m = std::fs::symlink_metadata(dir.path().join("secret")).unwrap();
        assert_eq!(m.uid(), 0);
        assert_eq!(
            std::fs::symlink_metadata(ws.join("dir-link"))
                .unwrap()
                .uid(),
            4242
        );
    }

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
