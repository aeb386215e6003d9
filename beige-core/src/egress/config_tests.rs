use serde_json::json;

use super::*;
use crate::egress::rules::{Request, Verdict};
use crate::egress::target::parse_authority;

fn agent(value: serde_json::Value) -> AgentEgressConfig {
    serde_json::from_value(value).unwrap()
}

fn top(value: serde_json::Value) -> EgressConfig {
    serde_json::from_value(value).unwrap()
}

/// The errors of an agent `intern` whose only rule is `rule`.
fn errors_of(rule: serde_json::Value) -> Vec<(String, String)> {
    let a = agent(json!({ "rules": [rule] }));
    match rule_set(None, "intern", &a, 1) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.into_iter().map(|e| (e.path, e.message)).collect(),
    }
}

#[test]
fn defaults() {
    let t = top(json!({}));
    assert_eq!(t, EgressConfig::default());
    assert_eq!(t.on_unknown, OnUnknown::Deny);
    assert_eq!(
        (t.max_streams, t.idle_seconds, t.proxy_port),
        (256, 600, 3128)
    );
    let a = agent(json!({}));
    assert_eq!(a, AgentEgressConfig::default());
    let s = settings(None, "intern", &a).unwrap();
    assert_eq!(
        s,
        EgressSettings {
            on_unknown: OnUnknown::Deny,
            hold_seconds: 0,
            max_streams: 256,
            idle_seconds: 600,
            proxy_port: 3128
        }
    );
}

#[test]
fn camel_case_and_unknown_fields_refused() {
    let t = top(json!({
        "onUnknown": "ask", "maxStreams": 8, "idleSeconds": 30, "proxyPort": 8080,
        "rules": [{ "id": "pypi", "hosts": ["pypi.org"], "allowPrivate": [] }]
    }));
    assert_eq!(t.on_unknown, OnUnknown::Ask);
    assert_eq!((t.max_streams, t.idle_seconds, t.proxy_port), (8, 30, 8080));
    for bad in [
        json!({ "on_unknown": "deny" }),
        json!({ "onUnknown": "maybe" }),
        json!({ "rules": [{ "id": "a", "hosts": ["a.com"], "host": "a.com" }] }),
    ] {
        assert!(
            serde_json::from_value::<EgressConfig>(bad.clone()).is_err(),
            "{bad}"
        );
    }
    assert!(serde_json::from_value::<AgentEgressConfig>(json!({ "proxyPort": 1 })).is_err());
    assert!(serde_json::from_value::<RuleConfig>(json!({ "id": "a" })).is_err());
    assert!(serde_json::from_value::<RuleConfig>(
        json!({ "id": "a", "hosts": [], "ports": [70000] })
    )
    .is_err());
    let rule: RuleConfig =
        serde_json::from_value(json!({ "id": "a", "hosts": ["a.com"], "action": "deny" })).unwrap();
    assert_eq!(rule.action, Some(Action::Deny));
    let back = serde_json::to_value(&rule).unwrap();
    assert_eq!(
        back,
        json!({ "id": "a", "hosts": ["a.com"], "action": "deny" })
    );
}

#[test]
fn agent_settings_override() {
    let t = top(json!({ "onUnknown": "ask", "maxStreams": 10, "proxyPort": 3129 }));
    let a = agent(json!({ "onUnknown": "deny", "idleSeconds": 5 }));
    let s = settings(Some(&t), "intern", &a).unwrap();
    assert_eq!(s.on_unknown, OnUnknown::Deny);
    assert_eq!((s.max_streams, s.idle_seconds, s.proxy_port), (10, 5, 3129));
    let s = settings(Some(&t), "intern", &agent(json!({}))).unwrap();
    assert_eq!(s.on_unknown, OnUnknown::Ask);
    assert_eq!(s.hold_seconds, 0);
    let held = top(json!({ "onUnknown": "ask", "holdSeconds": 30 }));
    assert_eq!(
        settings(Some(&held), "intern", &agent(json!({})))
            .unwrap()
            .hold_seconds,
        30
    );
    let errors = settings(
        Some(&top(json!({ "holdSeconds": 31 }))),
        "intern",
        &agent(json!({})),
    )
    .unwrap_err();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].path, "egress.holdSeconds");
    assert!(
        errors[0].message.contains("at most 30"),
        "{}",
        errors[0].message
    );

    let errors = settings(
        Some(&top(json!({ "proxyPort": 53, "idleSeconds": 0 }))),
        "intern",
        &agent(json!({ "maxStreams": 0 })),
    )
    .unwrap_err();
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "agents.intern.egress.maxStreams",
            "egress.idleSeconds",
            "egress.proxyPort"
        ]
    );
}

