//! The built-in `schedule` tool: an agent makes and manages **its own** schedules
//! (`schedule add|list|get|history|pause|resume|cancel|test`, platform.md §1.4).
//!
//! Owns the command line, the limits of `pluginConfigs.schedule` (how many schedules an
//! agent keeps, the shortest cron interval, the most fires a day, whether it may schedule
//! execs) and the rendering. Identity is the connection's: a schedule is always made for
//! the calling agent, its author is the exec and session the kernel attributed the call
//! to, `--deliver here` means the chat of that session, and a schedule the agent did not
//! make answers exactly like a missing one. Validation, firing and history are the
//! gateway's schedule engine, reached through [`GatewaySlot`]; policy, approvals, budgets
//! and audit ran before the handler, so a rule `{tool: "schedule", pattern: ["add"],
//! decision: "ask"}` puts a human before every schedule an agent makes. A prompt file
//! (`--prompt-file PATH`) is read by the shim in the sandbox and arrives as stdin.

use std::sync::Arc;

use async_trait::async_trait;
use beige_client::schedules::{
    ChatTarget, Deliver, EventsTarget, ScheduleAuthor, ScheduleRun, ScheduleSpec, ScheduleState,
    ScheduleView,
};
use serde::Deserialize;

use crate::gateway::{Admin as _, GatewaySlot, LocalGateway};
use crate::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use crate::schedule::cron::CronSpec;

/// The plugin and tool name.
pub(crate) const NAME: &str = "schedule";

/// What a schedule the agent did not make, or that does not exist, answers.
const NOT_FOUND: &str =
    "schedule: no such schedule of this agent; `schedule list` shows its schedules\n";

const USAGE: &str = "Usage:
  schedule add (--cron EXPR [--tz ZONE] | --at ISO) (--prompt TEXT | --prompt-file PATH | --exec CMD)
               [--session NAME] [--deliver here|events] [--tool NAME]... [--json]
      a schedule of this agent: a prompt (a new session per run, or --session NAME) or a
      command in this sandbox, on a cron expression in a time zone or once at an instant
  schedule list [--json]              this agent's schedules
  schedule get <id> [--json]          one of them
  schedule history <id> [-n 20] [--json]
                                      its latest runs, newest first
  schedule pause|resume|cancel <id>   stop, restart or end one this agent made
  schedule test <id>                  fire it once now
  schedule help";

/// `pluginConfigs.schedule`: the limits of what one agent may schedule.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Limits {
    /// Schedules the agent may keep (active or paused) at once.
    #[serde(default = "default_max_schedules")]
    max_schedules_per_agent: usize,
    /// The shortest time between two fires of a cron the agent makes.
    #[serde(default = "default_min_interval")]
    min_interval_seconds: u64,
    /// The most fires one schedule may have in a day.
    #[serde(default = "default_max_runs_per_day")]
    max_runs_per_day: u64,
    /// Whether the agent may schedule commands (`--exec`), not only prompts.
    #[serde(default = "default_allow_exec")]
    allow_exec: bool,
}

fn default_max_schedules() -> usize {
    20
}
fn default_min_interval() -> u64 {
    300
}
fn default_max_runs_per_day() -> u64 {
    100
}
fn default_allow_exec() -> bool {
    true
}

impl Limits {
    fn from_config(config: &serde_json::Value) -> Result<Self, ToolError> {
        if config.is_null() {
            return serde_json::from_value(serde_json::json!({}))
                .map_err(|e| ToolError::Failed(e.to_string()));
        }
        serde_json::from_value(config.clone()).map_err(|e| {
            ToolError::Failed(format!(
                "pluginConfigs.schedule is not valid ({e}); it takes maxSchedulesPerAgent, minIntervalSeconds, maxRunsPerDay and allowExec"
            ))
        })
    }
}

/// The built-in `schedule` plugin. Enable it with `plugins: { schedule: {} }` and give
/// agents the tool with `tools: ["schedule"]`.
#[derive(Debug)]
pub(crate) struct SchedulePlugin {
    gateway: GatewaySlot,
}

