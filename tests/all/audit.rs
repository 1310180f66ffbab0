//! The audit log through gRPC and the CLI: what each RPC appends, who may
//! read it, tenant isolation, filters and paging, verification after
//! tampering with the store, exports the Python verifier accepts, and
//! durability across `kill -9`.

use std::path::Path;
use std::process::Output;

use spillway::audit::event_key;
use spillway::proto::{self, Role, audit_client::AuditClient, block::Block};
use spillway::store::engine::{Engine, Tree};
use tonic::Code;

use crate::common::*;

const AUDREY: &str = "tok-audrey";
const CAROL: &str = "tok-carol";

async fn audit(server: &impl Connect, token: &str) -> AuditClient<Svc> {
    AuditClient::with_interceptor(server.channel().await, Bearer(Some(token.into())))
        .max_decoding_message_size(64 << 20)
}

/// Every event that matches `query`, through every page.
async fn query(
    server: &impl Connect,
    token: &str,
    mut query: proto::AuditQuery,
) -> Vec<proto::AuditEvent> {
    let mut client = audit(server, token).await;
    let mut events = Vec::new();
    loop {
        let page = client
            .query_audit(query.clone())
            .await
            .unwrap()
            .into_inner();
        events.extend(page.events);
        if page.next_page_token.is_empty() {
            return events;
        }
        query.page_token = page.next_page_token;
    }
}

/// The caller's tenant's whole chain so far (the query's own `audit.query`
/// event comes after it).
async fn chain(server: &impl Connect, token: &str) -> Vec<proto::AuditEvent> {
    query(server, token, proto::AuditQuery::default()).await
}

fn by_action(action: &str) -> proto::AuditQuery {
    proto::AuditQuery {
        action: action.into(),
        ..Default::default()
    }
}

async fn verify(server: &impl Connect, token: &str) -> proto::VerifyAuditResponse {
    audit(server, token)
        .await
        .verify_audit(proto::VerifyAuditRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The tenant's chain as `spillway audit export` writes it.
async fn export(server: &impl Connect, token: &str) -> String {
    let mut stream = audit(server, token)
        .await
        .export_audit(proto::ExportAuditRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut out = String::new();
    while let Some(e) = stream.message().await.unwrap() {
        out.push_str(&spillway::cli::event_from_proto(e).to_export_line());
        out.push('\n');
    }
    out
}

/// Runs `scripts/verify_audit.py` on an export file: its stdout and exit code.
fn python_verify(file: &Path) -> (String, Option<i32>) {
    let out = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/verify_audit.py"
        ))
        .arg(file)
        .output()
        .unwrap();
    (String::from_utf8(out.stdout).unwrap(), out.status.code())
}

fn actions(events: &[proto::AuditEvent]) -> Vec<&str> {
    events.iter().map(|e| e.action.as_str()).collect()
}

/// Asserts that `events` are a whole chain: seq 1, 2, … and every link
/// and hash right.
fn assert_whole_chain(events: &[proto::AuditEvent]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    let chain: Vec<_> = events
        .iter()
        .cloned()
        .map(spillway::cli::event_from_proto)
        .collect();
    let out = spillway::audit::verify(chain);
    assert!(out.ok, "{out:?}");
}

/// Opens the stopped server's metadata engine as the server would: with
/// the audit journal replayed into it, since a server killed with `kill -9`
/// may have acknowledged events that only the journal holds.
async fn open_engine(data_dir: &Path) -> std::sync::Arc<dyn Engine> {
    let engine: std::sync::Arc<dyn Engine> = open_bare_engine(data_dir).await.into();
    let clock = std::sync::Arc::new(spillway::clock::SystemClock);
    let journal = data_dir.join(spillway::server::AUDIT_JOURNAL);
    let (log, _replayed) =
        spillway::audit::AuditLog::with_journal(engine.clone(), clock, &journal).unwrap();
    drop(log);
    engine
}

/// Opens the stopped server's metadata engine. The engines lock their
/// files, and the last reference to the server's store may be dropped a
/// moment after the server stopped, so this waits for the lock.
async fn open_bare_engine(data_dir: &Path) -> Box<dyn Engine> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let opened: Result<Box<dyn Engine>, _> = match engine() {
            spillway::config::EngineKind::Redb => spillway::store::RedbEngine::open(
                &data_dir.join("meta.redb"),
                spillway::store::engine::DEFAULT_CACHE_BYTES,
            )
            .map(|e| Box::new(e) as Box<dyn Engine>),
            spillway::config::EngineKind::Sled => spillway::store::SledEngine::open(
                &data_dir.join("meta.sled"),
                spillway::store::engine::DEFAULT_CACHE_BYTES,
            )
            .map(|e| Box::new(e) as Box<dyn Engine>),
            spillway::config::EngineKind::Postgres => spillway::store::PostgresEngine::open(
                &spillway::store::PostgresSettings::new(crate::common::postgres_url_for(data_dir)),
            )
            .map(|e| Box::new(e) as Box<dyn Engine>),
        };
        match opened {
            Ok(engine) => return engine,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("waiting for the store's lock: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot open the store: {e}"),
        }
    }
}

