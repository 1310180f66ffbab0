//! The tonic services. This is the only code that sees prost types: it
//! checks access through [`crate::auth::access`], calls the store on the
//! blocking pool, converts records to messages, and turns errors into
//! statuses through [`crate::error`].
//!
//! Auditing goes through [`AppState`] too: a handler appends its event with
//! [`AppState::audit`] before it replies, and every refusal (a role the
//! access table does not allow, a session the caller may see but not use
//! this way, a policy, or a target that is not found or not visible) is
//! appended as `access.denied` where it is decided: in
//! [`AppState::authorize`], [`AppState::session_for`],
//! [`AppState::payload_for`], or through [`AppState::refusal`].

pub mod audit;
pub mod codemode;
pub mod context;
mod convert;
pub mod payloads;
pub mod policies;
pub mod sessions;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tonic::Request;

use crate::audit::{AuditLog, NewEvent, action, outcome};
use crate::auth::access::{self, Access, Relation, Rpc, SessionOwnership, Target};
use crate::auth::{AuthError, Principal, TokenTable};
use crate::config::Config;
use crate::error::{ApiError, ApiResult};
use crate::ids::SessionId;
use crate::inspect::cache::StructureCache;
use crate::policy::PolicyOverrides;
use crate::policy::{self, Policy, PolicyError};
use crate::redact::{RedactCounts, Redactor};
use crate::sandbox::Sandbox;
use crate::store::records::{PayloadRecord, SessionRecord};
use crate::store::{Store, StoreError};

/// What every service shares.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The store.
    pub store: Arc<Store>,
    /// The audit log, over the store's engine.
    pub audit_log: Arc<AuditLog>,
    /// Inspect results by content hash.
    pub inspect_cache: Arc<StructureCache>,
    /// The configuration the server runs with.
    pub config: Arc<Config>,
    /// Upload slots, server-wide.
    pub upload_slots: Arc<Semaphore>,
    /// Code mode.
    pub sandbox: Arc<Sandbox>,
    /// Wakes the reaper when a hold is lifted.
    pub reaper: crate::reaper::ReaperHandle,
    /// Compiled redaction rule lists, by list (see [`AppState::redactor`]).
    redactors: Arc<Mutex<HashMap<Vec<String>, Redactor>>>,
}

/// Most compiled rule lists [`AppState::redactor`] keeps; it starts over
/// when full. Sessions share lists (the server's and their tenant's rules),
/// so a few entries serve most calls.
const REDACTOR_CACHE: usize = 256;

impl AppState {
    /// Builds the state.
    pub fn new(
        store: Arc<Store>,
        audit_log: Arc<AuditLog>,
        inspect_cache: Arc<StructureCache>,
        config: Arc<Config>,
        sandbox: Arc<Sandbox>,
        reaper: crate::reaper::ReaperHandle,
    ) -> Self {
        let upload_slots = Arc::new(Semaphore::new(config.limits.max_concurrent_uploads));
        Self {
            store,
            audit_log,
            inspect_cache,
            config,
            upload_slots,
            sandbox,
            reaper,
            redactors: Arc::default(),
        }
    }

