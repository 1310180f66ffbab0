//! `spillway.v1.Sessions`.

use std::collections::BTreeMap;

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{AppState, blocking, convert, page_size, principal};
use crate::audit::{NewEvent, action};
use crate::auth::access::{self, Rpc};
use crate::error::ApiError;
use crate::ids::SessionId;
use crate::policy;
use crate::proto::{self, sessions_server::Sessions};
use crate::store::NewSession;
use crate::store::records::{PolicyOverrides, SessionState};

/// Longest label, label key or value, and principal ID accepted.
const MAX_LABEL: usize = 256;
/// Most labels and `share_with` entries on one session.
const MAX_ENTRIES: usize = 64;

/// The Sessions service.
#[derive(Debug, Clone)]
pub struct SessionsService {
    state: AppState,
}

impl SessionsService {
    /// Wraps the shared state.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

fn check_len(field: &str, value: &str) -> Result<(), ApiError> {
    if value.len() > MAX_LABEL {
        return Err(ApiError::BadRequest(format!(
            "{field} is {} bytes; at most {MAX_LABEL} are allowed",
            value.len()
        )));
    }
    Ok(())
}

/// ListSessions' optional filters, checked against stored records.
struct ListFilter {
    owner: Option<String>,
    labels: Vec<(String, String)>,
    expires_before_ms: Option<crate::clock::Millis>,
    legal_hold: Option<bool>,
    label_contains: Option<String>,
}

impl ListFilter {
    fn of(r: &proto::ListSessionsRequest) -> Self {
        Self {
            owner: (!r.owner.is_empty()).then(|| r.owner.clone()),
            labels: r
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            expires_before_ms: r.expires_before.as_ref().map(|t| {
                t.seconds
                    .saturating_mul(1000)
                    .saturating_add(i64::from(t.nanos) / 1_000_000)
            }),
            legal_hold: r.legal_hold,
            label_contains: (!r.label_contains.is_empty()).then(|| r.label_contains.to_lowercase()),
        }
    }

    /// Whether `s` passes; `ttl` gives its effective session TTL (its
    /// expiry is the earlier of the stored one and creation plus the TTL).
    fn keep(
        &self,
        s: &crate::store::records::SessionRecord,
        ttl: &dyn Fn(&crate::store::records::SessionRecord) -> std::time::Duration,
    ) -> bool {
        self.owner.as_ref().is_none_or(|o| *o == s.owner)
            && self
                .labels
                .iter()
                .all(|(k, v)| s.labels.get(k).is_some_and(|have| have == v))
            && self.legal_hold.is_none_or(|h| h == s.legal_hold)
            && self
                .label_contains
                .as_ref()
                .is_none_or(|t| s.label.to_lowercase().contains(t.as_str()))
            && self.expires_before_ms.is_none_or(|before| {
                s.expires_ms.min(crate::clock::add(s.created_ms, ttl(s))) < before
            })
    }
}

#[tonic::async_trait]
impl Sessions for SessionsService {
    #[instrument(name = "sessions.create", skip_all, err(level = "info"))]
    async fn create_session(
        &self,
        req: Request<proto::CreateSessionRequest>,
    ) -> Result<Response<proto::Session>, Status> {
        let p = principal(&req)?;
        self.state.authorize(&p, Rpc::CreateSession).await?;
        let r = req.into_inner();
        check_len("label", &r.label)?;
        if r.labels.len() > MAX_ENTRIES || r.share_with.len() > MAX_ENTRIES {
            return Err(ApiError::BadRequest(format!(
                "at most {MAX_ENTRIES} labels and {MAX_ENTRIES} share_with entries are allowed"
            ))
            .into());
        }
        for (k, v) in &r.labels {
            check_len("a label key", k)?;
            check_len("a label value", v)?;
        }
        for s in &r.share_with {
            check_len("a share_with entry", s)?;
        }
        let parent = if r.parent_session_id.is_empty() {
            None
        } else {
            Some(
                self.state
                    .session_for(&p, Rpc::GetSession, &r.parent_session_id)
                    .await?,
            )
        };
        // Overrides may only tighten what the session would get without
        // them: the tenant's policy, and a parent's overrides, which a
        // sub-agent session inherits.
        let overrides = match &r.policy {
            Some(m) => convert::policy_level_from(m)?,
            None => PolicyOverrides::default(),
        };
        policy::validate(&overrides, false)?;
        let inherited = parent
            .as_ref()
            .map(|s| s.policy.clone())
            .unwrap_or_default();
        let tenant = self.state.tenant_policy(&p.tenant).await?;
        let server = self.state.server_policy();
        policy::check_overrides(&policy::effective(&server, &tenant, &inherited), &overrides)?;
        let overrides = policy::combine(&inherited, &overrides);
        let effective = policy::effective(&server, &tenant, &overrides);
        policy::validate_effective(&effective)?;
        let new = NewSession {
            tenant: p.tenant.clone(),
            owner: p.id.clone(),
            label: r.label,
            labels: r.labels.into_iter().collect::<BTreeMap<_, _>>(),
            parent: parent.map(|s| s.id),
            share_with: r.share_with,
            policy: overrides,
            ttl: Some(effective.session_ttl),
        };
        let store = self.state.store.clone();
        let s = blocking(move || store.create_session(new)).await?;
        let mut detail = Vec::new();
        if let Some(parent) = &s.parent {
            detail.push(format!("parent={parent}"));
        }
        if !s.share_with.is_empty() {
            detail.push(format!("share_with={}", s.share_with.join(",")));
        }
        self.state
            .audit(
                &p,
                NewEvent::new(action::SESSION_CREATE)
                    .session(&s.id)
                    .detail(detail.join(" ")),
            )
            .await?;
        tracing::info!(session_id = %s.id, principal = %p.id, "session created");
        Ok(Response::new(convert::session(&s, &effective)))
    }

