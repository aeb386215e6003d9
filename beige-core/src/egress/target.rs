//! Normalising where a connection wants to go (spec `egress.md` §5 step 1).
//!
//! Owns the one spelling of a destination that every entry point (CONNECT, absolute-form
//! HTTP, transparent entry, SNI, `Host`, DNS questions) is reduced to before the matcher
//! sees it: [`normalize_host`] lower-cases a name, strips one trailing dot and checks it
//! label by label; IP literals, bare or bracketed, become [`Host::Ip`]; [`parse_authority`]
//! splits `host[:port]`. Names are ASCII only: an IDN (`bücher.example`) is refused, not
//! converted, so a rule and a connection can never disagree about its punycode; the
//! `xn--…` form is an ordinary ASCII name. Names that a C resolver would read as a
//! numeric IPv4 address (`127.1`, `0x7f000001`, `017.0.0.1`) are refused too, since they
//! are addresses in disguise.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// The longest name, in bytes, without its trailing dot.
const MAX_NAME: usize = 253;

/// The longest label, in bytes.
const MAX_LABEL: usize = 63;

/// A normalised host: a checked lower-case DNS name or an IP address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A lower-case ASCII name without a trailing dot, each label 1–63 bytes of
    /// `[a-z0-9-]` not starting or ending with `-`, at most 253 bytes in all.
    Name(String),
    /// An IP literal; it matches only `ip:` rules. IPv4-mapped IPv6 stays IPv6.
    Ip(IpAddr),
}

impl Host {
    /// The name, when this is one.
    pub fn as_name(&self) -> Option<&str> {
        match self {
            Host::Name(name) => Some(name),
            Host::Ip(_) => None,
        }
    }

    /// The address, when this is an IP literal.
    pub fn as_ip(&self) -> Option<IpAddr> {
        match self {
            Host::Name(_) => None,
            Host::Ip(ip) => Some(*ip),
        }
    }
}

/// The name, or the address (IPv6 without brackets).
impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// A normalised destination: host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// Where to.
    pub host: Host,
    /// The TCP port, never 0.
    pub port: u16,
}

/// `host:port`, with an IPv6 address in brackets (`[2001:db8::1]:443`).
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            host => write!(f, "{host}:{}", self.port),
        }
    }
}

/// Why a host or authority was refused. Each message quotes the offending text (escaped
/// and shortened, since it comes from the sandbox) and says what a valid one looks like.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// Nothing to go to.
    #[error("the host is empty")]
    Empty,
    /// A non-ASCII character: IDN names are refused, not converted.
    #[error(
        "host '{0}' is not ASCII: IDN names are refused, not converted; write its `xn--…` form"
    )]
    NonAscii(String),
    /// Longer than 253 bytes.
    #[error("host '{host}' is {len} bytes long; a name has at most 253")]
    TooLong {
        /// The host, shortened.
        host: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A leading dot or two dots in a row.
    #[error("host '{0}' has an empty label (a leading dot or two dots in a row)")]
    EmptyLabel(String),
    /// A label longer than 63 bytes.
    #[error("host '{host}' has a label of {len} bytes; a label has at most 63")]
    LabelTooLong {
        /// The host, shortened.
        host: String,
        /// The label's length in bytes.
        len: usize,
    },
    /// A character a name cannot have.
    #[error("host '{host}' contains {ch:?}: a name has only letters, digits, '-' and '.'")]
    BadChar {
        /// The host, shortened.
        host: String,
        /// The first offending character.
        ch: char,
    },
    /// A label starting or ending with `-`.
    #[error("host '{0}' has a label that starts or ends with '-'")]
    Hyphen(String),
    /// A name a C resolver would read as a numeric IPv4 address.
    #[error(
        "host '{0}' looks like an IPv4 address in a non-standard form; write it as a dotted \
         quad such as 192.0.2.1"
    )]
    NumericName(String),
    /// Brackets around something that is not an IPv6 address, or junk after them.
    #[error("'{0}' is not a bracketed IPv6 address such as [2001:db8::1] or [2001:db8::1]:443")]
    BadBracket(String),
    /// An IPv6 address without brackets where a port could follow.
    #[error("'{0}' is an IPv6 address without brackets; write [{0}] or [{0}]:443")]
    UnbracketedIpv6(String),
    /// A port that is not a number from 1 to 65535.
    #[error("port '{0}' is not a number from 1 to 65535")]
    BadPort(String),
}

