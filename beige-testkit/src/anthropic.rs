//! Anthropic Messages API streams for [`crate::llm::FakeLlmServer`]: [`MessageStream`]
//! writes the SSE byte stream exactly as Anthropic documents it (`message_start`,
//! `content_block_start/delta/stop`, `ping`, `message_delta`, `message_stop`, `error`),
//! with text and tool input split over several deltas; shortcuts cover the common
//! answers, and [`check_tool_pairing`] validates a recorded request the way the API does
//! (every `tool_use` answered by a `tool_result` in the next user message, results
//! first).

use serde_json::{json, Value};

use crate::llm::Reply;

/// Split `s` into pieces of about `n` characters (never inside a character).
pub(crate) fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

#[derive(Debug, Clone)]
enum Block {
    Text(String),
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// Builder of one streamed Messages API answer.
#[derive(Debug, Clone)]
pub struct MessageStream {
    model: String,
    blocks: Vec<Block>,
    input_tokens: u64,
    output_tokens: u64,
    cache_read: u64,
    cache_write: u64,
    stop_reason: Option<String>,
    error: Option<(String, String)>,
    complete: bool,
    piece: usize,
}

impl Default for MessageStream {
    fn default() -> Self {
        Self::new()
    }
}

impl MessageStream {
    pub fn new() -> Self {
        Self {
            model: "claude-sonnet-4-5".into(),
            blocks: Vec::new(),
            input_tokens: 25,
            output_tokens: 15,
            cache_read: 0,
            cache_write: 0,
            stop_reason: None,
            error: None,
            complete: true,
            piece: 5,
        }
    }

    pub fn model(mut self, model: &str) -> Self {
        self.model = model.into();
        self
    }

    /// A text block (streamed in several `text_delta`s).
    pub fn text(mut self, text: &str) -> Self {
        self.blocks.push(Block::Text(text.into()));
        self
    }

    /// A thinking block (`thinking_delta`s, then one `signature_delta`).
    pub fn thinking(mut self, thinking: &str, signature: &str) -> Self {
        self.blocks.push(Block::Thinking {
            thinking: thinking.into(),
            signature: signature.into(),
        });
        self
    }

    /// A `tool_use` block whose input arrives as `input_json_delta` pieces.
    pub fn tool_use(mut self, id: &str, name: &str, input: Value) -> Self {
        self.blocks.push(Block::ToolUse {
            id: id.into(),
            name: name.into(),
            input,
        });
        self
    }

    /// `input_tokens` (in `message_start`) and `output_tokens` (in `message_delta`).
    pub fn usage(mut self, input: u64, output: u64) -> Self {
        self.input_tokens = input;
        self.output_tokens = output;
        self
    }

    /// `cache_read_input_tokens` and `cache_creation_input_tokens`.
    pub fn cache(mut self, read: u64, write: u64) -> Self {
        self.cache_read = read;
        self.cache_write = write;
        self
    }

    /// Override the stop reason (default: `tool_use` with tool calls, else `end_turn`).
    pub fn stop_reason(mut self, reason: &str) -> Self {
        self.stop_reason = Some(reason.into());
        self
    }

    /// Characters per delta (default 5).
    pub fn piece_size(mut self, n: usize) -> Self {
        self.piece = n.max(1);
        self
    }

    /// After the content, send an `error` event (e.g. `overloaded_error`) instead of
    /// `message_delta`/`message_stop`.
    pub fn error(mut self, error_type: &str, message: &str) -> Self {
        self.error = Some((error_type.into(), message.into()));
        self
    }

    /// Leave out `message_delta` and `message_stop` (a stream that ends too early).
    pub fn without_stop(mut self) -> Self {
        self.complete = false;
        self
    }

    /// The SSE body.
    pub fn body(&self) -> String {
        let mut out = String::new();
        let mut ev = |name: &str, data: Value| {
            out.push_str("event: ");
            out.push_str(name);
            out.push_str("\ndata: ");
            out.push_str(&data.to_string());
            out.push_str("\n\n");
        };
        ev(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
                "content": [], "model": self.model, "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.input_tokens,
                          "cache_creation_input_tokens": self.cache_write,
                          "cache_read_input_tokens": self.cache_read,
                          "output_tokens": 1}}}),
        );
        for (index, block) in self.blocks.iter().enumerate() {
            match block {
                Block::Text(text) => {
                    ev(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": index,
                               "content_block": {"type": "text", "text": ""}}),
                    );
                    if index == 0 {
                        ev("ping", json!({"type": "ping"}));
                    }
                    for p in pieces(text, self.piece) {
                        ev(
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "text_delta", "text": p}}),
                        );
                    }
                }
                Block::Thinking {
                    thinking,
                    signature,
                } => {
                    ev(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": index,
                               "content_block": {"type": "thinking", "thinking": ""}}),
                    );
                    for p in pieces(thinking, self.piece) {
                        ev(
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "thinking_delta", "thinking": p}}),
                        );
                    }
                    ev(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                               "delta": {"type": "signature_delta", "signature": signature}}),
                    );
                }
                Block::ToolUse { id, name, input } => {
                    ev(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": index,
                               "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                    );
                    let mut parts = vec![String::new()];
                    parts.extend(pieces(&input.to_string(), self.piece));
                    for p in parts {
                        ev(
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "input_json_delta", "partial_json": p}}),
                        );
                    }
                }
            }
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            );
        }
        if let Some((t, m)) = &self.error {
            ev(
                "error",
                json!({"type": "error", "error": {"type": t, "message": m}}),
            );
            return out;
        }
        if !self.complete {
            return out;
        }
        let has_tools = self
            .blocks
            .iter()
            .any(|b| matches!(b, Block::ToolUse { .. }));
        let stop = self
            .stop_reason
            .clone()
            .unwrap_or_else(|| if has_tools { "tool_use" } else { "end_turn" }.to_string());
        ev(
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": stop, "stop_sequence": null},
                   "usage": {"output_tokens": self.output_tokens}}),
        );
        ev("message_stop", json!({"type": "message_stop"}));
        out
    }

    /// The body as a [`Reply`] (one chunk; split it with [`Reply::chunked`]).
    pub fn reply(&self) -> Reply {
        Reply::sse(self.body())
    }
}

