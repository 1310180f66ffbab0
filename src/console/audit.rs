//! The audit pages: the query form (filters in the URL), chain
//! verification, the streamed NDJSON export, and the receipt viewer, which
//! checks a receipt's signature with the server's receipt key.

use std::time::SystemTime;

use axum::body::Body;
use axum::extract::Query;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use tokio_stream::StreamExt;

use super::routes::{Ctx, Verification};
use super::views::{self, Section};
use crate::audit::{action, outcome};
use crate::proto;
use crate::store::records::RemovedItem;
use crate::store::signing::Signed;

/// Events per query page.
const PAGE: u32 = 100;
/// Longest receipt JSON the viewer reads.
const MAX_RECEIPT_JSON: usize = 32 << 10;

/// The query's filters, as they appear in its URL.
#[derive(Debug, Default, Clone, serde::Deserialize)]
pub struct AuditFilters {
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
    #[serde(default)]
    principal: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    session: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    page: String,
}

/// `YYYY-MM-DDTHH:MM[:SS]` (what a datetime-local field sends), as UTC.
fn instant(field: &str, v: &str) -> Result<Option<pbjson_types::Timestamp>, String> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let full = if v.len() == 16 {
        format!("{v}:00Z")
    } else if v.ends_with('Z') {
        v.to_owned()
    } else {
        format!("{v}Z")
    };
    let at = humantime::parse_rfc3339_weak(full.trim_end_matches('Z')).map_err(|_| {
        format!("{field} {v:?} is not a date and time such as 2026-12-01T09:30 (UTC)")
    })?;
    let d = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    Ok(Some(pbjson_types::Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    }))
}

impl AuditFilters {
    fn request(&self) -> Result<proto::AuditQuery, String> {
        Ok(proto::AuditQuery {
            session_id: self.session.trim().to_owned(),
            payload_id: String::new(),
            principal: self.principal.trim().to_owned(),
            action: self.action.clone(),
            since: instant("since", &self.since)?,
            until: instant("until", &self.until)?,
            page_size: PAGE,
            page_token: self.page.clone(),
            outcome: self.outcome.clone(),
        })
    }

