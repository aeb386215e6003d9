//! Tests of rules as data: one rule set against a table of calls, the strictest-wins
//! order, grants, and the load-time checks.

use super::*;
use crate::policy::ConfigPolicy;
use crate::Config;

/// The rule set the table runs against (ids in comments where they are defaults).
fn policy() -> serde_json::Value {
    serde_json::json!({
        "execDefault": "allow",
        "opaqueExec": "ask",
        "rules": [
            { "id": "no-force", "tool": "exec", "pattern": ["git", "push", ["-f", "--force"]],
              "decision": "deny", "justification": "force-push rewrites shared history",
              "match": ["git push -f origin main"], "notMatch": ["git push origin main"] },
            { "id": "push", "tool": "exec", "pattern": ["git", ["push", "tag"]], "decision": "ask",
              "justification": "publishes work outside the sandbox", "match": ["git push origin main"] },
            { "id": "status", "tool": "exec", "pattern": ["git", "status"], "decision": "allow" },
            // r3
            { "tool": "exec", "pattern": ["rm", "-rf", "/"], "exact": true, "decision": "deny" },
            { "id": "curl", "tool": "exec", "pattern": ["curl"], "decision": "ask" },
            // r5
            { "tool": "write", "path": ".github/workflows/**", "decision": "ask" },
            { "id": "secrets", "tool": "read", "path": "secrets/*.key", "decision": "deny",
              "justification": "keys stay on disk" },
            // r7
            { "tool": "gh", "pattern": ["pr", "merge"], "decision": "ask" },
            { "id": "repo-delete", "tool": "gh", "pattern": ["repo", "delete"], "decision": "deny" },
            { "id": "gh-ro", "tool": "gh", "pattern": [["issue", "pr"], ["list", "view"]],
              "decision": "allow" },
            { "id": "deploy-dir", "tool": "exec", "pattern": ["make"], "path": "deploy/**",
              "decision": "ask" },
        ],
        "grants": [
            { "id": "merge-41", "tool": "gh", "pattern": ["pr", "merge", "41"], "exact": true,
              "grantedBy": "ops1" },
            { "tool": "exec", "pattern": ["git", "push", "origin", "docs"], "grantedBy": "ops2" },
        ],
    })
}

fn config_with(policy: serde_json::Value) -> Config {
    serde_json::from_value(serde_json::json!({
        "llm": {"providers": {"anthropic": {}}},
        "agents": {
            "intern": {"model": {"provider": "anthropic", "model": "m"}, "tools": ["gh"],
                       "policy": policy},
            "plain": {"model": {"provider": "anthropic", "model": "m"}, "tools": ["gh"]},
        }
    }))
    .unwrap()
}

fn config_policy() -> ConfigPolicy {
    ConfigPolicy::from_config(&config_with(policy()))
}

