//! `beige egress test AGENT URL` (alias `check`): a dry run of an agent's egress rules.
//!
//! Loads the config as the gateway would, builds the agent's rule set with the gateway's
//! own code ([`beige_core::egress::config::rule_set`]), decides the URL with the one matcher
//! ([`RuleSet::decide`]), then, unless `--no-resolve`, resolves the host with the host's
//! resolver and classifies every address with the one classifier
//! ([`classify::permitted`]). Nothing is ever sent to the host. Exit codes: 0 allowed,
//! 1 refused, 2 wrong usage, a config that does not load, or no such agent.
//!
//! Also owns the one-line egress posture of an agent that `beige doctor` prints
//! ([`posture`]).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use beige_core::config::{AgentConfig, Config, NetworkMode};
use beige_core::egress::classify::{self, AddressClass};
use beige_core::egress::config as egress_config;
use beige_core::egress::rules::{Action, Allowed, DenyReason, Request, RuleSet, Verdict};
use beige_core::egress::target::{parse_authority, Host, Target};
use beige_core::egress::upstream::{HickoryResolver, Resolver};
use beige_core::home::BeigeHome;

use crate::cli::EgressTestArgs;
use crate::Exit;

/// How long resolving may take in all, as in the gateway.
const RESOLVE_BUDGET: Duration = Duration::from_secs(5);

/// Exit code: the gateway would refuse the connection.
const REFUSED: u8 = 1;
/// Exit code: wrong usage, a config that does not load, no such agent.
const USAGE: u8 = 2;

/// What the URL asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Probe {
    target: Target,
    /// `https`, `http` or `connect` (a bare `host:port`).
    kind: Kind,
    /// The path as written (with no query), `/` when there is none.
    path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Https,
    Http,
    Connect,
}

/// Reads `https://host[:port][/path]`, `http://host[:port][/path]` or `host[:port]`.
fn parse_url(url: &str) -> Result<Probe, String> {
    let (kind, rest) = match url.split_once("://") {
        Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
            "https" => (Kind::Https, rest),
            "http" => (Kind::Http, rest),
            other => {
                return Err(format!(
                "'{}': only https://, http:// or a bare host:port can be tested, not {other}://",
                url.escape_debug()
            ))
            }
        },
        None => (Kind::Connect, url),
    };
    let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    if kind == Kind::Connect && !path.is_empty() {
        return Err(format!(
            "'{}': a path needs a scheme; write https://{rest} or http://{rest}",
            url.escape_debug()
        ));
    }
    if authority.contains('@') {
        return Err(format!(
            "'{}': user info (user@host) is not part of a destination; leave it out",
            url.escape_debug()
        ));
    }
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let path = if path.is_empty() { "/" } else { path };
    let default_port = if kind == Kind::Http { 80 } else { 443 };
    let target = parse_authority(authority, default_port)
        .map_err(|e| format!("'{}': {e}", url.escape_debug()))?;
    Ok(Probe {
        target,
        kind,
        path: path.to_string(),
    })
}

/// Loads the config as the gateway does; every failure is a usage error (exit 2).
fn load(home: &BeigeHome, explicit: Option<&Path>) -> Result<Config> {
    let path = explicit
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.config_path());
    if !path.exists() {
        return Err(Exit::new(
            USAGE,
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
            USAGE,
            format!(
                "error: the config does not load: {e}\n(check it with `beige config validate`)"
            ),
        )
        .into()),
    }
}