    fn url(&self, page: &str) -> String {
        let pairs: Vec<(&str, &str)> = [
            ("since", self.since.as_str()),
            ("until", self.until.as_str()),
            ("principal", self.principal.as_str()),
            ("action", self.action.as_str()),
            ("session", self.session.as_str()),
            ("outcome", self.outcome.as_str()),
            ("page", page),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect();
        let qs = serde_urlencoded::to_string(pairs).unwrap_or_default();
        if qs.is_empty() {
            "/audit".into()
        } else {
            format!("/audit?{qs}")
        }
    }
}

/// The verification's status line.
pub fn verification_notice(v: Option<&Verification>) -> Markup {
    match v {
        None => views::notice(
            "info",
            "The chain has not been verified from this console yet.",
        ),
        Some(v) => {
            let at = humantime::format_rfc3339_seconds(v.at);
            if v.ok {
                views::notice(
                    "ok",
                    &format!(
                        "Verified: all {} events chain correctly up to the stored head (seq {}). Last checked {at} by {}.",
                        v.events_checked, v.head_seq, v.by
                    ),
                )
            } else {
                views::notice(
                    "error",
                    &format!(
                        "The chain does NOT verify: event {} is missing, altered or out of place ({} events checked before it, head seq {}). Last checked {at} by {}. Export the log and keep it as evidence.",
                        v.first_bad_seq, v.events_checked, v.head_seq, v.by
                    ),
                )
            }
        }
    }
}

/// VerifyAudit, remembered as the tenant's last verification.
pub async fn run_verify(ctx: &mut Ctx) -> Result<Verification, tonic::Status> {
    let r = ctx
        .calls
        .audit
        .verify_audit(proto::VerifyAuditRequest {})
        .await?
        .into_inner();
    let v = Verification {
        ok: r.ok,
        events_checked: r.events_checked,
        first_bad_seq: r.first_bad_seq,
        head_seq: r.head_seq,
        at: SystemTime::now(),
        by: ctx.signed.principal.id.clone(),
    };
    ctx.app
        .verified
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(ctx.signed.principal.tenant.clone(), v.clone());
    Ok(v)
}

fn query_form(f: &AuditFilters) -> Markup {
    html! {
        form method="get" action="/audit" class="filters card" aria-label="Query the audit log" {
            div class="field" { label for="a-since" { "From (UTC)" } input id="a-since" name="since" type="datetime-local" value=(f.since); }
            div class="field" { label for="a-until" { "Before (UTC)" } input id="a-until" name="until" type="datetime-local" value=(f.until); }
            div class="field" { label for="a-principal" { "Actor" } input id="a-principal" name="principal" value=(f.principal) maxlength="256"; }
            div class="field" {
                label for="a-action" { "Action" }
                select id="a-action" name="action" {
                    option value="" selected[f.action.is_empty()] { "any" }
                    @for a in action::ALL { option value=(a) selected[f.action == a] { (a) } }
                }
            }
            div class="field" { label for="a-session" { "Session" } input id="a-session" name="session" value=(f.session) maxlength="128" placeholder="ses_…"; }
            div class="field" {
                label for="a-outcome" { "Outcome" }
                select id="a-outcome" name="outcome" {
                    option value="" selected[f.outcome.is_empty()] { "any" }
                    @for o in outcome::ALL { option value=(o) selected[f.outcome == o] { (o) } }
                }
            }
            div class="field actions" { button type="submit" { "Query" } " " a href="/audit" { "Clear" } }
        }
    }
}

fn events_table(events: &[proto::AuditEvent]) -> Markup {
    html! {
        table class="events" {
            caption { (events.len()) " events on this page" }
            thead { tr {
                th scope="col" { "Seq" } th scope="col" { "Time" } th scope="col" { "Actor" } th scope="col" { "Action" }
                th scope="col" { "Session" } th scope="col" { "Payload" } th scope="col" { "Outcome" } th scope="col" { "Detail" }
            } }
            tbody {
                @for e in events {
                    tr class=(format!("outcome-{}", e.outcome)) {
                        td class="num" { (e.seq) }
                        td { (e.time) }
                        td { (e.principal) }
                        td { code { (e.action) } }
                        td { @if !e.session_id.is_empty() { a href=(format!("/sessions/{}", e.session_id)) { code { (e.session_id) } } } }
                        td { @if !e.payload_id.is_empty() { code { (e.payload_id) } } }
                        td { (e.outcome) }
                        td { (views::cut(&e.detail, 300)) }
                    }
                }
            }
        }
    }
}

/// GET /audit.
pub async fn query(mut ctx: Ctx, Query(f): Query<AuditFilters>) -> Response {
    let last = ctx
        .app
        .verified
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&ctx.signed.principal.tenant)
        .cloned();
    let tools = html! {
        section class="card" aria-labelledby="tools-h" {
            h2 id="tools-h" { "Chain and export" }
            (verification_notice(last.as_ref()))
            form method="post" action="/audit/verify" class="inline" {
                (views::csrf(&ctx.signed.csrf))
                button type="submit" { "Verify the chain" }
            }
            " "
            a href="/audit/export" class="button" download { "Export as NDJSON" }
            " "
            a href="/receipts" class="button" { "Receipt viewer" }
        }
    };
    let req = match f.request() {
        Ok(r) => r,
        Err(e) => {
            let body = html! { (tools) (query_form(&f)) (views::notice("error", &e)) };
            return ctx.page_with(StatusCode::BAD_REQUEST, Section::Audit, "Audit", body);
        }
    };
    let page = match ctx.calls.audit.query_audit(req).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::InvalidArgument => {
            let body = html! { (tools) (query_form(&f)) (views::notice("error", &super::routes::message(&s))) };
            return ctx.page_with(StatusCode::BAD_REQUEST, Section::Audit, "Audit", body);
        }
        Err(s) => return ctx.refused(Section::Audit, &s),
    };
    let body = html! {
        (tools)
        (query_form(&f))
        @if page.events.is_empty() { p { "No events on this page." } } @else { (events_table(&page.events)) }
        nav aria-label="Pages" class="pager" {
            @if !f.page.is_empty() { a href=(f.url("")) { "First page" } }
            @if !page.next_page_token.is_empty() { " " a href=(f.url(&page.next_page_token)) rel="next" { "Next page" } }
        }
    };
    ctx.page(Section::Audit, "Audit", body)
}

/// The verify form.
#[derive(serde::Deserialize)]
pub struct VerifyForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    back: String,
}

/// POST /audit/verify.
pub async fn verify(mut ctx: Ctx, axum::Form(f): axum::Form<VerifyForm>) -> Response {
    if let Some(r) = ctx.csrf_refusal(&f.csrf) {
        return r;
    }
    match run_verify(&mut ctx).await {
        Ok(_) if f.back == "overview" => Redirect::to("/overview").into_response(),
        Ok(_) => Redirect::to("/audit?verified=1").into_response(),
        Err(s) => ctx.refused(Section::Audit, &s),
    }
}

