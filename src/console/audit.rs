//! The audit pages: the query form (filters in the URL), chain
//! verification, the streamed NDJSON export, and the receipt viewer, which
//! checks a receipt's signature with the server's receipt key (through the
//! service, which holds it).

use std::time::SystemTime;

use axum::body::Body;
use axum::extract::Query;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use tokio_stream::StreamExt;

use super::ctx::{Ctx, Verification, status};
use super::views::{self, Section};
use crate::audit::{AuditEvent, Filter, action, outcome};
use crate::clock::Millis;
use crate::proto;
use crate::receipt::{RemovedItem, Signed};
use crate::service::ReceiptLookup;
use crate::store::ReceiptRecord;

/// Events per query page.
const PAGE: u32 = 100;
/// Longest receipt JSON the viewer reads.
const MAX_RECEIPT_JSON: usize = 32 << 10;

/// The query's filters, as they appear in its URL.
#[derive(Debug, Default, Clone, serde::Deserialize, serde::Serialize)]
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
fn instant(field: &str, v: &str) -> Result<Option<Millis>, String> {
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
    Ok(Some(Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)))
}

impl AuditFilters {
    fn filter(&self) -> Result<Filter, String> {
        let set = |v: &str| (!v.trim().is_empty()).then(|| v.trim().to_owned());
        Ok(Filter {
            session_id: set(&self.session),
            payload_id: None,
            principal: set(&self.principal),
            action: set(&self.action),
            outcome: set(&self.outcome),
            since: instant("since", &self.since)?,
            until: instant("until", &self.until)?,
        })
    }

    fn url(&self, page: &str) -> String {
        views::filters_url("/audit", self, page)
    }
}

