//! The four core tools the model sees — `read`, `write`, `patch`, `exec` — and the texts
//! of their results.
//!
//! Owns parsing a call (names and parameters exactly as in the original, because models
//! and prompts rely on them), turning it into a shim operation, and turning the shim's
//! reply into the [`ToolOutput`] the model reads. It does not decide whether a call may
//! run (policy) and does not know how the operation reaches the container (sandbox).

use beige_protocol::op::{
    ExecReply, ExecRequest, OpReply, OpRequest, PatchRequest, ReadReply, ReadRequest, WriteRequest,
    DEFAULT_IMAGE_MAX_BYTES, DEFAULT_READ_MAX_BYTES,
};

use crate::config::AgentSandboxConfig;
use crate::ident::ExecId;
use crate::sandbox::{OpOutcome, Sandbox, SandboxError};

pub(crate) use crate::vocab::CORE_TOOLS;

/// Default `exec` timeout in seconds.
pub(crate) const DEFAULT_EXEC_TIMEOUT_SECS: u64 = 900;

/// The four core tools as the model sees them: names, descriptions and parameter schemas
/// (names and parameter names are the original's; models and prompts rely on them).
pub(crate) fn definitions() -> Vec<crate::llm::ToolSpec> {
    use serde_json::json;
    let spec = |name: &str, description: &str, schema: serde_json::Value| crate::llm::ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        input_schema: schema,
    };
    vec![
        spec(
            "read",
            "Read a file in your sandbox. Paths are relative to /workspace or absolute. Text files are returned as text (long files are cut at 256 KiB; use offset and limit to read further). Images (.png, .jpg, .jpeg, .gif, .webp) are returned as images when the model supports them.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "File path, relative to /workspace or absolute"},
                "offset": {"type": "integer", "description": "1-based line to start from"},
                "limit": {"type": "integer", "description": "Number of lines to read"}
            }, "required": ["path"]}),
        ),
        spec(
            "write",
            "Create or overwrite a file in your sandbox with exactly the given content. Parent folders are created. The write is atomic.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "File path, relative to /workspace or absolute"},
                "content": {"type": "string", "description": "The complete file content"}
            }, "required": ["path", "content"]}),
        ),
        spec(
            "patch",
            "Replace one exact piece of text in a file. oldText must occur exactly once in the file (include surrounding lines to make it unique); it is replaced literally by newText.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "File path, relative to /workspace or absolute"},
                "oldText": {"type": "string", "description": "The exact text to replace; must occur exactly once"},
                "newText": {"type": "string", "description": "The replacement text"}
            }, "required": ["path", "oldText", "newText"]}),
        ),
        spec(
            "exec",
            "Run a shell command (sh -c) in /workspace in your sandbox. Returns the exit code, stdout and stderr (long output is cut in the middle). Tools on your PATH (/tools/bin) are run this way too, also from scripts and loops.",
            json!({"type": "object", "properties": {
                "command": {"type": "string", "description": "The shell command"},
                "timeout": {"type": "integer", "description": "Timeout in seconds (default 900)"}
            }, "required": ["command"]}),
        ),
    ]
}

pub(crate) use beige_client::tools::{
    ContentBlock, CoreToolCall, ToolContext, ToolOutcome, ToolOutput,
};

