//! The `op` role: `beige-shim op <name>` performs one core-tool operation (`read`,
//! `write`, `patch`, `exec`) inside the container, or `kill`s a running `exec` (by the
//! `execId` it was started with) from a second invocation.
//!
//! This module owns the invocation contract — one JSON [`OpRequest`] on stdin, one JSON
//! [`OpReply`] line on stdout, exit code 0 whenever the operation ran (its failure is an
//! [`OpReply::Error`]), exit code 2 with a message on stderr (and a `bad_request` reply
//! on stdout) when the request cannot be decoded or does not match `<name>` — plus path
//! resolution against the workspace and the mapping of I/O errors to [`OpError`]s. The
//! operations themselves live in the submodules; none of them ever runs a shell except
//! `exec`, whose whole purpose is to run one.
//!
//! `beige-shim op <name> --drop UID:GID` (the `docker exec` fallback, run as root)
//! first applies the agent's privilege drop in-process ([`crate::privdrop`]), before
//! reading the request; if that fails nothing runs (exit code 1, an `io` error reply).
//! Every op process makes itself non-dumpable, so a concurrent agent process of the
//! same uid cannot read or change its memory while it works (the commands `exec` starts
//! are dumpable again).
//!
//! PID 1's forked `exec` op children (same code, through [`serve`]) also get a progress
//! pipe, to which the output is streamed while the command runs ([`crate::link`]
//! describes it); it is handed over explicitly, so the `op` invocation, which never has
//! one, does not look for it.

mod capture;
mod exec;
mod kill;
mod patch;
mod read;
mod spool;
mod survivors;
mod write;

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use beige_protocol::op::{OpError, OpErrorKind, OpReply, OpRequest};

use crate::privdrop::{AgentUser, PrivDrop};
use crate::sys;

/// Environment variable that overrides the workspace directory (tests use a temp dir).
pub const WORKSPACE_ENV: &str = "BEIGE_WORKSPACE";
/// Where the agent's workspace is mounted inside the container.
pub const DEFAULT_WORKSPACE: &str = "/workspace";

/// The operation names accepted after `op`.
pub const NAMES: [&str; 5] = ["read", "write", "patch", "exec", "kill"];

/// Exit code for a request that could not be decoded or did not match the op name.
const EXIT_BAD_REQUEST: i32 = 2;
/// Exit code when `--drop` could not be applied.
const EXIT_DROP_FAILED: i32 = 1;

/// Where an operation runs: the base for relative paths.
#[derive(Debug, Clone)]
pub struct Context {
    workspace: PathBuf,
}

impl Context {
    /// A context with an explicit workspace directory.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        Self {
            workspace: workspace.into(),
        }
    }

    /// The workspace from `BEIGE_WORKSPACE`, or `/workspace`.
    pub fn from_env() -> Self {
        let workspace = std::env::var_os(WORKSPACE_ENV)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| OsString::from(DEFAULT_WORKSPACE));
        Self::new(workspace)
    }

    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// Resolves a request path: absolute paths as given, relative ones against the
    /// workspace. Symlinks are left to the kernel (the container's own view).
    pub fn resolve(&self, path: &str) -> Result<PathBuf, OpError> {
        if path.is_empty() {
            return Err(op_error(
                OpErrorKind::BadRequest,
                "The path must not be empty.",
            ));
        }
        if path.contains('\0') {
            return Err(op_error(
                OpErrorKind::BadRequest,
                "The path must not contain NUL characters.",
            ));
        }
        let p = Path::new(path);
        Ok(if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.workspace.join(p)
        })
    }
}