impl SchedulePlugin {
    /// The plugin, reaching the gateway through `gateway`.
    pub(crate) fn new(gateway: GatewaySlot) -> Self {
        Self { gateway }
    }
}

#[async_trait]
impl Plugin for SchedulePlugin {
    fn name(&self) -> &str {
        NAME
    }

    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(ScheduleTool {
            gateway: self.gateway.clone(),
        }))
    }
}

/// The `schedule` tool.
#[derive(Debug)]
struct ScheduleTool {
    gateway: GatewaySlot,
}

/// One parsed command line.
#[derive(Debug, PartialEq)]
enum Command {
    Help,
    Add(AddArgs),
    List { json: bool },
    Get { id: String, json: bool },
    History { id: String, n: usize, json: bool },
    Pause(String),
    Resume(String),
    Cancel(String),
    Test(String),
}

#[derive(Debug, Default, PartialEq)]
struct AddArgs {
    cron: Option<String>,
    tz: Option<String>,
    at: Option<String>,
    prompt: Option<String>,
    exec: Option<String>,
    session: Option<String>,
    deliver: Option<String>,
    tools: Vec<String>,
    json: bool,
}

fn usage(message: &str) -> String {
    format!("schedule: {message}\n{USAGE}\n")
}

impl Command {
    fn parse(args: &[String]) -> Result<Self, String> {
        let Some((sub, rest)) = args.split_first() else {
            return Ok(Self::Help);
        };
        let id_of = |rest: &[String]| -> Result<String, String> {
            match rest {
                [id] if !id.starts_with('-') => Ok(id.clone()),
                _ => Err(usage(&format!("`schedule {sub}` takes one schedule id"))),
            }
        };
        let json = rest.iter().any(|a| a == "--json");
        let plain: Vec<String> = rest.iter().filter(|a| *a != "--json").cloned().collect();
        match sub.as_str() {
            "help" | "--help" | "-h" => Ok(Self::Help),
            "add" => parse_add(rest).map(Self::Add),
            "list" => match plain.as_slice() {
                [] => Ok(Self::List { json }),
                _ => Err(usage("`schedule list` takes only --json")),
            },
            "get" => Ok(Self::Get {
                id: id_of(&plain)?,
                json,
            }),
            "history" => {
                let mut n = 20;
                let mut id = None;
                let mut it = plain.iter();
                while let Some(a) = it.next() {
                    match a.as_str() {
                        "-n" | "--lines" => {
                            n = it
                                .next()
                                .and_then(|v| v.parse::<usize>().ok())
                                .filter(|n| (1..=1000).contains(n))
                                .ok_or_else(|| usage("-n takes a number from 1 to 1000"))?;
                        }
                        s if !s.starts_with('-') && id.is_none() => id = Some(s.to_string()),
                        s => return Err(usage(&format!("unknown argument '{s}'"))),
                    }
                }
                let id = id.ok_or_else(|| usage("`schedule history` takes a schedule id"))?;
                Ok(Self::History { id, n, json })
            }
            "pause" => Ok(Self::Pause(id_of(rest)?)),
            "resume" => Ok(Self::Resume(id_of(rest)?)),
            "cancel" => Ok(Self::Cancel(id_of(rest)?)),
            "test" | "run" => Ok(Self::Test(id_of(rest)?)),
            other => Err(usage(&format!("unknown command '{other}'"))),
        }
    }
}

fn parse_add(args: &[String]) -> Result<AddArgs, String> {
    let mut out = AddArgs::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| usage(&format!("{name} needs a value")))
        };
        match flag {
            "--cron" => out.cron = Some(value("--cron")?),
            "--tz" => out.tz = Some(value("--tz")?),
            "--at" => out.at = Some(value("--at")?),
            "--prompt" => out.prompt = Some(value("--prompt")?),
            "--exec" => out.exec = Some(value("--exec")?),
            "--session" => out.session = Some(value("--session")?),
            "--deliver" => out.deliver = Some(value("--deliver")?),
            "--tool" => out.tools.push(value("--tool")?),
            "--json" => out.json = true,
            "--agent" => {
                return Err(usage(
                    "the schedule tool makes schedules for this agent only; there is no --agent",
                ))
            }
            other => return Err(usage(&format!("unknown option '{other}'"))),
        }
    }
    Ok(out)
}

