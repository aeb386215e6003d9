//! The command-line grammar (clap derive): global options and the command tree.
//!
//! Owns names, flags and help texts only; what a command does lives in [`crate::cmd`].

use std::path::PathBuf;

use clap::{ArgAction, Args, Parser, Subcommand};
use clap_complete::Shell;

/// Where commands that talk to a running gateway find it when neither `--gateway` nor the
/// config says otherwise.
pub const DEFAULT_GATEWAY_URL: &str = "http://127.0.0.1:7433";

/// beige: a secure self-hosted gateway that runs AI agents in Docker sandboxes.
#[derive(Debug, Parser)]
#[command(
    name = "beige",
    version,
    disable_version_flag = true,
    after_help = "Environment:\n  BEIGE_HOME  where beige keeps its config, token, data and logs [default: ~/.beige]\n  RUST_LOG    log filter when --log-level is not given\n\nStart with `beige demo` (offline, no API key), then `beige setup` and `beige gateway start`."
)]
pub struct Cli {
    /// Config file [default: <BEIGE_HOME>/config.json5]
    #[arg(short, long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// URL of the running gateway [default: gateway.host/port of the config, else
    /// http://127.0.0.1:7433]
    #[arg(short, long, global = true, value_name = "URL")]
    pub gateway: Option<String>,

