//! The shim link: frames exchanged between the gateway and the shim running as PID 1.
//!
//! One link per container carries every core-tool operation without `docker exec`. It
//! runs over a *carrier*: a Unix connection that PID 1 dials to `/beige/run/ctl.sock`
//! (authenticated by the gateway with `SO_PEERCRED`), or the container's own stdin and
//! stdout through the Engine API's attach endpoint. The frames are the same on both.
//!
//! A frame is `magic (4 bytes) | header length (u32 BE) | payload length (u32 BE) |
//! header (JSON) | payload (raw bytes)`. The header is a [`LinkMessage`]; the payload
//! carries op requests and replies as the exact JSON the `beige-shim op` contract uses
//! (see [`crate::op`]), so the shim forwards them without re-encoding.
//!
//! Conversation:
//!
//! 1. the gateway speaks first with [`LinkMessage::GatewayHello`] (on the attach carrier,
//!    output written while nobody listens is lost, so the shim never speaks unasked);
//! 2. the shim answers [`LinkMessage::ShimHello`] with its boot id, then re-sends every
//!    [`LinkMessage::Result`] the gateway has not acknowledged yet;
//! 3. the gateway sends [`LinkMessage::Op`]s (any number in flight, each with a unique
//!    id); the shim answers each with one [`LinkMessage::Result`] carrying the same id;
//!    the gateway acknowledges it with [`LinkMessage::Ack`], after which the shim forgets
//!    it. A result can therefore arrive twice (once before and once after a gateway
//!    restart); the gateway delivers it once, by id;
//! 4. while an `exec` runs, the shim may send [`LinkMessage::Output`] pieces of its
//!    output before the `Result` (progress for a live view; never acknowledged);
//! 5. either side may send [`LinkMessage::Ping`]; the other answers
//!    [`LinkMessage::Pong`] with the same number;
//! 6. when an `exec` op with an `execId` is handed to the process that runs it, the shim
//!    sends [`LinkMessage::ExecStarted`] (before any output and the `Result`): that
//!    process is the session leader of everything the command starts, which is how the
//!    gateway tells which exec a caller of `gateway.sock` belongs to. Not acknowledged
//!    and not replayed; a gateway that does not know the message ignores it.
//!
//! **Egress streams** (Unix carrier only, for now): PID 1 dials the control socket once
//! per outbound connection an agent process opens through its proxy. The gateway speaks
//! first as always ([`LinkMessage::GatewayHello`]); PID 1 answers
//! [`LinkMessage::ShimHello`] with `role: egress` and the boot id of its control
//! connection, then one [`LinkMessage::EgressOpen`] whose payload is every byte the
//! client has sent so far (at least its complete request head). From then on the
//! connection is a raw byte pipe between the client and the gateway, half-closable: the
//! gateway answers the client's request itself (`200 Connection established`, or a
//! `403` saying why not) and, when allowed, splices it to the upstream it dialled. The
//! gateway accepts an egress stream only from the peer that is PID 1 and only while a
//! control connection of the same boot id is up.
//!
//! **Spawn streams** (Unix carrier only): for a `spawn` op ([`crate::spawn`]) PID 1
//! dials the control socket, and the child it forks for the op answers the gateway's
//! hello with `role: spawn` and one [`LinkMessage::SpawnOpen`] naming the op and its
//! one-time token; the connection is then the spawned process's stdin and stdout. The
//! gateway accepts it only with a token it issued for a spawn still waiting, from PID 1
//! and while a control connection of the same boot id is up.

use serde::{Deserialize, Serialize};

