//! Retention, legal holds, `delete_on_close`, quotas, deletion that
//! propagates, and deletion that survives `kill -9`, through the API.
//!
//! Time-based tests run the server on a `ManualClock`: they move it past a
//! retention period instead of sleeping through one, and poll (briefly)
//! only for the reaper task to get its turn.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway::clock::{Clock, ManualClock, SystemClock};
use spillway::proto::{
    self, audit_client::AuditClient, context_client::ContextClient, policies_client::PoliciesClient,
};
use tonic::Code;

use crate::common::*;

const CAROL: &str = "tok-carol";
const AUDREY: &str = "tok-audrey";
const HOUR: Duration = Duration::from_secs(3600);

fn hours(n: i64) -> Option<pbjson_types::Duration> {
    Some(pbjson_types::Duration {
        seconds: n * 3600,
        nanos: 0,
    })
}

/// A policy level that names only a retention of `n` hours.
fn retention_hours(n: i64) -> proto::Policy {
    proto::Policy {
        retention: hours(n),
        ..Default::default()
    }
}

fn clock_now() -> ManualClock {
    ManualClock::new(SystemClock.now_ms())
}

/// A server on `clock` whose reaper looks every 20 ms.
async fn clocked(clock: &ManualClock) -> TestServer {
    warm_compile_cache().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.reaper.interval = Duration::from_millis(20);
    TestServer::start_clocked(dir, config, Arc::new(clock.clone())).await
}

