//! The web console of a beige gateway (`spec/people.md` §3): server-rendered pages at
//! `/console` on the HTTP API's own port, behind the API's `Host`/`Origin` checks.
//!
//! This crate owns the console's routes, its login and sessions ([`auth`]), its pages
//! and live fragments ([`views`], `templates/`) and its embedded assets ([`assets`]).
//! Every handler goes through the [`Gateway`](beige_core::api::Gateway),
//! [`Sessions`](beige_core::api::Sessions) and [`Admin`](beige_core::api::Admin) traits
//! and the audit log reader; it never touches the store, the sandboxes or the policy,
//! and every decision about who may do what is [`Caller::may`](beige_core::api::auth::Caller::may).
//!
//! # Quick start
//!
//! ```no_run
//! use std::sync::Arc;
//! use beige_core::channel::http::{ApiOptions, HttpApiChannel};
//! use beige_console::ConsoleOptions;
//!
//! let audit_log = std::path::PathBuf::from("/home/me/.beige/logs/audit.jsonl");
//! let options = ApiOptions::new(Some("the gateway token".into())).with_extra_routes(Arc::new(
//!     move |state| beige_console::router(state, ConsoleOptions::new().audit_log(audit_log.clone())),
//! ));
//! let (channel, addr) = HttpApiChannel::bind("127.0.0.1", 0, options)?;
//! println!("console at http://{addr}/console");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Pages read without JavaScript; htmx (vendored, embedded) adds live updates: a running
//! turn streams as HTML fragments over SSE, approvals and audit follow live.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use beige_core::channel::http::{refuse_foreign, ApiState};

pub mod assets;
mod audit;
pub mod auth;
mod chat;
pub mod error;
mod pages;
pub mod views;

pub use error::ConsoleError;

/// Where the console is mounted.
pub const BASE: &str = "/console";
/// The login page.
pub const LOGIN_PATH: &str = "/console/login";

/// The `Content-Security-Policy` of every console answer.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// How the console serves, apart from the API state it is built from.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ConsoleOptions {
    /// The audit log (`BEIGE_HOME/logs/audit.jsonl`); `None` leaves the Audit page empty.
    pub audit_log: Option<PathBuf>,
    /// Mark cookies `Secure` (when served over TLS).
    pub secure_cookies: bool,
}

impl ConsoleOptions {
    /// No audit log, cookies without `Secure`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Read the audit from this file (and its rotated siblings).
    pub fn audit_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.audit_log = Some(path.into());
        self
    }

    /// Mark cookies `Secure`.
    pub fn secure_cookies(mut self, secure: bool) -> Self {
        self.secure_cookies = secure;
        self
    }
}

/// Everything the console's handlers share.
#[derive(Debug)]
pub(crate) struct Console {
    pub api: ApiState,
    pub options: ConsoleOptions,
    pub sessions: auth::SessionStore,
    pub turns: chat::Turns,
}

pub(crate) type Shared = Arc<Console>;

/// The console's routes under `/console`, with the API's `Host`/`Origin` checks and the
/// console's security headers in front of them, to merge into the API's app. No
/// fallback: unknown paths get the API's.
pub fn router(api: &ApiState, options: ConsoleOptions) -> Router {
    let shared: Shared = Arc::new(Console {
        api: api.clone(),
        options,
        sessions: auth::SessionStore::default(),
        turns: chat::Turns::default(),
    });
    Router::new()
        .route("/console", get(pages::agents))
        .route("/console/", get(pages::agents))
        .route("/console/login", get(pages::login_page).post(pages::login))
        .route("/console/logout", post(pages::logout))
        .route("/console/assets/{name}", get(assets::serve))
        .route("/console/agents/{agent}/sessions", get(pages::sessions))
        .route("/console/agents/{agent}/sessions/{key}", get(chat::page))
        .route(
            "/console/agents/{agent}/sessions/{key}/prompt",
            post(chat::prompt),
        )
        .route(
            "/console/agents/{agent}/sessions/{key}/cancel",
            post(chat::cancel),
        )
        .route("/console/turns/{id}/events", get(chat::events))
        .route("/console/approvals", get(pages::approvals))
        .route("/console/approvals/list", get(pages::approval_list))
        .route("/console/approvals/events", get(pages::approval_events))
        .route("/console/approvals/{id}/decision", post(pages::decide))
        .route("/console/audit", get(audit::page))
        .route("/console/audit/events", get(audit::events))
        .route("/console/usage", get(pages::usage))
        .route_layer(middleware::from_fn_with_state(shared.clone(), guard))
        .with_state(shared)
}

