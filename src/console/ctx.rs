//! What every console handler shares: the console's state, the signed-in
//! request ([`Ctx`]) and how a service refusal reads on a page. Pages and
//! the router import from here; this file imports no page.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::FromRequestParts;
use axum::http::{HeaderMap, StatusCode, header, request::Parts};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::Markup;

use super::auth::{COOKIE, Missing, Sessions, Signed};
use super::views::{self, Chrome, Section};
use crate::auth::TokenTable;
use crate::error::ApiError;
use crate::service::Service;

/// Longest ID the console looks up: longer than any this server makes.
pub const MAX_ID: usize = 128;

/// The last verification of a tenant's audit chain seen by this console.
#[derive(Debug, Clone)]
pub struct Verification {
    /// Whether it verified.
    pub ok: bool,
    /// Events checked.
    pub events_checked: u64,
    /// First bad seq, 0 when ok.
    pub first_bad_seq: u64,
    /// The head seq.
    pub head_seq: u64,
    /// When it was checked.
    pub at: std::time::SystemTime,
    /// Who checked.
    pub by: String,
}

/// What every handler shares.
pub struct Console {
    /// The service layer every action calls, as gRPC does.
    pub service: Service,
    /// Signed-in sessions.
    pub sessions: Sessions,
    /// The server's token table, to tell who a token stands for at sign-in
    /// (the same table the gRPC interceptor authenticates with).
    pub tokens: Arc<TokenTable>,
    /// The server's configuration: its default policy shows where each
    /// policy value comes from.
    pub config: Arc<crate::config::Config>,
    /// `Secure` on cookies.
    pub secure: bool,
    /// Sessions the overview reads at most.
    pub overview_max_sessions: usize,
    /// Last verification per tenant.
    pub verified: Mutex<HashMap<String, Verification>>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

/// Shared state.
pub type AppState = Arc<Console>;

/// The value of cookie `name` in the request.
pub fn cookie<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A signed-in request: the session, whose principal every service call
/// of the request acts as.
pub struct Ctx {
    /// The session.
    pub signed: Signed,
    /// The shared state.
    pub app: AppState,
}

impl Ctx {
    /// The page frame for `section`.
    pub fn chrome(&self, section: Section) -> Chrome<'_> {
        Chrome {
            principal: &self.signed.principal.id,
            tenant: &self.signed.principal.tenant,
            roles: &self.signed.principal.roles,
            csrf: &self.signed.csrf,
            section,
        }
    }

    /// A full page in this user's frame.
    pub fn page(&self, section: Section, title: &str, body: Markup) -> Response {
        self.page_with(StatusCode::OK, section, title, body)
    }

    /// The 404 page for an ID longer than [`MAX_ID`]: no `what` (a
    /// session, a receipt) can have it.
    pub fn id_too_long(&self, section: Section, what: &str) -> Response {
        self.page_with(
            StatusCode::NOT_FOUND,
            section,
            "Not found",
            views::notice(
                "error",
                &format!("No such {what}: the ID is longer than any this server makes."),
            ),
        )
    }

    /// [`Ctx::page`] with a status.
    pub fn page_with(
        &self,
        status: StatusCode,
        section: Section,
        title: &str,
        body: Markup,
    ) -> Response {
        let chrome = self.chrome(section);
        (
            status,
            Html(views::page(title, Some(&chrome), body).into_string()),
        )
            .into_response()
    }

    /// Checks a form's CSRF token: `None` when it is this session's, the
    /// refusal page otherwise.
    pub fn csrf_refusal(&self, submitted: &str) -> Option<Response> {
        if self.signed.csrf_ok(submitted) {
            return None;
        }
        tracing::warn!(principal = %self.signed.principal.id, "console form refused: missing or wrong csrf token");
        Some(self.page_with(
            StatusCode::FORBIDDEN,
            Section::None,
            "Refused: the form is not from this console session",
            views::notice(
                "error",
                "The form's CSRF token is missing or does not match your console session, so nothing was changed. Reload the page and submit the form again.",
            ),
        ))
    }

    /// The service, and the principal to call it as.
    pub fn service(&self) -> (&Service, &crate::auth::Principal) {
        (&self.app.service, &self.signed.principal)
    }

    /// The page for a refusal or failure of the service.
    pub fn refused(&self, section: Section, s: &tonic::Status) -> Response {
        if s.code() == tonic::Code::Unauthenticated {
            self.app.sessions.sign_out(&self.signed);
            return Redirect::to("/signin?why=token").into_response();
        }
        let (status, title) = status_of(s.code());
        self.page_with(status, section, title, views::notice("error", &message(s)))
    }
}

/// A service error as a status: its code and words from the one mapping
/// in [`crate::error`] (internal details stay in the server log).
pub fn status(e: ApiError) -> tonic::Status {
    e.into()
}

/// The HTTP status and page title for a status code. NOT_FOUND stays 404, so
/// another tenant's session reads the same as one that does not exist.
pub fn status_of(code: tonic::Code) -> (StatusCode, &'static str) {
    use tonic::Code as C;
    match code {
        C::NotFound => (StatusCode::NOT_FOUND, "Not found"),
        C::PermissionDenied => (StatusCode::FORBIDDEN, "Not allowed"),
        C::InvalidArgument => (StatusCode::BAD_REQUEST, "Not accepted"),
        C::FailedPrecondition => (StatusCode::CONFLICT, "Refused"),
        C::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "Over a limit"),
        C::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "Server unavailable"),
        C::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "Took too long"),
        _ => (StatusCode::BAD_GATEWAY, "The server could not answer"),
    }
}

/// The server's message for a status, as the user should read it.
pub fn message(s: &tonic::Status) -> String {
    let text = views::cut(s.message(), 2000);
    match s.code() {
        tonic::Code::Unavailable => format!(
            "The server is unavailable ({text}). It may be shutting down; try again shortly."
        ),
        tonic::Code::Internal | tonic::Code::Unknown => format!(
            "The server failed to answer ({text}). Details are in the server log; try again."
        ),
        _ => text,
    }
}

impl FromRequestParts<AppState> for Ctx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Response> {
        let signed = match app.sessions.get(cookie(&parts.headers, COOKIE)) {
            Ok(s) => s,
            Err(why) => {
                let why = match why {
                    Missing::NoCookie => "none",
                    Missing::Unknown => "unknown",
                    Missing::Expired => "expired",
                };
                return Err(Redirect::to(&format!("/signin?why={why}")).into_response());
            }
        };
        Ok(Ctx {
            signed,
            app: app.clone(),
        })
    }
}