#[async_trait]
impl Tool for ScheduleTool {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "This agent's schedules: prompt itself or run a command on a cron or once, and manage them."
    }

    fn commands(&self) -> Vec<String> {
        [
            "schedule add (--cron EXPR [--tz ZONE] | --at ISO) (--prompt TEXT | --prompt-file PATH | --exec CMD) [--session NAME] [--deliver here|events]",
            "schedule list [--json]",
            "schedule get <id> [--json]",
            "schedule history <id> [-n 20] [--json]",
            "schedule pause|resume|cancel <id>",
            "schedule test <id>",
        ]
        .map(String::from)
        .to_vec()
    }

    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        let command = match Command::parse(&call.args) {
            Ok(c) => c,
            Err(e) => return Ok(ToolResult::fail(e, 2)),
        };
        if command == Command::Help {
            return Ok(ToolResult::ok(format!(
                "{}\n\n{USAGE}\n",
                self.description()
            )));
        }
        let limits = Limits::from_config(&call.config)?;
        let gateway = self
            .gateway
            .get()
            .ok_or_else(|| ToolError::Failed("the gateway is not running".into()))?;
        let agent = call.session.agent.clone();
        match command {
            Command::Help => Ok(ToolResult::ok(USAGE.to_string())),
            Command::Add(args) => add(&gateway, &call, &limits, args).await,
            Command::List { json } => {
                let list = gateway
                    .schedules(Some(&agent))
                    .await
                    .map_err(|e| ToolError::Failed(format!("listing schedules failed: {e}")))?;
                let list: Vec<ScheduleView> =
                    list.into_iter().filter(|v| v.agent == agent).collect();
                if json {
                    return Ok(ToolResult::ok(to_json(&list)?));
                }
                if list.is_empty() {
                    return Ok(ToolResult::ok(
                        "No schedules. Make one with `schedule add`.\n".to_string(),
                    ));
                }
                Ok(ToolResult::ok(list.iter().map(line).collect::<String>()))
            }
            Command::Get { id, json } => {
                let Some(view) = own(&gateway, &agent, &id, false).await? else {
                    return Ok(ToolResult::fail(NOT_FOUND.to_string(), 1));
                };
                Ok(ToolResult::ok(if json {
                    to_json(&view)?
                } else {
                    line(&view)
                }))
            }
            Command::History { id, n, json } => {
                if own(&gateway, &agent, &id, false).await?.is_none() {
                    return Ok(ToolResult::fail(NOT_FOUND.to_string(), 1));
                }
                let runs = gateway
                    .schedule_history(&id, n)
                    .await
                    .map_err(|e| ToolError::Failed(format!("reading the history failed: {e}")))?;
                if json {
                    return Ok(ToolResult::ok(to_json(&runs)?));
                }
                if runs.is_empty() {
                    return Ok(ToolResult::ok(format!("{id} has not run yet.\n")));
                }
                Ok(ToolResult::ok(
                    runs.iter().map(run_line).collect::<String>(),
                ))
            }
            Command::Pause(id) | Command::Resume(id) | Command::Cancel(id) | Command::Test(id)
                if own(&gateway, &agent, &id, true).await?.is_none() =>
            {
                Ok(ToolResult::fail(NOT_FOUND.to_string(), 1))
            }
            Command::Pause(id) => change(gateway.pause_schedule(&id).await, "paused"),
            Command::Resume(id) => change(gateway.resume_schedule(&id).await, "resumed"),
            Command::Cancel(id) => change(gateway.cancel_schedule(&id).await, "cancelled"),
            Command::Test(id) => match gateway.run_schedule_now(&id).await {
                Ok(run) => Ok(ToolResult::ok(format!(
                    "SCHEDULE {id} fired now: run {}; `schedule history {id}` shows how it ends.\n",
                    run.id
                ))),
                Err(e) => Ok(ToolResult::fail(format!("schedule: {e}\n"), 1)),
            },
        }
    }
}