    /// The compiled form of a rule list: from the cache, or compiled on the
    /// blocking pool (a custom regex may take milliseconds). Every level's
    /// rules were checked when they were set, but their union may still be
    /// refused (too many rules): then nothing is stored, and the error says
    /// why.
    pub async fn redactor(&self, rules: &[String]) -> ApiResult<Redactor> {
        if rules.is_empty() {
            return Ok(Redactor::default());
        }
        if let Some(r) = self.cache().get(rules) {
            return Ok(r.clone());
        }
        let owned = rules.to_vec();
        let compiled = blocking(move || {
            Redactor::compile(&owned).map_err(|e| PolicyError::Invalid {
                field: "policy.redact",
                message: format!(
                    "the effective redaction rules (server, tenant and session levels together) cannot be applied, so nothing was stored: {e}"
                ),
            })
        })
        .await?;
        let mut cache = self.cache();
        if cache.len() >= REDACTOR_CACHE {
            cache.clear();
        }
        cache.insert(rules.to_vec(), compiled.clone());
        Ok(compiled)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<String>, Redactor>> {
        // A panic while holding the lock leaves a valid map.
        self.redactors.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The redactor of a session's effective policy, with that policy.
    pub async fn session_redactor(&self, s: &SessionRecord) -> ApiResult<(Policy, Redactor)> {
        let policy = self.effective_policy(s).await?;
        let redactor = self.redactor(&policy.redact).await?;
        Ok((policy, redactor))
    }

    /// Checks the caller's roles against the access table, for a call with
    /// no target or before its session is looked up; a refusal is audited.
    pub async fn authorize(&self, principal: &Principal, rpc: Rpc) -> ApiResult<()> {
        self.decide(principal, rpc, Target::Call).await
    }

    /// Asks [`access::decide`] about a target that is not a session (a
    /// tenant, or nothing); a refusal is audited.
    pub async fn decide(&self, principal: &Principal, rpc: Rpc, target: Target) -> ApiResult<()> {
        let checked = access_result(access::decide(principal, rpc, target), "target", "");
        self.refusal(principal, rpc, checked, "", "").await
    }

    /// Appends `event`, by `principal`, to its tenant's audit chain, and
    /// returns once it is durable: call it before replying. `detail` holds
    /// IDs, sizes, counts and names, never content, tokens or host paths.
    pub async fn audit(&self, principal: &Principal, event: NewEvent) -> ApiResult<()> {
        self.audit_all(principal, vec![event]).await
    }

    /// [`AppState::audit`] for several events, appended in order in one
    /// commit.
    pub async fn audit_all(&self, principal: &Principal, events: Vec<NewEvent>) -> ApiResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let events = events
            .into_iter()
            .map(|e| e.by(&principal.id, &principal.tenant))
            .collect();
        let audit_log = self.audit_log.clone();
        blocking(move || audit_log.append_all(events))
            .await
            .map(drop)
    }

    /// Passes `result` through, after appending `event` with outcome
    /// `error` when it failed: a deletion refused by a legal hold, a write
    /// over a quota or a limit. The detail is the error's message, which
    /// names IDs, limits and counts, never content.
    pub async fn audit_failure<T>(
        &self,
        principal: &Principal,
        event: NewEvent,
        result: ApiResult<T>,
    ) -> ApiResult<T> {
        match result {
            Ok(v) => Ok(v),
            Err(e) => Err(self.audit_error(principal, event, e).await),
        }
    }

    /// Appends `event` with outcome `error` and `e` in its detail; returns
    /// `e` (see [`AppState::audit_failure`]).
    pub async fn audit_error(
        &self,
        principal: &Principal,
        event: NewEvent,
        e: ApiError,
    ) -> ApiError {
        let event = event.outcome(outcome::ERROR).detail(e.to_string());
        if let Err(failed) = self.audit(principal, event).await {
            tracing::error!(error = %failed, "could not audit a failed action");
        }
        e
    }

    /// Passes `result` through, after appending an `access.denied` event
    /// when it is a refusal: a role the table does not allow, a use the
    /// session's sharing or a policy does not allow (with `session` and
    /// `payload`, which the caller may see), or a target that is not found
    /// or not visible (without any ID, so that the log of the caller's
    /// tenant says nothing about other tenants' data, and an unknown ID and
    /// another tenant's read the same).
    pub async fn refusal<T>(
        &self,
        principal: &Principal,
        rpc: Rpc,
        result: ApiResult<T>,
        session: &str,
        payload: &str,
    ) -> ApiResult<T> {
        let Err(e) = result else { return result };
        let method = rpc.rule().method;
        let event = NewEvent::new(action::ACCESS_DENIED).outcome(outcome::DENIED);
        let event = match &e {
            ApiError::Auth(AuthError::RoleDenied { roles, needed, .. }) => event.detail(format!(
                "{method}: roles [{roles}] may not call it; it needs one of [{needed}]"
            )),
            ApiError::Denied(why) => event
                .detail(format!("{method}: {why}"))
                .session(session)
                .payload(payload),
            ApiError::Hidden { kind, .. } => event.detail(format!(
                "{method}: the {kind} is not found or not visible to the caller"
            )),
            _ => return Err(e),
        };
        if let Err(failed) = self.audit(principal, event).await {
            tracing::error!(error = %failed, rpc = method, "could not audit a refusal");
        }
        Err(e)
    }

    /// Loads a session and checks that `principal` may use it through `rpc`.
    /// A refusal is audited.
    pub async fn session_for(
        &self,
        principal: &Principal,
        rpc: Rpc,
        raw_id: &str,
    ) -> ApiResult<SessionRecord> {
        self.authorize(principal, rpc).await?;
        let found = self.find_session(principal, rpc, raw_id).await;
        self.refusal(principal, rpc, found, raw_id, "").await
    }

    async fn find_session(
        &self,
        principal: &Principal,
        rpc: Rpc,
        raw_id: &str,
    ) -> ApiResult<SessionRecord> {
        if raw_id.is_empty() {
            return Err(ApiError::BadRequest("session_id is required".into()));
        }
        let id = SessionId::parse(raw_id)?;
        let store = self.store.clone();
        let session = match blocking(move || store.session(&id)).await {
            Err(ApiError::Store(StoreError::NotFound { .. })) => {
                return Err(self.gone(principal, "session", raw_id).await);
            }
            other => other?,
        };
        self.check_session(principal, rpc, &session, "session", raw_id)
            .await?;
        Ok(session)
    }

    /// Loads a payload and its session, and checks access through `rpc`.
    /// A refusal is audited.
    pub async fn payload_for(
        &self,
        principal: &Principal,
        rpc: Rpc,
        raw_id: &str,
    ) -> ApiResult<(SessionRecord, PayloadRecord)> {
        self.authorize(principal, rpc).await?;
        let (found, session) = match self.find_payload(principal, rpc, raw_id).await {
            Ok(found) => (Ok(found), String::new()),
            Err((e, session)) => (Err(e), session),
        };
        self.refusal(principal, rpc, found, &session, raw_id).await
    }

    /// On a refusal, also the session's ID when the caller may see it.
    async fn find_payload(
        &self,
        principal: &Principal,
        rpc: Rpc,
        raw_id: &str,
    ) -> Result<(SessionRecord, PayloadRecord), (ApiError, String)> {
        if raw_id.is_empty() {
            return Err((
                ApiError::BadRequest("payload_id is required".into()),
                String::new(),
            ));
        }
        let id = crate::ids::PayloadId::parse(raw_id).map_err(|e| (e.into(), String::new()))?;
        let store = self.store.clone();
        let found = blocking(move || {
            let p = store.payload(&id)?;
            let s = store.session(&p.session_id)?;
            Ok::<_, StoreError>((s, p))
        })
        .await;
        let (session, payload) = match found {
            Err(ApiError::Store(StoreError::NotFound { .. })) => {
                return Err((self.gone(principal, "payload", raw_id).await, String::new()));
            }
            Err(e) => return Err((e, String::new())),
            Ok(found) => found,
        };
        self.check_session(principal, rpc, &session, "payload", raw_id)
            .await
            .map_err(|e| (e, session.id.to_string()))?;
        Ok((session, payload))
    }

    /// The server default policy.
    pub fn server_policy(&self) -> Policy {
        Policy::server_default(&self.config.policy)
    }

    /// A tenant's policy as set (empty when none was).
    pub async fn tenant_policy(&self, tenant: &str) -> ApiResult<PolicyOverrides> {
        let store = self.store.clone();
        let tenant = tenant.to_owned();
        let record = blocking(move || store.tenant_policy(&tenant)).await?;
        Ok(record.map(|r| r.policy).unwrap_or_default())
    }

    /// The quotas of a session's effective policy, for the store.
    pub fn quota(policy: &Policy) -> crate::store::Quota {
        crate::store::Quota {
            max_session_bytes: policy.max_session_bytes,
            max_payload_bytes: policy.max_payload_bytes,
            max_payloads: policy.max_payloads,
        }
    }

    /// A session's effective policy, from the current tenant policy.
    pub async fn effective_policy(&self, s: &SessionRecord) -> ApiResult<Policy> {
        let tenant = self.tenant_policy(&s.tenant).await?;
        Ok(policy::effective(&self.server_policy(), &tenant, &s.policy))
    }

    /// Checks access to a session. The effective policy is loaded only when
    /// it can change the answer: `compliance_can_read` can only turn a
    /// refusal into a yes.
    async fn check_session(
        &self,
        principal: &Principal,
        rpc: Rpc,
        s: &SessionRecord,
        kind: &'static str,
        id: &str,
    ) -> ApiResult<()> {
        let relation = Relation::of(principal, ownership(s));
        let target = |compliance_can_read| Target::Session {
            relation,
            compliance_can_read,
        };
        let mut answer = access::decide(principal, rpc, target(false));
        if matches!(answer, Access::Denied(_))
            && self.effective_policy(s).await?.compliance_can_read
        {
            answer = access::decide(principal, rpc, target(true));
        }
        access_result(answer, kind, id)
    }
}

/// The error for a refusal of [`access::decide`]: `kind` and `id` name the
/// target reported as not found.
pub fn access_result(answer: Access, kind: &'static str, id: &str) -> ApiResult<()> {
    match answer {
        Access::Allowed => Ok(()),
        Access::Role(e) => Err(ApiError::Auth(e)),
        Access::Hidden => Err(ApiError::Hidden {
            kind,
            id: id.to_owned(),
        }),
        Access::Denied(why) => Err(ApiError::Denied(why)),
    }
}

impl AppState {
    /// The error for an unknown ID: when the ID was deleted within the
    /// caller's tenant, say so with its receipt; otherwise a plain not-found.
    async fn gone(&self, principal: &Principal, kind: &'static str, raw_id: &str) -> ApiError {
        let store = self.store.clone();
        let target = raw_id.to_owned();
        match blocking(move || store.deletion_receipt(&target)).await {
            // Only those who could see the session learn that it existed.
            Ok(Some(r))
                if access::can_see(
                    principal,
                    SessionOwnership {
                        tenant: &r.tenant,
                        owner: &r.owner,
                        share_with: &r.share_with,
                    },
                ) =>
            {
                let reason = if r.reason.is_empty() {
                    String::new()
                } else {
                    format!(", reason {:?}", r.reason)
                };
                ApiError::Missing(format!(
                    "{kind} {raw_id} was deleted by {} (receipt {}{reason}); its data, derived payloads and archived results are gone and cannot be recalled",
                    r.requested_by, r.id
                ))
            }
            _ => ApiError::Hidden {
                kind,
                id: raw_id.to_owned(),
            },
        }
    }
}

/// Who a session belongs to, for [`Relation::of`].
pub fn ownership(s: &SessionRecord) -> SessionOwnership<'_> {
    SessionOwnership {
        tenant: &s.tenant,
        owner: &s.owner,
        share_with: &s.share_with,
    }
}

