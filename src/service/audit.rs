//! Audit operations: QueryAudit, VerifyAudit, GetReceipt and ExportAudit,
//! over the caller's tenant's chain only. Reading the log is itself audited
//! (`audit.query`, `audit.verify`).

use tokio::sync::mpsc;

use super::{Service, blocking, page_size};
use crate::audit::{AuditEvent, Filter, NewEvent, Verified, action};
use crate::auth::Principal;
use crate::auth::access::{self, Relation, Rpc, SessionOwnership, Target};
use crate::error::{ApiError, ApiResult};
use crate::ids::{PayloadId, ReceiptId, SessionId};
use crate::store::{Page, ReceiptRecord};

/// Events read per engine scan of an export.
const EXPORT_BATCH: usize = 256;
/// Events buffered ahead of a slow export client.
const EXPORT_QUEUE: usize = 1024;
/// Longest principal filter accepted.
const MAX_PRINCIPAL: usize = 256;

/// How GetReceipt finds a receipt.
#[derive(Debug, Clone)]
pub enum ReceiptLookup {
    /// By its own ID.
    Receipt(ReceiptId),
    /// By the ID of what it deleted.
    Target(String),
}

impl ReceiptLookup {
    /// The lookup of exactly one of `receipt_id` and `target_id`.
    pub fn parse(receipt_id: &str, target_id: &str) -> ApiResult<Self> {
        match (receipt_id.is_empty(), target_id.is_empty()) {
            (false, true) => Ok(Self::Receipt(
                ReceiptId::parse(receipt_id)
                    .map_err(|e| ApiError::BadRequest(format!("receipt_id: {e}")))?,
            )),
            (true, false) => {
                if SessionId::parse(target_id).is_err() && PayloadId::parse(target_id).is_err() {
                    return Err(ApiError::BadRequest(format!(
                        "target_id {target_id:?} is neither a session ID (ses_…) nor a payload ID (pl_…)"
                    )));
                }
                Ok(Self::Target(target_id.to_owned()))
            }
            _ => Err(ApiError::BadRequest(
                "give exactly one of receipt_id (rcpt_…) and target_id (the deleted ses_… or pl_… ID)".into(),
            )),
        }
    }
}

/// An export's events, oldest first; an error ends it.
pub type ExportStream = mpsc::Receiver<ApiResult<AuditEvent>>;