/// The schedule `id` of `agent`: `None` when it is missing, another agent's, or (with
/// `made_by_agent`) not one the agent made itself — told apart by nobody.
async fn own(
    gateway: &LocalGateway,
    agent: &str,
    id: &str,
    made_by_agent: bool,
) -> Result<Option<ScheduleView>, ToolError> {
    match gateway.schedule(id).await {
        Ok(view) => {
            let mine =
                view.agent == agent && (!made_by_agent || view.owner == format!("agent:{agent}"));
            Ok(mine.then_some(view))
        }
        Err(crate::GatewayError::UnknownSchedule { .. }) => Ok(None),
        Err(e) => Err(ToolError::Failed(format!(
            "reading the schedule failed: {e}"
        ))),
    }
}

fn change(
    result: Result<ScheduleView, crate::GatewayError>,
    what: &str,
) -> Result<ToolResult, ToolError> {
    match result {
        Ok(view) => Ok(ToolResult::ok(format!(
            "SCHEDULE {} {what}: now {}.\n",
            view.id,
            view.state.as_str()
        ))),
        Err(e) => Ok(ToolResult::fail(format!("schedule: {e}\n"), 1)),
    }
}

async fn add(
    gateway: &LocalGateway,
    call: &ToolCall,
    limits: &Limits,
    args: AddArgs,
) -> Result<ToolResult, ToolError> {
    let agent = call.session.agent.clone();
    let fail = |m: String| Ok(ToolResult::fail(format!("schedule: {m}\n"), 1));
    let prompt = match (args.prompt, &call.stdin) {
        (Some(p), _) => Some(p),
        (None, Some(bytes)) if args.exec.is_none() => match String::from_utf8(bytes.clone()) {
            Ok(text) if !text.trim().is_empty() => Some(text),
            Ok(_) => return fail("the prompt file is empty".into()),
            Err(_) => return fail("the prompt file is not UTF-8 text".into()),
        },
        (None, _) => None,
    };
    if args.exec.is_some() && !limits.allow_exec {
        return fail(
            "this agent may not schedule commands (pluginConfigs.schedule.allowExec is false); schedule a --prompt instead".into(),
        );
    }
    let deliver = match args.deliver.as_deref() {
        None => None,
        Some("events") => Some(Deliver::Events(EventsTarget::Events)),
        Some("here") => match &call.session.chat_id {
            Some(chat) => Some(Deliver::Chat(ChatTarget {
                channel: call.session.channel.clone(),
                chat_id: chat.clone(),
            })),
            None => {
                return fail(format!(
                    "--deliver here needs a chat, and this call's session ({}) has none; use --deliver events, or leave it out to have failures reported to the agent's owner",
                    call.session.key
                ))
            }
        },
        Some(other) => {
            return fail(format!(
                "--deliver '{other}': an agent delivers to the chat of its session (here) or to the event stream (events) only"
            ))
        }
    };
    // The limits of pluginConfigs.schedule, before the engine checks the rest.
    if let Some(expr) = &args.cron {
        if let Ok(cron) = CronSpec::parse(expr, args.tz.as_deref()) {
            let now = crate::store::now_ms();
            if let Some(gap) = shortest_gap(&cron, now) {
                if gap < i64::try_from(limits.min_interval_seconds).unwrap_or(i64::MAX) * 1000 {
                    return fail(format!(
                        "cron '{expr}' fires every {} s, more often than the {} s an agent's schedule may (pluginConfigs.schedule.minIntervalSeconds)",
                        gap / 1000,
                        limits.min_interval_seconds
                    ));
                }
            }
            let per_day = fires_within(&cron, now, 86_400_000);
            if per_day > limits.max_runs_per_day {
                return fail(format!(
                    "cron '{expr}' fires {per_day} times a day, more than the {} a schedule may (pluginConfigs.schedule.maxRunsPerDay)",
                    limits.max_runs_per_day
                ));
            }
        }
    }
    let kept = gateway
        .schedules(Some(&agent))
        .await
        .map_err(|e| ToolError::Failed(format!("listing schedules failed: {e}")))?
        .into_iter()
        .filter(|v| {
            v.owner == format!("agent:{agent}")
                && matches!(v.state, ScheduleState::Active | ScheduleState::Paused)
        })
        .count();
    if kept >= limits.max_schedules_per_agent {
        return fail(format!(
            "this agent has {kept} schedules, the most it may keep (pluginConfigs.schedule.maxSchedulesPerAgent {}); cancel one first",
            limits.max_schedules_per_agent
        ));
    }
    let spec = ScheduleSpec {
        agent: agent.clone(),
        cron: args.cron,
        tz: args.tz,
        at: args.at,
        prompt,
        exec: args.exec,
        session: args.session,
        deliver,
        tools: (!args.tools.is_empty()).then_some(args.tools),
        ..ScheduleSpec::default()
    };
    let author = ScheduleAuthor::agent(&agent, call.exec.as_deref(), Some(&call.session.key));
    let view = match gateway.add_schedule(spec, author).await {
        Ok(v) => v,
        Err(e) => return fail(e.to_string()),
    };
    if args.json {
        return Ok(ToolResult::ok(to_json(&view)?));
    }
    Ok(ToolResult::ok(created(&view)))
}

