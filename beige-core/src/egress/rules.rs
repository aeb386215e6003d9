//! The one rule matcher (spec `egress.md` §1.7, §2, §5 step 2).
//!
//! Owns what a rule is ([`Rule`], its [`HostPattern`]s), the pinned snapshot of an
//! agent's rules ([`RuleSet`], with its policy `version`) and the only function that
//! decides whether a destination, and then each inspected request, may go:
//! [`RuleSet::decide`]. CONNECT, transparent entry, SNI and `Host` checks, DNS answers,
//! config validation and approvals all call it, so they cannot disagree. It also owns the
//! refusal reasons every part of egress reports ([`DenyReason`]).
//!
//! The decision, in order (the order of the rules never changes the kind of verdict;
//! where several rules qualify, the first in the set's order is the one named):
//!
//! 1. Only rules with a pattern matching the host take part. A name matches an exact
//!    pattern equal to it or a `*.` pattern it lies strictly below; an IP literal matches
//!    only `ip:` patterns. None: `no_rule` (`ip_literal` for an address).
//! 2. A deny rule without methods or paths refuses the host on every port:
//!    `denied_by_rule`. It beats every allow.
//! 3. With a request, a deny rule with methods or paths refuses the requests it matches
//!    (`denied_by_rule`); a path that cannot be matched unambiguously counts as matching.
//! 4. Some allow rule must match the host (else `no_rule`, or `ip_literal`) and list the
//!    port (else `port_not_allowed`).
//! 5. With a request, one of those allow rules must also accept its method
//!    (case-insensitively) and its path (globs on the percent-decoded path), else
//!    `method_not_allowed` or `path_not_allowed`.
//!
//! Paths are matched strictly, because the gateway and the upstream must see the same
//! path: a path that does not start with `/`, contains `..` or `.` segments (also when
//! percent-encoded or followed by `;params`), an empty segment (`//`), an encoded `/` or
//! `\` (`%2F`, `%5C`), a raw `\`, a control character, a malformed or double (`%252F`)
//! escape, or bytes that are not UTF-8 once decoded, matches no path glob. An allow rule
//! with `paths` then refuses it as `path_not_allowed`; a rule without `paths` does not
//! look at the path at all.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::config::Credential;
use super::target::{normalize_host, Host, Target, TargetError};

/// The fix every host-pattern error ends with (spec §2, validation).
const PATTERN_FIX: &str = "write `*.example.com`, `ip:1.2.3.4`, `xn--…`";

/// One entry of a rule's `hosts`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// `api.example.com`: that name only (normalised: lower case, no trailing dot).
    Exact(String),
    /// `*.example.com`, stored without the `*.`: any name any depth below it, not the
    /// apex itself.
    Suffix(String),
    /// `ip:1.2.3.4` or `ip:10.0.0.0/8`: IP literals in that range (never names).
    Ip(IpNet),
}

/// Why a host pattern was refused; each message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// An empty string.
    #[error("the host pattern is empty; write `api.example.com`, `*.example.com` or `ip:1.2.3.4`")]
    Empty,
    /// `*` on its own.
    #[error("`*` would allow every host; {PATTERN_FIX}")]
    LoneWildcard,
    /// `*.com`: fewer than two labels after `*.`.
    #[error("`{0}` is too broad: a wildcard needs at least two labels after `*.`; {PATTERN_FIX}")]
    TooBroad(String),
    /// `a*.x.com`, `*x.com`, `x.*.com`: `*` that is not the whole first label.
    #[error("`{0}`: `*` can only be the whole first label; {PATTERN_FIX}")]
    PartialWildcard(String),
    /// `host:port`.
    #[error("`{0}`: a host pattern has no port (list it in `ports`); {PATTERN_FIX}")]
    HostPort(String),
    /// A bare IP address or bracketed IPv6 address.
    #[error("`{pattern}` is a bare IP address; write `ip:{addr}`")]
    BareIp {
        /// The pattern as written, shortened.
        pattern: String,
        /// The address it names.
        addr: IpAddr,
    },
    /// `*.` followed by an address.
    #[error("`{0}`: a wildcard covers names, not addresses; write a range, `ip:1.2.3.0/24`")]
    WildcardIp(String),
    /// A non-ASCII name: IDN names are refused, not converted.
    #[error("`{0}` is not ASCII: IDN names are refused, not converted; {PATTERN_FIX}")]
    NonAscii(String),
    /// `ip:` followed by something that is not an address or CIDR.
    #[error("`{0}` is not an IP address or CIDR; write `ip:1.2.3.4` or `ip:10.0.0.0/8`")]
    BadIp(String),
    /// `ip:10.0.0.1/8`: bits set after the prefix.
    #[error("`{pattern}` has bits set after the prefix length; write `ip:{network}`")]
    HostBits {
        /// The pattern as written, shortened.
        pattern: String,
        /// The network it probably means.
        network: IpNet,
    },
    /// Not a valid name.
    #[error("`{pattern}`: {reason}; {PATTERN_FIX}")]
    BadName {
        /// The pattern as written, shortened.
        pattern: String,
        /// What is wrong with the name.
        reason: TargetError,
    },
}