/// Checks a query's filter; returns the names of the filters set.
fn check_filter(f: &Filter) -> ApiResult<Vec<&'static str>> {
    if let Some(s) = &f.session_id {
        SessionId::parse(s)?;
    }
    if let Some(p) = &f.payload_id {
        PayloadId::parse(p)?;
    }
    if let Some(p) = &f.principal
        && p.len() > MAX_PRINCIPAL
    {
        return Err(ApiError::BadRequest(format!(
            "principal is {} bytes; at most {MAX_PRINCIPAL} are allowed",
            p.len()
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
    let set = [
        ("session_id", f.session_id.is_some()),
        ("payload_id", f.payload_id.is_some()),
        ("principal", f.principal.is_some()),
        ("action", f.action.is_some()),
        ("outcome", f.outcome.is_some()),
        ("since", f.since.is_some()),
        ("until", f.until.is_some()),
    ];
    Ok(set.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect())
}

impl Service {
    /// One page of the caller's tenant's events that match `filter`.
    pub async fn query_audit(
        &self,
        p: &Principal,
        filter: Filter,
        page_token: &str,
        page: u32,
    ) -> ApiResult<Page<AuditEvent>> {
        self.authorize(p, Rpc::QueryAudit).await?;
        let used = check_filter(&filter)?;
        let size = page_size(page, self.config.limits.max_page_size);
        let log = self.audit_log.clone();
        let (tenant, token) = (p.tenant.clone(), page_token.to_owned());
        let page = blocking(move || log.query(&tenant, &filter, &token, size)).await?;
        let filters = if used.is_empty() {
            "none".to_owned()
        } else {
            used.join(",")
        };
        let detail = format!("events={} filters={filters}", page.items.len());
        self.audit(p, NewEvent::new(action::AUDIT_QUERY).detail(detail))
            .await?;
        Ok(page)
    }

    /// Verifies the caller's tenant's chain from its first event to its head.
    pub async fn verify_audit(&self, p: &Principal) -> ApiResult<Verified> {
        self.authorize(p, Rpc::VerifyAudit).await?;
        let (log, tenant) = (self.audit_log.clone(), p.tenant.clone());
        let v = blocking(move || log.verify(&tenant)).await?;
        let o = &v.outcome;
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
        self.audit(p, NewEvent::new(action::AUDIT_VERIFY).detail(detail))
            .await?;
        Ok(v)
    }

    /// The caller's tenant's last VerifyAudit, from its own `audit.verify`
    /// event in the chain (so it survives restarts and is the same on every
    /// replica), looking back at most `look_back` events.
    pub async fn last_verification(
        &self,
        p: &Principal,
        look_back: u64,
    ) -> ApiResult<Option<AuditEvent>> {
        self.authorize(p, Rpc::VerifyAudit).await?;
        let (log, tenant) = (self.audit_log.clone(), p.tenant.clone());
        blocking(move || log.last_of(&tenant, action::AUDIT_VERIFY, look_back)).await
    }

    /// A deletion receipt, seen as its deleted session's metadata was.
    pub async fn get_receipt(
        &self,
        p: &Principal,
        lookup: ApiResult<ReceiptLookup>,
    ) -> ApiResult<ReceiptRecord> {
        self.authorize(p, Rpc::GetReceipt).await?;
        let lookup = lookup?;
        let asked = match &lookup {
            ReceiptLookup::Receipt(id) => id.to_string(),
            ReceiptLookup::Target(t) => t.clone(),
        };
        let store = self.store.clone();
        let found = blocking(move || match lookup {
            ReceiptLookup::Receipt(id) => match store.receipt(&id) {
                Ok(r) => Ok(Some(r)),
                Err(crate::store::StoreError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            },
            ReceiptLookup::Target(t) => store.deletion_receipt(&t),
        })
        .await?;
        let checked = match found {
            None => Err(ApiError::Hidden {
                kind: "receipt",
                id: asked,
            }),
            Some(r) => {
                let owner = SessionOwnership {
                    tenant: &r.tenant,
                    owner: &r.owner,
                    share_with: &r.share_with,
                };
                let target = Target::Session {
                    relation: Relation::of(p, owner),
                    compliance_can_read: false,
                };
                let answer = access::decide(p, Rpc::GetReceipt, target);
                super::access_result(answer, "receipt", &asked).map(|()| r)
            }
        };
        let receipt = self.refusal(p, Rpc::GetReceipt, checked, "", "").await?;
        let detail = format!("receipt={} target={}", receipt.id, receipt.target_id);
        self.audit(p, NewEvent::new(action::RECEIPT_GET).detail(detail))
            .await?;
        Ok(receipt)
    }

    /// Whether a receipt's signature is this server's: a check of the
    /// given fields against the server's receipt key, which reads no stored
    /// data (the CLI makes the same check with the key file).
    pub fn receipt_signature_ok(&self, r: &crate::receipt::Signed<'_>, signature: &str) -> bool {
        self.store.verify_receipt(r, signature)
    }

    /// Streams the caller's tenant's whole chain, up to its head when the
    /// export starts. The export is recorded first, so it ends with its own
    /// event.
    pub async fn export_audit(&self, p: &Principal) -> ApiResult<ExportStream> {
        self.authorize(p, Rpc::ExportAudit).await?;
        let event = NewEvent::new(action::AUDIT_QUERY).detail("export".to_owned());
        self.audit(p, event).await?;
        let (log, tenant) = (self.audit_log.clone(), p.tenant.clone());
        let (upto, _) = {
            let (log, tenant) = (log.clone(), tenant.clone());
            blocking(move || log.head(&tenant)).await?
        };
        let (tx, rx) = mpsc::channel(EXPORT_QUEUE);
        tokio::task::spawn_blocking(move || {
            let mut from = 1;
            while from <= upto {
                let (events, next) = match log.export_page(&tenant, from, upto, EXPORT_BATCH) {
                    Ok(page) => page,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(ApiError::from(e)));
                        return;
                    }
                };
                for e in events {
                    if tx.blocking_send(Ok(e)).is_err() {
                        return; // the client went away
                    }
                }
                from = next;
            }
        });
        tracing::info!(tenant = %p.tenant, events = upto, "audit export started");
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_filters_are_checked_and_named() {
        let f = Filter {
            action: Some("payload.read".into()),
            principal: Some("alice".into()),
            since: Some(2005),
            ..Default::default()
        };
        assert_eq!(check_filter(&f).unwrap(), ["principal", "action", "since"]);
        for bad in [
            Filter {
                action: Some("payload.reed".into()),
                ..Default::default()
            },
            Filter {
                session_id: Some("pl_nope".into()),
                ..Default::default()
            },
            Filter {
                principal: Some("x".repeat(300)),
                ..Default::default()
            },
        ] {
            assert!(matches!(
                check_filter(&bad),
                Err(ApiError::BadRequest(_) | ApiError::Id(_))
            ));
        }
    }
}
