//! PID 1's `spawn` op: a long-lived process (an MCP server) whose stdin and stdout are a
//! connection of their own to the gateway (protocol: [`beige_protocol::spawn`]).
//!
//! [`start`] runs in PID 1: it checks the request, dials the control socket (so the
//! connection's `SO_PEERCRED` names PID 1, the only peer the gateway accepts) and forks
//! a child with [`sys::fork_agent_child`] under the request's user — by default a uid of
//! its own in the agent's group, so agent code can neither signal, trace nor read the
//! environment of the process — with the connection as descriptor 0 and the op's reply
//! pipe as descriptor 1. PID 1 then treats the child like any op child: its reply is
//! the op's result.
//!
//! The child ([`child_main`]) answers the gateway's hello on the connection with
//! `role: spawn` and `SpawnOpen` (the op id and its one-time token), starts the command
//! with the connection as its stdin and stdout and a pipe as its stderr, lets go of the
//! connection (so the gateway sees end-of-file when the command ends), keeps the last
//! [`STDERR_TAIL`] bytes of stderr, and when the command has ended writes a
//! [`SpawnExit`] line as the op's reply.

use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use beige_protocol::link::{encode, Carrier, FrameDecoder, LinkMessage, Role};
use beige_protocol::spawn::{is_valid_token, SpawnExit, SpawnRequest, SpawnUser, STDERR_TAIL};

use crate::privdrop::{AgentUser, PrivDrop};
use crate::sys;

/// How long the child waits for the gateway's hello on the new connection.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A spawn forked by [`start`]: the child's pid and the read end of its reply pipe.
#[derive(Debug)]
pub struct Started {
    pub pid: u32,
    pub reply: OwnedFd,
}

/// Why a spawn could not be started; its text is the op's `SpawnExit::error`.
#[derive(Debug)]
pub struct Refusal(pub String);

/// The op's reply for a spawn that never started.
pub fn refusal_reply(message: String) -> Vec<u8> {
    exit_line(&SpawnExit {
        error: Some(message),
        ..SpawnExit::default()
    })
}

fn exit_line(exit: &SpawnExit) -> Vec<u8> {
    let mut line = serde_json::to_vec(exit).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    line
}

/// Starts the spawn `id` (in PID 1): `ctl` is the control socket's path (`None` on the
/// attach carrier, which has no per-stream connections), `plan` the agent's privilege
/// drop, `workdir` the op children's working directory.
pub fn start(
    id: &str,
    request: &[u8],
    ctl: Option<&std::path::Path>,
    plan: &PrivDrop,
    workdir: &CStr,
    boot_id: &str,
) -> Result<Started, Refusal> {
    let request: SpawnRequest = serde_json::from_slice(request)
        .map_err(|e| Refusal(format!("The spawn request is not valid: {e}.")))?;
    if request.argv.first().is_none_or(|p| p.is_empty()) {
        return Err(Refusal("The spawn request names no program.".into()));
    }
    if !is_valid_token(&request.token) {
        return Err(Refusal("The spawn request's token is malformed.".into()));
    }
    let plan = match request.user {
        SpawnUser::Agent => plan.clone(),
        SpawnUser::Uid(0) => {
            return Err(Refusal(
                "A spawned process may not run as root (uid 0).".into(),
            ))
        }
        SpawnUser::Uid(uid) => plan.with_user(AgentUser {
            uid,
            gid: plan.user().gid,
        }),
    };
    let Some(ctl) = ctl else {
        return Err(Refusal(
            "Processes of their own (MCP servers) need the unix link carrier; this \
             sandbox's link runs over attach. Set sandbox.linkMode to \"unix\"."
                .into(),
        ));
    };
    let conn = UnixStream::connect(ctl).map_err(|e| {
        Refusal(format!(
            "Cannot dial the gateway at {} for the process: {e}.",
            ctl.display()
        ))
    })?;
    let conn = OwnedFd::from(conn);
    let (reply_read, reply_write) =
        sys::pipe().map_err(|e| Refusal(format!("Cannot make a pipe: {e}.")))?;
    let forked = sys::fork_agent_child(&plan, workdir, &reply_write, None, Some(&conn))
        .map_err(|e| Refusal(format!("Cannot fork the process: {e}.")))?;
    match forked {
        sys::Forked::Child(setup) => {
            // Descriptors 0 (the connection) and 1 (the reply pipe) are all this child
            // has; PID 1's handles name closed descriptors here: forgotten, never closed.
            for fd in [conn, reply_read, reply_write] {
                std::mem::forget(fd);
            }
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let exit = match setup {
                    Ok(_) => child_main(id, &request, boot_id),
                    Err(failure) => SpawnExit {
                        error: Some(format!("Cannot become the process's user: {failure}")),
                        ..SpawnExit::default()
                    },
                };
                let _ = io::stdout().write_all(&exit_line(&exit));
                let _ = io::stdout().flush();
                0
            }))
            .unwrap_or(1);
            sys::exit_now(code)
        }
        sys::Forked::Parent(pid) => {
            drop(reply_write);
            drop(conn);
            sys::set_nonblocking(std::os::fd::AsFd::as_fd(&reply_read))
                .map_err(|e| Refusal(format!("Cannot set up the reply pipe: {e}.")))?;
            Ok(Started {
                pid,
                reply: reply_read,
            })
        }
    }
}

