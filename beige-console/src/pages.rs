//! The console's plain pages and forms: login and logout, Agents, Sessions, Approvals
//! (with its live list and the decision form) and Usage. Each handler resumes the
//! caller's session, asks the gateway through its traits, keeps what the caller may
//! see, and renders a template; every POST passes the CSRF checks first.

use std::convert::Infallible;
use std::time::Duration;

use askama::Template;
use axum::extract::{FromRequest as _, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use beige_core::api::approvals::{ApprovalDecision, ApprovalStatus, Scope};
use beige_core::api::auth::{Action, AuthEvent, Caller};
use beige_core::api::usage::{UsageGroupBy, UsageQuery};
use beige_core::api::{Admin as _, Gateway as _, GatewayError, SandboxStatus, Sessions as _};
use futures_util::StreamExt as _;
use serde::Deserialize;

use crate::auth::{self, Session, LOGIN_COOKIE, SESSION_COOKIE};
use crate::error::{ConsoleError, PageResult};
use crate::views::{
    AgentCard, AgentsPage, ApprovalCard, ApprovalList, ApprovalsPage, Layout, LoginPage,
    SessionRow, SessionsPage, UsageLine, UsagePage,
};
use crate::Shared;

/// Interval of SSE keep-alive comments.
pub(crate) const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Render a template as a `text/html` answer.
pub(crate) fn html<T: Template>(t: &T) -> PageResult {
    Ok(Html(t.render()?).into_response())
}

/// Whether htmx sent the request (it then wants a fragment).
pub(crate) fn from_htmx(headers: &HeaderMap) -> bool {
    headers.get("hx-request").is_some_and(|v| v == "true")
}

/// The caller's live session, from the cookie.
pub(crate) async fn session(s: &Shared, headers: &HeaderMap) -> Result<Session, ConsoleError> {
    let cookie = auth::cookie(headers, SESSION_COOKIE).ok_or(ConsoleError::NotLoggedIn)?;
    s.sessions.resume(&s.api, &cookie).await
}

fn with_cookie(mut r: Response, value: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(value) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

fn see_other(to: &str) -> Response {
    Redirect::to(to).into_response()
}

/// A form with only the CSRF field (logout).
#[derive(Debug, Deserialize)]
pub(crate) struct CsrfForm {
    #[serde(default, rename = "_csrf")]
    csrf: String,
}

/// The login form.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default, rename = "_csrf")]
    csrf: String,
    #[serde(default)]
    token: String,
}

fn login_form(s: &Shared, error: Option<String>, status: StatusCode) -> PageResult {
    let login_csrf = auth::random_token();
    let page = LoginPage {
        l: Layout::new("Log in", "login", None, ""),
        login_csrf: login_csrf.clone(),
        error,
    };
    let mut r = html(&page)?;
    *r.status_mut() = status;
    Ok(with_cookie(
        r,
        &auth::set_cookie(LOGIN_COOKIE, &login_csrf, s.options.secure_cookies),
    ))
}

/// `GET /console/login`: the form (or Agents, when already logged in).
pub(crate) async fn login_page(State(s): State<Shared>, headers: HeaderMap) -> PageResult {
    if session(&s, &headers).await.is_ok() {
        return Ok(see_other(crate::BASE));
    }
    login_form(&s, None, StatusCode::OK)
}

/// `POST /console/login`: a pasted token.
pub(crate) async fn login(State(s): State<Shared>, req: Request) -> PageResult {
    let addr = auth::peer(&req);
    let headers = req.headers().clone();
    let Form(form) = Form::<LoginForm>::from_request(req, &())
        .await
        .map_err(|e| ConsoleError::BadRequest(e.body_text()))?;
    // The pre-session token: the form's field must match the double-submit cookie.
    let cookie = auth::cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if cookie.is_empty() {
        return Err(ConsoleError::Csrf {
            reason: "the login form's cookie is missing: reload the login page",
        });
    }
    auth::check_csrf(&headers, Some(&form.csrf), &cookie)?;
    if !s.sessions.login_allowed(addr) {
        tracing::warn!(?addr, "console: too many failed logins");
        return Err(ConsoleError::RateLimited);
    }
    let Some(caller) = s.sessions.authenticate(&s.api, &form.token).await? else {
        s.sessions.login_failed(addr);
        tracing::warn!(?addr, "console: a login with an unknown token");
        return login_form(
            &s,
            Some("That token is not valid (unknown, revoked or expired).".into()),
            StatusCode::UNAUTHORIZED,
        );
    };
    tracing::info!(user = %caller.user, "console: logged in");
    let value = s.sessions.start(caller, &form.token);
    let secure = s.options.secure_cookies;
    let r = with_cookie(
        see_other(crate::BASE),
        &auth::set_cookie(SESSION_COOKIE, &value, secure),
    );
    Ok(with_cookie(r, &auth::clear_cookie(LOGIN_COOKIE, secure)))
}

/// `POST /console/logout`.
pub(crate) async fn logout(
    State(s): State<Shared>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> PageResult {
    let me = session(&s, &headers).await?;
    auth::check_csrf(&headers, Some(&form.csrf), &me.csrf)?;
    if let Some(cookie) = auth::cookie(&headers, SESSION_COOKIE) {
        s.sessions.end(&cookie);
    }
    Ok(with_cookie(
        see_other(crate::LOGIN_PATH),
        &auth::clear_cookie(SESSION_COOKIE, s.options.secure_cookies),
    ))
}

fn sandbox_words(st: &SandboxStatus) -> String {
    let mut words = if st.container.is_empty() {
        String::from("no container")
    } else {
        format!("container {}", st.container)
    };
    match &st.link {
        None => words.push_str(", no link"),
        Some(l) if l.connected => {
            words.push_str(&format!(", link up ({})", st.link_mode.as_str()));
            if let Some(us) = st.ping_us {
                words.push_str(&format!(", ping {us} µs"));
            }
        }
        Some(_) => words.push_str(", link down"),
    }
    words
}

/// `GET /console`: the agents the caller sees.
pub(crate) async fn agents(State(s): State<Shared>, headers: HeaderMap) -> PageResult {
    let me = session(&s, &headers).await?;
    let gw = &s.api.gateway;
    let mut cards = Vec::new();
    for a in gw.agents().await? {
        let Some(role) = me.caller.role_on(&a.name) else {
            continue;
        };
        let sandbox = match gw.sandbox_status(&a.name).await {
            Ok(st) => sandbox_words(&st),
            Err(GatewayError::Unsupported { .. }) => "unknown".to_string(),
            Err(e) => format!("unavailable: {e}"),
        };
        let pending = gw
            .approvals(Some(&a.name))
            .await
            .map(|list| {
                list.iter()
                    .filter(|x| x.status == ApprovalStatus::Pending)
                    .count()
            })
            .unwrap_or(0);
        let chat_key = me
            .caller
            .may(Action::Prompt, &a.name)
            .is_ok()
            .then(|| me.caller.default_session_key(&a.name));
        cards.push(AgentCard {
            model: a.model.clone(),
            fallbacks: a.fallback_models.join(", "),
            sandbox,
            pending,
            role: role.to_string(),
            chat_key,
            name: a.name,
        });
    }
    html(&AgentsPage {
        l: Layout::new("Agents", "agents", Some(&me.caller), &me.csrf),
        agents: cards,
    })
}

fn time_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default()
}

/// `GET /console/agents/{agent}/sessions`: all of them for who may read every
/// transcript, else the caller's own.
pub(crate) async fn sessions(
    State(s): State<Shared>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> PageResult {
    let me = session(&s, &headers).await?;
    me.caller.may(Action::See, &agent)?;
    let all = me.caller.may(Action::ReadAllTranscripts, &agent).is_ok();
    let mut list: Vec<SessionRow> = s
        .api
        .gateway
        .sessions(&agent)
        .await?
        .into_iter()
        .filter(|r| all || me.caller.owns_session(&agent, &r.key))
        .map(|r| SessionRow {
            tokens: r.usage.input_tokens + r.usage.output_tokens,
            title: r.title.unwrap_or_default(),
            model: r.model.unwrap_or_default(),
            updated: time_ms(r.updated),
            messages: r.message_count,
            key: r.key,
            id: r.id,
        })
        .collect();
    list.sort_by(|a, b| b.updated.cmp(&a.updated));
    let own_key = me
        .caller
        .may(Action::Prompt, &agent)
        .is_ok()
        .then(|| me.caller.default_session_key(&agent));
    html(&SessionsPage {
        l: Layout::new(
            format!("Sessions of {agent}"),
            "agents",
            Some(&me.caller),
            &me.csrf,
        ),
        agent,
        sessions: list,
        own_key,
    })
}

async fn approval_cards(s: &Shared, me: &Session) -> Result<ApprovalList, ConsoleError> {
    let mut list: Vec<_> = match s.api.gateway.approvals(None).await {
        Ok(list) => list,
        Err(GatewayError::Unsupported { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    list.retain(|a| me.caller.sees(&a.agent));
    // Pending first; the gateway's order (newest first) otherwise.
    list.sort_by_key(|a| a.status != ApprovalStatus::Pending);
    Ok(ApprovalList {
        cards: list
            .iter()
            .map(|a| ApprovalCard::new(a, &me.caller, &me.csrf))
            .collect(),
    })
}

/// `GET /console/approvals`.
pub(crate) async fn approvals(State(s): State<Shared>, headers: HeaderMap) -> PageResult {
    let me = session(&s, &headers).await?;
    let list = approval_cards(&s, &me).await?;
    html(&ApprovalsPage {
        l: Layout::new("Approvals", "approvals", Some(&me.caller), &me.csrf),
        list,
    })
}

/// `GET /console/approvals/list`: the live part of the page.
pub(crate) async fn approval_list(State(s): State<Shared>, headers: HeaderMap) -> PageResult {
    let me = session(&s, &headers).await?;
    html(&approval_cards(&s, &me).await?)
}

/// `GET /console/approvals/events`: a `changed` event whenever an approval request is
/// raised or settled (the page then reloads its list).
pub(crate) async fn approval_events(State(s): State<Shared>, headers: HeaderMap) -> PageResult {
    session(&s, &headers).await?;
    let events = match s.api.gateway.approval_events().await {
        Ok(stream) => stream
            .map(|_| Ok::<Event, Infallible>(Event::default().event("changed").data("1")))
            .boxed(),
        Err(_) => futures_util::stream::pending().boxed(),
    };
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE))
        .into_response())
}

/// The decision form.
#[derive(Debug, Deserialize)]
pub(crate) struct DecisionForm {
    #[serde(default, rename = "_csrf")]
    csrf: String,
    #[serde(default)]
    decision: String,
    #[serde(default)]
    digest: String,
}

/// May `caller` decide this way on a request of `agent`'s session `session`? Approving
/// once (or denying) a request of an own session needs `ApproveOwn`; anything else
/// `ApproveAny`. The gateway checks again.
pub(crate) fn may_decide(
    caller: &Caller,
    agent: &str,
    session: &str,
    scope: Option<Scope>,
) -> Result<(), ConsoleError> {
    caller.may(Action::See, agent)?;
    let any = caller.may(Action::ApproveAny, agent);
    if any.is_ok() {
        return Ok(());
    }
    let own = matches!(scope, None | Some(Scope::Once))
        && caller.owns_session(agent, session)
        && caller.may(Action::ApproveOwn, agent).is_ok();
    if own {
        Ok(())
    } else {
        any.map_err(ConsoleError::from)
    }
}

/// `POST /console/approvals/{id}/decision`.
pub(crate) async fn decide(
    State(s): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<DecisionForm>,
) -> PageResult {
    let me = session(&s, &headers).await?;
    auth::check_csrf(&headers, Some(&form.csrf), &me.csrf)?;
    let gw = &s.api.gateway;
    let approval = gw
        .approvals(None)
        .await?
        .into_iter()
        .find(|a| a.id == id && me.caller.sees(&a.agent))
        .ok_or_else(|| ConsoleError::NotFound(format!("approval request {id}")))?;
    let (decision, scope) = match form.decision.as_str() {
        "once" => (ApprovalDecision::approve(Scope::Once), Some(Scope::Once)),
        "session" => (
            ApprovalDecision::approve(Scope::Session),
            Some(Scope::Session),
        ),
        "deny" => (ApprovalDecision::deny(None), None),
        other => {
            return Err(ConsoleError::BadRequest(format!(
                "unknown decision '{other}': use once, session or deny"
            )))
        }
    };
    if let Err(e) = may_decide(&me.caller, &approval.agent, &approval.session, scope) {
        if let ConsoleError::Refused(refusal) = &e {
            gw.audit_auth(AuthEvent::refused(
                &me.caller,
                Some(&approval.agent),
                refusal,
            ))
            .await;
        }
        return Err(e);
    }
    let digest = if form.digest.is_empty() {
        approval.call_digest.clone()
    } else {
        form.digest
    };
    let decided = gw
        .decide_approval(&id, decision.with_digest(digest), me.caller.principal())
        .await?;
    tracing::info!(id = %id, user = %me.caller.user, decision = %form.decision, "console: approval decided");
    if from_htmx(&headers) {
        html(&ApprovalCard::new(&decided, &me.caller, &me.csrf))
    } else {
        Ok(see_other("/console/approvals"))
    }
}

/// `GET /console/usage`: tokens and cost per agent the caller sees.
pub(crate) async fn usage(State(s): State<Shared>, headers: HeaderMap) -> PageResult {
    let me = session(&s, &headers).await?;
    let query = UsageQuery {
        by: UsageGroupBy::Agent,
        ..UsageQuery::default()
    };
    let rows = match s.api.gateway.usage(query).await {
        Ok(report) => report
            .rows
            .into_iter()
            .filter(|r| me.caller.sees(&r.key))
            .map(|r| UsageLine {
                calls: r.totals.calls,
                input: r.totals.input_tokens,
                output: r.totals.output_tokens,
                cost: format!("{:.4}", r.totals.cost_micros as f64 / 1_000_000.0),
                key: r.key,
            })
            .collect(),
        Err(GatewayError::Unsupported { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    html(&UsagePage {
        l: Layout::new("Usage", "usage", Some(&me.caller), &me.csrf),
        rows,
    })
}