/// Sandbox-supplied text as an error may quote it: control characters escaped, at most
/// 80 characters.
fn shown(s: &str) -> String {
    const MAX: usize = 80;
    let mut out: String = s.chars().take(MAX).flat_map(char::escape_debug).collect();
    if s.chars().count() > MAX {
        out.push('…');
    }
    out
}

/// Normalises a host as a client or a rule wrote it (spec §5 step 1).
///
/// An IP literal, bare (`1.2.3.4`, `2001:db8::1`) or bracketed (`[2001:db8::1]`),
/// becomes [`Host::Ip`]. Anything else must be an ASCII DNS name: it is lower-cased, one
/// trailing dot is stripped, and each label must be 1–63 bytes of `[a-z0-9-]`, not
/// starting or ending with `-`, the whole at most 253 bytes. Non-ASCII is refused, and so
/// is a name whose last label is all digits or `0x…` (a numeric IPv4 address in
/// disguise). IPv6 zone ids (`%eth0`) are refused.
pub fn normalize_host(raw: &str) -> Result<Host, TargetError> {
    if raw.is_empty() {
        return Err(TargetError::Empty);
    }
    if let Some(inner) = raw.strip_prefix('[') {
        return inner
            .strip_suffix(']')
            .and_then(|inner| inner.parse::<Ipv6Addr>().ok())
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .ok_or_else(|| TargetError::BadBracket(shown(raw)));
    }
    if !raw.is_ascii() {
        return Err(TargetError::NonAscii(shown(raw)));
    }
    let lower = raw.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() {
        return Err(TargetError::Empty);
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(Host::Ip(ip));
    }
    check_name(name)?;
    Ok(Host::Name(name.to_string()))
}

/// The label rules of [`normalize_host`] on a lower-case name without its trailing dot.
fn check_name(name: &str) -> Result<(), TargetError> {
    if name.len() > MAX_NAME {
        return Err(TargetError::TooLong {
            host: shown(name),
            len: name.len(),
        });
    }
    if let Some(ch) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(TargetError::BadChar {
            host: shown(name),
            ch,
        });
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(TargetError::EmptyLabel(shown(name)));
        }
        if label.len() > MAX_LABEL {
            return Err(TargetError::LabelTooLong {
                host: shown(name),
                len: label.len(),
            });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(TargetError::Hyphen(shown(name)));
        }
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || last
            .strip_prefix("0x")
            .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err(TargetError::NumericName(shown(name)));
    }
    Ok(())
}

/// A port as written after the colon: decimal digits only, 1–65535.
fn parse_port(raw: &str) -> Result<u16, TargetError> {
    let bad = || TargetError::BadPort(shown(raw));
    if raw.is_empty() || raw.len() > 5 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match raw.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(port) => Ok(port),
    }
}

