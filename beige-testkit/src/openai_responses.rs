//! OpenAI Responses API streams for [`crate::llm::FakeLlmServer`]: [`ResponsesStream`]
//! writes the SSE byte stream as OpenAI documents it (`event: <type>` + `data: <json>`
//! with a `sequence_number`: `response.created`, `response.in_progress`, per output item
//! `response.output_item.added` … `response.output_item.done` with the text, reasoning
//! summary and function-call-argument deltas in between, then `response.completed` with
//! `usage` — or `response.incomplete`, `response.failed`, an `error` event, or nothing);
//! shortcuts cover the common answers, and [`check_tool_pairing`] validates a recorded
//! request (every `function_call_output.call_id` answers an earlier `function_call` item,
//! once, and every call is answered).

use serde_json::{json, Value};

use crate::anthropic::pieces;
use crate::llm::Reply;

#[derive(Debug, Clone)]
enum Ending {
    Completed,
    Incomplete(String),
    Failed { code: String, message: String },
    Error { code: String, message: String },
    Nothing,
}

/// Builder of one streamed Responses API answer.
#[derive(Debug, Clone)]
pub struct ResponsesStream {
    model: String,
    reasoning: Option<String>,
    text: Option<String>,
    calls: Vec<(String, String, Value)>,
    usage: (u64, u64, u64, u64),
    ending: Ending,
    piece: usize,
}

impl Default for ResponsesStream {
    fn default() -> Self {
        Self::new()
    }
}

const RESPONSE_ID: &str = "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b";

impl ResponsesStream {
    pub fn new() -> Self {
        Self {
            model: "gpt-4.1-2025-04-14".into(),
            reasoning: None,
            text: None,
            calls: Vec::new(),
            usage: (37, 11, 0, 0),
            ending: Ending::Completed,
            piece: 5,
        }
    }

    pub fn model(mut self, model: &str) -> Self {
        self.model = model.into();
        self
    }

    /// A `reasoning` item whose summary arrives as `response.reasoning_summary_text.delta`.
    pub fn reasoning_summary(mut self, text: &str) -> Self {
        self.reasoning = Some(text.into());
        self
    }

    /// A `message` item with this text in `response.output_text.delta` pieces.
    pub fn text(mut self, text: &str) -> Self {
        self.text = Some(text.into());
        self
    }

    /// A `function_call` item (`call_id`, `name`) whose `arguments` arrive in pieces.
    pub fn function_call(mut self, call_id: &str, name: &str, arguments: Value) -> Self {
        self.calls.push((call_id.into(), name.into(), arguments));
        self
    }

    /// `usage` of `response.completed`: `input_tokens`, `output_tokens`,
    /// `input_tokens_details.cached_tokens`, `output_tokens_details.reasoning_tokens`
    /// (default 37, 11, 0, 0).
    pub fn usage(mut self, input: u64, output: u64, cached: u64, reasoning: u64) -> Self {
        self.usage = (input, output, cached, reasoning);
        self
    }

    /// Characters per delta (default 5).
    pub fn piece_size(mut self, n: usize) -> Self {
        self.piece = n.max(1);
        self
    }

    /// End with `response.incomplete` (`incomplete_details.reason`, e.g.
    /// `max_output_tokens`) instead of `response.completed`.
    pub fn incomplete(mut self, reason: &str) -> Self {
        self.ending = Ending::Incomplete(reason.into());
        self
    }

    /// End with `response.failed` carrying `response.error {code, message}`.
    pub fn failed(mut self, code: &str, message: &str) -> Self {
        self.ending = Ending::Failed {
            code: code.into(),
            message: message.into(),
        };
        self
    }

    /// After the content, send an `error` event (`code`, `message`) and end.
    pub fn error(mut self, code: &str, message: &str) -> Self {
        self.ending = Ending::Error {
            code: code.into(),
            message: message.into(),
        };
        self
    }

    /// No terminal event at all (a stream that ends too early).
    pub fn without_completion(mut self) -> Self {
        self.ending = Ending::Nothing;
        self
    }

