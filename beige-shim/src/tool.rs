//! The tool-client role: `/tools/bin/<tool>` (a symlink to the shim) or `beige-shim tool
//! <tool> [args…]` sends one [`ToolRequest`] line to the gateway's socket (`$BEIGE_SOCKET`,
//! default `/beige/run/gateway.sock`), reads one [`ToolResponse`] line back and turns it
//! into stdout, stderr and an exit code — so a plugin tool behaves like a local command.
//! The request carries the arguments (UTF-8 only), the session context from the
//! `BEIGE_*` variables, the current directory relative to the workspace and, following
//! one fixed rule, the data on stdin: **a terminal, `/dev/null` or any other character
//! device is never read; a regular file is read from its current offset; a pipe or socket
//! is read to end of file only if it becomes readable (data or end of file) within
//! [`PIPE_WAIT`] (50 ms), otherwise it is left alone** — so `echo x | kv set k` forwards
//! `x\n`, and `kv get k` from a script, under `< /dev/null`, in a terminal or with an idle
//! inherited pipe never hangs. `BEIGE_TOOL_STDIN=1` always reads stdin to end of file (for
//! a slow producer), `BEIGE_TOOL_STDIN=0` never does. Like `ssh`, a tool consumes the stdin
//! it inherits, so inside a `while read` loop call it with `< /dev/null`. Stdin is bounded
//! by [`MAX_STDIN_BYTES`]. Own exit codes: 2 invalid invocation (non-UTF-8 argument, stdin
//! too large, bad setting), 124 `BEIGE_TOOL_TIMEOUT` expired, 125 the gateway cannot be
//! reached, 126 protocol error. The gateway's codes pass through, e.g. 77 when a budget
//! (`budgets.exec.toolCalls`) refused the call; `BEIGE_EXEC_ID` goes along as the
//! request's advisory `execId`.
//!
//! A few tools take a file of text by path: `spawn --message-file PATH` and `schedule
//! add … --prompt-file PATH` ([`FILE_FLAGS`]). The client reads that file **here, in the
//! sandbox**, as the calling user, sends its bytes as the request's stdin and drops the
//! flag and its path from the arguments, so the gateway never opens a path an agent named
//! (`~/` is the sandbox's `$HOME`). A file that cannot be read (missing, not a regular
//! file, over [`MAX_STDIN_BYTES`]) fails the call with exit code 2 before anything is sent.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use beige_protocol::op::EXEC_ID_ENV;
use beige_protocol::socket::{
    SessionContext, ToolRequest, ToolResponse, MAX_STDIN_BYTES, TOOL_RESPONSE,
};

use crate::op::{DEFAULT_WORKSPACE, WORKSPACE_ENV};
use crate::sys;

/// Environment variable naming the gateway's socket.
pub const SOCKET_ENV: &str = "BEIGE_SOCKET";
/// Where the gateway's socket is mounted inside the container.
pub const DEFAULT_SOCKET: &str = "/beige/run/gateway.sock";
/// `1`: always read stdin to end of file; `0`: never read it; unset: the rule above.
pub const STDIN_ENV: &str = "BEIGE_TOOL_STDIN";
/// Optional client-side limit, in seconds, on the whole call.
pub const TIMEOUT_ENV: &str = "BEIGE_TOOL_TIMEOUT";

/// How long a pipe or socket on stdin may take to become readable before it is
/// considered idle and left alone.
pub const PIPE_WAIT: Duration = Duration::from_millis(50);
/// Largest reply line read from the gateway.
const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;
/// How much of an unexpected reply is shown in an error message.
const SHOWN_BYTES: usize = 200;

/// Invalid invocation: non-UTF-8 argument or directory, stdin too large, bad setting.
pub const EXIT_USAGE: i32 = 2;
/// `BEIGE_TOOL_TIMEOUT` expired before the reply arrived.
pub const EXIT_TIMEOUT: i32 = 124;
/// The gateway's socket cannot be connected to.
pub const EXIT_UNREACHABLE: i32 = 125;
/// The connection broke or the reply was not a tool response.
pub const EXIT_PROTOCOL: i32 = 126;