/// File name of the control socket in an agent's run directory (`/beige/run` inside).
pub const CTL_SOCKET_NAME: &str = "ctl.sock";
/// Where PID 1 dials the control socket inside the container.
pub const CTL_SOCKET_PATH: &str = "/beige/run/ctl.sock";
/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"BGL1";
/// Bytes before the header: magic and the two lengths.
pub const PREFIX_LEN: usize = 12;
/// Largest header accepted.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Largest payload accepted (an 8 MiB `write` is about 11 MiB of JSON after escaping; a
/// reply is at most 16 MiB).
pub const MAX_PAYLOAD_BYTES: usize = 32 * 1024 * 1024;
/// Seconds between pings from the gateway; a link silent for three intervals is dead.
pub const PING_INTERVAL_SECS: u64 = 10;
/// Longest accepted op id, in bytes.
pub const MAX_ID_LEN: usize = 64;
/// Most output bytes of one `exec` sent as [`LinkMessage::Output`] progress.
pub const MAX_STREAMED_BYTES: usize = 256 * 1024;

/// Which carrier a link runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Carrier {
    /// PID 1 dialled `/beige/run/ctl.sock`.
    Unix,
    /// The container's stdin and stdout, through the engine's attach endpoint.
    Attach,
}

impl Carrier {
    pub fn as_str(self) -> &'static str {
        match self {
            Carrier::Unix => "unix",
            Carrier::Attach => "attach",
        }
    }
}

/// What a connection to the gateway is for. Both pass the same peer check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The one link that carries ops, results and keepalives.
    Control,
    /// One outbound connection of an agent process, opened with
    /// [`LinkMessage::EgressOpen`] and then a raw byte pipe.
    Egress,
    /// The stdin and stdout of a process started by a `spawn` op, opened with
    /// [`LinkMessage::SpawnOpen`] and then a raw byte pipe ([`crate::spawn`]).
    Spawn,
}

/// Where PID 1 took an egress stream in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressEntry {
    /// The explicit HTTP proxy on `127.0.0.1:`[`EGRESS_PROXY_PORT`] (`CONNECT` and
    /// absolute-form requests; what `HTTPS_PROXY` points at).
    Explicit,
    /// A transparent listener: the client dialled a synthetic address that PID 1's DNS
    /// stub handed out for `name`.
    Transparent,
}

impl EgressEntry {
    /// The name used in audit records and config (`explicit`, `transparent`).
    pub fn as_str(self) -> &'static str {
        match self {
            EgressEntry::Explicit => "explicit",
            EgressEntry::Transparent => "transparent",
        }
    }
}

/// The port of PID 1's explicit proxy on the container's loopback.
pub const EGRESS_PROXY_PORT: u16 = 3128;

/// Where PID 1 writes the egress CA (`beige-ca.pem`) and the merged bundle
/// (`bundle.pem`): a root-owned tmpfs.
pub const EGRESS_CA_DIR: &str = "/beige/ca";

/// The variables that point TLS clients at the egress CA, and the file each names in
/// [`EGRESS_CA_DIR`]: most take the merged bundle, Node and Deno the CA alone (they add
/// it to their own roots).
pub const EGRESS_CA_ENV: [(&str, &str); 8] = [
    ("CURL_CA_BUNDLE", "bundle.pem"),
    ("SSL_CERT_FILE", "bundle.pem"),
    ("GIT_SSL_CAINFO", "bundle.pem"),
    ("REQUESTS_CA_BUNDLE", "bundle.pem"),
    ("PIP_CERT", "bundle.pem"),
    ("CARGO_HTTP_CAINFO", "bundle.pem"),
    ("NODE_EXTRA_CA_CERTS", "beige-ca.pem"),
    ("DENO_CERT", "beige-ca.pem"),
];
/// Largest request head PID 1 reads before it gives up on a client (and the gateway
/// before it refuses one with `400`).
pub const MAX_EGRESS_HEAD: usize = 16 * 1024;
/// Seconds a client has to send its complete request head.
pub const EGRESS_HEAD_TIMEOUT_SECS: u64 = 10;

