//! The console's routes without a browser, driven in process (`tower::ServiceExt::oneshot`)
//! against a real gateway: the security headers on every answer, the `Host` rule, and
//! who gets 404 or 403 for what (a viewer, a member and the owner).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use beige_console::{ConsoleOptions, CSP};
use beige_core::api::auth::NewToken;
use beige_core::api::Admin as _;
use beige_core::channel::http::{router, ApiState};
use beige_core::config::Config;
use beige_core::testing::MemorySandbox;
use beige_core::{BeigeHome, GatewayBuilder, LocalGateway};
use serde_json::json;
use tower::ServiceExt as _;

const TOKEN: &str = "console-pages-token-0123456789abcdef";

struct App {
    _dir: tempfile::TempDir,
    gw: Arc<LocalGateway>,
    app: Router,
}

async fn app() -> App {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    std::fs::create_dir_all(home.root()).unwrap();
    let config: Config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-test-0123456789", "baseUrl": "http://127.0.0.1:9"}}},
        "agents": {
            "a": {"model": {"provider": "anthropic", "model": "claude-sonnet-4-6"}, "tools": []},
            "b": {"model": {"provider": "anthropic", "model": "claude-haiku-4-5"}, "tools": []},
        },
        "users": {
            "vera": {"roles": {"a": "viewer"}},
            "mia": {"roles": {"a": "member"}},
        },
    }))
    .unwrap();
    let gw = Arc::new(
        GatewayBuilder::new(config, home.clone())
            .sandbox(Arc::new(MemorySandbox::new()))
            .build()
            .await
            .unwrap(),
    );
    let state = ApiState::new(gw.clone(), Some(TOKEN.into()));
    let console = beige_console::router(
        &state,
        ConsoleOptions::new().audit_log(home.audit_log_path()),
    );
    App {
        _dir: dir,
        gw,
        app: router(state).merge(console),
    }
}

fn get(path: &str, cookie: Option<&str>) -> Request<Body> {
    let mut b = Request::builder()
        .uri(path)
        .header(header::HOST, "127.0.0.1:7433");
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    b.body(Body::empty()).unwrap()
}

fn post(path: &str, cookie: &str, body: &str) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri(path)
        .header(header::HOST, "127.0.0.1:7433")
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let r = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = r.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// Log in with `token`; the session cookie (`beige_session=…`) and the CSRF token.
async fn login(app: &Router, token: &str) -> (String, String) {
    let (_, headers, html) = send(app, get("/console/login", None)).await;
    let pre = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .find(|c| c.starts_with("beige_login_csrf="))
        .unwrap();
    let value = pre.trim_start_matches("beige_login_csrf=").to_string();
    assert!(html.contains(&value));
    let body = format!("_csrf={value}&token={token}");
    let (status, headers, _) = send(app, post("/console/login", &pre, &body)).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "login with {token}");
    let cookie = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .find(|c| c.starts_with("beige_session="))
        .unwrap();
    let (_, _, page) = send(app, get("/console", Some(&cookie))).await;
    let csrf = page
        .split("name=\"_csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();
    (cookie, csrf)
}