/// The verification's status line.
pub fn verification_notice(v: Option<&Verification>) -> Markup {
    match v {
        None => views::notice(
            "info",
            "No verification of the chain is on record (the last 100 000 events hold none). Verify it now to check every event up to the head.",
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
pub async fn run_verify(ctx: &Ctx) -> Result<Verification, tonic::Status> {
    let (service, p) = ctx.service();
    let r = service.verify_audit(p).await.map_err(status)?;
    let v = Verification {
        ok: r.outcome.ok,
        events_checked: r.outcome.events_checked,
        first_bad_seq: r.outcome.first_bad_seq,
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

/// Audit events looked back through for the last verification.
const VERIFY_LOOK_BACK: u64 = 100_000;

/// The tenant's last verification: this console's, or else the one its
/// chain records (an `audit.verify` event, by any door, before a restart
/// or on another replica). `None` when neither is known.
pub async fn last_verification(ctx: &Ctx) -> Result<Option<Verification>, tonic::Status> {
    let tenant = &ctx.signed.principal.tenant;
    let known = ctx
        .app
        .verified
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(tenant)
        .cloned();
    if known.is_some() {
        return Ok(known);
    }
    let (service, p) = ctx.service();
    let event = service
        .last_verification(p, VERIFY_LOOK_BACK)
        .await
        .map_err(status)?;
    let v = event.and_then(|e| from_event(&e));
    if let Some(v) = &v {
        ctx.app
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(tenant.clone())
            .or_insert_with(|| v.clone());
    }
    Ok(v)
}

/// A verification as its `audit.verify` event's detail records it:
/// `ok events_checked=N head_seq=M` or `bad first_bad_seq=S
/// events_checked=N head_seq=M`.
fn from_event(e: &AuditEvent) -> Option<Verification> {
    let mut words = e.detail.split(' ');
    let ok = match words.next()? {
        "ok" => true,
        "bad" => false,
        _ => return None,
    };
    let mut v = Verification {
        ok,
        events_checked: 0,
        first_bad_seq: 0,
        head_seq: 0,
        at: humantime::parse_rfc3339(&e.time).ok()?,
        by: e.principal.clone(),
    };
    for w in words {
        let (k, n) = w.split_once('=')?;
        let n: u64 = n.parse().ok()?;
        match k {
            "events_checked" => v.events_checked = n,
            "first_bad_seq" => v.first_bad_seq = n,
            "head_seq" => v.head_seq = n,
            _ => {}
        }
    }
    Some(v)
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

fn events_table(events: &[AuditEvent]) -> Markup {
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
                        td class="nowrap" { (e.time) }
                        td { (e.principal) }
                        td class="nowrap" { code { (e.action) } }
                        td { @if !e.session_id.is_empty() { a href=(format!("/sessions/{}", e.session_id)) { code { (e.session_id) } } } }
                        td { @if !e.payload_id.is_empty() { code { (e.payload_id) } } }
                        td class="nowrap" { (e.outcome) }
                        td { (views::cut(&e.detail, 300)) }
                    }
                }
            }
        }
    }
}

/// GET /audit.
pub async fn query(ctx: Ctx, Query(f): Query<AuditFilters>) -> Response {
    let last = if super::views::may(
        &ctx.signed.principal.roles,
        crate::auth::access::Rpc::VerifyAudit,
    ) {
        match last_verification(&ctx).await {
            Ok(v) => v,
            Err(s) => return ctx.refused(Section::Audit, &s),
        }
    } else {
        None
    };
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
    let filter = match f.filter() {
        Ok(r) => r,
        Err(e) => {
            let body = html! { (tools) (query_form(&f)) (views::notice("error", &e)) };
            return ctx.page_with(StatusCode::BAD_REQUEST, Section::Audit, "Audit", body);
        }
    };
    let (service, p) = ctx.service();
    let page = match service
        .query_audit(p, filter, &f.page, PAGE)
        .await
        .map_err(status)
    {
        Ok(r) => r,
        Err(s) if s.code() == tonic::Code::InvalidArgument => {
            let body = html! { (tools) (query_form(&f)) (views::notice("error", &super::ctx::message(&s))) };
            return ctx.page_with(StatusCode::BAD_REQUEST, Section::Audit, "Audit", body);
        }
        Err(s) => return ctx.refused(Section::Audit, &s),
    };
    let body = html! {
        (tools)
        (query_form(&f))
        @if page.items.is_empty() { p { "No events on this page." } } @else { (events_table(&page.items)) }
        nav aria-label="Pages" class="pager" {
            @if !f.page.is_empty() { a href=(f.url("")) { "First page" } }
            @if !page.next_token.is_empty() { " " a href=(f.url(&page.next_token)) rel="next" { "Next page" } }
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
pub async fn verify(ctx: Ctx, axum::Form(f): axum::Form<VerifyForm>) -> Response {
    if let Some(r) = ctx.csrf_refusal(&f.csrf) {
        return r;
    }
    match run_verify(&ctx).await {
        Ok(_) if f.back == "overview" => Redirect::to("/overview").into_response(),
        Ok(_) => Redirect::to("/audit?verified=1").into_response(),
        Err(s) => ctx.refused(Section::Audit, &s),
    }
}

/// GET /audit/export: the tenant's chain, one event per line in its
/// canonical JSON, streamed as the service reads it.
pub async fn export(ctx: Ctx) -> Response {
    let (service, p) = ctx.service();
    let stream = match service.export_audit(p).await {
        Ok(s) => tokio_stream::wrappers::ReceiverStream::new(s),
        Err(e) => return ctx.refused(Section::Audit, &status(e)),
    };
    let lines = stream.map(|item| {
        item.map(|e| {
            let mut line = e.to_export_line();
            line.push('\n');
            axum::body::Bytes::from(line)
        })
        .map_err(|e| std::io::Error::other(format!("the export stopped: {}", status(e).message())))
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

/// Whether a receipt's signature is this server's.
fn signature_ok(ctx: &Ctx, r: &ReceiptRecord) -> bool {
    ctx.app
        .service
        .receipt_signature_ok(&Signed::from(r), &r.signature)
}

/// A receipt in the API's JSON form (what the CLI prints with `--json`,
/// and what the paste form reads back).
fn receipt_json(r: &ReceiptRecord) -> String {
    serde_json::to_string_pretty(&crate::api::receipt_to_proto(r)).unwrap_or_default()
}

/// A receipt pasted in the API's JSON form, read back into the record the
/// signature covers; or what is wrong with it.
fn receipt_from_json(text: &str) -> Result<ReceiptRecord, String> {
    let m: proto::DeletionReceipt = serde_json::from_str(text).map_err(|e| {
        format!(
            "That is not a receipt in the API's JSON form: {}",
            views::cut(&e.to_string(), 200)
        )
    })?;
    let id = crate::ids::ReceiptId::parse(&m.id)
        .map_err(|e| format!("The receipt's id is not a receipt ID: {e}"))?;
    let deleted_payload_ids = m
        .deleted_payload_ids
        .iter()
        .map(|p| crate::ids::PayloadId::parse(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            format!("The receipt lists a deleted payload that is not a payload ID: {e}")
        })?;
    let at = m.deleted_at.unwrap_or_default();
    Ok(ReceiptRecord {
        id,
        target_id: m.target_id,
        reason: m.reason,
        requested_by: m.requested_by,
        tenant: String::new(),
        owner: String::new(),
        share_with: Vec::new(),
        deleted_ms: crate::receipt::timestamp_millis(at.seconds, at.nanos),
        deleted_payload_ids,
        bytes_deleted: m.bytes_deleted,
        content_sha256: m.content_sha256,
        removed: m.removed.into_iter().map(RemovedItem::from).collect(),
        signature: m.signature,
        purge_confirmed: crate::receipt::PurgeConfirmation::from_message(
            m.purge_confirmed_at.as_ref().map(|t| (t.seconds, t.nanos)),
            m.purge_replicas,
        ),
    })
}

fn receipt_view(ctx: &Ctx, r: &ReceiptRecord) -> Markup {
    let json = receipt_json(r);
    html! {
        section class="card" aria-labelledby="r-h" {
            h2 id="r-h" { "Receipt " code { (r.id) } }
            @if signature_ok(ctx, r) {
                (views::notice("ok", "Signature verified: signed by this server's receipt key, and unchanged since."))
            } @else {
                (views::notice("error", "Signature does NOT verify: the receipt was changed after signing, or another server signed it."))
            }
            dl class="meta" {
                dt { "Deleted" } dd { code { (r.target_id) } }
                dt { "Requested by" } dd { (r.requested_by) }
                dt { "Reason" } dd { (views::cut(&r.reason, 300)) }
                dt { "At" } dd { (views::time(r.deleted_ms)) }
                dt { "Payloads" } dd { (r.deleted_payload_ids.len()) ", " (views::bytes(r.bytes_deleted)) }
                dt { "Items removed" } dd { (r.removed.len()) }
                @if let Some(p) = r.purge_confirmed {
                    dt { "Purge confirmed" } dd { (views::time(p.at_ms)) ", by " (p.replicas) " replicas" }
                }
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
pub async fn receipt(ctx: Ctx, Query(q): Query<ReceiptQuery>) -> Response {
    let id = q.id.trim().to_owned();
    if id.is_empty() {
        let body = receipt_forms(&ctx, "", "");
        return ctx.page(Section::Audit, "Receipts", body);
    }
    if id.len() > super::ctx::MAX_ID {
        return ctx.id_too_long(Section::Audit, "receipt");
    }
    let lookup = if id.starts_with("rcpt_") {
        ReceiptLookup::parse(&id, "")
    } else {
        ReceiptLookup::parse("", &id)
    };
    let (service, p) = ctx.service();
    match service.get_receipt(p, lookup).await.map_err(status) {
        Ok(r) => {
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
    match receipt_from_json(&f.json) {
        Ok(r) => {
            let body = html! { (receipt_view(&ctx, &r)) (receipt_forms(&ctx, "", &f.json)) };
            ctx.page(Section::Audit, "Receipts", body)
        }
        Err(e) => {
            let body = html! {
                (views::notice("error", &e))
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
    fn a_verify_events_detail_reads_back_as_the_verification() {
        let e = AuditEvent {
            action: action::AUDIT_VERIFY.into(),
            detail: "bad first_bad_seq=7 events_checked=9 head_seq=12".into(),
            principal: "carol".into(),
            time: "2026-12-01T09:30:00.000Z".into(),
            ..Default::default()
        };
        let v = from_event(&e).unwrap();
        assert_eq!(
            (v.ok, v.first_bad_seq, v.events_checked, v.head_seq),
            (false, 7, 9, 12)
        );
        assert_eq!(v.by, "carol");
        assert_eq!(
            humantime::format_rfc3339_seconds(v.at).to_string(),
            "2026-12-01T09:30:00Z"
        );
        let ok = AuditEvent {
            detail: "ok events_checked=3 head_seq=3".into(),
            ..e.clone()
        };
        assert!(from_event(&ok).unwrap().ok);
        let odd = AuditEvent {
            detail: "export".into(),
            ..e
        };
        assert!(from_event(&odd).is_none());
    }

    #[test]
    fn a_pasted_receipt_keeps_its_purge_confirmation_in_the_signed_fields() {
        let r = ReceiptRecord {
            id: crate::ids::ReceiptId::generate(),
            target_id: "pl_00000000000000000000000000000003".into(),
            reason: "asked".into(),
            requested_by: "alice".into(),
            tenant: String::new(),
            owner: String::new(),
            share_with: Vec::new(),
            deleted_ms: 1_796_031_106_334,
            deleted_payload_ids: Vec::new(),
            bytes_deleted: 42,
            content_sha256: vec!["ab".into()],
            removed: Vec::new(),
            signature: "00".into(),
            purge_confirmed: Some(crate::receipt::PurgeConfirmation {
                at_ms: 1_796_031_106_900,
                replicas: 3,
            }),
        };
        let canonical = |r: &ReceiptRecord| crate::receipt::canonical(&Signed::from(r));
        let json = receipt_json(&r);
        assert!(json.contains("purgeConfirmedAt"), "{json}");
        let back = receipt_from_json(&json).unwrap();
        assert_eq!(back.purge_confirmed, r.purge_confirmed);
        assert_eq!(canonical(&back), canonical(&r));
        // Without the confirmation the signed fields differ.
        let mut plain: serde_json::Value = serde_json::from_str(&json).unwrap();
        plain.as_object_mut().unwrap().remove("purgeConfirmedAt");
        let back = receipt_from_json(&plain.to_string()).unwrap();
        assert_eq!(back.purge_confirmed, None);
        assert_ne!(canonical(&back), canonical(&r));
    }

    #[test]
    fn datetime_local_values_are_read_as_utc() {
        let t = instant("since", "2026-12-01T09:30").unwrap().unwrap();
        assert_eq!(t % 86_400_000, (9 * 3600 + 30 * 60) * 1000);
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
