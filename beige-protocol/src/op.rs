//! Core-tool operations run inside the container by `beige-shim op <name>`.
//!
//! The gateway writes one [`OpRequest`] as JSON to the shim's stdin and reads one
//! [`OpReply`] as JSON from its stdout. The transport (`docker exec` today, a persistent
//! link later) does not change these payloads. Field names are camelCase on the wire.
//!
//! The shim does the file-system and process work and reports *facts* (bytes, counts,
//! exit codes); the gateway turns them into the texts the model reads, except for error
//! messages, which the shim writes in full because only it can see the cause.

use serde::{Deserialize, Serialize};

/// Default cap for text returned by `read` (256 KiB).
pub const DEFAULT_READ_MAX_BYTES: u64 = 256 * 1024;
/// Default cap for image data returned by `read` (5 MiB before base64).
pub const DEFAULT_IMAGE_MAX_BYTES: u64 = 5 * 1024 * 1024;
/// Default cap for `exec` output, stdout and stderr together (64 KiB).
pub const DEFAULT_EXEC_MAX_OUTPUT_BYTES: u64 = 64 * 1024;
/// Seconds between SIGTERM and SIGKILL when an `exec` times out or is killed by `kill`.
pub const EXEC_KILL_GRACE_SECS: u64 = 5;
/// Environment variable that carries [`ExecRequest::exec_id`] into every process of the
/// command, so `kill` can find them.
pub const EXEC_ID_ENV: &str = "BEIGE_EXEC_ID";
/// Longest accepted exec id, in bytes.
pub const MAX_EXEC_ID_LEN: usize = 64;

/// Whether `id` is acceptable as an exec id: 1 to [`MAX_EXEC_ID_LEN`] characters of
/// `[A-Za-z0-9_-]`. The shim refuses other ids with `bad_request`.
pub fn is_valid_exec_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_EXEC_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One operation request. Serialized with an `op` tag: `{"op":"read","path":…}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OpRequest {
    Read(ReadRequest),
    Write(WriteRequest),
    Patch(PatchRequest),
    Exec(ExecRequest),
    Kill(KillRequest),
}

impl OpRequest {
    /// The operation's name as used on the shim's command line (`beige-shim op <name>`).
    pub fn name(&self) -> &'static str {
        match self {
            OpRequest::Read(_) => "read",
            OpRequest::Write(_) => "write",
            OpRequest::Patch(_) => "patch",
            OpRequest::Exec(_) => "exec",
            OpRequest::Kill(_) => "kill",
        }
    }
}

/// `read {path, offset?, limit?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadRequest {
    /// Relative to `/workspace`, or absolute inside the container.
    pub path: String,
    /// 1-based first line; `0` or absent means from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Number of lines; absent means to the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Cap on returned text in bytes.
    #[serde(default = "default_read_max")]
    pub max_bytes: u64,
    /// When the path has an image extension, return its bytes as an image.
    /// When false the shim still recognises images and answers [`ReadReply::Image`]
    /// without data so the gateway can explain why it cannot show it.
    #[serde(default)]
    pub images: bool,
    /// Cap on image size in bytes.
    #[serde(default = "default_image_max")]
    pub max_image_bytes: u64,
}

fn default_read_max() -> u64 {
    DEFAULT_READ_MAX_BYTES
}
fn default_image_max() -> u64 {
    DEFAULT_IMAGE_MAX_BYTES
}
fn default_exec_max() -> u64 {
    DEFAULT_EXEC_MAX_OUTPUT_BYTES
}

/// `write {path, content}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteRequest {
    pub path: String,
    /// Written exactly (its UTF-8 bytes), through a temporary file and a rename.
    pub content: String,
}

/// `patch {path, oldText, newText}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchRequest {
    pub path: String,
    pub old_text: String,
    pub new_text: String,
}

/// `exec {command, timeout?}` — `sh -c <command>` in its own process group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecRequest {
    pub command: String,
    /// Seconds before the process group is killed.
    pub timeout_secs: u64,
    /// Extra environment for the command (`BEIGE_AGENT_NAME`, …), added to the
    /// container's own environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory; `/workspace` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Cap on stdout + stderr kept; head and tail are kept, the middle dropped.
    #[serde(default = "default_exec_max")]
    pub max_output_bytes: u64,
    /// Opaque id chosen by the gateway (see [`is_valid_exec_id`]). When present, every
    /// process of the command gets `BEIGE_EXEC_ID=<id>` in its environment, and a later
    /// [`OpRequest::Kill`] with the same id ends them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_id: Option<String>,
}

/// `kill {execId}` — ends the processes of a running `exec` started with that id:
/// SIGTERM to their process groups, SIGKILL after [`EXEC_KILL_GRACE_SECS`] to whatever
/// is left. Runs as a separate `beige-shim op kill` next to the `op exec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KillRequest {
    pub exec_id: String,
}

/// One reply, tagged with `result`: `{"result":"exec","exitCode":0,…}` or
/// `{"result":"error","kind":"not_found","message":…}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum OpReply {
    Read(ReadReply),
    Write(WriteReply),
    Patch(PatchReply),
    Exec(ExecReply),
    Kill(KillReply),
    Error(OpError),
}