/// The checks and headers of every console request: the API's `Host` and `Origin` rules,
/// then the security headers on the answer (`no-store` unless the answer is an asset).
///
/// Under `Referrer-Policy: no-referrer` a browser sends `Origin: null` with the
/// console's own form posts; such a request counts as the console's own only when the
/// browser also says `Sec-Fetch-Site: same-origin` (a header pages cannot set). Any
/// other `Origin: null` is refused like a foreign origin.
async fn guard(State(s): State<Shared>, mut req: Request, next: Next) -> Response {
    let headers = req.headers();
    let null_origin = headers
        .get(header::ORIGIN)
        .is_some_and(|o| o.as_bytes() == b"null");
    let same_origin = headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"same-origin");
    if null_origin && same_origin {
        req.headers_mut().remove(header::ORIGIN);
    }
    let mut response = match refuse_foreign(&s.api, &req) {
        Some(refused) => refused,
        None => next.run(req).await,
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// A name safe in an element id: a hex digest prefix of `raw`.
pub(crate) fn dom_id(raw: &str) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(raw.as_bytes())[..8])
}

/// Percent-encode everything but unreserved characters (for query strings and paths).
pub(crate) fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the template scan finds in `text`: inline style, inline script, inline event
    /// handlers (`on…=` attributes, `hx-on`), `javascript:` URLs.
    fn inline_problems(text: &str) -> Vec<String> {
        let text = text.to_ascii_lowercase();
        let mut found = Vec::new();
        for needle in ["style=", "<style", "hx-on", "javascript:"] {
            if text.contains(needle) {
                found.push(needle.to_string());
            }
        }
        for (i, _) in text.match_indices("<script") {
            let end = text[i..].find('>').map_or(text.len(), |e| i + e);
            if !text[i..end].contains(" src=") {
                found.push(format!("<script> without src: {}", &text[i..end]));
            }
        }
        let bytes = text.as_bytes();
        for (i, _) in text.match_indices("on") {
            let before = i.checked_sub(1).map(|j| bytes[j]);
            if !before.is_some_and(|b| b.is_ascii_whitespace()) {
                continue;
            }
            let rest = &bytes[i + 2..];
            let n = rest.iter().take_while(|b| b.is_ascii_alphabetic()).count();
            let after = rest[n..].iter().find(|b| !b.is_ascii_whitespace());
            if n > 0 && after == Some(&b'=') {
                found.push(format!("inline handler: {}", &text[i..i + 2 + n]));
            }
        }
        found
    }

    /// No inline script, no inline style, no inline event handler in any template: the
    /// CSP would block them, and they would be a place for injected code to hide.
    #[test]
    fn templates_have_no_inline_script_style_or_handlers() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let found = inline_problems(&text);
            assert!(found.is_empty(), "{}: {found:?}", path.display());
            checked += 1;
        }
        assert!(checked >= 10, "only {checked} templates found");
        // The fragments written inline in `views.rs` too.
        let views = include_str!("views.rs");
        assert_eq!(inline_problems(views), Vec::<String>::new(), "views.rs");
    }

    /// The scan finds what it looks for.
    #[test]
    fn the_template_scan_catches_inline_code() {
        assert!(!inline_problems(r#"<a onclick="x()">"#).is_empty());
        assert!(!inline_problems(r#"<body onload = "x()">"#).is_empty());
        assert!(!inline_problems(r#"<p style="color:red">"#).is_empty());
        assert!(!inline_problems("<script>alert(1)</script>").is_empty());
        assert!(!inline_problems(r#"<button hx-on:click="x()">"#).is_empty());
        assert!(inline_problems(r#"<script src="/a.js" defer></script><p class="on">"#).is_empty());
    }

    #[test]
    fn url_encoding() {
        assert_eq!(url_encode("api:a:default"), "api%3Aa%3Adefault");
        assert_eq!(url_encode("a b/c"), "a%20b%2Fc");
    }
}
