//! Policies: the effective policy (strictest of server default, tenant
//! policy and session overrides), locked tenant policies, enforcement on
//! existing sessions, session overrides, legal holds and who may do what.

use pbjson_types::Duration;
use spillway::proto::{self, get_policy_request::Target, policies_client::PoliciesClient};
use tonic::Code;

use crate::common::*;

const CAROL: &str = "tok-carol";
const ADMIN: &str = "tok-admin";
const AUDREY: &str = "tok-audrey";
const DAY: i64 = 24 * 3600;

async fn policies(server: &TestServer, token: &str) -> PoliciesClient<Svc> {
    PoliciesClient::with_interceptor(server.channel().await, Bearer(Some(token.into())))
}

fn days(n: i64) -> Option<Duration> {
    Some(Duration {
        seconds: n * DAY,
        nanos: 0,
    })
}

async fn set_policy(
    server: &TestServer,
    token: &str,
    tenant: &str,
    policy: proto::Policy,
) -> Result<proto::Policy, tonic::Status> {
    policies(server, token)
        .await
        .set_policy(proto::SetPolicyRequest {
            tenant: tenant.into(),
            policy: Some(policy),
        })
        .await
        .map(|r| r.into_inner())
}

async fn get_policy(
    server: &TestServer,
    token: &str,
    target: Target,
) -> Result<proto::Policy, tonic::Status> {
    policies(server, token)
        .await
        .get_policy(proto::GetPolicyRequest {
            target: Some(target),
        })
        .await
        .map(|r| r.into_inner())
}