/// `SCHEDULE sch_… created: cron "…" Zone, next …, prompts agent (new session), delivers to …`
fn created(view: &ScheduleView) -> String {
    let spec = &view.spec;
    let timing = match (&spec.cron, &spec.at) {
        (Some(c), _) => format!(
            "cron \"{c}\"{}",
            spec.tz
                .as_deref()
                .map(|t| format!(" {t}"))
                .unwrap_or_default()
        ),
        (None, Some(at)) => format!("once at {at}"),
        (None, None) => String::new(),
    };
    let work = match (&spec.prompt, &spec.exec) {
        (Some(_), _) => format!(
            "prompts {} ({})",
            view.agent,
            match spec.session.as_deref() {
                None | Some("new") => "new session".to_string(),
                Some(name) => format!("session {name}"),
            }
        ),
        (None, Some(cmd)) => format!("runs `{cmd}`"),
        (None, None) => String::new(),
    };
    let deliver = match &spec.deliver {
        Some(Deliver::Chat(c)) => format!("delivers to {} chat {}", c.channel, c.chat_id),
        Some(Deliver::Events(_)) => "delivers to the event stream".to_string(),
        None => "reports failures to the agent's owner".to_string(),
    };
    format!(
        "SCHEDULE {} created: {timing}, next {}, {work}, {deliver}.\n",
        view.id,
        when(view.next_fire_at)
    )
}

fn line(view: &ScheduleView) -> String {
    let spec = &view.spec;
    let timing = match (&spec.cron, &spec.at) {
        (Some(c), _) => format!(
            "cron \"{c}\"{}",
            spec.tz
                .as_deref()
                .map(|t| format!(" {t}"))
                .unwrap_or_default()
        ),
        (None, Some(at)) => format!("at {at}"),
        (None, None) => "-".into(),
    };
    let last = view
        .last_run
        .as_ref()
        .map(|r| r.status.as_str())
        .unwrap_or("-");
    format!(
        "{}  {}  {timing}  next {}  last {last}\n",
        view.id,
        view.state.as_str(),
        when(view.next_fire_at)
    )
}

fn run_line(run: &ScheduleRun) -> String {
    let missed = if run.missed_count > 1 {
        format!(" (stands for {} missed fires)", run.missed_count)
    } else {
        String::new()
    };
    let why = run
        .error
        .as_deref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    format!(
        "{}  {}  {}{missed}{why}\n",
        when(Some(run.fire_at)),
        run.id,
        run.status.as_str()
    )
}