/// A pattern as an error may quote it: escaped, at most 80 characters.
fn shown(s: &str) -> String {
    const MAX: usize = 80;
    let mut out: String = s.chars().take(MAX).flat_map(char::escape_debug).collect();
    if s.chars().count() > MAX {
        out.push('…');
    }
    out
}

/// A pattern written after `ip:`: an address (a single-address range) or a CIDR.
fn parse_ip_pattern(written: &str, rest: &str) -> Result<HostPattern, PatternError> {
    if let Ok(ip) = rest.parse::<IpAddr>() {
        return Ok(HostPattern::Ip(IpNet::from(ip)));
    }
    let net: IpNet = rest
        .parse()
        .map_err(|_| PatternError::BadIp(shown(written)))?;
    if net.trunc() != net {
        return Err(PatternError::HostBits {
            pattern: shown(written),
            network: net.trunc(),
        });
    }
    Ok(HostPattern::Ip(net))
}

/// The address a pattern spells, bare (`1.2.3.4`, `::1`) or bracketed (`[::1]`).
fn as_ip_literal(s: &str) -> Option<IpAddr> {
    let inner = s
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(s);
    inner.parse().ok()
}

impl HostPattern {
    /// Parses one entry of a rule's `hosts`: `api.example.com`, `*.example.com` (at least
    /// two labels after `*.`) or `ip:ADDR[/len]`. Names are normalised as
    /// [`normalize_host`] does. Refused: `*`, `*.com`, `a*.x.com`, `host:port`, bare IP
    /// addresses (they are written `ip:…`) and non-ASCII names (write the `xn--…` form).
    pub fn parse(s: &str) -> Result<HostPattern, PatternError> {
        if s.is_empty() {
            return Err(PatternError::Empty);
        }
        if let Some(rest) = s.strip_prefix("ip:") {
            return parse_ip_pattern(s, rest);
        }
        if !s.is_ascii() {
            return Err(PatternError::NonAscii(shown(s)));
        }
        if s == "*" || s == "*." {
            return Err(PatternError::LoneWildcard);
        }
        if let Some(rest) = s.strip_prefix("*.") {
            if rest.contains('*') {
                return Err(PatternError::PartialWildcard(shown(s)));
            }
            if rest.contains(':') {
                return Err(PatternError::HostPort(shown(s)));
            }
            return match normalize_host(rest) {
                Ok(Host::Name(name)) if name.contains('.') => Ok(HostPattern::Suffix(name)),
                Ok(Host::Name(_)) => Err(PatternError::TooBroad(shown(s))),
                Ok(Host::Ip(_)) => Err(PatternError::WildcardIp(shown(s))),
                Err(reason) => Err(PatternError::BadName {
                    pattern: shown(s),
                    reason,
                }),
            };
        }
        if s.contains('*') {
            return Err(PatternError::PartialWildcard(shown(s)));
        }
        if let Some(addr) = as_ip_literal(s) {
            return Err(PatternError::BareIp {
                pattern: shown(s),
                addr,
            });
        }
        if s.contains(':') {
            return Err(PatternError::HostPort(shown(s)));
        }
        match normalize_host(s) {
            Ok(Host::Name(name)) => Ok(HostPattern::Exact(name)),
            Ok(Host::Ip(addr)) => Err(PatternError::BareIp {
                pattern: shown(s),
                addr,
            }),
            Err(reason) => Err(PatternError::BadName {
                pattern: shown(s),
                reason,
            }),
        }
    }

