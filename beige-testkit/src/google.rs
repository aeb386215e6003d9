//! Gemini `streamGenerateContent?alt=sse` streams for [`crate::llm::FakeLlmServer`]:
//! [`GeminiStream`] writes the SSE byte stream as the API sends it — one
//! `data: <GenerateContentResponse>` per chunk, separated by `\r\n\r\n`, each chunk with
//! `candidates[0].content.parts[]` (`text`, `thought: true` text, `functionCall {name,
//! args}` with a `thoughtSignature` on the first call), cumulative `usageMetadata`,
//! `modelVersion` and `responseId`; the last chunk carries `finishReason`. There is no
//! terminal sentinel: the body ending is the end. Shortcuts cover the common answers,
//! [`error_body`] builds Google's error JSON (with `RetryInfo`), and
//! [`check_tool_pairing`] validates a recorded request (each `functionResponse` content
//! directly follows a `model` content whose `functionCall` names it matches, in order).

use serde_json::{json, Value};

use crate::anthropic::pieces;
use crate::llm::Reply;

/// Builder of one streamed Gemini answer.
#[derive(Debug, Clone)]
pub struct GeminiStream {
    model: String,
    thought: Option<String>,
    text: Option<String>,
    calls: Vec<(String, Value)>,
    usage: (u64, u64, u64, u64),
    finish_reason: Option<String>,
    finish: bool,
    error: Option<Value>,
    piece: usize,
}

impl Default for GeminiStream {
    fn default() -> Self {
        Self::new()
    }
}

impl GeminiStream {
    pub fn new() -> Self {
        Self {
            model: "gemini-2.5-flash".into(),
            thought: None,
            text: None,
            calls: Vec::new(),
            usage: (9, 12, 0, 0),
            finish_reason: None,
            finish: true,
            error: None,
            piece: 8,
        }
    }

    pub fn model(mut self, model: &str) -> Self {
        self.model = model.into();
        self
    }

    /// Thought-summary text (`thought: true` parts), before the answer.
    pub fn thought(mut self, text: &str) -> Self {
        self.thought = Some(text.into());
        self
    }

    /// Answer text, one piece per chunk.
    pub fn text(mut self, text: &str) -> Self {
        self.text = Some(text.into());
        self
    }

    /// A `functionCall` part; all calls arrive together in one chunk, as Gemini sends
    /// parallel calls.
    pub fn function_call(mut self, name: &str, args: Value) -> Self {
        self.calls.push((name.into(), args));
        self
    }

    /// Final `usageMetadata`: `promptTokenCount`, `candidatesTokenCount`,
    /// `cachedContentTokenCount`, `thoughtsTokenCount` (default 9, 12, 0, 0).
    pub fn usage(mut self, prompt: u64, candidates: u64, cached: u64, thoughts: u64) -> Self {
        self.usage = (prompt, candidates, cached, thoughts);
        self
    }

    /// Override `finishReason` (default `STOP`).
    pub fn finish_reason(mut self, reason: &str) -> Self {
        self.finish_reason = Some(reason.into());
        self
    }

    /// No chunk carries a `finishReason` (a stream that ends too early).
    pub fn without_finish(mut self) -> Self {
        self.finish = false;
        self
    }

    /// After the content, send a chunk `{"error": {code, message, status}}` and end.
    pub fn error(mut self, code: u16, status: &str, message: &str) -> Self {
        self.error = Some(error_body(code, status, message, None));
        self
    }

    /// Characters per text chunk (default 8).
    pub fn piece_size(mut self, n: usize) -> Self {
        self.piece = n.max(1);
        self
    }

    /// The SSE body.
    pub fn body(&self) -> String {
        let (prompt, candidates, cached, thoughts) = self.usage;
        let mut out = String::new();
        let mut data = |v: &Value| {
            out.push_str("data: ");
            out.push_str(&v.to_string());
            out.push_str("\r\n\r\n");
        };
        let partial_usage = json!({
            "promptTokenCount": prompt, "totalTokenCount": prompt,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}]
        });
        let chunk = |parts: Value, finish: Option<&str>, usage: &Value| -> Value {
            let mut candidate = json!({"content": {"parts": parts, "role": "model"}, "index": 0});
            if let Some(f) = finish {
                candidate["finishReason"] = json!(f);
            }
            json!({
                "candidates": [candidate], "usageMetadata": usage,
                "modelVersion": self.model, "responseId": "mcY4aN2pIqSv1dkP2Nq9mQ4"
            })
        };
        let mut texts: Vec<Value> = Vec::new();
        if let Some(t) = &self.thought {
            texts.extend(
                pieces(t, self.piece)
                    .into_iter()
                    .map(|p| json!([{"text": p, "thought": true}])),
            );
        }
        if let Some(t) = &self.text {
            texts.extend(
                pieces(t, self.piece)
                    .into_iter()
                    .map(|p| json!([{"text": p}])),
            );
        }
        let calls: Vec<Value> = self
            .calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                let mut part = json!({"functionCall": {"name": name, "args": args}});
                if i == 0 {
                    part["thoughtSignature"] =
                        json!("CiQBcsjafBqN8mVb6XhD2ZrDPb8oBvyOWDeWqTOm2cyDNuRfEkE=");
                }
                part
            })
            .collect();
        let mut chunks: Vec<Value> = texts;
        if !calls.is_empty() {
            chunks.push(Value::Array(calls));
        }
        if let Some(error) = &self.error {
            for parts in chunks {
                data(&chunk(parts, None, &partial_usage));
            }
            data(error);
            return out;
        }
        let final_usage = {
            let mut u = json!({
                "promptTokenCount": prompt, "candidatesTokenCount": candidates,
                "totalTokenCount": prompt + candidates + thoughts,
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}]
            });
            if cached > 0 {
                u["cachedContentTokenCount"] = json!(cached);
            }
            if thoughts > 0 {
                u["thoughtsTokenCount"] = json!(thoughts);
            }
            u
        };
        let finish = self
            .finish
            .then(|| self.finish_reason.clone().unwrap_or_else(|| "STOP".into()));
        if chunks.is_empty() {
            chunks.push(json!([{"text": ""}]));
        }
        let last = chunks.len() - 1;
        for (i, parts) in chunks.into_iter().enumerate() {
            if i == last {
                data(&chunk(parts, finish.as_deref(), &final_usage));
            } else {
                data(&chunk(parts, None, &partial_usage));
            }
        }
        out
    }

    /// The body as a [`Reply`] (one chunk; split it with [`Reply::chunked`]).
    pub fn reply(&self) -> Reply {
        Reply::sse(self.body())
    }
}