/// Run a core tool in the agent's sandbox and format its result.
///
/// When `cancel` fires while an `exec` runs, its processes are killed in the sandbox
/// (SIGTERM, then SIGKILL) and the result says so. With `output`, an `exec`'s output is
/// also sent there while it runs, where the transport can. Every `exec` gets an id
/// (`exec_id`, or a fresh one), and `exec_env(id)` is added to its environment (the
/// egress placeholders made for it).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_core_tool(
    sandbox: &dyn Sandbox,
    agent: &str,
    limits: &AgentSandboxConfig,
    call: &CoreToolCall,
    ctx: &ToolContext,
    cancel: Option<&tokio_util::sync::CancellationToken>,
    output: Option<crate::sandbox::OutputSink>,
    exec_env: &(dyn Fn(&str) -> Vec<(String, String)> + Send + Sync),
    exec_id: Option<ExecId>,
) -> Result<ToolOutput, SandboxError> {
    let mut request = to_request(agent, limits, call, ctx);
    let exec_id = match &mut request {
        OpRequest::Exec(e) => {
            let id = exec_id.unwrap_or_else(ExecId::mint).as_str().to_string();
            e.env.extend(exec_env(&id));
            e.exec_id = Some(id.clone());
            Some(id)
        }
        _ => None,
    };
    let op = async {
        match (output, &request) {
            (Some(sink), OpRequest::Exec(_)) => {
                sandbox.run_op_streaming(agent, &request, sink).await
            }
            _ => sandbox.run_op(agent, &request).await,
        }
    };
    let (outcome, cancelled) = match (cancel, exec_id) {
        (Some(token), Some(id)) => {
            tokio::pin!(op);
            tokio::select! {
                r = &mut op => (r, false),
                _ = token.cancelled() => {
                    let kill = OpRequest::Kill(beige_protocol::op::KillRequest { exec_id: id });
                    if let Err(e) = sandbox.run_op(agent, &kill).await {
                        tracing::warn!(agent, error = %e, "could not kill a cancelled exec");
                    }
                    (op.await, true)
                }
            }
        }
        _ => (op.await, false),
    };
    let OpOutcome {
        reply,
        restarted,
        transport,
    } = outcome?;
    let mut out = format_reply(call, &request, reply, ctx);
    out.transport = Some(transport);
    if cancelled {
        out.is_error = true;
        out.content.insert(
            0,
            ContentBlock::Text {
                text: "[beige] Cancelled by the user: the command and every process it started were killed.".into(),
            },
        );
    }
    if let Some(notice) = restarted {
        out.content.insert(
            0,
            ContentBlock::Text {
                text: notice.message(),
            },
        );
    }
    Ok(out)
}

/// The operation a core tool call becomes in `agent`'s sandbox, with the agent's
/// sandbox limits applied (what [`Sandbox::run_op`](crate::Sandbox::run_op) is given).
pub fn to_request(
    agent: &str,
    limits: &AgentSandboxConfig,
    call: &CoreToolCall,
    ctx: &ToolContext,
) -> OpRequest {
    match call {
        CoreToolCall::Read(p) => OpRequest::Read(ReadRequest {
            path: p.path.clone(),
            offset: p.offset,
            limit: p.limit,
            max_bytes: DEFAULT_READ_MAX_BYTES,
            images: ctx.model_accepts_images,
            max_image_bytes: DEFAULT_IMAGE_MAX_BYTES,
        }),
        CoreToolCall::Write(p) => OpRequest::Write(WriteRequest {
            path: p.path.clone(),
            content: p.content.clone(),
        }),
        CoreToolCall::Patch(p) => OpRequest::Patch(PatchRequest {
            path: p.path.clone(),
            old_text: p.old_text.clone(),
            new_text: p.new_text.clone(),
        }),
        CoreToolCall::Exec(p) => {
            let mut env = vec![("BEIGE_AGENT_NAME".to_string(), agent.to_string())];
            let fields = [
                ("BEIGE_CHANNEL", &ctx.channel),
                ("BEIGE_SESSION_KEY", &ctx.session_key),
                ("BEIGE_CHAT_ID", &ctx.chat_id),
                ("BEIGE_THREAD_ID", &ctx.thread_id),
            ];
            for (k, v) in fields {
                if let Some(v) = v {
                    env.push((k.to_string(), v.clone()));
                }
            }
            OpRequest::Exec(ExecRequest {
                command: p.command.clone(),
                timeout_secs: exec_timeout(p.timeout, limits.max_exec_timeout),
                env,
                cwd: None,
                max_output_bytes: limits.exec_output_limit,
                exec_id: None,
                raw_output: true,
            })
        }
    }
}

