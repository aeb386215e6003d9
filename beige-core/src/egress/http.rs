//! The gateway's reading of an explicit-proxy request head, and the HTTP responses egress
//! writes itself (spec `egress.md` §4, §5.4).
//!
//! PID 1 forwards each client connection of its proxy on `127.0.0.1:3128` verbatim,
//! starting with the bytes the client sent, so the gateway parses the head again here and
//! trusts nothing PID 1 may have made of it: [`parse_proxy_head`] accepts exactly a
//! `CONNECT host:port` or an absolute-form `http://` request, and [`origin_form_head`]
//! rewrites the latter into the head the upstream gets. The responses are the `403`
//! refusal ([`refusal`], [`bad_request`]), the `502`/`504` upstream failure
//! ([`upstream_error`]) and the `CONNECT` success line ([`CONNECT_OK`]); none of them lets
//! a byte of the client's into a header line. [`new_id`] makes the ids refusals carry.

use beige_protocol::link::MAX_EGRESS_HEAD;

/// Most header fields a request head may carry; one more is [`HeadError::TooManyHeaders`].
pub const MAX_HEADERS: usize = 64;

/// The request a client made of the explicit proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyRequest {
    /// `CONNECT host:port`: open a tunnel to that authority.
    Connect {
        /// The request target as sent: `host:port`, the host a name, an IPv4 literal or a
        /// bracketed IPv6 literal, the port present and 1 to 65535. Not normalised.
        authority: String,
    },
    /// An absolute-form request, `GET http://host[:port]/path HTTP/1.1`: plain HTTP
    /// forwarded by the gateway.
    Absolute {
        /// The request method as sent (case-sensitive, e.g. `GET`).
        method: String,
        /// The scheme, lower-cased; always `http` (an `https://` target is refused: such
        /// clients must use `CONNECT`).
        scheme: String,
        /// The authority as sent: `host` or `host:port` (no user info), not normalised.
        authority: String,
        /// The path and query as sent, starting with `/` (`/` when the target had none).
        path: String,
    },
}

/// A complete, valid proxy request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedHead {
    /// What the client asked for.
    pub request: ProxyRequest,
    /// The length of the head in the buffer, including its final empty line; the bytes
    /// after it are the start of the body or of the tunnelled stream.
    pub head_len: usize,
    /// The minor HTTP version of the request line: `0` for `HTTP/1.0`, `1` for `HTTP/1.1`.
    pub version: u8,
    /// The header fields in order: name as sent, value with surrounding whitespace
    /// trimmed (values may hold any byte but CR, LF and other controls except tab).
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Why a request head is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeadError {
    /// No complete head within [`MAX_EGRESS_HEAD`] bytes.
    #[error("the request head is larger than {} bytes", MAX_EGRESS_HEAD)]
    TooLarge,
    /// More than [`MAX_HEADERS`] header fields.
    #[error("the request head has more than {} header fields", MAX_HEADERS)]
    TooManyHeaders,
    /// Not an HTTP/1.x request head, or one whose framing is ambiguous.
    #[error("malformed request head: {0}")]
    Malformed(&'static str),
    /// A request with a path (origin-form) or `*` target: what a server gets, not a proxy.
    #[error("not a proxy request: the target must be absolute-form (http://host/path) or CONNECT host:port")]
    NotProxyRequest,
    /// `CONNECT` whose target is not `host:port`.
    #[error("the CONNECT target is not host:port")]
    ConnectTarget,
    /// An absolute-form target with a scheme other than `http`. The scheme is lower-cased
    /// and holds only scheme characters (letters, digits, `+`, `-`, `.`).
    #[error("absolute-form requests support only http, not {0} (https goes through CONNECT)")]
    UnsupportedScheme(String),
    /// An absolute-form target that is not `http://host[:port][/path][?query]`.
    #[error("bad absolute-form target: {0}")]
    BadTarget(&'static str),
}

/// Parses the proxy request head at the start of `buf`.
///
/// Returns `Ok(None)` while the head is incomplete and `buf` is shorter than
/// [`MAX_EGRESS_HEAD`]: read more and call again with the whole buffer. Bytes past
/// [`MAX_EGRESS_HEAD`] are never looked at, so a caller never needs to buffer more than
/// that. A head whose framing a later hop could read differently (two `Host` or
/// `Content-Length` fields, or `Content-Length` with `Transfer-Encoding`) is
/// [`HeadError::Malformed`].
pub fn parse_proxy_head(buf: &[u8]) -> Result<Option<ParsedHead>, HeadError> {
    let window = &buf[..buf.len().min(MAX_EGRESS_HEAD)];
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    let head_len = match req.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_EGRESS_HEAD => {
            return Err(HeadError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(e) => return Err(HeadError::Malformed(httparse_reason(e))),
    };
    // A complete parse always fills these; treat their absence as malformed, not a panic.
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("incomplete request line"));
    };

    let mut hosts = 0usize;
    let mut lengths = 0usize;
    let mut chunked = false;
    let mut headers = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("host") {
            hosts += 1;
        } else if h.name.eq_ignore_ascii_case("content-length") {
            lengths += 1;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = true;
        }
        headers.push((h.name.to_owned(), h.value.to_vec()));
    }
    if hosts > 1 {
        return Err(HeadError::Malformed("more than one Host header"));
    }
    if lengths > 1 {
        return Err(HeadError::Malformed("more than one Content-Length header"));
    }
    if lengths == 1 && chunked {
        return Err(HeadError::Malformed(
            "both Content-Length and Transfer-Encoding",
        ));
    }

    let request = if method == "CONNECT" {
        if !valid_authority(target, true) {
            return Err(HeadError::ConnectTarget);
        }
        ProxyRequest::Connect {
            authority: target.to_owned(),
        }
    } else {
        absolute_form(method, target)?
    };
    Ok(Some(ParsedHead {
        request,
        head_len,
        version,
        headers,
    }))
}

