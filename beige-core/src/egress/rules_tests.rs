use super::*;
use crate::egress::target::parse_authority;

fn pattern(s: &str) -> HostPattern {
    HostPattern::parse(s).unwrap()
}

fn rule(id: &str, hosts: &[&str]) -> Rule {
    Rule {
        id: id.to_string(),
        hosts: hosts.iter().map(|h| pattern(h)).collect(),
        ports: vec![443],
        action: Action::Allow,
        methods: None,
        paths: None,
        allow_private: Vec::new(),
        source: RuleSource::Config,
    }
}

fn deny_rule(id: &str, hosts: &[&str]) -> Rule {
    Rule {
        action: Action::Deny,
        ..rule(id, hosts)
    }
}

fn strings(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|s| s.to_string()).collect())
}

fn set(rules: Vec<Rule>) -> RuleSet {
    RuleSet::new(rules, 7)
}

/// The verdict for a connection to `authority` (default port 443): the allowing rule's
/// id, or the reason's name.
fn connect(set: &RuleSet, authority: &str) -> String {
    let target = parse_authority(authority, 443).unwrap();
    outcome(set.decide(&target, None))
}

fn request(set: &RuleSet, authority: &str, method: &str, path: &str) -> String {
    let target = parse_authority(authority, 443).unwrap();
    outcome(set.decide(&target, Some(Request { method, path })))
}

fn outcome(verdict: Verdict) -> String {
    match verdict {
        Verdict::Allow(a) => format!("allow {}", a.rule),
        Verdict::Deny(d) => match d.rule {
            Some(rule) => format!("{} {rule}", d.reason),
            None => d.reason.to_string(),
        },
    }
}

#[test]
fn patterns_parse_and_normalise() {
    assert_eq!(
        pattern("API.Example.COM."),
        HostPattern::Exact("api.example.com".into())
    );
    assert_eq!(
        pattern("*.Example.com"),
        HostPattern::Suffix("example.com".into())
    );
    assert_eq!(pattern("*.co.uk"), HostPattern::Suffix("co.uk".into()));
    assert_eq!(
        pattern("xn--bcher-kva.example"),
        HostPattern::Exact("xn--bcher-kva.example".into())
    );
    assert_eq!(
        pattern("ip:1.2.3.4"),
        HostPattern::Ip("1.2.3.4/32".parse().unwrap())
    );
    assert_eq!(
        pattern("ip:10.0.0.0/8"),
        HostPattern::Ip("10.0.0.0/8".parse().unwrap())
    );
    assert_eq!(
        pattern("ip:2001:db8::/32"),
        HostPattern::Ip("2001:db8::/32".parse().unwrap())
    );
    assert_eq!(pattern("localhost"), HostPattern::Exact("localhost".into()));
    for s in [
        "api.example.com",
        "*.example.com",
        "ip:1.2.3.4",
        "ip:10.0.0.0/8",
        "ip:::1",
    ] {
        assert_eq!(pattern(s).to_string(), s);
    }
}

#[test]
fn bad_patterns_name_the_fix() {
    use PatternError as E;
    let err = |s: &str| HostPattern::parse(s).unwrap_err();
    assert_eq!(err(""), E::Empty);
    assert_eq!(err("*"), E::LoneWildcard);
    assert!(matches!(err("*.com"), E::TooBroad(_)));
    assert!(matches!(err("*.com."), E::TooBroad(_)));
    assert!(matches!(err("a*.x.com"), E::PartialWildcard(_)));
    assert!(matches!(err("*x.com"), E::PartialWildcard(_)));
    assert!(matches!(err("x.*.com"), E::PartialWildcard(_)));
    assert!(matches!(err("*.*.x.com"), E::PartialWildcard(_)));
    assert!(matches!(err("api.x.com:443"), E::HostPort(_)));
    assert!(matches!(err("*.x.com:443"), E::HostPort(_)));
    assert!(matches!(err("1.2.3.4"), E::BareIp { .. }));
    assert!(matches!(err("2001:db8::1"), E::BareIp { .. }));
    assert!(matches!(err("[2001:db8::1]"), E::BareIp { .. }));
    assert!(matches!(err("*.1.2.3.4"), E::WildcardIp(_)));
    assert!(matches!(err("bücher.example"), E::NonAscii(_)));
    assert!(matches!(err("*.bücher.example"), E::NonAscii(_)));
    assert!(matches!(err("ip:example.com"), E::BadIp(_)));
    assert!(matches!(err("ip:10.0.0.0/33"), E::BadIp(_)));
    assert!(matches!(err("ip:10.0.0.1/8"), E::HostBits { .. }));
    assert!(matches!(err("a..b.com"), E::BadName { .. }));
    assert!(matches!(err("127.1"), E::BadName { .. }));
    assert!(matches!(err("http://a.com"), E::HostPort(_)));

    for s in [
        "*",
        "*.com",
        "a*.x.com",
        "a.com:443",
        "bücher.example",
        "a_b.com",
    ] {
        let e = err(s).to_string();
        assert!(
            e.contains("write `*.example.com`, `ip:1.2.3.4`, `xn--…`"),
            "{s}: {e}"
        );
    }
    assert_eq!(
        err("1.2.3.4").to_string(),
        "`1.2.3.4` is a bare IP address; write `ip:1.2.3.4`"
    );
    assert_eq!(
        err("ip:10.0.0.1/8").to_string(),
        "`ip:10.0.0.1/8` has bits set after the prefix length; write `ip:10.0.0.0/8`"
    );
}

