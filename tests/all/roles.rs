//! The role matrix. Every RPC of the server's own access table is called for
//! real, by one principal of each role, on each relation to its target
//! (own, shared, same-tenant, foreign session; a sub-agent session naming
//! its parent's payload and the reverse; own and foreign tenant), with
//! `compliance_can_read` off and on. The expected code comes from
//! `access::decide`, the function the server enforces, applied to the
//! table; not from a copy of it. Every refusal must be in the audit log as
//! `access.denied`.

use std::collections::BTreeMap;
use std::time::Instant;

use prost::Message as _;
use spillway::auth::Principal;
use spillway::auth::access::{self, Access, Relation, Rpc, SessionUse, Source, TABLE, Target};
use spillway::proto::{
    self, audit_client::AuditClient, code_mode_client::CodeModeClient,
    context_client::ContextClient, get_policy_request, payloads_client::PayloadsClient,
    policies_client::PoliciesClient, sessions_client::SessionsClient,
};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::common::*;

/// One principal of each role, by ID; the owners of targets are `bob`
/// (acme) and `mallory` (the foreign tenant).
const CALLERS: [&str; 4] = ["alice", "ada", "carol", "audrey"];
const CONTENT: &[u8] = b"{\"a\":1,\"word\":\"needle\"}\n";

fn cast(id: &str) -> (&'static str, Principal) {
    let (token, principal, tenant, roles) = CAST
        .iter()
        .find(|c| c.1 == id)
        .unwrap_or_else(|| panic!("{id} is not in the cast"));
    let p = Principal {
        id: (*principal).into(),
        tenant: (*tenant).into(),
        roles: roles.to_vec(),
    };
    (token, p)
}

fn token_of(id: &str) -> &'static str {
    cast(id).0
}

/// A session with one payload, and a sub-agent session of it with one.
#[derive(Clone)]
struct World {
    session: String,
    payload: String,
    sha: String,
    child: String,
    child_payload: String,
    /// The receipt of a payload its owner deleted.
    receipt: String,
}

/// What one call names.
#[derive(Clone, Default)]
struct Args {
    session: String,
    payload: String,
    /// For exec and search: the payload named as input.
    input: String,
    /// A recall key of the session.
    key: String,
    /// A deletion receipt of the session.
    receipt: String,
    tenant: String,
    compliance_can_read: bool,
}

/// The target of a case, as the table sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aim {
    Call,
    Session(Relation, Source),
    Tenant { own: bool },
}

struct Matrix {
    chan: Channel,
    /// Calls made per rule, to show that every row was exercised.
    calls: BTreeMap<&'static str, usize>,
    /// Refusals made, by (principal, method).
    refused: BTreeMap<(String, String), usize>,
    failures: Vec<String>,
    seq: usize,
}

