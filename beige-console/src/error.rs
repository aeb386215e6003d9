//! What a console request can fail with ([`ConsoleError`]) and how each failure is
//! answered: a refusal is 403 with the [`Refusal`]'s words (404 for an agent the caller
//! has no role on), a missing or ended session sends the browser to the login page, and
//! anything else is an HTML error page with the status it deserves. It owns no state.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use beige_core::api::auth::Refusal;
use beige_core::api::GatewayError;

/// Why a console request was not served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleError {
    /// No session cookie, or its session ended (logout, expiry, revoked token).
    #[error("not logged in")]
    NotLoggedIn,
    /// The caller may not do this.
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// A POST without the session's CSRF token, or sent from another site.
    #[error("refused: {reason}")]
    Csrf {
        /// What was wrong with the request.
        reason: &'static str,
    },
    /// Too many failed logins from this address.
    #[error("too many failed logins from this address: wait a minute and try again")]
    RateLimited,
    /// A malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// Something the console does not know.
    #[error("not found: {0}")]
    NotFound(String),
    /// The gateway answered with an error.
    #[error("{0}")]
    Gateway(#[from] GatewayError),
    /// A template failed to render.
    #[error("rendering the page failed: {0}")]
    Render(#[from] askama::Error),
    /// The audit log could not be read.
    #[error("reading the audit log failed: {0}")]
    Audit(String),
}

impl ConsoleError {
    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            ConsoleError::NotLoggedIn => StatusCode::SEE_OTHER,
            ConsoleError::Refused(r) => {
                StatusCode::from_u16(r.status()).unwrap_or(StatusCode::FORBIDDEN)
            }
            ConsoleError::Csrf { .. } => StatusCode::FORBIDDEN,
            ConsoleError::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::Gateway(e) => gateway_status(e),
            ConsoleError::Render(_) | ConsoleError::Audit(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

fn gateway_status(e: &GatewayError) -> StatusCode {
    match e {
        GatewayError::UnknownAgent { .. }
        | GatewayError::UnknownSession { .. }
        | GatewayError::UnknownSchedule { .. } => StatusCode::NOT_FOUND,
        GatewayError::Refused(r) => {
            StatusCode::from_u16(r.status()).unwrap_or(StatusCode::FORBIDDEN)
        }
        GatewayError::InvalidCall(_) | GatewayError::Approval { .. } => StatusCode::CONFLICT,
        GatewayError::Unsupported { .. } => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::BAD_GATEWAY,
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        if let ConsoleError::NotLoggedIn = self {
            let mut r = Redirect::to(crate::LOGIN_PATH).into_response();
            // htmx follows this header with a full page load.
            r.headers_mut()
                .insert("hx-redirect", HeaderValue::from_static(crate::LOGIN_PATH));
            return r;
        }
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "console request failed");
        }
        let page = crate::views::ErrorPage {
            status: status.as_u16(),
            title: status.canonical_reason().unwrap_or("Error").to_string(),
            message: self.to_string(),
        };
        let body = askama::Template::render(&page).unwrap_or_else(|_| self.to_string());
        let mut r = (status, Html(body)).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        r
    }
}

/// What a console handler returns.
pub type PageResult = Result<Response, ConsoleError>;