#[test]
fn the_spec_example_builds_and_decides() {
    let t = top(
        json!({ "rules": [{ "id": "pypi", "hosts": ["pypi.org", "files.pythonhosted.org"] }] }),
    );
    let a = agent(json!({ "rules": [
        { "id": "gh", "hosts": ["api.github.com"], "methods": ["GET", "POST"], "paths": ["/repos/acme/**"] },
        { "id": "ai", "hosts": ["api.openai.com"] },
        { "id": "ssh", "hosts": ["github.com"], "ports": [22] },
        { "id": "nexus", "hosts": ["nexus.corp.example"], "allowPrivate": ["10.1.2.3/32"] },
        { "id": "no-gist", "hosts": ["gist.github.com"], "action": "deny" },
    ] }));
    let set = rule_set(Some(&t), "intern", &a, 9).unwrap();
    assert_eq!(set.version(), 9);
    let ids: Vec<&str> = set.rules().iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["pypi", "gh", "ai", "ssh", "nexus", "no-gist"]);
    assert!(set.rules().iter().all(|r| r.source == RuleSource::Config));
    assert_eq!(set.rules()[0].ports, [443]);

    let decide = |authority: &str, request: Option<Request<'_>>| {
        let target = parse_authority(authority, 443).unwrap();
        match set.decide(&target, request) {
            Verdict::Allow(a) => format!("allow {}", a.rule),
            Verdict::Deny(d) => d.reason.to_string(),
        }
    };
    assert_eq!(decide("files.pythonhosted.org", None), "allow pypi");
    assert_eq!(decide("github.com:22", None), "allow ssh");
    assert_eq!(decide("github.com", None), "port_not_allowed");
    assert_eq!(decide("gist.github.com", None), "denied_by_rule");
    assert_eq!(
        decide(
            "api.github.com",
            Some(Request {
                method: "GET",
                path: "/repos/acme/x"
            })
        ),
        "allow gh"
    );
    assert_eq!(
        decide(
            "api.github.com",
            Some(Request {
                method: "GET",
                path: "/repos/evil/x"
            })
        ),
        "path_not_allowed"
    );
    let target = parse_authority("nexus.corp.example", 443).unwrap();
    let Verdict::Allow(allowed) = set.decide(&target, None) else {
        panic!("denied")
    };
    assert_eq!(
        allowed.allow_private,
        vec!["10.1.2.3/32".parse::<IpNet>().unwrap()]
    );
}

/// One validation row: a rule, the path of its (only) error, and a piece of the fix.
fn row(rule: serde_json::Value, path: &str, fix: &str) {
    let errors = errors_of(rule.clone());
    assert_eq!(errors.len(), 1, "{rule}: {errors:#?}");
    let (got_path, message) = &errors[0];
    let want_path = format!("agents.intern.egress.rules[0]{path}");
    assert_eq!(got_path, &want_path, "{rule}: {message}");
    assert!(message.contains(fix), "{rule}: {message} lacks {fix:?}");
}