impl Matrix {
    async fn world(&mut self, owner: &str, share: &[&str], child: bool) -> World {
        let token = token_of(owner);
        let mut sessions =
            SessionsClient::with_interceptor(self.chan.clone(), Bearer(Some(token.into())));
        let mut payloads =
            PayloadsClient::with_interceptor(self.chan.clone(), Bearer(Some(token.into())));
        let share_with: Vec<String> = share.iter().map(|s| s.to_string()).collect();
        let create = |parent: &str| proto::CreateSessionRequest {
            label: "matrix".into(),
            parent_session_id: parent.into(),
            share_with: share_with.clone(),
            ..Default::default()
        };
        let s = sessions
            .create_session(create(""))
            .await
            .unwrap()
            .into_inner();
        let p = upload(&mut payloads, header(&s.id, "data.json"), CONTENT)
            .await
            .unwrap();
        let doomed = upload(&mut payloads, header(&s.id, "gone.json"), b"gone\n")
            .await
            .unwrap();
        let receipt = payloads
            .delete_payload(proto::DeletePayloadRequest {
                payload_id: doomed.id,
                reason: "matrix".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .id;
        let (child, child_payload) = if child {
            let c = sessions
                .create_session(create(&s.id))
                .await
                .unwrap()
                .into_inner();
            let cp = upload(&mut payloads, header(&c.id, "child.json"), CONTENT)
                .await
                .unwrap();
            (c.id, cp.id)
        } else {
            Default::default()
        };
        World {
            session: s.id,
            payload: p.id,
            sha: p.sha256,
            child,
            child_payload,
            receipt,
        }
    }

    /// Makes one real call and compares its code with the table's answer.
    async fn case(&mut self, rpc: Rpc, caller: &str, aim: Aim, args: Args) {
        let (token, principal) = cast(caller);
        let rule = rpc.rule();
        let flag = args.compliance_can_read;
        let want = match aim {
            Aim::Call => access::decide(&principal, rpc, Target::Call),
            Aim::Tenant { own } => access::decide(&principal, rpc, Target::Tenant { own }),
            Aim::Session(relation, source) => {
                let target = Target::Session {
                    relation,
                    compliance_can_read: flag,
                };
                match access::decide(&principal, rpc, target) {
                    Access::Allowed => source.access(),
                    refused => refused,
                }
            }
        };
        let want_code = match spillway::service::access_result(want.clone(), "target", "") {
            Ok(()) => Code::Ok,
            Err(e) => Status::from(e).code(),
        };
        self.seq += 1;
        let got = self.call(rpc, token, &args).await;
        *self.calls.entry(rule.method).or_default() += 1;
        let got_code = got.as_ref().err().map_or(Code::Ok, |s| s.code());
        if want_code != got_code {
            self.failures.push(format!(
                "{} by {caller} on {aim:?} (compliance_can_read {flag}): want {want_code:?} ({want:?}), got {got:?}",
                rule.method
            ));
        }
        if want != Access::Allowed {
            *self
                .refused
                .entry((principal.id.clone(), rule.method.to_owned()))
                .or_default() += 1;
        }
    }

    /// The request builder: a minimal valid request for each RPC. The match
    /// is exhaustive, so a new RPC does not compile without one.
    async fn call(&self, rpc: Rpc, token: &str, a: &Args) -> Result<(), Status> {
        let bearer = || Bearer(Some(token.into()));
        let chan = self.chan.clone();
        let mut sessions = SessionsClient::with_interceptor(chan.clone(), bearer());
        let mut payloads = PayloadsClient::with_interceptor(chan.clone(), bearer());
        let mut context = ContextClient::with_interceptor(chan.clone(), bearer());
        let mut codemode = CodeModeClient::with_interceptor(chan.clone(), bearer());
        let mut audit = AuditClient::with_interceptor(chan.clone(), bearer());
        let mut policies = PoliciesClient::with_interceptor(chan, bearer());
        let session_id = a.session.clone();
        let payload = || proto::PayloadRequest {
            payload_id: a.payload.clone(),
        };
        match rpc {
            Rpc::CreateSession => sessions
                .create_session(proto::CreateSessionRequest::default())
                .await
                .map(drop),
            Rpc::GetSession => sessions
                .get_session(proto::GetSessionRequest { session_id })
                .await
                .map(drop),
            Rpc::ListSessions => sessions
                .list_sessions(proto::ListSessionsRequest::default())
                .await
                .map(drop),
            Rpc::CloseSession => sessions
                .close_session(proto::CloseSessionRequest { session_id })
                .await
                .map(drop),
            Rpc::DeleteSession => sessions
                .delete_session(proto::DeleteSessionRequest {
                    session_id,
                    reason: "matrix".into(),
                })
                .await
                .map(drop),
            Rpc::Offload => payloads
                .offload(proto::OffloadRequest {
                    session_id,
                    turn: 1,
                    results: vec![proto::ToolResult {
                        tool_call_id: format!("call{}", self.seq),
                        tool_name: "t".into(),
                        content: b"small".to_vec().into(),
                        ..Default::default()
                    }],
                    settings: None,
                })
                .await
                .map(drop),
            Rpc::Upload => {
                let name = format!("up{}.txt", self.seq);
                upload(&mut payloads, header(&session_id, &name), b"x")
                    .await
                    .map(drop)
            }
            Rpc::Stat => payloads.stat(payload()).await.map(drop),
            Rpc::ListPayloads => payloads
                .list_payloads(proto::ListPayloadsRequest {
                    session_id,
                    ..Default::default()
                })
                .await
                .map(drop),
            Rpc::Read => payloads
                .read(proto::ReadRequest {
                    payload_id: a.payload.clone(),
                    ..Default::default()
                })
                .await
                .map(drop),
            Rpc::Download => download(&mut payloads, &a.payload).await.map(drop),
            Rpc::DeletePayload => payloads
                .delete_payload(proto::DeletePayloadRequest {
                    payload_id: a.payload.clone(),
                    reason: "matrix".into(),
                })
                .await
                .map(drop),
            Rpc::Inspect => payloads.inspect(payload()).await.map(drop),
            Rpc::Search => {
                let reply = payloads
                    .search(proto::SearchRequest {
                        session_id,
                        payload_ids: vec![a.input.clone()],
                        pattern: "needle".into(),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                assert_eq!(reply.matches.len(), 1, "the search found its input");
                Ok(())
            }
            Rpc::RepairHistory => context
                .repair_history(proto::RepairHistoryRequest::default())
                .await
                .map(drop),
            Rpc::CompactHistory => context
                .compact_history(proto::CompactHistoryRequest {
                    session_id,
                    ..Default::default()
                })
                .await
                .map(drop),
            Rpc::Recall => context
                .recall(proto::RecallRequest {
                    session_id,
                    key: a.key.clone(),
                })
                .await
                .map(drop),
            Rpc::Exec => {
                let result = codemode
                    .exec(proto::ExecRequest {
                        session_id,
                        runtime: "jq".into(),
                        source: ".word".into(),
                        inputs: vec![a.input.clone()],
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                assert_eq!(result.stdout.trim(), "\"needle\"", "{result:?}");
                Ok(())
            }
            Rpc::ListRuntimes => codemode
                .list_runtimes(proto::ListRuntimesRequest::default())
                .await
                .map(drop),
            Rpc::QueryAudit => audit
                .query_audit(proto::AuditQuery {
                    page_size: 1,
                    ..Default::default()
                })
                .await
                .map(drop),
            Rpc::VerifyAudit => audit
                .verify_audit(proto::VerifyAuditRequest::default())
                .await
                .map(drop),
            Rpc::ExportAudit => {
                let mut stream = audit
                    .export_audit(proto::ExportAuditRequest::default())
                    .await?
                    .into_inner();
                while stream.message().await?.is_some() {}
                Ok(())
            }
            Rpc::GetReceipt => audit
                .get_receipt(proto::GetReceiptRequest {
                    receipt_id: a.receipt.clone(),
                    target_id: String::new(),
                })
                .await
                .map(drop),
            Rpc::GetPolicy => {
                let target = if a.tenant.is_empty() {
                    get_policy_request::Target::SessionId(session_id)
                } else {
                    get_policy_request::Target::Tenant(a.tenant.clone())
                };
                policies
                    .get_policy(proto::GetPolicyRequest {
                        target: Some(target),
                    })
                    .await
                    .map(drop)
            }
            Rpc::SetPolicy => policies
                .set_policy(proto::SetPolicyRequest {
                    tenant: a.tenant.clone(),
                    policy: Some(proto::Policy {
                        compliance_can_read: Some(a.compliance_can_read),
                        ..Default::default()
                    }),
                })
                .await
                .map(drop),
            Rpc::SetLegalHold => policies
                .set_legal_hold(proto::SetLegalHoldRequest {
                    session_id,
                    hold: true,
                    reason: "matrix".into(),
                })
                .await
                .map(drop),
        }
    }
}

/// Who owns the target of `relation` for `caller`, and whom it is shared
/// with; `None` when the caller cannot own a session (its role may not
/// create one, which the CreateSession row shows).
fn owner_of(caller: &'static str, relation: Relation) -> Option<(&'static str, Vec<&'static str>)> {
    match relation {
        Relation::Owner => {
            let (_, p) = cast(caller);
            let may = access::decide(&p, Rpc::CreateSession, Target::Call) == Access::Allowed;
            may.then(|| (caller, vec![]))
        }
        Relation::Shared => Some(("bob", vec![caller])),
        Relation::Tenant => Some(("bob", vec![])),
        Relation::Foreign => Some(("mallory", vec![])),
    }
}

#[tokio::test]
async fn every_rpc_answers_every_role_and_relation_as_the_access_table_says() {
    // Every level of policy must grant compliance_can_read (the server's
    // default included); the tenant policy turns it off and on below.
    let server = TestServer::start_with(|c| c.policy.compliance_can_read = true).await;
    let started = Instant::now();
    let mut m = Matrix {
        chan: server.channel().await,
        calls: BTreeMap::new(),
        refused: BTreeMap::new(),
        failures: Vec::new(),
        seq: 0,
    };
    // Targets that no call changes, one per caller and relation.
    let mut worlds = BTreeMap::new();
    for caller in CALLERS {
        for relation in Relation::ALL {
            if let Some((owner, share)) = owner_of(caller, relation) {
                let w = m.world(owner, &share, true).await;
                worlds.insert((caller, format!("{relation:?}")), (relation, w));
            }
        }
    }
    let ada = token_of("ada");
    for compliance_can_read in [false, true] {
        // The tenant policy of acme for this round, set by its admin.
        m.call(
            Rpc::SetPolicy,
            ada,
            &Args {
                tenant: "acme".into(),
                compliance_can_read,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        for rule in TABLE {
            let rpc = rule.rpc;
            for caller in CALLERS {
                let base = Args {
                    compliance_can_read,
                    ..Default::default()
                };
                if rule.session == SessionUse::None && !rule.roles.is_empty() {
                    m.case(rpc, caller, Aim::Call, base.clone()).await;
                }
                if !rule.tenant.is_empty() {
                    for (tenant, own) in [("acme", true), ("other", false)] {
                        let args = Args {
                            tenant: tenant.into(),
                            ..base.clone()
                        };
                        m.case(rpc, caller, Aim::Tenant { own }, args).await;
                    }
                }
                if rule.session == SessionUse::None {
                    continue;
                }
                // Exec and search name payloads within a session: from the
                // session itself, from its parent, or (never allowed) from
                // its child.
                let sources: &[Source] = if matches!(rpc, Rpc::Exec | Rpc::Search) {
                    &[Source::Same, Source::Parent, Source::Other]
                } else {
                    &[Source::Same]
                };
                for relation in Relation::ALL {
                    let Some((owner, share)) = owner_of(caller, relation) else {
                        continue;
                    };
                    let w = if rule.session == SessionUse::Manage {
                        // It changes its target: a fresh one each time.
                        m.world(owner, &share, false).await
                    } else {
                        worlds[&(caller, format!("{relation:?}"))].1.clone()
                    };
                    for &source in sources {
                        let (session, input) = match source {
                            Source::Same => (&w.session, &w.payload),
                            Source::Parent => (&w.child, &w.payload),
                            Source::Other => (&w.session, &w.child_payload),
                        };
                        let args = Args {
                            session: session.clone(),
                            payload: w.payload.clone(),
                            input: input.clone(),
                            key: w.sha[..16].to_owned(),
                            receipt: w.receipt.clone(),
                            ..base.clone()
                        };
                        m.case(rpc, caller, Aim::Session(relation, source), args)
                            .await;
                    }
                }
            }
        }
    }
    let elapsed = started.elapsed();
    let calls: usize = m.calls.values().sum();
    assert!(
        m.failures.is_empty(),
        "{} of {calls} calls disagree with the access table:\n{}",
        m.failures.len(),
        m.failures.join("\n")
    );
    for rule in TABLE {
        assert!(
            m.calls.contains_key(rule.method),
            "{} never called",
            rule.method
        );
    }

    // Every refusal is audited as access.denied, by the refused principal,
    // naming the method; and only the refusals are.
    let mut audit = AuditClient::with_interceptor(
        server.channel().await,
        Bearer(Some(token_of("audrey").into())),
    );
    let mut logged: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut page_token = String::new();
    loop {
        let page = audit
            .query_audit(proto::AuditQuery {
                action: "access.denied".into(),
                page_size: 1000,
                page_token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        for e in &page.events {
            assert_eq!(e.outcome, "denied", "{e:?}");
            let method = e.detail.split(": ").next().unwrap_or_default();
            if e.detail.contains("not found or not visible") {
                assert!(
                    e.session_id.is_empty() && e.payload_id.is_empty(),
                    "a hidden target leaks no ID into the log: {e:?}"
                );
            }
            *logged
                .entry((e.principal.clone(), method.to_owned()))
                .or_default() += 1;
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(m.refused, logged, "refusals made vs access.denied logged");
    let refusals: usize = m.refused.values().sum();
    println!(
        "role matrix: {calls} calls over {} rules, {refusals} refusals audited, in {elapsed:?}",
        TABLE.len()
    );
}

#[test]
fn the_access_table_covers_every_method_of_the_served_protos_exactly_once() {
    let fds =
        pbjson_types::FileDescriptorSet::decode(spillway::proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut served = Vec::new();
    for file in fds.file.iter().filter(|f| f.package() == "spillway.v1") {
        for service in &file.service {
            for method in &service.method {
                served.push(format!(
                    "{}.{}/{}",
                    file.package(),
                    service.name(),
                    method.name()
                ));
            }
        }
    }
    assert!(served.len() >= 25, "{served:?}");
    for method in &served {
        let rows = TABLE.iter().filter(|r| r.method == method).count();
        assert_eq!(rows, 1, "{method} has {rows} rows in the access table");
    }
    for rule in TABLE {
        assert!(
            served.contains(&rule.method.to_owned()),
            "{} is in the access table but not served",
            rule.method
        );
        assert_eq!(rule.rpc.rule().method, rule.method, "{:?}", rule.rpc);
    }
}

#[tokio::test]
async fn a_token_configured_by_sha256_authenticates_and_bad_tokens_are_unauthenticated_with_a_hint()
{
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("spillway.toml");
    std::fs::write(
        &file,
        format!(
            "[[auth.tokens]]\ntoken_sha256 = \"{}\"\nprincipal = \"hashy\"\ntenant = \"acme\"\nroles = [\"agent\"]\n",
            sha256_hex(b"hashed-secret")
        ),
    )
    .unwrap();
    let loaded = spillway::config::Config::load(
        Some(&file),
        &Default::default(),
        &spillway::config::Overrides::default(),
    )
    .unwrap();
    assert_eq!(loaded.auth.tokens[0].token, None);
    let server = TestServer::start_with(|c| c.auth.tokens.extend(loaded.auth.tokens)).await;

    let created = server
        .sessions("hashed-secret")
        .await
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (created.owner.as_str(), created.tenant.as_str()),
        ("hashy", "acme")
    );

    // The digest is not a password.
    let digest = sha256_hex(b"hashed-secret");
    for token in [digest.as_str(), "not-a-token"] {
        let err = server
            .sessions(token)
            .await
            .list_sessions(proto::ListSessionsRequest::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        assert!(
            err.message().starts_with("unknown bearer token")
                && err.message().contains("token_sha256"),
            "{}",
            err.message()
        );
    }
    let err = SessionsClient::with_interceptor(server.channel().await, Bearer(None))
        .list_sessions(proto::ListSessionsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(
        err.message().contains("authorization: Bearer <token>")
            && err.message().contains("--token"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn a_sub_agent_session_inherits_the_parent_policy_and_reads_its_payloads_only_as_the_parent_allows_never_the_reverse()
 {
    let server = TestServer::start().await;
    let mut bob_sessions = server.sessions(BOB).await;
    let mut bob_payloads = server.payloads(BOB).await;
    // Bob's session, tightened, and not shared with alice.
    let parent = bob_sessions
        .create_session(proto::CreateSessionRequest {
            policy: Some(proto::Policy {
                max_payloads: 5,
                allow_download: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let in_parent = upload(&mut bob_payloads, header(&parent.id, "p.json"), CONTENT)
        .await
        .unwrap();
    // A sub-agent session of it, for alice.
    let child = bob_sessions
        .create_session(proto::CreateSessionRequest {
            parent_session_id: parent.id.clone(),
            share_with: vec!["alice".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(child.parent_session_id, parent.id);
    assert_eq!(
        child.policy, parent.policy,
        "the effective policy is inherited"
    );
    let in_child = upload(&mut bob_payloads, header(&child.id, "c.json"), CONTENT)
        .await
        .unwrap();

    let exec = |session: &str, input: &str| proto::ExecRequest {
        session_id: session.into(),
        runtime: "jq".into(),
        source: ".word".into(),
        inputs: vec![input.into()],
        ..Default::default()
    };
    let search = |session: &str, input: &str| proto::SearchRequest {
        session_id: session.into(),
        payload_ids: vec![input.into()],
        pattern: "needle".into(),
        ..Default::default()
    };
    // One rule through every RPC: a payload is readable by those who may
    // read the session that holds it. The child is shared with alice, its
    // parent is not: so the parent's payload is not found for her through
    // Exec and Search in the child, just as through Stat and Read.
    let hidden = server
        .codemode(ALICE)
        .await
        .exec(exec(&child.id, &in_parent.id))
        .await
        .unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound, "{hidden:?}");
    let hidden = server
        .payloads(ALICE)
        .await
        .search(search(&child.id, &in_parent.id))
        .await
        .unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound, "{hidden:?}");
    let mut alice_payloads = server.payloads(ALICE).await;
    let direct = alice_payloads
        .stat(proto::PayloadRequest {
            payload_id: in_parent.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(direct.code(), Code::NotFound);
    assert_eq!(
        direct.message().replace(&in_parent.id, "ID"),
        hidden.message().replace(&in_parent.id, "ID"),
        "the same words as any unknown payload"
    );
    // Bob may read both sessions, so through the child he reads the parent's.
    let ran = server
        .codemode(BOB)
        .await
        .exec(exec(&child.id, &in_parent.id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ran.stdout.trim(), "\"needle\"", "{ran:?}");
    let found = bob_payloads
        .search(search(&child.id, &in_parent.id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.matches.len(), 1);

    // Never the reverse, not even for the owner of both.
    let up = server
        .codemode(BOB)
        .await
        .exec(exec(&parent.id, &in_child.id))
        .await
        .unwrap_err();
    assert_eq!(up.code(), Code::NotFound, "{up:?}");
    let up = bob_payloads
        .search(search(&parent.id, &in_child.id))
        .await
        .unwrap_err();
    assert_eq!(up.code(), Code::NotFound, "{up:?}");
}
