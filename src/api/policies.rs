//! `spillway.v1.Policies`: tenant policies, effective policies and legal
//! holds.
//!
//! Tenants are not secret the way session IDs are: any tenant name has a
//! policy (the server default, when none was set), so a principal asking
//! about another tenant learns nothing from the answer's code. Such a call is
//! `PERMISSION_DENIED`, as for any known principal acting outside its role.

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{AppState, blocking, convert, principal};
use crate::audit::{action, log::NewEvent};
use crate::auth::Principal;
use crate::auth::access::{self, Rpc};
use crate::error::ApiError;
use crate::policy;
use crate::proto::{self, get_policy_request::Target, policies_server::Policies};
use crate::store::records::{LegalHold, TenantPolicyRecord};

/// Longest legal-hold reason accepted.
const MAX_REASON: usize = 1024;
/// Longest tenant name accepted.
const MAX_TENANT: usize = 256;

/// The Policies service.
#[derive(Debug, Clone)]
pub struct PoliciesService {
    state: AppState,
}

impl PoliciesService {
    /// Wraps the shared state.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    /// Checks that `p` may call `rpc` for `tenant`; a refusal is audited.
    async fn tenant_access(&self, p: &Principal, rpc: Rpc, tenant: &str) -> Result<(), ApiError> {
        let roles = access::authorize(p, rpc).map_err(ApiError::from);
        self.state.refusal(p, rpc, roles, "", "").await?;
        if tenant.is_empty() || tenant.len() > MAX_TENANT {
            return Err(ApiError::BadRequest(format!(
                "tenant must be 1 to {MAX_TENANT} bytes; your principal's tenant is {:?}",
                p.tenant
            )));
        }
        let own = p.tenant == tenant;
        self.state
            .decide(p, rpc, access::Target::Tenant { own })
            .await
    }
}

#[tonic::async_trait]
impl Policies for PoliciesService {
    #[instrument(name = "policies.get", skip_all, err(level = "info"))]
    async fn get_policy(
        &self,
        req: Request<proto::GetPolicyRequest>,
    ) -> Result<Response<proto::Policy>, Status> {
        let p = principal(&req)?;
        match req.into_inner().target {
            None => Err(ApiError::BadRequest(
                "give a target: tenant (the tenant's policy as set) or session_id (a session's effective policy)".into(),
            )
            .into()),
            Some(Target::Tenant(tenant)) => {
                self.tenant_access(&p, Rpc::GetPolicy, &tenant).await?;
                let level = self.state.tenant_policy(&tenant).await?;
                Ok(Response::new(convert::policy_level(&level)))
            }
            Some(Target::SessionId(id)) => {
                let s = self.state.session_for(&p, Rpc::GetPolicy, &id).await?;
                let effective = self.state.effective_policy(&s).await?;
                Ok(Response::new(convert::policy(&effective)))
            }
        }
    }

    #[instrument(name = "policies.set", skip_all, err(level = "info"))]
    async fn set_policy(
        &self,
        req: Request<proto::SetPolicyRequest>,
    ) -> Result<Response<proto::Policy>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        self.tenant_access(&p, Rpc::SetPolicy, &r.tenant).await?;
        let Some(message) = r.policy else {
            return Err(ApiError::BadRequest(
                "policy is required; to defer every field to the server default, send an empty policy".into(),
            )
            .into());
        };
        let new = convert::policy_level_from(&message)?;
        policy::validate(&new, true)?;
        policy::validate_effective(&policy::effective(
            &self.state.server_policy(),
            &new,
            &Default::default(),
        ))?;
        let store = self.state.store.clone();
        let (tenant, by) = (r.tenant.clone(), p.id.clone());
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
            .state
            .audit_failure(&p, NewEvent::new(action::POLICY_SET), record)
            .await?;
        // A shorter retention or TTL applies to what is stored already.
        let store = self.state.store.clone();
        let (server, level, tenant) = (
            self.state.server_policy(),
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
            self.state.reaper.rescan();
        }
        tracing::info!(tenant = %record.tenant, principal = %p.id, locked = record.policy.locked, sessions, payloads, "tenant policy set");
        let event = NewEvent::new(action::POLICY_SET).detail(format!(
            "tenant policy set (locked: {}, redact rules: {}); expiry brought forward for {sessions} sessions and {payloads} payloads",
            record.policy.locked,
            record.policy.redact.len()
        ));
        self.state.audit(&p, event).await?;
        Ok(Response::new(convert::policy_level(&record.policy)))
    }

    #[instrument(name = "policies.set_legal_hold", skip_all, err(level = "info"))]
    async fn set_legal_hold(
        &self,
        req: Request<proto::SetLegalHoldRequest>,
    ) -> Result<Response<proto::Session>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let s = self
            .state
            .session_for(&p, Rpc::SetLegalHold, &r.session_id)
            .await?;
        if r.reason.len() > MAX_REASON {
            return Err(ApiError::BadRequest(format!(
                "reason is {} bytes; at most {MAX_REASON} are allowed",
                r.reason.len()
            ))
            .into());
        }
        if r.hold && r.reason.trim().is_empty() {
            return Err(ApiError::BadRequest(
                "reason is required to place a legal hold; it is shown to anyone whose deletion the hold refuses".into(),
            )
            .into());
        }
        let hold = r.hold.then(|| LegalHold {
            reason: r.reason.clone(),
            by: p.id.clone(),
            since_ms: self.state.store.now_ms(),
        });
        let store = self.state.store.clone();
        let id = s.id.clone();
        let s = blocking(move || store.set_legal_hold(&id, hold)).await?;
        tracing::info!(session_id = %s.id, principal = %p.id, hold = s.legal_hold, "legal hold set");
        let event = NewEvent::new(action::HOLD_SET)
            .session(&s.id)
            .detail(if s.legal_hold {
                "hold placed"
            } else {
                "hold released"
            });
        self.state.audit(&p, event).await?;
        if !s.legal_hold {
            // Deletions the hold deferred are overdue: do them now.
            self.state.reaper.rescan();
        }
        let effective = self.state.effective_policy(&s).await?;
        Ok(Response::new(convert::session(&s, &effective)))
    }
}