/// The header of a frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum LinkMessage {
    /// Gateway → shim, first frame of every session.
    GatewayHello {
        version: String,
    },
    /// Shim → gateway, the answer to [`LinkMessage::GatewayHello`].
    ShimHello {
        role: Role,
        /// Random per start of PID 1: a new value means a new container boot.
        boot_id: String,
        version: String,
        carrier: Carrier,
        /// Ids of ops still running or whose results are not yet acknowledged.
        #[serde(default)]
        pending: Vec<String>,
    },
    /// Gateway → shim: run one operation. Payload: the [`crate::op::OpRequest`] JSON.
    Op {
        id: String,
        name: String,
    },
    /// Shim → gateway: an operation's outcome. Payload: the [`crate::op::OpReply`] JSON.
    Result {
        id: String,
    },
    /// Shim → gateway, while an `exec` runs: the next piece of its output (payload: the
    /// raw bytes; `stream` 1 = stdout, 2 = stderr; `seq` counts from 0 per op). Progress
    /// only, best effort: at most [`MAX_STREAMED_BYTES`] per op, pieces may be skipped
    /// when the sandbox cannot keep up, and they are not replayed after a reconnect. The
    /// `Result` always carries the output (capped head and tail) in full.
    Output {
        id: String,
        stream: u8,
        seq: u64,
    },
    /// Shim → gateway: the `exec` op `id` (carrying `exec_id`) was handed to the
    /// process `pid` (in the container's pid namespace), which leads the session the
    /// command runs in; `starttime` is field 22 of its `/proc/<pid>/stat` (clock ticks
    /// after boot), so that a reused pid is never mistaken for it.
    ExecStarted {
        id: String,
        exec_id: String,
        pid: u32,
        starttime: u64,
    },
    /// Gateway → shim: the result `id` was received; the shim may forget it.
    Ack {
        id: String,
    },
    Ping {
        seq: u64,
    },
    Pong {
        seq: u64,
    },
    /// Sent before closing a connection that is not accepted.
    Refused {
        reason: String,
    },
    /// PID 1 → gateway, after its egress hello: a new outbound connection. Payload: the
    /// bytes the client sent so far, verbatim (its request head, perhaps more). `name`
    /// and `port` are what PID 1 read: the `CONNECT` or absolute-form target for the
    /// explicit entry, the name behind the synthetic address for a transparent one. The
    /// gateway parses the head itself and refuses a stream whose head disagrees.
    EgressOpen {
        entry: EgressEntry,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        port: u16,
    },
    /// The spawned child → gateway, after its spawn hello: this connection is the
    /// stdin and stdout of the process of the `spawn` op `id`, proven by the op's
    /// one-time `token` ([`crate::spawn::SpawnRequest::token`]). No payload.
    SpawnOpen {
        id: String,
        token: String,
    },
}

/// Whether `id` is acceptable as an op id: 1 to [`MAX_ID_LEN`] bytes of
/// `[A-Za-z0-9_-]`.
pub fn is_valid_id(id: &str) -> bool {
    crate::op::is_valid_exec_id(id) && id.len() <= MAX_ID_LEN
}

