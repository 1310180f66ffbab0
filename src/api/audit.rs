//! `spillway.v1.Audit`: QueryAudit, VerifyAudit and ExportAudit, over the
//! caller's tenant's chain only. Reading the log is itself audited
//! (`audit.query`, `audit.verify`).

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{AppState, blocking, page_size, principal};
use crate::audit::{AuditEvent, Filter, NewEvent, action};
use crate::auth::access::{self, Relation, Rpc, SessionOwnership, Target};
use crate::clock::Millis;
use crate::error::ApiError;
use crate::ids::{PayloadId, ReceiptId, SessionId};
use crate::proto::{self, audit_server::Audit};

/// Events read per engine scan of an export.
const EXPORT_BATCH: usize = 256;
/// Events buffered ahead of a slow export client.
const EXPORT_QUEUE: usize = 1024;
/// Longest principal filter accepted.
const MAX_PRINCIPAL: usize = 256;

/// How GetReceipt finds a receipt.
enum Lookup {
    Receipt(ReceiptId),
    Target(String),
}

/// The Audit service.
#[derive(Debug, Clone)]
pub struct AuditService {
    state: AppState,
}

impl AuditService {
    /// Wraps the shared state.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

/// An event for the wire: field for field.
pub fn event_to_proto(e: AuditEvent) -> proto::AuditEvent {
    proto::AuditEvent {
        seq: e.seq,
        time: e.time,
        principal: e.principal,
        tenant: e.tenant,
        action: e.action,
        session_id: e.session_id,
        payload_id: e.payload_id,
        outcome: e.outcome,
        detail: e.detail,
        content_sha256: e.content_sha256,
        prev_hash: e.prev_hash,
        hash: e.hash,
    }
}

/// An event from the wire, as the chain knows it (for exports and
/// client-side verification).
pub fn event_from_proto(e: proto::AuditEvent) -> AuditEvent {
    AuditEvent {
        action: e.action,
        content_sha256: e.content_sha256,
        detail: e.detail,
        hash: e.hash,
        outcome: e.outcome,
        payload_id: e.payload_id,
        prev_hash: e.prev_hash,
        principal: e.principal,
        seq: e.seq,
        session_id: e.session_id,
        tenant: e.tenant,
        time: e.time,
    }
}

fn millis(t: &pbjson_types::Timestamp) -> Millis {
    t.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos) / 1_000_000)
}

/// The filter of a query, checked; and the names of the filters set.
fn filter(q: &proto::AuditQuery) -> Result<(Filter, Vec<&'static str>), ApiError> {
    let mut used = Vec::new();
    let mut set = |name: &'static str, value: &str| -> Option<String> {
        (!value.is_empty()).then(|| {
            used.push(name);
            value.to_owned()
        })
    };
    let f = Filter {
        session_id: set("session_id", &q.session_id),
        payload_id: set("payload_id", &q.payload_id),
        principal: set("principal", &q.principal),
        action: set("action", &q.action),
        outcome: set("outcome", &q.outcome),
        since: q.since.as_ref().map(millis),
        until: q.until.as_ref().map(millis),
    };
    if f.since.is_some() {
        used.push("since");
    }
    if f.until.is_some() {
        used.push("until");
    }
    if let Some(s) = &f.session_id {
        SessionId::parse(s)?;
    }
    if let Some(p) = &f.payload_id {
        PayloadId::parse(p)?;
    }
    if q.principal.len() > MAX_PRINCIPAL {
        return Err(ApiError::BadRequest(format!(
            "principal is {} bytes; at most {MAX_PRINCIPAL} are allowed",
            q.principal.len()
        )));
    }
    if let Some(a) = &f.action
        && !action::ALL.contains(&a.as_str())
    {
        return Err(ApiError::BadRequest(format!(
            "action {:?} is not one the log records; use one of {}",
            a.chars().take(64).collect::<String>(),
            action::ALL.join(", ")
        )));
    }
    if let Some(o) = &f.outcome
        && !crate::audit::outcome::ALL.contains(&o.as_str())
    {
        return Err(ApiError::BadRequest(format!(
            "outcome {:?} is not one the log records; use one of {}",
            o.chars().take(64).collect::<String>(),
            crate::audit::outcome::ALL.join(", ")
        )));
    }
    Ok((f, used))
}