#[test]
fn apex_versus_wildcard_and_depth() {
    let s = set(vec![
        rule("wild", &["*.example.com"]),
        rule("apex", &["example.org"]),
    ]);
    assert_eq!(connect(&s, "a.example.com"), "allow wild");
    assert_eq!(connect(&s, "a.b.c.example.com"), "allow wild");
    assert_eq!(connect(&s, "example.com"), "no_rule");
    assert_eq!(connect(&s, "badexample.com"), "no_rule");
    assert_eq!(connect(&s, "example.com.evil.net"), "no_rule");
    assert_eq!(connect(&s, "example.org"), "allow apex");
    assert_eq!(connect(&s, "www.example.org"), "no_rule");
    assert_eq!(connect(&s, "other.test"), "no_rule");
}

#[test]
fn case_and_trailing_dot() {
    let s = set(vec![
        rule("a", &["API.Example.com"]),
        rule("w", &["*.Pinned.Example."]),
    ]);
    assert_eq!(connect(&s, "api.example.com"), "allow a");
    assert_eq!(connect(&s, "API.EXAMPLE.COM"), "allow a");
    assert_eq!(connect(&s, "api.example.com."), "allow a");
    assert_eq!(connect(&s, "X.pinned.example."), "allow w");
}

#[test]
fn idn_is_refused_before_matching() {
    // The normaliser refuses the Unicode form; the xn-- form is an ordinary name.
    assert!(parse_authority("bücher.example", 443).is_err());
    let s = set(vec![rule("idn", &["xn--bcher-kva.example"])]);
    assert_eq!(connect(&s, "xn--bcher-kva.example"), "allow idn");
    assert_eq!(connect(&s, "XN--BCHER-KVA.example"), "allow idn");
}

#[test]
fn deny_wins() {
    let s = set(vec![
        rule("gh", &["*.github.com", "github.com"]),
        deny_rule("no-gist", &["gist.github.com"]),
        rule("gist-too", &["gist.github.com"]),
    ]);
    assert_eq!(connect(&s, "api.github.com"), "allow gh");
    assert_eq!(connect(&s, "gist.github.com"), "denied_by_rule no-gist");
    // On every port, listed by an allow rule or not.
    assert_eq!(connect(&s, "gist.github.com:80"), "denied_by_rule no-gist");
    assert_eq!(connect(&s, "gist.github.com:22"), "denied_by_rule no-gist");
    // And for every request.
    assert_eq!(
        request(&s, "gist.github.com", "GET", "/"),
        "denied_by_rule no-gist"
    );
    // Order does not matter.
    let s = set(vec![
        deny_rule("no", &["*.x.com"]),
        rule("yes", &["a.x.com"]),
    ]);
    assert_eq!(connect(&s, "a.x.com"), "denied_by_rule no");
    let s = set(vec![
        rule("yes", &["a.x.com"]),
        deny_rule("no", &["*.x.com"]),
    ]);
    assert_eq!(connect(&s, "a.x.com"), "denied_by_rule no");
    // A deny alone allows nothing else.
    assert_eq!(connect(&s, "x.com"), "no_rule");
}

