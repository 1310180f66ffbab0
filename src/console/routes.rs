//! The router, the state every handler shares, the signed-in extractor,
//! security headers, and the mapping of the service's refusals to pages.

use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{AppendHeaders, Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::html;

use super::auth::COOKIE;
use super::ctx::{AppState, Ctx, cookie};
use super::views;

/// The cookie of a sign-in form in progress.
pub const SIGNIN_COOKIE: &str = "spillway_console_signin";

/// The strict Content-Security-Policy every response carries: no scripts
/// at all, styles and images from the console only, forms to itself only.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const CSS: &str = include_str!("console.css");

/// Builds the console's router.
pub fn router(state: AppState, max_body: usize, timeout: Duration) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/overview") }))
        .route("/static/console.css", get(css))
        .route("/signin", get(signin_form).post(signin))
        .route("/signout", post(signout))
        .route("/overview", get(super::overview::overview))
        .route(
            "/policy",
            get(super::policy::show).post(super::policy::update),
        )
        .route("/sessions", get(super::sessions::list))
        .route("/sessions/{id}", get(super::sessions::show))
        .route("/sessions/{id}/hold", post(super::sessions::hold))
        .route(
            "/sessions/{id}/delete",
            get(super::sessions::confirm_delete).post(super::sessions::delete),
        )
        .route("/payloads/{id}", get(super::sessions::payload))
        .route("/audit", get(super::audit::query))
        .route("/audit/verify", post(super::audit::verify))
        .route("/audit/export", get(super::audit::export))
        .route("/receipts", get(super::audit::receipt))
        .route("/receipts/verify", post(super::audit::verify_receipt))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(timeout, guard))
        .with_state(state)
}

/// Security headers on every response, a same-origin check on every POST,
/// and the page time limit.
async fn guard(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let foreign = req.method() == Method::POST && !same_origin(req.headers());
    let mut resp = if foreign {
        error_page(
            StatusCode::FORBIDDEN,
            "Refused: cross-site request",
            "This form was submitted from another site. Nothing was changed. Use the console's own pages.",
        )
    } else {
        match tokio::time::timeout(limit, next.run(req)).await {
            Ok(r) => r,
            Err(_) => error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The page took too long",
                &format!(
                    "The page did not finish within {} s (console.request_timeout). Narrow the filters, or try again.",
                    limit.as_secs()
                ),
            ),
        }
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    // The time to the response head (a streamed body may take longer).
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if let Ok(v) = HeaderValue::from_str(&format!("total;dur={ms:.2}")) {
        h.insert("server-timing", v);
    }
    resp
}

/// A POST whose `Origin` (or, without it, `Referer`) names another host
/// than `Host` is cross-site; one with neither is accepted (the CSRF token
/// and the SameSite cookie still guard it).
fn same_origin(h: &HeaderMap) -> bool {
    let Some(host) = h.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let from = h
        .get(header::ORIGIN)
        .or_else(|| h.get(header::REFERER))
        .and_then(|v| v.to_str().ok());
    match from {
        None => true,
        Some(origin) => origin
            .split_once("://")
            .map(|(_, rest)| rest.split('/').next() == Some(host))
            .unwrap_or(false),
    }
}

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        CSS,
    )
        .into_response()
}

async fn not_found() -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no console page at this address. Start from the overview.",
    )
}

/// A page outside any signed-in frame.
pub fn error_page(status: StatusCode, title: &str, text: &str) -> Response {
    let body = html! {
        (views::notice("error", text))
        p { a href="/overview" { "Go to the overview" } }
    };
    (status, Html(views::page(title, None, body).into_string())).into_response()
}

fn set_cookie(name: &str, value: &str, path: &str, max_age: Duration, secure: bool) -> String {
    let c = cookie::Cookie::build((name, value))
        .path(path)
        .http_only(true)
        .same_site(cookie::SameSite::Strict)
        .max_age(cookie::time::Duration::seconds(
            i64::try_from(max_age.as_secs()).unwrap_or(i64::MAX),
        ))
        .secure(secure)
        .build();
    c.to_string()
}

#[derive(serde::Deserialize)]
struct SigninQuery {
    #[serde(default)]
    why: String,
}

async fn signin_form(
    State(app): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<SigninQuery>,
) -> Response {
    let (cookie, csrf) = match app.sessions.begin() {
        Ok(pair) => pair,
        Err(e) => {
            return error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Cannot sign in",
                &e.to_string(),
            );
        }
    };
    let why = match q.why.as_str() {
        "expired" => Some("Your console session expired. Sign in again."),
        "unknown" => Some(
            "That console session has ended (signed out, or the server restarted). Sign in again.",
        ),
        "signedout" => Some("You signed out."),
        "token" => Some("The server no longer accepts your token. Sign in with a current one."),
        "none" => Some("Sign in to continue."),
        _ => None,
    };
    signin_page(
        StatusCode::OK,
        &cookie,
        &csrf,
        why.map(|w| ("info", w)),
        app.secure,
    )
}