/// The flags whose value is a file read in the sandbox and sent as the request's stdin:
/// `(tool, flag)` (platform.md §4). Only the first word of the tool's name counts, so
/// `spawn` and `schedule` here; the flag may be given as `--flag PATH` or `--flag=PATH`,
/// once, before any `--`.
pub const FILE_FLAGS: &[(&str, &str)] =
    &[("spawn", "--message-file"), ("schedule", "--prompt-file")];

/// Session variables and the `sessionContext` fields they fill.
const SESSION_KEY_ENV: &str = "BEIGE_SESSION_KEY";
const CHANNEL_ENV: &str = "BEIGE_CHANNEL";
const AGENT_NAME_ENV: &str = "BEIGE_AGENT_NAME";
const CHAT_ID_ENV: &str = "BEIGE_CHAT_ID";
const THREAD_ID_ENV: &str = "BEIGE_THREAD_ID";

/// The tool client's section of the shim's help text.
pub const USAGE: &str = concat!(
    "tool client (`beige-shim tool <tool> [args…]`, or the shim run under the tool's name,\n",
    "e.g. /tools/bin/kv -> /beige/shim; every argument, `--help` included, goes to the tool):\n",
    "  Sends one request to $BEIGE_SOCKET (default /beige/run/gateway.sock), prints the\n",
    "  tool's output on stdout (errors on stderr) and exits with the tool's exit code.\n",
    "  stdin: a terminal, /dev/null or another character device is never read; a regular\n",
    "  file is read; a pipe or socket is read to end of file only if it is readable within\n",
    "  50 ms (so `echo x | kv set k` forwards x, while an idle inherited pipe is ignored).\n",
    "  At most 8 MiB. BEIGE_TOOL_STDIN=1 always reads stdin (slow producers),\n",
    "  BEIGE_TOOL_STDIN=0 never does. In a `while read` loop, call tools with `< /dev/null`.\n",
    "  BEIGE_TOOL_TIMEOUT=<seconds> limits the wait for the reply (default: none).\n",
    "  spawn --message-file PATH, schedule … --prompt-file PATH: the file is read here, in\n",
    "  the sandbox (~/ is $HOME), and sent as stdin; the flag is not forwarded.\n",
    "  Own exit codes: 2 invalid invocation, 124 timeout, 125 gateway unreachable,\n",
    "  126 protocol error.",
);

/// Why the call ended before the tool's own result: exit code and message.
#[derive(Debug)]
struct Failure {
    code: i32,
    message: String,
}