#[test]
fn ports() {
    let ssh = Rule {
        ports: vec![22],
        ..rule("ssh", &["github.com"])
    };
    let s = set(vec![
        rule("gh", &["github.com"]),
        ssh,
        rule("api", &["api.x.com"]),
    ]);
    assert_eq!(connect(&s, "github.com"), "allow gh");
    assert_eq!(connect(&s, "github.com:443"), "allow gh");
    assert_eq!(connect(&s, "github.com:22"), "allow ssh");
    assert_eq!(connect(&s, "github.com:80"), "port_not_allowed gh");
    assert_eq!(connect(&s, "api.x.com:8443"), "port_not_allowed api");
    assert_eq!(
        request(&s, "api.x.com:80", "GET", "/"),
        "port_not_allowed api"
    );
}

#[test]
fn methods() {
    let gh = Rule {
        methods: strings(&["GET", "POST"]),
        ..rule("gh", &["api.github.com"])
    };
    let s = set(vec![gh]);
    assert_eq!(request(&s, "api.github.com", "GET", "/"), "allow gh");
    assert_eq!(request(&s, "api.github.com", "get", "/"), "allow gh");
    assert_eq!(request(&s, "api.github.com", "Post", "/x"), "allow gh");
    assert_eq!(
        request(&s, "api.github.com", "DELETE", "/"),
        "method_not_allowed gh"
    );
    assert_eq!(
        request(&s, "api.github.com", "GETX", "/"),
        "method_not_allowed gh"
    );
    // The connection is allowed but must be inspected.
    let target = parse_authority("api.github.com", 443).unwrap();
    let Verdict::Allow(a) = s.decide(&target, None) else {
        panic!("denied")
    };
    assert!(a.needs_inspect);
}

#[test]
fn paths() {
    let gh = Rule {
        methods: strings(&["GET", "POST"]),
        paths: strings(&["/repos/acme/**", "/users/*/keys", "/files/*.json"]),
        ..rule("gh", &["api.github.com"])
    };
    let s = set(vec![gh]);
    let r = |path: &str| request(&s, "api.github.com", "GET", path);
    assert_eq!(r("/repos/acme"), "allow gh");
    assert_eq!(r("/repos/acme/"), "allow gh");
    assert_eq!(r("/repos/acme/widget/issues/1"), "allow gh");
    assert_eq!(r("/repos/acm%65/widget"), "allow gh");
    assert_eq!(r("/repos/acmex/widget"), "path_not_allowed gh");
    assert_eq!(r("/repos/other/widget"), "path_not_allowed gh");
    assert_eq!(r("/users/octo/keys"), "allow gh");
    assert_eq!(r("/users/octo/cat/keys"), "path_not_allowed gh");
    assert_eq!(r("/files/a.json"), "allow gh");
    assert_eq!(r("/files/a.json.bak"), "path_not_allowed gh");
    assert_eq!(r("/files/sub/a.json"), "path_not_allowed gh");
    // The method is checked before the path.
    assert_eq!(
        request(&s, "api.github.com", "DELETE", "/x"),
        "method_not_allowed gh"
    );
    // Strict refusals: encoded slash, dot segments, empty segments, double encoding.
    for bad in [
        "/repos/acme%2F..%2Fother/x",
        "/repos/acme/a%2fb",
        "/repos/acme/../other",
        "/repos/acme/%2e%2e/other",
        "/repos/acme/%2E./other",
        "/repos/acme/..;/other",
        "/repos/acme/./x",
        "/repos//acme/x",
        "//repos/acme/x",
        "/repos/acme/a%5Cb",
        "/repos/acme/a\\b",
        "/repos/acme/%252e%252e/x",
        "/repos/acme/%00",
        "/repos/acme/%zz",
        "/repos/acme/%2",
        "/repos/acme/%ff",
        "repos/acme/x",
        "*",
        "",
    ] {
        assert_eq!(r(bad), "path_not_allowed gh", "{bad}");
    }
}

#[test]
fn a_rule_without_paths_does_not_look_at_the_path() {
    let s = set(vec![rule("any", &["a.x.com"])]);
    assert_eq!(request(&s, "a.x.com", "GET", "/a//b/../c%2F"), "allow any");
    let target = parse_authority("a.x.com", 443).unwrap();
    let Verdict::Allow(a) = s.decide(&target, None) else {
        panic!("denied")
    };
    assert!(!a.needs_inspect);
}

