//! Session operations: create, get, list, close and delete.

use std::collections::BTreeMap;

use super::{Service, blocking, page_size};
use crate::audit::{NewEvent, action};
use crate::auth::Principal;
use crate::auth::access::{self, Rpc};
use crate::error::{ApiError, ApiResult};
use crate::policy::PolicyOverrides;
use crate::policy::{self, Policy};
use crate::store::{NewSession, Page, ReceiptRecord, SessionRecord, SessionState, UsageSample};

/// Longest label, label key or value, and principal ID accepted.
const MAX_LABEL: usize = 256;
/// Most labels and `share_with` entries on one session.
const MAX_ENTRIES: usize = 64;

/// A session to create.
#[derive(Debug, Default)]
pub struct CreateSession {
    /// A label for people.
    pub label: String,
    /// Labels for tools.
    pub labels: BTreeMap<String, String>,
    /// The parent, for a sub-agent's session.
    pub parent_session_id: String,
    /// Principals of the tenant it is shared with.
    pub share_with: Vec<String>,
    /// Overrides over the tenant policy (tighten only).
    pub policy: Option<PolicyOverrides>,
}

/// Which sessions a list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    /// Every state.
    Any,
    /// Only open or only closed ones.
    Only(SessionState),
    /// Deleted sessions, which leave only their receipts: none are listed.
    Deleted,
}

/// Optional filters of a session list: every filter that is set must match.
#[derive(Debug, Clone, Default)]
pub struct SessionFilter {
    /// Only sessions owned by this principal ID.
    pub owner: Option<String>,
    /// Only sessions that carry every one of these labels, with these values.
    pub labels: BTreeMap<String, String>,
    /// Only sessions that expire before this time.
    pub expires_before_ms: Option<crate::clock::Millis>,
    /// Only sessions under a legal hold (`true`) or not under one (`false`).
    pub legal_hold: Option<bool>,
    /// Only sessions whose label contains this text (case-insensitive).
    pub label_contains: Option<String>,
}

impl SessionFilter {
    fn check(&self) -> ApiResult<()> {
        check_len("owner", self.owner.as_deref().unwrap_or(""))?;
        check_len(
            "label_contains",
            self.label_contains.as_deref().unwrap_or(""),
        )?;
        if self.labels.len() > MAX_ENTRIES {
            return Err(ApiError::BadRequest(format!(
                "at most {MAX_ENTRIES} label filters are allowed"
            )));
        }
        for (k, v) in &self.labels {
            check_len("a label filter's key", k)?;
            check_len("a label filter's value", v)?;
        }
        Ok(())
    }

    /// Whether `s`, whose effective session TTL is `ttl`, passes (its
    /// expiry is the earlier of the stored one and creation plus the TTL).
    fn keep(&self, s: &SessionRecord, ttl: std::time::Duration) -> bool {
        self.owner.as_ref().is_none_or(|o| *o == s.owner)
            && self
                .labels
                .iter()
                .all(|(k, v)| s.labels.get(k).is_some_and(|have| have == v))
            && self.legal_hold.is_none_or(|h| h == s.legal_hold)
            && self
                .label_contains
                .as_ref()
                .is_none_or(|t| s.label.to_lowercase().contains(t.to_lowercase().as_str()))
            && self.expires_before_ms.is_none_or(|before| {
                s.expires_ms.min(crate::clock::add(s.created_ms, ttl)) < before
            })
    }

    fn is_empty(&self) -> bool {
        self.owner.is_none()
            && self.labels.is_empty()
            && self.expires_before_ms.is_none()
            && self.legal_hold.is_none()
            && self.label_contains.is_none()
    }
}

fn check_len(field: &str, value: &str) -> ApiResult<()> {
    if value.len() > MAX_LABEL {
        return Err(ApiError::BadRequest(format!(
            "{field} is {} bytes; at most {MAX_LABEL} are allowed",
            value.len()
        )));
    }
    Ok(())
}