#[tonic::async_trait]
impl Audit for AuditService {
    #[instrument(name = "audit.query", skip_all, err(level = "info"))]
    async fn query_audit(
        &self,
        req: Request<proto::AuditQuery>,
    ) -> Result<Response<proto::AuditQueryResponse>, Status> {
        let p = principal(&req)?;
        self.state.authorize(&p, Rpc::QueryAudit).await?;
        let q = req.into_inner();
        let (filter, used) = filter(&q)?;
        let size = page_size(q.page_size, self.state.config.limits.max_page_size);
        let store = self.state.store.clone();
        let tenant = p.tenant.clone();
        let page =
            blocking(move || store.audit().query(&tenant, &filter, &q.page_token, size)).await?;
        let filters = if used.is_empty() {
            "none".to_owned()
        } else {
            used.join(",")
        };
        self.state
            .audit(
                &p,
                NewEvent::new(action::AUDIT_QUERY)
                    .detail(format!("events={} filters={filters}", page.items.len())),
            )
            .await?;
        Ok(Response::new(proto::AuditQueryResponse {
            events: page.items.into_iter().map(event_to_proto).collect(),
            next_page_token: page.next_token,
        }))
    }

    #[instrument(name = "audit.verify", skip_all, err(level = "info"))]
    async fn verify_audit(
        &self,
        req: Request<proto::VerifyAuditRequest>,
    ) -> Result<Response<proto::VerifyAuditResponse>, Status> {
        let p = principal(&req)?;
        self.state.authorize(&p, Rpc::VerifyAudit).await?;
        let store = self.state.store.clone();
        let tenant = p.tenant.clone();
        let v = blocking(move || store.audit().verify(&tenant)).await?;
        let o = v.outcome;
        let detail = if o.ok {
            format!(
                "ok events_checked={} head_seq={}",
                o.events_checked, v.head_seq
            )
        } else {
            tracing::error!(tenant = %p.tenant, first_bad_seq = o.first_bad_seq, "the audit chain does not verify");
            format!(
                "bad first_bad_seq={} events_checked={} head_seq={}",
                o.first_bad_seq, o.events_checked, v.head_seq
            )
        };
        self.state
            .audit(&p, NewEvent::new(action::AUDIT_VERIFY).detail(detail))
            .await?;
        Ok(Response::new(proto::VerifyAuditResponse {
            ok: o.ok,
            events_checked: o.events_checked,
            first_bad_seq: o.first_bad_seq,
            head_seq: v.head_seq,
            head_hash: v.head_hash,
        }))
    }

