//! `beige policy check AGENT -- TOOL ARGS…` and `beige policy list AGENT`: an agent's
//! rules as data, offline.
//!
//! Loads the config as the gateway does and decides the call with the gateway's own
//! policy ([`ConfigPolicy::explain`]): the allow-lists first, then `agents.<a>.policy`.
//! Nothing runs and no gateway is asked, so live (session, time-boxed) grants are not
//! seen. Owns only reading the call from the command line and printing the answer; exit
//! codes: 0 allow, 1 deny, 2 ask, 4 no such agent, 78 a config that does not load.

use std::path::Path;

use anyhow::Result;
use beige_core::config::Config;
use beige_core::home::BeigeHome;
use beige_core::policy::rules::is_core_tool;
use beige_core::policy::shell::display_argv;
use beige_core::policy::{
    AgentPolicy, ConfigPolicy, Decision, Evaluation, Grant, PatternElem, PolicyRequest, Rule,
    ToolKind,
};

use crate::cli::PolicyCheckArgs;
use crate::{code, Exit};

/// Exit code: the call would be refused.
const DENY: u8 = 1;
/// Exit code: the call would need approval.
const ASK: u8 = 2;
/// Exit code: the config does not load (`EX_CONFIG`).
pub(crate) const CONFIG: u8 = 78;

/// Loads the config as the gateway does; a failure exits with [`CONFIG`].
pub(crate) fn load(home: &BeigeHome, explicit: Option<&Path>) -> Result<Config> {
    let path = explicit
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.config_path());
    if !path.exists() {
        return Err(Exit::new(
            CONFIG,
            format!(
                "error: no config at {}; run `beige setup` to create one",
                path.display()
            ),
        )
        .into());
    }
    match Config::load(&path, home) {
        Ok(loaded) => Ok(loaded.config),
        Err(e) => Err(Exit::new(
            CONFIG,
            format!(
                "error: the config does not load: {e}\n(check it with `beige config validate`)"
            ),
        )
        .into()),
    }
}

fn known_agent(config: &Config, agent: &str) -> Result<()> {
    if config.agents.contains_key(agent) {
        return Ok(());
    }
    let known: Vec<&str> = config.agents.keys().map(String::as_str).collect();
    Err(Exit::new(
        code::UNKNOWN_AGENT,
        format!(
            "error: no agent '{agent}' in the config (agents: {})",
            known.join(", ")
        ),
    )
    .into())
}

/// The call's kind and arguments as the gateway would see them: `exec` one command
/// line, `read`/`write`/`patch` the path, a plugin tool its arguments.
fn call_args(tool: &str, rest: &[String]) -> (ToolKind, Vec<String>) {
    match tool {
        "exec" => (ToolKind::Core, vec![super::run::shell_line(rest)]),
        t if is_core_tool(t) => (ToolKind::Core, vec![rest.join(" ")]),
        _ => (ToolKind::Plugin, rest.to_vec()),
    }
}

pub fn check(home: &BeigeHome, config: Option<&Path>, args: PolicyCheckArgs) -> Result<()> {
    let config = load(home, config)?;
    known_agent(&config, &args.agent)?;
    let Some((tool, rest)) = args.call.split_first() else {
        return Err(Exit::new(ASK, "error: name the tool after `--`").into());
    };
    let (kind, call) = call_args(tool, rest);
    let policy = ConfigPolicy::from_config(&config);
    let request = PolicyRequest::new(&args.agent, tool, kind, &call).with_cwd(args.cwd.as_deref());
    let evaluation = policy.explain(&request);
    if args.json {
        let value = check_json(&args.agent, tool, &call, &evaluation);
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", render_check(&evaluation));
    }
    match &evaluation.decision {
        d if d.is_allow() => Ok(()),
        d if d.is_deny() => Err(Exit::silent(DENY).into()),
        _ => Err(Exit::silent(ASK).into()),
    }
}

fn verdict(d: &Decision) -> &'static str {
    if d.is_allow() {
        "allow"
    } else if d.is_deny() {
        "deny"
    } else {
        "ask"
    }
}

/// The lines of `beige policy check`.
pub fn render_check(e: &Evaluation) -> String {
    let mut out = format!(
        "verdict: {}\nreason: {}\n",
        verdict(&e.decision),
        e.decision.reason()
    );
    for m in &e.matches {
        out.push_str(&format!("rule: {} {} '{}'", m.rule, m.decision, m.command));
        if let Some(j) = &m.justification {
            out.push_str(&format!(": {j}"));
        }
        out.push('\n');
    }
    if let Some(g) = &e.grant {
        out.push_str(&format!("grant: {}\n", grant_line(g)));
    }
    out
}