/// `timeout` (seconds; absent or 0 → 900) capped by `max`.
pub(crate) fn exec_timeout(requested: Option<u64>, max: u64) -> u64 {
    let t = match requested {
        None | Some(0) => DEFAULT_EXEC_TIMEOUT_SECS,
        Some(t) => t,
    };
    t.min(max.max(1))
}

/// Turn the shim's reply into what the model reads.
pub(crate) fn format_reply(
    call: &CoreToolCall,
    request: &OpRequest,
    reply: OpReply,
    ctx: &ToolContext,
) -> ToolOutput {
    match (call, reply) {
        (_, OpReply::Error(e)) => ToolOutput::error(e.message),
        (CoreToolCall::Read(p), OpReply::Read(r)) => format_read(&p.path, r, ctx),
        (CoreToolCall::Write(p), OpReply::Write(w)) => ToolOutput::text(format!(
            "Successfully wrote {} bytes to {}",
            w.bytes, p.path
        )),
        (CoreToolCall::Patch(p), OpReply::Patch(_)) => {
            ToolOutput::text(format!("Successfully patched {}", p.path))
        }
        (CoreToolCall::Exec(_), OpReply::Exec(e)) => {
            let (timeout, exec_id) = match request {
                OpRequest::Exec(r) => (r.timeout_secs, r.exec_id.as_deref()),
                _ => (0, None),
            };
            // The op's span (current here) records the command's exit code.
            crate::telemetry::annotate(
                &opentelemetry::Context::current(),
                vec![opentelemetry::KeyValue::new(
                    crate::telemetry::names::EXIT_CODE,
                    i64::from(e.exit_code.unwrap_or_else(|| 128 + e.signal.unwrap_or(9))),
                )],
            );
            format_exec(e, timeout, exec_id)
        }
        (call, other) => ToolOutput::error(format!(
            "Error: the sandbox answered `{}` with an unexpected reply ({other:?})",
            call.name()
        )),
    }
}

fn format_read(path: &str, reply: ReadReply, ctx: &ToolContext) -> ToolOutput {
    match reply {
        ReadReply::Text {
            content,
            total_lines,
            first_line,
            last_line,
            truncated,
        } => {
            if truncated {
                let next = last_line + 1;
                ToolOutput::text(format!(
                    "{content}\n\n[Output capped at {} KiB: showing lines {first_line}-{last_line} of {total_lines}. Continue with read {{\"path\": {path:?}, \"offset\": {next}, \"limit\": 2000}}.]",
                    DEFAULT_READ_MAX_BYTES / 1024
                ))
            } else if first_line > total_lines && total_lines > 0 && content.is_empty() {
                ToolOutput::error(format!(
                    "{path} has {total_lines} lines; offset {first_line} is past the end."
                ))
            } else {
                ToolOutput::text(content)
            }
        }
        ReadReply::Image {
            mime_type,
            data: Some(data),
            ..
        } if ctx.model_accepts_images => {
            ToolOutput::new(vec![ContentBlock::Image { data, mime_type }], false)
        }
        ReadReply::Image { bytes, .. } => {
            let model = ctx
                .model
                .as_deref()
                .map(|m| format!("the current model ({m})"))
                .unwrap_or_else(|| "the current model".to_string());
            ToolOutput::error(format!(
                "Cannot show the image {path} ({bytes} bytes): {model} does not accept image input. Switch to a vision-capable model (for example anthropic/claude-sonnet-4-6 or openai/gpt-4o) to look at images, or inspect the file with exec (e.g. `file {path}`)."
            ))
        }
        ReadReply::Binary { bytes } => ToolOutput::text(format!(
            "binary file, {bytes} bytes — not shown. Inspect it with exec, e.g. `file {path}` or `od -c {path} | head`."
        )),
    }
}