    /// Whether `host` matches: a name equal to an exact pattern or strictly below a
    /// `*.` pattern; an address inside an `ip:` range. Names never match `ip:` patterns
    /// and addresses never match name patterns.
    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Exact(pattern), Host::Name(name)) => pattern == name,
            (HostPattern::Suffix(suffix), Host::Name(name)) => name
                .strip_suffix(suffix.as_str())
                .and_then(|below| below.strip_suffix('.'))
                .is_some_and(|below| !below.is_empty()),
            (HostPattern::Ip(net), Host::Ip(ip)) => net.contains(ip),
            _ => false,
        }
    }

    /// Whether this is a `*.` pattern (a rule with one may not have `allowPrivate`).
    pub fn is_wildcard(&self) -> bool {
        matches!(self, HostPattern::Suffix(_))
    }
}

/// As written in config: `api.example.com`, `*.example.com`, `ip:1.2.3.4`,
/// `ip:10.0.0.0/8`.
impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(name) => f.write_str(name),
            HostPattern::Suffix(suffix) => write!(f, "*.{suffix}"),
            HostPattern::Ip(net) if net.prefix_len() == net.max_prefix_len() => {
                write!(f, "ip:{}", net.addr())
            }
            HostPattern::Ip(net) => write!(f, "ip:{net}"),
        }
    }
}

/// What a rule does with what it matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Let it through (the default).
    #[default]
    Allow,
    /// Refuse it; beats every allow and every approval.
    Deny,
}

/// Where a rule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleSource {
    /// The config file (`egress.rules` or `agents.<a>.egress.rules`).
    Config,
    /// A human's decision on an approval request (spec §6).
    Approval,
}

/// One checked rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Unique within the set; named in verdicts, audit records and refusals.
    pub id: String,
    /// The hosts it covers; never empty in a validated rule.
    pub hosts: Vec<HostPattern>,
    /// The ports an allow rule admits (config default `[443]`). A deny rule refuses its
    /// hosts on every port and ignores this.
    pub ports: Vec<u16>,
    /// Allow or deny.
    pub action: Action,
    /// The HTTP methods it covers, upper case; `None` is any. Matched
    /// case-insensitively; only inspected requests have one.
    pub methods: Option<Vec<String>>,
    /// Path globs it covers (`*` within one segment, `**` any number of segments), on
    /// the percent-decoded path; `None` is any.
    pub paths: Option<Vec<String>>,
    /// CIDRs this rule's hosts may resolve into although they are private (spec §5.1).
    pub allow_private: Vec<IpNet>,
    /// Config or approval.
    pub source: RuleSource,
}

impl Rule {
    /// Whether any of its patterns matches `host`.
    pub fn matches_host(&self, host: &Host) -> bool {
        self.hosts.iter().any(|p| p.matches(host))
    }

    /// Whether it has methods or paths, so only inspected requests can be held to it.
    pub fn is_request_level(&self) -> bool {
        self.methods.is_some() || self.paths.is_some()
    }

    fn method_matches(&self, method: &str) -> bool {
        self.methods
            .as_ref()
            .is_none_or(|ms| ms.iter().any(|m| m.eq_ignore_ascii_case(method)))
    }

    /// `path` is the decoded path, `None` when it cannot be matched unambiguously.
    fn path_matches(&self, path: Option<&str>) -> bool {
        match (&self.paths, path) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(globs), Some(path)) => globs.iter().any(|g| glob_matches(g, path)),
        }
    }
}

/// What an inspected request is, for [`RuleSet::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The method as sent (`GET`).
    pub method: &'a str,
    /// The path as sent, percent-encoded, without the query.
    pub path: &'a str,
}