    /// Log filter, e.g. info or beige_core=debug [default: $RUST_LOG, else warn]
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Print the version
    #[arg(short = 'v', long, action = ArgAction::Version)]
    version: Option<bool>,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create BEIGE_HOME, a commented default config.json5 and the API token (never
    /// overwrites anything)
    Setup,
    /// Start, stop, restart and watch the gateway daemon
    Gateway {
        #[command(subcommand)]
        command: Option<GatewayCommand>,
    },
    /// Send one message to an agent through the running gateway and stream the answer
    #[command(
        after_help = "Exit codes:\n  0    the agent answered\n  1    the prompt failed (the message says why and what to do)\n  2    wrong usage\n  3    the gateway is not running\n  4    no such agent\n  130  cancelled with Ctrl+C"
    )]
    Run(RunArgs),
    /// Run a command in an agent's sandbox through the gateway (a core `exec`, checked by
    /// policy and audited like the model's own calls)
    #[command(
        after_help = "The exit code is the command's own exit code (1 when the call itself failed).\n\nExample:\n  beige exec assistant -- ls -la /workspace"
    )]
    Exec(ExecArgs),
    /// List an agent's sessions
    Sessions(SessionsArgs),
    /// Tokens and cost of the model calls in the gateway's ledger, by agent, session,
    /// model or day
    #[command(
        after_help = "Examples:\n  beige usage\n  beige usage --agent assistant --since 7d --by day\n  beige usage --by model --json"
    )]
    Usage(UsageArgs),
    /// Prompts and execs on a timetable: add, list, show, pause, resume, cancel, run now,
    /// and each schedule's history
    Schedule {
        #[command(subcommand)]
        command: Option<ScheduleCommand>,
    },
    /// Install, list, remove and update plugins (external plugins and command tools)
    Plugins {
        #[command(subcommand)]
        command: Option<crate::cmd::plugins::PluginsCommand>,
    },
    /// Read the audit log (every tool call, who allowed it and how it ended)
    Audit {
        #[command(subcommand)]
        command: Option<AuditCommand>,
    },
    /// Check a config file or print its JSON Schema
    Config {
        #[command(subcommand)]
        command: Option<ConfigCommand>,
    },
    /// Check Docker, images, the shim, the config, the port and BEIGE_HOME; prints what is
    /// wrong and how to fix it
    Doctor(DoctorArgs),
    /// Dry-run an agent's egress rules: would the gateway let its sandbox reach a URL?
    Egress {
        #[command(subcommand)]
        command: Option<EgressCommand>,
    },
    /// Dry-run an agent's rules (`agents.<a>.policy`): would a tool call be allowed, need
    /// approval or be refused?
    Policy {
        #[command(subcommand)]
        command: Option<PolicyCommand>,
    },
    /// Users and their personal API tokens (a shared gateway: roles per agent)
    Users {
        #[command(subcommand)]
        command: Option<crate::cmd::users::UsersCommand>,
    },
    /// The gateway's state: copy this home's database into PostgreSQL
    Store {
        #[command(subcommand)]
        command: Option<crate::cmd::store::StoreCommand>,
    },
    /// MCP: list an agent's MCP servers and tools; serve its tools to an MCP client (Claude Code, Codex, editors)
    Mcp {
        #[command(subcommand)]
        command: Option<crate::cmd::mcp::McpCommand>,
    },
    /// The offline demonstration: one agent in a real Docker sandbox, driven by a scripted
    /// model (no API key, no network, no daemon)
    #[command(
        after_help = "Needs a Docker engine, the test image (scripts/setup-docker) and the static shim\n(scripts/build-shim). With ANTHROPIC_API_KEY or OPENAI_API_KEY set, a real model answers the\nsame prompt instead of the scripted one.\n\nEnvironment:\n  BEIGE_TEST_IMAGE  sandbox image [default: beige-test-busybox:latest]\n  BEIGE_SHIM        the static shim [default: next to beige, else target/shim/beige-shim]"
    )]
    Demo,
    /// Start the terminal UI against the running gateway
    Tui {
        /// The agent to talk to [default: the first configured]
        agent: Option<String>,
    },
    /// Print a shell completion script
    #[command(
        after_help = "Example:\n  beige completions bash > ~/.local/share/bash-completion/completions/beige"
    )]
    Completions {
        /// The shell to complete for
        shell: Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum GatewayCommand {
    /// Start the gateway as a background daemon (or in this terminal with --foreground)
    #[command(
        after_help = "Checks Docker and the config first, starts the daemon with its output in\n<BEIGE_HOME>/logs/gateway.log, waits until /api/health answers (showing the startup log)\nand prints the pid, the URL and the log path."
    )]
    Start {
        /// Run in this terminal instead of as a daemon (logs to stderr; Ctrl+C stops)
        #[arg(short = 'F', long)]
        foreground: bool,
        /// Seconds to wait for the gateway to answer (0 = no limit)
        #[arg(long, value_name = "S", default_value_t = 60.0)]
        timeout: f64,
        /// Set by `gateway start` for the daemon it starts: write the log to this file,
        /// rotating it by size while running
        #[arg(long, value_name = "PATH", hide = true, requires = "foreground")]
        log_file: Option<std::path::PathBuf>,
        /// With --log-file: rotate at this many bytes (0 = never)
        #[arg(long, value_name = "BYTES", hide = true, default_value_t = 10 * 1024 * 1024)]
        log_max_size: u64,
        /// With --log-file: rotated files kept
        #[arg(long, value_name = "N", hide = true, default_value_t = 5)]
        log_max_files: u32,
    },
    /// Stop the daemon gracefully (running prompts get up to 10 s), wait for it to exit
    Stop {
        /// Seconds to wait for the daemon to exit before giving up
        #[arg(long, value_name = "S", default_value_t = 30.0)]
        timeout: f64,
    },
    /// Reload config and plugins in place; sessions survive, a broken config is reported
    /// and the gateway keeps running with the old one
    Restart,
    /// Whether the gateway runs: pid, version, uptime, agents (exit 3 when stopped)
    Status,
    /// Print the gateway log
    Logs {
        /// Keep printing new lines as they are written (across rotation)
        #[arg(short, long)]
        follow: bool,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The agent to talk to
    pub agent: String,
    /// The message (several words are joined with spaces)
    #[arg(required = true, num_args = 1.., value_name = "MESSAGE")]
    pub message: Vec<String>,
    /// Session key: the same key continues the same conversation
    /// [default: cli:AGENT:default]
    #[arg(short, long, value_name = "KEY")]
    pub session: Option<String>,
    /// Print every event as one JSON object per line instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The agent whose sandbox runs the command
    pub agent: String,
    /// The command and its arguments (after `--`), run by `sh -c` in /workspace
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    pub command: Vec<String>,
    /// Seconds before the command is killed [default: 900, capped by the config]
    #[arg(long, value_name = "S")]
    pub timeout: Option<u64>,
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Only this agent's model calls
    #[arg(long, value_name = "AGENT")]
    pub agent: Option<String>,
    /// Only calls in this time back from now: a number and d, h, m or s (7d)
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// One row per agent, session, model or day (UTC)
    #[arg(long, value_name = "GROUP", default_value = "agent", value_parser = parse_by)]
    pub by: beige_core::api::usage::UsageGroupBy,
    /// Print the report as JSON (the answer of GET /api/usage)
    #[arg(long)]
    pub json: bool,
}