async fn create_with(
    server: &TestServer,
    token: &str,
    policy: proto::Policy,
) -> Result<proto::Session, tonic::Status> {
    server
        .sessions(token)
        .await
        .create_session(proto::CreateSessionRequest {
            label: "policy test".into(),
            policy: Some(policy),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

async fn hold(
    server: &TestServer,
    token: &str,
    session: &str,
    on: bool,
    reason: &str,
) -> Result<proto::Session, tonic::Status> {
    policies(server, token)
        .await
        .set_legal_hold(proto::SetLegalHoldRequest {
            session_id: session.into(),
            hold: on,
            reason: reason.into(),
        })
        .await
        .map(|r| r.into_inner())
}

fn empty_wasm(session: &str) -> proto::ExecRequest {
    proto::ExecRequest {
        session_id: session.into(),
        runtime: "wasm".into(),
        source: r#"(module (func (export "_start")))"#.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_effective_policy_is_the_strictest_of_server_default_tenant_policy_and_session_overrides()
 {
    let server = TestServer::start_with(|c| {
        c.policy.retention = std::time::Duration::from_secs(5 * DAY as u64);
        c.policy.exec_ceiling.timeout_ms = 60_000;
        c.policy.redact = vec!["builtin:email".into()];
    })
    .await;
    set_policy(
        &server,
        ADMIN,
        "acme",
        proto::Policy {
            retention: days(30),
            session_ttl: days(3),
            max_payloads: 10,
            max_session_bytes: 1 << 20,
            allow_download: Some(false),
            exec_ceiling: Some(proto::ExecLimits {
                timeout_ms: 120_000,
                memory_bytes: 1 << 30,
                ..Default::default()
            }),
            redact: vec!["builtin:private_key".into()],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let session = create_with(
        &server,
        ALICE,
        proto::Policy {
            session_ttl: days(1),
            max_payloads: 5,
            allow_exec: Some(false),
            delete_on_close: Some(true),
            redact: vec!["ticket-[0-9]+".into()],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let want = proto::Policy {
        retention: days(5),   // the server's is shortest
        session_ttl: days(1), // the session's
        max_session_bytes: 1 << 20,
        max_payload_bytes: 0, // no level sets one
        max_payloads: 5,
        delete_on_close: Some(true),
        allow_download: Some(false),
        allow_exec: Some(false),
        compliance_can_read: Some(false),
        exec_ceiling: Some(proto::ExecLimits {
            timeout_ms: 60_000,
            memory_bytes: 1 << 30,
            max_stdout_bytes: 64 << 20,
            fuel: spillway::sandbox::limits::ExecLimits::CEILING.fuel,
        }),
        redact: vec![
            "builtin:email".into(),
            "builtin:private_key".into(),
            "ticket-[0-9]+".into(),
        ],
        locked: false,
    };
    assert_eq!(session.policy.as_ref(), Some(&want));
    let got = get_policy(&server, ALICE, Target::SessionId(session.id.clone()))
        .await
        .unwrap();
    assert_eq!(got, want);
    let expires = session.expires_at.unwrap().seconds - session.created_at.unwrap().seconds;
    assert!((DAY - 1..=DAY).contains(&expires), "{expires}");

    // The tenant policy reads back as set, not merged.
    let tenant = get_policy(&server, CAROL, Target::Tenant("acme".into()))
        .await
        .unwrap();
    assert_eq!(tenant.retention, days(30));
    assert_eq!(tenant.allow_exec, None);
}

#[tokio::test]
async fn a_locked_tenant_policy_refuses_loosening_naming_the_field_and_accepts_tightening() {
    let server = TestServer::start().await;
    let locked = proto::Policy {
        retention: days(7),
        allow_exec: Some(false),
        locked: true,
        ..Default::default()
    };
    set_policy(&server, CAROL, "acme", locked.clone())
        .await
        .unwrap();

    let err = set_policy(
        &server,
        ADMIN,
        "acme",
        proto::Policy {
            retention: days(30),
            ..locked.clone()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with(
            "policy.retention: 30days would loosen the locked tenant policy (7days); a locked policy can only be tightened"
        ),
        "{}",
        err.message()
    );
    for (loose, field) in [
        (
            proto::Policy {
                allow_exec: Some(true),
                ..locked.clone()
            },
            "policy.allow_exec",
        ),
        (
            proto::Policy {
                locked: false,
                ..locked.clone()
            },
            "policy.locked",
        ),
    ] {
        let err = set_policy(&server, ADMIN, "acme", loose).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with(field), "{}", err.message());
    }
    // Nothing of the refused changes was stored.
    let stored = get_policy(&server, CAROL, Target::Tenant("acme".into()))
        .await
        .unwrap();
    assert_eq!(stored, locked);

    let tighter = proto::Policy {
        retention: days(1),
        allow_download: Some(false),
        ..locked
    };
    let set = set_policy(&server, ADMIN, "acme", tighter.clone())
        .await
        .unwrap();
    assert_eq!(set, tighter);
}

#[tokio::test]
async fn tightening_the_tenant_policy_applies_to_an_existing_session_at_once() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let big = "x".repeat(10_000);
    let stored = upload(&mut p, header(&session.id, "big.txt"), big.as_bytes())
        .await
        .unwrap();
    assert_eq!(download(&mut p, &stored.id).await.unwrap().len(), 10_000);
    let read_all = proto::ReadRequest {
        payload_id: stored.id.clone(),
        ..Default::default()
    };
    assert_eq!(
        p.read(read_all.clone())
            .await
            .unwrap()
            .into_inner()
            .data
            .len(),
        10_000
    );
    let mut code = server.codemode(ALICE).await;
    code.exec(empty_wasm(&session.id)).await.unwrap();

    set_policy(
        &server,
        CAROL,
        "acme",
        proto::Policy {
            allow_download: Some(false),
            allow_exec: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();

    let err = download(&mut p, &stored.id).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(
        err.message().contains("allow_download"),
        "{}",
        err.message()
    );
    let err = p.read(read_all).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(
        err.message().contains("at most 1500 bytes") && err.message().contains("Search"),
        "{}",
        err.message()
    );
    // A preview-sized Read still works.
    let small = p
        .read(proto::ReadRequest {
            payload_id: stored.id.clone(),
            max_bytes: 1500,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(small.data.len(), 1500);
    let err = code.exec(empty_wasm(&session.id)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("allow_exec"), "{}", err.message());
    let shown = server
        .sessions(ALICE)
        .await
        .get_session(proto::GetSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .policy
        .unwrap();
    assert_eq!(
        (shown.allow_download, shown.allow_exec),
        (Some(false), Some(false))
    );
}

#[tokio::test]
async fn session_overrides_that_loosen_the_tenant_policy_are_refused_naming_the_field() {
    let server = TestServer::start().await;
    set_policy(
        &server,
        ADMIN,
        "acme",
        proto::Policy {
            retention: days(2),
            max_payloads: 10,
            allow_download: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    for (loose, field) in [
        (
            proto::Policy {
                retention: days(3),
                ..Default::default()
            },
            "policy.retention: 3days would loosen the tenant's effective policy (2days)",
        ),
        (
            proto::Policy {
                max_payloads: 11,
                ..Default::default()
            },
            "policy.max_payloads: 11",
        ),
        (
            proto::Policy {
                allow_download: Some(true),
                ..Default::default()
            },
            "policy.allow_download",
        ),
        (
            proto::Policy {
                session_ttl: days(8),
                ..Default::default()
            },
            "policy.session_ttl",
        ),
    ] {
        let err = create_with(&server, ALICE, loose).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with(field), "{}", err.message());
    }
    let ok = create_with(
        &server,
        ALICE,
        proto::Policy {
            retention: days(1),
            max_payloads: 3,
            allow_download: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(ok.policy.unwrap().max_payloads, 3);

    // A sub-agent session inherits its parent's overrides: it may not
    // loosen them either.
    let child = server
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest {
            parent_session_id: ok.id.clone(),
            policy: Some(proto::Policy {
                max_payloads: 5,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        child.message().starts_with("policy.max_payloads: 5"),
        "{}",
        child.message()
    );
}

#[tokio::test]
async fn a_legal_hold_refuses_payload_and_session_deletion_until_it_is_released() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let stored = upload(&mut p, header(&session.id, "evidence.txt"), b"keep me")
        .await
        .unwrap();
    let held = hold(&server, CAROL, &session.id, true, "case 42")
        .await
        .unwrap();
    assert!(held.legal_hold);
    assert_eq!(
        (held.legal_hold_reason.as_str(), held.legal_hold_by.as_str()),
        ("case 42", "carol")
    );

    let err = p
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: stored.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("legal hold") && err.message().contains("case 42"),
        "{}",
        err.message()
    );
    let err = server
        .sessions(ADMIN)
        .await
        .delete_session(proto::DeleteSessionRequest {
            session_id: session.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("case 42"), "{}", err.message());
    assert_eq!(download(&mut p, &stored.id).await.unwrap(), b"keep me");

    let released = hold(&server, ADMIN, &session.id, false, "").await.unwrap();
    assert!(!released.legal_hold && released.legal_hold_reason.is_empty());
    p.delete_payload(proto::DeletePayloadRequest {
        payload_id: stored.id.clone(),
        reason: String::new(),
    })
    .await
    .unwrap();
    server
        .sessions(ALICE)
        .await
        .delete_session(proto::DeleteSessionRequest {
            session_id: session.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_legal_hold_needs_a_reason_and_compliance_or_admin() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let err = hold(&server, CAROL, &session.id, true, " ")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = hold(&server, ALICE, &session.id, true, "mine")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = hold(&server, MALLORY, &session.id, true, "theirs")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn agents_cannot_set_policies_and_read_only_their_own_sessions_policy() {
    let server = TestServer::start().await;
    let err = set_policy(&server, ALICE, "acme", proto::Policy::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = get_policy(&server, ALICE, Target::Tenant("acme".into()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let own = create_session(&server, ALICE).await;
    get_policy(&server, ALICE, Target::SessionId(own.id.clone()))
        .await
        .unwrap();
    let err = get_policy(&server, BOB, Target::SessionId(own.id.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn another_tenant_cannot_read_or_set_acmes_policy() {
    let server = TestServer::start().await;
    let err = set_policy(
        &server,
        MALLORY,
        "acme",
        proto::Policy {
            allow_download: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = get_policy(&server, MALLORY, Target::Tenant("acme".into()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let acme = create_session(&server, ALICE).await;
    let err = get_policy(&server, MALLORY, Target::SessionId(acme.id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // Nothing changed for acme.
    let stored = get_policy(&server, CAROL, Target::Tenant("acme".into()))
        .await
        .unwrap();
    assert_eq!(stored, proto::Policy::default());
    // Mallory's own tenant is theirs to set; an empty tenant (and a
    // GetPolicy without a target) means the caller's own, never acme.
    set_policy(&server, MALLORY, "other", proto::Policy::default())
        .await
        .unwrap();
    let no_download = proto::Policy {
        allow_download: Some(false),
        ..Default::default()
    };
    set_policy(&server, MALLORY, "", no_download.clone())
        .await
        .unwrap();
    let own = policies(&server, MALLORY)
        .await
        .get_policy(proto::GetPolicyRequest { target: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.allow_download, Some(false));
    let other = get_policy(&server, MALLORY, Target::Tenant("other".into()))
        .await
        .unwrap();
    assert_eq!(other, own);
    let acme = get_policy(&server, CAROL, Target::Tenant("acme".into()))
        .await
        .unwrap();
    assert_eq!(acme, proto::Policy::default());
}

#[tokio::test]
async fn auditors_read_the_tenant_policy_but_cannot_set_it() {
    let server = TestServer::start().await;
    get_policy(&server, AUDREY, Target::Tenant("acme".into()))
        .await
        .unwrap();
    let err = set_policy(&server, AUDREY, "acme", proto::Policy::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn compliance_reads_content_only_where_the_effective_policy_grants_it() {
    let server = TestServer::start_with(|c| c.policy.compliance_can_read = true).await;
    set_policy(
        &server,
        ADMIN,
        "acme",
        proto::Policy {
            compliance_can_read: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (_, stored) = session_with_payload(&server, ALICE, "x.txt", b"content").await;
    let read = proto::ReadRequest {
        payload_id: stored.id.clone(),
        ..Default::default()
    };
    let mut carol = server.payloads(CAROL).await;
    let err = carol.read(read.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);

    set_policy(
        &server,
        ADMIN,
        "acme",
        proto::Policy {
            compliance_can_read: Some(true),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let data = carol.read(read).await.unwrap().into_inner().data;
    assert_eq!(data, b"content");
}

#[tokio::test]
async fn a_redaction_rule_that_does_not_compile_is_refused_with_the_parsers_message() {
    let server = TestServer::start().await;
    let err = set_policy(
        &server,
        ADMIN,
        "acme",
        proto::Policy {
            redact: vec!["(unclosed".into()],
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("policy.redact: redaction rule 0")
            && err.message().contains("regex"),
        "{}",
        err.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_and_gets_policies_and_places_and_lifts_holds() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = ProcessServer::start(None, &data_dir, dir.path().join("server.log")).await;
    let cli = |args: &[&str]| {
        command()
            .args(args)
            .env("SPILLWAY_ADDR", server.addr.to_string())
            .env("SPILLWAY_DATA_DIR", &data_dir)
            .output()
            .unwrap()
    };
    let ok = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // Dev mode: the dev token is an admin of tenant "dev"; without
    // --tenant, set and get act on the caller's own tenant.
    let set: serde_json::Value = serde_json::from_str(&ok(cli(&[
        "--json",
        "policy",
        "set",
        "--retention",
        "3d",
        "--no-download",
        "--exec-timeout-ms",
        "60000",
        "--redact",
        "builtin:email",
        "--locked",
    ])))
    .unwrap();
    assert_eq!(set["retention"], "259200s");
    assert_eq!(set["allowDownload"], false);
    assert_eq!(set["locked"], true);
    assert!(set.get("allowExec").is_none(), "unset flags defer: {set}");

    let shown = ok(cli(&["policy", "get"]));
    assert!(shown.contains("retention            3days"), "{shown}");
    assert_eq!(shown, ok(cli(&["policy", "get", "--tenant", "dev"])));
    assert!(
        shown.contains("allow_exec           (server default)"),
        "{shown}"
    );

    let refused = cli(&[
        "policy",
        "set",
        "--tenant",
        "dev",
        "--retention",
        "30d",
        "--locked",
    ]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("InvalidArgument") || stderr.contains("INVALID_ARGUMENT"),
        "{stderr}"
    );
    assert!(stderr.contains("policy.retention"), "{stderr}");

    let created: serde_json::Value =
        serde_json::from_str(&ok(cli(&["--json", "session", "create"]))).unwrap();
    let session = created["id"].as_str().unwrap().to_owned();
    let effective: serde_json::Value = serde_json::from_str(&ok(cli(&[
        "--json",
        "policy",
        "get",
        "--session",
        &session,
    ])))
    .unwrap();
    assert_eq!(effective["allowDownload"], false);
    assert_eq!(effective["allowExec"], true);

    let held = ok(cli(&[
        "hold",
        "on",
        "--session",
        &session,
        "--reason",
        "case 7",
    ]));
    assert!(held.contains("legal hold by"), "{held}");
    let refused = cli(&["session", "rm", &session]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("case 7"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    ok(cli(&["hold", "off", "--session", &session]));
    ok(cli(&["session", "rm", &session]));
}

#[tokio::test]
async fn a_payload_expires_after_the_effective_retention() {
    let server = TestServer::start().await;
    set_policy(
        &server,
        ADMIN,
        "acme",
        proto::Policy {
            retention: days(2),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let session = create_with(
        &server,
        ALICE,
        proto::Policy {
            retention: days(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let other = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    for (session, want) in [(&session.id, DAY), (&other.id, 2 * DAY)] {
        let stored = upload(&mut p, header(session, "x.txt"), b"x")
            .await
            .unwrap();
        let lives = stored.expires_at.unwrap().seconds - stored.created_at.unwrap().seconds;
        assert!((want - 1..=want).contains(&lives), "{lives}, wanted {want}");
    }
}

#[tokio::test]
async fn without_allow_download_recall_returns_no_more_than_a_read_may() {
    let server = TestServer::start().await;
    let s = create_with(
        &server,
        ALICE,
        proto::Policy {
            allow_download: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let big: String = (0..400)
        .map(|i| format!("line {i} of a long result\n"))
        .collect();
    let small = "a short result\n";
    let mut payloads = server.payloads(ALICE).await;
    for (name, body) in [("big.txt", big.as_str()), ("small.txt", small)] {
        upload(&mut payloads, header(&s.id, name), body.as_bytes())
            .await
            .unwrap();
    }
    let key = |text: &str| spillway::context::recall_key(text);
    let mut context = spillway::proto::context_client::ContextClient::with_interceptor(
        server.channel().await,
        Bearer(Some(ALICE.into())),
    );
    let recall = |key: String| proto::RecallRequest {
        session_id: s.id.clone(),
        key,
    };
    let err = context.recall(recall(key(&big))).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(
        err.message().contains("allow_download = false"),
        "{}",
        err.message()
    );
    let ok = context
        .recall(recall(key(small)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.content, small);
}