fn signin_page(
    status: StatusCode,
    cookie: &str,
    csrf: &str,
    notice: Option<(&str, &str)>,
    secure: bool,
) -> Response {
    let body = html! {
        @if let Some((kind, text)) = notice { (views::notice(kind, text)) }
        form method="post" action="/signin" class="card narrow" {
            (views::csrf(csrf))
            p { label for="token" { "Bearer token" } }
            p { input id="token" name="token" type="password" autocomplete="off" required maxlength="4096" aria-describedby="token-help"; }
            p id="token-help" class="help" {
                "The token you use with the CLI or the API. It is checked once, at sign-in, against the server's tokens; it is not kept, and never stored in your browser."
            }
            p { button type="submit" { "Sign in" } }
        }
    };
    let set = set_cookie(
        SIGNIN_COOKIE,
        cookie,
        "/signin",
        Duration::from_secs(15 * 60),
        secure,
    );
    (
        status,
        [(header::SET_COOKIE, set)],
        Html(views::page("Sign in", None, body).into_string()),
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct SigninForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    token: String,
}

async fn signin(
    State(app): State<AppState>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<SigninForm>,
) -> Response {
    let again = |status: StatusCode, text: &str| match app.sessions.begin() {
        Ok((cookie, csrf)) => {
            signin_page(status, &cookie, &csrf, Some(("error", text)), app.secure)
        }
        Err(e) => error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "Cannot sign in",
            &e.to_string(),
        ),
    };
    if let Err(e) = app
        .sessions
        .take_form(cookie(&headers, SIGNIN_COOKIE), &form.csrf)
    {
        return again(StatusCode::FORBIDDEN, &e.to_string());
    }
    let token = form.token.trim();
    let principal = match app.tokens.authenticate(Some(&format!("Bearer {token}"))) {
        Ok(p) => p,
        Err(e) => {
            tracing::info!("console sign-in refused: unknown token");
            return again(StatusCode::UNAUTHORIZED, &e.to_string());
        }
    };
    let id = principal.id.clone();
    match app.sessions.sign_in(principal) {
        Ok(cookie) => {
            tracing::info!(principal = %id, "console sign-in");
            let set = set_cookie(COOKIE, &cookie, "/", app.sessions.lifetime(), app.secure);
            let clear = set_cookie(SIGNIN_COOKIE, "", "/signin", Duration::ZERO, app.secure);
            (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, "/overview")],
                AppendHeaders([(header::SET_COOKIE, set), (header::SET_COOKIE, clear)]),
            )
                .into_response()
        }
        Err(e) => again(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

/// A form with only its CSRF token.
#[derive(serde::Deserialize)]
pub struct CsrfForm {
    /// The token.
    #[serde(default)]
    pub csrf: String,
}

async fn signout(ctx: Ctx, axum::Form(form): axum::Form<CsrfForm>) -> Response {
    if let Some(r) = ctx.csrf_refusal(&form.csrf) {
        return r;
    }
    ctx.app.sessions.sign_out(&ctx.signed);
    tracing::info!(principal = %ctx.signed.principal.id, "console sign-out");
    let clear = set_cookie(COOKIE, "", "/", Duration::ZERO, ctx.app.secure);
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, clear),
            (header::LOCATION, "/signin?why=signedout".to_owned()),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::ctx::status_of;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_post_from_another_origin_is_cross_site() {
        let ok = headers(&[
            (header::HOST, "127.0.0.1:50052"),
            (header::ORIGIN, "http://127.0.0.1:50052"),
        ]);
        assert!(same_origin(&ok));
        let evil = headers(&[
            (header::HOST, "127.0.0.1:50052"),
            (header::ORIGIN, "http://evil.example"),
        ]);
        assert!(!same_origin(&evil));
        assert!(same_origin(&headers(&[(header::HOST, "h")])));
        assert!(!same_origin(&HeaderMap::new()));
    }

    #[test]
    fn cookies_are_found_by_name_among_others() {
        let h = headers(&[(header::COOKIE, "a=1; spillway_console=abc; b=2")]);
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "nope"), None);
    }

    #[test]
    fn the_session_cookie_is_http_only_strict_and_bounded() {
        let c = set_cookie(COOKIE, "v", "/", Duration::from_secs(60), true);
        for part in [
            "HttpOnly",
            "SameSite=Strict",
            "Max-Age=60",
            "Secure",
            "Path=/",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(!set_cookie(COOKIE, "v", "/", Duration::from_secs(60), false).contains("Secure"));
    }

    #[test]
    fn not_found_stays_not_found() {
        assert_eq!(status_of(tonic::Code::NotFound).0, StatusCode::NOT_FOUND);
        assert_eq!(
            status_of(tonic::Code::PermissionDenied).0,
            StatusCode::FORBIDDEN
        );
    }
}
