//! Placeholder brokering on inspected requests (spec §5.3): swapping a placeholder for
//! its secret on the routes its credential is bound to, refusing a bound request that
//! does not use it (`credential_required`), and refusing a placeholder headed anywhere
//! else (`placeholder_misuse`).
//!
//! The swap happens in header values, in the decoded credentials of `Authorization:
//! Basic`, and in the query, never in bodies. The misuse scan looks at the request line,
//! every header and the first [`BODY_SCAN_LIMIT`] bytes of the body (held back
//! until they are scanned), with every decoding [`super::scan`] knows.
//! Only placeholders that verify under the home's key for this agent count: anything
//! else that looks like one is left alone.

use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use hyper::Uri;

use super::config::{Credential, Delivery, Violation};
use super::placeholder::{Minted, PlaceholderKey};
use super::scan::{scan, Encoding, BODY_SCAN_LIMIT, MARKER};

/// A request body whose first part was read (to be scanned) before it is forwarded.
pub(crate) struct RequestBody {
    prefix: Option<Bytes>,
    trailers: Option<Frame<Bytes>>,
    rest: Option<Incoming>,
}

impl RequestBody {
    /// `body` forwarded as it comes.
    pub(crate) fn streaming(body: Incoming) -> Self {
        Self {
            prefix: None,
            trailers: None,
            rest: Some(body),
        }
    }

    /// Reads up to [`BODY_SCAN_LIMIT`] bytes of `body`; the rest follows when forwarded.
    pub(crate) async fn buffered(mut body: Incoming) -> Result<(Self, Bytes), hyper::Error> {
        let mut prefix = Vec::new();
        let mut trailers = None;
        let mut ended = false;
        while prefix.len() < BODY_SCAN_LIMIT {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => prefix.extend_from_slice(&data),
                    Err(frame) => {
                        trailers = Some(frame);
                        ended = true;
                        break;
                    }
                },
                Some(Err(e)) => return Err(e),
                None => {
                    ended = true;
                    break;
                }
            }
        }
        let prefix = Bytes::from(prefix);
        Ok((
            Self {
                prefix: Some(prefix.clone()),
                trailers,
                rest: (!ended).then_some(body),
            },
            prefix,
        ))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            if !prefix.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(prefix))));
            }
        }
        if let Some(rest) = self.rest.as_mut() {
            return Pin::new(rest).poll_frame(cx);
        }
        Poll::Ready(self.trailers.take().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.as_ref().is_none_or(Bytes::is_empty)
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let prefix = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let rest = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Incoming::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + prefix);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + prefix);
        }
        hint
    }
}

/// A placeholder found where it must not go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misuse {
    /// The credential it stands for.
    pub credential: String,
    /// The exec it was made for.
    pub exec: String,
    /// How it was written.
    pub encoding: Encoding,
    /// Whether the credential says to kill that exec.
    pub kill: bool,
}

/// The brokering state of one inspected stream: the key, the agent, and the agent's
/// placeholder credentials.
pub(crate) struct Broker<'a> {
    pub key: &'a PlaceholderKey,
    pub agent: &'a str,
    pub credentials: &'a [Credential],
}