fn check_json(agent: &str, tool: &str, args: &[String], e: &Evaluation) -> serde_json::Value {
    serde_json::json!({
        "agent": agent,
        "tool": tool,
        "args": args,
        "verdict": verdict(&e.decision),
        "reason": e.decision.reason(),
        "rule": e.decision.rule(),
        "justification": e.decision.justification(),
        "matches": e.matches,
        "grant": e.grant,
    })
}

pub fn list(home: &BeigeHome, config: Option<&Path>, agent: &str, json: bool) -> Result<()> {
    let config = load(home, config)?;
    known_agent(&config, agent)?;
    let a = &config.agents[agent];
    if json {
        let value = serde_json::json!({
            "agent": agent,
            "tools": a.tools,
            "denyTools": a.deny_tools,
            "policy": a.policy,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    print!(
        "{}",
        render_list(agent, &a.tools, &a.deny_tools, a.policy.as_ref())
    );
    Ok(())
}

fn pattern_text(pattern: &[PatternElem]) -> String {
    pattern
        .iter()
        .map(|p| match p {
            PatternElem::Literal(w) => display_argv(std::slice::from_ref(w)),
            PatternElem::AnyOf(alts) => format!("[{}]", display_argv(alts).replace(' ', "|")),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn rule_line(id: &str, r: &Rule) -> String {
    let mut out = format!("rule {id}: {} {}", r.decision, r.tool);
    if !r.pattern.is_empty() {
        out.push(' ');
        out.push_str(&pattern_text(&r.pattern));
    }
    if r.exact {
        out.push_str(" (exact)");
    }
    if let Some(p) = &r.path {
        out.push_str(&format!(" path {p}"));
    }
    if let Some(j) = &r.justification {
        out.push_str(&format!(": {j}"));
    }
    out
}

fn grant_line(g: &Grant) -> String {
    let mut out = format!(
        "{} {} {}",
        g.id.as_deref().unwrap_or("-"),
        g.tool,
        pattern_text(&g.pattern)
    );
    if g.exact {
        out.push_str(" (exact)");
    }
    if let Some(cwd) = &g.cwd {
        out.push_str(&format!(" in {cwd}"));
    }
    out.push_str(&format!(" granted by {}", g.granted_by));
    if let Some(at) = &g.granted_at {
        out.push_str(&format!(" at {at}"));
    }
    out
}

/// The lines of `beige policy list`.
pub fn render_list(
    agent: &str,
    tools: &[String],
    deny_tools: &[String],
    policy: Option<&AgentPolicy>,
) -> String {
    let mut out = format!(
        "agent '{agent}': tools [{}], denyTools [{}]\n",
        tools.join(", "),
        deny_tools.join(", ")
    );
    let Some(p) = policy else {
        out.push_str("no policy: the allow-lists alone decide\n");
        return out;
    };
    out.push_str(&format!(
        "execDefault {}, opaqueExec {}, unboundCalls {}\n",
        p.exec_default,
        p.opaque_exec,
        match p.unbound_calls {
            beige_core::policy::UnboundCalls::Deny => "deny",
            beige_core::policy::UnboundCalls::Session => "session",
        }
    ));
    for (i, r) in p.rules.iter().enumerate() {
        out.push_str(&rule_line(&p.rule_id(i), r));
        out.push('\n');
    }
    for (i, g) in p.grants.iter().enumerate() {
        let g = Grant {
            id: Some(g.id.clone().unwrap_or_else(|| format!("g{i}"))),
            ..g.clone()
        };
        out.push_str(&format!("grant {}\n", grant_line(&g)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_read_like_the_gateway_sees_them() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            call_args("exec", &words(&["git push -f origin"])),
            (ToolKind::Core, words(&["git push -f origin"]))
        );
        assert_eq!(
            call_args("exec", &words(&["git", "commit", "-m", "a b"])),
            (ToolKind::Core, words(&["git commit -m 'a b'"]))
        );
        assert_eq!(
            call_args("write", &words(&["a.txt"])),
            (ToolKind::Core, words(&["a.txt"]))
        );
        assert_eq!(
            call_args("gh", &words(&["pr", "merge", "41"])),
            (ToolKind::Plugin, words(&["pr", "merge", "41"]))
        );
    }

    #[test]
    fn patterns_print_with_their_alternatives() {
        let p: Vec<PatternElem> =
            serde_json::from_value(serde_json::json!(["git", "push", ["-f", "--force"], "a b"]))
                .unwrap();
        assert_eq!(pattern_text(&p), "git push [-f|--force] 'a b'");
    }
}