    #[instrument(name = "sessions.get", skip_all, err(level = "info"))]
    async fn get_session(
        &self,
        req: Request<proto::GetSessionRequest>,
    ) -> Result<Response<proto::Session>, Status> {
        let p = principal(&req)?;
        let s = self
            .state
            .session_for(&p, Rpc::GetSession, &req.get_ref().session_id)
            .await?;
        let effective = self.state.effective_policy(&s).await?;
        Ok(Response::new(convert::session(&s, &effective)))
    }

    #[instrument(name = "sessions.list", skip_all, err(level = "info"))]
    async fn list_sessions(
        &self,
        req: Request<proto::ListSessionsRequest>,
    ) -> Result<Response<proto::ListSessionsResponse>, Status> {
        let p = principal(&req)?;
        self.state.authorize(&p, Rpc::ListSessions).await?;
        let r = req.into_inner();
        let want = match proto::SessionState::try_from(r.state) {
            Ok(proto::SessionState::Unspecified) => None,
            Ok(proto::SessionState::Open) => Some(SessionState::Open),
            Ok(proto::SessionState::Closed) => Some(SessionState::Closed),
            // Deleted sessions leave only their receipts behind.
            Ok(proto::SessionState::Deleted) => {
                return Ok(Response::new(proto::ListSessionsResponse::default()));
            }
            Err(_) => {
                return Err(ApiError::BadRequest(format!(
                    "state {} is not a SessionState",
                    r.state
                ))
                .into());
            }
        };
        let size = page_size(r.page_size, self.state.config.limits.max_page_size);
        check_len("owner", &r.owner)?;
        check_len("label_contains", &r.label_contains)?;
        if r.labels.len() > MAX_ENTRIES {
            return Err(ApiError::BadRequest(format!(
                "at most {MAX_ENTRIES} label filters are allowed"
            ))
            .into());
        }
        // Every session listed is of the caller's tenant.
        let tenant = self.state.tenant_policy(&p.tenant).await?;
        let server = self.state.server_policy();
        let filter = ListFilter::of(&r);
        let store = self.state.store.clone();
        let principal = p.clone();
        let (level, defaults) = (tenant.clone(), server.clone());
        let page = blocking(move || {
            store.list_sessions(&principal.tenant, &r.page_token, size, &|s| {
                want.is_none_or(|w| s.state == w)
                    && access::can_see(&principal, super::ownership(s))
                    && filter.keep(s, &|s| {
                        policy::effective(&defaults, &level, &s.policy).session_ttl
                    })
            })
        })
        .await?;
        Ok(Response::new(proto::ListSessionsResponse {
            sessions: page
                .items
                .iter()
                .map(|s| convert::session(s, &policy::effective(&server, &tenant, &s.policy)))
                .collect(),
            next_page_token: page.next_token,
        }))
    }

    #[instrument(name = "sessions.close", skip_all, err(level = "info"))]
    async fn close_session(
        &self,
        req: Request<proto::CloseSessionRequest>,
    ) -> Result<Response<proto::Session>, Status> {
        let p = principal(&req)?;
        let s = self
            .state
            .session_for(&p, Rpc::CloseSession, &req.get_ref().session_id)
            .await?;
        let delete_on_close = self.state.effective_policy(&s).await?.delete_on_close;
        let store = self.state.store.clone();
        let (s, receipt) = blocking(move || store.close_session(&s.id, delete_on_close)).await?;
        let detail = match (&receipt, delete_on_close) {
            (Some(r), _) => format!(
                "delete_on_close: receipt={} payloads={} bytes={} items={}",
                r.id,
                r.deleted_payload_ids.len(),
                r.bytes_deleted,
                r.removed.len()
            ),
            (None, true) if s.legal_hold => {
                "delete_on_close: deferred by the legal hold; the payloads are deleted once it is lifted".to_owned()
            }
            (None, _) => String::new(),
        };
        self.state
            .audit(
                &p,
                NewEvent::new(action::SESSION_CLOSE)
                    .session(&s.id)
                    .detail(detail),
            )
            .await?;
        tracing::info!(session_id = %s.id, principal = %p.id, deleted = receipt.is_some(), "session closed");
        let effective = self.state.effective_policy(&s).await?;
        Ok(Response::new(convert::session(&s, &effective)))
    }

    #[instrument(name = "sessions.delete", skip_all, err(level = "info"))]
    async fn delete_session(
        &self,
        req: Request<proto::DeleteSessionRequest>,
    ) -> Result<Response<proto::DeletionReceipt>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let s = self
            .state
            .session_for(&p, Rpc::DeleteSession, &r.session_id)
            .await?;
        check_len("reason", &r.reason)?;
        let store = self.state.store.clone();
        let id: SessionId = s.id.clone();
        let by = p.id.clone();
        let deleted = blocking(move || store.delete_session(&id, &by, &r.reason)).await;
        let receipt = self
            .state
            .audit_failure(
                &p,
                NewEvent::new(action::SESSION_DELETE).session(&s.id),
                deleted,
            )
            .await?;
        self.state
            .audit(
                &p,
                NewEvent::new(action::SESSION_DELETE)
                    .session(&s.id)
                    .detail(format!(
                        "receipt={} payloads={} bytes={} items={}",
                        receipt.id,
                        receipt.deleted_payload_ids.len(),
                        receipt.bytes_deleted,
                        receipt.removed.len()
                    )),
            )
            .await?;
        tracing::info!(session_id = %s.id, receipt_id = %receipt.id, payloads = receipt.deleted_payload_ids.len(), bytes = receipt.bytes_deleted, "session deleted");
        Ok(Response::new(convert::receipt(&receipt)))
    }
}
