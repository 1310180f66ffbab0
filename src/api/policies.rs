//! `spillway.v1.Policies`: tenant policies, effective policies and legal
//! holds.

use tracing::instrument;

use super::convert;
use crate::proto::{self, get_policy_request::Target, policies_server::Policies};
use crate::service::{PolicyTarget, PolicyView};

front!(
    /// The Policies service.
    PoliciesService
);

rpcs! {
    impl Policies for PoliciesService {
        #[instrument(name = "policies.get", skip_all, err(level = "info"))]
        fn get_policy(&self, p, r: proto::GetPolicyRequest) -> proto::Policy {
            let target = match r.target {
                // No target: the caller's own tenant.
                None => PolicyTarget::Tenant(String::new()),
                Some(Target::Tenant(tenant)) => PolicyTarget::Tenant(tenant),
                Some(Target::SessionId(id)) => PolicyTarget::Session(id),
            };
            match self.service.get_policy(&p, target).await? {
                PolicyView::Level(level) => convert::policy_level(&level),
                PolicyView::Effective(effective) => convert::policy(&effective),
            }
        }

        #[instrument(name = "policies.set", skip_all, err(level = "info"))]
        fn set_policy(&self, p, r: proto::SetPolicyRequest) -> proto::Policy {
            let new = r
                .policy
                .as_ref()
                .map(convert::policy_level_from)
                .transpose()?;
            let set = self.service.set_policy(&p, &r.tenant, new).await?;
            convert::policy_level(&set)
        }

        #[instrument(name = "policies.set_legal_hold", skip_all, err(level = "info"))]
        fn set_legal_hold(&self, p, r: proto::SetLegalHoldRequest) -> proto::Session {
            let (s, effective) = self
                .service
                .set_legal_hold(&p, &r.session_id, r.hold, &r.reason)
                .await?;
            convert::session(&s, &effective)
        }
    }
}