/// The child: greet the gateway on descriptor 0, start the command on it, collect its
/// stderr and report its end.
fn child_main(id: &str, request: &SpawnRequest, boot_id: &str) -> SpawnExit {
    // Descriptor 0 is the connection fork_agent_child put there; PID 1's handle on it
    // was forgotten in this child.
    let conn = UnixStream::from(sys::take_descriptor_0());
    if let Err(e) = greet(&conn, id, &request.token, boot_id) {
        return SpawnExit {
            error: Some(format!(
                "The gateway did not take the process's connection: {e}"
            )),
            ..SpawnExit::default()
        };
    }
    let (stdin, stdout) = match (conn.try_clone(), conn.try_clone()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            return SpawnExit {
                error: Some(format!("Cannot hand the connection to the process: {e}")),
                ..SpawnExit::default()
            }
        }
    };
    let mut command = Command::new(&request.argv[0]);
    command
        .args(&request.argv[1..])
        .envs(request.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::from(OwnedFd::from(stdin)))
        .stdout(Stdio::from(OwnedFd::from(stdout)))
        .stderr(Stdio::piped());
    if let Some(cwd) = &request.cwd {
        command.current_dir(cwd);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return SpawnExit {
                error: Some(format!("Cannot start {}: {e}", request.argv[0])),
                ..SpawnExit::default()
            }
        }
    };
    // Only the command holds the connection now: its end is the stream's end.
    drop(command);
    drop(conn);
    let mut tail = Tail::default();
    if let Some(mut stderr) = child.stderr.take() {
        let mut buf = [0u8; 8192];
        loop {
            match stderr.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => tail.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
    let status = loop {
        match child.wait() {
            Ok(status) => break Some(status),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break None,
        }
    };
    use std::os::unix::process::ExitStatusExt;
    SpawnExit {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        stderr_tail: String::from_utf8_lossy(&tail.bytes()).into_owned(),
        error: None,
    }
}

/// Waits for the gateway's hello on `conn`, then says who this connection is.
fn greet(mut conn: &UnixStream, id: &str, token: &str, boot_id: &str) -> io::Result<()> {
    conn.set_read_timeout(Some(HELLO_TIMEOUT))?;
    let mut decoder = FrameDecoder::new();
    let mut buf = [0u8; 4096];
    let first = loop {
        if let Some(frame) = decoder
            .next_frame()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
        {
            break frame.message;
        }
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the gateway closed the connection",
            ));
        }
        decoder.push(&buf[..n]);
    };
    match first {
        LinkMessage::GatewayHello { .. } => {}
        LinkMessage::Refused { reason } => {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, reason))
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected the gateway's hello, got {other:?}"),
            ))
        }
    }
    conn.set_read_timeout(None)?;
    let mut out = encode(
        &LinkMessage::ShimHello {
            role: Role::Spawn,
            boot_id: boot_id.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            carrier: Carrier::Unix,
            pending: Vec::new(),
        },
        b"",
    );
    out.extend_from_slice(&encode(
        &LinkMessage::SpawnOpen {
            id: id.to_string(),
            token: token.to_string(),
        },
        b"",
    ));
    conn.write_all(&out)?;
    Ok(())
}

/// The last [`STDERR_TAIL`] bytes written to it.
#[derive(Debug, Default)]
struct Tail {
    buf: std::collections::VecDeque<u8>,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        let bytes = &bytes[bytes.len().saturating_sub(STDERR_TAIL)..];
        let over = (self.buf.len() + bytes.len()).saturating_sub(STDERR_TAIL);
        self.buf.drain(..over);
        self.buf.extend(bytes);
    }

    fn bytes(&self) -> Vec<u8> {
        self.buf.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_bytes() {
        let mut tail = Tail::default();
        tail.push(b"abc");
        assert_eq!(tail.bytes(), b"abc");
        tail.push(&vec![b'x'; STDERR_TAIL]);
        tail.push(b"end");
        let bytes = tail.bytes();
        assert_eq!(bytes.len(), STDERR_TAIL);
        assert!(bytes.ends_with(b"xend"));
        assert!(!bytes.starts_with(b"abc"));
    }

    #[test]
    fn a_bad_request_is_refused_before_anything_runs() {
        let plan = PrivDrop::prepare(AgentUser {
            uid: sys::effective_uid(),
            gid: 0,
        })
        .unwrap();
        let refuse = |json: &str, ctl: Option<&std::path::Path>| {
            start("s1", json.as_bytes(), ctl, &plan, c"/", "boot")
                .map(|_| ())
                .unwrap_err()
                .0
        };
        let token = "a".repeat(32);
        assert!(refuse("not json", None).contains("not valid"));
        let no_program = format!(r#"{{"argv":[],"user":"agent","token":"{token}"}}"#);
        assert!(refuse(&no_program, None).contains("no program"));
        let root = format!(r#"{{"argv":["x"],"user":{{"uid":0}},"token":"{token}"}}"#);
        assert!(refuse(&root, None).contains("root"));
        let bad_token = r#"{"argv":["x"],"user":"agent","token":"zz"}"#;
        assert!(refuse(bad_token, None).contains("token"));
        let attach = format!(r#"{{"argv":["x"],"user":"agent","token":"{token}"}}"#);
        assert!(refuse(&attach, None).contains("unix link carrier"));
        let missing = std::path::Path::new("/nonexistent/ctl.sock");
        assert!(refuse(&attach, Some(missing)).contains("Cannot dial"));
    }
}
