//! `beige schedule add|list|get|history|pause|resume|cancel|run`: the running gateway's
//! schedules, through `RemoteGateway` and the HTTP API's `/api/schedules` routes.
//!
//! Owns turning the command line into a [`ScheduleSpec`] and the one-line-per-schedule
//! and one-line-per-run tables; validation, firing and history are the gateway's.

use anyhow::Result;
use beige_core::api::schedules::{
    ChatTarget, Deliver, ScheduleAuthor, ScheduleRun, ScheduleSpec, ScheduleView,
};
use beige_core::api::Admin;
use beige_core::GatewayError;

use crate::cli::{ScheduleAddArgs, ScheduleCommand};
use crate::client::Target;
use crate::Exit;

/// The spec `args` describe.
pub fn spec(args: &ScheduleAddArgs) -> Result<ScheduleSpec, Exit> {
    let deliver = match args.deliver.as_deref() {
        None => None,
        Some("events") => Some(Deliver::Events(
            beige_core::api::schedules::EventsTarget::Events,
        )),
        Some(d) => {
            let (channel, chat) = d.split_once(':').ok_or_else(|| {
                Exit::new(
                    2,
                    format!(
                        "error: --deliver '{d}': give CHANNEL:CHAT (telegram:123456789) or events"
                    ),
                )
            })?;
            Some(Deliver::Chat(ChatTarget {
                channel: channel.to_string(),
                chat_id: chat.to_string(),
            }))
        }
    };
    Ok(ScheduleSpec {
        agent: args.agent.clone(),
        cron: args.cron.clone(),
        tz: args.tz.clone(),
        at: args.at.clone(),
        prompt: args.prompt.clone(),
        exec: args.exec.clone(),
        session: args.session.clone(),
        deliver,
        tools: (!args.tools.is_empty()).then(|| args.tools.clone()),
        ..ScheduleSpec::default()
    })
}

/// An instant in Unix ms as local RFC 3339, or `-`.
fn when(ms: Option<i64>) -> String {
    ms.and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| {
            t.with_timezone(&chrono::Local)
                .format("%Y-%m-%dT%H:%M:%S%:z")
                .to_string()
        })
        .unwrap_or_else(|| "-".into())
}

/// What a schedule runs on: `cron "…" TZ` or `at …`.
fn timing(spec: &ScheduleSpec) -> String {
    match (&spec.cron, &spec.at) {
        (Some(c), _) => format!(
            "cron \"{c}\"{}",
            spec.tz
                .as_deref()
                .map(|t| format!(" {t}"))
                .unwrap_or_default()
        ),
        (None, Some(a)) => format!("at {a}"),
        (None, None) => "-".into(),
    }
}

/// One line per schedule: id, state, timing, next fire, last status.
pub fn table(list: &[ScheduleView]) -> String {
    let rows: Vec<[String; 6]> = std::iter::once([
        "ID".into(),
        "AGENT".into(),
        "STATE".into(),
        "WHEN".into(),
        "NEXT".into(),
        "LAST".into(),
    ])
    .chain(list.iter().map(|s| {
        [
            s.id.clone(),
            s.agent.clone(),
            s.state.as_str().to_string(),
            timing(&s.spec),
            when(s.next_fire_at),
            s.last_run
                .as_ref()
                .map(|r| r.status.as_str().to_string())
                .unwrap_or_else(|| "-".into()),
        ]
    }))
    .collect();
    aligned(&rows)
}

/// One line per run: fire instant, status, missed count, summary or error.
pub fn runs_table(runs: &[ScheduleRun]) -> String {
    let rows: Vec<[String; 4]> = std::iter::once([
        "FIRE".into(),
        "STATUS".into(),
        "MISSED".into(),
        "RESULT".into(),
    ])
    .chain(runs.iter().map(|r| {
        let text = r
            .error
            .as_deref()
            .or(r.summary.as_deref())
            .unwrap_or("")
            .replace('\n', " ");
        let text: String = if text.chars().count() > 80 {
            text.chars().take(79).chain(std::iter::once('…')).collect()
        } else {
            text
        };
        [
            when(Some(r.fire_at)),
            r.status.as_str().to_string(),
            r.missed_count.to_string(),
            text,
        ]
    }))
    .collect();
    aligned(&rows)
}

fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn failed(target: &Target, e: GatewayError) -> anyhow::Error {
    match e {
        GatewayError::Unreachable { .. } => Exit::new(
            crate::code::NOT_RUNNING,
            crate::client::not_running_message(&target.url),
        )
        .into(),
        e => Exit::new(1, format!("error: {e}")).into(),
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// One schedule, for people.
fn describe(s: &ScheduleView) -> String {
    let what = match (&s.spec.prompt, &s.spec.exec) {
        (Some(_), _) => format!(
            "prompts {} ({})",
            s.agent,
            s.spec
                .session
                .as_deref()
                .filter(|n| *n != "new")
                .map(|n| format!("session {n}"))
                .unwrap_or_else(|| "new session".into())
        ),
        (None, Some(cmd)) => format!("runs `{cmd}` in {}'s sandbox", s.agent),
        (None, None) => "does nothing".into(),
    };
    format!(
        "SCHEDULE {} {}: {}, next {}, {what}.",
        s.id,
        s.state.as_str(),
        timing(&s.spec),
        when(s.next_fire_at)
    )
}

/// `beige schedule …`.
pub async fn run(target: &Target, command: ScheduleCommand) -> Result<()> {
    let gw = target.remote()?;
    let fail = |e| failed(target, e);
    match command {
        ScheduleCommand::Add(args) => {
            let view = gw
                .add_schedule(
                    spec(&args)?,
                    ScheduleAuthor::principal(&beige_core::api::Principal::ApiToken),
                )
                .await
                .map_err(fail)?;
            if args.json {
                return print_json(&view);
            }
            println!("{}", describe(&view).replacen(" active:", " created:", 1));
        }
        ScheduleCommand::List { agent, json } => {
            let list = gw.schedules(agent.as_deref()).await.map_err(fail)?;
            if json {
                return print_json(&list);
            }
            if list.is_empty() {
                println!("No schedules.");
            } else {
                print!("{}", table(&list));
            }
        }
        ScheduleCommand::Get { id, json } => {
            let view = gw.schedule(&id).await.map_err(fail)?;
            if json {
                return print_json(&view);
            }
            println!("{}", describe(&view));
        }
        ScheduleCommand::History { id, lines, json } => {
            let runs = gw.schedule_history(&id, lines).await.map_err(fail)?;
            if json {
                return print_json(&runs);
            }
            if runs.is_empty() {
                println!("No runs of {id} yet.");
            } else {
                print!("{}", runs_table(&runs));
            }
        }
        ScheduleCommand::Pause { id } => {
            println!("{}", describe(&gw.pause_schedule(&id).await.map_err(fail)?));
        }
        ScheduleCommand::Resume { id } => {
            println!(
                "{}",
                describe(&gw.resume_schedule(&id).await.map_err(fail)?)
            );
        }
        ScheduleCommand::Cancel { id } => {
            println!(
                "{}",
                describe(&gw.cancel_schedule(&id).await.map_err(fail)?)
            );
        }
        ScheduleCommand::Run { id, json } => {
            let run = gw.run_schedule_now(&id).await.map_err(fail)?;
            if json {
                return print_json(&run);
            }
            println!(
                "RUN {} of {id} {}; see `beige schedule history {id}`.",
                run.id,
                run.status.as_str()
            );
        }
    }
    Ok(())
}