/// Runs `beige-shim op <name> [--drop UID:GID]` (`args` after `op`) with the
/// process's stdin and stdout; returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let name = args.first().map(String::as_str);
    let Some(name) = name.filter(|n| NAMES.contains(n)) else {
        let given = name.unwrap_or("");
        return bad_request(&format!(
            "unknown operation {given:?}; expected one of: {}",
            NAMES.join(", ")
        ));
    };
    let mut drop_to: Option<AgentUser> = None;
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        match (arg.as_str(), rest.next()) {
            ("--drop", Some(user)) => match user.parse() {
                Ok(user) => drop_to = Some(user),
                Err(err) => return bad_request(&format!("--drop: {err}")),
            },
            ("--drop", None) => return bad_request("--drop needs UID:GID"),
            (other, _) => return bad_request(&format!("unexpected argument {other:?}")),
        }
    }
    // Best effort: it only shields this process from same-uid neighbours.
    let _ = sys::set_non_dumpable();
    if let Some(user) = drop_to {
        let dropped = PrivDrop::prepare(user)
            .and_then(|plan| plan.apply().map_err(|failure| format!("{failure}")));
        if let Err(err) = dropped {
            let message =
                format!("Cannot drop privileges to {user} for the {name} operation: {err}");
            eprintln!("beige-shim op: {message}");
            if let Err(err) = write_reply(OpReply::Error(op_error(OpErrorKind::Io, message)), false)
            {
                eprintln!("beige-shim op: cannot write the reply: {err}");
            }
            return EXIT_DROP_FAILED;
        }
    }
    let mut input = Vec::new();
    if let Err(err) = io::stdin().lock().read_to_end(&mut input) {
        return bad_request(&format!("cannot read the request from stdin: {err}"));
    }
    // No progress pipe here (`docker exec`): descriptor 3 is nobody's business.
    serve(name, &input, None)
}

/// Decodes `input` as a `name` request, performs it and writes the reply to stdout;
/// returns the exit code. Shared by `op <name>` and PID 1's forked op children.
///
/// `progress` is the progress pipe PID 1 gives its `exec` op children (descriptor 3,
/// see [`crate::link`]): an `exec` streams its output there while it runs. It is only
/// ever passed explicitly, never looked for.
pub fn serve(name: &str, input: &[u8], progress: Option<OwnedFd>) -> i32 {
    let request: OpRequest = match serde_json::from_slice(input) {
        Ok(request) => request,
        Err(err) => return bad_request(&format!("invalid {name} request: {err}")),
    };
    if request.name() != name {
        return bad_request(&format!(
            "the request is a {:?} operation but the shim was invoked as `op {name}`",
            request.name()
        ));
    }
    let raw = matches!(&request, OpRequest::Exec(e) if e.raw_output);
    let reply = perform(&Context::from_env(), request, true, progress);
    match write_reply(reply, raw) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("beige-shim op {name}: cannot write the reply: {err}");
            1
        }
    }
}

/// Performs one operation. `forward_signals` lets `exec` pass SIGTERM/SIGINT/SIGHUP it
/// receives on to the command's process group (only sensible in the shim process itself).
/// `progress`: where `exec` streams its output while it runs (see [`serve`]); other
/// operations just close it.
pub fn perform(
    ctx: &Context,
    request: OpRequest,
    forward_signals: bool,
    progress: Option<OwnedFd>,
) -> OpReply {
    let result = match request {
        OpRequest::Read(req) => read::read(ctx, &req).map(OpReply::Read),
        OpRequest::Write(req) => write::write(ctx, &req).map(OpReply::Write),
        OpRequest::Patch(req) => patch::patch(ctx, &req).map(OpReply::Patch),
        OpRequest::Exec(req) => exec::exec(ctx, &req, forward_signals, progress).map(OpReply::Exec),
        OpRequest::Kill(req) => kill::kill(&req).map(OpReply::Kill),
    };
    result.unwrap_or_else(OpReply::Error)
}

/// Reports a bad invocation on stderr and as a `bad_request` reply on stdout.
fn bad_request(message: &str) -> i32 {
    eprintln!("beige-shim op: {message}");
    let reply = OpReply::Error(op_error(OpErrorKind::BadRequest, message));
    if let Err(err) = write_reply(reply, false) {
        eprintln!("beige-shim op: cannot write the reply: {err}");
    }
    EXIT_BAD_REQUEST
}

