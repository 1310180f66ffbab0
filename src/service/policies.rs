//! Policy operations: tenant policies, effective policies and legal holds.
//!
//! Tenants are not secret the way session IDs are: any tenant name has a
//! policy (the server default, when none was set), so a principal asking
//! about another tenant learns nothing from the answer's code. Such a call is
//! `PERMISSION_DENIED`, as for any known principal acting outside its role.

use super::{Service, blocking};
use crate::audit::{NewEvent, action};
use crate::auth::Principal;
use crate::auth::access::{self, Rpc};
use crate::error::{ApiError, ApiResult};
use crate::policy::PolicyOverrides;
use crate::policy::{self, Policy};
use crate::store::{LegalHold, SessionRecord, TenantPolicyRecord};

/// Longest legal-hold reason accepted.
const MAX_REASON: usize = 1024;
/// Longest tenant name accepted.
const MAX_TENANT: usize = 256;

/// Whose policy GetPolicy asks for.
#[derive(Debug, Clone)]
pub enum PolicyTarget {
    /// A tenant's policy as set (empty: the caller's own tenant).
    Tenant(String),
    /// A session's effective policy.
    Session(String),
}

/// What GetPolicy answers.
#[derive(Debug, Clone)]
pub enum PolicyView {
    /// A tenant's level, as set (empty where it defers).
    Level(PolicyOverrides),
    /// A session's effective policy.
    Effective(Policy),
}

impl Service {
    /// Checks that `p` may call `rpc` for `tenant` (empty: the caller's
    /// own), and returns the tenant meant; a refusal is audited.
    async fn tenant_access<'a>(
        &self,
        p: &'a Principal,
        rpc: Rpc,
        tenant: &'a str,
    ) -> ApiResult<&'a str> {
        let roles = access::authorize(p, rpc).map_err(ApiError::from);
        self.refusal(p, rpc, roles, "", "").await?;
        let tenant = if tenant.is_empty() {
            p.tenant.as_str()
        } else {
            tenant
        };
        if tenant.len() > MAX_TENANT {
            return Err(ApiError::BadRequest(format!(
                "tenant must be at most {MAX_TENANT} bytes; leave it empty for your own tenant, {:?}",
                p.tenant
            )));
        }
        let own = p.tenant == tenant;
        self.decide(p, rpc, access::Target::Tenant { own }).await?;
        Ok(tenant)
    }

    /// A tenant's policy as set, or a session's effective policy.
    pub async fn get_policy(&self, p: &Principal, target: PolicyTarget) -> ApiResult<PolicyView> {
        match target {
            PolicyTarget::Tenant(tenant) => {
                let tenant = self.tenant_access(p, Rpc::GetPolicy, &tenant).await?;
                Ok(PolicyView::Level(self.tenant_policy(tenant).await?))
            }
            PolicyTarget::Session(id) => {
                let s = self.session_for(p, Rpc::GetPolicy, &id).await?;
                Ok(PolicyView::Effective(self.effective_policy(&s).await?))
            }
        }
    }

    /// Sets a tenant's policy (locked fields stay as they are), and brings
    /// forward the expiry of what a shorter retention or TTL now covers.
    pub async fn set_policy(
        &self,
        p: &Principal,
        tenant: &str,
        new: Option<PolicyOverrides>,
    ) -> ApiResult<PolicyOverrides> {
        let tenant = self.tenant_access(p, Rpc::SetPolicy, tenant).await?;
        let Some(new) = new else {
            return Err(ApiError::BadRequest(
                "policy is required; to defer every field to the server default, send an empty policy".into(),
            ));
        };
        policy::validate(&new, true)?;
        policy::validate_effective(&policy::effective(
            &self.server_policy(),
            &new,
            &Default::default(),
        ))?;
        let store = self.store.clone();
        let (tenant, by) = (tenant.to_owned(), p.id.clone());
        let record = blocking(move || {
            store.update_tenant_policy(&tenant.clone(), |old| {
                if let Some(old) = old {
                    policy::check_locked(&old.policy, &new)?;
                }
                Ok::<_, ApiError>(TenantPolicyRecord {
                    tenant,
                    policy: new,
                    updated_ms: store.now_ms(),
                    updated_by: by,
                })
            })
        })
        .await;
        // A refused loosening of a locked policy is on the record too.
        let record = self
            .audit_failure(p, NewEvent::new(action::POLICY_SET), record)
            .await?;
        let store = self.store.clone();
        let (server, level, tenant) = (
            self.server_policy(),
            record.policy.clone(),
            record.tenant.clone(),
        );
        let (sessions, payloads) = blocking(move || {
            store.shorten_lifetimes(&tenant, &|s| {
                let e = policy::effective(&server, &level, &s.policy);
                (e.retention, e.session_ttl)
            })
        })
        .await?;
        if sessions + payloads > 0 {
            self.reaper.rescan();
        }
        tracing::info!(tenant = %record.tenant, principal = %p.id, locked = record.policy.locked, sessions, payloads, "tenant policy set");
        let event = NewEvent::new(action::POLICY_SET).detail(format!(
            "tenant policy set (locked: {}, redact rules: {}); expiry brought forward for {sessions} sessions and {payloads} payloads",
            record.policy.locked,
            record.policy.redact.len()
        ));
        self.audit(p, event).await?;
        Ok(record.policy)
    }

    /// Places (`hold`) or lifts a legal hold on a session. Lifting one
    /// makes the deletions it deferred overdue, so the reaper runs them.
    pub async fn set_legal_hold(
        &self,
        p: &Principal,
        session_id: &str,
        hold: bool,
        reason: &str,
    ) -> ApiResult<(SessionRecord, Policy)> {
        let s = self.session_for(p, Rpc::SetLegalHold, session_id).await?;
        if reason.len() > MAX_REASON {
            return Err(ApiError::BadRequest(format!(
                "reason is {} bytes; at most {MAX_REASON} are allowed",
                reason.len()
            )));
        }
        if hold && reason.trim().is_empty() {
            return Err(ApiError::BadRequest(
                "reason is required to place a legal hold; it is shown to anyone whose deletion the hold refuses".into(),
            ));
        }
        let hold = hold.then(|| LegalHold {
            reason: reason.to_owned(),
            by: p.id.clone(),
            since_ms: self.store.now_ms(),
        });
        let store = self.store.clone();
        let id = s.id.clone();
        let s = blocking(move || store.set_legal_hold(&id, hold)).await?;
        tracing::info!(session_id = %s.id, principal = %p.id, hold = s.legal_hold, "legal hold set");
        let what = if s.legal_hold {
            "hold placed"
        } else {
            "hold released"
        };
        let event = NewEvent::new(action::HOLD_SET).session(&s.id).detail(what);
        self.audit(p, event).await?;
        if !s.legal_hold {
            self.reaper.rescan();
        }
        let effective = self.effective_policy(&s).await?;
        Ok((s, effective))
    }
}
