//! `spillway.v1.Policies`: tenant policies, effective policies and legal
//! holds.

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{convert, parts, principal};
use crate::proto::{self, get_policy_request::Target, policies_server::Policies};
use crate::service::{PolicyTarget, PolicyView};

front!(
    /// The Policies service.
    PoliciesService
);

#[tonic::async_trait]
impl Policies for PoliciesService {
    #[instrument(name = "policies.get", skip_all, err(level = "info"))]
    async fn get_policy(
        &self,
        req: Request<proto::GetPolicyRequest>,
    ) -> Result<Response<proto::Policy>, Status> {
        let p = principal(&req)?;
        let target = match req.into_inner().target {
            // No target: the caller's own tenant.
            None => PolicyTarget::Tenant(String::new()),
            Some(Target::Tenant(tenant)) => PolicyTarget::Tenant(tenant),
            Some(Target::SessionId(id)) => PolicyTarget::Session(id),
        };
        Ok(Response::new(
            match self.service.get_policy(&p, target).await? {
                PolicyView::Level(level) => convert::policy_level(&level),
                PolicyView::Effective(effective) => convert::policy(&effective),
            },
        ))
    }

    #[instrument(name = "policies.set", skip_all, err(level = "info"))]
    async fn set_policy(
        &self,
        req: Request<proto::SetPolicyRequest>,
    ) -> Result<Response<proto::Policy>, Status> {
        let (p, r) = parts(req)?;
        let new = r
            .policy
            .as_ref()
            .map(convert::policy_level_from)
            .transpose()?;
        let set = self.service.set_policy(&p, &r.tenant, new).await?;
        Ok(Response::new(convert::policy_level(&set)))
    }

    #[instrument(name = "policies.set_legal_hold", skip_all, err(level = "info"))]
    async fn set_legal_hold(
        &self,
        req: Request<proto::SetLegalHoldRequest>,
    ) -> Result<Response<proto::Session>, Status> {
        let (p, r) = parts(req)?;
        let (s, effective) = self
            .service
            .set_legal_hold(&p, &r.session_id, r.hold, &r.reason)
            .await?;
        Ok(Response::new(convert::session(&s, &effective)))
    }
}