impl Failure {
    fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Runs the tool client for `tool` with `args`; returns the process exit code.
pub fn run(tool: &OsStr, args: &[OsString]) -> i32 {
    let shown = tool.to_string_lossy();
    let Some(tool) = tool.to_str() else {
        write_stderr(&format!(
            "{shown}: the tool name is not valid UTF-8; beige tools have UTF-8 names.\n"
        ));
        return EXIT_USAGE;
    };
    match call(tool, args) {
        Ok(code) => code,
        Err(failure) => {
            write_stderr(&format!("{tool}: {}\n", failure.message));
            failure.code
        }
    }
}

/// Builds the request, exchanges it with the gateway and writes the result.
fn call(tool: &str, args: &[OsString]) -> Result<i32, Failure> {
    let timeout = timeout_from_env()?;
    let (args, file) = take_file_flag(tool, utf8_args(args)?)?;
    let stdin = match file {
        Some(path) => Some(read_flag_file(tool, &path)?),
        None => read_stdin()?,
    };
    let mut request = ToolRequest::new(tool, args);
    request.session_context = session_context(env_string);
    request.cwd = current_relative_dir()?;
    request.stdin = stdin.map(|data| base64::engine::general_purpose::STANDARD.encode(data));

    let socket = std::env::var_os(SOCKET_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from);
    let deadline = timeout.map(|t| (Instant::now() + t, t));
    let reply = exchange(&socket, &request, deadline)?;
    let response = parse_reply(&reply).map_err(|m| Failure::new(EXIT_PROTOCOL, m))?;
    Ok(write_result(tool, &response))
}

/// The arguments as UTF-8, or a usage failure naming the first one that is not.
fn utf8_args(args: &[OsString]) -> Result<Vec<String>, Failure> {
    args.iter()
        .enumerate()
        .map(|(i, a)| {
            a.to_str().map(str::to_owned).ok_or_else(|| {
                Failure::new(
                    EXIT_USAGE,
                    format!(
                        "argument {} ({:?}) is not valid UTF-8; the beige gateway accepts only \
                         UTF-8 arguments.",
                        i + 1,
                        a.to_string_lossy()
                    ),
                )
            })
        })
        .collect()
}

/// A [`FILE_FLAGS`] flag as given: the flag and the path after it.
type FlagFile = (&'static str, String);

/// `args` without the tool's file flag ([`FILE_FLAGS`]) and its value, and that value
/// (`(flag, path)`), if the flag was given.
fn take_file_flag(
    tool: &str,
    args: Vec<String>,
) -> Result<(Vec<String>, Option<FlagFile>), Failure> {
    let Some(&(_, flag)) = FILE_FLAGS.iter().find(|(t, _)| *t == tool) else {
        return Ok((args, None));
    };
    let mut kept = Vec::with_capacity(args.len());
    let mut found: Option<String> = None;
    let mut rest = args.into_iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            kept.push(arg);
            kept.extend(rest.by_ref());
            break;
        }
        let value = if arg == flag {
            Some(rest.next().ok_or_else(|| {
                Failure::new(EXIT_USAGE, format!("{flag} needs a path after it."))
            })?)
        } else {
            arg.strip_prefix(flag)
                .and_then(|v| v.strip_prefix('='))
                .map(str::to_owned)
        };
        match value {
            Some(_) if found.is_some() => {
                return Err(Failure::new(
                    EXIT_USAGE,
                    format!("{flag} is given twice; give one file."),
                ))
            }
            Some(v) if v.is_empty() => {
                return Err(Failure::new(
                    EXIT_USAGE,
                    format!("{flag} needs a path after it."),
                ))
            }
            Some(v) => found = Some(v),
            None => kept.push(arg),
        }
    }
    Ok((kept, found.map(|path| (flag, path))))
}

/// `path` with a leading `~/` (or a lone `~`) taken as `home`.
fn expand_home(path: &str, home: Option<&OsStr>) -> PathBuf {
    match (path.strip_prefix('~'), home) {
        (Some(""), Some(home)) => PathBuf::from(home),
        (Some(rest), Some(home)) if rest.starts_with('/') => {
            Path::new(home).join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(path),
    }
}

/// Read the file a [`FILE_FLAGS`] flag names, here in the sandbox: a regular file of at
/// most [`MAX_STDIN_BYTES`]. Opened without blocking, so a FIFO cannot hang the call.
fn read_flag_file(tool: &str, (flag, path): &FlagFile) -> Result<Vec<u8>, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    let full = expand_home(path, home.as_deref());
    let fail = |why: String| {
        Failure::new(
            EXIT_USAGE,
            format!(
                "cannot read {flag} {path} ({}): {why}; the file is read inside the sandbox, \
                 and nothing was sent to {tool}.",
                full.display()
            ),
        )
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&full)
        .map_err(|err| fail(err.to_string()))?;
    let meta = file.metadata().map_err(|err| fail(err.to_string()))?;
    if !meta.is_file() {
        return Err(fail("it is not a regular file".into()));
    }
    let limit = u64::try_from(MAX_STDIN_BYTES).unwrap_or(u64::MAX);
    let mut data = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|err| fail(err.to_string()))?;
    if data.len() > MAX_STDIN_BYTES {
        return Err(fail(format!(
            "it is larger than {} MiB, the most a tool call may carry",
            MAX_STDIN_BYTES / (1024 * 1024)
        )));
    }
    Ok(data)
}