#[test]
fn request_level_deny_rules() {
    let no_delete = Rule {
        methods: strings(&["DELETE"]),
        ..deny_rule("no-delete", &["api.x.com"])
    };
    let no_admin = Rule {
        paths: strings(&["/admin/**"]),
        ..deny_rule("no-admin", &["api.x.com"])
    };
    let s = set(vec![rule("api", &["api.x.com"]), no_delete, no_admin]);
    assert_eq!(request(&s, "api.x.com", "GET", "/x"), "allow api");
    assert_eq!(
        request(&s, "api.x.com", "delete", "/x"),
        "denied_by_rule no-delete"
    );
    assert_eq!(
        request(&s, "api.x.com", "GET", "/admin/users"),
        "denied_by_rule no-admin"
    );
    // An ambiguous path counts as matching a deny rule's paths.
    assert_eq!(
        request(&s, "api.x.com", "GET", "/x/../admin"),
        "denied_by_rule no-admin"
    );
    assert_eq!(
        request(&s, "api.x.com", "GET", "/%61dmin/x"),
        "denied_by_rule no-admin"
    );
    // The connection is allowed, but must be inspected to hold requests to them.
    let target = parse_authority("api.x.com", 443).unwrap();
    let Verdict::Allow(a) = s.decide(&target, None) else {
        panic!("denied")
    };
    assert_eq!(a.rule, "api");
    assert!(a.needs_inspect);
}

#[test]
fn the_most_permissive_rule_admits_the_connection() {
    let narrow = Rule {
        paths: strings(&["/a/**"]),
        ..rule("narrow", &["h.x.com"])
    };
    let s = set(vec![narrow, rule("wide", &["h.x.com"])]);
    let target = parse_authority("h.x.com", 443).unwrap();
    let Verdict::Allow(a) = s.decide(&target, None) else {
        panic!("denied")
    };
    assert_eq!((a.rule.as_str(), a.needs_inspect), ("wide", false));
    assert_eq!(request(&s, "h.x.com", "GET", "/a/b"), "allow narrow");
    assert_eq!(request(&s, "h.x.com", "GET", "/b"), "allow wide");
    assert_eq!(request(&s, "h.x.com", "GET", "/a//b"), "allow wide");
}

#[test]
fn ip_literals_match_only_ip_rules() {
    let s = set(vec![
        rule("names", &["*.example.com", "example.com"]),
        rule("one", &["ip:11.0.0.1"]),
        rule("net", &["ip:10.0.0.0/8", "ip:2001:db8::/32"]),
        deny_rule("no", &["ip:10.9.0.0/16"]),
    ]);
    assert_eq!(connect(&s, "11.0.0.1"), "allow one");
    assert_eq!(connect(&s, "11.0.0.2"), "ip_literal");
    assert_eq!(connect(&s, "10.1.2.3"), "allow net");
    assert_eq!(connect(&s, "10.9.1.1"), "denied_by_rule no");
    assert_eq!(connect(&s, "[2001:db8::5]"), "allow net");
    assert_eq!(connect(&s, "[2001:db9::5]"), "ip_literal");
    // IPv4-mapped addresses are not unwrapped.
    assert_eq!(connect(&s, "[::ffff:11.0.0.1]"), "ip_literal");
    assert_eq!(connect(&s, "11.0.0.1:80"), "port_not_allowed one");
    // An empty set knows only refusals.
    assert_eq!(connect(&RuleSet::default(), "1.1.1.1"), "ip_literal");
    assert_eq!(connect(&RuleSet::default(), "a.com"), "no_rule");
}

#[test]
fn allow_private_is_carried() {
    let nexus = Rule {
        allow_private: vec!["10.1.2.3/32".parse().unwrap()],
        ..rule("nexus", &["nexus.corp.example"])
    };
    let other = Rule {
        allow_private: vec![
            "10.1.2.4/32".parse().unwrap(),
            "10.1.2.3/32".parse().unwrap(),
        ],
        methods: strings(&["GET"]),
        ..rule("other", &["nexus.corp.example"])
    };
    let s = set(vec![nexus, other]);
    let target = parse_authority("nexus.corp.example", 443).unwrap();
    let Verdict::Allow(a) = s.decide(&target, None) else {
        panic!("denied")
    };
    let want: Vec<IpNet> = vec![
        "10.1.2.3/32".parse().unwrap(),
        "10.1.2.4/32".parse().unwrap(),
    ];
    assert_eq!(a.allow_private, want);
    let Verdict::Allow(a) = s.decide(
        &target,
        Some(Request {
            method: "GET",
            path: "/",
        }),
    ) else {
        panic!("denied")
    };
    assert_eq!(a.rule, "nexus");
    assert_eq!(
        a.allow_private,
        vec!["10.1.2.3/32".parse::<IpNet>().unwrap()]
    );
}

