//! `spillway.v1.Audit`: QueryAudit, VerifyAudit, GetReceipt and
//! ExportAudit.

use tracing::instrument;

use super::convert;
use crate::audit::{AuditEvent, Filter};
use crate::proto::{self, audit_server::Audit};
use crate::service::ReceiptLookup;

front!(
    /// The Audit service.
    AuditService
);

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

/// A query's filter; the service checks it.
fn filter(q: &proto::AuditQuery) -> Filter {
    let set = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    Filter {
        session_id: set(&q.session_id),
        payload_id: set(&q.payload_id),
        principal: set(&q.principal),
        action: set(&q.action),
        outcome: set(&q.outcome),
        since: q.since.as_ref().map(convert::millis),
        until: q.until.as_ref().map(convert::millis),
    }
}

rpcs! {
    impl Audit for AuditService {
        type ExportAuditStream = super::Relay<proto::AuditEvent>;

        #[instrument(name = "audit.query", skip_all, err(level = "info"))]
        fn query_audit(&self, p, q: proto::AuditQuery) -> proto::AuditQueryResponse {
            let page = self
                .service
                .query_audit(&p, filter(&q), &q.page_token, q.page_size)
                .await?;
            proto::AuditQueryResponse {
                events: page.items.into_iter().map(event_to_proto).collect(),
                next_page_token: page.next_token,
            }
        }

        #[instrument(name = "audit.verify", skip_all, err(level = "info"))]
        fn verify_audit(&self, p, _: proto::VerifyAuditRequest) -> proto::VerifyAuditResponse {
            let v = self.service.verify_audit(&p).await?;
            proto::VerifyAuditResponse {
                ok: v.outcome.ok,
                events_checked: v.outcome.events_checked,
                first_bad_seq: v.outcome.first_bad_seq,
                head_seq: v.head_seq,
                head_hash: v.head_hash,
            }
        }

        #[instrument(name = "audit.get_receipt", skip_all, err(level = "info"))]
        fn get_receipt(&self, p, r: proto::GetReceiptRequest) -> proto::DeletionReceipt {
            // Parsed after the role check, as every refusal is.
            let lookup = ReceiptLookup::parse(&r.receipt_id, &r.target_id);
            let receipt = self.service.get_receipt(&p, lookup).await?;
            convert::receipt(&receipt)
        }

        #[instrument(name = "audit.export", skip_all, err(level = "info"))]
        fn export_audit(&self, p, _: proto::ExportAuditRequest) -> Self::ExportAuditStream {
            let events = self.service.export_audit(&p).await?;
            super::relay(events, event_to_proto)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::action;

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
        assert_eq!(crate::cli::event_from_proto(event_to_proto(e.clone())), e);
    }

    #[test]
    fn query_filters_keep_only_what_is_set() {
        let q = proto::AuditQuery {
            action: "payload.read".into(),
            since: Some(pbjson_types::Timestamp {
                seconds: 2,
                nanos: 5_000_000,
            }),
            ..Default::default()
        };
        let f = filter(&q);
        assert_eq!(f.action.as_deref(), Some("payload.read"));
        assert_eq!((f.since, f.until, f.principal), (Some(2005), None, None));
    }
}