/// Parses an authority, `host`, `host:port` or `[v6]:port` (as in CONNECT or `Host`),
/// into a normalised [`Target`]; `default_port` applies when none is written (443, or 80
/// for plain HTTP) and must not be 0. An IPv6 address must be bracketed. The host is
/// normalised by [`normalize_host`]; userinfo (`user@host`) is refused by it.
pub fn parse_authority(authority: &str, default_port: u16) -> Result<Target, TargetError> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let close = rest
            .find(']')
            .ok_or_else(|| TargetError::BadBracket(shown(authority)))?;
        let (inside, after) = authority.split_at(close + 2);
        match after.strip_prefix(':') {
            _ if after.is_empty() => (inside, None),
            Some(port) => (inside, Some(port)),
            None => return Err(TargetError::BadBracket(shown(authority))),
        }
    } else if authority.parse::<Ipv6Addr>().is_ok() {
        return Err(TargetError::UnbracketedIpv6(shown(authority)));
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(raw) => parse_port(raw)?,
        None if default_port == 0 => return Err(TargetError::BadPort("0".to_string())),
        None => default_port,
    };
    let host = normalize_host(host)?;
    Ok(Target { host, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Host {
        Host::Name(s.to_string())
    }

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    #[test]
    fn names_are_lower_cased_and_lose_one_trailing_dot() {
        assert_eq!(
            normalize_host("API.GitHub.COM").unwrap(),
            name("api.github.com")
        );
        assert_eq!(normalize_host("example.com.").unwrap(), name("example.com"));
        assert_eq!(normalize_host("localhost").unwrap(), name("localhost"));
        assert_eq!(
            normalize_host("xn--bcher-kva.example").unwrap(),
            name("xn--bcher-kva.example")
        );
        assert_eq!(normalize_host("a-b.c0").unwrap(), name("a-b.c0"));
        assert_eq!(normalize_host("3com.com").unwrap(), name("3com.com"));
    }

    #[test]
    fn ip_literals_become_ips() {
        assert_eq!(normalize_host("1.2.3.4").unwrap(), ip("1.2.3.4"));
        assert_eq!(normalize_host("1.2.3.4.").unwrap(), ip("1.2.3.4"));
        assert_eq!(normalize_host("2001:DB8::1").unwrap(), ip("2001:db8::1"));
        assert_eq!(normalize_host("[2001:db8::1]").unwrap(), ip("2001:db8::1"));
        assert_eq!(
            normalize_host("[::ffff:8.8.8.8]").unwrap(),
            Host::Ip(IpAddr::V6("::ffff:8.8.8.8".parse().unwrap()))
        );
    }

    #[test]
    fn bad_names_are_refused_with_reasons() {
        use TargetError as E;
        let err = |s: &str| normalize_host(s).unwrap_err();
        assert_eq!(err(""), E::Empty);
        assert_eq!(err("."), E::Empty);
        assert!(matches!(err("bücher.example"), E::NonAscii(_)));
        // The Kelvin sign lower-cases to an ASCII k; it is refused before that.
        assert!(matches!(err("\u{212A}.example"), E::NonAscii(_)));
        assert!(matches!(err("a..b"), E::EmptyLabel(_)));
        assert!(matches!(err(".a.b"), E::EmptyLabel(_)));
        assert!(matches!(err("example.com.."), E::EmptyLabel(_)));
        assert!(matches!(err("-a.com"), E::Hyphen(_)));
        assert!(matches!(err("a-.com"), E::Hyphen(_)));
        assert!(matches!(err("a_b.com"), E::BadChar { ch: '_', .. }));
        assert!(matches!(err("user@a.com"), E::BadChar { ch: '@', .. }));
        assert!(matches!(err("a.com:443"), E::BadChar { ch: ':', .. }));
        assert!(matches!(err("*.a.com"), E::BadChar { ch: '*', .. }));
        assert!(matches!(err("fe80::1%eth0"), E::BadChar { .. }));
        assert!(matches!(err("[1.2.3.4]"), E::BadBracket(_)));
        assert!(matches!(err("[::1"), E::BadBracket(_)));
        assert!(matches!(err("127.1"), E::NumericName(_)));
        assert!(matches!(err("2130706433"), E::NumericName(_)));
        assert!(matches!(err("0x7f000001"), E::NumericName(_)));
        assert!(matches!(err("017.0.0.1"), E::NumericName(_)));
        assert!(matches!(err("1.2.3.0x4"), E::NumericName(_)));
        let label = "a".repeat(64);
        assert!(matches!(
            err(&format!("{label}.com")),
            E::LabelTooLong { len: 64, .. }
        ));
        let ok = format!("{}.com", vec!["a".repeat(63); 3].join("."));
        assert_eq!(ok.len(), 195);
        assert!(normalize_host(&ok).is_ok());
        let long = format!("{}.{}", vec!["a".repeat(63); 3].join("."), "b".repeat(62));
        assert_eq!(long.len(), 254);
        assert!(matches!(err(&long), E::TooLong { len: 254, .. }));
        assert_eq!(
            normalize_host(&format!("{long}.")).map_err(|e| matches!(e, E::TooLong { .. })),
            Err(true)
        );
        let max = format!("{}.{}", vec!["a".repeat(63); 3].join("."), "b".repeat(61));
        assert_eq!(max.len(), 253);
        assert!(normalize_host(&format!("{max}.")).is_ok());
    }

    #[test]
    fn messages_say_what_is_wrong() {
        let e = normalize_host("bücher.example").unwrap_err().to_string();
        assert!(e.contains("not ASCII") && e.contains("xn--"), "{e}");
        let e = normalize_host("a\nb").unwrap_err().to_string();
        assert!(e.contains("a\\nb"), "{e}");
        let e = parse_authority("a.com:0", 443).unwrap_err().to_string();
        assert_eq!(e, "port '0' is not a number from 1 to 65535");
        let e = normalize_host(&"x".repeat(300)).unwrap_err().to_string();
        assert!(e.contains('…') && e.len() < 200, "{e}");
    }

    #[test]
    fn authorities() {
        let t = |s: &str| parse_authority(s, 443).unwrap();
        assert_eq!(
            t("Example.COM"),
            Target {
                host: name("example.com"),
                port: 443
            }
        );
        assert_eq!(
            t("example.com:8443"),
            Target {
                host: name("example.com"),
                port: 8443
            }
        );
        assert_eq!(
            t("example.com.:80"),
            Target {
                host: name("example.com"),
                port: 80
            }
        );
        assert_eq!(
            t("1.2.3.4:22"),
            Target {
                host: ip("1.2.3.4"),
                port: 22
            }
        );
        assert_eq!(
            t("[2001:db8::1]:65535"),
            Target {
                host: ip("2001:db8::1"),
                port: 65535
            }
        );
        assert_eq!(
            t("[2001:db8::1]"),
            Target {
                host: ip("2001:db8::1"),
                port: 443
            }
        );
        assert_eq!(parse_authority("a.com", 80).unwrap().port, 80);

        let err = |s: &str| parse_authority(s, 443).unwrap_err();
        use TargetError as E;
        assert!(matches!(err("a.com:"), E::BadPort(_)));
        assert!(matches!(err("a.com:0"), E::BadPort(_)));
        assert!(matches!(err("a.com:65536"), E::BadPort(_)));
        assert!(matches!(err("a.com:+443"), E::BadPort(_)));
        assert!(matches!(err("a.com:443:1"), E::BadPort(_)));
        assert!(matches!(err("a.com:https"), E::BadPort(_)));
        assert!(matches!(err("2001:db8::1"), E::UnbracketedIpv6(_)));
        assert!(matches!(err("[2001:db8::1]x"), E::BadBracket(_)));
        assert!(matches!(err("[2001:db8::1"), E::BadBracket(_)));
        assert!(matches!(err("[a.com]:443"), E::BadBracket(_)));
        assert!(matches!(err(":443"), E::Empty));
        assert!(matches!(err("user@a.com:443"), E::BadChar { ch: '@', .. }));
        assert!(matches!(parse_authority("a.com", 0), Err(E::BadPort(_))));
    }

    #[test]
    fn display() {
        let t = parse_authority("[2001:db8::1]:443", 443).unwrap();
        assert_eq!(t.to_string(), "[2001:db8::1]:443");
        assert_eq!(t.host.to_string(), "2001:db8::1");
        assert_eq!(
            parse_authority("A.com", 443).unwrap().to_string(),
            "a.com:443"
        );
        assert_eq!(
            parse_authority("1.2.3.4:80", 443).unwrap().to_string(),
            "1.2.3.4:80"
        );
        assert_eq!(name("a.com").as_name(), Some("a.com"));
        assert_eq!(ip("1.2.3.4").as_ip(), Some("1.2.3.4".parse().unwrap()));
    }
}