fn parse_by(s: &str) -> Result<beige_core::api::usage::UsageGroupBy, String> {
    s.parse()
}

#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// The agent whose sessions to list
    pub agent: String,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule that prompts AGENT or runs a command in its sandbox
    #[command(
        after_help = "Examples:\n  beige schedule add assistant --cron '0 8 * * 1-5' --tz Europe/Berlin --prompt 'Summarise yesterday.' --deliver telegram:123456789\n  beige schedule add intern --at 2026-12-24T18:00:00+01:00 --exec 'python tools/clean.py'"
    )]
    Add(ScheduleAddArgs),
    /// List the schedules: id, agent, state, timing, next fire, last status
    List {
        /// Only this agent's schedules
        #[arg(long, value_name = "AGENT")]
        agent: Option<String>,
        /// Print JSON (the answer of GET /api/schedules)
        #[arg(long)]
        json: bool,
    },
    /// Show one schedule
    Get {
        /// The schedule's id
        id: String,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// The latest runs of a schedule, newest first
    History {
        /// The schedule's id
        id: String,
        /// How many runs
        #[arg(short = 'n', long, value_name = "N", default_value_t = 20)]
        lines: usize,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Stop a schedule from firing until it is resumed
    Pause {
        /// The schedule's id
        id: String,
    },
    /// Let a paused schedule fire again, from the next instant after now
    Resume {
        /// The schedule's id
        id: String,
    },
    /// Cancel a schedule for good (its history is kept; config schedules can only be paused)
    Cancel {
        /// The schedule's id
        id: String,
    },
    /// Fire a schedule once now, outside its timetable
    Run {
        /// The schedule's id
        id: String,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("timing").required(true).args(["cron", "at"])))]