#[test]
fn validation_rows() {
    const FIX: &str = "write `*.example.com`, `ip:1.2.3.4`, `xn--…`";
    let host = |h: &str| json!({ "id": "r", "hosts": ["ok.example.com", h] });
    row(host("*"), ".hosts[1]", FIX);
    row(host("*.com"), ".hosts[1]", FIX);
    row(host("a*.x.com"), ".hosts[1]", FIX);
    row(host("api.x.com:443"), ".hosts[1]", FIX);
    row(host("1.2.3.4"), ".hosts[1]", "write `ip:1.2.3.4`");
    row(host("bücher.example"), ".hosts[1]", FIX);
    row(host("ip:nope"), ".hosts[1]", "ip:1.2.3.4");
    row(
        json!({ "id": "r", "hosts": [] }),
        ".hosts",
        "at least one host",
    );

    row(json!({ "id": "", "hosts": ["a.com"] }), ".id", "write e.g.");
    row(
        json!({ "id": "a b", "hosts": ["a.com"] }),
        ".id",
        "only letters",
    );
    row(
        json!({ "id": "x".repeat(65), "hosts": ["a.com"] }),
        ".id",
        "at most 64",
    );

    row(
        json!({ "id": "r", "hosts": ["a.com"], "ports": [] }),
        ".ports",
        "leave `ports` out",
    );
    row(
        json!({ "id": "r", "hosts": ["a.com"], "ports": [443, 0] }),
        ".ports[1]",
        "1 to 65535",
    );
    row(
        json!({ "id": "r", "hosts": ["a.com"], "ports": [22], "action": "deny" }),
        ".ports",
        "remove `ports`",
    );

    row(
        json!({ "id": "r", "hosts": ["a.com"], "methods": [] }),
        ".methods",
        "leave `methods` out",
    );
    row(
        json!({ "id": "r", "hosts": ["a.com"], "methods": ["GET", "get"] }),
        ".methods[1]",
        "write `GET`",
    );
    row(
        json!({ "id": "r", "hosts": ["a.com"], "methods": ["G ET"] }),
        ".methods[0]",
        "e.g. `GET`",
    );
    row(
        json!({ "id": "r", "hosts": ["a.com"], "paths": [] }),
        ".paths",
        "leave `paths` out",
    );
    row(
        json!({ "id": "r", "hosts": ["a.com"], "paths": ["/a", "b"] }),
        ".paths[1]",
        "start with `/`",
    );
    row(
        json!({ "id": "r", "hosts": ["a.com"], "paths": ["/a/%2F"] }),
        ".paths[0]",
        "decoded path",
    );

    let private = |net: &str| json!({ "id": "r", "hosts": ["nexus.corp"], "allowPrivate": [net] });
    row(private("127.0.0.1/32"), ".allowPrivate[0]", "loopback");
    row(private("169.254.169.254"), ".allowPrivate[0]", "link-local");
    row(private("0.0.0.0/0"), ".allowPrivate[0]", "unspecified");
    row(private("224.0.0.0/4"), ".allowPrivate[0]", "multicast");
    row(private("::1/128"), ".allowPrivate[0]", "loopback");
    row(private("fe80::/10"), ".allowPrivate[0]", "link-local");
    row(
        private("::ffff:10.0.0.0/104"),
        ".allowPrivate[0]",
        "write the IPv4 range",
    );
    row(private("10.0.0.0/33"), ".allowPrivate[0]", "not a CIDR");
    row(private("nexus"), ".allowPrivate[0]", "not a CIDR");
    row(
        private("10.1.2.3/8"),
        ".allowPrivate[0]",
        "write `10.0.0.0/8`",
    );
    row(
        json!({ "id": "r", "hosts": ["a.corp", "*.corp.example"], "allowPrivate": ["10.0.0.0/8"] }),
        ".allowPrivate",
        "`*.corp.example`",
    );
    row(
        json!({ "id": "r", "hosts": ["a.corp"], "action": "deny", "allowPrivate": ["10.0.0.0/8"] }),
        ".allowPrivate",
        "remove it",
    );
}

#[test]
fn good_rules_pass() {
    for rule in [
        json!({ "id": "a.b_c-1", "hosts": ["a.com", "*.a.com", "ip:10.0.0.0/8"], "ports": [80, 443, 8443] }),
        json!({ "id": "n", "hosts": ["nexus.corp"], "allowPrivate": ["10.1.2.3", "10.2.0.0/16", "fd00::/8"] }),
        json!({ "id": "m", "hosts": ["a.com"], "methods": ["GET", "M-SEARCH"], "paths": ["/", "/**", "/a/*.json"] }),
        json!({ "id": "d", "hosts": ["a.com"], "action": "deny", "methods": ["DELETE"] }),
    ] {
        assert_eq!(
            errors_of(rule.clone()),
            Vec::<(String, String)>::new(),
            "{rule}"
        );
    }
    let a = agent(
        json!({ "rules": [{ "id": "n", "hosts": ["x.corp"], "allowPrivate": ["10.1.2.3"] }] }),
    );
    let set = rule_set(None, "intern", &a, 1).unwrap();
    assert_eq!(
        set.rules()[0].allow_private,
        vec!["10.1.2.3/32".parse::<IpNet>().unwrap()]
    );
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let t = top(json!({ "rules": [
        { "id": "pypi", "hosts": ["pypi.org"] },
        { "id": "bad", "hosts": ["*"] },
    ] }));
    let a = agent(json!({ "rules": [
        { "id": "ok", "hosts": ["a.com"] },
        { "id": "pypi", "hosts": ["b.com"] },
        { "id": "two", "hosts": ["*.com", "x:1"], "ports": [0] },
    ] }));
    let errors = rule_set(Some(&t), "intern", &a, 1).unwrap_err();
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "egress.rules[1].hosts[0]",
            "agents.intern.egress.rules[1].id",
            "agents.intern.egress.rules[2].hosts[0]",
            "agents.intern.egress.rules[2].hosts[1]",
            "agents.intern.egress.rules[2].ports[0]",
        ]
    );
    assert!(
        errors[1]
            .message
            .contains("already used at egress.rules[0]"),
        "{}",
        errors[1]
    );
    assert!(errors[0]
        .to_string()
        .starts_with("egress.rules[1].hosts[0]: "));
}