/// A streamed text answer (with usage).
pub fn text_response(text: &str) -> Reply {
    GeminiStream::new().text(text).reply()
}

/// A streamed answer with these function calls `(name, args)`.
pub fn function_calls_response(calls: &[(&str, Value)]) -> Reply {
    calls
        .iter()
        .fold(GeminiStream::new(), |s, (name, args)| {
            s.function_call(name, args.clone())
        })
        .reply()
}

/// Google's JSON error body; `retry_delay` (e.g. `"30s"`) adds a `RetryInfo` detail.
pub fn error_body(code: u16, status: &str, message: &str, retry_delay: Option<&str>) -> Value {
    let mut error = json!({"code": code, "message": message, "status": status});
    if let Some(delay) = retry_delay {
        error["details"] = json!([
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [
                {"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                 "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
        ]);
    }
    json!({ "error": error })
}

/// An HTTP error answer with Google's body (add `retry-after` with [`Reply::header`]).
pub fn error_reply(code: u16, status: &str, message: &str, retry_delay: Option<&str>) -> Reply {
    Reply::error(code, error_body(code, status, message, retry_delay))
}

fn part_names<'a>(content: &'a Value, key: &str) -> Vec<&'a str> {
    content
        .get("parts")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.get(key))
                .map(|f| f.get("name").and_then(Value::as_str).unwrap_or(""))
                .collect()
        })
        .unwrap_or_default()
}

/// Check a recorded Gemini request: a `model` content with `functionCall` parts is
/// directly followed by a `user` content whose `functionResponse` parts have the same
/// names in the same order, and `functionResponse` parts appear nowhere else.
pub fn check_tool_pairing(body: &Value) -> Result<(), String> {
    let Some(contents) = body.get("contents").and_then(Value::as_array) else {
        return Err("no contents array".into());
    };
    let mut pending: Option<(usize, Vec<&str>)> = None;
    for (i, content) in contents.iter().enumerate() {
        let role = content.get("role").and_then(Value::as_str).unwrap_or("");
        let responses = part_names(content, "functionResponse");
        if let Some((at, calls)) = pending.take() {
            if role != "user" || responses != calls {
                return Err(format!(
                    "content {i}: functionResponse names {responses:?} do not match the functionCall names {calls:?} of content {at}"
                ));
            }
        } else if !responses.is_empty() {
            return Err(format!(
                "content {i}: functionResponse without a preceding functionCall"
            ));
        }
        let calls = part_names(content, "functionCall");
        if !calls.is_empty() {
            if role != "model" {
                return Err(format!("content {i}: functionCall in a {role:?} content"));
            }
            pending = Some((i, calls));
        }
    }
    match pending {
        Some((at, calls)) => Err(format!(
            "content {at}: functionCall {calls:?} has no functionResponse"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_has_documented_shape() {
        let body = GeminiStream::new()
            .text("Hello there")
            .function_call("exec", json!({"cmd": "ls"}))
            .body();
        assert!(body.starts_with(
            "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hello th\"}]"
        ));
        assert!(body.ends_with("\r\n\r\n"));
        let last = body.trim_end().lines().last().unwrap_or_default();
        assert!(
            last.contains("\"functionCall\":{\"name\":\"exec\",\"args\":{\"cmd\":\"ls\"}}"),
            "{last}"
        );
        assert!(last.contains("\"finishReason\":\"STOP\""), "{last}");
        assert!(last.contains("\"candidatesTokenCount\":12"), "{last}");
        assert!(!GeminiStream::new()
            .text("x")
            .without_finish()
            .body()
            .contains("finishReason"));
    }

    #[test]
    fn pairing_check() {
        let ok = json!({"contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "a", "args": {}}},
                                        {"functionCall": {"name": "b", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "a", "response": {}}},
                                       {"functionResponse": {"name": "b", "response": {}}}]}
        ]});
        assert_eq!(check_tool_pairing(&ok), Ok(()));
        let mut missing = ok.clone();
        missing["contents"].as_array_mut().unwrap().remove(2);
        assert!(check_tool_pairing(&missing).is_err());
        let mut wrong = ok.clone();
        wrong["contents"][2]["parts"][1]["functionResponse"]["name"] = json!("c");
        assert!(check_tool_pairing(&wrong).is_err());
        let mut stray = ok;
        stray["contents"].as_array_mut().unwrap().remove(1);
        assert!(check_tool_pairing(&stray).is_err());
    }
}
