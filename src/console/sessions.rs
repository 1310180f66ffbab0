//! The sessions pages: the filterable list (filters live in the URL), a
//! session's page with its payloads, derived payloads and sharing, legal
//! holds, deletion with a confirmation step, and a payload's bounded text
//! when the server allows it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::ctx::{Ctx, status};
use super::views::{self, Section, may};
use crate::auth::access::Rpc;
use crate::clock::Millis;
use crate::policy::Policy;
use crate::service::{ReadRequest, SessionFilter, StateFilter};
use crate::store::{PayloadRecord, ReadSpec, SessionRecord, SessionState};

/// Sessions per list page.
const PAGE: u32 = 50;
/// Payloads listed on a session's page.
const PAYLOADS: u32 = 1000;
/// Bytes of content the payload page shows at most.
const CONTENT_BYTES: u64 = 16 << 10;
/// Longest ID accepted in a path.
/// Longest filter value accepted.
const MAX_FILTER: usize = 256;

/// The list's filters, as they appear in its URL.
#[derive(Debug, Default, Clone, serde::Deserialize, serde::Serialize)]
pub struct Filters {
    /// `open`, `closed` or empty.
    #[serde(default)]
    pub state: String,
    /// Owner principal ID.
    #[serde(default)]
    pub owner: String,
    /// Text the label contains.
    #[serde(default)]
    pub q: String,
    /// `key=value` a label must have.
    #[serde(default)]
    pub label: String,
    /// `24h`, `7d`, `30d` or empty.
    #[serde(default)]
    pub expires: String,
    /// `yes`, `no` or empty.
    #[serde(default)]
    pub hold: String,
    /// The page token.
    #[serde(default)]
    pub page: String,
}

impl Filters {
    /// The state and filters of a list request.
    fn request(&self, now: SystemTime) -> Result<(StateFilter, SessionFilter), String> {
        for (name, v) in [
            ("owner", &self.owner),
            ("q", &self.q),
            ("label", &self.label),
        ] {
            if v.len() > MAX_FILTER {
                return Err(format!(
                    "the {name} filter is {} bytes; at most {MAX_FILTER}",
                    v.len()
                ));
            }
        }
        let state = match self.state.as_str() {
            "" => StateFilter::Any,
            "open" => StateFilter::Only(SessionState::Open),
            "closed" => StateFilter::Only(SessionState::Closed),
            other => return Err(format!("state {other:?} is not open or closed")),
        };
        let labels = match self.label.trim() {
            "" => Default::default(),
            kv => match kv.split_once('=') {
                Some((k, v)) => [(k.trim().to_owned(), v.trim().to_owned())].into(),
                None => return Err(format!("label filter {kv:?} is not key=value")),
            },
        };
        let window = match self.expires.as_str() {
            "" => None,
            "24h" => Some(Duration::from_secs(86_400)),
            "7d" => Some(Duration::from_secs(7 * 86_400)),
            "30d" => Some(Duration::from_secs(30 * 86_400)),
            other => return Err(format!("expires {other:?} is not 24h, 7d or 30d")),
        };
        let expires_before_ms = window.map(|w| {
            let at = (now + w).duration_since(UNIX_EPOCH).unwrap_or_default();
            Millis::try_from(at.as_millis()).unwrap_or(Millis::MAX)
        });
        let legal_hold = match self.hold.as_str() {
            "" => None,
            "yes" => Some(true),
            "no" => Some(false),
            other => return Err(format!("hold {other:?} is not yes or no")),
        };
        let set = |v: &str| (!v.trim().is_empty()).then(|| v.trim().to_owned());
        Ok((
            state,
            SessionFilter {
                owner: set(&self.owner),
                labels,
                expires_before_ms,
                legal_hold,
                label_contains: set(&self.q),
            },
        ))
    }

    /// The query string of these filters on another page.
    fn url(&self, page: &str) -> String {
        views::filters_url("/sessions", self, page)
    }
}

fn state_name(s: SessionState) -> &'static str {
    match s {
        SessionState::Open => "open",
        SessionState::Closed => "closed",
    }
}

/// When a session expires: the earlier of its stored expiry and its
/// creation plus its effective TTL (what GetSession reports).
pub fn expires_ms(s: &SessionRecord, effective: &Policy) -> Millis {
    s.expires_ms
        .min(crate::clock::add(s.created_ms, effective.session_ttl))
}