/// Why egress refused something: the `reason` of a 403 and of an audit record
/// (spec §5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DenyReason {
    /// No rule allows the host.
    NoRule,
    /// A deny rule matches.
    DeniedByRule,
    /// Rules allow the host, but none on this port.
    PortNotAllowed,
    /// The rules for the host do not allow this method.
    MethodNotAllowed,
    /// The rules for the host do not allow this path, or it is ambiguous.
    PathNotAllowed,
    /// The time-boxed rule that admitted the stream expired.
    RuleExpired,
    /// An approval request waits for a human.
    ApprovalPending,
    /// A human refused the approval request.
    ApprovalDenied,
    /// Nobody could be asked: an unattended run or an unbound stream.
    Unattended,
    /// The host resolved to a private or special address outside `allowPrivate`.
    PrivateAddress,
    /// The host could not be resolved.
    DnsFailed,
    /// An IP literal no `ip:` rule allows.
    IpLiteral,
    /// `sni: required`, but the client did not start TLS.
    NotTls,
    /// The ClientHello carries no SNI.
    SniMissing,
    /// The SNI names another host than the connection's.
    SniMismatch,
    /// `Host` or `:authority` differs from the SNI.
    HostMismatch,
    /// A bound request did not use its brokered credential.
    CredentialRequired,
    /// A credential placeholder was headed for a host it is not bound to.
    PlaceholderMisuse,
    /// The request could not be parsed.
    BadRequest,
    /// The agent has `maxStreams` streams open.
    TooManyStreams,
    /// The audit record could not be written, so nothing may pass.
    AuditUnavailable,
}

impl DenyReason {
    /// Every reason, in spec order.
    pub const ALL: [DenyReason; 21] = [
        DenyReason::NoRule,
        DenyReason::DeniedByRule,
        DenyReason::PortNotAllowed,
        DenyReason::MethodNotAllowed,
        DenyReason::PathNotAllowed,
        DenyReason::RuleExpired,
        DenyReason::ApprovalPending,
        DenyReason::ApprovalDenied,
        DenyReason::Unattended,
        DenyReason::PrivateAddress,
        DenyReason::DnsFailed,
        DenyReason::IpLiteral,
        DenyReason::NotTls,
        DenyReason::SniMissing,
        DenyReason::SniMismatch,
        DenyReason::HostMismatch,
        DenyReason::CredentialRequired,
        DenyReason::PlaceholderMisuse,
        DenyReason::BadRequest,
        DenyReason::TooManyStreams,
        DenyReason::AuditUnavailable,
    ];

    /// The snake_case name of spec §5.4, as the `X-Beige-Egress` header and audit
    /// records carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::NoRule => "no_rule",
            DenyReason::DeniedByRule => "denied_by_rule",
            DenyReason::PortNotAllowed => "port_not_allowed",
            DenyReason::MethodNotAllowed => "method_not_allowed",
            DenyReason::PathNotAllowed => "path_not_allowed",
            DenyReason::RuleExpired => "rule_expired",
            DenyReason::ApprovalPending => "approval_pending",
            DenyReason::ApprovalDenied => "approval_denied",
            DenyReason::Unattended => "unattended",
            DenyReason::PrivateAddress => "private_address",
            DenyReason::DnsFailed => "dns_failed",
            DenyReason::IpLiteral => "ip_literal",
            DenyReason::NotTls => "not_tls",
            DenyReason::SniMissing => "sni_missing",
            DenyReason::SniMismatch => "sni_mismatch",
            DenyReason::HostMismatch => "host_mismatch",
            DenyReason::CredentialRequired => "credential_required",
            DenyReason::PlaceholderMisuse => "placeholder_misuse",
            DenyReason::BadRequest => "bad_request",
            DenyReason::TooManyStreams => "too_many_streams",
            DenyReason::AuditUnavailable => "audit_unavailable",
        }
    }

    /// A short phrase for the one-line 403 body, after "refused for agent 'a': ".
    pub fn explain(self) -> &'static str {
        match self {
            DenyReason::NoRule => "no rule allows it",
            DenyReason::DeniedByRule => "a deny rule refuses it",
            DenyReason::PortNotAllowed => "no rule allows that port",
            DenyReason::MethodNotAllowed => "no rule allows that method",
            DenyReason::PathNotAllowed => "no rule allows that path",
            DenyReason::RuleExpired => "the rule that allowed it has expired",
            DenyReason::ApprovalPending => "it waits for a human's approval",
            DenyReason::ApprovalDenied => "a human refused it",
            DenyReason::Unattended => "nobody is there to approve it",
            DenyReason::PrivateAddress => "the host resolves to a private or special address",
            DenyReason::DnsFailed => "the host could not be resolved",
            DenyReason::IpLiteral => "no `ip:` rule allows that address",
            DenyReason::NotTls => "the connection is not TLS",
            DenyReason::SniMissing => "the TLS handshake names no host",
            DenyReason::SniMismatch => "the TLS handshake names another host",
            DenyReason::HostMismatch => "the request's host differs from the TLS name",
            DenyReason::CredentialRequired => "the request must use the brokered credential",
            DenyReason::PlaceholderMisuse => {
                "a credential placeholder was sent to a host it is not for"
            }
            DenyReason::BadRequest => "the request could not be read",
            DenyReason::TooManyStreams => "the agent has too many connections open",
            DenyReason::AuditUnavailable => "the audit record could not be written",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`RuleSet::decide`] concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It may go.
    Allow(Allowed),
    /// It is refused.
    Deny(Denied),
}