async fn session_with(server: &TestServer, token: &str, policy: proto::Policy) -> proto::Session {
    server
        .sessions(token)
        .await
        .create_session(proto::CreateSessionRequest {
            label: "lifecycle".into(),
            policy: Some(policy),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn put(server: &TestServer, session: &str, name: &str, data: &[u8]) -> proto::Payload {
    let mut client = server.payloads(ALICE).await;
    upload(&mut client, header(session, name), data)
        .await
        .unwrap()
}

async fn stat(server: &TestServer, token: &str, id: &str) -> Result<proto::Payload, tonic::Status> {
    server
        .payloads(token)
        .await
        .stat(proto::PayloadRequest {
            payload_id: id.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn hold(server: &TestServer, session: &str, on: bool) {
    PoliciesClient::with_interceptor(server.channel().await, Bearer(Some(CAROL.into())))
        .set_legal_hold(proto::SetLegalHoldRequest {
            session_id: session.into(),
            hold: on,
            reason: if on {
                "litigation 42".into()
            } else {
                String::new()
            },
        })
        .await
        .unwrap();
}

async fn receipt_of(server: &TestServer, target: &str) -> proto::DeletionReceipt {
    AuditClient::with_interceptor(server.channel().await, Bearer(Some(AUDREY.into())))
        .get_receipt(proto::GetReceiptRequest {
            receipt_id: String::new(),
            target_id: target.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

async fn audit_events(server: &TestServer, action: &str) -> Vec<proto::AuditEvent> {
    AuditClient::with_interceptor(server.channel().await, Bearer(Some(AUDREY.into())))
        .query_audit(proto::AuditQuery {
            action: action.into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events
}

/// Polls `check` until it holds, for at most 5 s (the reaper runs every
/// 20 ms here; this only waits for it to get a turn).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn gone(server: &TestServer, id: &str) -> bool {
    matches!(stat(server, ALICE, id).await, Err(s) if s.code() == Code::NotFound)
}

#[tokio::test]
async fn expired_payloads_and_sessions_are_reaped_with_receipts_and_audit_events() {
    let clock = clock_now();
    let server = clocked(&clock).await;
    let s = session_with(
        &server,
        ALICE,
        proto::Policy {
            retention: hours(1),
            session_ttl: hours(3),
            ..Default::default()
        },
    )
    .await;
    let p = put(&server, &s.id, "a.txt", b"expires in an hour\n").await;

    clock.advance(HOUR / 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(stat(&server, ALICE, &p.id).await.is_ok(), "not yet due");

    clock.advance(HOUR);
    eventually("the payload is reaped", || gone(&server, &p.id)).await;
    let err = stat(&server, ALICE, &p.id).await.unwrap_err();
    assert!(
        err.message().contains("was deleted by reaper"),
        "{}",
        err.message()
    );
    let r = receipt_of(&server, &p.id).await;
    assert_eq!(r.requested_by, "reaper");
    assert_eq!(r.deleted_payload_ids, vec![p.id.clone()]);
    assert!(r.reason.contains("retention"), "{}", r.reason);
    // The reaper audits a deletion once its files are gone and before its
    // intent is: the payload can read as gone a moment before the event is
    // in the log.
    eventually("the reaper's deletion is audited", || async {
        audit_events(&server, "payload.delete")
            .await
            .iter()
            .any(|e| e.principal == "reaper" && e.payload_id == p.id)
    })
    .await;

    // The session TTL (3 h) takes the session itself.
    clock.advance(2 * HOUR);
    let sid = s.id.clone();
    eventually("the session is reaped", || async {
        let mut c = server.sessions(ALICE).await;
        matches!(
            c.get_session(proto::GetSessionRequest { session_id: sid.clone() }).await,
            Err(st) if st.code() == Code::NotFound
        )
    })
    .await;
    assert!(session_files(&server.data_dir(), &s.id).is_empty());
    assert_eq!(receipt_of(&server, &s.id).await.requested_by, "reaper");
}

#[tokio::test]
async fn a_legal_hold_defers_every_deletion_and_its_release_deletes_the_overdue_data_promptly() {
    let clock = clock_now();
    let server = clocked(&clock).await;
    let s = session_with(&server, ALICE, retention_hours(1)).await;
    let p = put(&server, &s.id, "held.txt", b"evidence\n").await;
    hold(&server, &s.id, true).await;
    clock.advance(2 * HOUR);
    // Many reaper passes (20 ms each) go by: the hold stands.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(stat(&server, ALICE, &p.id).await.is_ok());
    let err = server
        .payloads(ALICE)
        .await
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: p.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("legal hold"), "{}", err.message());
    let refused: Vec<_> = audit_events(&server, "payload.delete")
        .await
        .into_iter()
        .filter(|e| e.outcome == "error")
        .collect();
    assert_eq!(refused.len(), 1, "the refused deletion is audited");
    assert!(refused[0].detail.contains("legal hold"), "{:?}", refused[0]);

    let released = Instant::now();
    hold(&server, &s.id, false).await;
    eventually("the overdue payload goes once the hold is lifted", || {
        gone(&server, &p.id)
    })
    .await;
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "took {:?}",
        released.elapsed()
    );
}

#[tokio::test]
async fn work_due_while_the_server_was_down_is_done_at_startup() {
    let clock = clock_now();
    let server = clocked(&clock).await;
    let s = session_with(&server, ALICE, retention_hours(1)).await;
    let p = put(&server, &s.id, "old.txt", b"old\n").await;
    let keep = session_with(&server, ALICE, proto::Policy::default()).await;
    let k = put(&server, &keep.id, "new.txt", b"new\n").await;
    let (dir, mut config) = server.stop().await;

    clock.advance(2 * HOUR);
    // After the first pass the reaper would wait an hour: only the pass at
    // startup can delete it within the test.
    config.reaper.interval = HOUR;
    let server = TestServer::start_clocked(dir, config, Arc::new(clock.clone())).await;
    eventually("the overdue payload is deleted at startup", || {
        gone(&server, &p.id)
    })
    .await;
    assert!(stat(&server, ALICE, &k.id).await.is_ok());
}

#[tokio::test]
async fn closing_with_delete_on_close_deletes_the_payloads_at_once_or_after_the_hold_is_lifted() {
    let clock = clock_now();
    let server = clocked(&clock).await;
    let policy = proto::Policy {
        delete_on_close: Some(true),
        ..Default::default()
    };
    let s = session_with(&server, ALICE, policy.clone()).await;
    let p = put(&server, &s.id, "x.txt", b"x\n").await;
    let closed = server
        .sessions(ALICE)
        .await
        .close_session(proto::CloseSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(closed.usage.unwrap().payloads, 0);
    assert!(gone(&server, &p.id).await, "deleted before the reply");
    assert_eq!(
        receipt_of(&server, &s.id).await.deleted_payload_ids,
        vec![p.id]
    );

    let held = session_with(&server, ALICE, policy).await;
    let q = put(&server, &held.id, "y.txt", b"y\n").await;
    hold(&server, &held.id, true).await;
    server
        .sessions(ALICE)
        .await
        .close_session(proto::CloseSessionRequest {
            session_id: held.id.clone(),
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        stat(&server, ALICE, &q.id).await.is_ok(),
        "the hold defers it"
    );
    hold(&server, &held.id, false).await;
    eventually("delete_on_close happens once the hold is lifted", || {
        gone(&server, &q.id)
    })
    .await;
}

#[tokio::test]
async fn fifty_concurrent_uploads_against_a_quota_that_fits_ten_store_exactly_ten() {
    let server = TestServer::start().await;
    const SIZE: usize = 1000;
    let s = session_with(
        &server,
        ALICE,
        proto::Policy {
            max_session_bytes: 10 * SIZE as u64,
            ..Default::default()
        },
    )
    .await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let mut client = server.payloads(ALICE).await;
        let sid = s.id.clone();
        tasks.spawn(async move {
            let body = format!("{i:0>width$}", width = SIZE);
            upload(
                &mut client,
                header(&sid, &format!("p{i}.txt")),
                body.as_bytes(),
            )
            .await
        });
    }
    let mut stored = 0;
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(_) => stored += 1,
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
                let m = e.message();
                assert!(
                    m.contains("max_session_bytes is 10000 bytes")
                        && m.contains("already uses")
                        && m.contains("Nothing was stored"),
                    "{m}"
                );
            }
        }
    }
    assert_eq!(stored, 10);
    let over: Vec<_> = audit_events(&server, "payload.upload")
        .await
        .into_iter()
        .filter(|e| e.outcome == "error")
        .collect();
    assert_eq!(over.len(), 40, "every refused upload is audited");
    assert!(over.iter().all(|e| e.detail.contains("max_session_bytes")));
    assert_eq!(payloads_of(&server, &s.id).await.len(), 10);
    assert_eq!(session_files(&server.data_dir(), &s.id).len(), 10);

    // The payload-count quota names itself too.
    let counted = session_with(
        &server,
        ALICE,
        proto::Policy {
            max_payloads: 2,
            ..Default::default()
        },
    )
    .await;
    put(&server, &counted.id, "a", b"a").await;
    put(&server, &counted.id, "b", b"b").await;
    let mut client = server.payloads(ALICE).await;
    let err = upload(&mut client, header(&counted.id, "c"), b"c")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("max_payloads is 2 payloads"),
        "{}",
        err.message()
    );
}

// Multi-threaded: the CLI runs as a child process while this runtime
// serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_payload_removes_its_derived_outputs_and_archived_history_and_the_receipt_lists_them()
 {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await;
    let items: Vec<String> = (0..3000)
        .map(|i| {
            format!(
                "{{\"id\":{i},\"title\":\"PR {i}\",\"user\":\"dev{}\"}}",
                i % 7
            )
        })
        .collect();
    let json = format!("[{}]", items.join(","));
    let reply = server
        .payloads(ALICE)
        .await
        .offload(proto::OffloadRequest {
            session_id: s.id.clone(),
            turn: 1,
            results: vec![proto::ToolResult {
                tool_call_id: "c1".into(),
                tool_name: "list_prs".into(),
                content: json.clone().into_bytes().into(),
                content_type: "application/json".into(),
                is_error: false,
            }],
            settings: None,
        })
        .await
        .unwrap()
        .into_inner();
    let parent = reply.outcomes[0].payload.clone().expect("offloaded");
    let notice = reply.outcomes[0].content.clone();

    // A script's output, offloaded because it is large: derived from the parent.
    let exec = server
        .codemode(ALICE)
        .await
        .exec(proto::ExecRequest {
            session_id: s.id.clone(),
            runtime: "jq".into(),
            source: ".[]".into(),
            inputs: vec![parent.id.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let output = exec.stdout_payload.expect("large stdout is offloaded");
    assert_eq!(output.derived_from, vec![parent.id.clone()]);

    // Archived history: the raw result and the notice that names it.
    let turn = |n: usize, content: &str| {
        use proto::block::Block;
        vec![
            proto::Message {
                role: proto::Role::Assistant as i32,
                blocks: vec![proto::Block {
                    block: Some(Block::ToolUse(proto::ToolUseBlock {
                        id: format!("c{n}"),
                        name: "list_prs".into(),
                        input_json: "{}".into(),
                    })),
                }],
            },
            proto::Message {
                role: proto::Role::Tool as i32,
                blocks: vec![proto::Block {
                    block: Some(Block::ToolResult(proto::ToolResultBlock {
                        tool_use_id: format!("c{n}"),
                        content: content.into(),
                        ..Default::default()
                    })),
                }],
            },
        ]
    };
    let mut messages = turn(1, &json);
    messages.extend(turn(2, &notice));
    for _ in 3..=8 {
        messages.push(proto::Message {
            role: proto::Role::Assistant as i32,
            blocks: vec![proto::Block {
                block: Some(proto::block::Block::Text("thinking".into())),
            }],
        });
    }
    let compacted =
        ContextClient::with_interceptor(server.channel().await, Bearer(Some(ALICE.into())))
            .max_decoding_message_size(64 << 20)
            .compact_history(proto::CompactHistoryRequest {
                session_id: s.id.clone(),
                messages,
                current_turn: 8,
                settings: Some(proto::CompactSettings {
                    truncate_age: Some(1),
                    clear_age: Some(2),
                    min_chars: Some(1),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
    // The raw result's recall key resolves to the parent's own bytes; the
    // notice, which names the parent, is archived as a new entry. Both
    // stand behind a marker.
    let report = compacted.report.unwrap();
    assert_eq!(report.stored_keys.len(), 1, "{report:?}");
    assert_eq!(report.archived_keys.len(), 2, "{report:?}");
    let text = format!("{:?}", compacted.messages);
    let keys: Vec<String> = regex::Regex::new(r"<<ccr:([0-9a-f]{16})>>")
        .unwrap()
        .captures_iter(&text)
        .map(|c| c[1].to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(keys.len(), 2, "both results compacted: {text}");
    let mut context =
        ContextClient::with_interceptor(server.channel().await, Bearer(Some(ALICE.into())))
            .max_decoding_message_size(64 << 20);
    for key in &keys {
        context
            .recall(proto::RecallRequest {
                session_id: s.id.clone(),
                key: key.clone(),
            })
            .await
            .unwrap();
    }

    let receipt = server
        .payloads(ALICE)
        .await
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: parent.id.clone(),
            reason: "user asked".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let of_kind = |kind: &str| -> Vec<String> {
        receipt
            .removed
            .iter()
            .filter(|i| i.kind == kind)
            .map(|i| i.id.clone())
            .collect()
    };
    assert_eq!(of_kind("payload"), vec![parent.id.clone()]);
    assert_eq!(of_kind("derived_payload"), vec![output.id.clone()]);
    let archives = of_kind("archive_entry");
    assert_eq!(archives.len(), 1, "{:?}", receipt.removed);
    assert_eq!(of_kind("line_index").len(), 3);
    assert_eq!(of_kind("content_blob").len(), 3);
    assert_eq!(receipt.deleted_payload_ids.len(), 3);

    for id in [&parent.id, &output.id, &archives[0]] {
        let err = stat(&server, ALICE, id).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert!(err.message().contains(&receipt.id), "{}", err.message());
    }
    for key in &keys {
        let err = context
            .recall(proto::RecallRequest {
                session_id: s.id.clone(),
                key: key.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "recall {key}");
    }
    let stored = session_files(&server.data_dir(), &s.id);
    assert!(
        stored.is_empty(),
        "nothing of it is left on disk: {stored:?}"
    );

    // The receipt, fetched again, verifies offline with the CLI.
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("receipt.json");
    let fetched = command()
        .args(["--addr", &format!("http://{}", server.addr)])
        .args(["--token", AUDREY, "--json", "audit", "receipt", &receipt.id])
        .output()
        .unwrap();
    assert!(
        fetched.status.success(),
        "{}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    std::fs::write(&file, &fetched.stdout).unwrap();
    let verified = command()
        .args(["audit", "verify-receipt"])
        .arg(&file)
        .arg("--data-dir")
        .arg(server.data_dir())
        .output()
        .unwrap();
    assert!(
        verified.status.success(),
        "{}{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr)
    );
    // And a changed copy does not.
    let text = String::from_utf8(fetched.stdout).unwrap();
    std::fs::write(&file, text.replace("derived_payload", "payload")).unwrap();
    let tampered = command()
        .args(["audit", "verify-receipt"])
        .arg(&file)
        .arg("--data-dir")
        .arg(server.data_dir())
        .output()
        .unwrap();
    assert!(!tampered.status.success());
}

#[tokio::test]
async fn a_deletion_killed_midway_is_finished_at_the_next_start() {
    for point in ["deletion.after_intent", "deletion.after_files"] {
        let work = tempfile::tempdir().unwrap();
        let config = write_config(work.path());
        let data_dir = work.path().join("data");
        let log = work.path().join("server.log");
        let mut server = ProcessServer::start_with_env(
            Some(&config),
            &data_dir,
            log.clone(),
            &[("SPILLWAY_CRASH_AT", point)],
        )
        .await;
        let s = {
            let mut c = server.sessions(ALICE).await;
            c.create_session(proto::CreateSessionRequest::default())
                .await
                .unwrap()
                .into_inner()
        };
        let keep = {
            let mut c = server.sessions(ALICE).await;
            c.create_session(proto::CreateSessionRequest::default())
                .await
                .unwrap()
                .into_inner()
        };
        let mut client = server.payloads(ALICE).await;
        for i in 0..5 {
            upload(
                &mut client,
                header(&s.id, &format!("{i}.txt")),
                format!("{i}\n").as_bytes(),
            )
            .await
            .unwrap();
        }
        let kept = upload(&mut client, header(&keep.id, "k.txt"), b"kept\n")
            .await
            .unwrap();
        let err = server
            .sessions(ALICE)
            .await
            .delete_session(proto::DeleteSessionRequest {
                session_id: s.id.clone(),
                reason: "crash test".into(),
            })
            .await
            .unwrap_err();
        assert_ne!(err.code(), Code::Ok);
        let status = server.child.wait().unwrap();
        assert!(!status.success(), "{point}: the server aborted");
        assert!(
            std::fs::read_to_string(&log)
                .unwrap()
                .contains(&format!("SPILLWAY_CRASH_AT={point}")),
            "{point}: it crashed where asked"
        );

        let log2 = work.path().join("server2.log");
        let server = ProcessServer::start(Some(&config), &data_dir, log2.clone()).await;
        server.wait_for_log(
            "finishing a deletion interrupted by a crash",
            Duration::from_secs(5),
        );
        let err = server
            .sessions(ALICE)
            .await
            .get_session(proto::GetSessionRequest {
                session_id: s.id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{point}");
        assert!(
            err.message().contains("was deleted by alice"),
            "{}",
            err.message()
        );
        assert!(
            !data_dir.join(&s.id).exists(),
            "{point}: its directory is gone"
        );
        let receipt =
            AuditClient::with_interceptor(server.channel().await, Bearer(Some(AUDREY.into())))
                .get_receipt(proto::GetReceiptRequest {
                    receipt_id: String::new(),
                    target_id: s.id.clone(),
                })
                .await
                .unwrap()
                .into_inner();
        assert_eq!(receipt.deleted_payload_ids.len(), 5, "{point}");
        assert_eq!(
            download(&mut server.payloads(ALICE).await, &kept.id)
                .await
                .unwrap(),
            b"kept\n"
        );
        let verified =
            AuditClient::with_interceptor(server.channel().await, Bearer(Some(AUDREY.into())))
                .verify_audit(proto::VerifyAuditRequest {})
                .await
                .unwrap()
                .into_inner();
        assert!(verified.ok, "{point}: the audit chain verifies");
        drop(server);
    }
}

#[tokio::test]
async fn a_shorter_tenant_retention_applies_to_payloads_already_stored() {
    let clock = clock_now();
    let server = clocked(&clock).await;
    let s = create_session(&server, ALICE).await;
    let old = put(
        &server,
        &s.id,
        "old.txt",
        b"stored under the 7-day default\n",
    )
    .await;
    clock.advance(2 * HOUR);
    let young = put(&server, &s.id, "young.txt", b"stored just now\n").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(stat(&server, ALICE, &old.id).await.is_ok());

    PoliciesClient::with_interceptor(server.channel().await, Bearer(Some("tok-admin".into())))
        .set_policy(proto::SetPolicyRequest {
            tenant: "acme".into(),
            policy: Some(retention_hours(1)),
        })
        .await
        .unwrap();
    eventually("the payload older than the new retention goes", || {
        gone(&server, &old.id)
    })
    .await;
    let left = stat(&server, ALICE, &young.id).await.unwrap();
    let expires = left.expires_at.unwrap().seconds * 1000;
    assert!(
        expires <= clock.now_ms() + 3_600_000,
        "the young payload now expires within the hour"
    );
    clock.advance(HOUR);
    eventually("and then the young one", || gone(&server, &young.id)).await;
}