#[command(group(clap::ArgGroup::new("work").required(true).args(["prompt", "exec"])))]
pub struct ScheduleAddArgs {
    /// The agent it runs as (with the agent's rights at fire time)
    pub agent: String,
    /// A cron expression: 5 fields, or @hourly, @daily, @weekly, @monthly
    #[arg(long, value_name = "EXPR")]
    pub cron: Option<String>,
    /// The IANA time zone of --cron [default: the host's]
    #[arg(long, value_name = "TZ", requires = "cron")]
    pub tz: Option<String>,
    /// Fire once at this instant (RFC 3339, with its offset)
    #[arg(long, value_name = "ISO")]
    pub at: Option<String>,
    /// Prompt the agent with this text
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Run this command in the agent's sandbox (no model)
    #[arg(long, value_name = "CMD")]
    pub exec: Option<String>,
    /// Reuse one named session for every run [default: a new session per run]
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// Where results go: CHANNEL:CHAT (telegram:123456789) or events [default: a report to the agent's owner when a run is not ok]
    #[arg(long, value_name = "TARGET")]
    pub deliver: Option<String>,
    /// Narrow the run to these of the agent's tools (repeatable)
    #[arg(long = "tool", value_name = "TOOL")]
    pub tools: Vec<String>,
    /// Print the new schedule as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Print the last records of <BEIGE_HOME>/logs/audit.jsonl, one line per finished call
    #[command(
        after_help = "Line format:\n  <time> ✓|✗ <CORE|TOOL> <agent>/<tool> <args> → <outcome> (<duration>)\n\n`✗` marks a call that was denied or failed."
    )]
    Tail {
        /// Keep printing new records as they are written (across rotation)
        #[arg(short, long)]
        follow: bool,
        /// Only this agent's calls
        #[arg(short, long, value_name = "AGENT")]
        agent: Option<String>,
        /// Only this session's records (its key, e.g. telegram:42)
        #[arg(long, value_name = "KEY")]
        session: Option<String>,
        /// With --session: its sub-agents' records too (`spawn`), at any depth
        #[arg(long, requires = "session")]
        tree: bool,
        /// How many calls to print first
        #[arg(short = 'n', long, value_name = "N", default_value_t = 20)]
        lines: usize,
        /// Print the raw JSON records
        #[arg(long)]
        json: bool,
    },
    /// Check the audit log's hash chain and signed checkpoints offline; names the first
    /// changed, deleted, reordered or forged record
    #[command(
        after_help = "Exit status: 0 intact, 1 tampered, 2 unreadable or bad usage.\n\nExamples:\n  beige audit verify\n  beige audit verify --pubkey ~/audit.pub copy/audit.jsonl.2 copy/audit.jsonl.1 copy/audit.jsonl"
    )]
    Verify {
        /// Log files in seq order, oldest first [default: <BEIGE_HOME>/logs/audit.jsonl.N
        /// … .1, then audit.jsonl, checked against the head the gateway stored]
        files: Vec<PathBuf>,
        /// The public key (base64, as `beige audit pubkey` prints it) [default:
        /// <BEIGE_HOME>/keys/audit_ed25519.pub; keep a copy off the host]
        #[arg(long, value_name = "FILE")]
        pubkey: Option<PathBuf>,
        /// Print the report as JSON ({ok, firstBad: {file, line, seq, reason}, range,
        /// records, checkpoints, warnings})
        #[arg(long)]
        json: bool,
    },
    /// Print the public key that verifies the audit log's checkpoints
    Pubkey,
    /// Export the audit log offline: as stored (jsonl), as OCSF 1.3 events or as OTLP logs
    #[command(
        after_help = "Reads <BEIGE_HOME>/logs/audit.jsonl.N … .1, then audit.jsonl (oldest first); no gateway\nneeded. A line that is not a record (torn, edited) is skipped with a warning naming\nfile:line; a summary goes to stderr.\n\nOCSF: tool calls are API Activity (6003), exec Process Activity (1007), egress Network\n(4001) or, when inspected, HTTP Activity (4002); denials and security.* events Detection\nFindings (2004); the rest as docs/audit.md says. OTLP: one ExportLogsServiceRequest\n(OTLP/JSON) per 512 records, one per line, or POSTed with --endpoint.\n\nExamples:\n  beige audit export --format ocsf --since 24h > audit.ocsf.jsonl\n  beige audit export --format jsonl --agent intern --since 2026-11-30T00:00:00Z\n  beige audit export --format otlp --endpoint http://127.0.0.1:4318"
    )]
    Export {
        /// The output form
        #[arg(long, value_enum, value_name = "FORMAT")]
        format: ExportFormat,
        /// Only records from this time on: RFC 3339 (2026-11-30T08:00:00Z) or a duration back
        /// from now (30m, 24h, 7d)
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// Only this agent's records
        #[arg(short, long, value_name = "AGENT")]
        agent: Option<String>,
        /// With --format otlp: POST each batch to this OTLP/HTTP collector (http:// or https://;
        /// /v1/logs is appended when the URL has no path) instead of printing it
        #[arg(long, value_name = "URL", conflicts_with = "output")]
        endpoint: Option<String>,
        /// Write to this file (created with mode 0600, replaced if it exists) instead of stdout
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

/// `beige audit export --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// The stored lines as they are
    Jsonl,
    /// One OCSF 1.3 event per line
    Ocsf,
    /// OTLP/JSON logs: one ExportLogsServiceRequest per batch, per line
    Otlp,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load and validate a config file; prints warnings and a summary
    Validate {
        /// The file to check [default: --config, else <BEIGE_HOME>/config.json5]
        path: Option<PathBuf>,
    },
    /// Print the JSON Schema of config.json5
    Schema,
}