/// A variable's value when it is set, non-empty and UTF-8.
fn env_string(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The session context from the `BEIGE_*` variables: present when the session key or
/// the exec id (`BEIGE_EXEC_ID`, a label the gateway checks against the exec it finds
/// for this process) is set, with only the fields that are set.
fn session_context(lookup: impl Fn(&str) -> Option<String>) -> Option<SessionContext> {
    let session_key = lookup(SESSION_KEY_ENV);
    let exec_id = lookup(EXEC_ID_ENV);
    if session_key.is_none() && exec_id.is_none() {
        return None;
    }
    Some(SessionContext {
        session_key,
        channel: lookup(CHANNEL_ENV),
        agent_name: lookup(AGENT_NAME_ENV),
        chat_id: lookup(CHAT_ID_ENV),
        thread_id: lookup(THREAD_ID_ENV),
        exec_id,
    })
}

/// The process's directory relative to the workspace (`BEIGE_WORKSPACE`, default
/// `/workspace`); `None` at the workspace root, outside it or when unknown.
fn current_relative_dir() -> Result<Option<String>, Failure> {
    let Ok(cwd) = std::env::current_dir() else {
        return Ok(None);
    };
    let workspace = std::env::var_os(WORKSPACE_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_WORKSPACE), PathBuf::from);
    let canonical = std::fs::canonicalize(&workspace).ok();
    let rel =
        relative_dir(&cwd, &workspace).or_else(|| canonical.and_then(|w| relative_dir(&cwd, &w)));
    match rel {
        None => Ok(None),
        Some(rel) => match rel.to_str() {
            Some(s) => Ok(Some(s.to_owned())),
            None => Err(Failure::new(
                EXIT_USAGE,
                format!(
                    "the current directory {:?} is not valid UTF-8, so it cannot be sent to the \
                     beige gateway; run the tool from another directory.",
                    cwd.to_string_lossy()
                ),
            )),
        },
    }
}

/// `cwd` relative to `workspace` when it lies strictly beneath it.
fn relative_dir(cwd: &Path, workspace: &Path) -> Option<PathBuf> {
    let rel = cwd.strip_prefix(workspace).ok()?;
    (!rel.as_os_str().is_empty()).then(|| rel.to_path_buf())
}

/// What the stdin rule says to do with the process's stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StdinMode {
    /// The rule of the module documentation.
    Auto,
    /// `BEIGE_TOOL_STDIN=1`.
    Always,
    /// `BEIGE_TOOL_STDIN=0`.
    Never,
}

/// Applies the stdin rule; returns the data to forward, if any.
fn read_stdin() -> Result<Option<Vec<u8>>, Failure> {
    let mode = match std::env::var_os(STDIN_ENV).as_deref().map(OsStr::to_str) {
        None | Some(Some("")) => StdinMode::Auto,
        Some(Some("1")) => StdinMode::Always,
        Some(Some("0")) => StdinMode::Never,
        Some(other) => {
            return Err(Failure::new(
                EXIT_USAGE,
                format!(
                    "{STDIN_ENV} must be 1 (always forward stdin) or 0 (never); got {:?}.",
                    other.unwrap_or("<not UTF-8>")
                ),
            ))
        }
    };
    let stdin = io::stdin();
    let forward = match mode {
        StdinMode::Never => false,
        StdinMode::Always => true,
        StdinMode::Auto => {
            // A closed fd 0 cannot be duplicated: nothing to forward.
            let Ok(fd) = stdin.as_fd().try_clone_to_owned() else {
                return Ok(None);
            };
            let Ok(meta) = File::from(fd).metadata() else {
                return Ok(None);
            };
            let kind = meta.file_type();
            if kind.is_file() {
                true
            } else if kind.is_fifo() || kind.is_socket() {
                sys::wait_readable(stdin.as_fd(), PIPE_WAIT).unwrap_or(false)
            } else {
                // Terminals, /dev/null and other character devices, block devices,
                // directories: never read.
                false
            }
        }
    };
    if !forward {
        return Ok(None);
    }
    let limit = u64::try_from(MAX_STDIN_BYTES).unwrap_or(u64::MAX);
    let mut data = Vec::new();
    stdin
        .lock()
        .take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|err| Failure::new(EXIT_USAGE, format!("cannot read stdin: {err}")))?;
    if data.len() > MAX_STDIN_BYTES {
        return Err(Failure::new(
            EXIT_USAGE,
            format!(
                "stdin is larger than {} bytes ({} MiB), the most a tool call may carry; \
                 write the data to a file in the workspace and pass its path instead.",
                MAX_STDIN_BYTES,
                MAX_STDIN_BYTES / (1024 * 1024)
            ),
        ));
    }
    Ok((!data.is_empty()).then_some(data))
}