/// Writes the reply to stdout in one go; with `raw`, large exec output in the raw form
/// ([`beige_protocol::op::encode_reply`]).
fn write_reply(reply: OpReply, raw: bool) -> io::Result<()> {
    let line = beige_protocol::op::encode_reply(reply, raw);
    let mut out = io::stdout().lock();
    out.write_all(&line)?;
    out.flush()
}

/// Builds an [`OpError`].
pub(crate) fn op_error(kind: OpErrorKind, message: impl Into<String>) -> OpError {
    OpError {
        kind,
        message: message.into(),
    }
}

/// The error for a path that is a directory where a file was expected (`read`).
pub(crate) fn is_directory(path: &str) -> OpError {
    op_error(
        OpErrorKind::IsDirectory,
        format!("{path} is a directory, not a file. Use exec with ls to list it."),
    )
}

/// Maps an I/O error on `path` (as the request named it) to an [`OpError`]; `doing`
/// completes "Failed to …" for errors without a dedicated kind (e.g. "read", "write").
pub(crate) fn fs_error(err: &io::Error, path: &str, doing: &str) -> OpError {
    match err.kind() {
        io::ErrorKind::NotFound => {
            op_error(OpErrorKind::NotFound, format!("File not found: {path}"))
        }
        io::ErrorKind::PermissionDenied => op_error(
            OpErrorKind::PermissionDenied,
            format!("Permission denied: {path}"),
        ),
        io::ErrorKind::ReadOnlyFilesystem => op_error(
            OpErrorKind::PermissionDenied,
            format!("Permission denied: {path} is on a read-only file system"),
        ),
        io::ErrorKind::IsADirectory => is_directory(path),
        io::ErrorKind::NotADirectory => op_error(
            OpErrorKind::NotFound,
            format!("File not found: {path} (a component of the path is not a directory)"),
        ),
        _ => op_error(OpErrorKind::Io, format!("Failed to {doing} {path}: {err}")),
    }
}

/// A short name for a non-regular, non-directory file type, for error messages.
pub(crate) fn special_file_kind(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "a named pipe"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// The error for a path that exists but is not a regular file or directory.
pub(crate) fn not_regular(path: &str, ft: &std::fs::FileType) -> OpError {
    op_error(
        OpErrorKind::Io,
        format!(
            "{path} is {}, not a regular file. Use exec to inspect it.",
            special_file_kind(ft)
        ),
    )
}

/// Checks that an existing regular file may be written by us, without changing it.
/// A rename would replace even a read-only file; `cat >` would not, and neither do we.
pub(crate) fn check_writable(target: &Path, path: &str) -> Result<(), OpError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(target)
        .map(drop)
        .map_err(|err| fs_error(&err, path, "write"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_relative_against_workspace() {
        let ctx = Context::new("/ws");
        assert_eq!(ctx.resolve("a/b").unwrap(), PathBuf::from("/ws/a/b"));
        assert_eq!(ctx.resolve("/etc/x").unwrap(), PathBuf::from("/etc/x"));
        assert_eq!(ctx.resolve("").unwrap_err().kind, OpErrorKind::BadRequest);
        assert_eq!(
            ctx.resolve("a\0b").unwrap_err().kind,
            OpErrorKind::BadRequest
        );
    }

    #[test]
    fn maps_io_errors() {
        let e = fs_error(&io::Error::from(io::ErrorKind::NotFound), "x", "read");
        assert_eq!(e.kind, OpErrorKind::NotFound);
        assert_eq!(e.message, "File not found: x");
        let e = fs_error(
            &io::Error::from(io::ErrorKind::PermissionDenied),
            "x",
            "read",
        );
        assert_eq!(e.kind, OpErrorKind::PermissionDenied);
        assert!(e.message.contains('x'));
    }
}
