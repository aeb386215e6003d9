//! The socket wire protocol between a sandbox and the gateway: newline-delimited JSON
//! over the agent's Unix socket (`/beige/run/gateway.sock` inside the container).
//!
//! Compatible with the TypeScript original: its tool client's request lines parse here
//! and its client understands our responses. Additions are optional fields (`stdin`).

use serde::{Deserialize, Deserializer, Serialize};

/// The `type` of a request.
pub const TOOL_REQUEST: &str = "tool_request";
/// The `type` of a response.
pub const TOOL_RESPONSE: &str = "tool_response";

/// The exit code of a call refused because a budget is exhausted
/// (`budgets.exec.toolCalls`), as `sysexits.h`'s `EX_NOPERM`.
pub const EXIT_BUDGET_EXHAUSTED: i32 = 77;

/// Largest request line the gateway reads (1 MiB).
pub const MAX_REQUEST_LINE: usize = 1024 * 1024;
/// Largest stdin a request may carry after base64 decoding (8 MiB).
pub const MAX_STDIN_BYTES: usize = 8 * 1024 * 1024;
/// Largest output returned; longer output is truncated with a note (8 MiB).
pub const MAX_RESPONSE_OUTPUT: usize = 8 * 1024 * 1024;

/// `{"type":"tool_request","tool":"kv","args":["get","user:7"],"cwd":"projects/x",
///   "sessionContext":{…},"stdin":"<base64>"}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolRequest {
    #[serde(rename = "type")]
    pub kind: String,
    pub tool: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Relative to `/workspace`; validated by the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Advisory. When the gateway attributes the calling process to an exec (see
    /// `docs/socket-protocol.md`, "Who is calling"), the exec's session is used and this
    /// is ignored, except that an `execId` naming another exec is refused. Otherwise
    /// only `sessionKey` is used, and only if that session exists and belongs to the
    /// calling agent; its channel, chat and thread come from the gateway's record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_context: Option<SessionContext>,
    /// Base64 of the data piped into the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
}

impl ToolRequest {
    pub fn new(tool: impl Into<String>, args: Vec<String>) -> Self {
        Self {
            kind: TOOL_REQUEST.to_string(),
            tool: tool.into(),
            args,
            cwd: None,
            session_context: None,
            stdin: None,
        }
    }
}

/// What the calling process knows about its session (from `BEIGE_*` variables).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionContext {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub session_key: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub channel: Option<String>,
    /// Ignored by the gateway: identity comes from the socket.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub agent_name: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub chat_id: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub thread_id: Option<String>,
    /// The `BEIGE_EXEC_ID` the calling process has in its environment: a label, never
    /// proof. A value that differs from the exec the kernel attributes the caller to is
    /// refused (`exec_id_mismatch`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub exec_id: Option<String>,
}

/// Accept strings, numbers and null (chat ids are numbers in some clients).
fn lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s),
        other => Some(other.to_string()),
    })
}

/// `{"type":"tool_response","success":true,"output":"…","exitCode":0}`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResponse {
    #[serde(rename = "type")]
    pub kind: String,
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub exit_code: i32,
}

impl ToolResponse {
    /// A tool's result: `success` iff the exit code is 0; on failure the output is also
    /// the `error` (so the original's client prints it), as the original did.
    pub fn from_result(output: String, exit_code: i32) -> Self {
        let success = exit_code == 0;
        Self {
            kind: TOOL_RESPONSE.to_string(),
            success,
            error: if success { None } else { Some(output.clone()) },
            output: Some(output),
            exit_code,
        }
    }

    /// A failure before or around the tool (denied, invalid request, timeout).
    pub fn error(message: impl Into<String>, exit_code: i32) -> Self {
        Self {
            kind: TOOL_RESPONSE.to_string(),
            success: false,
            output: None,
            error: Some(message.into()),
            exit_code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn original_client_request_parses() {
        // Exactly what the TypeScript tool client writes.
        let line = r#"{"type":"tool_request","tool":"kv","args":["get","user:7"],"sessionContext":{"sessionKey":"telegram:42","channel":"telegram","agentName":"assistant","chatId":42},"cwd":"projects/x"}"#;
        let r: ToolRequest = serde_json::from_str(line).unwrap();
        assert_eq!(r.tool, "kv");
        assert_eq!(r.args, vec!["get", "user:7"]);
        let ctx = r.session_context.unwrap();
        assert_eq!(ctx.chat_id.as_deref(), Some("42"));
        assert_eq!(r.cwd.as_deref(), Some("projects/x"));
        assert_eq!(r.stdin, None);
        assert_eq!(ctx.exec_id, None);
        let with_id: SessionContext = serde_json::from_str(r#"{"execId":"x12"}"#).unwrap();
        assert_eq!(with_id.exec_id.as_deref(), Some("x12"));
        assert_eq!(
            serde_json::to_string(&with_id).unwrap(),
            r#"{"execId":"x12"}"#
        );
    }

    #[test]
    fn response_shapes() {
        let ok = serde_json::to_string(&ToolResponse::from_result("v\n".into(), 0)).unwrap();
        assert_eq!(
            ok,
            r#"{"type":"tool_response","success":true,"output":"v\n","exitCode":0}"#
        );
        let denied = serde_json::to_string(&ToolResponse::error("Permission denied", 1)).unwrap();
        assert_eq!(
            denied,
            r#"{"type":"tool_response","success":false,"error":"Permission denied","exitCode":1}"#
        );
        let failed = ToolResponse::from_result("nope".into(), 2);
        assert_eq!(failed.error.as_deref(), Some("nope"));
        assert!(!failed.success);
    }
}