/// `BEIGE_TOOL_TIMEOUT` in seconds (decimals allowed); unset, empty or 0 means none.
fn timeout_from_env() -> Result<Option<Duration>, Failure> {
    let Some(raw) = std::env::var_os(TIMEOUT_ENV).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    parse_timeout(&raw.to_string_lossy()).ok_or_else(|| {
        Failure::new(
            EXIT_USAGE,
            format!(
                "{TIMEOUT_ENV} must be a number of seconds (0 for none); got {:?}.",
                raw.to_string_lossy()
            ),
        )
    })
}

fn parse_timeout(raw: &str) -> Option<Option<Duration>> {
    let secs: f64 = raw.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    if secs == 0.0 {
        return Some(None);
    }
    Duration::try_from_secs_f64(secs).ok().map(Some)
}

/// Connects, sends the request line and returns the reply line (without the newline).
/// `deadline` is the instant the call times out and the configured limit (for messages).
fn exchange(
    socket: &Path,
    request: &ToolRequest,
    deadline: Option<(Instant, Duration)>,
) -> Result<Vec<u8>, Failure> {
    let mut stream = UnixStream::connect(socket).map_err(|err| {
        Failure::new(
            EXIT_UNREACHABLE,
            format!(
                "cannot reach the beige gateway at {}: {err}. The gateway may be restarting; \
                 try again in a moment.",
                socket.display()
            ),
        )
    })?;
    let mut line = serde_json::to_vec(request)
        .map_err(|err| Failure::new(EXIT_PROTOCOL, format!("cannot encode the request: {err}")))?;
    line.push(b'\n');
    match send(&mut stream, &line, deadline) {
        Ok(()) => receive(&mut stream, deadline),
        Err(failure) if failure.code == EXIT_TIMEOUT => Err(failure),
        // Even when sending failed, the gateway may have answered before closing (for
        // example a request it refused as too large): prefer its reply.
        Err(failure) => receive(&mut stream, deadline).map_err(|_| failure),
    }
}

/// The failure for an expired `BEIGE_TOOL_TIMEOUT`.
fn timed_out(limit: Duration) -> Failure {
    Failure::new(
        EXIT_TIMEOUT,
        format!(
            "no reply from the beige gateway within {} s ({TIMEOUT_ENV}); the call may still be \
             running there.",
            limit.as_secs_f64()
        ),
    )
}

fn is_timeout(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Time left before the deadline, or the timeout failure once it has passed.
fn remaining(deadline: Option<(Instant, Duration)>) -> Result<Option<Duration>, Failure> {
    match deadline {
        None => Ok(None),
        Some((at, limit)) => {
            let left = at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                Err(timed_out(limit))
            } else {
                Ok(Some(left))
            }
        }
    }
}

fn send(
    stream: &mut UnixStream,
    mut data: &[u8],
    deadline: Option<(Instant, Duration)>,
) -> Result<(), Failure> {
    let broken = |err: io::Error| {
        Failure::new(
            EXIT_PROTOCOL,
            format!("the beige gateway closed the connection while the request was being sent ({err}) and did not reply."),
        )
    };
    while !data.is_empty() {
        let left = remaining(deadline)?;
        stream.set_write_timeout(left).map_err(broken)?;
        match stream.write(data) {
            Ok(0) => return Err(broken(io::ErrorKind::WriteZero.into())),
            Ok(n) => data = data.get(n..).unwrap_or_default(),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if is_timeout(&err) && deadline.is_some() => {
                remaining(deadline)?;
            }
            Err(err) => return Err(broken(err)),
        }
    }
    Ok(())
}