/// The list page's body, for a page of sessions (shared with the bench).
pub fn list_body(
    f: &Filters,
    sessions: &[(SessionRecord, Policy)],
    next: &str,
    error: Option<&str>,
) -> Markup {
    let select = |name: &str, current: &str, options: &[(&str, &str)]| -> Markup {
        html! {
            select id=(format!("f-{name}")) name=(name) {
                @for (v, text) in options {
                    option value=(v) selected[current == *v] { (text) }
                }
            }
        }
    };
    html! {
        form method="get" action="/sessions" class="filters card" aria-label="Filter sessions" {
            div class="field" { label for="f-state" { "State" } (select("state", &f.state, &[("", "any"), ("open", "open"), ("closed", "closed")])) }
            div class="field" { label for="f-owner" { "Owner" } input id="f-owner" name="owner" value=(f.owner) maxlength="256"; }
            div class="field" { label for="f-q" { "Label contains" } input id="f-q" name="q" value=(f.q) maxlength="256"; }
            div class="field" { label for="f-label" { "Label key=value" } input id="f-label" name="label" value=(f.label) maxlength="256" placeholder="team=red"; }
            div class="field" { label for="f-expires" { "Expires within" } (select("expires", &f.expires, &[("", "any time"), ("24h", "24 hours"), ("7d", "7 days"), ("30d", "30 days")])) }
            div class="field" { label for="f-hold" { "Legal hold" } (select("hold", &f.hold, &[("", "any"), ("yes", "held"), ("no", "not held")])) }
            div class="field actions" { button type="submit" { "Apply filters" } " " a href="/sessions" { "Clear" } }
        }
        @if let Some(e) = error { (views::notice("error", e)) }
        @if sessions.is_empty() && error.is_none() {
            p { "No session matches these filters." }
        } @else if !sessions.is_empty() {
            table class="sessions" {
                caption { (sessions.len()) " sessions on this page" }
                thead { tr {
                    th scope="col" { "Session" } th scope="col" { "Label" } th scope="col" { "Owner" } th scope="col" { "State" }
                    th scope="col" { "Created" } th scope="col" { "Expires" } th scope="col" { "Payloads" } th scope="col" { "Stored" } th scope="col" { "Hold" }
                } }
                tbody {
                    @for (s, e) in sessions {
                        tr {
                            td { a href=(format!("/sessions/{}", s.id)) { code { (s.id) } } }
                            td { (views::cut(&s.label, 80)) }
                            td { (s.owner) }
                            td { (state_name(s.state)) }
                            td class="nowrap" { (views::time(s.created_ms)) }
                            td class="nowrap" { (views::time(expires_ms(s, e))) }
                            td class="num" { (s.usage_payloads) }
                            td class="num" { (views::bytes(s.usage_bytes)) }
                            td { @if s.legal_hold { span class="badge" { "held" } } }
                        }
                    }
                }
            }
        }
        nav aria-label="Pages" class="pager" {
            @if !f.page.is_empty() { a href=(f.url("")) { "First page" } }
            @if !next.is_empty() { " " a href=(f.url(next)) rel="next" { "Next page" } }
        }
    }
}

/// GET /sessions.
pub async fn list(ctx: Ctx, Query(f): Query<Filters>) -> Response {
    let (state, filter) = match f.request(SystemTime::now()) {
        Ok(r) => r,
        Err(e) => {
            let body = list_body(&f, &[], "", Some(&e));
            return ctx.page_with(StatusCode::BAD_REQUEST, Section::Sessions, "Sessions", body);
        }
    };
    let (service, p) = ctx.service();
    let listed = service
        .list_sessions_where(p, state, &filter, &f.page, PAGE)
        .await
        .map_err(status);
    match listed {
        Ok(r) => {
            let body = list_body(&f, &r.items, &r.next_token, None);
            ctx.page(Section::Sessions, "Sessions", body)
        }
        Err(s) if matches!(s.code(), tonic::Code::InvalidArgument) => {
            let body = list_body(&f, &[], "", Some(&super::ctx::message(&s)));
            ctx.page_with(StatusCode::BAD_REQUEST, Section::Sessions, "Sessions", body)
        }
        Err(s) => ctx.refused(Section::Sessions, &s),
    }
}

