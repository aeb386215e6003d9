//! The `spawn` operation: a long-lived process in the sandbox whose stdin and stdout
//! are a connection of their own to the gateway (design: `spec/mcp.md` §1.2). It is how
//! an MCP server configured for an agent runs inside the agent's sandbox, never on the
//! host.
//!
//! The gateway sends a [`LinkMessage::Op`](crate::link::LinkMessage::Op) named
//! [`SPAWN_OP`] whose payload is a [`SpawnRequest`]. PID 1 dials the control socket
//! (so the connection's `SO_PEERCRED` is PID 1's, like an egress stream's) and forks a
//! child that becomes [`SpawnRequest::user`]; that child says hello on the new
//! connection ([`Role::Spawn`](crate::link::Role::Spawn), then
//! [`LinkMessage::SpawnOpen`](crate::link::LinkMessage::SpawnOpen) with the op id and
//! the request's one-time [`SpawnRequest::token`]) and starts the command with the
//! connection as its stdin and stdout. From then on the connection is the process's raw
//! byte stream. The child stays to collect the command's stderr (the last
//! [`STDERR_TAIL`] bytes) and, when the command ends, replies to the op with a
//! [`SpawnExit`]: the op's `Result` is the process's end.
//!
//! The token is what binds a connection to the op: it travels only over the
//! authenticated control link and in PID 1's memory, never in the command's
//! environment, so no process of the agent can present it.

use serde::{Deserialize, Serialize};

/// The op name of a spawn.
pub const SPAWN_OP: &str = "spawn";
/// The uid an MCP server runs as by default (`sandbox.mcpUser`), in the agent's group:
/// not the agent's, so agent code can neither signal, trace nor read its environment.
pub const DEFAULT_SPAWN_UID: u32 = 61000;
/// Bytes of the command's stderr kept for [`SpawnExit::stderr_tail`].
pub const STDERR_TAIL: usize = 64 * 1024;
/// Length of a [`SpawnRequest::token`] in hex digits (128 random bits).
pub const TOKEN_HEX_LEN: usize = 32;

/// Who the spawned command runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnUser {
    /// The agent's own user (gives up the protection of a separate uid).
    Agent,
    /// This uid, with the agent's group. Never 0.
    Uid(u32),
}

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpawnRequest {
    /// The program and its arguments (the program is looked up on the sandbox's `PATH`).
    pub argv: Vec<String>,
    /// Environment variables beyond `PATH` and `HOME`, in order.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory (absolute, in the sandbox); `/workspace` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Who it runs as.
    pub user: SpawnUser,
    /// The one-time token the spawned connection presents ([`TOKEN_HEX_LEN`] hex
    /// digits).
    pub token: String,
}

/// How a spawned process ended: the payload of the spawn op's `Result`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpawnExit {
    /// The exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The last [`STDERR_TAIL`] bytes it wrote to stderr (lossy UTF-8).
    #[serde(default)]
    pub stderr_tail: String,
    /// Why it could not be started (then nothing ran), or what failed around it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Whether `token` has the shape of a spawn token.
pub fn is_valid_token(token: &str) -> bool {
    token.len() == TOKEN_HEX_LEN && token.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_exit_round_trip() {
        let request = SpawnRequest {
            argv: vec!["testsrv".into(), "--stdio".into()],
            env: vec![("A".into(), "1".into())],
            cwd: None,
            user: SpawnUser::Uid(DEFAULT_SPAWN_UID),
            token: "0".repeat(TOKEN_HEX_LEN),
        };
        let json = serde_json::to_string(&request).unwrap();
        assert!(json.contains(r#""user":{"uid":61000}"#), "{json}");
        assert_eq!(
            serde_json::from_str::<SpawnRequest>(&json).unwrap(),
            request
        );
        let agent = serde_json::to_string(&SpawnUser::Agent).unwrap();
        assert_eq!(agent, r#""agent""#);
        let exit = SpawnExit {
            exit_code: Some(3),
            stderr_tail: "boom".into(),
            ..SpawnExit::default()
        };
        let json = serde_json::to_string(&exit).unwrap();
        assert_eq!(serde_json::from_str::<SpawnExit>(&json).unwrap(), exit);
    }

    #[test]
    fn tokens_are_checked() {
        assert!(!is_valid_token(""));
        assert!(is_valid_token(&"a".repeat(TOKEN_HEX_LEN)));
        assert!(!is_valid_token(&"g".repeat(TOKEN_HEX_LEN)));
        assert!(!is_valid_token(&"a".repeat(TOKEN_HEX_LEN - 1)));
    }
}