/// The text the model reads for an `exec`, built in one buffer: with the cap raised the
/// output can be megabytes.
fn format_exec(e: ExecReply, timeout_secs: u64, exec_id: Option<&str>) -> ToolOutput {
    let code = e.exit_code.unwrap_or_else(|| 128 + e.signal.unwrap_or(9));
    let is_error = e.timed_out || code != 0;
    let header = if e.timed_out {
        format!(
            "Error: timed out after {timeout_secs} s; the command and every process it started were killed. Output so far:"
        )
    } else {
        let mut line = format!("Exit code: {code}");
        if let (None, Some(sig)) = (e.exit_code, e.signal) {
            line.push_str(&format!(" (killed by signal {sig})"));
        }
        line
    };
    // The text is built in stdout's own buffer (the header goes in front), so megabytes
    // of output are moved within one allocation, not copied into a second one.
    let mut text = e.stdout;
    text.truncate(text.trim_end_matches('\n').len());
    // The shim's own marker line says "bytes omitted"; then no note is added.
    let stdout_marked = e.stdout_omitted > 0 && text.contains("bytes omitted");
    if text.is_empty() {
        text.push_str(&header);
    } else {
        text.insert_str(0, &format!("{header}\n"));
    }
    if e.stdout_omitted > 0 && !stdout_marked {
        text.push_str(&format!("\n[{} bytes of stdout omitted]", e.stdout_omitted));
    }
    let stderr = e.stderr.trim_end_matches('\n');
    if !stderr.is_empty() {
        text.reserve(stderr.len() + 1);
        text.push('\n');
        text.push_str(stderr);
    }
    if e.stderr_omitted > 0 && !stderr.contains("bytes omitted") {
        text.push_str(&format!("\n[{} bytes of stderr omitted]", e.stderr_omitted));
    }
    if let Some(note) = e
        .output_file
        .as_ref()
        .and_then(|f| output_file_note(f, exec_id?))
    {
        text.push('\n');
        text.push_str(&note);
    }
    if !e.survivors.is_empty() {
        let list = e
            .survivors
            .iter()
            .map(|s| format!("pid {} `{}`", s.pid, s.command))
            .collect::<Vec<_>>()
            .join(", ");
        text.push_str(&format!(
            "\n[beige] {} process(es) left the command's process group and are still running: {list}. They were not killed; end them with `kill <pid>` if they are not wanted.",
            e.survivors.len()
        ));
    }
    ToolOutput::new(vec![ContentBlock::Text { text }], is_error)
}