    #[instrument(name = "audit.get_receipt", skip_all, err(level = "info"))]
    async fn get_receipt(
        &self,
        req: Request<proto::GetReceiptRequest>,
    ) -> Result<Response<proto::DeletionReceipt>, Status> {
        let p = principal(&req)?;
        self.state.authorize(&p, Rpc::GetReceipt).await?;
        let r = req.into_inner();
        let lookup = match (r.receipt_id.is_empty(), r.target_id.is_empty()) {
            (false, true) => Lookup::Receipt(
                ReceiptId::parse(&r.receipt_id)
                    .map_err(|e| ApiError::BadRequest(format!("receipt_id: {e}")))?,
            ),
            (true, false) => {
                if SessionId::parse(&r.target_id).is_err()
                    && PayloadId::parse(&r.target_id).is_err()
                {
                    return Err(ApiError::BadRequest(format!(
                        "target_id {:?} is neither a session ID (ses_…) nor a payload ID (pl_…)",
                        r.target_id
                    ))
                    .into());
                }
                Lookup::Target(r.target_id)
            }
            _ => {
                return Err(ApiError::BadRequest(
                    "give exactly one of receipt_id (rcpt_…) and target_id (the deleted ses_… or pl_… ID)".into(),
                )
                .into());
            }
        };
        let asked = match &lookup {
            Lookup::Receipt(id) => id.to_string(),
            Lookup::Target(t) => t.clone(),
        };
        let store = self.state.store.clone();
        let found = blocking(move || match lookup {
            Lookup::Receipt(id) => match store.receipt(&id) {
                Ok(r) => Ok(Some(r)),
                Err(crate::store::StoreError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            },
            Lookup::Target(t) => store.deletion_receipt(&t),
        })
        .await?;
        // A receipt is seen as its deleted session's metadata was.
        let checked = match found {
            None => Err(ApiError::Hidden {
                kind: "receipt",
                id: asked,
            }),
            Some(r) => {
                let relation = Relation::of(
                    &p,
                    SessionOwnership {
                        tenant: &r.tenant,
                        owner: &r.owner,
                        share_with: &r.share_with,
                    },
                );
                let target = Target::Session {
                    relation,
                    compliance_can_read: false,
                };
                super::access_result(
                    access::decide(&p, Rpc::GetReceipt, target),
                    "receipt",
                    &asked,
                )
                .map(|()| r)
            }
        };
        let receipt = self
            .state
            .refusal(&p, Rpc::GetReceipt, checked, "", "")
            .await?;
        self.state
            .audit(
                &p,
                NewEvent::new(action::RECEIPT_GET).detail(format!(
                    "receipt={} target={}",
                    receipt.id, receipt.target_id
                )),
            )
            .await?;
        Ok(Response::new(super::convert::receipt(&receipt)))
    }

    type ExportAuditStream = ReceiverStream<Result<proto::AuditEvent, Status>>;

    #[instrument(name = "audit.export", skip_all, err(level = "info"))]
    async fn export_audit(
        &self,
        req: Request<proto::ExportAuditRequest>,
    ) -> Result<Response<Self::ExportAuditStream>, Status> {
        let p = principal(&req)?;
        self.state.authorize(&p, Rpc::ExportAudit).await?;
        // Recorded first, so the export ends with its own event.
        self.state
            .audit(
                &p,
                NewEvent::new(action::AUDIT_QUERY).detail("export".to_owned()),
            )
            .await?;
        let store = self.state.store.clone();
        let tenant = p.tenant.clone();
        let (upto, _) = blocking(move || store.audit().head(&tenant)).await?;
        let (tx, rx) = mpsc::channel(EXPORT_QUEUE);
        let store = self.state.store.clone();
        let tenant = p.tenant.clone();
        tokio::task::spawn_blocking(move || {
            let mut from = 1;
            while from <= upto {
                let (events, next) =
                    match store.audit().export_page(&tenant, from, upto, EXPORT_BATCH) {
                        Ok(page) => page,
                        Err(e) => {
                            let _ = tx.blocking_send(Err(ApiError::from(e).into()));
                            return;
                        }
                    };
                for e in events {
                    if tx.blocking_send(Ok(event_to_proto(e))).is_err() {
                        return; // the client went away
                    }
                }
                from = next;
            }
        });
        tracing::info!(tenant = %p.tenant, events = upto, "audit export started");
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_convert_to_the_wire_and_back_unchanged() {
        let mut b = crate::audit::ChainBuilder::new();
        let e = b.append(AuditEvent {
            time: "2026-11-30T09:31:46.334Z".into(),
            principal: "alice".into(),
            tenant: "acme".into(),
            action: action::PAYLOAD_READ.into(),
            session_id: "ses_1".into(),
            payload_id: "pl_2".into(),
            outcome: "ok".into(),
            detail: "bytes=0-10".into(),
            content_sha256: "ab".repeat(32),
            ..AuditEvent::default()
        });
        assert_eq!(event_from_proto(event_to_proto(e.clone())), e);
    }

    #[test]
    fn query_filters_are_checked_and_named() {
        let q = proto::AuditQuery {
            action: "payload.read".into(),
            principal: "alice".into(),
            since: Some(pbjson_types::Timestamp {
                seconds: 2,
                nanos: 5_000_000,
            }),
            ..Default::default()
        };
        let (f, used) = filter(&q).unwrap();
        assert_eq!(used, ["principal", "action", "since"]);
        assert_eq!((f.since, f.until), (Some(2005), None));
        for bad in [
            proto::AuditQuery {
                action: "payload.reed".into(),
                ..Default::default()
            },
            proto::AuditQuery {
                session_id: "pl_nope".into(),
                ..Default::default()
            },
            proto::AuditQuery {
                principal: "x".repeat(300),
                ..Default::default()
            },
        ] {
            assert!(matches!(
                filter(&bad),
                Err(ApiError::BadRequest(_) | ApiError::Id(_))
            ));
        }
    }
}