impl Verdict {
    /// Whether this is an allow.
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow(_))
    }
}

/// An allow verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The id of the rule that allows it.
    pub rule: String,
    /// The private ranges the host may resolve into. For a connection, the union over
    /// every allow rule admitting its host and port; for a request, the allowing rule's.
    pub allow_private: Vec<IpNet>,
    /// Whether requests must be inspected: for a connection, when no rule admits every
    /// request on it (the admitting rules all have methods or paths, or a deny rule with
    /// methods or paths covers the host); for a request, when its rule has methods or
    /// paths.
    pub needs_inspect: bool,
}

/// A deny verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// Why.
    pub reason: DenyReason,
    /// The rule concerned: the deny rule, or an allow rule whose port, method or path
    /// did not fit; `None` when no rule matched the host.
    pub rule: Option<String>,
}

fn deny(reason: DenyReason, rule: Option<&Rule>) -> Verdict {
    Verdict::Deny(Denied {
        reason,
        rule: rule.map(|r| r.id.clone()),
    })
}

/// An agent's rules at one policy version: the snapshot a stream is pinned to. It also
/// holds the credentials the agent is granted, since a host with a bound credential must
/// be inspected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    rules: Vec<Rule>,
    version: u64,
    credentials: Vec<Credential>,
}

impl RuleSet {
    /// The set of `rules` at policy `version`. The rules are taken as checked (config
    /// validation or the approval path made them).
    pub fn new(rules: Vec<Rule>, version: u64) -> Self {
        Self {
            rules,
            version,
            credentials: Vec::new(),
        }
    }

    /// The same set with `credentials` bound to it (checked: at most one per host).
    pub fn with_credentials(mut self, credentials: Vec<Credential>) -> Self {
        self.credentials = credentials;
        self
    }

    /// Every credential the agent is granted.
    pub fn credentials(&self) -> &[Credential] {
        &self.credentials
    }

    /// The credential bound to `host`, if any (only names have one).
    pub fn credential_for(&self, host: &Host) -> Option<&Credential> {
        let name = host.as_name()?;
        self.credentials.iter().find(|c| c.is_for(name))
    }