fn check_new(r: &CreateSession) -> ApiResult<()> {
    check_len("label", &r.label)?;
    if r.labels.len() > MAX_ENTRIES || r.share_with.len() > MAX_ENTRIES {
        return Err(ApiError::BadRequest(format!(
            "at most {MAX_ENTRIES} labels and {MAX_ENTRIES} share_with entries are allowed"
        )));
    }
    for (k, v) in &r.labels {
        check_len("a label key", k)?;
        check_len("a label value", v)?;
    }
    for s in &r.share_with {
        check_len("a share_with entry", s)?;
    }
    Ok(())
}

impl Service {
    /// Creates a session owned by `p`, with its effective policy. Overrides
    /// may only tighten what the session would get without them: the
    /// tenant's policy, and a parent's overrides, which a sub-agent session
    /// inherits.
    pub async fn create_session(
        &self,
        p: &Principal,
        r: CreateSession,
    ) -> ApiResult<(SessionRecord, Policy)> {
        self.authorize(p, Rpc::CreateSession).await?;
        check_new(&r)?;
        let parent = match r.parent_session_id.as_str() {
            "" => None,
            id => Some(self.session_for(p, Rpc::GetSession, id).await?),
        };
        let overrides = r.policy.unwrap_or_default();
        policy::validate(&overrides, false)?;
        let inherited = parent
            .as_ref()
            .map(|s| s.policy.clone())
            .unwrap_or_default();
        let tenant = self.tenant_policy(&p.tenant).await?;
        let server = self.server_policy();
        policy::check_overrides(&policy::effective(&server, &tenant, &inherited), &overrides)?;
        let overrides = policy::combine(&inherited, &overrides);
        let effective = policy::effective(&server, &tenant, &overrides);
        policy::validate_effective(&effective)?;
        let new = NewSession {
            tenant: p.tenant.clone(),
            owner: p.id.clone(),
            label: r.label,
            labels: r.labels,
            parent: parent.map(|s| s.id),
            share_with: r.share_with,
            policy: overrides,
            ttl: Some(effective.session_ttl),
        };
        let store = self.store.clone();
        let s = blocking(move || store.create_session(new)).await?;
        let mut detail = Vec::new();
        if let Some(parent) = &s.parent {
            detail.push(format!("parent={parent}"));
        }
        if !s.share_with.is_empty() {
            detail.push(format!("share_with={}", s.share_with.join(",")));
        }
        let event = NewEvent::new(action::SESSION_CREATE)
            .session(&s.id)
            .detail(detail.join(" "));
        self.audit(p, event).await?;
        tracing::info!(session_id = %s.id, principal = %p.id, "session created");
        Ok((s, effective))
    }

    /// A session, with its effective policy.
    pub async fn get_session(
        &self,
        p: &Principal,
        session_id: &str,
    ) -> ApiResult<(SessionRecord, Policy)> {
        let s = self.session_for(p, Rpc::GetSession, session_id).await?;
        let effective = self.effective_policy(&s).await?;
        Ok((s, effective))
    }

    /// One page of the sessions of `p`'s tenant that `p` may see, each with
    /// its effective policy.
    pub async fn list_sessions(
        &self,
        p: &Principal,
        state: StateFilter,
        page_token: &str,
        page: u32,
    ) -> ApiResult<Page<(SessionRecord, Policy)>> {
        self.list_sessions_where(p, state, &SessionFilter::default(), page_token, page)
            .await
    }