pub async fn test(home: &BeigeHome, config: Option<&Path>, args: EgressTestArgs) -> Result<()> {
    let probe = parse_url(&args.url).map_err(|e| Exit::new(USAGE, format!("error: {e}")))?;
    let method = args.method.to_ascii_uppercase();
    if probe.kind == Kind::Http
        && (method.is_empty()
            || !method
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err(Exit::new(
            USAGE,
            format!(
                "error: '{}' is not an HTTP method; write e.g. GET or POST",
                args.method.escape_debug()
            ),
        )
        .into());
    }
    let config = load(home, config)?;
    let name = args.agent.as_str();
    let Some(agent) = config.agents.get(name) else {
        let known: Vec<&str> = config.agents.keys().map(String::as_str).collect();
        return Err(Exit::new(
            USAGE,
            format!(
                "error: no agent '{name}' in the config; the agents are: {}",
                if known.is_empty() {
                    "(none)".to_string()
                } else {
                    known.join(", ")
                }
            ),
        )
        .into());
    };

    let target = &probe.target;
    let how = match probe.kind {
        Kind::Https => "https: a CONNECT tunnel".to_string(),
        Kind::Connect => "a CONNECT tunnel".to_string(),
        Kind::Http => format!("plain http: {method} {}", probe.path),
    };
    println!("agent '{name}' → {target} ({how})");

    let Some(agent_egress) = &agent.egress else {
        if agent.sandbox.network == NetworkMode::Bridge {
            println!(
                "⚠ agent '{name}' has sandbox.network \"bridge\": open egress, not controlled by beige (no rules, no audit); its sandbox reaches {target} directly, if the network lets it"
            );
            return Ok(());
        }
        return Err(Exit::new(
            REFUSED,
            format!(
                "✗ agent '{name}' has no egress: every connection from its sandbox is refused (add agents.{name}.egress)"
            ),
        )
        .into());
    };
    let rules = egress_config::rule_set(config.egress.as_ref(), name, agent_egress, 0).map_err(
        |errors| {
            let lines: Vec<String> = errors.iter().map(|e| format!("  {e}")).collect();
            Exit::new(
                USAGE,
                format!(
                    "error: the egress rules of agent '{name}' are invalid:\n{}",
                    lines.join("\n")
                ),
            )
        },
    )?;

    let request = (probe.kind == Kind::Http).then(|| Request {
        method: &method,
        path: &probe.path,
    });
    let allowed = match rules.decide(target, request) {
        Verdict::Deny(d) => {
            print_refusal(name, target, d.reason, d.rule.as_deref(), &rules);
            return Err(Exit::silent(REFUSED).into());
        }
        Verdict::Allow(a) => a,
    };
    let mode = match (probe.kind == Kind::Http, allowed.needs_inspect) {
        (true, _) => "http",
        (false, true) => "inspect",
        (false, false) => "tunnel",
    };
    println!("✓ allowed by rule '{}' (mode {mode})", allowed.rule);
    if mode == "inspect" {
        println!(
            "• the connection is inspected: the gateway answers its TLS with a certificate from the home's egress CA (installed in the sandbox at /beige/ca) and checks each request's method and path"
        );
        if let Some(c) = rules.credential_for(&target.host) {
            let how = match &c.delivery {
                beige_core::egress::config::Delivery::Inject { header, .. } => {
                    format!("sets header `{header}`")
                }
                beige_core::egress::config::Delivery::Placeholder { env, .. } => format!(
                    "swaps the placeholder in ${env} for the secret{}",
                    if c.require {
                        "; a request without it is refused (credential_required)"
                    } else {
                        ""
                    }
                ),
            };
            println!("• credential '{}': the gateway {how}", c.name);
        }
    } else if probe.kind != Kind::Http {
        println!("• only the connection was decided: its bytes are tunnelled, not read");
    }

    if args.no_resolve {
        println!(
            "• not resolved (--no-resolve): the gateway still refuses it if the host does not resolve (dns_failed) or if any address is private or special{} (private_address)",
            if allowed.allow_private.is_empty() {
                String::new()
            } else {
                format!(" outside allowPrivate {}", nets(&allowed.allow_private))
            }
        );
        println!("→ allowed");
        return Ok(());
    }

    let addrs = match &target.host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(host) => match resolve(host).await {
            Ok(addrs) => addrs,
            Err(e) => {
                println!(
                    "✗ refused: {} ({}): {e}",
                    DenyReason::DnsFailed.as_str(),
                    DenyReason::DnsFailed.explain()
                );
                println!("→ refused");
                return Err(Exit::silent(REFUSED).into());
            }
        },
    };
    let source = match &target.host {
        Host::Ip(_) => "the address itself",
        Host::Name(_) => "this machine's resolver",
    };
    println!("addresses ({source}):");
    let mut refused = false;
    for ip in &addrs {
        let line = address_line(*ip, &allowed);
        refused |= line.starts_with('✗');
        println!("  {line}");
    }
    if refused {
        println!(
            "✗ refused: {} ({}); the gateway refuses the host if any of its addresses is refused",
            DenyReason::PrivateAddress.as_str(),
            DenyReason::PrivateAddress.explain()
        );
        println!("→ refused");
        return Err(Exit::silent(REFUSED).into());
    }
    println!("→ allowed");
    Ok(())
}

/// `✓ 1.2.3.4: public, would be dialled` or `✗ 10.0.0.1 (private): refused: …`.
fn address_line(ip: IpAddr, allowed: &Allowed) -> String {
    let allow_private = allowed.allow_private.as_slice();
    match (
        classify::permitted(ip, allow_private),
        classify::classify(ip),
    ) {
        (Ok(()), AddressClass::Public) => format!("✓ {ip}: public, would be dialled"),
        (Ok(()), AddressClass::Denied(special)) => format!(
            "✓ {ip} ({special}): inside allowPrivate {}, would be dialled",
            nets(allow_private)
        ),
        (Err(special), _) => {
            let why = if special.never_allowed() {
                "never allowed, whatever allowPrivate says".to_string()
            } else if allow_private.is_empty() {
                "no allowPrivate covers it".to_string()
            } else {
                format!("outside allowPrivate {}", nets(allow_private))
            };
            format!(
                "✗ {ip} ({special}): refused: {} ({why})",
                DenyReason::PrivateAddress.as_str()
            )
        }
    }
}