#[derive(Debug, Subcommand)]
pub enum EgressCommand {
    /// Would the gateway let AGENT's sandbox reach URL? The agent's rules decide, then each
    /// address of the host is classified (a dry run: nothing is sent to the host)
    #[command(
        visible_alias = "check",
        after_help = "URL forms:\n  https://host[:port][/path]  a CONNECT to host:port (default 443); only the connection is decided\n  http://host[:port][/path]   plain HTTP (default port 80); the request (GET, or --method) is decided too\n  host[:port]                 a CONNECT to host:port (default 443)\n\nNothing is sent to the host. Without --no-resolve the host's name is looked up with this\nmachine's resolver, which may differ from the gateway's.\n\nExit codes:\n  0  the gateway would allow it\n  1  the gateway would refuse it\n  2  wrong usage, a config that does not load, or no such agent\n\nExample:\n  beige egress test intern https://pypi.org/simple/requests/"
    )]
    Test(EgressTestArgs),
}

#[derive(Debug, Args)]
pub struct EgressTestArgs {
    /// The agent whose rules decide
    pub agent: String,
    // The brackets are the help text's, not doc links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Where to: https://host[:port]/path, http://host[:port]/path or host:port
    pub url: String,
    /// The method of a plain http:// request
    #[arg(short = 'X', long, value_name = "METHOD", default_value = "GET")]
    pub method: String,
    /// Decide with the rules only; do not look up the host's addresses
    #[arg(long)]
    pub no_resolve: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Also show what this agent's system prompt tells it about its tools and skills
    #[arg(short, long, value_name = "AGENT")]
    pub agent: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// What AGENT's policy decides on one call, without running it: the verdict, the
    /// reason, every rule that matches and the grant that lifted an ask
    #[command(
        after_help = "TOOL is a core tool (exec, read, write, patch) or a plugin tool. exec takes the\ncommand line (several words are joined and quoted like `beige exec`); read, write and\npatch take the path; a plugin tool takes its arguments.\n\nOutput lines (stable):\n  verdict: allow|ask|deny\n  reason: <the reason the caller would see>\n  rule: <id> <decision> '<simple command>'[: <justification>]   (one per matching rule)\n  grant: <id> <tool> <pattern> granted by <who>               (when a grant lifted an ask)\n\nExit codes:\n  0   allow\n  1   deny\n  2   ask (also clap's own usage errors)\n  4   no such agent\n  78  the config does not load\n\nExamples:\n  beige policy check intern -- exec 'git push -f origin'\n  beige policy check intern -- gh pr merge 41\n  beige policy check intern --cwd /workspace/deploy -- exec make"
    )]
    Check(PolicyCheckArgs),
    /// Print AGENT's rules and config grants
    List {
        /// The agent whose policy to print
        agent: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct PolicyCheckArgs {
    /// The agent whose policy decides
    pub agent: String,
    /// The tool and its arguments (after `--`)
    #[arg(last = true, required = true, num_args = 1.., value_name = "TOOL ARGS")]
    pub call: Vec<String>,
    /// The working folder of the call [default: /workspace]
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Print one JSON object instead of lines
    #[arg(long)]
    pub json: bool,
}