/// Flips one byte of acme's stored event `seq`: the first `alice` in its
/// JSON becomes `alicf`.
/// A server whose log holds five events (seq 1 to 5): Alice's new session
/// and her four uploads.
async fn server_with_five_events() -> TestServer {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await;
    let mut payloads = server.payloads(ALICE).await;
    for i in 0..4 {
        upload(&mut payloads, header(&s.id, &format!("{i}.txt")), b"x\n")
            .await
            .unwrap();
    }
    server
}

async fn flip_a_byte(data_dir: &Path, seq: u64) {
    let engine = open_engine(data_dir).await;
    let key = event_key("acme", seq);
    let mut raw = engine.get(Tree::Audit, &key).unwrap().expect("the event");
    let at = raw
        .windows(5)
        .position(|w| w == b"alice")
        .expect("alice in it");
    raw[at + 4] = b'f';
    engine.put(Tree::Audit, &key, &raw).unwrap();
    engine.flush().unwrap();
}

async fn delete_event(data_dir: &Path, seq: u64) {
    let engine = open_engine(data_dir).await;
    assert!(
        engine
            .get(Tree::Audit, &event_key("acme", seq))
            .unwrap()
            .is_some()
    );
    engine.delete(Tree::Audit, &event_key("acme", seq)).unwrap();
    engine.flush().unwrap();
}

/// A history whose old results compaction archives.
fn history(turns: usize) -> Vec<proto::Message> {
    let mut messages = Vec::new();
    for turn in 1..=turns {
        let id = format!("c{turn}");
        messages.push(proto::Message {
            role: Role::Assistant as i32,
            blocks: vec![proto::Block {
                block: Some(Block::ToolUse(proto::ToolUseBlock {
                    id: id.clone(),
                    name: "read_file".into(),
                    input_json: "{}".into(),
                })),
            }],
        });
        let content: String = (0..200)
            .map(|i| format!("line {i} of turn {turn}: SECRET-HISTORY\n"))
            .collect();
        messages.push(proto::Message {
            role: Role::Tool as i32,
            blocks: vec![proto::Block {
                block: Some(Block::ToolResult(proto::ToolResultBlock {
                    tool_use_id: id,
                    content,
                    ..Default::default()
                })),
            }],
        });
    }
    messages
}

