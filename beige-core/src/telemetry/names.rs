//! Every span and attribute name the gateway exports, in one place. The `gen_ai.*`
//! names follow the OpenTelemetry GenAI semantic conventions, which are still in
//! development: a snapshot test pins this list, so a rename is a visible change.

/// The root span of a turn: `invoke_agent <agent>`.
pub const SPAN_TURN: &str = "invoke_agent";
/// A model call: `chat <model>`.
pub const SPAN_CHAT: &str = "chat";
/// A tool call, by the model or by a script: `execute_tool <tool>`.
pub const SPAN_TOOL: &str = "execute_tool";
/// The time a call waited for a person's decision.
pub const SPAN_APPROVAL_WAIT: &str = "beige.approval.wait";
/// An operation in the sandbox: `beige.sandbox.op <op>`.
pub const SPAN_SANDBOX_OP: &str = "beige.sandbox.op";

/// `gen_ai.operation.name`: `invoke_agent`, `chat` or `execute_tool`.
pub const OPERATION: &str = "gen_ai.operation.name";
/// `gen_ai.agent.name`: the agent's configured name.
pub const AGENT_NAME: &str = "gen_ai.agent.name";
/// `gen_ai.conversation.id`: the session's random id, never its key.
pub const CONVERSATION_ID: &str = "gen_ai.conversation.id";
/// `gen_ai.provider.name`: the configured provider.
pub const PROVIDER: &str = "gen_ai.provider.name";
/// `gen_ai.request.model`: the model asked.
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
/// `gen_ai.usage.input_tokens`.
pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// `gen_ai.usage.output_tokens`.
pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// `gen_ai.tool.name`.
pub const TOOL_NAME: &str = "gen_ai.tool.name";
/// `gen_ai.tool.call.id`: the model's id of the call.
pub const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";

/// `beige.channel`: where the prompt came from (`api`, `telegram`, …).
pub const CHANNEL: &str = "beige.channel";
/// `beige.principal`: who the prompt or call acts for.
pub const PRINCIPAL: &str = "beige.principal";
/// `beige.usage.cache_read_tokens`.
pub const CACHE_READ_TOKENS: &str = "beige.usage.cache_read_tokens";
/// `beige.usage.cache_write_tokens`.
pub const CACHE_WRITE_TOKENS: &str = "beige.usage.cache_write_tokens";
/// `beige.tool.kind`: `core` or `plugin`.
pub const TOOL_KIND: &str = "beige.tool.kind";
/// `beige.decision`: `ran`, `denied` or `failed`.
pub const DECISION: &str = "beige.decision";
/// `beige.transport`: how the sandbox op travelled (`link`, `docker_exec`, …).
pub const TRANSPORT: &str = "beige.transport";
/// `beige.exit_code`.
pub const EXIT_CODE: &str = "beige.exit_code";
/// `beige.exec.id`: the exec a sandbox op or a script's call belongs to.
pub const EXEC_ID: &str = "beige.exec.id";
/// `beige.outcome`: how a turn ended (`done`, `blocked`, `failed`, `cancelled`).
pub const OUTCOME: &str = "beige.outcome";
/// `beige.prompt`: the prompt text, only with `telemetry.otlp.capture.prompts`.
pub const PROMPT: &str = "beige.prompt";
/// `beige.tool.args`: a call's arguments, only with `telemetry.otlp.capture.toolArgs`.
pub const TOOL_ARGS: &str = "beige.tool.args";

/// Every name above, for the snapshot test.
pub const ALL: &[&str] = &[
    SPAN_TURN,
    SPAN_CHAT,
    SPAN_TOOL,
    SPAN_APPROVAL_WAIT,
    SPAN_SANDBOX_OP,
    OPERATION,
    AGENT_NAME,
    CONVERSATION_ID,
    PROVIDER,
    REQUEST_MODEL,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    TOOL_NAME,
    TOOL_CALL_ID,
    CHANNEL,
    PRINCIPAL,
    CACHE_READ_TOKENS,
    CACHE_WRITE_TOKENS,
    TOOL_KIND,
    DECISION,
    TRANSPORT,
    EXIT_CODE,
    EXEC_ID,
    OUTCOME,
    PROMPT,
    TOOL_ARGS,
];