/// Redacts one result's bytes, keeping the buffer when nothing matched.
pub fn redact_bytes(r: &Redactor, content: bytes::Bytes) -> (bytes::Bytes, RedactCounts) {
    let (out, counts) = r.redact(&content);
    let out = match out {
        std::borrow::Cow::Borrowed(_) => None,
        std::borrow::Cow::Owned(v) => Some(bytes::Bytes::from(v)),
    };
    (out.unwrap_or(content), counts)
}

/// Redaction counts for an audit detail or a log line: ` redactions=3
/// (email=2,custom=1)`, or nothing when there were none. Rule names and
/// counts only, never what matched.
pub fn redaction_detail(c: &RedactCounts) -> String {
    if c.is_empty() {
        return String::new();
    }
    let by_rule: Vec<String> = c.by_rule.iter().map(|(k, n)| format!("{k}={n}")).collect();
    format!(" redactions={} ({})", c.total, by_rule.join(","))
}

/// Runs blocking store work on the blocking pool.
pub async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> ApiResult<T>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    joined(tokio::task::spawn_blocking(f)).await
}

/// Waits for blocking work spawned elsewhere (e.g. on the sandbox's pool).
pub async fn joined<T, E>(task: tokio::task::JoinHandle<Result<T, E>>) -> ApiResult<T>
where
    E: Into<ApiError>,
{
    match task.await {
        Ok(r) => r.map_err(Into::into),
        Err(e) => Err(ApiError::Internal(format!("blocking task failed: {e}"))),
    }
}

