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
/// Where an `exec` whose output outgrew its cap keeps all of it, relative to the
/// workspace: one file per exec, [`exec_output_file`].
pub const EXEC_OUTPUT_DIR: &str = ".beige/out";
/// Most bytes kept in one exec's output file (64 MiB); a command that writes more has
/// the first ones kept and [`OutputFile::truncated`] set.
pub const EXEC_OUTPUT_FILE_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Output files kept in [`EXEC_OUTPUT_DIR`]: making a new one removes the oldest beyond
/// this many.
pub const EXEC_OUTPUT_FILES_KEPT: usize = 16;

/// The output file of exec `exec_id`, relative to the workspace
/// (`.beige/out/<exec id>.log`). The gateway names it from its own exec id, never from
/// anything the sandbox wrote.
pub fn exec_output_file(exec_id: &str) -> String {
    format!("{EXEC_OUTPUT_DIR}/{exec_id}.log")
}

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
    /// The gateway reads the raw reply form ([`encode_reply`]): large output may follow
    /// the reply's JSON line as raw bytes instead of JSON strings. A shim that does not
    /// know the field ignores it and replies in plain JSON, which is always accepted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub raw_output: bool,
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
    /// Set when output was dropped by the cap and the request had an `execId`: all of
    /// it (stdout and stderr as they came, up to [`EXEC_OUTPUT_FILE_MAX_BYTES`]) is in
    /// the workspace at [`exec_output_file`]. Absent when nothing was dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<OutputFile>,
}

/// What became of an exec's output file ([`ExecReply::output_file`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputFile {
    /// Bytes in the file.
    pub bytes: u64,
    /// The command wrote more than [`EXEC_OUTPUT_FILE_MAX_BYTES`]; the file holds the
    /// first ones.
    #[serde(default)]
    pub truncated: bool,
    /// Why the file could not be written (or was cut short), when it could not; the
    /// capped output in the reply is complete as always.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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

/// Exec output from this size on (stdout and stderr together) is sent in the raw
/// reply form when the request allows it; smaller replies stay plain JSON.
pub const RAW_OUTPUT_MIN: usize = 64 * 1024;

/// The field of a raw reply's JSON line that gives the byte lengths of the stdout and
/// stderr that follow it.
const RAW_FIELD: &str = "raw";

/// Encodes a reply as the op contract's payload: one line of compact JSON ending in
/// `\n`.
///
/// With `raw`, an exec reply whose output is at least [`RAW_OUTPUT_MIN`] bytes is sent
/// in the *raw form*: the JSON line carries empty `stdout` and `stderr` and a field
/// `"raw": [stdout bytes, stderr bytes]`, and the two texts follow the line as they are
/// (UTF-8, no escaping). Megabytes of output then cost a copy instead of a JSON escape
/// on one side and an unescape on the other. [`decode_reply`] reads both forms.
pub fn encode_reply(reply: OpReply, raw: bool) -> Vec<u8> {
    let mut line = match reply {
        OpReply::Exec(mut e) if raw && e.stdout.len() + e.stderr.len() >= RAW_OUTPUT_MIN => {
            let out = std::mem::take(&mut e.stdout);
            let err = std::mem::take(&mut e.stderr);
            let mut line = match serde_json::to_value(OpReply::Exec(e)) {
                Ok(serde_json::Value::Object(mut map)) => {
                    map.insert(RAW_FIELD.into(), serde_json::json!([out.len(), err.len()]));
                    serde_json::to_vec(&map).unwrap_or_default()
                }
                _ => Vec::new(),
            };
            line.push(b'\n');
            line.reserve_exact(out.len() + err.len());
            line.extend_from_slice(out.as_bytes());
            line.extend_from_slice(err.as_bytes());
            return line;
        }
        other => {
            // Sized for the text it carries (plus room for escapes), so a large reply
            // is not copied again and again as the buffer doubles.
            let carried = match &other {
                OpReply::Exec(e) => e.stdout.len() + e.stderr.len(),
                OpReply::Read(ReadReply::Text { content, .. }) => content.len(),
                _ => 0,
            };
            let mut line = Vec::with_capacity(carried + carried / 8 + 1024);
            // A reply is plain data (strings, numbers, lists): it always serialises.
            let _ = serde_json::to_writer(&mut line, &other);
            line
        }
    };
    line.push(b'\n');
    line
}