/// The evaluation of one call: `tool` a core tool (args `[line]` or `[path]`) or `gh`
/// (args split at spaces), in `cwd`.
fn eval(p: &ConfigPolicy, tool: &str, line: &str, cwd: Option<&str>) -> Evaluation {
    let (kind, args) = if is_core_tool(tool) {
        (ToolKind::Core, vec![line.to_string()])
    } else {
        (
            ToolKind::Plugin,
            line.split_whitespace().map(str::to_string).collect(),
        )
    };
    let r = PolicyRequest::new("intern", tool, kind, &args).with_cwd(cwd);
    p.explain_at(&r, 1_000)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum V {
    Allow,
    Ask,
    Deny,
}

fn verdict(d: &Decision) -> V {
    if d.is_allow() {
        V::Allow
    } else if d.is_ask() {
        V::Ask
    } else {
        V::Deny
    }
}

/// (tool, call, cwd, verdict, deciding rule).
type Case = (
    &'static str,
    &'static str,
    Option<&'static str>,
    V,
    Option<&'static str>,
);

#[test]
fn policy_table_of_calls() {
    use V::*;
    let p = config_policy();
    let table: &[Case] = &[
        // Prefixes and alternatives.
        (
            "exec",
            "git push -f origin main",
            None,
            Deny,
            Some("no-force"),
        ),
        ("exec", "git push --force", None, Deny, Some("no-force")),
        ("exec", "git push origin main", None, Ask, Some("push")),
        ("exec", "git tag v1", None, Ask, Some("push")),
        ("exec", "git push", None, Ask, Some("push")),
        ("exec", "git status", None, Allow, Some("status")),
        ("exec", "git status --short", None, Allow, Some("status")),
        ("exec", "git log", None, Allow, None),
        ("exec", "git", None, Allow, None),
        ("exec", "ls -la", None, Allow, None),
        // The flag must sit where the pattern has it (a guardrail, not a parser of git).
        ("exec", "git push origin -f", None, Ask, Some("push")),
        // Exact.
        ("exec", "rm -rf /", None, Deny, Some("r3")),
        ("exec", "rm -rf / --no-preserve-root", None, Allow, None),
        ("exec", "rm -rf /tmp/x", None, Allow, None),
        // argv[0] by its last path segment.
        ("exec", "/usr/bin/git push -f", None, Deny, Some("no-force")),
        // Quoting.
        ("exec", "'git' \"push\" '-f'", None, Deny, Some("no-force")),
        ("exec", "echo 'git push -f'", None, Allow, None),
        ("exec", "git commit -m 'git push -f'", None, Allow, None),
        ("exec", r"git push \-f", None, Deny, Some("no-force")),
        // Shell wrappers.
        ("exec", "sh -c 'git push -f'", None, Deny, Some("no-force")),
        (
            "exec",
            "bash -lc 'git push origin main'",
            None,
            Ask,
            Some("push"),
        ),
        (
            "exec",
            r#"bash -c "sh -c 'git push -f'""#,
            None,
            Deny,
            Some("no-force"),
        ),
        ("exec", "dash -c 'git status'", None, Allow, Some("status")),
        // Pipes, lists, background.
        ("exec", "git status | grep x", None, Allow, Some("status")),
        ("exec", "cd x && git push", None, Ask, Some("push")),
        (
            "exec",
            "git status; git push -f",
            None,
            Deny,
            Some("no-force"),
        ),
        ("exec", "true || curl x", None, Ask, Some("curl")),
        ("exec", "curl x & git push -f", None, Deny, Some("no-force")),
        ("exec", "ls\ngit push -f", None, Deny, Some("no-force")),
        // Assignments and wrappers.
        (
            "exec",
            "GIT_TRACE=1 git push -f",
            None,
            Deny,
            Some("no-force"),
        ),
        (
            "exec",
            "env -i HOME=/x git push -f",
            None,
            Deny,
            Some("no-force"),
        ),
        (
            "exec",
            "timeout -k 5 30s git push origin",
            None,
            Ask,
            Some("push"),
        ),
        ("exec", "nohup nice -n 10 curl x", None, Ask, Some("curl")),
        ("exec", "command git push -f", None, Deny, Some("no-force")),
        ("exec", "time git status", None, Allow, Some("status")),
        // Redirections are not words.
        (
            "exec",
            "git push -f > /dev/null 2>&1",
            None,
            Deny,
            Some("no-force"),
        ),
        // Opaque: opaqueExec (ask), unless a deny rule sees enough.
        ("exec", "$(echo git) push", None, Ask, None),
        ("exec", "eval 'git push -f'", None, Ask, None),
        ("exec", "ls `pwd`", None, Ask, None),
        ("exec", "cat <<EOF", None, Ask, None),
        ("exec", "$GIT push", None, Ask, None),
        (
            "exec",
            "git push -f $(git remote)",
            None,
            Deny,
            Some("no-force"),
        ),
        ("exec", "source ./env.sh", None, Ask, None),
        // Arguments: only `$` in the command word is opaque.
        ("exec", "echo $HOME", None, Allow, None),
        // A grant lifts an ask…
        ("exec", "git push origin docs", None, Allow, Some("push")),
        // …but not one that is not covered.
        (
            "exec",
            "git push origin docs && git push origin main",
            None,
            Ask,
            Some("push"),
        ),
        // Path rules on the working folder (exec) and the file (read, write).
        (
            "exec",
            "make all",
            Some("/workspace/deploy/prod"),
            Ask,
            Some("deploy-dir"),
        ),
        ("exec", "make all", Some("/workspace/src"), Allow, None),
        ("exec", "make all", None, Allow, None),
        ("write", ".github/workflows/ci.yml", None, Ask, Some("r5")),
        (
            "write",
            "/workspace/.github/workflows/ci.yml",
            None,
            Ask,
            Some("r5"),
        ),
        (
            "write",
            "src/../.github/workflows/ci.yml",
            None,
            Ask,
            Some("r5"),
        ),
        (
            "write",
            "./.github//workflows/x/y.yml",
            None,
            Ask,
            Some("r5"),
        ),
        ("write", ".github/dependabot.yml", None, Allow, None),
        ("write", "/tmp/.github/workflows/ci.yml", None, Allow, None),
        ("read", "secrets/deploy.key", None, Deny, Some("secrets")),
        ("read", "secrets/sub/deploy.key", None, Allow, None),
        (
            "read",
            "/workspace/secrets/a.key",
            None,
            Deny,
            Some("secrets"),
        ),
        ("patch", "secrets/deploy.key", None, Allow, None),
        // Plugin tools: their arguments.
        ("gh", "pr merge 42", None, Ask, Some("r7")),
        ("gh", "pr merge 41", None, Allow, Some("r7")),
        ("gh", "pr merge 41 --admin", None, Ask, Some("r7")),
        ("gh", "repo delete acme/x", None, Deny, Some("repo-delete")),
        ("gh", "issue view 3", None, Allow, Some("gh-ro")),
        ("gh", "pr list", None, Allow, Some("gh-ro")),
        ("gh", "issue create", None, Allow, None),
    ];
    assert!(table.len() >= 40);
    for (tool, line, cwd, want, rule) in table {
        let e = eval(&p, tool, line, *cwd);
        assert_eq!(verdict(&e.decision), *want, "{tool} {line:?}: {e:?}");
        assert_eq!(e.decision.rule(), *rule, "{tool} {line:?}: {e:?}");
    }
}

#[test]
fn strictest_wins() {
    // git push -f matches an allow, an ask and a deny rule.
    let config = config_with(serde_json::json!({
        "rules": [
            { "id": "git-ok", "tool": "exec", "pattern": ["git"], "decision": "allow" },
            { "id": "push", "tool": "exec", "pattern": ["git", "push"], "decision": "ask" },
            { "id": "no-force", "tool": "exec", "pattern": ["git", "push", "-f"], "decision": "deny",
              "justification": "force-push rewrites shared history" },
        ],
        "grants": [
            { "tool": "exec", "pattern": ["git", "push", "-f", "origin"], "grantedBy": "ops1" },
            { "tool": "exec", "pattern": ["git push -f origin"], "exact": true, "grantedBy": "ops1" },
        ],
    }));
    let p = ConfigPolicy::from_config(&config);
    let e = eval(&p, "exec", "git push -f origin", None);
    assert!(e.decision.is_deny(), "{e:?}");
    assert_eq!(e.decision.rule(), Some("no-force"));
    assert_eq!(
        e.decision.justification(),
        Some("force-push rewrites shared history")
    );
    assert_eq!(
        e.decision.reason(),
        "Permission denied: exec 'git push -f origin' matches rule 'no-force': \
         force-push rewrites shared history"
    );
    let ids: Vec<(&str, RuleDecision)> = e
        .matches
        .iter()
        .map(|m| (m.rule.as_str(), m.decision))
        .collect();
    assert_eq!(
        ids,
        [
            ("git-ok", RuleDecision::Allow),
            ("push", RuleDecision::Ask),
            ("no-force", RuleDecision::Deny)
        ]
    );
    // Neither the config grants nor a live one lift a deny.
    assert_eq!(e.grant, None);
    let live = GrantSet::new(vec![Grant {
        id: Some("always".into()),
        tool: "exec".into(),
        pattern: vec![PatternElem::Literal("git".into())],
        exact: false,
        cwd: None,
        granted_by: "owner".into(),
        granted_at: None,
        approval: None,
        session: None,
        expires_at_ms: None,
    }]);
    let args = vec!["git push -f origin".to_string()];
    let r = PolicyRequest::new("intern", "exec", ToolKind::Core, &args).with_grants(Some(&live));
    let e = p.explain_at(&r, 0);
    assert!(e.decision.is_deny());
    assert_eq!(e.decision.rule(), Some("no-force"));
    // The same grant lifts the ask of a plain push, and is named.
    let args = vec!["git push origin".to_string()];
    let r = PolicyRequest::new("intern", "exec", ToolKind::Core, &args).with_grants(Some(&live));
    let e = p.explain_at(&r, 0);
    assert!(e.decision.is_allow(), "{e:?}");
    assert_eq!(e.decision.rule(), Some("push"));
    assert_eq!(
        e.grant.as_ref().and_then(|g| g.id.as_deref()),
        Some("always")
    );
    assert!(e
        .decision
        .reason()
        .contains("lifted by grant 'always' (granted by owner)"));
}

fn live_grant(session: Option<&str>, expires_at_ms: Option<u64>, cwd: Option<&str>) -> GrantSet {
    GrantSet::new(vec![Grant {
        id: Some("live".into()),
        tool: "gh".into(),
        pattern: vec![
            PatternElem::Literal("pr".into()),
            PatternElem::Literal("merge".into()),
            PatternElem::Literal("42".into()),
        ],
        exact: true,
        cwd: cwd.map(str::to_string),
        granted_by: "ops1".into(),
        granted_at: None,
        approval: Some("a7k2m9qx".into()),
        session: session.map(str::to_string),
        expires_at_ms,
    }])
}

#[test]
fn live_grants_are_bound_to_session_time_and_cwd() {
    let p = config_policy();
    let args: Vec<String> = ["pr", "merge", "42"].map(String::from).to_vec();
    let check = |grants: &GrantSet, session: Option<&str>, cwd: Option<&str>, now: u64| {
        let r = PolicyRequest::new("intern", "gh", ToolKind::Plugin, &args)
            .with_session(session)
            .with_cwd(cwd)
            .with_grants(Some(grants));
        verdict(&p.explain_at(&r, now).decision)
    };
    let g = live_grant(Some("s1"), Some(5_000), Some("/workspace/app"));
    assert_eq!(
        check(&g, Some("s1"), Some("/workspace/app"), 4_999),
        V::Allow
    );
    assert_eq!(check(&g, Some("s1"), Some("app/"), 4_999), V::Allow);
    assert_eq!(check(&g, Some("s2"), Some("/workspace/app"), 4_999), V::Ask);
    assert_eq!(check(&g, None, Some("/workspace/app"), 4_999), V::Ask);
    assert_eq!(check(&g, Some("s1"), Some("/workspace/app"), 5_000), V::Ask);
    assert_eq!(check(&g, Some("s1"), None, 4_999), V::Ask);
    let anywhere = live_grant(None, None, None);
    assert_eq!(
        check(&anywhere, Some("s9"), Some("/workspace/x"), u64::MAX),
        V::Allow
    );
    // Exact: one more argument is another call.
    let more: Vec<String> = ["pr", "merge", "42", "--admin"].map(String::from).to_vec();
    let r =
        PolicyRequest::new("intern", "gh", ToolKind::Plugin, &more).with_grants(Some(&anywhere));
    assert!(p.explain_at(&r, 0).decision.is_ask());
    assert!(anywhere.lifting(&r, &more, false, 0).is_none());
    assert!(anywhere.lifting(&r, &args, false, 0).is_some());
}

#[test]
fn opaque_commands_are_lifted_only_by_the_whole_line() {
    let p = config_policy();
    let line = "$(echo git) push";
    let args = vec![line.to_string()];
    let grant = |pattern: &str| {
        GrantSet::new(vec![Grant {
            id: None,
            tool: "exec".into(),
            pattern: vec![PatternElem::Literal(pattern.into())],
            exact: true,
            cwd: None,
            granted_by: "ops1".into(),
            granted_at: None,
            approval: None,
            session: None,
            expires_at_ms: None,
        }])
    };
    let whole = grant(line);
    let r = PolicyRequest::new("intern", "exec", ToolKind::Core, &args).with_grants(Some(&whole));
    let e = p.explain_at(&r, 0);
    assert!(e.decision.is_allow(), "{e:?}");
    let word = grant("$(echo git)");
    let r = PolicyRequest::new("intern", "exec", ToolKind::Core, &args).with_grants(Some(&word));
    let e = p.explain_at(&r, 0);
    assert!(e.decision.is_ask(), "{e:?}");
    assert!(e.decision.reason().contains("opaqueExec is ask"), "{e:?}");
}

#[test]
fn defaults_apply_per_simple_command() {
    let config = config_with(serde_json::json!({
        "execDefault": "deny",
        "opaqueExec": "deny",
        "rules": [{ "id": "st", "tool": "exec", "pattern": ["git", "status"], "decision": "allow" }],
    }));
    let p = ConfigPolicy::from_config(&config);
    let e = eval(&p, "exec", "git status", None);
    assert!(e.decision.is_allow());
    let e = eval(&p, "exec", "git status && rm -rf x", None);
    assert!(e.decision.is_deny());
    assert_eq!(e.decision.rule(), None);
    assert_eq!(
        e.decision.reason(),
        "Permission denied: exec 'rm -rf x' matches no rule \
         (agents.intern.policy.execDefault is deny)"
    );
    let e = eval(&p, "exec", "git status $(id)", None);
    assert!(e.decision.is_deny(), "{e:?}");
    assert!(e.decision.reason().contains("opaqueExec is deny"));
    // Without exec rules, opaqueExec does not apply: only execDefault.
    let config = config_with(serde_json::json!({
        "rules": [{ "tool": "gh", "pattern": ["pr", "merge"], "decision": "ask" }],
    }));
    let p = ConfigPolicy::from_config(&config);
    assert!(eval(&p, "exec", "eval $(curl x)", None).decision.is_allow());
}

#[test]
fn allow_lists_come_first_and_rules_never_grant() {
    let p = config_policy();
    // Not in tools: denied before any rule is looked at.
    let args = vec!["x".to_string()];
    let r = PolicyRequest::new("intern", "kv", ToolKind::Plugin, &args);
    let e = p.explain_at(&r, 0);
    assert!(e.decision.is_deny());
    assert!(e.matches.is_empty());
    // No policy: the allow-lists alone, as before.
    let r = PolicyRequest::new("plain", "exec", ToolKind::Core, &args);
    assert_eq!(
        p.explain_at(&r, 0).decision,
        Decision::allow("core tool, not denied by config")
    );
    // A granted call no rule matches keeps the allow-list's reason.
    let r = PolicyRequest::new("intern", "gh", ToolKind::Plugin, &args);
    assert_eq!(
        p.explain_at(&r, 0).decision.reason(),
        "listed in agents.intern.tools; no rule matches"
    );
    // Rules do not hide a tool.
    assert!(
        futures_util::FutureExt::now_or_never(crate::policy::Policy::exposes(&p, "intern", "gh"))
            .unwrap_or(false)
    );
}

#[test]
fn decisions_serialize_the_rule_only_when_there_is_one() {
    let d = Decision::deny("no").with_rule("no-force", Some("because".into()));
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        serde_json::json!({"decision": "deny", "reason": "no", "rule": "no-force",
                           "justification": "because"})
    );
    let d = Decision::ask("sure?").with_rule("r2", None);
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        serde_json::json!({"decision": "ask", "reason": "sure?", "rule": "r2"})
    );
}

