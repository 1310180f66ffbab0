//! The access table: for every RPC, the roles that may call it and the
//! relation to the target session the caller needs. Handlers ask
//! [`authorize`] and [`session_access`]; nothing else decides access.
//!
//! Visibility follows the contract: a session of another tenant, or one the
//! caller neither owns nor has been shared, is reported as not found, so that
//! nobody can probe for existence.

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
    /// The call has no target session (create, list).
    None,
    /// Looks at metadata: sizes, names, hashes.
    Metadata,
    /// Reads payload content.
    Content,
    /// Adds data to the session.
    Write,
    /// Closes or deletes: the owner, an admin or compliance.
    Manage,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The RPC.
    pub rpc: Rpc,
    /// Its full gRPC name.
    pub method: &'static str,
    /// Roles that may call it at all.
    pub roles: &'static [Role],
    /// What it needs of the target session.
    pub session: SessionUse,
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
    // Checked against the receipt's tenant, owner and sharing: see
    // `receipt_access`.
    rule(Rpc::GetReceipt, "spillway.v1.Audit/GetReceipt", &[Agent, Admin, Compliance, Auditor], U::Metadata),
    // By tenant: admin, compliance and auditors of that tenant; by session:
    // whoever may see the session's metadata (agents: their own and shared).
    rule(Rpc::GetPolicy, "spillway.v1.Policies/GetPolicy", &[Agent, Admin, Compliance, Auditor], U::Metadata),
    rule(Rpc::SetPolicy, "spillway.v1.Policies/SetPolicy", &[Admin, Compliance], U::None),
    rule(Rpc::SetLegalHold, "spillway.v1.Policies/SetLegalHold", &[Admin, Compliance], U::Manage),
];

const fn rule(rpc: Rpc, method: &'static str, roles: &'static [Role], session: SessionUse) -> Rule {
    Rule {
        rpc,
        method,
        roles,
        session,
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

/// Who a session belongs to, as far as access is concerned.
#[derive(Debug, Clone, Copy)]
pub struct SessionOwnership<'a> {
    /// The session's tenant.
    pub tenant: &'a str,
    /// Its owner.
    pub owner: &'a str,
    /// Principals it is shared with.
    pub share_with: &'a [String],
    /// Whether compliance principals may read content (policy).
    pub compliance_can_read: bool,
}

/// The answer for one principal, one RPC and one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Go ahead.
    Allowed,
    /// Report the session as not found.
    Hidden,
    /// A known principal that may see the session but not do this.
    Denied(String),
}

/// Checks the caller's roles against the table.
pub fn authorize(principal: &Principal, rpc: Rpc) -> Result<(), AuthError> {
    let rule = rpc.rule();
    if rule.roles.iter().any(|r| principal.has(*r)) {
        return Ok(());
    }
    let join = |roles: &[Role]| {
        roles
            .iter()
            .map(|r| r.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(AuthError::RoleDenied {
        principal: principal.id.clone(),
        roles: join(&principal.roles),
        rpc: rule.method,
        needed: join(rule.roles),
    })
}

/// Decides what `principal` may do to a session through `rpc`.
pub fn session_access(principal: &Principal, rpc: Rpc, session: SessionOwnership<'_>) -> Access {
    if principal.tenant != session.tenant {
        return Access::Hidden;
    }
    if principal.has(Admin) {
        return Access::Allowed;
    }
    let owner = principal.id == session.owner;
    let shared = session.share_with.contains(&principal.id);
    let agent = principal.has(Agent) && (owner || shared);
    let compliance = principal.has(Compliance);
    if !agent && !compliance {
        return Access::Hidden;
    }
    let allowed = match rpc.rule().session {
        U::None | U::Metadata => true,
        U::Content => agent || (compliance && session.compliance_can_read),
        U::Write => agent,
        U::Manage => (agent && owner) || compliance,
    };
    if allowed {
        Access::Allowed
    } else {
        Access::Denied(format!(
            "{} may see this session but may not call {} on it",
            principal.id,
            rpc.rule().method
        ))
    }
}

/// Whether the principal may see a deletion receipt: auditors, compliance
/// and admins of its tenant, and the agents who could see the deleted
/// session.
pub fn receipt_access(principal: &Principal, deleted: SessionOwnership<'_>) -> Access {
    if principal.tenant != deleted.tenant {
        return Access::Hidden;
    }
    if principal.has(Auditor) || principal.has(Compliance) || principal.has(Admin) {
        return Access::Allowed;
    }
    session_access(principal, Rpc::GetReceipt, deleted)
}

/// True when the principal may see the session at all (for listings).
pub fn can_see(principal: &Principal, session: SessionOwnership<'_>) -> bool {
    session_access(principal, Rpc::GetSession, session) == Access::Allowed
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
            compliance_can_read: false,
        }
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
        let share = vec!["bob".to_string()];
        let mallory = p("mallory", "acme", &[Agent]);
        let foreign_admin = p("root", "other", &[Admin]);
        assert_eq!(
            session_access(&mallory, Rpc::Stat, owned(&share)),
            Access::Hidden
        );
        assert_eq!(
            session_access(&foreign_admin, Rpc::Stat, owned(&share)),
            Access::Hidden
        );
    }

    #[test]
    fn shared_agent_reads_and_writes_but_does_not_delete() {
        let share = vec!["bob".to_string()];
        let bob = p("bob", "acme", &[Agent]);
        assert_eq!(
            session_access(&bob, Rpc::Read, owned(&share)),
            Access::Allowed
        );
        assert_eq!(
            session_access(&bob, Rpc::Upload, owned(&share)),
            Access::Allowed
        );
        assert!(matches!(
            session_access(&bob, Rpc::DeleteSession, owned(&share)),
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
        let granted = SessionOwnership {
            compliance_can_read: true,
            ..owned(&[])
        };
        assert_eq!(session_access(&c, Rpc::Read, granted), Access::Allowed);
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
