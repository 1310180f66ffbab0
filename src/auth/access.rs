//! The access table and the one function that applies it.
//!
//! [`TABLE`] says, for every RPC, which roles may call it and what it does to
//! its target session; [`decide`] turns a principal, an RPC and the caller's
//! [`Target`] into an [`Access`]. The server asks nothing else: handlers go
//! through `Service::authorize`, `session_for` and `payload_for` (or
//! [`decide`] with a tenant target), which work out the [`Relation`] of the
//! caller to the stored session and audit every refusal. The role-matrix
//! test enumerates the same table and asks the same function.
//!
//! Visibility follows the contract: a session of another tenant, or one the
//! caller neither owns nor has been shared (and may not see through its
//! role), is reported as not found, so that nobody can probe for existence.
//!
//! Sub-agent sessions: a session created with `parent_session_id` may use
//! its parent's payloads as inputs (exec, search), never the reverse; see
//! [`Source`].

use super::{AuthError, Principal, Role};

/// Every RPC that needs authorization, named `Service/Method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rpc {
    /// Sessions/CreateSession.
    CreateSession,
    /// Sessions/GetSession.
    GetSession,
    /// Sessions/ListSessions.
    ListSessions,
    /// Sessions/CloseSession.
    CloseSession,
    /// Sessions/DeleteSession.
    DeleteSession,
    /// Payloads/Offload.
    Offload,
    /// Payloads/Upload.
    Upload,
    /// Payloads/Stat.
    Stat,
    /// Payloads/ListPayloads.
    ListPayloads,
    /// Payloads/Read.
    Read,
    /// Payloads/Download.
    Download,
    /// Payloads/DeletePayload.
    DeletePayload,
    /// Payloads/Inspect.
    Inspect,
    /// Payloads/Search.
    Search,
    /// Context/RepairHistory.
    RepairHistory,
    /// Context/CompactHistory.
    CompactHistory,
    /// Context/Recall.
    Recall,
    /// CodeMode/Exec.
    Exec,
    /// CodeMode/ListRuntimes.
    ListRuntimes,
    /// Audit/QueryAudit.
    QueryAudit,
    /// Audit/VerifyAudit.
    VerifyAudit,
    /// Audit/ExportAudit.
    ExportAudit,
    /// Audit/GetReceipt.
    GetReceipt,
    /// Policies/GetPolicy.
    GetPolicy,
    /// Policies/SetPolicy.
    SetPolicy,
    /// Policies/SetLegalHold.
    SetLegalHold,
}

/// What a call does to its target session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionUse {
    /// The call has no target session (create, list, audit, tenant policies).
    None,
    /// Looks at metadata: sizes, names, hashes.
    Metadata,
    /// Reads payload content.
    Content,
    /// Adds data to the session.
    Write,
    /// Closes, deletes or holds: the owner, an admin or compliance.
    Manage,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The RPC.
    pub rpc: Rpc,
    /// Its full gRPC name.
    pub method: &'static str,
    /// Roles that may call it with no target, or on a session.
    pub roles: &'static [Role],
    /// What it needs of the target session.
    pub session: SessionUse,
    /// Roles that may call it naming a tenant (their own only); empty when
    /// the RPC names no tenant.
    pub tenant: &'static [Role],
}

use Role::{Admin, Agent, Auditor, Compliance};
use SessionUse as U;