/// The host's addresses from the system resolver, within the gateway's budget.
async fn resolve(host: &str) -> Result<Vec<IpAddr>, String> {
    let resolver = HickoryResolver::system().map_err(|e| e.to_string())?;
    match tokio::time::timeout(RESOLVE_BUDGET, resolver.resolve(host)).await {
        Ok(Ok(addrs)) if !addrs.is_empty() => Ok(addrs),
        Ok(Ok(_)) => Err(format!("'{host}' has no addresses")),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "resolving '{host}' took longer than {}s",
            RESOLVE_BUDGET.as_secs()
        )),
    }
}

/// The refusal as the tool prints it: reason, explanation, the rule concerned, and what
/// the sandbox's client would get.
fn print_refusal(
    agent: &str,
    target: &Target,
    reason: DenyReason,
    rule: Option<&str>,
    rules: &RuleSet,
) {
    println!("✗ refused: {} ({})", reason.as_str(), reason.explain());
    match rule {
        Some(id) => {
            let hint = match reason {
                DenyReason::DeniedByRule => "the deny rule".to_string(),
                DenyReason::PortNotAllowed => {
                    let ports = rules
                        .rules()
                        .iter()
                        .find(|r| r.id == id)
                        .map(|r| {
                            r.ports
                                .iter()
                                .map(u16::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        })
                        .unwrap_or_default();
                    format!(
                        "it allows the host on port(s) {ports}; add {} to its `ports` to allow this one",
                        target.port
                    )
                }
                _ => "the allow rule for the host".to_string(),
            };
            println!("  rule: '{id}' ({hint})");
        }
        None => {
            let hint = match reason {
                DenyReason::IpLiteral => {
                    "IP literals match only `ip:` rules; use the host's name, or add a rule with hosts [\"ip:ADDR\"]"
                }
                _ => "no rule names this host; add one to the agent's egress.rules",
            };
            println!("  rule: none ({hint})");
        }
    }
    println!(
        "  the client gets: 403 Forbidden, X-Beige-Egress: denied; reason={}; id=…",
        reason.as_str()
    );
    println!(
        "  and the body: beige: egress to {target} refused for agent '{agent}': {}",
        reason.explain()
    );
    println!("→ refused");
}

fn nets<T: std::fmt::Display>(nets: &[T]) -> String {
    let list: Vec<String> = nets.iter().map(ToString::to_string).collect();
    format!("[{}]", list.join(", "))
}

/// The egress posture of agent `name`, for `beige doctor`: `Ok(line)` for a note,
/// `Err(line)` for a warning.
pub fn posture(config: &Config, name: &str, agent: &AgentConfig) -> Result<String, String> {
    if agent.sandbox.network == NetworkMode::Bridge {
        return Err(format!(
            "agent '{name}': egress: open egress, not controlled by beige (no rules, no audit) — sandbox.network is \"bridge\"; remove it and add agents.{name}.egress to go through the gateway"
        ));
    }
    let Some(egress) = &agent.egress else {
        return Ok(format!(
            "agent '{name}': egress: none (no egress: sealed; add agents.{name}.egress to allow hosts)"
        ));
    };
    let rules = egress_config::rule_set(config.egress.as_ref(), name, egress, 0)
        .map_err(|e| format!("agent '{name}': egress: invalid rules: {}", e[0]))?;
    let mut hosts: Vec<String> = Vec::new();
    for rule in rules.rules() {
        if rule.action == Action::Allow {
            for h in &rule.hosts {
                let h = h.to_string();
                if !hosts.contains(&h) {
                    hosts.push(h);
                }
            }
        }
    }
    let n = rules.rules().len();
    let noun = if n == 1 { "rule" } else { "rules" };
    Ok(format!(
        "agent '{name}': egress: through the gateway: {n} {noun} (hosts: {})",
        if hosts.is_empty() {
            "none allowed".to_string()
        } else {
            hosts.join(", ")
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_become_targets() {
        let p = parse_url("https://PyPI.org/simple/requests/?x=1#f").unwrap();
        assert_eq!(p.target.to_string(), "pypi.org:443");
        assert_eq!(p.kind, Kind::Https);
        assert_eq!(p.path, "/simple/requests/");
        let p = parse_url("http://example.com:8080").unwrap();
        assert_eq!(p.target.to_string(), "example.com:8080");
        assert_eq!(p.path, "/");
        assert_eq!(parse_url("http://example.com").unwrap().target.port, 80);
        let p = parse_url("github.com:22").unwrap();
        assert_eq!(p.kind, Kind::Connect);
        assert_eq!(p.target.to_string(), "github.com:22");
        assert_eq!(parse_url("github.com").unwrap().target.port, 443);
        assert_eq!(
            parse_url("https://[2001:db8::1]:8443/")
                .unwrap()
                .target
                .to_string(),
            "[2001:db8::1]:8443"
        );
        assert!(parse_url("ftp://x.example").unwrap_err().contains("ftp://"));
        assert!(parse_url("x.example/path")
            .unwrap_err()
            .contains("https://"));
        assert!(parse_url("https://u:p@x.example/")
            .unwrap_err()
            .contains("user info"));
        assert!(parse_url("https://x.example:0/").is_err());
        assert!(parse_url("https://bücher.example/").is_err());
    }
}
