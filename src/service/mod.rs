//! The service layer: one function per operation, behind every front door.
//!
//! Each operation takes the calling [`Principal`] and domain types, and
//! returns domain types or an [`ApiError`]. Access decisions, policy
//! resolution, redaction and auditing happen here, once: the gRPC services
//! in [`crate::api`] only convert messages and call one function, and any
//! other door (MCP, the console) calls the same functions or goes through
//! gRPC.
//!
//! Auditing: an operation appends its event with `Service::audit` before
//! it returns, and every refusal (a role the access table does not allow, a
//! session the caller may see but not use this way, a policy, or a target
//! that is not found or not visible) is appended as `access.denied` where it
//! is decided: in `Service::authorize`, `Service::session_for`,
//! `Service::payload_for`, or through `Service::refusal`.
//!
//! The data path of one request runs one way: a front door, then this
//! layer, then auth, policy and redact, then offload, inspect or sandbox,
//! then the store; the audit event follows the work.

mod audit;
mod codemode;
mod context;
mod payloads;
mod policies;
mod sessions;

pub use audit::{ExportStream, ReceiptLookup};
pub use codemode::{ExecReply, ExecRequest, ExecUsage, RuntimeInfo};
pub use context::{CompactReply, RepairReply};
pub use payloads::{
    DownloadStream, OffloadReply, OffloadTurn, ReadReply, ReadRequest, SearchHit, SearchReply,
    SearchRequest, UploadPart,
};
pub use policies::{PolicyTarget, PolicyView};
pub use sessions::{CreateSession, SessionFilter, StateFilter};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::audit::{AuditLog, AuditWriter, NewEvent, action, outcome};
use crate::auth::access::{self, Access, Relation, Rpc, SessionOwnership, Target};
use crate::auth::{AuthError, Principal};
use crate::config::Config;
use crate::error::{ApiError, ApiResult};
use crate::fairness::{Bound, KeyedSlots, Refused};
use crate::ids::SessionId;
use crate::inspect::StructureCache;
use crate::policy::PolicyOverrides;
use crate::policy::{self, Policy, PolicyError};
use crate::reaper::ReaperHandle;
use crate::redact::{RedactCounts, Redactor};
use crate::sandbox::Sandbox;
use crate::store::{PayloadRecord, SessionRecord, Store, StoreError};

/// The service layer's state: what every operation shares. Cheap to
/// clone (every field is shared).
#[derive(Debug, Clone)]
pub struct Service {
    /// The store.
    store: Arc<Store>,
    /// The audit log, over the store's engine: read here, appended
    /// through `audit_writer`.
    audit_log: Arc<AuditLog>,
    /// The async door for appends.
    audit_writer: AuditWriter,
    /// Inspect results by content hash.
    inspect_cache: Arc<StructureCache>,
    /// The configuration the server runs with.
    config: Arc<Config>,
    /// Upload slots, server-wide and per tenant.
    upload_slots: KeyedSlots,
    /// Search slots, server-wide and per tenant.
    search_slots: KeyedSlots,
    /// Inspect slots, server-wide and per tenant.
    inspect_slots: KeyedSlots,
    /// Code mode.
    sandbox: Arc<Sandbox>,
    /// Wakes the reaper when a hold is lifted.
    reaper: ReaperHandle,
    /// Compiled redaction rule lists, by list (see [`Service::redactor`]).
    redactors: Arc<Mutex<HashMap<Vec<String>, Redactor>>>,
}

/// Most compiled rule lists [`Service::redactor`] keeps; it starts over
/// when full. Sessions share lists (the server's and their tenant's rules),
/// so a few entries serve most calls.
const REDACTOR_CACHE: usize = 256;