#[test]
fn odd_agent_names_are_quoted() {
    let a = agent(json!({ "rules": [{ "id": "r", "hosts": [] }] }));
    let errors = rule_set(None, "a.b", &a, 1).unwrap_err();
    assert_eq!(errors[0].path, r#"agents["a.b"].egress.rules[0].hosts"#);
}

#[test]
fn schema_derives() {
    let schema = serde_json::to_value(schemars::schema_for!(EgressConfig)).unwrap();
    let props = &schema["properties"];
    for key in [
        "onUnknown",
        "rules",
        "maxStreams",
        "idleSeconds",
        "proxyPort",
    ] {
        assert!(props.get(key).is_some(), "{key}: {schema}");
    }
    assert_eq!(schema["additionalProperties"], json!(false));
}

/// The errors of agent `intern` (rules `rules`, grants `grants`) with `credentials`.
fn credential_errors(
    credentials: serde_json::Value,
    rules: serde_json::Value,
    grants: serde_json::Value,
) -> Vec<(String, String)> {
    let t = top(json!({ "credentials": credentials }));
    let a = agent(json!({ "rules": rules, "credentials": grants }));
    match rule_set(Some(&t), "intern", &a, 1) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.into_iter().map(|e| (e.path, e.message)).collect(),
    }
}

fn github(hosts: serde_json::Value) -> serde_json::Value {
    json!({ "github": {
        "secret": "ghp_real", "hosts": hosts,
        "inject": { "header": "Authorization", "format": "Bearer {}" }
    }})
}

#[test]
fn a_granted_credential_is_bound_and_forces_inspect() {
    let t = top(json!({ "credentials": github(json!(["api.github.com"])) }));
    let a = agent(json!({
        "rules": [{ "id": "gh", "hosts": ["api.github.com"] }, { "id": "pypi", "hosts": ["pypi.org"] }],
        "credentials": ["github"]
    }));
    let set = rule_set(Some(&t), "intern", &a, 1).unwrap();
    let gh = parse_authority("api.github.com:443", 443).unwrap();
    let c = set.credential_for(&gh.host).unwrap();
    assert_eq!(c.name, "github");
    let (header, value) = c.header_value().unwrap();
    assert_eq!(header, "authorization");
    assert_eq!(value, "Bearer ghp_real");
    assert!(c.require && c.scrub);
    match set.decide(&gh, None) {
        Verdict::Allow(a) => assert!(a.needs_inspect),
        v => panic!("{v:?}"),
    }
    let pypi = parse_authority("pypi.org", 443).unwrap();
    assert!(set.credential_for(&pypi.host).is_none());
    match set.decide(&pypi, None) {
        Verdict::Allow(a) => assert!(!a.needs_inspect),
        v => panic!("{v:?}"),
    }
    // The secret is in no Debug output.
    let shown = format!("{t:?} {a:?} {set:?}");
    assert!(!shown.contains("ghp_real"), "{shown}");
    assert!(shown.contains("Secret(<redacted>)"), "{shown}");
    // Without the grant, nothing is bound.
    let ungranted = agent(json!({ "rules": [{ "id": "gh", "hosts": ["api.github.com"] }] }));
    let set = rule_set(Some(&t), "intern", &ungranted, 1).unwrap();
    assert!(set.credential_for(&gh.host).is_none());
}

