//! Who is at the console: the login (a pasted token), the session cookie, the in-memory
//! session store, the CSRF checks and the limit on failed logins. It owns the console's
//! sessions — a map from the SHA-256 of a cookie to the caller, the token they logged in
//! with, their CSRF token and the idle and absolute expiries — and nothing else. The
//! store lives in the process: a restart of the gateway ends every console session.
//! Every request re-checks the token behind its session (the gateway's own token
//! against [`ApiState::token`], a personal token through `Admin::authenticate`), so a
//! revoked token ends its sessions at once.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::http::{header, HeaderMap, Request};
use base64::Engine as _;
use beige_core::api::auth::Caller;
use beige_core::api::Admin as _;
use beige_core::channel::http::ApiState;
use rand::RngCore as _;
use sha2::{Digest, Sha256};

use crate::error::ConsoleError;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "beige_session";
/// The login form's double-submit cookie.
pub const LOGIN_COOKIE: &str = "beige_login_csrf";
/// A session ends after this long without a request.
pub const IDLE: Duration = Duration::from_secs(12 * 60 * 60);
/// A session ends this long after the login, whatever happens.
pub const ABSOLUTE: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// Failed logins allowed per address and minute.
pub const MAX_FAILED_LOGINS: usize = 10;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// 32 random bytes, base64url without padding.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Compare two secrets without leaking where they differ or their lengths: both are
/// hashed, and the digests compared in constant time.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (x, y) = (Sha256::digest(a), Sha256::digest(b));
    x.iter()
        .zip(y.iter())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// One console session.
#[derive(Debug, Clone)]
struct Entry {
    /// Who it is (as of the last re-check).
    caller: Caller,
    /// The token they logged in with (re-checked on every request).
    token: String,
    /// The session's CSRF token.
    csrf: String,
    idle_until: Instant,
    absolute_until: Instant,
}

/// A logged-in request: the caller and the session's CSRF token.
#[derive(Debug, Clone)]
pub struct Session {
    /// Who is asking.
    pub caller: Caller,
    /// The token every POST must carry.
    pub csrf: String,
}

/// The sessions and the failed-login counts.
#[derive(Debug, Default)]
pub struct SessionStore {
    sessions: Mutex<HashMap<[u8; 32], Entry>>,
    failures: Mutex<HashMap<Option<IpAddr>, VecDeque<Instant>>>,
}

impl SessionStore {
    /// Who `token` is: the owner for the gateway's own token, else what the gateway says.
    pub async fn authenticate(
        &self,
        api: &ApiState,
        token: &str,
    ) -> Result<Option<Caller>, ConsoleError> {
        let token = token.trim();
        if token.is_empty() {
            return Ok(None);
        }
        if let Some(own) = &api.token {
            if constant_time_eq(token.as_bytes(), own.as_bytes()) {
                return Ok(Some(Caller::owner()));
            }
        }
        // A personal token at the console acts as `console:<token id>` (the audit's `via`).
        let caller = api.gateway.authenticate(token).await?;
        Ok(caller.map(|c| match c.token_id.clone() {
            Some(id) => c.with_via(format!("console:{id}")),
            None => c,
        }))
    }

    /// Whether `addr` may try another login now.
    pub fn login_allowed(&self, addr: Option<IpAddr>) -> bool {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let list = failures.entry(addr).or_default();
        while list
            .front()
            .is_some_and(|t| now.duration_since(*t) > FAILURE_WINDOW)
        {
            list.pop_front();
        }
        list.len() < MAX_FAILED_LOGINS
    }