fn httparse_reason(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid request line",
        httparse::Error::TooManyHeaders => "too many headers",
        httparse::Error::Version => "invalid HTTP version",
    }
}

/// Splits an absolute-form target `scheme://authority[/path][?query]`.
fn absolute_form(method: &str, target: &str) -> Result<ProxyRequest, HeadError> {
    if target.starts_with('/') || target == "*" {
        return Err(HeadError::NotProxyRequest);
    }
    const SHAPE: &str = "not scheme://host[:port]/path";
    let Some((scheme, rest)) = target.split_once("://") else {
        return Err(HeadError::BadTarget(SHAPE));
    };
    let scheme_ok = scheme.len() <= 32
        && scheme
            .as_bytes()
            .first()
            .is_some_and(u8::is_ascii_alphabetic)
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return Err(HeadError::BadTarget(SHAPE));
    }
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" {
        return Err(HeadError::UnsupportedScheme(scheme));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err(HeadError::BadTarget("user info in the authority"));
    }
    if !valid_authority(authority, false) {
        return Err(HeadError::BadTarget("the authority is not host[:port]"));
    }
    if path.contains('#') {
        return Err(HeadError::BadTarget("a fragment"));
    }
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    Ok(ProxyRequest::Absolute {
        method: method.to_owned(),
        scheme,
        authority: authority.to_owned(),
        path,
    })
}

/// Whether `s` is `host[:port]` (`host:port` when `port_required`): the host a name of
/// letters, digits, `-`, `_` and `.`, or a bracketed IPv6 literal; the port 1 to 65535.
/// This is syntax only: normalising and judging the host is the target module's work.
fn valid_authority(s: &str, port_required: bool) -> bool {
    let (host_ok, port) = if let Some(inner) = s.strip_prefix('[') {
        let Some((v6, after)) = inner.split_once(']') else {
            return false;
        };
        let v6_ok = !v6.is_empty()
            && v6
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(p) => Some(p),
                None => return false,
            },
        };
        (v6_ok, port)
    } else {
        let (host, port) = match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        };
        let host_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        (host_ok, port)
    };
    let port_ok = match port {
        None => !port_required,
        Some(p) => {
            !p.is_empty()
                && p.len() <= 5
                && p.bytes().all(|b| b.is_ascii_digit())
                && p.parse::<u16>().is_ok_and(|n| n != 0)
        }
    };
    host_ok && port_ok
}