#[test]
fn credential_validation_names_the_path_and_the_fix() {
    let gh_rule = json!([{ "id": "gh", "hosts": ["api.github.com"] }]);
    let grant = json!(["github"]);
    let cases = [
        (
            github(json!(["api.github.com"])),
            gh_rule.clone(),
            json!(["gitlab"]),
            "agents.intern.egress.credentials[0]",
            "no credential 'gitlab'",
        ),
        (
            github(json!(["api.github.com"])),
            json!([{ "id": "pypi", "hosts": ["pypi.org"] }]),
            grant.clone(),
            "egress.credentials.github.hosts[0]",
            "its rules allow api.github.com on no port",
        ),
        (
            github(json!(["*.github.com"])),
            json!([{ "id": "gh", "hosts": ["*.github.com"] }]),
            grant.clone(),
            "egress.credentials.github.hosts[0]",
            "never to a wildcard",
        ),
        (
            github(json!(["api.github.com:80"])),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.hosts[0]",
            "plain HTTP never gets credentials",
        ),
        (
            github(json!(["api.github.com"])),
            json!([{ "id": "gh", "hosts": ["api.github.com"], "ports": [80] }]),
            grant.clone(),
            "egress.credentials.github.hosts[0]",
            "only on port 80",
        ),
        (
            github(json!(["ip:11.0.0.1"])),
            json!([{ "id": "gh", "hosts": ["ip:11.0.0.1"] }]),
            grant.clone(),
            "egress.credentials.github.hosts[0]",
            "only to named hosts",
        ),
        (
            json!({ "github": { "secret": "", "hosts": ["api.github.com"],
                    "inject": { "header": "Authorization" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.secret",
            "the secret is empty",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": ["api.github.com"],
                    "inject": { "header": "Authorization", "format": "Bearer" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.inject.format",
            "exactly one `{}`",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": ["api.github.com"],
                    "inject": { "header": "Authorization", "format": "{} {}" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.inject.format",
            "exactly one `{}`",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": ["api.github.com"],
                    "inject": { "header": "Host" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.inject.header",
            "the gateway sets `Host` itself",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": [],
                    "inject": { "header": "Authorization" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.hosts",
            "at least one host",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": ["api.github.com"],
                    "inject": { "header": "Authorization" }, "placeholder": { "env": "GH" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github",
            "not both",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": ["api.github.com"] } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github",
            "says not how it is delivered",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": ["api.github.com"],
                    "placeholder": { "env": "1BAD-NAME" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.placeholder.env",
            "not an environment variable name",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": ["api.github.com"],
                    "placeholder": { "env": "HTTPS_PROXY" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.placeholder.env",
            "the gateway sets `HTTPS_PROXY` itself",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": ["api.github.com"],
                    "placeholder": { "env": "SSL_CERT_FILE" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.placeholder.env",
            "the gateway sets",
        ),
        (
            json!({ "github": { "secret": "x", "hosts": ["api.github.com"],
                    "placeholder": { "env": "GH_TOKEN", "prefix": "has space" } } }),
            gh_rule.clone(),
            grant.clone(),
            "egress.credentials.github.placeholder.prefix",
            "printable characters without spaces",
        ),
    ];
    for (credentials, rules, grants, path, message) in cases {
        let errors = credential_errors(credentials.clone(), rules, grants);
        assert!(
            errors.iter().any(|(p, m)| p == path && m.contains(message)),
            "{credentials}: {errors:?}"
        );
        for (_, m) in &errors {
            assert!(!m.contains("ghp_real"), "{m}");
        }
    }
    // Two credentials for one host.
    let both = json!({
        "a": { "secret": "x", "hosts": ["api.github.com"], "inject": { "header": "Authorization" } },
        "b": { "secret": "y", "hosts": ["api.github.com"], "inject": { "header": "X-Token" } },
    });
    let errors = credential_errors(both, gh_rule.clone(), json!(["a", "b"]));
    assert!(
        errors
            .iter()
            .any(|(p, m)| p == "agents.intern.egress.credentials[1]" && m.contains("both for")),
        "{errors:?}"
    );
    // Unknown fields are refused.
    assert!(
        serde_json::from_value::<EgressConfig>(json!({ "credentials": { "c": {
        "secret": "x", "hosts": ["a.example.com"], "inject": { "header": "A" }, "token": {}
    } } }))
        .is_err()
    );
}

#[test]
fn a_placeholder_credential_is_bound_with_its_settings() {
    let t = top(json!({ "credentials": { "openai": {
        "secret": "sk-real", "hosts": ["api.openai.com"],
        "placeholder": { "env": "OPENAI_API_KEY", "prefix": "sk-" },
        "require": false, "violation": "block_and_kill", "scrub": false,
    } } }));
    let a = agent(json!({
        "rules": [{ "id": "oa", "hosts": ["api.openai.com"] }],
        "credentials": ["openai"]
    }));
    let set = rule_set(Some(&t), "intern", &a, 1).unwrap();
    let host = parse_authority("api.openai.com", 443).unwrap().host;
    let c = set.credential_for(&host).unwrap();
    assert_eq!(
        c.delivery,
        crate::egress::config::Delivery::Placeholder {
            env: "OPENAI_API_KEY".into(),
            prefix: "sk-".into()
        }
    );
    assert!(c.header_value().is_none());
    assert!(!c.require && !c.scrub);
    assert_eq!(c.violation, crate::egress::config::Violation::BlockAndKill);
    match set.decide(&parse_authority("api.openai.com", 443).unwrap(), None) {
        Verdict::Allow(a) => assert!(a.needs_inspect),
        v => panic!("{v:?}"),
    }
}