/// GET /audit/export: the tenant's chain, one event per line in its
/// canonical JSON, streamed as it comes from the server.
pub async fn export(mut ctx: Ctx) -> Response {
    let stream = match ctx
        .calls
        .audit
        .export_audit(proto::ExportAuditRequest {})
        .await
    {
        Ok(s) => s.into_inner(),
        Err(s) => return ctx.refused(Section::Audit, &s),
    };
    let lines = stream.map(|item| {
        item.map(|e| {
            let mut line = crate::api::audit::event_from_proto(e).to_export_line();
            line.push('\n');
            axum::body::Bytes::from(line)
        })
        .map_err(|s| std::io::Error::other(format!("the export stopped: {}", s.message())))
    });
    let name = format!(
        "attachment; filename=\"audit-{}.ndjson\"",
        ctx.signed
            .principal
            .tenant
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(64)
            .collect::<String>()
    );
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_owned()),
            (header::CONTENT_DISPOSITION, name),
        ],
        Body::from_stream(lines),
    )
        .into_response()
}

/// Whether a receipt's signature is this server's; `None` without the key.
fn signature_ok(ctx: &Ctx, r: &proto::DeletionReceipt) -> Option<bool> {
    let key = ctx.app.receipt_key.as_ref()?;
    let at = r.deleted_at.unwrap_or_default();
    let removed: Vec<RemovedItem> = r
        .removed
        .iter()
        .map(|i| RemovedItem {
            kind: i.kind.clone(),
            id: i.id.clone(),
            session_id: i.session_id.clone(),
            content_sha256: i.content_sha256.clone(),
            bytes: i.bytes,
            because: i.because.clone(),
        })
        .collect();
    let signed = Signed {
        id: &r.id,
        target_id: &r.target_id,
        reason: &r.reason,
        requested_by: &r.requested_by,
        deleted_ms: at
            .seconds
            .saturating_mul(1000)
            .saturating_add(i64::from(at.nanos) / 1_000_000),
        deleted_payload_ids: r.deleted_payload_ids.iter().map(String::as_str).collect(),
        bytes_deleted: r.bytes_deleted,
        content_sha256: r.content_sha256.iter().map(String::as_str).collect(),
        removed: &removed,
    };
    Some(key.verify(&signed, &r.signature))
}

fn receipt_view(ctx: &Ctx, r: &proto::DeletionReceipt) -> Markup {
    let json = serde_json::to_string_pretty(r).unwrap_or_default();
    html! {
        section class="card" aria-labelledby="r-h" {
            h2 id="r-h" { "Receipt " code { (r.id) } }
            @match signature_ok(ctx, r) {
                Some(true) => (views::notice("ok", "Signature verified: signed by this server's receipt key, and unchanged since.")),
                Some(false) => (views::notice("error", "Signature does NOT verify: the receipt was changed after signing, or another server signed it.")),
                None => (views::notice("info", "This console cannot read the server's receipt key, so it cannot check the signature.")),
            }
            dl class="meta" {
                dt { "Deleted" } dd { code { (r.target_id) } }
                dt { "Requested by" } dd { (r.requested_by) }
                dt { "Reason" } dd { (views::cut(&r.reason, 300)) }
                dt { "At" } dd { (views::time(r.deleted_at.as_ref())) }
                dt { "Payloads" } dd { (r.deleted_payload_ids.len()) ", " (views::bytes(r.bytes_deleted)) }
                dt { "Items removed" } dd { (r.removed.len()) }
                dt { "Signature" } dd { code class="hash" { (r.signature) } }
            }
            @if !r.removed.is_empty() {
                table {
                    caption { "Everything the deletion removed" }
                    thead { tr { th scope="col" { "Kind" } th scope="col" { "ID" } th scope="col" { "Bytes" } th scope="col" { "Why" } } }
                    tbody {
                        @for i in r.removed.iter().take(500) {
                            tr { td { (i.kind) } td { code { (views::cut(&i.id, 80)) } } td class="num" { (i.bytes) } td { (views::cut(&i.because, 120)) } }
                        }
                    }
                }
            }
            details {
                summary { "The receipt as JSON" }
                pre class="content" tabindex="0" { (json) }
            }
        }
    }
}