impl Service {
    /// Builds the service over an open store and sandbox; `audit_writer`
    /// appends to `audit_log`.
    pub fn new(
        store: Arc<Store>,
        audit_log: Arc<AuditLog>,
        audit_writer: AuditWriter,
        inspect_cache: Arc<StructureCache>,
        config: Arc<Config>,
        sandbox: Arc<Sandbox>,
        reaper: ReaperHandle,
    ) -> Self {
        let l = &config.limits;
        let slots = |global, global_key, per_tenant, per_tenant_key| {
            KeyedSlots::new(
                Bound {
                    limit: global,
                    key: global_key,
                },
                Bound {
                    limit: per_tenant,
                    key: per_tenant_key,
                },
            )
        };
        let upload_slots = slots(
            l.max_concurrent_uploads,
            "limits.max_concurrent_uploads",
            l.max_concurrent_uploads_per_tenant,
            "limits.max_concurrent_uploads_per_tenant",
        );
        let search_slots = slots(
            l.max_concurrent_searches,
            "limits.max_concurrent_searches",
            l.max_concurrent_searches_per_tenant,
            "limits.max_concurrent_searches_per_tenant",
        );
        let inspect_slots = slots(
            l.max_concurrent_inspects,
            "limits.max_concurrent_inspects",
            l.max_concurrent_inspects_per_tenant,
            "limits.max_concurrent_inspects_per_tenant",
        );
        Self {
            store,
            audit_log,
            audit_writer,
            inspect_cache,
            config,
            upload_slots,
            search_slots,
            inspect_slots,
            sandbox,
            reaper,
            redactors: Arc::default(),
        }
    }

    /// The configuration the server runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The compiled form of a rule list: from the cache, or compiled on the
    /// blocking pool (a custom regex may take milliseconds). Every level's
    /// rules were checked when they were set, but their union may still be
    /// refused (too many rules): then nothing is stored, and the error says
    /// why.
    async fn redactor(&self, rules: &[String]) -> ApiResult<Redactor> {
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
    async fn session_redactor(&self, s: &SessionRecord) -> ApiResult<(Policy, Redactor)> {
        let policy = self.effective_policy(s).await?;
        let redactor = self.redactor(&policy.redact).await?;
        Ok((policy, redactor))
    }

    /// Checks the caller's roles against the access table, for a call with
    /// no target or before its session is looked up; a refusal is audited.
    async fn authorize(&self, principal: &Principal, rpc: Rpc) -> ApiResult<()> {
        self.decide(principal, rpc, Target::Call).await
    }

    /// Asks [`access::decide`] about a target that is not a session (a
    /// tenant, or nothing); a refusal is audited.
    async fn decide(&self, principal: &Principal, rpc: Rpc, target: Target) -> ApiResult<()> {
        let checked = access_result(access::decide(principal, rpc, target), "target", "");
        self.refusal(principal, rpc, checked, "", "").await
    }

    /// Appends `event`, by `principal`, to its tenant's audit chain, and
    /// returns once it is durable: call it before replying. `detail` holds
    /// IDs, sizes, counts and names, never content, tokens or host paths.
    async fn audit(&self, principal: &Principal, event: NewEvent) -> ApiResult<()> {
        self.audit_all(principal, vec![event]).await
    }

    /// [`Service::audit`] for several events, appended in order in one
    /// commit.
    async fn audit_all(&self, principal: &Principal, events: Vec<NewEvent>) -> ApiResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let events = events
            .into_iter()
            .map(|e| e.by(&principal.id, &principal.tenant))
            .collect();
        self.audit_writer
            .append_all(events)
            .await
            .map(drop)
            .map_err(Into::into)
    }