fn id_ok(id: &str) -> bool {
    id.len() <= super::ctx::MAX_ID
}

fn too_long(ctx: &Ctx) -> Response {
    ctx.id_too_long(Section::Sessions, "session")
}

/// GET /sessions/{id}.
pub async fn show(ctx: Ctx, Path(id): Path<String>) -> Response {
    if !id_ok(&id) {
        return too_long(&ctx);
    }
    let (service, p) = ctx.service();
    let s = match service.get_session(p, &id).await {
        Ok(s) => s,
        Err(e) => return ctx.refused(Section::Sessions, &status(e)),
    };
    let payloads = match service.list_payloads(p, &id, "", PAYLOADS).await {
        Ok(p) => p,
        Err(e) => return ctx.refused(Section::Sessions, &status(e)),
    };
    let body = session_body(&ctx, &s, &payloads.items, !payloads.next_token.is_empty());
    let title = format!("Session {}", s.0.id);
    ctx.page(Section::Sessions, &title, body)
}

fn session_body(
    ctx: &Ctx,
    (s, policy): &(SessionRecord, Policy),
    payloads: &[PayloadRecord],
    more: bool,
) -> Markup {
    let roles = &ctx.signed.principal.roles;
    // Only which link to offer: the service decides each Read.
    let can_read = may(roles, Rpc::Read)
        && (policy.compliance_can_read
            || roles
                .iter()
                .any(|r| matches!(r, crate::auth::Role::Agent | crate::auth::Role::Admin)));
    let derived: Vec<&PayloadRecord> = payloads
        .iter()
        .filter(|p| !p.derived_from.is_empty())
        .collect();
    let (hold_by, hold_reason, hold_since) = s.hold.as_ref().map_or(("", "", 0), |h| {
        (h.by.as_str(), h.reason.as_str(), h.since_ms)
    });
    html! {
        section class="card" aria-labelledby="meta-h" {
            h2 id="meta-h" { "Session" }
            dl class="meta" {
                dt { "ID" } dd { code { (s.id) } }
                dt { "Label" } dd { (views::cut(&s.label, 200)) }
                dt { "Labels" } dd {
                    @if s.labels.is_empty() { "none" }
                    @for (k, v) in &s.labels { span class="tag" { (views::cut(k, 64)) "=" (views::cut(v, 64)) } " " }
                }
                dt { "State" } dd { (state_name(s.state)) }
                dt { "Owner" } dd { (s.owner) }
                dt { "Created" } dd { (views::time(s.created_ms)) }
                dt { "Expires" } dd { (views::time(expires_ms(s, policy))) }
                dt { "Stored" } dd { (s.usage_payloads) " payloads, " (views::bytes(s.usage_bytes)) }
                dt { "Retention" } dd { (humantime::format_duration(policy.retention)) }
                dt { "Compliance may read" } dd { (if policy.compliance_can_read { "yes" } else { "no" }) }
                dt { "Policy" } dd { a href=(format!("/policy?session={}", s.id)) { "Every effective value, and where it comes from" } }
            }
        }
        section class="card" aria-labelledby="share-h" {
            h2 id="share-h" { "Sharing" }
            dl class="meta" {
                dt { "Shared with" } dd { @if s.share_with.is_empty() { "nobody" } @else { (s.share_with.join(", ")) } }
                dt { "Parent session" } dd { @if let Some(parent) = &s.parent { a href=(format!("/sessions/{parent}")) { code { (parent) } } } @else { "none" } }
            }
        }
        section class="card" aria-labelledby="hold-h" {
            h2 id="hold-h" { "Legal hold" }
            @if s.legal_hold {
                p { span class="badge" { "held" } " by " (hold_by) " since " (views::time(hold_since)) ": " (views::cut(hold_reason, 500)) }
                p { "While held, nothing of this session is deleted: not by expiry, not on request." }
            } @else {
                p { "Not held." }
            }
            @if may(roles, Rpc::SetLegalHold) {
                form method="post" action=(format!("/sessions/{}/hold", s.id)) {
                    (views::csrf(&ctx.signed.csrf))
                    @if s.legal_hold {
                        input type="hidden" name="hold" value="false";
                        button type="submit" { "Release the hold" }
                    } @else {
                        input type="hidden" name="hold" value="true";
                        div class="field" {
                            label for="reason" { "Reason for the hold" }
                            input id="reason" name="reason" required maxlength="1024" aria-describedby="reason-help";
                            p class="help" id="reason-help" { "Shown to anyone whose deletion the hold refuses." }
                        }
                        button type="submit" { "Place a legal hold" }
                    }
                }
            }
        }
        section class="card" aria-labelledby="pl-h" {
            h2 id="pl-h" { "Payloads" }
            @if payloads.is_empty() { p { "No payloads." } } @else {
                table {
                    caption { (payloads.len()) " payloads" @if more { " (the first " (PAYLOADS) " are listed)" } }
                    thead { tr {
                        th scope="col" { "Name" } th scope="col" { "ID" } th scope="col" { "Size" } th scope="col" { "Lines" }
                        th scope="col" { "Type" } th scope="col" { "Tool" } th scope="col" { "SHA-256" } th scope="col" { "Expires" }
                    } }
                    tbody {
                        @for p in payloads {
                            tr {
                                td { @if can_read { a href=(format!("/payloads/{}", p.id)) { (views::cut(&p.name, 120)) } } @else { (views::cut(&p.name, 120)) } }
                                td { code { (p.id) } }
                                td class="num" { (views::bytes(p.size)) }
                                td class="num" { (p.line_count) }
                                td { (views::cut(&p.content_type, 60)) }
                                td { (views::cut(&p.tool_name, 60)) }
                                td { code class="hash" { (p.sha256.get(..16).unwrap_or(&p.sha256)) "…" } }
                                td class="nowrap" { (views::time(p.expires_ms)) }
                            }
                        }
                    }
                }
            }
            h3 { "Derived payloads" }
            @if derived.is_empty() { p { "None: no payload here was made from others." } } @else {
                ul {
                    @for p in &derived {
                        li { code { (p.id) } " (" (views::cut(&p.name, 120)) ") from " (p.derived_from.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", ")) }
                    }
                }
            }
        }
        @if may(roles, Rpc::DeleteSession) {
            section class="card danger" aria-labelledby="del-h" {
                h2 id="del-h" { "Delete" }
                p { a href=(format!("/sessions/{}/delete", s.id)) class="button danger" { "Delete this session…" } }
            }
        }
    }
}