    /// The policy version this snapshot is.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The rules, in the order they were given.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Decides a connection to `target` (`request` is `None`) or one inspected request
    /// on it (`Some`), as the module documentation describes.
    ///
    /// A connection is admitted in the name of the first allow rule for its host and port
    /// that has no methods or paths, else of the first one that has; a request in the
    /// name of the first allow rule that accepts it. A connection to a host with a bound
    /// credential always `needs_inspect`.
    pub fn decide(&self, target: &Target, request: Option<Request<'_>>) -> Verdict {
        let host = &target.host;
        let no_rule = match host {
            Host::Ip(_) => DenyReason::IpLiteral,
            Host::Name(_) => DenyReason::NoRule,
        };
        let matching: Vec<&Rule> = self.rules.iter().filter(|r| r.matches_host(host)).collect();
        if let Some(rule) = matching
            .iter()
            .find(|r| r.action == Action::Deny && !r.is_request_level())
        {
            return deny(DenyReason::DeniedByRule, Some(rule));
        }
        let path = request.and_then(|req| clean_path(req.path));
        let request_denies: Vec<&Rule> = matching
            .iter()
            .copied()
            .filter(|r| r.action == Action::Deny)
            .collect();
        if let Some(req) = request {
            let hit = request_denies.iter().find(|r| {
                r.method_matches(req.method) && (path.is_none() || r.path_matches(path.as_deref()))
            });
            if let Some(rule) = hit {
                return deny(DenyReason::DeniedByRule, Some(rule));
            }
        }
        let allows: Vec<&Rule> = matching
            .iter()
            .copied()
            .filter(|r| r.action == Action::Allow)
            .collect();
        let Some(first_allow) = allows.first() else {
            return deny(no_rule, None);
        };
        let on_port: Vec<&Rule> = allows
            .iter()
            .copied()
            .filter(|r| r.ports.contains(&target.port))
            .collect();
        if on_port.is_empty() {
            return deny(DenyReason::PortNotAllowed, Some(first_allow));
        }
        let Some(req) = request else {
            let unconditional = on_port.iter().find(|r| !r.is_request_level());
            let Some(rule) = unconditional.or(on_port.first()) else {
                return deny(DenyReason::PortNotAllowed, Some(first_allow));
            };
            let mut allow_private: Vec<IpNet> = Vec::new();
            for net in on_port.iter().flat_map(|r| &r.allow_private) {
                if !allow_private.contains(net) {
                    allow_private.push(*net);
                }
            }
            return Verdict::Allow(Allowed {
                rule: rule.id.clone(),
                allow_private,
                needs_inspect: unconditional.is_none()
                    || !request_denies.is_empty()
                    || self.credential_for(host).is_some(),
            });
        };
        let mut miss: Option<(DenyReason, &Rule)> = None;
        for rule in on_port {
            if !rule.method_matches(req.method) {
                miss = miss.or(Some((DenyReason::MethodNotAllowed, rule)));
                continue;
            }
            if !rule.path_matches(path.as_deref()) {
                if !matches!(miss, Some((DenyReason::PathNotAllowed, _))) {
                    miss = Some((DenyReason::PathNotAllowed, rule));
                }
                continue;
            }
            return Verdict::Allow(Allowed {
                rule: rule.id.clone(),
                allow_private: rule.allow_private.clone(),
                needs_inspect: rule.is_request_level() || !request_denies.is_empty(),
            });
        }
        match miss {
            Some((reason, rule)) => deny(reason, Some(rule)),
            None => deny(DenyReason::MethodNotAllowed, Some(first_allow)),
        }
    }

    /// Whether any port of `host` could be allowed: the question of the DNS stub in
    /// `nxdomain-denied` mode. The same steps as [`RuleSet::decide`] without port and
    /// request: `no_rule` (or `ip_literal`), `denied_by_rule`, else the first allow rule.
    pub fn decide_host(&self, host: &Host) -> Verdict {
        let matching: Vec<&Rule> = self.rules.iter().filter(|r| r.matches_host(host)).collect();
        if let Some(rule) = matching
            .iter()
            .find(|r| r.action == Action::Deny && !r.is_request_level())
        {
            return deny(DenyReason::DeniedByRule, Some(rule));
        }
        match matching.iter().find(|r| r.action == Action::Allow) {
            Some(rule) => Verdict::Allow(Allowed {
                rule: rule.id.clone(),
                allow_private: rule.allow_private.clone(),
                needs_inspect: rule.is_request_level(),
            }),
            None => match host {
                Host::Ip(_) => deny(DenyReason::IpLiteral, None),
                Host::Name(_) => deny(DenyReason::NoRule, None),
            },
        }
    }
}

