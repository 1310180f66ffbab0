//! Sessions RPCs, authentication, visibility and server plumbing.

use spillway::proto::{self, SessionState};
use tonic::Code;

use crate::common::*;

#[tokio::test]
async fn creates_gets_lists_closes_and_deletes_a_session() {
    let server = TestServer::start().await;
    let mut s = server.sessions(ALICE).await;
    let created = s
        .create_session(proto::CreateSessionRequest {
            label: "triage".into(),
            labels: [("ticket".to_string(), "T-1".to_string())].into(),
            share_with: vec!["bob".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(created.id.starts_with("ses_"));
    assert_eq!(
        (created.tenant.as_str(), created.owner.as_str()),
        ("acme", "alice")
    );
    assert_eq!(created.state, SessionState::Open as i32);
    assert!(created.expires_at.unwrap().seconds > created.created_at.unwrap().seconds);
    assert!(created.policy.is_some());

    let got = s
        .get_session(proto::GetSessionRequest {
            session_id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.labels.get("ticket").map(String::as_str), Some("T-1"));

    let listed = s
        .list_sessions(proto::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 1);

    let closed = s
        .close_session(proto::CloseSessionRequest {
            session_id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(closed.state, SessionState::Closed as i32);
    assert!(closed.closed_at.is_some());
    let open_only = s
        .list_sessions(proto::ListSessionsRequest {
            state: SessionState::Open as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(open_only.sessions.is_empty());

    let receipt = s
        .delete_session(proto::DeleteSessionRequest {
            session_id: created.id.clone(),
            reason: "done".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(receipt.id.starts_with("rcpt_"));
    assert_eq!(
        (receipt.target_id.as_str(), receipt.requested_by.as_str()),
        (created.id.as_str(), "alice")
    );
    let err = s
        .get_session(proto::GetSessionRequest {
            session_id: created.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        !server
            .data_dir()
            .join("sessions")
            .join(&created.id)
            .exists()
    );
}

#[tokio::test]
async fn calls_without_a_valid_token_are_unauthenticated() {
    let server = TestServer::start().await;
    let err = server
        .anonymous_payloads()
        .await
        .stat(proto::PayloadRequest {
            payload_id: "pl_x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("Bearer"), "{}", err.message());
    let err = server
        .sessions("not-a-token")
        .await
        .list_sessions(proto::ListSessionsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn other_tenants_and_unshared_principals_get_not_found() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    for token in [MALLORY, BOB] {
        let err = server
            .sessions(token)
            .await
            .get_session(proto::GetSessionRequest {
                session_id: session.id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{token}");
        let listed = server
            .sessions(token)
            .await
            .list_sessions(proto::ListSessionsRequest::default())
            .await
            .unwrap();
        assert!(
            listed.into_inner().sessions.is_empty(),
            "{token} must not list alice's session"
        );
    }
    // The admin of the same tenant sees it.
    server
        .sessions("tok-admin")
        .await
        .get_session(proto::GetSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn roles_outside_the_table_get_permission_denied() {
    let server = TestServer::start().await;
    let err = server
        .sessions("tok-audrey")
        .await
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("auditor"), "{}", err.message());
}

#[tokio::test]
async fn malformed_and_unknown_ids_are_distinguished() {
    let server = TestServer::start().await;
    let mut s = server.sessions(ALICE).await;
    let err = s
        .get_session(proto::GetSessionRequest {
            session_id: "ses_../../etc".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let unknown = format!("ses_{}", "0".repeat(32));
    let err = s
        .get_session(proto::GetSessionRequest {
            session_id: unknown,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn list_sessions_pages_through_everything_once() {
    let server = TestServer::start().await;
    let mut s = server.sessions(ALICE).await;
    let mut made = Vec::new();
    for _ in 0..7 {
        made.push(create_session(&server, ALICE).await.id);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = s
            .list_sessions(proto::ListSessionsRequest {
                page_size: 3,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.sessions.len() <= 3);
        seen.extend(page.sessions.into_iter().map(|x| x.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    made.sort();
    seen.sort();
    assert_eq!(made, seen);
    let err = s
        .list_sessions(proto::ListSessionsRequest {
            page_token: "zz-not-hex".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn oversize_unary_message_is_resource_exhausted_naming_the_limit() {
    let server = TestServer::start_with(|c| c.limits.max_request_message_bytes = 64 * 1024).await;
    let err = server
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest {
            label: "x".repeat(100_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(
        err.message()
            .contains("limits.max_request_message_bytes (65536 bytes)"),
        "{}",
        err.message()
    );
}

/// The names of the services reflection lists, through `$version` of its
/// protocol (`v1` and `v1alpha` are the same messages in two modules).
macro_rules! list_services {
    ($version:ident, $channel:expr, $bearer:expr) => {{
        use tonic_reflection::pb::$version::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let mut client = ServerReflectionClient::with_interceptor($channel, $bearer);
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = client
            .server_reflection_info(tokio_stream::iter([req]))
            .await
            .unwrap()
            .into_inner();
        let msg = stream.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
            panic!("unexpected reply")
        };
        list.service.into_iter().map(|s| s.name).collect()
    }};
}

/// The names of the services reflection lists, through v1 or v1alpha.
async fn reflected_services(server: &TestServer, alpha: bool) -> Vec<String> {
    let channel = server.channel().await;
    let bearer = Bearer(Some(ALICE.into()));
    if alpha {
        list_services!(v1alpha, channel, bearer)
    } else {
        list_services!(v1, channel, bearer)
    }
}

#[tokio::test]
async fn every_service_of_the_proto_is_reflected_and_reports_serving_on_health() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let server = TestServer::start().await;
    let v1 = reflected_services(&server, false).await;
    let alpha = reflected_services(&server, true).await;
    let ours = |names: &[String]| -> Vec<String> {
        let mut v: Vec<String> = names
            .iter()
            .filter(|n| n.starts_with("spillway.v1."))
            .cloned()
            .collect();
        v.sort();
        v
    };
    assert_eq!(ours(&v1), ours(&alpha), "v1 and v1alpha list the same");
    assert!(alpha.contains(&"grpc.reflection.v1alpha.ServerReflection".to_owned()));
    // The proto's own list: reflection reads the descriptor set, so a
    // service missing from the server's table still shows here.
    let ours = ours(&v1);
    assert_eq!(ours.len(), 6, "{v1:?}");
    let mut health = HealthClient::new(server.channel().await);
    for name in ours.iter().map(|n| n.as_str()).chain([""]) {
        let resp = health
            .check(HealthCheckRequest {
                service: name.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("health of {name:?}: {e}"))
            .into_inner();
        assert_eq!(resp.status, ServingStatus::Serving as i32, "{name}");
    }
}

#[tokio::test]
async fn data_survives_a_graceful_restart() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let stored = upload(
        &mut p,
        header(&session.id, "a.txt"),
        b"kept across restarts\n",
    )
    .await
    .unwrap();
    let (dir, config) = server.stop().await;
    let server = TestServer::start_in(dir, config).await;
    let mut p = server.payloads(ALICE).await;
    assert_eq!(
        download(&mut p, &stored.id).await.unwrap(),
        b"kept across restarts\n"
    );
}

#[tokio::test]
async fn oversized_labels_and_share_lists_are_refused_by_name() {
    let server = TestServer::start().await;
    let mut s = server.sessions(ALICE).await;
    let err = s
        .create_session(proto::CreateSessionRequest {
            label: "x".repeat(257),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("label is 257 bytes; at most 256"),
        "{}",
        err.message()
    );
    let err = s
        .create_session(proto::CreateSessionRequest {
            share_with: (0..65).map(|i| format!("p{i}")).collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("share_with"), "{}", err.message());
}

#[tokio::test]
async fn list_sessions_filters_by_owner_labels_label_text_hold_and_expiry() {
    let server = TestServer::start().await;
    let create = |token: &'static str, label: &str, team: &str| {
        let req = proto::CreateSessionRequest {
            label: label.into(),
            labels: [("team".to_string(), team.to_string())].into(),
            share_with: vec!["carol".into()],
            ..Default::default()
        };
        let server = &server;
        async move {
            server
                .sessions(token)
                .await
                .create_session(req)
                .await
                .unwrap()
                .into_inner()
                .id
        }
    };
    let red = create(ALICE, "Triage of INCIDENT 7", "red").await;
    let blue = create(ALICE, "weekly report", "blue").await;
    let bobs = create(BOB, "bob's incident notes", "red").await;
    let mut policies = spillway::proto::policies_client::PoliciesClient::with_interceptor(
        server.channel().await,
        Bearer(Some("tok-carol".into())),
    );
    policies
        .set_legal_hold(proto::SetLegalHoldRequest {
            session_id: blue.clone(),
            hold: true,
            reason: "litigation".into(),
        })
        .await
        .unwrap();

    // Carol (compliance) sees all three; each filter narrows the list.
    let mut carol = server.sessions("tok-carol").await;
    let mut ids = async |r: proto::ListSessionsRequest| {
        let mut ids: Vec<String> = carol
            .list_sessions(r)
            .await
            .unwrap()
            .into_inner()
            .sessions
            .into_iter()
            .map(|s| s.id)
            .collect();
        ids.sort();
        ids
    };
    let sorted = |mut v: Vec<&String>| {
        v.sort();
        v.into_iter().cloned().collect::<Vec<_>>()
    };
    let all = ids(proto::ListSessionsRequest::default()).await;
    assert_eq!(all, sorted(vec![&red, &blue, &bobs]));
    let by_owner = ids(proto::ListSessionsRequest {
        owner: "alice".into(),
        ..Default::default()
    })
    .await;
    assert_eq!(by_owner, sorted(vec![&red, &blue]));
    let by_label = ids(proto::ListSessionsRequest {
        labels: [("team".to_string(), "red".to_string())].into(),
        ..Default::default()
    })
    .await;
    assert_eq!(by_label, sorted(vec![&red, &bobs]));
    let by_text = ids(proto::ListSessionsRequest {
        label_contains: "incident".into(),
        owner: "alice".into(),
        ..Default::default()
    })
    .await;
    assert_eq!(
        by_text,
        vec![red.clone()],
        "case-insensitive, and every filter applies"
    );
    let held = ids(proto::ListSessionsRequest {
        legal_hold: Some(true),
        ..Default::default()
    })
    .await;
    assert_eq!(held, vec![blue.clone()]);
    let not_held = ids(proto::ListSessionsRequest {
        legal_hold: Some(false),
        ..Default::default()
    })
    .await;
    assert_eq!(not_held, sorted(vec![&red, &bobs]));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let at = |seconds| Some(pbjson_types::Timestamp { seconds, nanos: 0 });
    // Sessions live 7 days by default.
    let within_a_day = ids(proto::ListSessionsRequest {
        expires_before: at(now + 86_400),
        ..Default::default()
    })
    .await;
    assert!(within_a_day.is_empty(), "{within_a_day:?}");
    let within_30_days = ids(proto::ListSessionsRequest {
        expires_before: at(now + 30 * 86_400),
        ..Default::default()
    })
    .await;
    assert_eq!(within_30_days, all);

    let err = carol
        .list_sessions(proto::ListSessionsRequest {
            owner: "x".repeat(300),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("owner"), "{}", err.message());
}