impl Broker<'_> {
    fn verified(&self, token: &str) -> Option<(Minted, &Credential)> {
        let minted = self.key.verify(self.agent, token)?;
        let credential = self.credentials.iter().find(|c| {
            c.name == minted.credential && matches!(c.delivery, Delivery::Placeholder { .. })
        })?;
        Some((minted, credential))
    }

    /// The first verified placeholder in the request (line, headers, body prefix) whose
    /// credential is not bound to `host`.
    pub(crate) fn misuse(
        &self,
        host: &str,
        request_line: &[u8],
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<Misuse> {
        let mut parts: Vec<&[u8]> = vec![request_line, body];
        parts.extend(headers.values().map(HeaderValue::as_bytes));
        for part in parts {
            for found in scan(part) {
                if let Some((minted, credential)) = self.verified(&found.token) {
                    if !credential.is_for(host) {
                        return Some(Misuse {
                            credential: minted.credential,
                            exec: minted.exec,
                            encoding: found.encoding,
                            kill: credential.violation == Violation::BlockAndKill,
                        });
                    }
                }
            }
        }
        None
    }

    /// `text` with every verified placeholder of `credential` (with its prefix) replaced
    /// by the secret, and the exec the last one was made for; `None` when there is none.
    fn swap(&self, credential: &Credential, text: &str) -> Option<(String, String)> {
        let Delivery::Placeholder { prefix, .. } = &credential.delivery else {
            return None;
        };
        if !text.as_bytes().windows(MARKER.len()).any(|w| w == MARKER) {
            return None;
        }
        let mut out = text.to_string();
        let mut swapped = None;
        for found in scan(text.as_bytes()) {
            if found.encoding != Encoding::Raw {
                continue;
            }
            let Some((minted, _)) = self.verified(&found.token) else {
                continue;
            };
            if minted.credential != credential.name {
                continue;
            }
            let bare = format!("{}{}", String::from_utf8_lossy(MARKER), found.token);
            let whole = format!("{prefix}{bare}");
            let needle = if out.contains(&whole) { whole } else { bare };
            out = out.replace(&needle, credential.secret.expose());
            swapped = Some(minted.exec);
        }
        swapped.map(|exec| (out, exec))
    }

    /// Swaps the placeholders of `credential` in `headers` (values, and the decoded
    /// credentials of `Authorization: Basic`) and in `uri`'s query. Returns the exec of
    /// a swapped one (`None`: the request did not use the credential), or an error when
    /// a swapped value is not a valid header or URI.
    pub(crate) fn substitute(
        &self,
        credential: &Credential,
        headers: &mut HeaderMap,
        uri: &mut Uri,
    ) -> Result<Option<String>, &'static str> {
        let mut swapped = None;
        for (name, value) in headers.iter_mut() {
            let Ok(text) = value.to_str() else {
                continue;
            };
            let basic = (name == AUTHORIZATION)
                .then(|| text.strip_prefix("Basic "))
                .flatten()
                .and_then(|b64| {
                    base64::engine::general_purpose::STANDARD
                        .decode(b64.trim())
                        .ok()
                })
                .and_then(|d| String::from_utf8(d).ok());
            let new = match basic.and_then(|decoded| self.swap(credential, &decoded)) {
                Some((decoded, exec)) => Some((
                    format!(
                        "Basic {}",
                        base64::engine::general_purpose::STANDARD.encode(decoded)
                    ),
                    exec,
                )),
                None => self.swap(credential, text),
            };
            if let Some((new, exec)) = new {
                let mut v = HeaderValue::from_str(&new).map_err(|_| "credential_invalid")?;
                v.set_sensitive(true);
                *value = v;
                swapped = Some(exec);
            }
        }
        if let Some(query) = uri.query() {
            if let Some((new_query, exec)) = self.swap(credential, query) {
                let path_and_query = format!("{}?{new_query}", uri.path());
                *uri = Uri::try_from(path_and_query).map_err(|_| "credential_invalid")?;
                swapped = Some(exec);
            }
        }
        Ok(swapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::config::Secret;

    const SECRET: &str = "sk-real-0123456789";

    fn credentials() -> Vec<Credential> {
        let mut kill = Credential::placeholder(
            "gh",
            Secret::new("ghp_real"),
            vec!["api.github.test".into()],
            "GH_TOKEN",
            "",
        );
        kill.violation = Violation::BlockAndKill;
        vec![
            Credential::placeholder(
                "openai",
                Secret::new(SECRET),
                vec!["api.openai.test".into()],
                "OPENAI_API_KEY",
                "sk-",
            ),
            kill,
        ]
    }

    #[test]
    fn swaps_in_headers_basic_and_query_but_only_its_own() {
        let key = PlaceholderKey::from_bytes(&[3; 32]);
        let creds = credentials();
        let broker = Broker {
            key: &key,
            agent: "a",
            credentials: &creds,
        };
        let p = key.mint("a", "openai", "x1", "sk-").unwrap();
        let gh = key.mint("a", "gh", "x1", "").unwrap();
        let foreign = key.mint("b", "openai", "x1", "sk-").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, format!("Bearer {p}").parse().unwrap());
        headers.insert("x-other", gh.parse().unwrap());
        headers.insert("x-foreign", foreign.parse().unwrap());
        let mut uri: Uri = format!("/v1/x?key={p}&n=1").parse().unwrap();
        assert_eq!(
            broker
                .substitute(&creds[0], &mut headers, &mut uri)
                .unwrap()
                .as_deref(),
            Some("x1")
        );
        assert_eq!(headers[AUTHORIZATION], format!("Bearer {SECRET}").as_str());
        assert_eq!(
            headers["x-other"],
            gh.as_str(),
            "another credential's stays"
        );
        assert_eq!(
            headers["x-foreign"],
            foreign.as_str(),
            "a foreign one stays"
        );
        assert_eq!(uri.query(), Some(format!("key={SECRET}&n=1").as_str()));

        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            format!("Basic {}", b64(&format!("x-access-token:{p}")))
                .parse()
                .unwrap(),
        );
        let mut uri: Uri = "/".parse().unwrap();
        assert!(broker
            .substitute(&creds[0], &mut headers, &mut uri)
            .unwrap()
            .is_some());
        assert_eq!(
            headers[AUTHORIZATION],
            format!("Basic {}", b64(&format!("x-access-token:{SECRET}"))).as_str()
        );

        // Nothing to swap: the request did not use the credential.
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, "Bearer sk-own".parse().unwrap());
        assert!(broker
            .substitute(&creds[0], &mut headers, &mut uri)
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_placeholder_to_another_host_is_misuse_in_every_encoding() {
        let key = PlaceholderKey::from_bytes(&[4; 32]);
        let creds = credentials();
        let broker = Broker {
            key: &key,
            agent: "a",
            credentials: &creds,
        };
        let p = key.mint("a", "openai", "x9", "sk-").unwrap();
        let none = HeaderMap::new();
        // To its own host: not misuse.
        assert_eq!(
            broker.misuse("api.openai.test", p.as_bytes(), &none, b""),
            None
        );
        let pct = p.replace('_', "%5F");
        let line = format!("GET /?k={pct} HTTP/1.1");
        let m = broker
            .misuse("evil.test", line.as_bytes(), &none, b"")
            .unwrap();
        assert_eq!(
            (m.credential.as_str(), m.exec.as_str(), m.encoding, m.kill),
            ("openai", "x9", Encoding::Percent, false)
        );
        let body = base64::engine::general_purpose::STANDARD.encode(format!("{{\"k\":\"{p}\"}}"));
        let m = broker
            .misuse("evil.test", b"POST / HTTP/1.1", &none, body.as_bytes())
            .unwrap();
        assert_eq!(m.encoding, Encoding::Base64);
        let mut headers = HeaderMap::new();
        let gh = key.mint("a", "gh", "x2", "").unwrap();
        headers.insert("x-token", gh.parse().unwrap());
        let m = broker
            .misuse("evil.test", b"GET / HTTP/1.1", &headers, b"")
            .unwrap();
        assert_eq!((m.credential.as_str(), m.kill), ("gh", true));
        // Another agent's placeholder is not this agent's misuse (it is not valid here).
        let foreign = key.mint("b", "openai", "x9", "sk-").unwrap();
        assert_eq!(
            broker.misuse("evil.test", foreign.as_bytes(), &none, b""),
            None
        );
    }
}