#[test]
fn decide_host_agrees() {
    let s = set(vec![
        Rule {
            ports: vec![22],
            ..rule("ssh", &["github.com"])
        },
        deny_rule("no-gist", &["gist.github.com"]),
        rule("wild", &["*.github.com"]),
    ]);
    let host = |s: &str| crate::egress::target::normalize_host(s).unwrap();
    assert!(s.decide_host(&host("github.com")).is_allow());
    assert!(s.decide_host(&host("api.github.com")).is_allow());
    assert_eq!(
        outcome(s.decide_host(&host("gist.github.com"))),
        "denied_by_rule no-gist"
    );
    assert_eq!(outcome(s.decide_host(&host("example.com"))), "no_rule");
    assert_eq!(outcome(s.decide_host(&host("1.2.3.4"))), "ip_literal");
}

#[test]
fn set_accessors() {
    let s = RuleSet::new(vec![rule("a", &["a.com"])], 42);
    assert_eq!(s.version(), 42);
    assert_eq!(s.rules().len(), 1);
}

#[test]
fn reasons_have_their_spec_names() {
    let names: Vec<&str> = DenyReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        names,
        [
            "no_rule",
            "denied_by_rule",
            "port_not_allowed",
            "method_not_allowed",
            "path_not_allowed",
            "rule_expired",
            "approval_pending",
            "approval_denied",
            "unattended",
            "private_address",
            "dns_failed",
            "ip_literal",
            "not_tls",
            "sni_missing",
            "sni_mismatch",
            "host_mismatch",
            "credential_required",
            "placeholder_misuse",
            "bad_request",
            "too_many_streams",
            "audit_unavailable",
        ]
    );
    for reason in DenyReason::ALL {
        let json = serde_json::to_string(&reason).unwrap();
        assert_eq!(json, format!("\"{}\"", reason.as_str()));
        assert!(!reason.explain().is_empty());
        assert_eq!(reason.to_string(), reason.as_str());
    }
    assert_eq!(DenyReason::NoRule.explain(), "no rule allows it");
    assert_eq!(DenyReason::DeniedByRule.explain(), "a deny rule refuses it");
}

#[test]
fn globs() {
    assert!(glob_matches("/**", "/"));
    assert!(glob_matches("/**", "/a/b"));
    assert!(glob_matches("/", "/"));
    assert!(!glob_matches("/", "/a"));
    assert!(glob_matches("/a/**/z", "/a/z"));
    assert!(glob_matches("/a/**/z", "/a/b/c/z"));
    assert!(!glob_matches("/a/**/z", "/a/b/c/y"));
    assert!(glob_matches("/a/*", "/a/b"));
    assert!(!glob_matches("/a/*", "/a/b/c"));
    assert!(glob_matches("/v*/x", "/v1/x"));
    assert!(glob_matches("/*a*b*", "/xaybz"));
    assert!(!glob_matches("/*a*b*", "/xbya"));
    assert!(!glob_matches("/aa*aa", "/aaa"));
    assert!(glob_matches("/aa*aa", "/aaaa"));
    // Many `**` stay linear in the path.
    let long = format!("/{}", vec!["s"; 4000].join("/"));
    assert!(!glob_matches("/**/**/**/**/**/**/x", &long));

    assert!(check_path_glob("/repos/acme/**").is_ok());
    assert!(check_path_glob("/").is_ok());
    assert!(check_path_glob("/files/*.json").is_ok());
    for bad in [
        "repos", "/a//b", "/a/../b", "/a/./b", "/a%2Fb", "/a?x=1", "/a/**b", "/a\\b",
    ] {
        let e = check_path_glob(bad).unwrap_err();
        assert!(e.contains("write"), "{bad}: {e}");
    }
}