/// Longest JSON line looked at for the raw form's lengths: a raw reply's line carries
/// no output, so it is short; a longer line is plain JSON.
const RAW_HEAD_MAX: usize = 64 * 1024;

/// The `[stdout, stderr]` lengths of a reply line in the raw form.
fn raw_lengths(head: &[u8]) -> Option<[u64; 2]> {
    if head.len() > RAW_HEAD_MAX {
        return None;
    }
    serde_json::from_slice::<RawMark>(head).ok()?.raw
}

/// Why a reply payload could not be decoded.
#[derive(Debug)]
pub enum ReplyError {
    /// The JSON line is not a reply.
    Json(serde_json::Error),
    /// The raw bytes after the line do not match the lengths it gives.
    RawLength { expected: u64, found: u64 },
    /// A raw text is not UTF-8.
    RawUtf8,
}

impl std::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplyError::Json(e) => write!(f, "{e}"),
            ReplyError::RawLength { expected, found } => write!(
                f,
                "the reply's raw output is {found} bytes where its header says {expected}"
            ),
            ReplyError::RawUtf8 => write!(f, "the reply's raw output is not UTF-8"),
        }
    }
}

impl std::error::Error for ReplyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplyError::Json(e) => Some(e),
            _ => None,
        }
    }
}

/// The `raw` lengths of a reply's JSON line, if it has them.
#[derive(Deserialize)]
struct RawMark {
    #[serde(default)]
    raw: Option<[u64; 2]>,
}

/// Where a reply's first line ends (the index of its `\n`), searching from `from`.
fn line_end(payload: &[u8], from: usize) -> Option<usize> {
    payload
        .get(from..)?
        .iter()
        .position(|&b| b == b'\n')
        .map(|i| from + i)
}

/// Decodes a reply payload in either form ([`encode_reply`]). Takes the payload by
/// value so large raw output becomes the reply's text without another copy.
pub fn decode_reply(mut payload: Vec<u8>) -> Result<OpReply, ReplyError> {
    let Some(end) = line_end(&payload, 0) else {
        return serde_json::from_slice(&payload).map_err(ReplyError::Json);
    };
    let head = &payload[..end];
    let mut reply: OpReply = serde_json::from_slice(head).map_err(ReplyError::Json)?;
    let (Some([out_len, err_len]), OpReply::Exec(e)) = (raw_lengths(head), &mut reply) else {
        // Plain JSON: nothing but white space may follow the line.
        if payload[end..].iter().all(u8::is_ascii_whitespace) {
            return Ok(reply);
        }
        return serde_json::from_slice(&payload).map_err(ReplyError::Json);
    };
    let found = (payload.len() - end - 1) as u64;
    let expected = out_len.saturating_add(err_len);
    if found != expected {
        return Err(ReplyError::RawLength { expected, found });
    }
    let split = end + 1 + usize::try_from(out_len).unwrap_or(usize::MAX);
    let err = payload.split_off(split);
    payload.drain(..=end);
    e.stdout = String::from_utf8(payload).map_err(|_| ReplyError::RawUtf8)?;
    e.stderr = String::from_utf8(err).map_err(|_| ReplyError::RawUtf8)?;
    Ok(reply)
}

/// How far a reply being read is: PID 1 reads an op's reply until it is complete,
/// without waiting for the op process to close its end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplyProgress {
    /// Bytes already searched for the end of the first line.
    scanned: usize,
    /// The whole reply's length, once the first line is in.
    total: Option<usize>,
}