/// Reads up to the first non-blank line (or end of file), bounded by [`MAX_REPLY_BYTES`].
fn receive(
    stream: &mut UnixStream,
    deadline: Option<(Instant, Duration)>,
) -> Result<Vec<u8>, Failure> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut start = 0; // start of the current line
    let mut scanned = 0; // bytes already searched for a newline
    loop {
        while let Some(pos) = buf
            .get(scanned..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
        {
            let end = scanned + pos;
            let line = buf.get(start..end).unwrap_or_default();
            if !line.trim_ascii().is_empty() {
                return Ok(line.to_vec());
            }
            start = end + 1;
            scanned = start;
        }
        scanned = buf.len();
        if buf.len() - start > MAX_REPLY_BYTES {
            return Err(Failure::new(
                EXIT_PROTOCOL,
                format!(
                    "the beige gateway's reply exceeds {} MiB without a line end; received: {}",
                    MAX_REPLY_BYTES / (1024 * 1024),
                    shown(buf.get(start..).unwrap_or_default())
                ),
            ));
        }
        let left = remaining(deadline)?;
        stream.set_read_timeout(left).map_err(|err| {
            Failure::new(EXIT_PROTOCOL, format!("cannot wait for the reply: {err}"))
        })?;
        match stream.read(&mut chunk) {
            Ok(0) => {
                let rest = buf.get(start..).unwrap_or_default();
                if rest.trim_ascii().is_empty() {
                    return Err(Failure::new(
                        EXIT_PROTOCOL,
                        "the beige gateway closed the connection without replying.",
                    ));
                }
                return Ok(rest.to_vec());
            }
            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if is_timeout(&err) && deadline.is_some() => {
                remaining(deadline)?;
            }
            Err(err) if err.kind() == io::ErrorKind::ConnectionReset => {
                return Err(Failure::new(
                    EXIT_PROTOCOL,
                    "the beige gateway closed the connection without replying (connection \
                     reset).",
                ))
            }
            Err(err) => {
                return Err(Failure::new(
                    EXIT_PROTOCOL,
                    format!("reading the beige gateway's reply failed: {err}"),
                ))
            }
        }
    }
}

/// At most [`SHOWN_BYTES`] of `bytes`, printable, for error messages.
fn shown(bytes: &[u8]) -> String {
    let cut = bytes.get(..SHOWN_BYTES).unwrap_or(bytes);
    let text = String::from_utf8_lossy(cut);
    let mut out: String = format!("\"{}\"", text.escape_debug());
    if bytes.len() > SHOWN_BYTES {
        out.push_str(&format!(" … ({} bytes in all)", bytes.len()));
    }
    out
}

/// Decodes a reply line into a [`ToolResponse`]; a missing `exitCode` becomes 0 (and
/// then 1 for a failure, see [`exit_code`]).
fn parse_reply(line: &[u8]) -> Result<ToolResponse, String> {
    let not_a_response = |why: &str| {
        format!(
            "the beige gateway's reply is not a tool response ({why}); received: {}",
            shown(line)
        )
    };
    let mut value: serde_json::Value = serde_json::from_slice(line)
        .map_err(|err| not_a_response(&format!("invalid JSON: {err}")))?;
    let Some(object) = value.as_object_mut() else {
        return Err(not_a_response("not a JSON object"));
    };
    match object.get("type").and_then(serde_json::Value::as_str) {
        Some(TOOL_RESPONSE) => {}
        Some(other) => return Err(not_a_response(&format!("type {other:?}"))),
        None => return Err(not_a_response("no type")),
    }
    if object
        .get("exitCode")
        .is_none_or(serde_json::Value::is_null)
    {
        object.insert("exitCode".to_owned(), serde_json::Value::from(0));
    }
    serde_json::from_value(value).map_err(|err| not_a_response(&err.to_string()))
}

/// The process exit code for a response: the tool's code, 1 for a failure that claims
/// 0, and 1 for codes a process cannot exit with (outside 0–255).
fn exit_code(response: &ToolResponse) -> i32 {
    match response.exit_code {
        0 if !response.success => 1,
        code @ 0..=255 => code,
        _ => 1,
    }
}