    /// [`Service::list_sessions`], keeping only the sessions that pass
    /// `filter`.
    pub async fn list_sessions_where(
        &self,
        p: &Principal,
        state: StateFilter,
        filter: &SessionFilter,
        page_token: &str,
        page: u32,
    ) -> ApiResult<Page<(SessionRecord, Policy)>> {
        self.authorize(p, Rpc::ListSessions).await?;
        filter.check()?;
        let want = match state {
            StateFilter::Any => None,
            StateFilter::Only(s) => Some(s),
            StateFilter::Deleted => {
                return Ok(Page {
                    items: Vec::new(),
                    next_token: String::new(),
                });
            }
        };
        let size = page_size(page, self.config.limits.max_page_size);
        // Every session listed is of the caller's tenant.
        let tenant = self.tenant_policy(&p.tenant).await?;
        let server = self.server_policy();
        let (store, principal, token) = (self.store.clone(), p.clone(), page_token.to_owned());
        let (level, defaults) = (tenant.clone(), server.clone());
        let filter = (!filter.is_empty()).then(|| filter.clone());
        let page = blocking(move || {
            store.list_sessions(&principal.tenant, &token, size, &|s| {
                want.is_none_or(|w| s.state == w)
                    && access::can_see(&principal, super::ownership(s))
                    && filter.as_ref().is_none_or(|f| {
                        f.keep(
                            s,
                            policy::effective(&defaults, &level, &s.policy).session_ttl,
                        )
                    })
            })
        })
        .await?;
        let items = page
            .items
            .into_iter()
            .map(|s| {
                let e = policy::effective(&server, &tenant, &s.policy);
                (s, e)
            })
            .collect();
        Ok(Page {
            items,
            next_token: page.next_token,
        })
    }

    /// The caller's tenant's daily usage samples of the last `days` days,
    /// oldest first (see `store::history`). Tenant-wide figures, so only for
    /// a principal that may see every session of its tenant.
    pub async fn usage_history(&self, p: &Principal, days: i64) -> ApiResult<Vec<UsageSample>> {
        self.decide(p, Rpc::GetSession, access::TENANT_WIDE).await?;
        let (store, tenant) = (self.store.clone(), p.tenant.clone());
        blocking(move || store.usage_history(&tenant, days)).await
    }

    /// Closes a session (read-only from now on); with `delete_on_close`,
    /// deletes its payloads too, unless a legal hold defers that.
    pub async fn close_session(
        &self,
        p: &Principal,
        session_id: &str,
    ) -> ApiResult<(SessionRecord, Policy)> {
        let s = self.session_for(p, Rpc::CloseSession, session_id).await?;
        let delete_on_close = self.effective_policy(&s).await?.delete_on_close;
        let store = self.store.clone();
        let (s, receipt) = blocking(move || store.close_session(&s.id, delete_on_close)).await?;
        let detail = match (&receipt, delete_on_close) {
            (Some(r), _) => format!("delete_on_close: {}", super::receipt_detail(r)),
            (None, true) if s.legal_hold => {
                "delete_on_close: deferred by the legal hold; the payloads are deleted once it is lifted".to_owned()
            }
            (None, _) => String::new(),
        };
        let event = NewEvent::new(action::SESSION_CLOSE)
            .session(&s.id)
            .detail(detail);
        self.audit(p, event).await?;
        tracing::info!(session_id = %s.id, principal = %p.id, deleted = receipt.is_some(), "session closed");
        let effective = self.effective_policy(&s).await?;
        Ok((s, effective))
    }

    /// Deletes a session and all of its data; returns the signed receipt.
    pub async fn delete_session(
        &self,
        p: &Principal,
        session_id: &str,
        reason: &str,
    ) -> ApiResult<ReceiptRecord> {
        let s = self.session_for(p, Rpc::DeleteSession, session_id).await?;
        check_len("reason", reason)?;
        let store = self.store.clone();
        let (id, by, reason) = (s.id.clone(), p.id.clone(), reason.to_owned());
        let deleted = blocking(move || store.delete_session(&id, &by, &reason)).await;
        let event = NewEvent::new(action::SESSION_DELETE).session(&s.id);
        let receipt = self.audit_failure(p, event.clone(), deleted).await?;
        self.audit(p, event.detail(super::receipt_detail(&receipt)))
            .await?;
        tracing::info!(session_id = %s.id, receipt_id = %receipt.id, payloads = receipt.deleted_payload_ids.len(), bytes = receipt.bytes_deleted, "session deleted");
        Ok(receipt)
    }
}