    /// Count a failed login from `addr`.
    pub fn login_failed(&self, addr: Option<IpAddr>) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.entry(addr).or_default().push_back(Instant::now());
    }

    /// Start a session for `caller`; returns the cookie's value.
    pub fn start(&self, caller: Caller, token: &str) -> String {
        let cookie = random_token();
        let now = Instant::now();
        let entry = Entry {
            caller,
            token: token.trim().to_string(),
            csrf: random_token(),
            idle_until: now + IDLE,
            absolute_until: now + ABSOLUTE,
        };
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|_, e| e.idle_until > now && e.absolute_until > now);
        sessions.insert(digest(&cookie), entry);
        cookie
    }

    /// End the session of this cookie.
    pub fn end(&self, cookie: &str) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.remove(&digest(cookie));
    }

    /// The live session of `cookie`, its token re-checked.
    pub async fn resume(&self, api: &ApiState, cookie: &str) -> Result<Session, ConsoleError> {
        let key = digest(cookie);
        let entry = {
            let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.get(&key).cloned()
        };
        let Some(entry) = entry else {
            return Err(ConsoleError::NotLoggedIn);
        };
        let now = Instant::now();
        if entry.idle_until <= now || entry.absolute_until <= now {
            self.end(cookie);
            return Err(ConsoleError::NotLoggedIn);
        }
        let Some(caller) = self.authenticate(api, &entry.token).await? else {
            // Revoked, expired or replaced: the session ends with its token.
            self.end(cookie);
            return Err(ConsoleError::NotLoggedIn);
        };
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let Some(live) = sessions.get_mut(&key) else {
            return Err(ConsoleError::NotLoggedIn);
        };
        live.caller = caller.clone();
        live.idle_until = now + IDLE;
        Ok(Session {
            caller,
            csrf: live.csrf.clone(),
        })
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
}

/// A `Set-Cookie` value for a console cookie.
pub fn set_cookie(name: &str, value: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{name}={value}; HttpOnly; SameSite=Strict; Path={}{secure}",
        crate::BASE
    )
}

/// A `Set-Cookie` value that removes a console cookie.
pub fn clear_cookie(name: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{name}=; HttpOnly; SameSite=Strict; Path={}; Max-Age=0{secure}",
        crate::BASE
    )
}

/// The peer's address, when the server recorded it.
pub fn peer<B>(req: &Request<B>) -> Option<IpAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// The CSRF checks of a state-changing request: not from another site, and carrying
/// `expected` (in the form's `_csrf` field or the `X-CSRF-Token` header).
pub fn check_csrf(
    headers: &HeaderMap,
    form_token: Option<&str>,
    expected: &str,
) -> Result<(), ConsoleError> {
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"))
    {
        return Err(ConsoleError::Csrf {
            reason: "a request from another site",
        });
    }
    let given = form_token
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .or_else(|| {
            headers
                .get("x-csrf-token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        });
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(()),
        Some(_) => Err(ConsoleError::Csrf {
            reason: "the CSRF token does not match this session",
        }),
        None => Err(ConsoleError::Csrf {
            reason: "the request carries no CSRF token",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn cookies_are_read_from_every_cookie_header() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; beige_session=xyz"),
        );
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(cookie(&h, SESSION_COOKIE).as_deref(), Some("xyz"));
        assert_eq!(cookie(&h, "b").as_deref(), Some("2"));
        assert_eq!(cookie(&h, "c"), None);
    }

    #[test]
    fn set_cookie_has_the_attributes() {
        assert_eq!(
            set_cookie(SESSION_COOKIE, "v", false),
            "beige_session=v; HttpOnly; SameSite=Strict; Path=/console"
        );
        assert!(set_cookie(SESSION_COOKIE, "v", true).ends_with("; Secure"));
    }

    #[test]
    fn csrf_needs_the_token_and_refuses_cross_site() {
        let mut h = HeaderMap::new();
        assert!(check_csrf(&h, None, "t").is_err());
        assert!(check_csrf(&h, Some("u"), "t").is_err());
        assert!(check_csrf(&h, Some("t"), "t").is_ok());
        h.insert("x-csrf-token", HeaderValue::from_static("t"));
        assert!(check_csrf(&h, None, "t").is_ok());
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(check_csrf(&h, Some("t"), "t").is_err());
    }

    #[test]
    fn ten_failures_a_minute_then_refused() {
        let store = SessionStore::default();
        let addr = Some(IpAddr::from([127, 0, 0, 1]));
        for _ in 0..MAX_FAILED_LOGINS {
            assert!(store.login_allowed(addr));
            store.login_failed(addr);
        }
        assert!(!store.login_allowed(addr));
        assert!(store.login_allowed(Some(IpAddr::from([127, 0, 0, 2]))));
    }

    #[test]
    fn tokens_are_32_bytes_base64url() {
        let t = random_token();
        assert_eq!(t.len(), 43);
        assert!(t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }
}