fn receipt_forms(ctx: &Ctx, id: &str, pasted: &str) -> Markup {
    html! {
        section class="card" aria-labelledby="find-h" {
            h2 id="find-h" { "Find a receipt" }
            form method="get" action="/receipts" {
                div class="field" {
                    label for="rid" { "Receipt ID, or the deleted session or payload ID" }
                    input id="rid" name="id" value=(id) maxlength="128" placeholder="rcpt_… / ses_… / pl_…";
                }
                button type="submit" { "Show and verify" }
            }
        }
        section class="card" aria-labelledby="paste-h" {
            h2 id="paste-h" { "Verify a receipt you hold" }
            form method="post" action="/receipts/verify" {
                (views::csrf(&ctx.signed.csrf))
                div class="field" {
                    label for="json" { "Receipt JSON (as the CLI or API returned it)" }
                    textarea id="json" name="json" rows="6" maxlength="32768" { (pasted) }
                }
                button type="submit" { "Verify signature" }
            }
        }
    }
}

/// The receipt query.
#[derive(Debug, Default, serde::Deserialize)]
pub struct ReceiptQuery {
    #[serde(default)]
    id: String,
    #[serde(default)]
    deleted: String,
}

/// GET /receipts?id=….
pub async fn receipt(mut ctx: Ctx, Query(q): Query<ReceiptQuery>) -> Response {
    let id = q.id.trim().to_owned();
    if id.is_empty() {
        let body = receipt_forms(&ctx, "", "");
        return ctx.page(Section::Audit, "Receipts", body);
    }
    if id.len() > 128 {
        return ctx.page_with(
            StatusCode::NOT_FOUND,
            Section::Audit,
            "Not found",
            views::notice(
                "error",
                "No such receipt: the ID is longer than any this server makes.",
            ),
        );
    }
    let req = if id.starts_with("rcpt_") {
        proto::GetReceiptRequest {
            receipt_id: id.clone(),
            target_id: String::new(),
        }
    } else {
        proto::GetReceiptRequest {
            receipt_id: String::new(),
            target_id: id.clone(),
        }
    };
    match ctx.calls.audit.get_receipt(req).await {
        Ok(r) => {
            let r = r.into_inner();
            let body = html! {
                @if q.deleted == "1" { (views::notice("ok", &format!("Deleted {}. The signed receipt follows.", r.target_id))) }
                (receipt_view(&ctx, &r))
                (receipt_forms(&ctx, &id, ""))
            };
            ctx.page(Section::Audit, "Receipts", body)
        }
        Err(s) => ctx.refused(Section::Audit, &s),
    }
}

/// The pasted receipt.
#[derive(serde::Deserialize)]
pub struct PastedReceipt {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    json: String,
}

/// POST /receipts/verify: checks a pasted receipt's signature.
pub async fn verify_receipt(ctx: Ctx, axum::Form(f): axum::Form<PastedReceipt>) -> Response {
    if let Some(r) = ctx.csrf_refusal(&f.csrf) {
        return r;
    }
    if f.json.len() > MAX_RECEIPT_JSON {
        let body = html! { (views::notice("error", &format!("The receipt JSON is {} bytes; at most {MAX_RECEIPT_JSON} are read.", f.json.len()))) (receipt_forms(&ctx, "", "")) };
        return ctx.page_with(
            StatusCode::PAYLOAD_TOO_LARGE,
            Section::Audit,
            "Receipts",
            body,
        );
    }
    match serde_json::from_str::<proto::DeletionReceipt>(&f.json) {
        Ok(r) => {
            let body = html! { (receipt_view(&ctx, &r)) (receipt_forms(&ctx, "", &f.json)) };
            ctx.page(Section::Audit, "Receipts", body)
        }
        Err(e) => {
            let body = html! {
                (views::notice("error", &format!("That is not a receipt in the API's JSON form: {}", views::cut(&e.to_string(), 200))))
                (receipt_forms(&ctx, "", &f.json))
            };
            ctx.page_with(StatusCode::BAD_REQUEST, Section::Audit, "Receipts", body)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime_local_values_are_read_as_utc() {
        let t = instant("since", "2026-12-01T09:30").unwrap().unwrap();
        assert_eq!(t.seconds % 86_400, 9 * 3600 + 30 * 60);
        assert!(instant("since", "").unwrap().is_none());
        assert!(instant("since", "yesterday").unwrap_err().contains("since"));
    }

    #[test]
    fn filters_round_trip_through_the_url() {
        let f = AuditFilters {
            action: "hold.set".into(),
            outcome: "denied".into(),
            ..Default::default()
        };
        assert_eq!(
            f.url("tok"),
            "/audit?action=hold.set&outcome=denied&page=tok"
        );
        assert_eq!(AuditFilters::default().url(""), "/audit");
    }
}