/// The line that tells the model where the whole output of a capped `exec` is. The
/// path comes from the gateway's own exec id, never from the sandbox's reply.
fn output_file_note(file: &beige_protocol::op::OutputFile, exec_id: &str) -> Option<String> {
    let id = exec_id;
    let path = format!("/workspace/{}", beige_protocol::op::exec_output_file(id));
    Some(match (&file.error, file.truncated) {
        (Some(why), _) if file.bytes == 0 => format!(
            "[beige] The output was cut to the exec output limit, and the whole output could not be kept: {why}"
        ),
        (Some(why), _) => format!(
            "[beige] The output was cut to the exec output limit; the first {} bytes of it are in {path} (then: {why}). Read on with `read` (offset, limit) or search it with exec (`grep -n PATTERN {path}`).",
            file.bytes
        ),
        (None, true) => format!(
            "[beige] The output was cut to the exec output limit; its first {} bytes (stdout and stderr as they came; the rest was not kept) are in {path}. Read on with `read` (offset, limit) or search it with exec (`grep -n PATTERN {path}`).",
            file.bytes
        ),
        (None, false) => format!(
            "[beige] The output was cut to the exec output limit; all of it ({} bytes, stdout and stderr as they came) is in {path}. Read on with `read` (offset, limit) or search it with exec (`grep -n PATTERN {path}`).",
            file.bytes
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_calls() {
        let c = CoreToolCall::parse(
            "patch",
            serde_json::json!({"path": "a", "oldText": "x", "newText": "y"}),
        )
        .unwrap();
        assert_eq!(c.name(), "patch");
        assert_eq!(c.params()["oldText"], "x");
        let e = CoreToolCall::parse("exec", serde_json::json!({"cmd": "ls"})).unwrap_err();
        assert!(e.message.contains("exec {command, timeout?}"), "{e}");
        let e = CoreToolCall::parse("rm", serde_json::json!({})).unwrap_err();
        assert!(e.message.contains("unknown core tool 'rm'"));
    }

    #[test]
    fn exec_timeouts() {
        assert_eq!(exec_timeout(None, 3600), 900);
        assert_eq!(exec_timeout(Some(0), 3600), 900);
        assert_eq!(exec_timeout(Some(5000), 3600), 3600);
        assert_eq!(exec_timeout(Some(2), 3600), 2);
    }

    #[test]
    fn exec_text_shape() {
        let r = ExecReply {
            exit_code: Some(3),
            signal: None,
            stdout: "out\n".into(),
            stderr: "err\n".into(),
            stdout_omitted: 0,
            stderr_omitted: 0,
            timed_out: false,
            duration_ms: 1,
            survivors: Vec::new(),
            output_file: None,
        };
        let out = format_exec(r.clone(), 10, None);
        assert_eq!(out.joined_text(), "Exit code: 3\nout\nerr");
        assert!(out.is_error);
        let ok = ExecReply {
            exit_code: Some(0),
            stderr: String::new(),
            ..r
        };
        let out = format_exec(ok.clone(), 10, None);
        assert_eq!(out.joined_text(), "Exit code: 0\nout");
        assert!(!out.is_error);
        let escaped = ExecReply {
            survivors: vec![beige_protocol::op::Survivor {
                pid: 42,
                command: "sleep 100".into(),
            }],
            ..ok
        };
        let text = format_exec(escaped.clone(), 10, None).joined_text();
        assert!(
            text.ends_with("still running: pid 42 `sleep 100`. They were not killed; end them with `kill <pid>` if they are not wanted."),
            "{text}"
        );
    }

    #[test]
    fn a_capped_exec_names_its_output_file_from_the_gateways_exec_id() {
        let capped = ExecReply {
            exit_code: Some(0),
            signal: None,
            stdout: "head\n[... 900 bytes omitted ...]\ntail\n".into(),
            stderr: String::new(),
            stdout_omitted: 900,
            stderr_omitted: 0,
            timed_out: false,
            duration_ms: 1,
            survivors: Vec::new(),
            output_file: Some(beige_protocol::op::OutputFile {
                bytes: 1000,
                truncated: false,
                error: None,
            }),
        };
        let text = format_exec(capped.clone(), 10, Some("x1abc")).joined_text();
        assert!(
            text.ends_with("all of it (1000 bytes, stdout and stderr as they came) is in /workspace/.beige/out/x1abc.log. Read on with `read` (offset, limit) or search it with exec (`grep -n PATTERN /workspace/.beige/out/x1abc.log`)."),
            "{text}"
        );
        assert!(!text.contains("bytes of stdout omitted"), "{text}");
        // No exec id of the gateway's own: no path is named.
        let text = format_exec(capped.clone(), 10, None).joined_text();
        assert!(!text.contains(".beige/out"), "{text}");
        let failed = ExecReply {
            output_file: Some(beige_protocol::op::OutputFile {
                bytes: 0,
                truncated: false,
                error: Some(
                    "cannot create /workspace/.beige/out/x1abc.log: No space left on device".into(),
                ),
            }),
            ..capped
        };
        let text = format_exec(failed, 10, Some("x1abc")).joined_text();
        assert!(text.ends_with("the whole output could not be kept: cannot create /workspace/.beige/out/x1abc.log: No space left on device"), "{text}");
    }

    #[test]
    fn image_without_vision_names_model() {
        let ctx = ToolContext {
            model: Some("ollama/llama3.1:8b".into()),
            ..Default::default()
        };
        let out = format_read(
            "a.png",
            ReadReply::Image {
                mime_type: "image/png".into(),
                bytes: 10,
                data: None,
            },
            &ctx,
        );
        assert!(out.is_error);
        assert!(out.joined_text().contains("ollama/llama3.1:8b"));
        assert!(out.joined_text().contains("vision-capable"));
    }
}