/// The table the server enforces and the tests enumerate.
#[rustfmt::skip]
pub const TABLE: &[Rule] = &[
    rule(Rpc::CreateSession, "spillway.v1.Sessions/CreateSession", &[Agent, Admin], U::None),
    rule(Rpc::GetSession, "spillway.v1.Sessions/GetSession", &[Agent, Admin, Compliance], U::Metadata),
    rule(Rpc::ListSessions, "spillway.v1.Sessions/ListSessions", &[Agent, Admin, Compliance], U::None),
    rule(Rpc::CloseSession, "spillway.v1.Sessions/CloseSession", &[Agent, Admin], U::Manage),
    rule(Rpc::DeleteSession, "spillway.v1.Sessions/DeleteSession", &[Agent, Admin, Compliance], U::Manage),
    rule(Rpc::Offload, "spillway.v1.Payloads/Offload", &[Agent, Admin], U::Write),
    rule(Rpc::Upload, "spillway.v1.Payloads/Upload", &[Agent, Admin], U::Write),
    rule(Rpc::Stat, "spillway.v1.Payloads/Stat", &[Agent, Admin, Compliance], U::Metadata),
    rule(Rpc::ListPayloads, "spillway.v1.Payloads/ListPayloads", &[Agent, Admin, Compliance], U::Metadata),
    rule(Rpc::Read, "spillway.v1.Payloads/Read", &[Agent, Admin, Compliance], U::Content),
    rule(Rpc::Download, "spillway.v1.Payloads/Download", &[Agent, Admin, Compliance], U::Content),
    rule(Rpc::DeletePayload, "spillway.v1.Payloads/DeletePayload", &[Agent, Admin, Compliance], U::Manage),
    rule(Rpc::Inspect, "spillway.v1.Payloads/Inspect", &[Agent, Admin, Compliance], U::Content),
    rule(Rpc::Search, "spillway.v1.Payloads/Search", &[Agent, Admin, Compliance], U::Content),
    rule(Rpc::RepairHistory, "spillway.v1.Context/RepairHistory", &[Agent, Admin], U::None),
    rule(Rpc::CompactHistory, "spillway.v1.Context/CompactHistory", &[Agent, Admin], U::Write),
    rule(Rpc::Recall, "spillway.v1.Context/Recall", &[Agent, Admin, Compliance], U::Content),
    rule(Rpc::Exec, "spillway.v1.CodeMode/Exec", &[Agent, Admin], U::Content),
    rule(Rpc::ListRuntimes, "spillway.v1.CodeMode/ListRuntimes", &[Agent, Admin, Compliance, Auditor], U::None),
    rule(Rpc::QueryAudit, "spillway.v1.Audit/QueryAudit", &[Auditor, Compliance, Admin], U::None),
    rule(Rpc::VerifyAudit, "spillway.v1.Audit/VerifyAudit", &[Auditor, Compliance, Admin], U::None),
    rule(Rpc::ExportAudit, "spillway.v1.Audit/ExportAudit", &[Auditor, Compliance, Admin], U::None),
    // Receipts of deleted sessions and payloads: those who could see the
    // session's metadata, and the tenant's auditors (see `session_access`).
    rule(Rpc::GetReceipt, "spillway.v1.Audit/GetReceipt", &[Agent, Admin, Compliance, Auditor], U::Metadata),
    // By session: whoever may see the session's metadata (agents: their own
    // and shared). By tenant: admin, compliance and auditors of that tenant.
    rule(Rpc::GetPolicy, "spillway.v1.Policies/GetPolicy", &[Agent, Admin, Compliance], U::Metadata)
        .on_tenant(&[Admin, Compliance, Auditor]),
    // Tenant policies only.
    rule(Rpc::SetPolicy, "spillway.v1.Policies/SetPolicy", &[], U::None)
        .on_tenant(&[Admin, Compliance]),
    rule(Rpc::SetLegalHold, "spillway.v1.Policies/SetLegalHold", &[Admin, Compliance], U::Manage),
];

const fn rule(rpc: Rpc, method: &'static str, roles: &'static [Role], session: SessionUse) -> Rule {
    Rule {
        rpc,
        method,
        roles,
        session,
        tenant: &[],
    }
}

impl Rule {
    const fn on_tenant(self, tenant: &'static [Role]) -> Rule {
        Rule { tenant, ..self }
    }

    /// Every role that may call it in some way.
    pub fn any_roles(&self) -> Vec<Role> {
        let mut all: Vec<Role> = self.roles.iter().chain(self.tenant).copied().collect();
        all.sort();
        all.dedup();
        all
    }
}

impl Rpc {
    /// The table row of this RPC.
    pub fn rule(self) -> &'static Rule {
        TABLE
            .iter()
            .find(|r| r.rpc == self)
            .expect("every Rpc has a row in the access table")
    }
}

/// How the caller stands to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Relation {
    /// The caller created it.
    Owner,
    /// Its owner listed the caller in `share_with`.
    Shared,
    /// Same tenant; neither owned by nor shared with the caller.
    Tenant,
    /// Another tenant's.
    Foreign,
}

impl Relation {
    /// Every relation, for tables and tests.
    pub const ALL: [Relation; 4] = [
        Relation::Owner,
        Relation::Shared,
        Relation::Tenant,
        Relation::Foreign,
    ];

