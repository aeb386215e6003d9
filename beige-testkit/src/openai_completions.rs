//! OpenAI Chat Completions streams for [`crate::llm::FakeLlmServer`]: [`ChatStream`]
//! writes the SSE byte stream as OpenAI documents it (`chat.completion.chunk` objects
//! with `choices[0].delta` content and partial `tool_calls` by `index`, a
//! `finish_reason` chunk, a usage chunk with empty `choices` for
//! `stream_options.include_usage`, then `data: [DONE]`); shortcuts cover the common
//! answers, and [`check_tool_pairing`] validates a recorded request (each `role: tool`
//! message answers a `tool_calls` id of the assistant message before it, and every call
//! is answered).

use serde_json::{json, Value};

use crate::anthropic::pieces;
use crate::llm::Reply;

/// Builder of one streamed Chat Completions answer.
#[derive(Debug, Clone)]
pub struct ChatStream {
    model: String,
    reasoning: Option<String>,
    text: Option<String>,
    tool_calls: Vec<(String, String, Value)>,
    finish_reason: Option<String>,
    usage: Option<(u64, u64, u64)>,
    error: Option<Value>,
    done: bool,
    piece: usize,
}

impl Default for ChatStream {
    fn default() -> Self {
        Self::new()
    }
}

impl ChatStream {
    pub fn new() -> Self {
        Self {
            model: "gpt-4o-mini".into(),
            reasoning: None,
            text: None,
            tool_calls: Vec::new(),
            finish_reason: None,
            usage: Some((19, 10, 0)),
            error: None,
            done: true,
            piece: 5,
        }
    }

    pub fn model(mut self, model: &str) -> Self {
        self.model = model.into();
        self
    }

    /// Reasoning text in `delta.reasoning_content` (DeepSeek, vLLM, …), before the text.
    pub fn reasoning(mut self, text: &str) -> Self {
        self.reasoning = Some(text.into());
        self
    }

    /// Answer text in `delta.content` pieces.
    pub fn text(mut self, text: &str) -> Self {
        self.text = Some(text.into());
        self
    }

    /// A tool call whose `function.arguments` arrive in pieces.
    pub fn tool_call(mut self, id: &str, name: &str, arguments: Value) -> Self {
        self.tool_calls.push((id.into(), name.into(), arguments));
        self
    }

    /// The usage chunk: `prompt_tokens`, `completion_tokens`,
    /// `prompt_tokens_details.cached_tokens` (default 19, 10, 0).
    pub fn usage(mut self, prompt: u64, completion: u64, cached: u64) -> Self {
        self.usage = Some((prompt, completion, cached));
        self
    }

    /// No usage chunk (a client that did not ask for it, or a server that ignores it).
    pub fn without_usage(mut self) -> Self {
        self.usage = None;
        self
    }

    /// Override `finish_reason` (default `tool_calls` with tool calls, else `stop`).
    pub fn finish_reason(mut self, reason: &str) -> Self {
        self.finish_reason = Some(reason.into());
        self
    }

    /// Characters per delta (default 5).
    pub fn piece_size(mut self, n: usize) -> Self {
        self.piece = n.max(1);
        self
    }

    /// After the content, send `data: {"error": {...}}` and end (no finish, no `[DONE]`).
    pub fn error(mut self, error_type: &str, code: Option<&str>, message: &str) -> Self {
        self.error = Some(json!({"error": {
            "message": message, "type": error_type, "param": null, "code": code
        }}));
        self
    }

    /// Leave out `data: [DONE]` (a stream that ends too early).
    pub fn without_done(mut self) -> Self {
        self.done = false;
        self
    }

    /// The SSE body.
    pub fn body(&self) -> String {
        let mut out = String::new();
        let include_usage = self.usage.is_some();
        let chunk = |choices: Value, usage: Option<Value>| -> Value {
            let mut c = json!({
                "id": "chatcmpl-AbC123", "object": "chat.completion.chunk", "created": 1_727_000_000u64,
                "model": self.model, "system_fingerprint": "fp_44709d6fcb", "choices": choices,
            });
            if include_usage {
                c["usage"] = usage.unwrap_or(Value::Null);
            }
            c
        };
        let delta = |d: Value, finish: Value| -> Value {
            chunk(
                json!([{"index": 0, "delta": d, "logprobs": null, "finish_reason": finish}]),
                None,
            )
        };
        let mut data = |v: &Value| {
            out.push_str("data: ");
            out.push_str(&v.to_string());
            out.push_str("\n\n");
        };
        let first_content = if self.tool_calls.is_empty() || self.text.is_some() {
            json!("")
        } else {
            Value::Null
        };
        data(&delta(
            json!({"role": "assistant", "content": first_content, "refusal": null}),
            Value::Null,
        ));
        if let Some(r) = &self.reasoning {
            for p in pieces(r, self.piece) {
                data(&delta(json!({"reasoning_content": p}), Value::Null));
            }
        }
        if let Some(t) = &self.text {
            for p in pieces(t, self.piece) {
                data(&delta(json!({"content": p}), Value::Null));
            }
        }
        for (index, (id, name, args)) in self.tool_calls.iter().enumerate() {
            data(&delta(
                json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                                        "function": {"name": name, "arguments": ""}}]}),
                Value::Null,
            ));
            for p in pieces(&args.to_string(), self.piece) {
                data(&delta(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": p}}]}),
                    Value::Null,
                ));
            }
        }
        if let Some(e) = &self.error {
            data(e);
            return out;
        }
        let finish = self.finish_reason.clone().unwrap_or_else(|| {
            if self.tool_calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            }
            .to_string()
        });
        data(&delta(json!({}), json!(finish)));
        if let Some((prompt, completion, cached)) = self.usage {
            data(&chunk(
                json!([]),
                Some(json!({
                    "prompt_tokens": prompt, "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                    "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                        "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
                })),
            ));
        }
        if self.done {
            out.push_str("data: [DONE]\n\n");
        }
        out
    }

    /// The body as a [`Reply`] (one chunk; split it with [`Reply::chunked`]).
    pub fn reply(&self) -> Reply {
        Reply::sse(self.body())
    }
}