/// What `read` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReadReply {
    /// UTF-8 text, possibly cut to a line range and to `max_bytes`.
    #[serde(rename_all = "camelCase")]
    Text {
        content: String,
        /// Total number of lines in the file.
        total_lines: u64,
        /// First line returned (1-based).
        first_line: u64,
        /// Last line returned (1-based, inclusive); 0 when nothing was returned.
        last_line: u64,
        /// True when the byte cap cut the selected range short.
        truncated: bool,
    },
    /// An image (by extension). `data` is base64 and present only when requested.
    #[serde(rename_all = "camelCase")]
    Image {
        mime_type: String,
        bytes: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<String>,
    },
    /// Not valid UTF-8 and not an image.
    #[serde(rename_all = "camelCase")]
    Binary { bytes: u64 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteReply {
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchReply {
    /// Size of the file after patching.
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecReply {
    /// Exit status; `None` when the process was killed by a signal.
    pub exit_code: Option<i32>,
    /// The signal that ended the process, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Captured stdout (lossy UTF-8), capped: see `stdout_omitted`.
    pub stdout: String,
    pub stderr: String,
    /// Bytes dropped from the middle of stdout by the cap.
    #[serde(default)]
    pub stdout_omitted: u64,
    #[serde(default)]
    pub stderr_omitted: u64,
    /// The timeout fired and the process group was killed.
    #[serde(default)]
    pub timed_out: bool,
    pub duration_ms: u64,
    /// Processes started during the command that escaped its process group (`setsid`,
    /// double fork) and were still running when it ended. Found by scanning `/proc`:
    /// without cgroup delegation this is a best effort (see `docs/sandbox.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survivors: Vec<Survivor>,
}

/// A process that outlived the `exec` that started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Survivor {
    pub pid: u32,
    /// Its command line, space-joined and cut to 200 bytes.
    pub command: String,
}

/// What `kill` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KillReply {
    /// Number of process groups signalled; 0 when no process carried the id (the
    /// `exec` had already ended, or never started).
    pub found: u32,
}

/// A failed operation. `message` is the complete text for the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpError {
    pub kind: OpErrorKind,
    pub message: String,
}

/// What kind of error an operation reported ([`OpError::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OpErrorKind {
    /// The path does not exist.
    NotFound,
    /// The path is a directory where a file was expected.
    IsDirectory,
    /// The sandbox user may not access the path.
    PermissionDenied,
    /// `patch`: `oldText` not found.
    NoMatch,
    /// `patch`: `oldText` found more than once.
    AmbiguousMatch,
    /// Image larger than allowed.
    TooLarge,
    /// `exec`: `/bin/sh` missing or not runnable.
    NoShell,
    /// The request itself was malformed.
    BadRequest,
    /// Any other I/O error.
    Io,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wire_shape() {
        let r = OpRequest::Patch(PatchRequest {
            path: "a b".into(),
            old_text: "x".into(),
            new_text: "y".into(),
        });
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(
            s,
            r#"{"op":"patch","path":"a b","oldText":"x","newText":"y"}"#
        );
        let back: OpRequest = serde_json::from_str(&s).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn reply_wire_shape() {
        let r = OpReply::Error(OpError {
            kind: OpErrorKind::NotFound,
            message: "File not found: x".into(),
        });
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(
            s,
            r#"{"result":"error","kind":"not_found","message":"File not found: x"}"#
        );
        let exec: OpReply = serde_json::from_str(
            r#"{"result":"exec","exitCode":3,"stdout":"a","stderr":"","durationMs":1}"#,
        )
        .unwrap();
        match exec {
            OpReply::Exec(e) => {
                assert_eq!(e.exit_code, Some(3));
                assert!(!e.timed_out);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn kill_and_exec_id_wire_shape() {
        let r = OpRequest::Kill(KillRequest {
            exec_id: "call_1-a".into(),
        });
        assert_eq!(r.name(), "kill");
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"op":"kill","execId":"call_1-a"}"#);
        assert_eq!(serde_json::from_str::<OpRequest>(&s).unwrap(), r);

        let reply = OpReply::Kill(KillReply { found: 2 });
        let s = serde_json::to_string(&reply).unwrap();
        assert_eq!(s, r#"{"result":"kill","found":2}"#);
        assert_eq!(serde_json::from_str::<OpReply>(&s).unwrap(), reply);

        // Old exec requests still parse, and no id means no `execId` on the wire.
        let old = r#"{"op":"exec","command":"ls","timeoutSecs":5}"#;
        let OpRequest::Exec(mut e) = serde_json::from_str::<OpRequest>(old).unwrap() else {
            panic!("not an exec");
        };
        assert_eq!(e.exec_id, None);
        assert!(!serde_json::to_string(&e).unwrap().contains("execId"));
        e.exec_id = Some("x".into());
        let s = serde_json::to_string(&OpRequest::Exec(e.clone())).unwrap();
        assert!(s.ends_with(r#","execId":"x"}"#), "{s}");
        assert_eq!(
            serde_json::from_str::<OpRequest>(&s).unwrap(),
            OpRequest::Exec(e)
        );
    }

    #[test]
    fn exec_id_rules() {
        assert!(is_valid_exec_id("t1"));
        assert!(is_valid_exec_id("Call_9-x"));
        assert!(is_valid_exec_id(&"a".repeat(MAX_EXEC_ID_LEN)));
        assert!(!is_valid_exec_id(""));
        assert!(!is_valid_exec_id(&"a".repeat(MAX_EXEC_ID_LEN + 1)));
        for bad in ["a b", "a=b", "a\0b", "é", "a/b", "a.b"] {
            assert!(!is_valid_exec_id(bad), "{bad:?}");
        }
    }
}
