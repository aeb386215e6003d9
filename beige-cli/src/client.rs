//! How the CLI finds and talks to a running gateway: its URL (`--gateway`, else the
//! config's `gateway.host`/`port`, else the default), the API token from
//! `<BEIGE_HOME>/gateway.token`, and the few plain HTTP calls that are not part of the
//! `Gateway` trait (`/api/health`, `/api/gateway/restart`).

use std::path::Path;
use std::time::Duration;

use beige_core::config::Config;
use beige_core::home::BeigeHome;
use serde_json::Value;

use crate::cli::DEFAULT_GATEWAY_URL;

/// Where the gateway is and how to authenticate.
#[derive(Debug, Clone)]
pub struct Target {
    /// Base URL without a trailing slash.
    pub url: String,
    pub token: Option<String>,
}

impl Target {
    /// `explicit` (from `--gateway`), else the URL of the running daemon
    /// (`run/gateway.url`), else
    /// the config's bind address, else the default. The token is read from
    /// `<BEIGE_HOME>/gateway.token` when it exists.
    pub fn resolve(home: &BeigeHome, config: Option<&Path>, explicit: Option<&str>) -> Self {
        let from_pid = || crate::daemon::PidFile::new(home).url();
        let url = match explicit.map(str::to_string).or_else(from_pid) {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => {
                let path = config
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| home.config_path());
                match Config::load(&path, home) {
                    Ok(loaded) => url_for(&loaded.config.gateway.host, loaded.config.gateway.port),
                    Err(_) => DEFAULT_GATEWAY_URL.to_string(),
                }
            }
        };
        Self {
            url,
            token: read_token(home),
        }
    }

    /// A client of the gateway's API (the `Gateway` trait over HTTP).
    pub fn remote(&self) -> Result<beige_core::RemoteGateway, crate::Exit> {
        beige_core::RemoteGateway::new(&self.url, self.token.clone())
            .map_err(|e| crate::Exit::new(2, format!("error: {e}")))
    }
}

/// The URL a client uses for a gateway bound to `host:port` (a wildcard bind is reached
/// over loopback).
pub fn url_for(host: &str, port: u16) -> String {
    let host = match host {
        "0.0.0.0" | "" => "127.0.0.1",
        "::" | "[::]" => "[::1]",
        h if h.contains(':') && !h.starts_with('[') => return format!("http://[{h}]:{port}"),
        h => h,
    };
    format!("http://{host}:{port}")
}

/// The API token, trimmed; `None` when the file is missing or empty.
pub fn read_token(home: &BeigeHome) -> Option<String> {
    std::fs::read_to_string(home.token_path())
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_default()
}

/// What `/api/health` said.
#[derive(Debug, Clone)]
pub struct Health {
    pub version: String,
    pub body: Value,
}

/// `GET /api/health` with a short timeout; `None` when nothing answers with 2xx.
pub async fn health(url: &str) -> Option<Health> {
    let resp = http()
        .get(format!("{url}/api/health"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    Some(Health {
        version: body
            .get("version")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string(),
        body,
    })
}

/// Why a request to the gateway failed.
#[derive(Debug)]
pub enum CallError {
    /// Nothing answered.
    Unreachable(String),
    /// The gateway answered with an error status and this message.
    Status(u16, String),
}

/// `POST <path>` with the token and a JSON body; the JSON body of a 2xx answer.
pub async fn post_json(
    target: &Target,
    path: &str,
    body: &Value,
    timeout: Duration,
) -> Result<Value, CallError> {
    send(
        target,
        http()
            .post(format!("{}{path}", target.url))
            .json(body)
            .timeout(timeout),
    )
    .await
}

async fn send(target: &Target, mut req: reqwest::RequestBuilder) -> Result<Value, CallError> {
    if let Some(token) = &target.token {
        req = req.bearer_auth(token);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| CallError::Unreachable(e.to_string()))?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status.is_success() {
        Ok(body)
    } else {
        let message = body
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| match &body {
                Value::String(s) if !s.is_empty() => s.clone(),
                _ => status.to_string(),
            });
        Err(CallError::Status(status.as_u16(), message))
    }
}

/// The sentence every command prints when the gateway is down.
/// The exit for a failed call to the running gateway: not running (exit 3, with how to
/// start it), or its error as it is (exit 1).
pub fn gateway_exit(target: &Target, e: beige_core::GatewayError) -> anyhow::Error {
    match e {
        beige_core::GatewayError::Unreachable { .. } => {
            crate::Exit::new(crate::code::NOT_RUNNING, not_running_message(&target.url)).into()
        }
        e => crate::Exit::new(1, format!("error: {e}")).into(),
    }
}

pub fn not_running_message(url: &str) -> String {
    format!("the gateway is not running (nothing answers at {url}) — start it with `beige gateway start`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_for_binds() {
        assert_eq!(url_for("127.0.0.1", 7433), "http://127.0.0.1:7433");
        assert_eq!(url_for("0.0.0.0", 1), "http://127.0.0.1:1");
        assert_eq!(url_for("::", 2), "http://[::1]:2");
        assert_eq!(url_for("::1", 3), "http://[::1]:3");
        assert_eq!(url_for("localhost", 4), "http://localhost:4");
    }
}