/// A streamed text answer.
pub fn text_response(text: &str) -> Reply {
    MessageStream::new().text(text).reply()
}

/// A streamed answer with these tool calls `(id, name, input)` (stop reason `tool_use`).
pub fn tool_use_response(calls: &[(&str, &str, Value)]) -> Reply {
    calls
        .iter()
        .fold(MessageStream::new(), |s, (id, name, input)| {
            s.tool_use(id, name, input.clone())
        })
        .reply()
}

/// A streamed answer with a thinking block (with signature) and then text.
pub fn thinking_response(thinking: &str, signature: &str, text: &str) -> Reply {
    MessageStream::new()
        .thinking(thinking, signature)
        .text(text)
        .reply()
}

/// Anthropic's JSON error body.
pub fn error_body(error_type: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type, "message": message}})
}

/// An HTTP error answer with Anthropic's body (add `retry-after` with [`Reply::header`]).
pub fn error_reply(status: u16, error_type: &str, message: &str) -> Reply {
    Reply::error(status, error_body(error_type, message))
        .header("request-id", "req_011CSHoEeqs5C35K2UUqR7Fy")
}

/// Check a recorded Messages request the way the API does: every assistant `tool_use` is
/// answered by exactly one `tool_result` in the next message (a user message), results
/// come before any other content there, and no `tool_result` answers an unknown id.
pub fn check_tool_pairing(body: &Value) -> Result<(), String> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err("no messages array".into());
    };
    let blocks = |m: &Value| -> Vec<Value> {
        m.get("content")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let ids_of = |bs: &[Value], ty: &str, key: &str| -> Vec<String> {
        bs.iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some(ty))
            .filter_map(|b| b.get(key).and_then(Value::as_str).map(str::to_string))
            .collect()
    };
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let bs = blocks(m);
        let results = ids_of(&bs, "tool_result", "tool_use_id");
        if !results.is_empty() {
            if role != "user" {
                return Err(format!("message {i}: tool_result in a {role} message"));
            }
            let first_other = bs
                .iter()
                .position(|b| b.get("type").and_then(Value::as_str) != Some("tool_result"))
                .unwrap_or(bs.len());
            if bs[first_other..]
                .iter()
                .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
            {
                return Err(format!("message {i}: tool_result blocks must come first"));
            }
            let calls = match i.checked_sub(1).map(|p| &messages[p]) {
                Some(prev) if prev.get("role").and_then(Value::as_str) == Some("assistant") => {
                    ids_of(&blocks(prev), "tool_use", "id")
                }
                _ => Vec::new(),
            };
            for r in &results {
                if !calls.contains(r) {
                    return Err(format!(
                        "message {i}: tool_result {r} answers no tool_use of the previous assistant message"
                    ));
                }
                if results.iter().filter(|x| *x == r).count() > 1 {
                    return Err(format!("message {i}: tool_use {r} answered twice"));
                }
            }
        }
        if role == "assistant" {
            let calls = ids_of(&bs, "tool_use", "id");
            if calls.is_empty() {
                continue;
            }
            let answered = messages
                .get(i + 1)
                .map(|next| ids_of(&blocks(next), "tool_result", "tool_use_id"))
                .unwrap_or_default();
            for c in &calls {
                if !answered.contains(c) {
                    return Err(format!(
                        "message {i}: tool_use {c} has no tool_result in the next message"
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_has_documented_shape() {
        let body = MessageStream::new()
            .thinking("hmm", "sig")
            .text("Hello")
            .tool_use("toolu_1", "exec", json!({"cmd": "ls"}))
            .body();
        assert!(body.starts_with("event: message_start\ndata: {\"type\":\"message_start\""));
        assert!(body.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
        assert!(body.contains("\"stop_reason\":\"tool_use\""));
        assert!(body.contains("signature_delta"));
        assert!(!MessageStream::new()
            .text("x")
            .without_stop()
            .body()
            .contains("message_stop"));
    }

    #[test]
    fn pairing_check() {
        let ok = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x", "input": {}},
                                               {"type": "tool_use", "id": "b", "name": "x", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": []},
                                          {"type": "tool_result", "tool_use_id": "b", "content": []},
                                          {"type": "text", "text": "more"}]}
        ]});
        assert_eq!(check_tool_pairing(&ok), Ok(()));
        let mut missing = ok.clone();
        missing["messages"][2]["content"]
            .as_array_mut()
            .unwrap()
            .remove(1);
        assert!(check_tool_pairing(&missing).is_err());
        let mut unknown = ok.clone();
        unknown["messages"][2]["content"][0]["tool_use_id"] = json!("zzz");
        assert!(check_tool_pairing(&unknown).is_err());
        let mut order = ok;
        order["messages"][2]["content"]
            .as_array_mut()
            .unwrap()
            .swap(0, 2);
        assert!(check_tool_pairing(&order).is_err());
    }
}