/// The hold form.
#[derive(serde::Deserialize)]
pub struct HoldForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    hold: String,
    #[serde(default)]
    reason: String,
}

/// A form POST's checks before any work: its CSRF token, and an ID no
/// longer than any this server makes.
fn post_refusal(ctx: &Ctx, csrf: &str, id: &str) -> Option<Response> {
    if let Some(r) = ctx.csrf_refusal(csrf) {
        return Some(r);
    }
    (!id_ok(id)).then(|| too_long(ctx))
}

/// POST /sessions/{id}/hold.
pub async fn hold(
    ctx: Ctx,
    Path(id): Path<String>,
    axum::Form(f): axum::Form<HoldForm>,
) -> Response {
    if let Some(r) = post_refusal(&ctx, &f.csrf, &id) {
        return r;
    }
    let (service, p) = ctx.service();
    match service
        .set_legal_hold(p, &id, f.hold == "true", &f.reason)
        .await
    {
        Ok(_) => Redirect::to(&format!("/sessions/{id}")).into_response(),
        Err(e) => ctx.refused(Section::Sessions, &status(e)),
    }
}

async fn session_of(ctx: &Ctx, id: &str) -> Result<SessionRecord, tonic::Status> {
    let (service, p) = ctx.service();
    let (s, _) = service.get_session(p, id).await.map_err(status)?;
    Ok(s)
}

fn confirm_body(ctx: &Ctx, s: &SessionRecord, refusal: Option<&str>) -> Markup {
    html! {
        @if let Some(r) = refusal { (views::notice("error", &format!("The server refused the deletion; nothing was deleted: {r}"))) }
        section class="card danger" aria-labelledby="confirm-h" {
            h2 id="confirm-h" { "Confirm the deletion" }
            p { "This removes session " code { (s.id) } " (" (views::cut(&s.label, 120)) "): "
                (s.usage_payloads) " payloads, " (views::bytes(s.usage_bytes)) ", their derived payloads and archived results. It cannot be undone; a signed receipt records it." }
            @if s.legal_hold { (views::notice("info", "This session is under a legal hold: the server will refuse to delete it until the hold is released.")) }
            form method="post" action=(format!("/sessions/{}/delete", s.id)) {
                (views::csrf(&ctx.signed.csrf))
                div class="field" {
                    label for="reason" { "Reason (recorded in the receipt)" }
                    input id="reason" name="reason" maxlength="256";
                }
                p { button type="submit" class="danger" { "Delete permanently" } " " a href=(format!("/sessions/{}", s.id)) { "Cancel" } }
            }
        }
    }
}