#[tokio::test]
async fn every_security_relevant_rpc_appends_exactly_its_events_in_one_gapless_chain() {
    let server = TestServer::start().await;
    let content = b"{\"token\": \"SECRET-CONTENT-7f3a\"}\n{\"n\": 2}\n";
    let sha = sha256_hex(content);
    let mut sessions = server.sessions(ALICE).await;
    let mut payloads = server.payloads(ALICE).await;

    let s = sessions
        .create_session(proto::CreateSessionRequest {
            label: "SECRET-LABEL".into(),
            share_with: vec!["bob".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let p = upload(&mut payloads, header(&s.id, "a.json"), content)
        .await
        .unwrap();
    payloads
        .read(proto::ReadRequest {
            payload_id: p.id.clone(),
            max_bytes: 0,
            range: Some(proto::read_request::Range::LineRange(proto::LineRange {
                start_line: 1,
                end_line: 1,
            })),
        })
        .await
        .unwrap();
    payloads
        .inspect(proto::PayloadRequest {
            payload_id: p.id.clone(),
        })
        .await
        .unwrap();
    let found = payloads
        .search(proto::SearchRequest {
            session_id: s.id.clone(),
            pattern: "SECRET-CONTENT".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.matches.len(), 1);
    download(&mut payloads, &p.id).await.unwrap();
    let big = "SECRET-BIG ".repeat(4000);
    let turn = payloads
        .offload(proto::OffloadRequest {
            session_id: s.id.clone(),
            turn: 1,
            results: vec![
                proto::ToolResult {
                    tool_call_id: "call_1".into(),
                    tool_name: "small".into(),
                    content: "SECRET-SMALL".into(),
                    ..Default::default()
                },
                proto::ToolResult {
                    tool_call_id: "call_2".into(),
                    tool_name: "big".into(),
                    content: big.clone().into(),
                    ..Default::default()
                },
            ],
            settings: None,
        })
        .await
        .unwrap()
        .into_inner();
    let offloaded = turn.outcomes[1].payload.clone().expect("offloaded");
    assert!(
        turn.outcomes[0].payload.is_none(),
        "the small one stays inline"
    );
    let ran = server
        .codemode(ALICE)
        .await
        .exec(proto::ExecRequest {
            session_id: s.id.clone(),
            runtime: "wasm".into(),
            source: "(module (func (export \"_start\")))".into(),
            args: vec!["SECRET-ARG".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ran.status, proto::ExecStatus::Ok as i32, "{}", ran.message);
    let receipt = payloads
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: p.id.clone(),
            reason: "SECRET-REASON".into(),
        })
        .await
        .unwrap()
        .into_inner();
    sessions
        .close_session(proto::CloseSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap();
    let gone = sessions
        .delete_session(proto::DeleteSessionRequest {
            session_id: s.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    // Metadata reads are not audited.
    sessions
        .list_sessions(proto::ListSessionsRequest::default())
        .await
        .unwrap();

    let events = chain(&server, AUDREY).await;
    assert_eq!(
        actions(&events),
        [
            "session.create",
            "payload.upload",
            "payload.read",
            "payload.inspect",
            "payload.search",
            "payload.download",
            "payload.offload",
            "exec.run",
            "payload.delete",
            "session.close",
            "session.delete",
        ]
    );
    assert_whole_chain(&events);
    assert_eq!(events[0].prev_hash, "0".repeat(64));
    for e in &events {
        assert_eq!(
            (e.principal.as_str(), e.tenant.as_str(), e.outcome.as_str()),
            ("alice", "acme", "ok")
        );
        assert_eq!(e.session_id, s.id, "{}", e.action);
        assert!(e.time.ends_with('Z') && e.time.len() == 24, "{}", e.time);
        // Neither content, nor labels, patterns, arguments or reasons.
        let line = spillway::cli::event_from_proto(e.clone()).to_export_line();
        assert!(!line.contains("SECRET"), "{line}");
    }
    assert_eq!(events[0].detail, "share_with=bob");
    for e in [&events[1], &events[2], &events[3], &events[5]] {
        assert_eq!(
            (e.payload_id.as_str(), e.content_sha256.as_str()),
            (p.id.as_str(), sha.as_str()),
            "{}",
            e.action
        );
    }
    assert_eq!(
        (
            events[4].payload_id.as_str(),
            events[4].content_sha256.as_str()
        ),
        ("", "")
    );
    assert_eq!(events[1].detail, format!("bytes={}", content.len()));
    assert!(
        events[2].detail.contains("lines=1-1"),
        "{}",
        events[2].detail
    );
    assert_eq!(events[4].detail, "payloads=all matches=1 truncated=false");
    assert_eq!(events[6].payload_id, offloaded.id);
    assert_eq!(events[6].content_sha256, sha256_hex(big.as_bytes()));
    assert!(
        events[6].detail.contains("reason=per_call"),
        "{}",
        events[6].detail
    );
    assert_eq!(events[7].payload_id, "");
    assert!(
        events[7]
            .detail
            .starts_with("runtime=wasm status=ok exit_code=0"),
        "{}",
        events[7].detail
    );
    assert_eq!(events[8].payload_id, p.id);
    assert_eq!(events[8].content_sha256, sha);
    assert!(
        events[8].detail.contains(&receipt.id),
        "{}",
        events[8].detail
    );
    assert!(
        events[10].detail.contains(&gone.id),
        "{}",
        events[10].detail
    );

    // Reading the log is audited too, after what it read.
    let again = chain(&server, AUDREY).await;
    assert_eq!(again.len(), 12);
    assert_eq!(again[..11], events[..]);
    assert_eq!(
        (again[11].action.as_str(), again[11].principal.as_str()),
        ("audit.query", "audrey")
    );
    assert_eq!(again[11].detail, "events=11 filters=none");

    let v = verify(&server, CAROL).await;
    assert!(v.ok, "{v:?}");
    assert_eq!((v.events_checked, v.first_bad_seq, v.head_seq), (13, 0, 13));
    assert_eq!(v.head_hash.len(), 64);
}

#[tokio::test]
async fn history_compaction_and_recall_are_audited_with_the_archive() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await;
    let mut client = spillway::proto::context_client::ContextClient::with_interceptor(
        server.channel().await,
        Bearer(Some(ALICE.into())),
    )
    .max_decoding_message_size(64 << 20);
    let reply = client
        .compact_history(proto::CompactHistoryRequest {
            session_id: s.id.clone(),
            messages: history(6),
            current_turn: 6,
            settings: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let report = reply.report.unwrap();
    assert!(!report.archived_keys.is_empty());
    let key = report.archived_keys[0].clone();
    let recalled = client
        .recall(proto::RecallRequest {
            session_id: s.id.clone(),
            key: key.clone(),
        })
        .await
        .unwrap()
        .into_inner();

    let events = query(
        &server,
        AUDREY,
        proto::AuditQuery {
            session_id: s.id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        actions(&events),
        ["session.create", "history.compact", "history.recall"]
    );
    assert!(
        events[1]
            .detail
            .starts_with(&format!("archived={} ", report.archived_keys.len())),
        "{}",
        events[1].detail
    );
    assert_eq!(events[2].payload_id, recalled.payload_id);
    assert_eq!(
        events[2].content_sha256,
        sha256_hex(recalled.content.as_bytes())
    );
    assert!(events[2].detail.starts_with(&format!("key={key} ")));
    assert!(events.iter().all(|e| !e.detail.contains("SECRET")));
}

#[tokio::test]
async fn agents_may_not_read_the_log_and_every_refusal_is_audited() {
    let server = TestServer::start().await;
    let (s, p) = session_with_payload(&server, ALICE, "a.txt", b"x\n").await;

    let mut agent = audit(&server, ALICE).await;
    let denied = [
        agent
            .query_audit(proto::AuditQuery::default())
            .await
            .unwrap_err(),
        agent
            .verify_audit(proto::VerifyAuditRequest {})
            .await
            .unwrap_err(),
        agent
            .export_audit(proto::ExportAuditRequest {})
            .await
            .unwrap_err(),
    ];
    for status in &denied {
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(status.message().contains("auditor"), "{}", status.message());
    }
    // Compliance may see the session but not read content; the auditor may
    // not touch sessions at all.
    let read = server
        .payloads(CAROL)
        .await
        .read(proto::ReadRequest {
            payload_id: p.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(read.code(), Code::PermissionDenied);
    let create = server
        .sessions(AUDREY)
        .await
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(create.code(), Code::PermissionDenied);
    // A principal without a token is not one: nothing to attribute.
    let anonymous = server
        .anonymous_payloads()
        .await
        .stat(proto::PayloadRequest {
            payload_id: p.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);

    let events = query(&server, AUDREY, by_action("access.denied")).await;
    let who: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.principal.as_str(), e.detail.split(':').next().unwrap()))
        .collect();
    assert_eq!(
        who,
        [
            ("alice", "spillway.v1.Audit/QueryAudit"),
            ("alice", "spillway.v1.Audit/VerifyAudit"),
            ("alice", "spillway.v1.Audit/ExportAudit"),
            ("carol", "spillway.v1.Payloads/Read"),
            ("audrey", "spillway.v1.Sessions/CreateSession"),
        ]
    );
    for e in &events {
        assert_eq!((e.outcome.as_str(), e.tenant.as_str()), ("denied", "acme"));
    }
    // Carol may see the session, so her refusal names what she tried.
    assert_eq!(
        (events[3].session_id.as_str(), events[3].payload_id.as_str()),
        (s.id.as_str(), p.id.as_str())
    );
    assert_eq!(events[0].session_id, "");
    assert_whole_chain(&chain(&server, AUDREY).await);
}

#[tokio::test]
async fn another_tenant_sees_none_of_acmes_events_and_its_probes_name_nothing_of_acme() {
    let server = TestServer::start().await;
    let (s, p) = session_with_payload(&server, ALICE, "a.txt", b"x\n").await;
    let mut mallory = server.payloads(MALLORY).await;
    for id in [
        p.id.clone(),
        spillway::ids::PayloadId::generate().to_string(),
    ] {
        let err = mallory
            .read(proto::ReadRequest {
                payload_id: id,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
    }
    let err = server
        .sessions(MALLORY)
        .await
        .get_session(proto::GetSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let own = create_session(&server, MALLORY).await;

    let theirs = chain(&server, MALLORY).await;
    assert_eq!(
        actions(&theirs),
        [
            "access.denied",
            "access.denied",
            "access.denied",
            "session.create"
        ]
    );
    assert_whole_chain(&theirs);
    for e in &theirs {
        assert_eq!(
            (e.tenant.as_str(), e.principal.as_str()),
            ("other", "mallory")
        );
        let line = spillway::cli::event_from_proto(e.clone()).to_export_line();
        assert!(
            !line.contains(&s.id) && !line.contains(&p.id) && !line.contains("alice"),
            "{line}"
        );
    }
    // A payload of another tenant and an unknown one leave the same trace.
    let strip = |e: &proto::AuditEvent| {
        (
            e.action.clone(),
            e.session_id.clone(),
            e.payload_id.clone(),
            e.detail.clone(),
            e.outcome.clone(),
        )
    };
    assert_eq!(strip(&theirs[0]), strip(&theirs[1]));
    assert_eq!(theirs[3].session_id, own.id);
    assert!(verify(&server, MALLORY).await.ok);

    let ours = chain(&server, AUDREY).await;
    assert_eq!(actions(&ours), ["session.create", "payload.upload"]);
    assert!(ours.iter().all(|e| e.tenant == "acme"));
}

#[tokio::test]
async fn queries_filter_by_session_payload_principal_action_and_time_and_page_by_seq() {
    let server = TestServer::start_with(|c| c.limits.max_page_size = 3).await;
    let s1 = create_session(&server, ALICE).await;
    let s2 = create_session(&server, BOB).await;
    let p1 = upload(
        &mut server.payloads(ALICE).await,
        header(&s1.id, "a.txt"),
        b"a\n",
    )
    .await
    .unwrap();
    upload(
        &mut server.payloads(BOB).await,
        header(&s2.id, "b.txt"),
        b"b\n",
    )
    .await
    .unwrap();
    let mut alice = server.payloads(ALICE).await;
    for _ in 0..2 {
        alice
            .read(proto::ReadRequest {
                payload_id: p1.id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let last = upload(&mut alice, header(&s1.id, "c.txt"), b"c\n")
        .await
        .unwrap();

    let seqs =
        |events: Vec<proto::AuditEvent>| -> Vec<u64> { events.iter().map(|e| e.seq).collect() };
    let by_session = proto::AuditQuery {
        session_id: s1.id.clone(),
        ..Default::default()
    };
    assert_eq!(
        seqs(query(&server, CAROL, by_session).await),
        [1, 3, 5, 6, 7]
    );
    let by_payload = proto::AuditQuery {
        payload_id: p1.id.clone(),
        ..Default::default()
    };
    assert_eq!(seqs(query(&server, CAROL, by_payload).await), [3, 5, 6]);
    let by_principal = proto::AuditQuery {
        principal: "bob".into(),
        ..Default::default()
    };
    assert_eq!(seqs(query(&server, CAROL, by_principal).await), [2, 4]);
    assert_eq!(
        seqs(query(&server, CAROL, by_action("payload.read")).await),
        [5, 6]
    );
    let both = proto::AuditQuery {
        principal: "alice".into(),
        ..by_action("payload.upload")
    };
    assert_eq!(seqs(query(&server, CAROL, both).await), [3, 7]);

    // Time: since is inclusive, until exclusive; together they split the log.
    let all: Vec<proto::AuditEvent> = chain(&server, CAROL).await.into_iter().take(7).collect();
    let at = humantime::parse_rfc3339(&all[6].time).unwrap();
    let since_epoch = at.duration_since(std::time::UNIX_EPOCH).unwrap();
    let ts = pbjson_types::Timestamp {
        seconds: since_epoch.as_secs() as i64,
        nanos: since_epoch.subsec_nanos() as i32,
    };
    let since = proto::AuditQuery {
        since: Some(ts),
        ..by_action("payload.upload")
    };
    assert_eq!(seqs(query(&server, CAROL, since).await), [7]);
    let until = proto::AuditQuery {
        until: Some(ts),
        ..by_action("payload.upload")
    };
    assert_eq!(seqs(query(&server, CAROL, until).await), [3, 4]);
    assert_eq!(all[6].payload_id, last.id);

    // Pages of at most max_page_size (3), in seq order, each event once,
    // although every page appends an audit.query event of its own.
    let mut client = audit(&server, CAROL).await;
    let mut token = String::new();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = client
            .query_audit(proto::AuditQuery {
                page_size: 100,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.events.len() <= 3);
        seen.extend(page.events);
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert!(pages >= 5, "{pages} pages");
    assert_whole_chain(&seen);
    assert!(seen.len() >= 7 + 8, "{} events", seen.len());

    for bad in [
        proto::AuditQuery {
            page_token: "not-a-token".into(),
            ..Default::default()
        },
        by_action("payload.reed"),
        proto::AuditQuery {
            session_id: "ses_short".into(),
            ..Default::default()
        },
    ] {
        let err = client.query_audit(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }
}

#[tokio::test]
async fn verify_names_an_event_altered_in_the_store_and_so_does_the_python_verifier() {
    let server = server_with_five_events().await;
    assert!(verify(&server, AUDREY).await.ok);
    let (dir, config) = server.stop().await;
    flip_a_byte(&config.data_dir, 3).await;

    let server = TestServer::start_in(dir, config).await;
    let v = verify(&server, AUDREY).await;
    assert_eq!(
        (v.ok, v.first_bad_seq, v.events_checked, v.head_seq),
        (false, 3, 2, 6)
    );
    // The altered event is still served, as stored, and an export of it
    // fails independent verification at the same seq.
    let events = chain(&server, AUDREY).await;
    assert_eq!(events[2].principal, "alicf");
    let file = server.dir.path().join("audit.jsonl");
    std::fs::write(&file, export(&server, AUDREY).await).unwrap();
    assert_eq!(python_verify(&file), ("bad at seq 3\n".into(), Some(1)));
}

#[tokio::test]
async fn verify_names_a_cut_off_tail_and_a_deleted_event() {
    let server = server_with_five_events().await;
    let (dir, config) = server.stop().await;
    // The last event (5): the chain left over is valid, but ends short of
    // the stored head.
    delete_event(&config.data_dir, 5).await;
    let server = TestServer::start_in(dir, config).await;
    let v = verify(&server, AUDREY).await;
    assert_eq!((v.ok, v.first_bad_seq, v.events_checked), (false, 5, 4));
    // Appends go on after the head, never into the hole.
    let after = chain(&server, AUDREY).await;
    assert_eq!(
        after.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 6]
    );

    let (dir, config) = server.stop().await;
    delete_event(&config.data_dir, 2).await;
    let server = TestServer::start_in(dir, config).await;
    let v = verify(&server, AUDREY).await;
    assert_eq!((v.ok, v.first_bad_seq, v.events_checked), (false, 2, 1));
    let file = server.dir.path().join("audit.jsonl");
    std::fs::write(&file, export(&server, AUDREY).await).unwrap();
    assert_eq!(python_verify(&file), ("bad at seq 2\n".into(), Some(1)));
}

fn cli(server: &ProcessServer, token: &str, args: &[&str]) -> Output {
    command()
        .args(args)
        .env("SPILLWAY_ADDR", server.addr.to_string())
        .env("SPILLWAY_TOKEN", token)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_exports_a_chain_python_verifies_and_verify_exits_1_once_it_is_broken() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config(dir.path());
    let log = dir.path().join("server.log");
    let mut server = ProcessServer::start(Some(&config), &data_dir, log.clone()).await;
    let s = server
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    upload(
        &mut server.payloads(ALICE).await,
        header(&s.id, "a.txt"),
        "ünïcode\u{2028}\n".as_bytes(),
    )
    .await
    .unwrap();

    let file = dir.path().join("audit.jsonl");
    let out = cli(
        &server,
        AUDREY,
        &["audit", "export", "-o", file.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // session.create, payload.upload, and the export's own audit.query.
    assert_eq!(python_verify(&file), ("ok 3\n".into(), Some(0)));
    let lines = std::fs::read_to_string(&file).unwrap();
    assert!(
        lines
            .lines()
            .last()
            .unwrap()
            .contains("\"detail\":\"export\"")
    );

    let out = cli(&server, AUDREY, &["audit", "verify"]);
    assert!(out.status.success());
    assert!(
        stdout(&out).starts_with("ok: 3 events verified; head seq 3 hash "),
        "{}",
        stdout(&out)
    );

    let out = cli(
        &server,
        CAROL,
        &[
            "audit",
            "query",
            "--action",
            "payload.upload",
            "--session",
            &s.id,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("alice  payload.upload  ok") && text.contains("bytes=13"),
        "{text}"
    );
    let out = cli(
        &server,
        CAROL,
        &[
            "audit",
            "query",
            "--limit",
            "2",
            "--since",
            "2000-01-01T00:00:00Z",
        ],
    );
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
    let out = cli(
        &server,
        CAROL,
        &["--json", "audit", "query", "--principal", "audrey"],
    );
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["principal"] == "audrey")
    );
    let out = cli(&server, CAROL, &["audit", "query", "--since", "yesterday"]);
    assert!(!out.status.success());

    let out = cli(&server, ALICE, &["audit", "verify"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("PermissionDenied"));

    server.kill9();
    flip_a_byte(&data_dir, 1).await;
    let server = ProcessServer::start(Some(&config), &data_dir, log).await;
    let out = cli(&server, AUDREY, &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("BROKEN at seq 1:"),
        "{}",
        stdout(&out)
    );
    let out = cli(
        &server,
        AUDREY,
        &["audit", "export", "-o", file.to_str().unwrap()],
    );
    assert!(out.status.success());
    assert_eq!(python_verify(&file), ("bad at seq 1\n".into(), Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_call_is_in_the_log_even_when_the_server_is_killed_right_after() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config(dir.path());
    let log = dir.path().join("server.log");
    let mut acked = Vec::new();
    for round in 0..3 {
        let mut server = ProcessServer::start(Some(&config), &data_dir, log.clone()).await;
        let mut payloads = server.payloads(ALICE).await;
        let s = server
            .sessions(ALICE)
            .await
            .create_session(proto::CreateSessionRequest::default())
            .await
            .unwrap()
            .into_inner();
        for i in 0..5 {
            let p = upload(
                &mut payloads,
                header(&s.id, &format!("{round}-{i}.txt")),
                b"x\n",
            )
            .await
            .unwrap();
            acked.push(p.id);
        }
        // No grace: the reply is all the server gets to send.
        server.kill9();
    }
    let server = ProcessServer::start(Some(&config), &data_dir, log).await;
    let uploads = query(&server, AUDREY, by_action("payload.upload")).await;
    let logged: Vec<String> = uploads.into_iter().map(|e| e.payload_id).collect();
    assert_eq!(logged, acked);
    let v = verify(&server, AUDREY).await;
    assert!(v.ok, "{v:?}");
}

/// Swaps the stored events `a` and `b` of acme's chain.
async fn swap_events(data_dir: &Path, a: u64, b: u64) {
    let engine = open_engine(data_dir).await;
    let (ka, kb) = (event_key("acme", a), event_key("acme", b));
    let va = engine.get(Tree::Audit, &ka).unwrap().expect("event a");
    let vb = engine.get(Tree::Audit, &kb).unwrap().expect("event b");
    engine.put(Tree::Audit, &ka, &vb).unwrap();
    engine.put(Tree::Audit, &kb, &va).unwrap();
    engine.flush().unwrap();
}

#[tokio::test]
async fn reordered_events_in_the_store_or_an_export_and_edited_or_deleted_export_lines_are_caught()
{
    let server = server_with_five_events().await;
    // An export (it ends with its own audit.query event) and three
    // tampered copies of it, each caught by the independent verifier at
    // the first changed seq.
    let text = export(&server, AUDREY).await;
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 5);
    let dir = tempfile::tempdir().unwrap();
    let check = |name: &str, lines: Vec<String>, want: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        assert_eq!(python_verify(&file), (want.to_owned(), Some(1)), "{name}");
    };
    let owned = || lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    let mut edited = owned();
    edited[2] = edited[2].replace("payload.upload", "payload.uploat");
    check("edited.jsonl", edited, "bad at seq 3\n");
    let mut deleted = owned();
    deleted.remove(1);
    check("deleted.jsonl", deleted, "bad at seq 2\n");
    let mut reordered = owned();
    reordered.swap(2, 3);
    check("reordered.jsonl", reordered, "bad at seq 3\n");

    // The same reorder in the store: VerifyAudit names the first moved seq.
    let (dir, config) = server.stop().await;
    swap_events(&config.data_dir, 3, 4).await;
    let server = TestServer::start_in(dir, config).await;
    let v = verify(&server, AUDREY).await;
    assert_eq!((v.ok, v.first_bad_seq), (false, 3));
}

#[tokio::test]
async fn queries_filter_by_outcome_and_a_refused_policy_loosening_is_on_the_record() {
    let server = TestServer::start().await;
    let mut policies = spillway::proto::policies_client::PoliciesClient::with_interceptor(
        server.channel().await,
        Bearer(Some(CAROL.into())),
    );
    let locked = proto::Policy {
        retention: Some(pbjson_types::Duration {
            seconds: 3 * 86_400,
            nanos: 0,
        }),
        locked: true,
        ..Default::default()
    };
    let set = |policy: proto::Policy| proto::SetPolicyRequest {
        tenant: "acme".into(),
        policy: Some(policy),
    };
    policies.set_policy(set(locked.clone())).await.unwrap();
    let looser = proto::Policy {
        retention: Some(pbjson_types::Duration {
            seconds: 30 * 86_400,
            nanos: 0,
        }),
        ..locked
    };
    let err = policies.set_policy(set(looser)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    let errors = query(
        &server,
        AUDREY,
        proto::AuditQuery {
            outcome: "error".into(),
            ..by_action("policy.set")
        },
    )
    .await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].principal, "carol");
    assert!(errors[0].detail.contains("policy.retention"), "{errors:?}");
    let oks = query(
        &server,
        AUDREY,
        proto::AuditQuery {
            outcome: "ok".into(),
            ..by_action("policy.set")
        },
    )
    .await;
    assert_eq!(oks.len(), 1, "{oks:?}");

    let err = audit(&server, AUDREY)
        .await
        .query_audit(proto::AuditQuery {
            outcome: "fine".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("ok, denied, error"),
        "{}",
        err.message()
    );
}