async fn personal(gw: &LocalGateway, user: &str) -> String {
    gw.create_token(NewToken {
        user: user.into(),
        name: "t".into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .token
}

#[tokio::test]
async fn every_answer_carries_the_security_headers() {
    let a = app().await;
    let (cookie, _) = login(&a.app, TOKEN).await;
    for (path, cookie, want) in [
        ("/console/login", None, StatusCode::OK),
        ("/console", None, StatusCode::SEE_OTHER),
        ("/console", Some(cookie.as_str()), StatusCode::OK),
        ("/console/approvals", Some(&cookie), StatusCode::OK),
        (
            "/console/audit?decision=denied",
            Some(&cookie),
            StatusCode::OK,
        ),
        ("/console/usage", Some(&cookie), StatusCode::OK),
        ("/console/agents/a/sessions", Some(&cookie), StatusCode::OK),
        (
            "/console/agents/a/sessions/api%3Aa%3Adefault",
            Some(&cookie),
            StatusCode::OK,
        ),
        (
            "/console/agents/nope/sessions",
            Some(&cookie),
            StatusCode::NOT_FOUND,
        ),
    ] {
        let (status, h, body) = send(&a.app, get(path, cookie)).await;
        assert_eq!(status, want, "{path}: {body}");
        assert_eq!(h["content-security-policy"], CSP, "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["referrer-policy"], "no-referrer", "{path}");
        assert_eq!(h["cross-origin-opener-policy"], "same-origin", "{path}");
        assert_eq!(h["cache-control"], "no-store", "{path}");
        if status == StatusCode::OK {
            assert!(!body.contains(" style="), "{path}");
        }
    }
    // A foreign Host is refused before anything else (DNS rebinding).
    let req = Request::builder()
        .uri("/console/login")
        .header(header::HOST, "evil.example:7433")
        .body(Body::empty())
        .unwrap();
    let (status, h, _) = send(&a.app, req).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(h["content-security-policy"], CSP);
    // Outside /console the API's own checks and answers stay as they were: the
    // session cookie is no bearer token.
    let (status, _, body) = send(&a.app, get("/console-not", Some(&cookie))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("\"error\""), "{body}");
}

#[tokio::test]
async fn roles_decide_what_each_person_gets() {
    let a = app().await;
    let vera = personal(&a.gw, "vera").await;
    let mia = personal(&a.gw, "mia").await;
    let (v_cookie, v_csrf) = login(&a.app, &vera).await;
    let (m_cookie, m_csrf) = login(&a.app, &mia).await;

    // Agent b does not exist for either of them.
    for cookie in [&v_cookie, &m_cookie] {
        let (status, _, _) = send(&a.app, get("/console/agents/b/sessions", Some(cookie))).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (_, _, agents) = send(&a.app, get("/console", Some(cookie))).await;
        assert!(agents.contains("id=\"agent-a\""));
        assert!(!agents.contains("id=\"agent-b\""));
    }
    // A member of a cannot prompt b: it is not there for her.
    let body = format!("_csrf={m_csrf}&message=hi");
    let (status, _, _) = send(
        &a.app,
        post(
            "/console/agents/b/sessions/api%3Ab%3Au%3Amia/prompt",
            &m_cookie,
            &body,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A viewer may not prompt: 403 with the refusal's words, nothing started.
    let body = format!("_csrf={v_csrf}&message=hi");
    let (status, _, page) = send(
        &a.app,
        post(
            "/console/agents/a/sessions/api%3Aa%3Au%3Avera/prompt",
            &v_cookie,
            &body,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        page.contains("vera (viewer on a) may not prompt a"),
        "{page}"
    );
    // A member may not use another's session.
    let body = format!("_csrf={m_csrf}&message=hi");
    let (status, _, page) = send(
        &a.app,
        post(
            "/console/agents/a/sessions/api%3Aa%3Adefault/prompt",
            &m_cookie,
            &body,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    // Their own default session's page has the composer; the viewer's has none.
    let (status, _, page) = send(
        &a.app,
        get(
            "/console/agents/a/sessions/api%3Aa%3Au%3Amia",
            Some(&m_cookie),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("class=\"composer\""));
    // A POST with another session's CSRF token is refused.
    let body = format!("_csrf={v_csrf}&message=hi");
    let (status, _, _) = send(
        &a.app,
        post(
            "/console/agents/a/sessions/api%3Aa%3Au%3Amia/prompt",
            &m_cookie,
            &body,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Logout needs the token too, then ends the session.
    let (status, _, _) = send(&a.app, post("/console/logout", &m_cookie, "_csrf=x")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let body = format!("_csrf={m_csrf}");
    let (status, _, _) = send(&a.app, post("/console/logout", &m_cookie, &body)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (status, h, _) = send(&a.app, get("/console", Some(&m_cookie))).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(h["location"], "/console/login");
}