    /// The relation of `principal` to `session`.
    pub fn of(principal: &Principal, session: SessionOwnership<'_>) -> Relation {
        if principal.tenant != session.tenant {
            Relation::Foreign
        } else if principal.id == session.owner {
            Relation::Owner
        } else if session.share_with.contains(&principal.id) {
            Relation::Shared
        } else {
            Relation::Tenant
        }
    }
}

/// Who a session belongs to, as far as access is concerned.
#[derive(Debug, Clone, Copy)]
pub struct SessionOwnership<'a> {
    /// The session's tenant.
    pub tenant: &'a str,
    /// Its owner.
    pub owner: &'a str,
    /// Principals it is shared with.
    pub share_with: &'a [String],
}

/// What a call names, as far as access is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Nothing (create, list, audit, runtimes, repair), or a session not
    /// looked up yet: only the caller's roles can refuse.
    Call,
    /// A session (named, or holding the named payload).
    Session {
        /// The caller's relation to it.
        relation: Relation,
        /// The session's effective `compliance_can_read`.
        compliance_can_read: bool,
    },
    /// A tenant (policies).
    Tenant {
        /// True when it is the caller's own.
        own: bool,
    },
}

/// Where a payload named in a call on a session lives, relative to that
/// session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// In the session itself.
    Same,
    /// In its parent: a sub-agent session reads its parent's payloads.
    Parent,
    /// Anywhere else, a child session included.
    Other,
}

impl Source {
    /// Where a payload of session `payload_session` lives, for a call on
    /// `session`, whose parent is `parent`.
    pub fn of<T: PartialEq>(session: &T, parent: Option<&T>, payload_session: &T) -> Source {
        if payload_session == session {
            Source::Same
        } else if parent == Some(payload_session) {
            Source::Parent
        } else {
            Source::Other
        }
    }

    /// The answer for a payload from here, once the session is allowed:
    /// its own and its parent's payloads, nothing else (reported as not
    /// found).
    pub fn access(self) -> Access {
        match self {
            Source::Same | Source::Parent => Access::Allowed,
            Source::Other => Access::Hidden,
        }
    }
}

/// The answer for one principal, one RPC and one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Go ahead.
    Allowed,
    /// The caller's roles may not call the RPC at all: `PERMISSION_DENIED`.
    Role(AuthError),
    /// Report the target as not found: `NOT_FOUND`.
    Hidden,
    /// A known principal that may call the RPC, but not on this target:
    /// `PERMISSION_DENIED`.
    Denied(String),
}

fn holds_any(principal: &Principal, roles: &[Role]) -> bool {
    roles.iter().any(|r| principal.has(*r))
}

/// Checks the caller's roles against the table: may it call `rpc` in any
/// way at all?
pub fn authorize(principal: &Principal, rpc: Rpc) -> Result<(), AuthError> {
    let rule = rpc.rule();
    let any = rule.any_roles();
    if holds_any(principal, &any) {
        return Ok(());
    }
    Err(AuthError::RoleDenied {
        principal: principal.id.clone(),
        roles: Role::names(&principal.roles),
        rpc: rule.method,
        needed: Role::names(&any),
    })
}

/// Decides what `principal` may do through `rpc` on `target`. The only
/// place that decides access.
pub fn decide(principal: &Principal, rpc: Rpc, target: Target) -> Access {
    let rule = rpc.rule();
    if let Err(e) = authorize(principal, rpc) {
        return Access::Role(e);
    }
    let method = rule.method;
    let id = &principal.id;
    match target {
        Target::Tenant { own } => {
            if !holds_any(principal, rule.tenant) {
                return Access::Denied(if rule.tenant.is_empty() {
                    format!("{method} does not take a tenant")
                } else {
                    format!(
                        "{id} may call {method} only for sessions; for a tenant it needs one of {}",
                        Role::names(rule.tenant)
                    )
                });
            }
            if !own {
                return Access::Denied(format!("{id} may call {method} only for its own tenant"));
            }
            Access::Allowed
        }
        Target::Call | Target::Session { .. } => {
            if !holds_any(principal, rule.roles) {
                return Access::Denied(format!(
                    "{id} may call {method} only for a tenant, which needs one of {}; on sessions it needs one of {}",
                    Role::names(rule.tenant),
                    Role::names(rule.roles)
                ));
            }
            match target {
                Target::Session {
                    relation,
                    compliance_can_read,
                } => session_access(principal, rule, relation, compliance_can_read),
                _ => Access::Allowed,
            }
        }
    }
}