/// The authenticated principal the interceptor attached to the request.
pub fn principal<T>(req: &Request<T>) -> ApiResult<Principal> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or(ApiError::Auth(crate::auth::AuthError::MissingToken))
}

/// The interceptor that authenticates every call of the services it wraps.
#[derive(Debug, Clone)]
pub struct Authenticator {
    tokens: Arc<TokenTable>,
}

impl Authenticator {
    /// Wraps a token table.
    pub fn new(tokens: Arc<TokenTable>) -> Self {
        Self { tokens }
    }
}

impl tonic::service::Interceptor for Authenticator {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, tonic::Status> {
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let principal = self
            .tokens
            .authenticate(header)
            .map_err(|e| tonic::Status::from(ApiError::from(e)))?;
        req.extensions_mut().insert(principal);
        Ok(req)
    }
}

/// Clamps a requested page size to `[1, max]`, with 100 for zero.
pub fn page_size(requested: u32, max: u32) -> usize {
    let size = if requested == 0 { 100 } else { requested };
    size.min(max) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor(rules: &[&str]) -> Redactor {
        let rules: Vec<String> = rules.iter().map(|r| (*r).to_owned()).collect();
        Redactor::compile(&rules).unwrap()
    }

    #[test]
    fn redaction_details_name_rules_and_counts_only() {
        let r = redactor(&["builtin:email", "sk-[0-9]{4}"]);
        let (_, counts) = r.redact(b"a@b.io sk-1234 c@d.io");
        assert_eq!(
            redaction_detail(&counts),
            " redactions=3 (custom=1,email=2)"
        );
        assert_eq!(redaction_detail(&RedactCounts::default()), "");
    }

    #[test]
    fn unchanged_results_keep_their_buffer() {
        let r = redactor(&["builtin:email"]);
        let clean = bytes::Bytes::from_static(b"nothing to see");
        let (out, counts) = redact_bytes(&r, clean.clone());
        assert!(counts.is_empty());
        assert_eq!(out.as_ptr(), clean.as_ptr(), "not copied");
        let (out, counts) = redact_bytes(&r, bytes::Bytes::from_static(b"mail a@b.io"));
        assert_eq!((&out[..], counts.total), (&b"mail [REDACTED:email]"[..], 1));
    }
}