fn when(ms: Option<i64>) -> String {
    ms.and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "-".into())
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, ToolError> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| ToolError::Failed(e.to_string()))
}

/// The shortest time between consecutive fires of `cron` over its next 50 fires.
fn shortest_gap(cron: &CronSpec, now: i64) -> Option<i64> {
    let mut prev = cron.next_after(now)?;
    let mut gap: Option<i64> = None;
    for _ in 0..50 {
        let Some(next) = cron.next_after(prev) else {
            break;
        };
        gap = Some(gap.map_or(next - prev, |g| g.min(next - prev)));
        prev = next;
    }
    gap
}

/// How many times `cron` fires in the `span` ms after `now` (counting stops past 10 000).
fn fires_within(cron: &CronSpec, now: i64, span: i64) -> u64 {
    let mut count = 0;
    let mut at = now;
    while count < 10_000 {
        match cron.next_after(at) {
            Some(next) if next <= now + span => {
                count += 1;
                at = next;
            }
            _ => break,
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn parses_the_commands() {
        assert_eq!(Command::parse(&[]).unwrap(), Command::Help);
        assert_eq!(
            Command::parse(&args(&[
                "add",
                "--cron",
                "0 8 * * *",
                "--tz=Europe/Berlin",
                "--prompt",
                "hi",
                "--deliver",
                "here"
            ]))
            .unwrap(),
            Command::Add(AddArgs {
                cron: Some("0 8 * * *".into()),
                tz: Some("Europe/Berlin".into()),
                prompt: Some("hi".into()),
                deliver: Some("here".into()),
                ..AddArgs::default()
            })
        );
        assert_eq!(
            Command::parse(&args(&["history", "sch_x", "-n", "5", "--json"])).unwrap(),
            Command::History {
                id: "sch_x".into(),
                n: 5,
                json: true
            }
        );
        assert_eq!(
            Command::parse(&args(&["test", "sch_x"])).unwrap(),
            Command::Test("sch_x".into())
        );
        for bad in [
            &["add", "--agent", "other"][..],
            &["add", "--cron"],
            &["pause"],
            &["frobnicate"],
            &["history", "x", "-n", "0"],
        ] {
            let e = Command::parse(&args(bad)).unwrap_err();
            assert!(e.contains("Usage:"), "{bad:?}: {e}");
        }
        assert!(Command::parse(&args(&["add", "--agent", "other"]))
            .unwrap_err()
            .contains("this agent only"));
    }

    #[test]
    fn limits_default_to_the_originals() {
        let l = Limits::from_config(&serde_json::Value::Null).unwrap();
        assert_eq!(l.max_schedules_per_agent, 20);
        assert_eq!(l.min_interval_seconds, 300);
        assert_eq!(l.max_runs_per_day, 100);
        assert!(l.allow_exec);
        let l =
            Limits::from_config(&serde_json::json!({"allowExec": false, "minIntervalSeconds": 60}))
                .unwrap();
        assert!(!l.allow_exec);
        assert_eq!(l.min_interval_seconds, 60);
        assert!(Limits::from_config(&serde_json::json!({"allowExec": "no"})).is_err());
    }

    #[test]
    fn gaps_and_fires_per_day() {
        let now = 1_780_000_000_000;
        let every_minute = CronSpec::parse("* * * * *", Some("UTC")).unwrap();
        assert_eq!(shortest_gap(&every_minute, now), Some(60_000));
        assert_eq!(fires_within(&every_minute, now, 86_400_000), 1440);
        let weekdays = CronSpec::parse("0 8 * * 1-5", Some("Europe/Berlin")).unwrap();
        assert!(shortest_gap(&weekdays, now).unwrap() >= 86_400_000 - 3_600_000);
        assert!(fires_within(&weekdays, now, 86_400_000) <= 1);
    }
}
