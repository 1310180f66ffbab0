//! `spillway.v1.Sessions`.

use tracing::instrument;

use super::convert;
use crate::error::ApiError;
use crate::proto::{self, sessions_server::Sessions};
use crate::service::{CreateSession, SessionFilter, StateFilter};
use crate::store::SessionState;

front!(
    /// The Sessions service.
    SessionsService
);

fn state_filter(state: i32) -> Result<StateFilter, ApiError> {
    match proto::SessionState::try_from(state) {
        Ok(proto::SessionState::Unspecified) => Ok(StateFilter::Any),
        Ok(proto::SessionState::Open) => Ok(StateFilter::Only(SessionState::Open)),
        Ok(proto::SessionState::Closed) => Ok(StateFilter::Only(SessionState::Closed)),
        Ok(proto::SessionState::Deleted) => Ok(StateFilter::Deleted),
        Err(_) => Err(ApiError::BadRequest(format!(
            "state {state} is not a SessionState"
        ))),
    }
}

rpcs! {
    impl Sessions for SessionsService {
        #[instrument(name = "sessions.create", skip_all, err(level = "info"))]
        fn create_session(&self, p, r: proto::CreateSessionRequest) -> proto::Session {
            let new = CreateSession {
                label: r.label,
                labels: r.labels.into_iter().collect(),
                parent_session_id: r.parent_session_id,
                share_with: r.share_with,
                policy: r
                    .policy
                    .as_ref()
                    .map(convert::policy_level_from)
                    .transpose()?,
            };
            let (s, effective) = self.service.create_session(&p, new).await?;
            convert::session(&s, &effective)
        }

        #[instrument(name = "sessions.get", skip_all, err(level = "info"))]
        fn get_session(&self, p, r: proto::GetSessionRequest) -> proto::Session {
            let (s, effective) = self.service.get_session(&p, &r.session_id).await?;
            convert::session(&s, &effective)
        }

        #[instrument(name = "sessions.list", skip_all, err(level = "info"))]
        fn list_sessions(&self, p, r: proto::ListSessionsRequest) -> proto::ListSessionsResponse {
            let state = state_filter(r.state)?;
            let filter = SessionFilter {
                owner: (!r.owner.is_empty()).then(|| r.owner.clone()),
                labels: r.labels.into_iter().collect(),
                expires_before_ms: r.expires_before.as_ref().map(convert::millis),
                legal_hold: r.legal_hold,
                label_contains: (!r.label_contains.is_empty()).then(|| r.label_contains.clone()),
            };
            let page = self
                .service
                .list_sessions_where(&p, state, &filter, &r.page_token, r.page_size)
                .await?;
            proto::ListSessionsResponse {
                sessions: page
                    .items
                    .iter()
                    .map(|(s, e)| convert::session(s, e))
                    .collect(),
                next_page_token: page.next_token,
            }
        }

        #[instrument(name = "sessions.close", skip_all, err(level = "info"))]
        fn close_session(&self, p, r: proto::CloseSessionRequest) -> proto::Session {
            let (s, effective) = self.service.close_session(&p, &r.session_id).await?;
            convert::session(&s, &effective)
        }

        #[instrument(name = "sessions.delete", skip_all, err(level = "info"))]
        fn delete_session(&self, p, r: proto::DeleteSessionRequest) -> proto::DeletionReceipt {
            let receipt = self.service.delete_session(&p, &r.session_id, &r.reason).await?;
            convert::receipt(&receipt)
        }
    }
}