impl ReplyProgress {
    /// Whether `payload` (everything read so far) is a whole reply: its JSON line
    /// ended, and, in the raw form, every byte the line announces followed it. Each
    /// call looks only at what is new since the last one.
    pub fn complete(&mut self, payload: &[u8]) -> bool {
        if self.total.is_none() {
            let Some(end) = line_end(payload, self.scanned) else {
                self.scanned = payload.len();
                return false;
            };
            let raw = raw_lengths(&payload[..end]);
            let extra = raw.map_or(0, |[out, err]| out.saturating_add(err));
            self.total = Some(
                (end as u64 + 1)
                    .saturating_add(extra)
                    .try_into()
                    .unwrap_or(usize::MAX),
            );
        }
        self.total.is_some_and(|total| payload.len() >= total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec_reply(stdout: String, stderr: &str) -> OpReply {
        OpReply::Exec(ExecReply {
            exit_code: Some(0),
            signal: None,
            stdout,
            stderr: stderr.into(),
            stdout_omitted: 0,
            stderr_omitted: 0,
            timed_out: false,
            duration_ms: 3,
            survivors: Vec::new(),
            output_file: None,
        })
    }

    #[test]
    fn large_exec_output_goes_raw_and_comes_back_the_same() {
        let big: String = (0..RAW_OUTPUT_MIN)
            .map(|i| ["a\n", "\"é\\"][i % 2])
            .collect();
        let reply = exec_reply(big.clone(), "warn\n\u{0}");
        let payload = encode_reply(reply.clone(), true);
        let line = payload.iter().position(|&b| b == b'\n').unwrap();
        let head = std::str::from_utf8(&payload[..line]).unwrap();
        assert!(head.contains(r#""stdout":"""#), "{head}");
        assert!(
            head.contains(&format!(r#""raw":[{},6]"#, big.len())),
            "{head}"
        );
        assert_eq!(&payload[line + 1..line + 1 + big.len()], big.as_bytes());
        assert_eq!(decode_reply(payload).unwrap(), reply);
        // Without the request's consent, or for small output, plain JSON.
        let plain = encode_reply(reply.clone(), false);
        assert_eq!(plain.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(decode_reply(plain).unwrap(), reply);
        let small = exec_reply("hi\n".into(), "");
        let payload = encode_reply(small.clone(), true);
        assert!(!String::from_utf8_lossy(&payload).contains("\"raw\""));
        assert_eq!(decode_reply(payload).unwrap(), small);
    }

    #[test]
    fn a_raw_reply_is_complete_only_when_every_announced_byte_is_in() {
        let big: String = "line\n".repeat(RAW_OUTPUT_MIN);
        let payload = encode_reply(exec_reply(big, "e\n"), true);
        let line = payload.iter().position(|&b| b == b'\n').unwrap();
        let mut progress = ReplyProgress::default();
        // Read in pieces; many end in a newline of the output, none is complete early.
        let mut upto = 0;
        while upto < payload.len() {
            assert!(!progress.complete(&payload[..upto]), "complete at {upto}");
            upto = (upto + 4099).min(payload.len());
        }
        assert!(progress.complete(&payload));
        assert!(line < 200);
        // Cut short: decoding says so instead of returning a shorter text.
        let cut = payload[..payload.len() - 1].to_vec();
        let e = decode_reply(cut).unwrap_err();
        assert!(matches!(e, ReplyError::RawLength { .. }), "{e}");
        // A plain reply is complete at its newline.
        let plain = encode_reply(exec_reply("x".into(), ""), true);
        let mut progress = ReplyProgress::default();
        assert!(!progress.complete(&plain[..plain.len() - 1]));
        assert!(progress.complete(&plain));
    }

    #[test]
    fn bad_raw_replies_are_refused() {
        let mut payload = encode_reply(exec_reply("é".repeat(RAW_OUTPUT_MIN), ""), true);
        let last = payload.len() - 1;
        payload[last] = 0xff;
        assert!(matches!(decode_reply(payload), Err(ReplyError::RawUtf8)));
        let mut plain = encode_reply(exec_reply("x".into(), ""), false);
        plain.extend_from_slice(b"trailing");
        assert!(matches!(decode_reply(plain), Err(ReplyError::Json(_))));
    }

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