    /// Passes `result` through, after appending `event` with outcome
    /// `error` when it failed: a deletion refused by a legal hold, a write
    /// over a quota or a limit. The detail is the error's message, which
    /// names IDs, limits and counts, never content.
    async fn audit_failure<T>(
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
    /// `e` (see [`Service::audit_failure`]).
    async fn audit_error(&self, principal: &Principal, event: NewEvent, e: ApiError) -> ApiError {
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
    async fn refusal<T>(
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
    async fn session_for(
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
        let session = match in_place(move || store.session(&id)).await {
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
    async fn payload_for(
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
        let found = in_place(move || {
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
    fn server_policy(&self) -> Policy {
        Policy::server_default(&self.config.policy)
    }

    /// A tenant's policy as set (empty when none was).
    async fn tenant_policy(&self, tenant: &str) -> ApiResult<PolicyOverrides> {
        let store = self.store.clone();
        let tenant = tenant.to_owned();
        let record = in_place(move || store.tenant_policy(&tenant)).await?;
        Ok(record.map(|r| r.policy).unwrap_or_default())
    }

    /// The quotas of a session's effective policy, for the store.
    fn quota(policy: &Policy) -> crate::store::Quota {
        crate::store::Quota {
            max_session_bytes: policy.max_session_bytes,
            max_payload_bytes: policy.max_payload_bytes,
            max_payloads: policy.max_payloads,
        }
    }

    /// A session's effective policy, from the current tenant policy.
    async fn effective_policy(&self, s: &SessionRecord) -> ApiResult<Policy> {
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

impl Service {
    /// The parent of `s`, when `p` may read it (as a Read would). The sharing
    /// rule, the same for every RPC: a payload is readable by those who may
    /// read the session that holds it. A script or a Search in a child
    /// session reads the parent's payloads only when the caller may read
    /// the parent itself; being shared the child is not enough.
    async fn readable_parent(
        &self,
        p: &Principal,
        s: &SessionRecord,
    ) -> ApiResult<Option<SessionId>> {
        let Some(parent) = s.parent.clone() else {
            return Ok(None);
        };
        let store = self.store.clone();
        let id = parent.clone();
        let record = match in_place(move || store.session(&id)).await {
            Ok(r) => r,
            Err(ApiError::Store(StoreError::NotFound { .. })) => return Ok(None),
            Err(e) => return Err(e),
        };
        let readable = self
            .check_session(p, Rpc::Read, &record, "session", parent.as_str())
            .await;
        match readable {
            Ok(()) => Ok(Some(parent)),
            Err(ApiError::Hidden { .. } | ApiError::Denied(_) | ApiError::Auth(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The error for a slot not given: `what` names the work ("uploads",
/// "searches"), `advice` what the caller should do. A tenant at its own
/// bound is told so, and that other tenants are not affected.
fn slot_refused(r: Refused, what: &str, advice: &str) -> ApiError {
    match r {
        Refused::Key {
            limit, config_key, ..
        } => ApiError::Limit(format!(
            "your tenant already has {limit} {what} in progress, its limit ({config_key} = {limit}); other tenants are not affected. {advice}"
        )),
        Refused::Global { limit, config_key } => ApiError::Limit(format!(
            "{config_key} ({limit}) {what} are already in progress server-wide; retry shortly"
        )),
        Refused::Closed => ApiError::Limit(format!(
            "no more {what} are taken: the server is shutting down; retry shortly"
        )),
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

impl Service {
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
fn ownership(s: &SessionRecord) -> SessionOwnership<'_> {
    SessionOwnership {
        tenant: &s.tenant,
        owner: &s.owner,
        share_with: &s.share_with,
    }
}

/// Redacts one result's bytes, keeping the buffer when nothing matched.
fn redact_bytes(r: &Redactor, content: bytes::Bytes) -> (bytes::Bytes, RedactCounts) {
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
fn redaction_detail(c: &RedactCounts) -> String {
    if c.is_empty() {
        return String::new();
    }
    let by_rule: Vec<String> = c.by_rule.iter().map(|(k, n)| format!("{k}={n}")).collect();
    format!(" redactions={} ({})", c.total, by_rule.join(","))
}

/// What an audit detail says of a deletion: its receipt and what it removed.
fn receipt_detail(r: &crate::store::ReceiptRecord) -> String {
    format!(
        "receipt={} payloads={} bytes={} items={}",
        r.id,
        r.deleted_payload_ids.len(),
        r.bytes_deleted,
        r.removed.len()
    )
}

/// Runs blocking store work on the blocking pool.
async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> ApiResult<T>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    joined(tokio::task::spawn_blocking(f)).await
}

/// Runs a short blocking store call (a record lookup)
/// without stalling the runtime's other tasks. On a multi-thread runtime it
/// runs right here, in [`tokio::task::block_in_place`]: the worker first
/// hands its other tasks to another thread, so this task needs no hop to
/// the blocking pool and back (two thread wake-ups, which are much of a
/// call this short). A current-thread runtime (tests, embedded clients)
/// cannot hand its tasks away, so there the call goes to the blocking pool.
/// Long work (scans, searches, queries) stays on [`blocking`], where a
/// caller's timeout can still fire while it runs. A panic in `f` is an
/// internal error either way, as a failed pool task is.
async fn in_place<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> ApiResult<T>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() != RuntimeFlavor::MultiThread {
        return blocking(f).await;
    }
    let call = std::panic::AssertUnwindSafe(|| tokio::task::block_in_place(f));
    match std::panic::catch_unwind(call) {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(ApiError::Internal(
            "blocking task failed: the store call panicked".into(),
        )),
    }
}

/// Waits for blocking work spawned elsewhere (e.g. on the sandbox's pool).
async fn joined<T, E>(task: tokio::task::JoinHandle<Result<T, E>>) -> ApiResult<T>
where
    E: Into<ApiError>,
{
    match task.await {
        Ok(r) => r.map_err(Into::into),
        Err(e) => Err(ApiError::Internal(format!("blocking task failed: {e}"))),
    }
}

/// Clamps a requested page size to `[1, max]`, with 100 for zero.
fn page_size(requested: u32, max: u32) -> usize {
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

    /// Blocks until `ticks` has moved past its value at the start, or fails
    /// after 5 s: only another task, running meanwhile, can move it.
    fn wait_for_a_tick(ticks: &std::sync::atomic::AtomicU64) -> Result<(), ApiError> {
        use std::sync::atomic::Ordering::SeqCst;
        let start = ticks.load(SeqCst);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while ticks.load(SeqCst) == start {
            if std::time::Instant::now() > until {
                return Err(ApiError::Internal("no other task ran".into()));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }

    async fn ticking_while_in_place() -> (Result<(), ApiError>, std::thread::ThreadId) {
        let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    ticks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            })
        };
        tokio::task::yield_now().await;
        let ran_on = Arc::new(Mutex::new(None));
        let seen = ran_on.clone();
        let waited = in_place(move || {
            *seen.lock().unwrap() = Some(std::thread::current().id());
            wait_for_a_tick(&ticks)
        })
        .await;
        ticker.abort();
        let id = ran_on.lock().unwrap().expect("the call ran");
        (waited, id)
    }

    #[test]
    fn an_in_place_call_runs_on_the_callers_thread_while_the_runtimes_other_tasks_go_on() {
        // One worker: the ticker can only run if the call hands it away.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (waited, ran_on) = rt.block_on(async {
            let caller = tokio::spawn(async {
                let me = std::thread::current().id();
                let (waited, ran_on) = ticking_while_in_place().await;
                (waited, ran_on == me)
            });
            caller.await.unwrap()
        });
        waited.unwrap();
        assert!(ran_on, "the call ran on the calling task's thread");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_panicking_in_place_call_is_an_internal_error_and_the_runtime_goes_on() {
        let panicked = in_place(|| -> Result<(), ApiError> { panic!("a store bug") }).await;
        assert!(
            matches!(&panicked, Err(ApiError::Internal(m)) if m.contains("panicked")),
            "{panicked:?}"
        );
        let again = in_place(|| Ok::<_, ApiError>(7)).await;
        assert_eq!(again.unwrap(), 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_in_place_call_on_a_current_thread_runtime_goes_to_the_blocking_pool() {
        let me = std::thread::current().id();
        let (waited, ran_on) = ticking_while_in_place().await;
        waited.unwrap();
        assert_ne!(
            ran_on, me,
            "a current-thread runtime cannot lend its thread"
        );
    }
}
