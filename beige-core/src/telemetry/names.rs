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
/// A stream a sandbox opened through the gateway's egress, under the exec it is
/// attributed to.
pub const SPAN_EGRESS: &str = "beige.egress.request";

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
/// `server.address`: an egress stream's target host.
pub const SERVER_ADDRESS: &str = "server.address";
/// `server.port`: its port.
pub const SERVER_PORT: &str = "server.port";
/// `beige.egress.mode`: `tunnel` or `inspect`.
pub const EGRESS_MODE: &str = "beige.egress.mode";
/// `beige.rule_id`: the rule that allowed or refused the call or stream.
pub const RULE_ID: &str = "beige.rule_id";
/// `beige.egress.reason`: why a stream was refused.
pub const EGRESS_REASON: &str = "beige.egress.reason";
/// `beige.egress.bytes_up` / `bytes_down`: what the stream carried.
pub const EGRESS_BYTES_UP: &str = "beige.egress.bytes_up";
/// See [`EGRESS_BYTES_UP`].
pub const EGRESS_BYTES_DOWN: &str = "beige.egress.bytes_down";
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
    SPAN_EGRESS,
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
    SERVER_ADDRESS,
    SERVER_PORT,
    EGRESS_MODE,
    RULE_ID,
    EGRESS_REASON,
    EGRESS_BYTES_UP,
    EGRESS_BYTES_DOWN,
    OUTCOME,
    PROMPT,
    TOOL_ARGS,
];