/// The value of the request's `Host` header, if it has one ([`parse_proxy_head`] refuses
/// a head with two). Takes [`ParsedHead::headers`].
pub fn host_header(headers: &[(String, Vec<u8>)]) -> Option<&[u8]> {
    headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("host"))
        .map(|(_, value)| value.as_slice())
}

/// The head the gateway sends upstream for an absolute-form request, `None` for a
/// `CONNECT`.
///
/// The request line becomes `METHOD /path HTTP/1.x`. `Proxy-Authorization` and
/// `Proxy-Connection` are dropped, and the client's `Host` is replaced by the target's
/// authority, first among the headers, as RFC 9112 §3.2.2 requires of a proxy (so the
/// upstream serves the host the policy decided on). Every other header keeps its name
/// and value bytes and its order; each line ends in CRLF.
pub fn origin_form_head(parsed: &ParsedHead) -> Option<Vec<u8>> {
    let ProxyRequest::Absolute {
        method,
        authority,
        path,
        ..
    } = &parsed.request
    else {
        return None;
    };
    let mut out = Vec::with_capacity(parsed.head_len + authority.len() + 16);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(if parsed.version == 0 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    out.extend_from_slice(b"Host: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parsed.headers {
        let dropped = ["host", "proxy-authorization", "proxy-connection"]
            .iter()
            .any(|d| name.eq_ignore_ascii_case(d));
        if dropped {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Some(out)
}

/// The reply to a `CONNECT` the gateway accepted; the tunnel starts after it.
pub const CONNECT_OK: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// Most characters of a client-supplied target, agent name or explanation a response body
/// repeats; longer ones are cut and end in `…`.
const MAX_BODY_FIELD: usize = 300;

/// The `403` refusal of spec §5.4:
///
/// ```text
/// HTTP/1.1 403 Forbidden
/// X-Beige-Egress: denied; reason=<reason>; id=<id>
/// Content-Type: text/plain; charset=utf-8
/// Content-Length: <n>
/// Connection: close
///
/// beige: egress to <target> refused for agent '<agent>': <explanation>
/// ```
///
/// `reason` (e.g. `no_rule`) and `id` (from [`new_id`]) go into the header with any byte
/// outside `[A-Za-z0-9_.-]` replaced by `_`. `target` (which may come from the client),
/// `agent` and `explanation` go only into the body, with control and bidi-override
/// characters replaced by `?` and each cut to 300 characters.
pub fn refusal(reason: &str, explanation: &str, target: &str, agent: &str, id: &str) -> Vec<u8> {
    let (header, body) = refusal_parts(reason, explanation, target, agent, id);
    response("403 Forbidden", &header, &body)
}

/// A [`refusal`] that names an approval request: `approval_pending` gets
/// `X-Beige-Egress: approval-pending; approval=<approval>; reason=approval_pending;
/// id=<id>`, another reason `denied; reason=<reason>; approval=<approval>; id=<id>`.
/// Without an approval it is exactly [`refusal`].
pub fn refusal_for_approval(
    reason: &str,
    explanation: &str,
    target: &str,
    agent: &str,
    id: &str,
    approval: Option<&str>,
) -> Vec<u8> {
    let Some(approval) = approval else {
        return refusal(reason, explanation, target, agent, id);
    };
    let approval = header_token(approval);
    let pending = reason == "approval_pending";
    let explanation = if pending {
        format!("{explanation} (approval {approval}); retry once it is approved")
    } else {
        format!("{explanation} (approval {approval})")
    };
    let (_, body) = refusal_parts(reason, &explanation, target, agent, id);
    let header = if pending {
        format!(
            "approval-pending; approval={approval}; reason=approval_pending; id={}",
            header_token(id)
        )
    } else {
        format!(
            "denied; reason={}; approval={approval}; id={}",
            header_token(reason),
            header_token(id)
        )
    };
    response("403 Forbidden", &header, &body)
}

/// The `X-Beige-Egress` value and the body of a [`refusal`], sanitised the same way, for
/// a `403` written by an HTTP server (inspect mode answers on the open connection).
pub fn refusal_parts(
    reason: &str,
    explanation: &str,
    target: &str,
    agent: &str,
    id: &str,
) -> (String, String) {
    let header = format!(
        "denied; reason={}; id={}",
        header_token(reason),
        header_token(id)
    );
    let body = format!(
        "beige: egress to {} refused for agent '{}': {}\n",
        body_text(target),
        body_text(agent),
        body_text(explanation)
    );
    (header, body)
}

/// The `400` for a request head the gateway cannot read ([`HeadError`]), so there is no
/// target to name: `X-Beige-Egress: denied; reason=bad_request; id=<id>` and the body
/// `beige: egress request refused for agent '<agent>': <explanation>`, both sanitised as
/// in [`refusal`].
pub fn bad_request(explanation: &str, agent: &str, id: &str) -> Vec<u8> {
    let header = format!("denied; reason=bad_request; id={}", header_token(id));
    let body = format!(
        "beige: egress request refused for agent '{}': {}\n",
        body_text(agent),
        body_text(explanation)
    );
    response("400 Bad Request", &header, &body)
}

/// The response when the upstream fails after the policy allowed the connection:
/// `504 Gateway Timeout` when `status` is 504, else `502 Bad Gateway`, with
/// `X-Beige-Egress: upstream-error; reason=<reason>` and the body
/// `beige: egress to <target> failed for agent '<agent>': upstream error (<reason>)`,
/// sanitised as in [`refusal`].
pub fn upstream_error(status: u16, reason: &str, target: &str, agent: &str) -> Vec<u8> {
    let status_line = if status == 504 {
        "504 Gateway Timeout"
    } else {
        "502 Bad Gateway"
    };
    let (header, body) = upstream_error_parts(reason, target, agent);
    response(status_line, &header, &body)
}

/// The `X-Beige-Egress` value and the body of an [`upstream_error`], sanitised the same
/// way, for a response written by an HTTP server.
pub fn upstream_error_parts(reason: &str, target: &str, agent: &str) -> (String, String) {
    let reason = header_token(reason);
    let header = format!("upstream-error; reason={reason}");
    let body = format!(
        "beige: egress to {} failed for agent '{}': upstream error ({reason})\n",
        body_text(target),
        body_text(agent)
    );
    (header, body)
}

fn response(status_line: &str, egress_header: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status_line}\r\nX-Beige-Egress: {egress_header}\r\n\
         Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `s` with every byte outside `[A-Za-z0-9_.-]` replaced by `_` (never empty).
fn header_token(s: &str) -> String {
    let t: String = s
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if t.is_empty() {
        "_".to_owned()
    } else {
        t
    }
}

/// `s` safe to print on one line: controls (C0, DEL, C1) and the invisible or bidi
/// formatting characters replaced by `?`, at most [`MAX_BODY_FIELD`] characters.
fn body_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_BODY_FIELD * 4));
    for (i, c) in s.chars().enumerate() {
        if i == MAX_BODY_FIELD {
            out.push('…');
            break;
        }
        let invisible = matches!(c,
            '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}');
        out.push(if c.is_control() || invisible { '?' } else { c });
    }
    out
}