/// A streamed text answer (with a usage chunk).
pub fn text_response(text: &str) -> Reply {
    ChatStream::new().text(text).reply()
}

/// A streamed answer with these tool calls `(id, name, arguments)`.
pub fn tool_calls_response(calls: &[(&str, &str, Value)]) -> Reply {
    calls
        .iter()
        .fold(ChatStream::new(), |s, (id, name, args)| {
            s.tool_call(id, name, args.clone())
        })
        .reply()
}

/// OpenAI's JSON error body.
pub fn error_body(error_type: &str, code: Option<&str>, message: &str) -> Value {
    json!({"error": {"message": message, "type": error_type, "param": null, "code": code}})
}

/// An HTTP error answer with OpenAI's body (add `retry-after` with [`Reply::header`]).
pub fn error_reply(status: u16, error_type: &str, code: Option<&str>, message: &str) -> Reply {
    Reply::error(status, error_body(error_type, code, message))
}

/// Check a recorded Chat Completions request: each `role: tool` message follows (through
/// other tool messages only) an assistant message whose `tool_calls` contain its
/// `tool_call_id`, no call is answered twice, and every call is answered before the next
/// non-tool message.
pub fn check_tool_pairing(body: &Value) -> Result<(), String> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err("no messages array".into());
    };
    let mut open: Option<(usize, Vec<String>)> = None;
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role == "tool" {
            let id = m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("message {i}: tool message without tool_call_id"))?;
            let Some((_, pending)) = open.as_mut() else {
                return Err(format!(
                    "message {i}: tool result {id} does not follow an assistant message with tool_calls"
                ));
            };
            let Some(pos) = pending.iter().position(|p| p == id) else {
                return Err(format!(
                    "message {i}: tool result {id} answers no pending tool call"
                ));
            };
            pending.remove(pos);
            continue;
        }
        if let Some((at, pending)) = open.take() {
            if let Some(id) = pending.first() {
                return Err(format!(
                    "message {at}: tool call {id} has no tool message before message {i}"
                ));
            }
        }
        if role == "assistant" {
            let ids: Vec<String> = m
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .filter_map(|c| c.get("id").and_then(Value::as_str).map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            if !ids.is_empty() {
                open = Some((i, ids));
            }
        }
    }
    if let Some((at, pending)) = open {
        if let Some(id) = pending.first() {
            return Err(format!("message {at}: tool call {id} has no tool message"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_has_documented_shape() {
        let body = ChatStream::new()
            .text("Hi")
            .tool_call("call_1", "exec", json!({"cmd": "ls"}))
            .body();
        assert!(body.starts_with("data: {\"id\":\"chatcmpl-AbC123\""));
        assert!(body.ends_with("data: [DONE]\n\n"));
        assert!(body.contains("\"finish_reason\":\"tool_calls\""));
        assert!(body.contains("\"choices\":[],"));
        assert!(!ChatStream::new()
            .text("x")
            .without_done()
            .body()
            .contains("[DONE]"));
    }

    #[test]
    fn pairing_check() {
        let ok = json!({"messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "x", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "x", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "tool", "tool_call_id": "b", "content": "2"},
            {"role": "user", "content": "next"}
        ]});
        assert_eq!(check_tool_pairing(&ok), Ok(()));
        let mut missing = ok.clone();
        missing["messages"].as_array_mut().unwrap().remove(4);
        assert!(check_tool_pairing(&missing).is_err());
        let mut unknown = ok.clone();
        unknown["messages"][3]["tool_call_id"] = json!("zzz");
        assert!(check_tool_pairing(&unknown).is_err());
        let mut stray = ok;
        stray["messages"].as_array_mut().unwrap().swap(2, 1);
        assert!(check_tool_pairing(&stray).is_err());
    }
}