fn validate_json(policy: serde_json::Value) -> Result<(), PolicyError> {
    let p: AgentPolicy = serde_json::from_value(policy).unwrap();
    validate(&p, &["gh".to_string()], &["patch".to_string()])
}

#[test]
fn the_table_policy_is_valid_and_defaults_are_as_documented() {
    validate_json(policy()).unwrap();
    let p: AgentPolicy = serde_json::from_value(serde_json::json!({})).unwrap();
    assert_eq!(p.exec_default, RuleDecision::Allow);
    assert_eq!(p.opaque_exec, RuleDecision::Ask);
    assert_eq!(p.unbound_calls, UnboundCalls::Deny);
    let p: AgentPolicy =
        serde_json::from_value(serde_json::json!({"unboundCalls": "session"})).unwrap();
    assert_eq!(p.unbound_calls, UnboundCalls::Session);
    assert!(serde_json::from_value::<AgentPolicy>(serde_json::json!({
        "rules": [{"tool": "exec", "pattern": ["ls"], "decision": "maybe"}]
    }))
    .is_err());
}

#[test]
fn invalid_policies_say_where_and_why() {
    use KeyStep::{Index, Key};
    let cases: &[(serde_json::Value, Vec<KeyStep>, &str)] = &[
        (
            serde_json::json!({"rules": [{"tool": "exec", "decision": "deny"}]}),
            vec![Key("rules"), Index(0), Key("pattern")],
            "rule 'r0' has neither a pattern nor a path",
        ),
        (
            serde_json::json!({"rules": [{"tool": "kv", "pattern": ["get"], "decision": "allow"}]}),
            vec![Key("rules"), Index(0), Key("decision")],
            "rules never grant a tool",
        ),
        (
            serde_json::json!({"rules": [{"tool": "patch", "path": "a/**", "decision": "allow"}]}),
            vec![Key("rules"), Index(0), Key("decision")],
            "rule 'r0' allows 'patch'",
        ),
        (
            serde_json::json!({"rules": [
                {"id": "x", "tool": "gh", "pattern": ["a"], "decision": "ask"},
                {"id": "x", "tool": "gh", "pattern": ["b"], "decision": "ask"}]}),
            vec![Key("rules"), Index(1), Key("id")],
            "rule id 'x' is used twice",
        ),
        (
            serde_json::json!({"rules": [
                {"tool": "gh", "pattern": ["a"], "decision": "ask"},
                {"id": "r0", "tool": "gh", "pattern": ["b"], "decision": "ask"}]}),
            vec![Key("rules"), Index(1), Key("id")],
            "rule id 'r0' is used twice",
        ),
        (
            serde_json::json!({"rules": [{"tool": "write", "path": "/etc/**", "decision": "ask"}]}),
            vec![Key("rules"), Index(0), Key("path")],
            "outside /workspace",
        ),
        (
            serde_json::json!({"rules": [{"tool": "write", "path": "a/../b", "decision": "ask"}]}),
            vec![Key("rules"), Index(0), Key("path")],
            "`..` segment",
        ),
        (
            serde_json::json!({"rules": [{"tool": "write", "path": "a/b**", "decision": "ask"}]}),
            vec![Key("rules"), Index(0), Key("path")],
            "whole segment",
        ),
        (
            serde_json::json!({"rules": [{"tool": "write", "path": "a/?.rs", "decision": "ask"}]}),
            vec![Key("rules"), Index(0), Key("path")],
            "only `*`",
        ),
        (
            serde_json::json!({"rules": [{"tool": "gh", "pattern": [[]], "decision": "ask"}]}),
            vec![Key("rules"), Index(0), Key("pattern"), Index(0)],
            "empty list of alternatives",
        ),
        (
            serde_json::json!({"rules": [{"id": "no-force", "tool": "exec",
                "pattern": ["git", "push", ["-f", "--force"]], "decision": "deny",
                "notMatch": ["git push origin main", "cd x && git push --force"]}]}),
            vec![Key("rules"), Index(0), Key("notMatch"), Index(1)],
            "rule 'no-force': the notMatch example \"cd x && git push --force\" matches it \
             (read as: cd x ; git push --force)",
        ),
        (
            serde_json::json!({"rules": [{"id": "merge", "tool": "gh", "pattern": ["pr", "merge"],
                "decision": "ask", "match": ["gh pr merge 41", "pr view 3"]}]}),
            vec![Key("rules"), Index(0), Key("match"), Index(1)],
            "rule 'merge': the match example \"pr view 3\" does not match it (read as: pr view 3)",
        ),
        (
            serde_json::json!({"grants": [{"tool": "gh", "pattern": [], "grantedBy": "x"}]}),
            vec![Key("grants"), Index(0), Key("pattern")],
            "grant 'g0' has no pattern",
        ),
        (
            serde_json::json!({"grants": [{"tool": "gh", "pattern": ["a"], "grantedBy": " "}]}),
            vec![Key("grants"), Index(0), Key("grantedBy")],
            "names nobody",
        ),
    ];
    for (policy, at, message) in cases {
        let e = validate_json(policy.clone()).unwrap_err();
        assert_eq!(&e.at, at, "{policy}: {e}");
        assert!(e.message.contains(message), "{policy}: {e}");
    }
}

#[test]
fn workspace_paths_are_normalised() {
    assert_eq!(workspace_relative("a/./b//c").as_deref(), Some("a/b/c"));
    assert_eq!(workspace_relative("/workspace").as_deref(), Some(""));
    assert_eq!(
        workspace_relative("/workspace/../workspace/x").as_deref(),
        Some("x")
    );
    assert_eq!(workspace_relative("../etc/passwd"), None);
    assert_eq!(workspace_relative("/etc/passwd"), None);
    assert_eq!(
        workspace_relative("/../../workspace/a").as_deref(),
        Some("a")
    );
}