/// A fresh 16-character id of `[a-z0-9]` from the thread's CSPRNG, for refusals and
/// connection records (e.g. `k3f9x2ab7qwe4mzd`).
pub fn new_id() -> String {
    use rand::Rng;
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..16)
        .map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<ParsedHead>, HeadError> {
        parse_proxy_head(s.as_bytes())
    }

    fn complete(s: &str) -> ParsedHead {
        match parse(s) {
            Ok(Some(p)) => p,
            other => panic!("{s:?}: {other:?}"),
        }
    }

    #[test]
    fn connect() {
        let s = "CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\
                 Proxy-Authorization: Basic eA==\r\n\r\n\x16\x03\x01";
        let p = complete(s);
        assert_eq!(
            p.request,
            ProxyRequest::Connect {
                authority: "api.example.test:443".into()
            }
        );
        assert_eq!(p.head_len, s.len() - 3);
        assert_eq!(p.version, 1);
        assert_eq!(p.headers.len(), 2);
        assert_eq!(host_header(&p.headers), Some(&b"api.example.test:443"[..]));
        assert_eq!(origin_form_head(&p), None);
        for ok in [
            "CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n",
            "CONNECT 11.0.0.1:8443 HTTP/1.0\r\n\r\n",
            "CONNECT a_b.example:65535 HTTP/1.1\r\n\r\n",
            "CONNECT xn--bcher-kva.example:1 HTTP/1.1\r\n\r\n",
        ] {
            assert!(matches!(complete(ok).request, ProxyRequest::Connect { .. }));
        }
    }

    #[test]
    fn connect_targets_refused() {
        for t in [
            "api.example.test",
            "api.example.test:",
            "api.example.test:0",
            "api.example.test:65536",
            "api.example.test:443x",
            "api.example.test:+443",
            ":443",
            "user@api.example.test:443",
            "https://api.example.test:443",
            "api.example.test:443/",
            "2001:db8::1:443",
            "[2001:db8::1]",
            "[]:443",
            "[2001:db8::1]x:443",
            "[fe80::1%25eth0]:443",
            "bücher.example:443",
            "a.example:443:443",
            "/",
        ] {
            let s = format!("CONNECT {t} HTTP/1.1\r\n\r\n");
            assert_eq!(parse(&s), Err(HeadError::ConnectTarget), "{t}");
        }
    }

    #[test]
    fn absolute_form() {
        let s = "GET http://api.example.test/v1/x?q=1&r=%2F HTTP/1.1\r\n\
                 Host: evil.example\r\nProxy-Connection: keep-alive\r\n\
                 Proxy-Authorization: Basic eA==\r\nAccept:  */* \r\nX-Odd: \u{e9}\t1\r\n\r\nbody";
        let p = complete(s);
        assert_eq!(
            p.request,
            ProxyRequest::Absolute {
                method: "GET".into(),
                scheme: "http".into(),
                authority: "api.example.test".into(),
                path: "/v1/x?q=1&r=%2F".into(),
            }
        );
        assert_eq!(p.head_len, s.len() - 4);
        let o = origin_form_head(&p).unwrap();
        assert_eq!(
            String::from_utf8(o).unwrap(),
            "GET /v1/x?q=1&r=%2F HTTP/1.1\r\nHost: api.example.test\r\nAccept: */*\r\n\
             X-Odd: \u{e9}\t1\r\n\r\n"
        );

        let p = complete("POST HTTP://Api.Example.Test:8080?a=b HTTP/1.0\nContent-Length: 3\n\n");
        assert_eq!(
            p.request,
            ProxyRequest::Absolute {
                method: "POST".into(),
                scheme: "http".into(),
                authority: "Api.Example.Test:8080".into(),
                path: "/?a=b".into(),
            }
        );
        assert_eq!(
            origin_form_head(&p).unwrap(),
            b"POST /?a=b HTTP/1.0\r\nHost: Api.Example.Test:8080\r\nContent-Length: 3\r\n\r\n"
        );
        let p = complete("GET http://[2001:db8::1]:80 HTTP/1.1\r\n\r\n");
        assert!(matches!(p.request, ProxyRequest::Absolute { ref path, .. } if path == "/"));
    }

    #[test]
    fn absolute_form_refused() {
        const SHAPE: &str = "not scheme://host[:port]/path";
        let cases: &[(&str, HeadError)] = &[
            ("/index.html", HeadError::NotProxyRequest),
            ("*", HeadError::NotProxyRequest),
            (
                "https://api.example.test/",
                HeadError::UnsupportedScheme("https".into()),
            ),
            (
                "FTP://api.example.test/",
                HeadError::UnsupportedScheme("ftp".into()),
            ),
            ("api.example.test:80", HeadError::BadTarget(SHAPE)),
            ("api.example.test", HeadError::BadTarget(SHAPE)),
            ("1http://x/", HeadError::BadTarget(SHAPE)),
            ("a:b/c://x/", HeadError::BadTarget(SHAPE)),
            ("http:/x/", HeadError::BadTarget(SHAPE)),
            ("https:x", HeadError::BadTarget(SHAPE)),
            (
                "http://u:p@api.example.test/",
                HeadError::BadTarget("user info in the authority"),
            ),
            (
                "http:///x",
                HeadError::BadTarget("the authority is not host[:port]"),
            ),
            (
                "http://api.example.test:/",
                HeadError::BadTarget("the authority is not host[:port]"),
            ),
            (
                "http://a%2eb/",
                HeadError::BadTarget("the authority is not host[:port]"),
            ),
            ("http://a/b#frag", HeadError::BadTarget("a fragment")),
            ("http://a#frag", HeadError::BadTarget("a fragment")),
        ];
        for (t, want) in cases {
            let s = format!("GET {t} HTTP/1.1\r\n\r\n");
            assert_eq!(parse(&s).as_ref(), Err(want), "{t}");
        }
    }

    #[test]
    fn malformed_and_ambiguous() {
        for s in [
            "GET http://a/ HTTP/2.0\r\n\r\n",
            "GET  http://a/ HTTP/1.1\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nBad Header: x\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
            "\x16\x03\x01\x02\x00\x01\x00\x01\x7c\x03\x03",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(
                matches!(parse(s), Err(HeadError::Malformed(_))),
                "{s:?}: {:?}",
                parse(s)
            );
        }
    }

    #[test]
    fn incomplete_too_large_too_many() {
        let s = "CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test\r\n\r\n";
        for n in 0..s.len() {
            assert_eq!(parse(&s[..n]), Ok(None), "{n}");
        }
        let mut big = b"GET http://a/ HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_EGRESS_HEAD - 1, b'a');
        assert_eq!(parse_proxy_head(&big), Ok(None));
        big.push(b'a');
        assert_eq!(parse_proxy_head(&big), Err(HeadError::TooLarge));
        // A head that completes only past the limit is too large too.
        big.extend_from_slice(b"\r\n\r\n");
        assert_eq!(parse_proxy_head(&big), Err(HeadError::TooLarge));
        // One that completes exactly at the limit is fine.
        let mut exact = b"GET http://a/ HTTP/1.1\r\nX: ".to_vec();
        exact.resize(MAX_EGRESS_HEAD - 4, b'a');
        exact.extend_from_slice(b"\r\n\r\n");
        exact.extend_from_slice(b"more");
        assert_eq!(complete_bytes(&exact).head_len, MAX_EGRESS_HEAD);

        let mut many = String::from("GET http://a/ HTTP/1.1\r\n");
        for i in 0..MAX_HEADERS {
            many.push_str(&format!("X-{i}: v\r\n"));
        }
        let ok = format!("{many}\r\n");
        assert_eq!(complete(&ok).headers.len(), MAX_HEADERS);
        let too_many = format!("{many}X-last: v\r\n\r\n");
        assert_eq!(parse(&too_many), Err(HeadError::TooManyHeaders));
    }

    fn complete_bytes(b: &[u8]) -> ParsedHead {
        match parse_proxy_head(b) {
            Ok(Some(p)) => p,
            other => panic!("{other:?}"),
        }
    }

    fn split_response(r: &[u8]) -> (String, String) {
        let s = String::from_utf8(r.to_vec()).unwrap();
        let (head, body) = s.split_once("\r\n\r\n").unwrap();
        (head.to_owned(), body.to_owned())
    }

    #[test]
    fn refusal_exact() {
        let r = refusal(
            "no_rule",
            "no rule allows it",
            "api.openai.com:443",
            "intern",
            "k3f9x2ab7qwe4mzd",
        );
        let body =
            "beige: egress to api.openai.com:443 refused for agent 'intern': no rule allows it\n";
        let want = format!(
            "HTTP/1.1 403 Forbidden\r\nX-Beige-Egress: denied; reason=no_rule; id=k3f9x2ab7qwe4mzd\r\n\
             Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(String::from_utf8(r).unwrap(), want);
    }

    #[test]
    fn responses_cannot_be_injected() {
        let evil = "a.test:443\r\nSet-Cookie: x=1\r\n\r\n\u{202e}\u{7f}\u{85}";
        let r = refusal("no_rule\r\nX: y", evil, evil, evil, "id\r\nX: z");
        let (head, body) = split_response(&r);
        let lines: Vec<&str> = head.split("\r\n").collect();
        assert_eq!(lines.len(), 5, "{head}");
        assert_eq!(
            lines[1],
            "X-Beige-Egress: denied; reason=no_rule__X__y; id=id__X__z"
        );
        assert_eq!(body.matches('\n').count(), 1);
        assert!(body.ends_with('\n'));
        assert!(!body.contains('\r') && !body.contains('\u{202e}') && !body.contains('\u{85}'));
        assert_eq!(lines[3], format!("Content-Length: {}", body.len()));

        let r = upstream_error(504, "timeout\n", evil, "intern");
        let (head, body) = split_response(&r);
        assert!(head.starts_with(
            "HTTP/1.1 504 Gateway Timeout\r\nX-Beige-Egress: upstream-error; reason=timeout_\r\n"
        ));
        assert_eq!(body.matches('\n').count(), 1);
        assert!(
            body.starts_with("beige: egress to a.test:443??Set-Cookie: x=1???"),
            "{body}"
        );
        let r = upstream_error(502, "connect_failed", "a.test:443", "intern");
        assert_eq!(
            split_response(&r).1,
            "beige: egress to a.test:443 failed for agent 'intern': upstream error (connect_failed)\n"
        );
        assert!(r.starts_with(b"HTTP/1.1 502 Bad Gateway\r\n"));
        assert!(upstream_error(500, "x", "t", "a").starts_with(b"HTTP/1.1 502 "));

        let r = bad_request("the request head is larger than 16384 bytes", "intern", "");
        let (head, body) = split_response(&r);
        assert!(head.starts_with(
            "HTTP/1.1 400 Bad Request\r\nX-Beige-Egress: denied; reason=bad_request; id=_\r\n"
        ));
        assert_eq!(
            body,
            "beige: egress request refused for agent 'intern': the request head is larger than 16384 bytes\n"
        );

        let long = "x".repeat(10_000);
        let (_, body) = split_response(&refusal("no_rule", "e", &long, "a", "i"));
        assert!(body.len() < 400 && body.contains('…'));
    }

    #[test]
    fn ids() {
        let a = new_id();
        let b = new_id();
        assert_eq!(a.len(), 16);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        assert_ne!(a, b);
    }

    /// xorshift64*: a fixed-seed source for the mutation test.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Every prefix of `input` gives `Ok(None)` or the full input's own result.
    fn check_prefixes(input: &[u8]) {
        let full = parse_proxy_head(input);
        for n in 0..input.len() {
            let r = parse_proxy_head(&input[..n]);
            if r != Ok(None) {
                // A prefix that already decides must decide what the whole input does;
                // a complete head in a prefix is the same head.
                assert_eq!(r, full, "prefix {n} of {input:?}");
            }
        }
        if let Ok(Some(p)) = &full {
            assert!(p.head_len <= input.len() && p.head_len <= MAX_EGRESS_HEAD);
            if let Some(o) = origin_form_head(p) {
                // The rewritten head parses as a complete origin-form head of its own.
                let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS + 1];
                let mut req = httparse::Request::new(&mut slots);
                assert_eq!(req.parse(&o), Ok(httparse::Status::Complete(o.len())));
            }
        }
    }

    #[test]
    fn fuzz_style_mutations() {
        let seeds: &[&[u8]] = &[
            b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\nUser-Agent: curl/8\r\n\r\n",
            b"GET http://api.example.test:8080/a/b?c=d HTTP/1.1\r\nHost: x\r\nProxy-Connection: close\r\nAccept: */*\r\n\r\n",
            b"POST http://[2001:db8::1]/p HTTP/1.0\nContent-Length: 2\n\nhi",
        ];
        let alphabet = b"\r\n :/?#@[]%\x00\x7f\x80\xffCONNECTGEThttp1.0-_";
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut decided = 0;
        for round in 0..3000 {
            let mut m = seeds[round % seeds.len()].to_vec();
            for _ in 0..=rng.below(4) {
                let at = rng.below(m.len() + 1);
                match rng.below(4) {
                    0 if at < m.len() => m[at] = alphabet[rng.below(alphabet.len())],
                    1 if at < m.len() => {
                        m.remove(at);
                    }
                    2 => m.insert(at, alphabet[rng.below(alphabet.len())]),
                    _ => m.truncate(at),
                }
            }
            check_prefixes(&m);
            if parse_proxy_head(&m) != Ok(None) {
                decided += 1;
            }
        }
        for seed in seeds {
            check_prefixes(seed);
            assert!(matches!(parse_proxy_head(seed), Ok(Some(_))));
        }
        assert!(decided > 1000, "{decided}");
    }
}