/// The session layer of [`decide`], once the roles allow the call.
fn session_access(
    principal: &Principal,
    rule: &Rule,
    relation: Relation,
    compliance_can_read: bool,
) -> Access {
    if relation == Relation::Foreign {
        return Access::Hidden;
    }
    if principal.has(Admin) {
        return Access::Allowed;
    }
    let owner = relation == Relation::Owner;
    let shared = relation == Relation::Shared;
    let agent = principal.has(Agent) && (owner || shared);
    let compliance = principal.has(Compliance);
    // Auditors see their tenant's metadata where the table lets them at all
    // (deletion receipts).
    let auditor = principal.has(Auditor) && rule.roles.contains(&Auditor);
    if !agent && !compliance && !auditor {
        return Access::Hidden;
    }
    let allowed = match rule.session {
        U::None | U::Metadata => true,
        _ if !agent && !compliance => false,
        U::Content => agent || (compliance && compliance_can_read),
        U::Write => agent,
        U::Manage => (agent && owner) || compliance,
    };
    if allowed {
        return Access::Allowed;
    }
    let why = if compliance && rule.session == U::Content {
        "; compliance principals read content only where the tenant policy sets compliance_can_read"
    } else {
        ""
    };
    Access::Denied(format!(
        "{} may see this session but may not call {} on it{why}",
        principal.id, rule.method
    ))
}

/// True when the principal may see the session at all (for listings, and
/// for telling a caller that a session it could see was deleted).
pub fn can_see(principal: &Principal, session: SessionOwnership<'_>) -> bool {
    let target = Target::Session {
        relation: Relation::of(principal, session),
        compliance_can_read: false,
    };
    decide(principal, Rpc::GetSession, target) == Access::Allowed
}

/// The target of a tenant-wide view (usage totals): a session of the
/// caller's tenant that it neither owns nor was shared. Whoever may see
/// such a session sees every session of the tenant.
pub const TENANT_WIDE: Target = Target::Session {
    relation: Relation::Tenant,
    compliance_can_read: false,
};