/// Writes the response's output or error and returns the exit code.
fn write_result(tool: &str, response: &ToolResponse) -> i32 {
    let code = exit_code(response);
    if response.success {
        let output = response.output.as_deref().unwrap_or_default();
        if output.is_empty() {
            return code;
        }
        let mut stdout = io::stdout().lock();
        match stdout
            .write_all(output.as_bytes())
            .and_then(|()| stdout.flush())
        {
            Ok(()) => code,
            // The reader went away (`kv list | head -1`): not an error of ours.
            Err(err) if err.kind() == io::ErrorKind::BrokenPipe => code,
            Err(err) => {
                write_stderr(&format!("{tool}: cannot write the output: {err}\n"));
                if code == 0 {
                    1
                } else {
                    code
                }
            }
        }
    } else {
        let message = response
            .error
            .as_deref()
            .filter(|e| !e.is_empty())
            .or(response.output.as_deref())
            .unwrap_or_default();
        if !message.is_empty() {
            if message.ends_with('\n') {
                write_stderr(message);
            } else {
                write_stderr(&format!("{message}\n"));
            }
        }
        code
    }
}

/// Writes to stderr, ignoring failures (nobody is left to tell).
fn write_stderr(text: &str) {
    let mut stderr = io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_context_needs_the_key_or_exec_id_and_keeps_only_set_fields() {
        assert_eq!(session_context(|_| None), None);
        let only_channel = |n: &str| (n == CHANNEL_ENV).then(|| "telegram".to_owned());
        assert_eq!(session_context(only_channel), None);
        let some = |n: &str| match n {
            SESSION_KEY_ENV => Some("telegram:42".to_owned()),
            CHAT_ID_ENV => Some("42".to_owned()),
            _ => None,
        };
        let ctx = session_context(some).unwrap();
        assert_eq!(
            serde_json::to_string(&ctx).unwrap(),
            r#"{"sessionKey":"telegram:42","chatId":"42"}"#
        );
        let exec_only = |n: &str| (n == EXEC_ID_ENV).then(|| "x1f".to_owned());
        assert_eq!(
            serde_json::to_string(&session_context(exec_only).unwrap()).unwrap(),
            r#"{"execId":"x1f"}"#
        );
    }

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn file_flags_are_taken_out_of_the_arguments() {
        let take = |tool: &str, a: &[&str]| take_file_flag(tool, strings(a));
        let (args, file) = take("spawn", &["--target", "r", "--message-file", "~/m.txt"]).unwrap();
        assert_eq!(args, strings(&["--target", "r"]));
        assert_eq!(file, Some(("--message-file", "~/m.txt".to_string())));
        let (args, file) = take(
            "schedule",
            &["add", "--prompt-file=p.md", "--cron", "0 8 * * *"],
        )
        .unwrap();
        assert_eq!(args, strings(&["add", "--cron", "0 8 * * *"]));
        assert_eq!(file, Some(("--prompt-file", "p.md".to_string())));
        // Other tools, other flags and words after `--` are left alone.
        let (args, file) = take("kv", &["set", "--message-file", "x"]).unwrap();
        assert_eq!((args.len(), file), (3, None));
        let (args, file) = take("spawn", &["--prompt-file", "x"]).unwrap();
        assert_eq!((args.len(), file), (2, None));
        let (args, file) = take("spawn", &["--", "--message-file", "x"]).unwrap();
        assert_eq!((args.len(), file), (3, None));
        for bad in [
            &["--message-file"][..],
            &["--message-file="],
            &["--message-file", "a", "--message-file=b"],
        ] {
            let err = take("spawn", bad).unwrap_err();
            assert_eq!(err.code, EXIT_USAGE, "{bad:?}");
            assert!(err.message.contains("--message-file"), "{}", err.message);
        }
    }

    #[test]
    fn flag_files_are_read_here_or_the_call_fails() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().as_os_str();
        assert_eq!(
            expand_home("~/.beige/config.json5", Some(home)),
            dir.path().join(".beige/config.json5")
        );
        assert_eq!(expand_home("~", Some(home)), dir.path());
        assert_eq!(
            expand_home("~other/x", Some(home)),
            PathBuf::from("~other/x")
        );
        assert_eq!(expand_home("~/x", None), PathBuf::from("~/x"));

        let file = dir.path().join("m.txt");
        std::fs::write(&file, "hello from the sandbox\n").unwrap();
        let flag = |p: &Path| ("--message-file", p.to_str().unwrap().to_string());
        assert_eq!(
            read_flag_file("spawn", &flag(&file)).unwrap(),
            b"hello from the sandbox\n"
        );
        let missing = read_flag_file("spawn", &flag(&dir.path().join("nope"))).unwrap_err();
        assert_eq!(missing.code, EXIT_USAGE);
        assert!(
            missing.message.contains("cannot read --message-file"),
            "{}",
            missing.message
        );
        assert!(
            missing.message.contains("nothing was sent to spawn"),
            "{}",
            missing.message
        );
        let not_file = read_flag_file("spawn", &flag(dir.path())).unwrap_err();
        assert!(
            not_file.message.contains("not a regular file"),
            "{}",
            not_file.message
        );
        // A FIFO with no writer fails at once instead of hanging.
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let err = read_flag_file("spawn", &flag(&fifo)).unwrap_err();
        assert!(
            err.message.contains("not a regular file"),
            "{}",
            err.message
        );
    }

    #[test]
    fn relative_dir_only_strictly_beneath() {
        let ws = Path::new("/workspace");
        assert_eq!(relative_dir(Path::new("/workspace"), ws), None);
        assert_eq!(relative_dir(Path::new("/workspace2/x"), ws), None);
        assert_eq!(relative_dir(Path::new("/tmp"), ws), None);
        assert_eq!(
            relative_dir(Path::new("/workspace/projects/x"), ws),
            Some(PathBuf::from("projects/x"))
        );
    }

    #[test]
    fn timeouts_parse() {
        assert_eq!(parse_timeout("0"), Some(None));
        assert_eq!(parse_timeout("2"), Some(Some(Duration::from_secs(2))));
        assert_eq!(
            parse_timeout(" 0.5 "),
            Some(Some(Duration::from_millis(500)))
        );
        assert_eq!(parse_timeout("-1"), None);
        assert_eq!(parse_timeout("inf"), None);
        assert_eq!(parse_timeout("NaN"), None);
        assert_eq!(parse_timeout("soon"), None);
    }

    #[test]
    fn replies_parse_and_map_to_exit_codes() {
        let ok = parse_reply(br#"{"type":"tool_response","success":true,"output":"v"}"#).unwrap();
        assert_eq!(exit_code(&ok), 0);
        let failed =
            parse_reply(br#"{"type":"tool_response","success":false,"error":"x"}"#).unwrap();
        assert_eq!(exit_code(&failed), 1);
        let zero =
            parse_reply(br#"{"type":"tool_response","success":false,"exitCode":0}"#).unwrap();
        assert_eq!(exit_code(&zero), 1);
        let three =
            parse_reply(br#"{"type":"tool_response","success":false,"exitCode":3}"#).unwrap();
        assert_eq!(exit_code(&three), 3);
        let huge =
            parse_reply(br#"{"type":"tool_response","success":false,"exitCode":256}"#).unwrap();
        assert_eq!(exit_code(&huge), 1);
        let negative =
            parse_reply(br#"{"type":"tool_response","success":true,"exitCode":-1}"#).unwrap();
        assert_eq!(exit_code(&negative), 1);

        let err = parse_reply(br#"{"type":"tool_request"}"#).unwrap_err();
        assert!(err.contains("tool_request"), "{err}");
        let err = parse_reply(b"[1]").unwrap_err();
        assert!(err.contains("not a JSON object"), "{err}");
        let err = parse_reply(br#"{"type":"tool_response"}"#).unwrap_err();
        assert!(err.contains("success"), "{err}");
    }

    #[test]
    fn shown_is_bounded_and_printable() {
        let long = vec![b'a'; 1000];
        let text = shown(&long);
        assert!(text.len() < 260, "{text}");
        assert!(text.contains("1000 bytes"));
        assert_eq!(shown(b"a\nb\x1b"), r#""a\nb\u{1b}""#);
    }
}