    fn response(
        &self,
        status: &str,
        output: Value,
        usage: Value,
        error: Value,
        incomplete: Value,
    ) -> Value {
        json!({
            "id": RESPONSE_ID, "object": "response", "created_at": 1_741_476_542u64,
            "status": status, "error": error, "incomplete_details": incomplete,
            "instructions": null, "max_output_tokens": null, "model": self.model,
            "output": output, "parallel_tool_calls": true, "previous_response_id": null,
            "reasoning": {"effort": null, "summary": null}, "store": false, "temperature": 1.0,
            "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
            "top_p": 1.0, "truncation": "disabled", "usage": usage, "user": null, "metadata": {}
        })
    }

    /// The SSE body.
    pub fn body(&self) -> String {
        let mut out = String::new();
        let mut seq = 0u64;
        let mut emit = |kind: &str, mut data: Value| {
            data["sequence_number"] = json!(seq);
            seq += 1;
            // `type` first, as the API writes it.
            let mut ordered = serde_json::Map::new();
            ordered.insert("type".into(), json!(kind));
            if let Value::Object(fields) = data {
                for (k, v) in fields {
                    if k != "type" {
                        ordered.insert(k, v);
                    }
                }
            }
            out.push_str("event: ");
            out.push_str(kind);
            out.push_str("\ndata: ");
            out.push_str(&Value::Object(ordered).to_string());
            out.push_str("\n\n");
        };
        let initial = self.response(
            "in_progress",
            json!([]),
            Value::Null,
            Value::Null,
            Value::Null,
        );
        emit("response.created", json!({"response": initial}));
        emit("response.in_progress", json!({"response": initial}));

        let mut output = Vec::new();
        let mut index = 0u64;
        if let Some(summary) = &self.reasoning {
            let id = "rs_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b";
            emit(
                "response.output_item.added",
                json!({"output_index": index, "item": {"id": id, "type": "reasoning", "summary": []}}),
            );
            let part = json!({"type": "summary_text", "text": ""});
            emit(
                "response.reasoning_summary_part.added",
                json!({"item_id": id, "output_index": index, "summary_index": 0, "part": part}),
            );
            for p in pieces(summary, self.piece) {
                emit(
                    "response.reasoning_summary_text.delta",
                    json!({"item_id": id, "output_index": index, "summary_index": 0, "delta": p}),
                );
            }
            emit(
                "response.reasoning_summary_text.done",
                json!({"item_id": id, "output_index": index, "summary_index": 0, "text": summary}),
            );
            let part = json!({"type": "summary_text", "text": summary});
            emit(
                "response.reasoning_summary_part.done",
                json!({"item_id": id, "output_index": index, "summary_index": 0, "part": part}),
            );
            let item = json!({"id": id, "type": "reasoning", "summary": [part]});
            emit(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
            index += 1;
        }
        if let Some(text) = &self.text {
            let id = "msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b";
            let item = json!({"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
            emit(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            emit(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            );
            for p in pieces(text, self.piece) {
                emit(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "delta": p, "logprobs": []}),
                );
            }
            emit(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
            );
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            emit(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            );
            let item = json!({"id": id, "type": "message", "status": "completed", "role": "assistant", "content": [part]});
            emit(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
            index += 1;
        }
        for (n, (call_id, name, args)) in self.calls.iter().enumerate() {
            let id = format!("fc_67ccd2c0e4a88190a1a9c7d5b2e46f{n:02}0bb6a6b452d3795b");
            let item = json!({"id": id, "type": "function_call", "status": "in_progress",
                              "arguments": "", "call_id": call_id, "name": name});
            emit(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            let arguments = args.to_string();
            for p in pieces(&arguments, self.piece) {
                emit(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": p}),
                );
            }
            emit(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": arguments}),
            );
            let item = json!({"id": id, "type": "function_call", "status": "completed",
                              "arguments": arguments, "call_id": call_id, "name": name});
            emit(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
            index += 1;
        }

        let (input, output_tokens, cached, reasoning) = self.usage;
        let usage = json!({
            "input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": input + output_tokens
        });
        match &self.ending {
            Ending::Completed => {
                let r = self.response(
                    "completed",
                    Value::Array(output),
                    usage,
                    Value::Null,
                    Value::Null,
                );
                emit("response.completed", json!({"response": r}));
            }
            Ending::Incomplete(reason) => {
                let r = self.response(
                    "incomplete",
                    Value::Array(output),
                    usage,
                    Value::Null,
                    json!({"reason": reason}),
                );
                emit("response.incomplete", json!({"response": r}));
            }
            Ending::Failed { code, message } => {
                let error = json!({"code": code, "message": message});
                let r = self.response(
                    "failed",
                    Value::Array(output),
                    Value::Null,
                    error,
                    Value::Null,
                );
                emit("response.failed", json!({"response": r}));
            }
            Ending::Error { code, message } => {
                emit(
                    "error",
                    json!({"code": code, "message": message, "param": null}),
                );
            }
            Ending::Nothing => {}
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
    ResponsesStream::new().text(text).reply()
}

/// A streamed answer with these function calls `(call_id, name, arguments)`.
pub fn function_calls_response(calls: &[(&str, &str, Value)]) -> Reply {
    calls
        .iter()
        .fold(ResponsesStream::new(), |s, (id, name, args)| {
            s.function_call(id, name, args.clone())
        })
        .reply()
}

/// OpenAI's error body and answer are the same for both of its APIs.
pub use crate::openai_completions::{error_body, error_reply};

/// Check a recorded Responses request: every `function_call_output` answers (by
/// `call_id`) a `function_call` item earlier in `input`, no call is answered twice, and
/// every call is answered.
pub fn check_tool_pairing(body: &Value) -> Result<(), String> {
    let Some(input) = body.get("input").and_then(Value::as_array) else {
        return Err("no input array".into());
    };
    let mut calls: Vec<(usize, String)> = Vec::new();
    let mut answered: Vec<String> = Vec::new();
    for (i, item) in input.iter().enumerate() {
        let call_id = || {
            item.get("call_id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("input {i}: no call_id"))
        };
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                let id = call_id()?;
                if calls.iter().any(|(_, c)| *c == id) {
                    return Err(format!("input {i}: duplicate function_call {id}"));
                }
                calls.push((i, id));
            }
            Some("function_call_output") => {
                let id = call_id()?;
                if !calls.iter().any(|(_, c)| *c == id) {
                    return Err(format!(
                        "input {i}: output {id} answers no earlier function_call"
                    ));
                }
                if answered.contains(&id) {
                    return Err(format!("input {i}: function_call {id} answered twice"));
                }
                answered.push(id);
            }
            _ => {}
        }
    }
    match calls.iter().find(|(_, id)| !answered.contains(id)) {
        Some((at, id)) => Err(format!(
            "input {at}: function_call {id} has no function_call_output"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_has_documented_shape() {
        let body = ResponsesStream::new()
            .text("Hi")
            .function_call("call_1", "exec", json!({"cmd": "ls"}))
            .body();
        assert!(body.starts_with("event: response.created\ndata: {\"type\":\"response.created\""));
        assert!(body.contains("event: response.function_call_arguments.delta\n"));
        assert!(body.ends_with("\n\n"));
        let last = body.trim_end().lines().last().unwrap_or_default();
        assert!(
            last.starts_with("data: {\"type\":\"response.completed\""),
            "{last}"
        );
        assert!(last.contains("\"usage\":{\"input_tokens\":37"), "{last}");
        assert!(!ResponsesStream::new()
            .text("x")
            .without_completion()
            .body()
            .contains("response.completed"));
    }

    #[test]
    fn pairing_check() {
        let ok = json!({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "a", "name": "x", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "x", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            {"type": "function_call_output", "call_id": "b", "output": "2"}
        ]});
        assert_eq!(check_tool_pairing(&ok), Ok(()));
        let mut missing = ok.clone();
        missing["input"].as_array_mut().unwrap().remove(4);
        assert!(check_tool_pairing(&missing).is_err());
        let mut unknown = ok.clone();
        unknown["input"][3]["call_id"] = json!("zzz");
        assert!(check_tool_pairing(&unknown).is_err());
        let mut early = ok;
        early["input"].as_array_mut().unwrap().swap(1, 3);
        assert!(check_tool_pairing(&early).is_err());
    }
}