/// The percent-decoded `raw` path when it can be matched unambiguously, else `None`
/// (the strict rules in the module documentation).
fn clean_path(raw: &str) -> Option<String> {
    if !raw.starts_with('/') {
        return None;
    }
    let mut bytes = Vec::with_capacity(raw.len());
    let mut iter = raw.bytes();
    while let Some(b) = iter.next() {
        let b = if b == b'%' {
            let hi = iter.next().and_then(hex_value)?;
            let lo = iter.next().and_then(hex_value)?;
            let decoded = hi * 16 + lo;
            if decoded == b'/' {
                return None;
            }
            decoded
        } else {
            b
        };
        if b == b'\\' || b.is_ascii_control() {
            return None;
        }
        bytes.push(b);
    }
    let path = String::from_utf8(bytes).ok()?;
    if has_escape(&path) {
        return None;
    }
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate() {
        if segment.is_empty() && i != last {
            return None;
        }
        let bare = segment.split(';').next().unwrap_or(segment);
        if bare == "." || bare == ".." {
            return None;
        }
    }
    Some(path)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether a decoded path still holds a `%XX` escape (it was double-encoded).
fn has_escape(path: &str) -> bool {
    path.as_bytes()
        .windows(3)
        .any(|w| matches!(w, [b'%', hi, lo] if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit()))
}

/// Whether `glob` matches the decoded `path`: `**` is any number of whole segments
/// (zero included, so `/a/**` matches `/a`), `*` any run of characters within one
/// segment (empty included), anything else itself.
pub(crate) fn glob_matches(glob: &str, path: &str) -> bool {
    let path: Vec<&str> = path.split('/').collect();
    // reach[j]: the glob's segments so far match the path's first j segments.
    let mut reach = vec![false; path.len() + 1];
    if let Some(first) = reach.first_mut() {
        *first = true;
    }
    for segment in glob.split('/') {
        let mut next = vec![false; path.len() + 1];
        if segment == "**" {
            let mut any = false;
            for (slot, &here) in next.iter_mut().zip(&reach) {
                any |= here;
                *slot = any;
            }
        } else {
            for (j, part) in path.iter().enumerate() {
                if reach[j] && segment_matches(segment, part) {
                    next[j + 1] = true;
                }
            }
        }
        reach = next;
    }
    reach.last().copied().unwrap_or(false)
}

/// One segment against a glob segment in which `*` is any run of characters.
fn segment_matches(glob: &str, segment: &str) -> bool {
    let mut parts = glob.split('*');
    let first = parts.next().unwrap_or("");
    let rest: Vec<&str> = parts.collect();
    let Some((last, middle)) = rest.split_last() else {
        return glob == segment;
    };
    if segment.len() < first.len() + last.len()
        || !segment.starts_with(first)
        || !segment.ends_with(last)
    {
        return false;
    }
    let mut inner = &segment[first.len()..segment.len() - last.len()];
    for part in middle {
        match inner.find(part) {
            Some(at) => inner = &inner[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Checks one `paths` glob as config writes it; the error says what is wrong and the fix.
///
/// A glob starts with `/`, matches the decoded path (so it holds no `%`, `?` or `#`),
/// has no empty (`//`), `.` or `..` segments, no `\` or control characters, and uses
/// `**` only as a whole segment.
pub fn check_path_glob(glob: &str) -> Result<(), String> {
    if !glob.starts_with('/') {
        return Err(format!(
            "`{}` does not start with `/`; write a path such as `/repos/acme/**`",
            shown(glob)
        ));
    }
    if let Some(c) = glob
        .chars()
        .find(|c| matches!(c, '%' | '?' | '#' | '\\') || c.is_control())
    {
        return Err(format!(
            "`{}` contains {c:?}: globs match the decoded path without its query; write the \
             characters themselves, such as `/files/a b`",
            shown(glob)
        ));
    }
    let segments: Vec<&str> = glob.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate() {
        if segment.is_empty() && i != last {
            return Err(format!(
                "`{}` has an empty segment (`//`), which no request may have; write single slashes",
                shown(glob)
            ));
        }
        if *segment == "." || *segment == ".." {
            return Err(format!(
                "`{}` has a `{segment}` segment, which no request may have; write the path without it",
                shown(glob)
            ));
        }
        if segment.contains("**") && *segment != "**" {
            return Err(format!(
                "`{}`: `**` must be a whole segment; write `/a/**/b`, or `*` within a segment",
                shown(glob)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