/// True when the principal sees every session of its tenant.
pub fn sees_whole_tenant(principal: &Principal) -> bool {
    decide(principal, Rpc::GetSession, TENANT_WIDE) == Access::Allowed
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn p(id: &str, tenant: &str, roles: &[Role]) -> Principal {
        Principal {
            id: id.into(),
            tenant: tenant.into(),
            roles: roles.to_vec(),
        }
    }

    fn owned<'a>(share: &'a [String]) -> SessionOwnership<'a> {
        SessionOwnership {
            tenant: "acme",
            owner: "alice",
            share_with: share,
        }
    }

    /// What `p` may do through `rpc` on a session it stands to as `s` says.
    fn session_access(p: &Principal, rpc: Rpc, s: SessionOwnership<'_>) -> Access {
        on(p, rpc, s, false)
    }

    /// What `p` may do through `rpc` on alice's session shared with bob.
    fn shared_with_bob(p: &Principal, rpc: Rpc) -> Access {
        session_access(p, rpc, owned(&["bob".to_string()]))
    }

    fn on(p: &Principal, rpc: Rpc, s: SessionOwnership<'_>, compliance_can_read: bool) -> Access {
        let relation = Relation::of(p, s);
        decide(
            p,
            rpc,
            Target::Session {
                relation,
                compliance_can_read,
            },
        )
    }

    #[test]
    fn table_covers_every_rpc_of_the_served_protos_exactly_once() {
        let fds = prost_types_fds();
        let mut served = Vec::new();
        for file in &fds.file {
            for svc in &file.service {
                for m in &svc.method {
                    served.push(format!("{}.{}/{}", file.package(), svc.name(), m.name()));
                }
            }
        }
        let mut table: Vec<String> = TABLE.iter().map(|r| r.method.to_owned()).collect();
        served.sort();
        table.sort();
        assert_eq!(served, table);
    }

    fn prost_types_fds() -> pbjson_types::FileDescriptorSet {
        pbjson_types::FileDescriptorSet::decode(crate::proto::FILE_DESCRIPTOR_SET).unwrap()
    }

    #[test]
    fn other_tenants_and_strangers_see_nothing() {
        let mallory = p("mallory", "acme", &[Agent]);
        let foreign_admin = p("root", "other", &[Admin]);
        assert_eq!(shared_with_bob(&mallory, Rpc::Stat), Access::Hidden);
        assert_eq!(shared_with_bob(&foreign_admin, Rpc::Stat), Access::Hidden);
    }

    #[test]
    fn shared_agent_reads_and_writes_but_does_not_delete() {
        let bob = p("bob", "acme", &[Agent]);
        assert_eq!(shared_with_bob(&bob, Rpc::Read), Access::Allowed);
        assert_eq!(shared_with_bob(&bob, Rpc::Upload), Access::Allowed);
        assert!(matches!(
            shared_with_bob(&bob, Rpc::DeleteSession),
            Access::Denied(_)
        ));
    }

    #[test]
    fn compliance_manages_but_cannot_read_content_unless_granted() {
        let c = p("carol", "acme", &[Compliance]);
        assert_eq!(
            session_access(&c, Rpc::DeletePayload, owned(&[])),
            Access::Allowed
        );
        assert!(matches!(
            session_access(&c, Rpc::Read, owned(&[])),
            Access::Denied(_)
        ));
        assert_eq!(on(&c, Rpc::Read, owned(&[]), true), Access::Allowed);
    }

    #[test]
    fn only_auditors_compliance_and_admins_read_the_audit_log() {
        for rpc in [Rpc::QueryAudit, Rpc::VerifyAudit, Rpc::ExportAudit] {
            for role in Role::ALL {
                let p = p("x", "acme", &[role]);
                assert_eq!(
                    authorize(&p, rpc).is_ok(),
                    role != Agent,
                    "{role:?} {rpc:?}"
                );
            }
        }
    }

    #[test]
    fn policies_and_holds_are_set_by_admin_and_compliance_only() {
        let admin = p("ada", "acme", &[Admin]);
        let carol = p("carol", "acme", &[Compliance]);
        let alice = p("alice", "acme", &[Agent]);
        let audrey = p("audrey", "acme", &[Auditor]);
        for rpc in [Rpc::SetPolicy, Rpc::SetLegalHold] {
            assert!(authorize(&admin, rpc).is_ok());
            assert!(authorize(&carol, rpc).is_ok());
            assert!(authorize(&alice, rpc).is_err());
            assert!(authorize(&audrey, rpc).is_err());
        }
        let own = Target::Tenant { own: true };
        let foreign = Target::Tenant { own: false };
        assert_eq!(decide(&carol, Rpc::SetPolicy, own), Access::Allowed);
        assert!(matches!(
            decide(&carol, Rpc::SetPolicy, foreign),
            Access::Denied(_)
        ));
        assert_eq!(decide(&audrey, Rpc::GetPolicy, own), Access::Allowed);
        assert!(matches!(
            decide(&alice, Rpc::GetPolicy, own),
            Access::Denied(_)
        ));
        assert_eq!(
            session_access(&carol, Rpc::SetLegalHold, owned(&[])),
            Access::Allowed
        );
        for who in [&admin, &carol, &alice, &audrey] {
            assert!(authorize(who, Rpc::GetPolicy).is_ok(), "{}", who.id);
        }
        // By session, GetPolicy needs what GetSession needs.
        assert_eq!(
            session_access(&alice, Rpc::GetPolicy, owned(&[])),
            Access::Allowed
        );
        assert_eq!(
            session_access(&p("bob", "acme", &[Agent]), Rpc::GetPolicy, owned(&[])),
            Access::Hidden
        );
        // Auditors read tenant policies, not sessions: a refusal, not a
        // hidden session.
        assert!(matches!(
            session_access(&audrey, Rpc::GetPolicy, owned(&[])),
            Access::Denied(_)
        ));
    }

    #[test]
    fn a_sub_agent_session_reads_its_parents_payloads_never_the_reverse() {
        let (parent, child, other) = ("ses_p", "ses_c", "ses_o");
        assert_eq!(
            Source::of(&child, Some(&parent), &parent).access(),
            Access::Allowed
        );
        assert_eq!(Source::of(&child, Some(&parent), &child), Source::Same);
        assert_eq!(Source::of(&parent, None, &child).access(), Access::Hidden);
        assert_eq!(
            Source::of(&child, Some(&parent), &other).access(),
            Access::Hidden
        );
    }

    #[test]
    fn auditor_role_cannot_call_session_rpcs() {
        let a = p("audrey", "acme", &[Role::Auditor]);
        let err = authorize(&a, Rpc::Read).unwrap_err().to_string();
        assert!(
            err.contains("auditor") && err.contains("Payloads/Read"),
            "{err}"
        );
    }
}