/// GET /sessions/{id}/delete: the confirmation step.
pub async fn confirm_delete(ctx: Ctx, Path(id): Path<String>) -> Response {
    if !id_ok(&id) {
        return too_long(&ctx);
    }
    match session_of(&ctx, &id).await {
        Ok(s) => {
            let body = confirm_body(&ctx, &s, None);
            ctx.page(Section::Sessions, "Delete a session", body)
        }
        Err(st) => ctx.refused(Section::Sessions, &st),
    }
}

/// The deletion form.
#[derive(serde::Deserialize)]
pub struct DeleteForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

/// POST /sessions/{id}/delete: DeleteSession, then its receipt.
pub async fn delete(
    ctx: Ctx,
    Path(id): Path<String>,
    axum::Form(f): axum::Form<DeleteForm>,
) -> Response {
    if let Some(r) = post_refusal(&ctx, &f.csrf, &id) {
        return r;
    }
    let (service, p) = ctx.service();
    match service
        .delete_session(p, &id, &f.reason)
        .await
        .map_err(status)
    {
        Ok(r) => Redirect::to(&format!("/receipts?id={}&deleted=1", r.id)).into_response(),
        Err(st) if st.code() == tonic::Code::FailedPrecondition => {
            let msg = super::ctx::message(&st);
            match session_of(&ctx, &id).await {
                Ok(s) => {
                    let body = confirm_body(&ctx, &s, Some(&msg));
                    ctx.page_with(
                        StatusCode::CONFLICT,
                        Section::Sessions,
                        "Delete a session",
                        body,
                    )
                }
                Err(_) => ctx.refused(Section::Sessions, &st),
            }
        }
        Err(st) => ctx.refused(Section::Sessions, &st),
    }
}

/// GET /payloads/{id}: metadata and, when the server allows it, the first
/// bytes as escaped text.
pub async fn payload(ctx: Ctx, Path(id): Path<String>) -> Response {
    if !id_ok(&id) {
        return too_long(&ctx);
    }
    let (service, principal) = ctx.service();
    let p = match service.stat(principal, &id).await {
        Ok(p) => p,
        Err(e) => return ctx.refused(Section::Sessions, &status(e)),
    };
    let read = service
        .read(
            principal,
            ReadRequest {
                payload_id: id.clone(),
                spec: Some(ReadSpec::Bytes {
                    offset: 0,
                    length: CONTENT_BYTES,
                }),
                max_bytes: CONTENT_BYTES,
            },
        )
        .await
        .map_err(status);
    let body = html! {
        section class="card" aria-labelledby="p-h" {
            h2 id="p-h" { "Payload" }
            dl class="meta" {
                dt { "Name" } dd { (views::cut(&p.name, 200)) }
                dt { "ID" } dd { code { (p.id) } }
                dt { "Session" } dd { a href=(format!("/sessions/{}", p.session_id)) { code { (p.session_id) } } }
                dt { "Size" } dd { (views::bytes(p.size)) ", " (p.line_count) " lines" }
                dt { "SHA-256" } dd { code class="hash" { (p.sha256) } }
            }
        }
        section class="card" aria-labelledby="c-h" {
            h2 id="c-h" { "Content" }
            @match &read {
                Ok(r) => {
                    p class="help" { "Bytes " (r.out.start_offset) " to " (r.out.end_offset) " of " (r.total_bytes) ", shown as text." @if !r.out.eof { " The rest is not shown." } }
                    pre class="content" tabindex="0" { (String::from_utf8_lossy(&r.out.data)) }
                }
                Err(s) => { (views::notice("info", &format!("Content not shown: {}", super::ctx::message(s)))) }
            }
        }
    };
    ctx.page(Section::Sessions, "Payload", body)
}