/// Why bytes are not a valid frame. Any of these ends the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// The stream does not start with the link's magic bytes.
    BadMagic,
    /// The header length prefix (this many bytes) exceeds [`MAX_HEADER_BYTES`].
    HeaderTooLarge(usize),
    /// The payload length prefix (this many bytes) exceeds [`MAX_PAYLOAD_BYTES`].
    PayloadTooLarge(usize),
    /// The header is not a valid link message (the JSON error).
    BadHeader(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::BadMagic => write!(f, "the stream is not a beige link (bad magic)"),
            FrameError::HeaderTooLarge(n) => {
                write!(f, "frame header of {n} bytes exceeds {MAX_HEADER_BYTES}")
            }
            FrameError::PayloadTooLarge(n) => {
                write!(f, "frame payload of {n} bytes exceeds {MAX_PAYLOAD_BYTES}")
            }
            FrameError::BadHeader(e) => write!(f, "unreadable frame header: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub message: LinkMessage,
    pub payload: Vec<u8>,
}

/// Encodes everything of a frame but its payload: magic, lengths and header, for a
/// writer that sends a large payload from where it is instead of copying it into one
/// buffer with [`encode`]. The bytes on the wire are the same.
pub fn encode_head(message: &LinkMessage, payload_len: usize) -> Vec<u8> {
    // Serializing a plain enum of strings and numbers cannot fail.
    let header = serde_json::to_vec(message).unwrap_or_default();
    let mut out = Vec::with_capacity(PREFIX_LEN + header.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(
        &u32::try_from(header.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(&u32::try_from(payload_len).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&header);
    out
}

/// Encodes one frame.
pub fn encode(message: &LinkMessage, payload: &[u8]) -> Vec<u8> {
    // Serializing a plain enum of strings and numbers cannot fail.
    let header = serde_json::to_vec(message).unwrap_or_default();
    let mut out = Vec::with_capacity(PREFIX_LEN + header.len() + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(
        &u32::try_from(header.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
    out
}

/// Reads the lengths from a frame prefix, checking magic and limits.
pub fn parse_prefix(prefix: &[u8; PREFIX_LEN]) -> Result<(usize, usize), FrameError> {
    if prefix[..4] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    let len = |b: &[u8]| -> usize {
        let mut a = [0u8; 4];
        a.copy_from_slice(b);
        u32::from_be_bytes(a) as usize
    };
    let header = len(&prefix[4..8]);
    let payload = len(&prefix[8..12]);
    if header > MAX_HEADER_BYTES {
        return Err(FrameError::HeaderTooLarge(header));
    }
    if payload > MAX_PAYLOAD_BYTES {
        return Err(FrameError::PayloadTooLarge(payload));
    }
    Ok((header, payload))
}

/// Decodes a header.
pub fn parse_header(header: &[u8]) -> Result<LinkMessage, FrameError> {
    serde_json::from_slice(header).map_err(|e| FrameError::BadHeader(e.to_string()))
}

/// Payloads from this size on are handed out in the decoder's own buffer rather than
/// copied out of it.
const LARGE_PAYLOAD: usize = 256 * 1024;

/// An incremental decoder: feed it bytes as they arrive, take frames out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The decoder's buffer, with room for at least `min` more bytes, for reading
    /// straight into (e.g. with tokio's `read_buf`) instead of into a scratch buffer
    /// and then [`FrameDecoder::push`]. Only append to it.
    pub fn read_target(&mut self, min: usize) -> &mut Vec<u8> {
        self.buf.reserve(min);
        &mut self.buf
    }

    /// Bytes received but not yet part of a returned frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The bytes pushed but not yet taken as frames (what follows the last frame on a
    /// connection that turns into a raw pipe, as an egress stream does).
    pub fn into_remaining(self) -> Vec<u8> {
        self.buf
    }

    /// The next complete frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < PREFIX_LEN {
            // A wrong magic is reported as soon as its bytes are here.
            let n = self.buf.len().min(4);
            if self.buf[..n] != MAGIC[..n] {
                return Err(FrameError::BadMagic);
            }
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX_LEN];
        prefix.copy_from_slice(&self.buf[..PREFIX_LEN]);
        let (header_len, payload_len) = parse_prefix(&prefix)?;
        let total = PREFIX_LEN + header_len + payload_len;
        if self.buf.len() < total {
            // Room for the whole frame at once, instead of doubling (and copying) its
            // way up to a large payload — once a quarter of it is here, so a peer
            // cannot make the decoder reserve more than four times what it sent.
            if self.buf.len() >= total / 4 {
                self.buf.reserve(total - self.buf.len());
            }
            return Ok(None);
        }
        let message = parse_header(&self.buf[PREFIX_LEN..PREFIX_LEN + header_len])?;
        let payload = if payload_len >= LARGE_PAYLOAD {
            // The frame's own buffer becomes the payload; only what follows it is
            // copied (usually nothing).
            let rest = self.buf.split_off(total);
            let mut frame = std::mem::replace(&mut self.buf, rest);
            frame.drain(..PREFIX_LEN + header_len);
            frame
        } else {
            let payload = self.buf[PREFIX_LEN + header_len..total].to_vec();
            self.buf.drain(..total);
            payload
        };
        Ok(Some(Frame { message, payload }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_in_any_split() {
        let a = encode(
            &LinkMessage::Op {
                id: "g1-1".into(),
                name: "exec".into(),
            },
            br#"{"op":"exec","command":"true"}"#,
        );
        let b = encode(&LinkMessage::Ping { seq: 7 }, b"");
        let mut all = a.clone();
        all.extend_from_slice(&b);
        for split in 0..all.len() {
            let mut d = FrameDecoder::new();
            d.push(&all[..split]);
            let mut frames = Vec::new();
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
            d.push(&all[split..]);
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
            assert_eq!(frames.len(), 2, "split at {split}");
            assert_eq!(frames[1].message, LinkMessage::Ping { seq: 7 });
            assert_eq!(frames[0].payload, br#"{"op":"exec","command":"true"}"#);
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn a_large_payload_comes_out_whole_with_what_follows_it() {
        let big: Vec<u8> = (0..LARGE_PAYLOAD * 3).map(|i| (i % 251) as u8).collect();
        let a = encode(&LinkMessage::Result { id: "r1".into() }, &big);
        let b = encode(&LinkMessage::Ping { seq: 9 }, b"");
        let mut all = a.clone();
        all.extend_from_slice(&b);
        for step in [1000, 65536, all.len()] {
            let mut d = FrameDecoder::new();
            let mut frames = Vec::new();
            for piece in all.chunks(step) {
                d.push(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    frames.push(f);
                }
            }
            assert_eq!(frames.len(), 2, "step {step}");
            assert_eq!(frames[0].message, LinkMessage::Result { id: "r1".into() });
            assert!(frames[0].payload == big, "step {step}");
            assert_eq!(frames[1].message, LinkMessage::Ping { seq: 9 });
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn garbage_and_oversize_are_refused() {
        let mut d = FrameDecoder::new();
        d.push(b"GET / HTTP/1.1\r\n");
        assert_eq!(d.next_frame(), Err(FrameError::BadMagic));
        let mut d = FrameDecoder::new();
        d.push(b"BX");
        assert_eq!(d.next_frame(), Err(FrameError::BadMagic));
        let mut big = MAGIC.to_vec();
        big.extend_from_slice(&(MAX_HEADER_BYTES as u32 + 1).to_be_bytes());
        big.extend_from_slice(&0u32.to_be_bytes());
        let mut d = FrameDecoder::new();
        d.push(&big);
        assert!(matches!(d.next_frame(), Err(FrameError::HeaderTooLarge(_))));
    }

    #[test]
    fn a_head_and_its_payload_are_the_frame() {
        let message = LinkMessage::Result { id: "r9".into() };
        let mut split = encode_head(&message, 5);
        split.extend_from_slice(b"hello");
        assert_eq!(split, encode(&message, b"hello"));
    }

    #[test]
    fn wire_shape_is_stable() {
        let hello = LinkMessage::ShimHello {
            role: Role::Control,
            boot_id: "b1".into(),
            version: "0.1.0".into(),
            carrier: Carrier::Unix,
            pending: vec!["g-1".into()],
        };
        assert_eq!(
            serde_json::to_string(&hello).unwrap(),
            r#"{"t":"shim_hello","role":"control","boot_id":"b1","version":"0.1.0","carrier":"unix","pending":["g-1"]}"#
        );
        let started = LinkMessage::ExecStarted {
            id: "g-2".into(),
            exec_id: "x1".into(),
            pid: 7,
            starttime: 123,
        };
        assert_eq!(
            serde_json::to_string(&started).unwrap(),
            r#"{"t":"exec_started","id":"g-2","exec_id":"x1","pid":7,"starttime":123}"#
        );
        assert!(is_valid_id("gA1-2_x"));
        assert!(!is_valid_id("a b"));
        assert!(!is_valid_id(""));
    }
}
