//! Redaction end to end: a tenant policy and a session policy that together
//! name all five built-ins and a custom regex, then secrets sent through
//! every way content comes in (a chunked Upload whose chunks cut every
//! secret in two, Offload results that stay inline and that are offloaded,
//! CompactHistory and RepairHistory, Exec stdout and `/out`), and a search
//! for the secrets everywhere they could end up: every file under the data
//! directory (payload bytes, the metadata database, the audit tree), every
//! reply (previews, notices, Read, Search, Inspect, Recall), the server's
//! log, and the audit events. The counts must be in the payloads' metadata
//! and the audit details.
//!
//! That an Upload is redacted in bounded memory, and gives the same bytes
//! however it is chunked, is the redaction library's to show: see
//! `a_stream_holds_at_most_one_window_whatever_the_chunk_size` and
//! `stream_equals_one_shot_for_random_chunkings_of_large_input` in
//! `src/redact/stream.rs`. The server feeds it chunk by chunk.

use std::collections::HashMap;
use std::path::Path;

use spillway::proto::{
    self, Disposition, audit_client::AuditClient, block::Block, context_client::ContextClient,
    policies_client::PoliciesClient, upload_chunk::Chunk,
};
use tonic::Code;

use crate::common::*;

const ADMIN: &str = "tok-admin";
const AUDREY: &str = "tok-audrey";

const AWS_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
const BEARER: &str = "eyJhbGciOiJIUzI1NiJ9.c3B3LXRlc3Q.Zm9vYmFyYmF6";
const PEM_LINE: &str = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun";
const EMAIL: &str = "jane.doe@example.com";
const CARD: &str = "4111 1111 1111 1111";
const NOT_A_CARD: &str = "4111 1111 1111 1112";
const CUSTOM_SECRET: &str = "spw-secret-7f3a9c";
const CUSTOM_RULE: &str = "spw-secret-[0-9a-f]{6}";

/// What must appear nowhere.
const SECRETS: [&str; 7] = [
    AWS_KEY,
    BEARER,
    PEM_LINE,
    "BEGIN RSA PRIVATE KEY",
    EMAIL,
    CARD,
    CUSTOM_SECRET,
];

/// Every rule name, as counts and markers name them.
const RULES: [&str; 6] = [
    "aws_access_key",
    "bearer_token",
    "private_key",
    "email",
    "credit_card",
    "custom",
];

fn pem(newline: &str) -> String {
    let body = [PEM_LINE; 4].join(newline);
    format!("-----BEGIN RSA PRIVATE KEY-----{newline}{body}{newline}-----END RSA PRIVATE KEY-----")
}

/// One of each secret (and a Luhn-invalid number that must stay).
fn secrets_block(i: usize) -> String {
    format!(
        "record {i}\naws_access_key_id = {AWS_KEY}\nAuthorization: Bearer {BEARER}\n{}\ncontact: {EMAIL}\ncard: {CARD}\nnot a card: {NOT_A_CARD}\nticket {CUSTOM_SECRET}\n",
        pem("\n")
    )
}

/// `blocks` secret blocks, each after about 8 KiB of filler, so that the
/// whole spans several of the redactor's 64 KiB windows.
fn document(blocks: usize) -> String {
    let filler = "lorem ipsum dolor sit amet, consectetur adipiscing elit\n".repeat(150);
    (0..blocks)
        .map(|i| format!("{filler}{}", secrets_block(i)))
        .collect()
}

/// Counts of `n` of each rule.
fn each(n: u64) -> HashMap<String, u64> {
    RULES.iter().map(|r| ((*r).to_owned(), n)).collect()
}

/// The audit detail of `n` of each rule.
fn each_detail(n: u64) -> String {
    let mut names = RULES;
    names.sort();
    let by_rule: Vec<String> = names.iter().map(|r| format!("{r}={n}")).collect();
    format!("redactions={} ({})", 6 * n, by_rule.join(","))
}

#[track_caller]
fn assert_clean(what: &str, haystack: &[u8]) {
    for s in SECRETS {
        assert!(
            memchr::memmem::find(haystack, s.as_bytes()).is_none(),
            "{what} holds the secret {s:?}"
        );
    }
}

/// Chunks of `data` cut in the middle of every occurrence of every secret,
/// and then some.
fn straddling_chunks(data: &[u8]) -> Vec<bytes::Bytes> {
    let mut cuts: Vec<usize> = SECRETS
        .iter()
        .flat_map(|s| memchr::memmem::find_iter(data, s.as_bytes()).map(move |at| at + s.len() / 2))
        .chain((1..data.len()).step_by(4093))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut chunks = Vec::new();
    let mut from = 0;
    for cut in cuts {
        chunks.push(bytes::Bytes::copy_from_slice(&data[from..cut]));
        from = cut;
    }
    chunks.push(bytes::Bytes::copy_from_slice(&data[from..]));
    chunks
}

async fn upload_chunks(
    server: &ProcessServer,
    header: proto::UploadHeader,
    chunks: Vec<bytes::Bytes>,
) -> Result<proto::Payload, tonic::Status> {
    let messages = std::iter::once(proto::UploadChunk {
        chunk: Some(Chunk::Header(header)),
    })
    .chain(chunks.into_iter().map(|d| proto::UploadChunk {
        chunk: Some(Chunk::Data(d)),
    }));
    server
        .payloads(ALICE)
        .await
        .upload(tokio_stream::iter(messages))
        .await
        .map(|r| r.into_inner())
}

fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn tool_result(id: &str, tool: &str, content: &str) -> proto::Block {
    proto::Block {
        block: Some(Block::ToolResult(proto::ToolResultBlock {
            tool_use_id: id.into(),
            content: content.into(),
            tool_name: tool.into(),
            ..Default::default()
        })),
    }
}

fn tool_use(id: &str, tool: &str) -> proto::Block {
    proto::Block {
        block: Some(Block::ToolUse(proto::ToolUseBlock {
            id: id.into(),
            name: tool.into(),
            input_json: "{}".into(),
        })),
    }
}

fn message(role: proto::Role, blocks: Vec<proto::Block>) -> proto::Message {
    proto::Message {
        role: role as i32,
        blocks,
    }
}

fn result_contents(messages: &[proto::Message]) -> Vec<String> {
    messages
        .iter()
        .flat_map(|m| &m.blocks)
        .filter_map(|b| match &b.block {
            Some(Block::ToolResult(r)) => Some(r.content.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_storage_replies_logs_or_audit_and_counts_are_recorded()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data");
    let config = write_config(dir.path());
    let log = dir.path().join("server.log");
    let mut server = ProcessServer::start_with_env(
        Some(&config),
        &data_dir,
        log.clone(),
        &[("RUST_LOG", "info,spillway=debug")],
    )
    .await;
    let channel = server.channel().await;
    let bearer = |t: &str| Bearer(Some(t.into()));

    // Three built-ins from the tenant, the rest from the session: the
    // effective rules are the union.
    PoliciesClient::with_interceptor(channel.clone(), bearer(ADMIN))
        .set_policy(proto::SetPolicyRequest {
            tenant: "acme".into(),
            policy: Some(proto::Policy {
                redact: vec![
                    "builtin:aws_access_key".into(),
                    "builtin:bearer_token".into(),
                    "builtin:private_key".into(),
                ],
                ..Default::default()
            }),
        })
        .await?;
    let mut sessions = server.sessions(ALICE).await;
    let create = |redact: Vec<String>| proto::CreateSessionRequest {
        label: "redaction".into(),
        policy: Some(proto::Policy {
            redact,
            ..Default::default()
        }),
        ..Default::default()
    };
    // Rules are checked before a session exists: a bad regex, and a union
    // over the rule limit, are refused.
    let err = sessions
        .create_session(create(vec!["(unclosed".into()]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("policy.redact"), "{err:?}");
    let many = (0..62).map(|i| format!("x{i}y")).collect();
    let err = sessions.create_session(create(many)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("limit is 64"), "{err:?}");
    let session = sessions
        .create_session(create(vec![
            "builtin:email".into(),
            "builtin:credit_card".into(),
            CUSTOM_RULE.into(),
        ]))
        .await?
        .into_inner();
    let sid = session.id.clone();
    let effective = session.policy.clone().unwrap().redact;
    assert_eq!(effective.len(), 6, "{effective:?}");

    // Everything the server returns goes here, to be searched at the end.
    let mut replies: Vec<u8> = Vec::new();
    let mut keep = |what: &dyn std::fmt::Debug| replies.extend(format!("{what:?}").into_bytes());

    // Upload: 24 blocks, cut in the middle of every secret.
    const BLOCKS: u64 = 24;
    let doc = document(BLOCKS as usize);
    let chunks = straddling_chunks(doc.as_bytes());
    assert!(chunks.len() > 7 * BLOCKS as usize, "{}", chunks.len());
    let mut h = header(&sid, "secrets.txt");
    h.expected_sha256 = sha256_hex(doc.as_bytes());
    let uploaded = upload_chunks(&server, h, chunks.clone()).await?;
    keep(&uploaded);
    assert_eq!(uploaded.redactions, each(BLOCKS));
    let stored = download(&mut server.payloads(ALICE).await, &uploaded.id).await?;
    assert_clean("the uploaded payload", &stored);
    assert_eq!(
        uploaded.sha256,
        sha256_hex(&stored),
        "sha256 is the stored bytes'"
    );
    assert_eq!(uploaded.size_bytes, stored.len() as u64);
    let text = String::from_utf8(stored)?;
    for rule in RULES {
        assert_eq!(
            text.matches(&format!("[REDACTED:{rule}]")).count() as u64,
            BLOCKS,
            "{rule}"
        );
    }
    assert_eq!(text.matches(NOT_A_CARD).count() as u64, BLOCKS);
    // expected_sha256 is the sent bytes': the stored bytes' hash is refused,
    // and nothing of that upload is kept.
    let files_before = session_files(&data_dir, &sid);
    let mut h = header(&sid, "mismatch.txt");
    h.expected_sha256 = uploaded.sha256.clone();
    let err = upload_chunks(&server, h, chunks).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("nothing was stored"), "{err:?}");
    assert_eq!(session_files(&data_dir, &sid), files_before);

    // Offload: one result stays inline, one is offloaded; both redacted.
    let records: Vec<String> = (0..300)
        .map(|i| {
            format!(
                r#"{{"id":{i},"key":"{AWS_KEY}","auth":"Bearer {BEARER}","pem":"{}","email":"{EMAIL}","card":"{CARD}","other":"{NOT_A_CARD}","ticket":"{CUSTOM_SECRET}"}}"#,
                pem("\\n")
            )
        })
        .collect();
    let big = format!("[{}]", records.join(","));
    let small = secrets_block(0);
    let result = |id: &str, content: &str, content_type: &str| proto::ToolResult {
        tool_call_id: id.into(),
        tool_name: "fetch".into(),
        content: content.as_bytes().to_vec().into(),
        content_type: content_type.into(),
        is_error: false,
    };
    let turn = server
        .payloads(ALICE)
        .await
        .offload(proto::OffloadRequest {
            session_id: sid.clone(),
            turn: 1,
            results: vec![
                result("call_small", &small, "text/plain"),
                result("call_big", &big, "application/json"),
            ],
            settings: None,
        })
        .await?
        .into_inner();
    keep(&turn);
    let inline = &turn.outcomes[0];
    assert_eq!(inline.disposition, Disposition::Inline as i32);
    assert_eq!(inline.redactions, each(1));
    assert!(inline.content.contains("[REDACTED:private_key]"));
    assert!(
        inline.content.contains(NOT_A_CARD),
        "a Luhn-invalid number stays"
    );
    let offloaded = &turn.outcomes[1];
    assert_eq!(offloaded.disposition, Disposition::Offloaded as i32);
    let big_payload = offloaded.payload.clone().unwrap();
    assert_eq!(big_payload.redactions, each(300));
    assert_eq!(offloaded.redactions, each(300));
    assert!(
        offloaded.preview.contains("[REDACTED:"),
        "{}",
        offloaded.preview
    );

    // CompactHistory: a big result is archived and cut down; what comes
    // back, and what Recall finds, is redacted.
    let archived_text = document(4);
    let history = vec![
        message(
            proto::Role::User,
            vec![proto::Block {
                block: Some(Block::Text("read it".into())),
            }],
        ),
        message(proto::Role::Assistant, vec![tool_use("t1", "read_file")]),
        message(
            proto::Role::Tool,
            vec![tool_result("t1", "read_file", &archived_text)],
        ),
        message(
            proto::Role::Assistant,
            vec![proto::Block {
                block: Some(Block::Text("done".into())),
            }],
        ),
    ];
    let mut context = ContextClient::with_interceptor(channel.clone(), bearer(ALICE));
    let compacted = context
        .compact_history(proto::CompactHistoryRequest {
            session_id: sid.clone(),
            messages: history,
            ..Default::default()
        })
        .await?
        .into_inner();
    keep(&compacted);
    let report = compacted.report.clone().unwrap();
    assert_eq!(report.archived_keys.len(), 1, "{report:?}");
    assert_eq!(report.redactions, each(4));
    let recalled = context
        .recall(proto::RecallRequest {
            session_id: sid.clone(),
            key: report.archived_keys[0].clone(),
        })
        .await?
        .into_inner();
    keep(&recalled);
    assert_eq!(recalled.content.matches("[REDACTED:").count(), 4 * 6);
    let archive = server
        .payloads(ALICE)
        .await
        .stat(proto::PayloadRequest {
            payload_id: recalled.payload_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(archive.redactions, each(4));

    // RepairHistory has no session: the server's and the tenant's rules.
    let repaired = context
        .repair_history(proto::RepairHistoryRequest {
            messages: vec![
                message(proto::Role::Assistant, vec![tool_use("t9", "env")]),
                message(
                    proto::Role::Tool,
                    vec![tool_result(
                        "t9",
                        "env",
                        &format!("AWS_ACCESS_KEY_ID={AWS_KEY}\n{}\n", pem("\n")),
                    )],
                ),
            ],
            ..Default::default()
        })
        .await?
        .into_inner();
    keep(&repaired);
    assert_eq!(
        result_contents(&repaired.messages),
        vec!["AWS_ACCESS_KEY_ID=[REDACTED:aws_access_key]\n[REDACTED:private_key]\n"]
    );

    // Exec: stdout (the probe prints its args) and a kept /out file.
    let mut codemode = server.codemode(ALICE).await;
    let probe = |args: Vec<String>, keep_outputs: bool| proto::ExecRequest {
        session_id: sid.clone(),
        runtime: "wasm".into(),
        module: probe_module().into(),
        args,
        keep_outputs,
        inputs: vec![uploaded.id.clone()],
        ..Default::default()
    };
    let printed = codemode
        .exec(probe(
            ["args", AWS_KEY, EMAIL, CUSTOM_SECRET, NOT_A_CARD]
                .map(String::from)
                .to_vec(),
            false,
        ))
        .await?
        .into_inner();
    keep(&printed);
    assert_eq!(printed.redactions.values().sum::<u64>(), 3, "{printed:?}");
    assert!(
        printed
            .stdout
            .contains("[REDACTED:aws_access_key] [REDACTED:email] [REDACTED:custom] 4111"),
        "{printed:?}"
    );
    let written = codemode
        .exec(probe(
            vec!["out".into(), "result.txt".into(), secrets_block(7)],
            true,
        ))
        .await?
        .into_inner();
    keep(&written);
    assert_eq!(written.outputs.len(), 1, "{written:?}");
    assert_eq!(written.outputs[0].redactions, each(1));
    assert_eq!(written.redactions, each(1));

    // Read, Search and Inspect see only redacted bytes.
    let mut payloads = server.payloads(ALICE).await;
    let listed = payloads
        .list_payloads(proto::ListPayloadsRequest {
            session_id: sid.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    keep(&listed);
    assert_eq!(listed.payloads.len(), 4, "upload, offload, archive, /out");
    for p in &listed.payloads {
        assert!(!p.redactions.is_empty(), "{p:?}");
        let read = payloads
            .read(proto::ReadRequest {
                payload_id: p.id.clone(),
                max_bytes: 4 << 20,
                range: None,
            })
            .await?
            .into_inner();
        assert!(read.eof, "read {} whole", p.name);
        keep(&read);
        keep(
            &payloads
                .inspect(proto::PayloadRequest {
                    payload_id: p.id.clone(),
                })
                .await?
                .into_inner(),
        );
    }
    let search = |pattern: &str| proto::SearchRequest {
        session_id: sid.clone(),
        pattern: pattern.into(),
        fixed_string: true,
        max_matches: 10_000,
        ..Default::default()
    };
    for secret in SECRETS {
        let found = payloads.search(search(secret)).await?.into_inner();
        assert!(found.matches.is_empty(), "{secret}: {found:?}");
    }
    let found = payloads
        .search(search("[REDACTED:email]"))
        .await?
        .into_inner();
    assert!(
        found.matches.len() >= (BLOCKS + 4 + 1) as usize,
        "{found:?}"
    );
    keep(&found);
    assert_clean("the replies", &replies);

    // The audit events carry counts, never values.
    let mut audit = AuditClient::with_interceptor(channel.clone(), bearer(AUDREY));
    let events = audit
        .query_audit(proto::AuditQuery {
            page_size: 1000,
            ..Default::default()
        })
        .await?
        .into_inner()
        .events;
    assert_clean("the audit events", format!("{events:?}").as_bytes());
    let detail_of = |action: &str, payload: &str| {
        events
            .iter()
            .find(|e| e.action == action && e.payload_id == payload)
            .map(|e| e.detail.clone())
            .unwrap_or_else(|| panic!("no {action} event for {payload}"))
    };
    assert!(
        detail_of("payload.upload", &uploaded.id).ends_with(&each_detail(BLOCKS)),
        "{}",
        detail_of("payload.upload", &uploaded.id)
    );
    assert!(detail_of("payload.offload", &big_payload.id).ends_with(&each_detail(300)));
    let compact = events
        .iter()
        .find(|e| e.action == "history.compact")
        .unwrap();
    assert!(compact.detail.ends_with(&each_detail(4)), "{compact:?}");
    let runs: Vec<&str> = events
        .iter()
        .filter(|e| e.action == "exec.run")
        .map(|e| e.detail.as_str())
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(
        runs[0].ends_with("redactions=3 (aws_access_key=1,custom=1,email=1)"),
        "{runs:?}"
    );
    assert!(runs[1].ends_with(&each_detail(1)), "{runs:?}");

    // Nothing on disk: payload bytes, the metadata database, the audit
    // tree, temporary files. Stopped first, so every file is final.
    server.kill9();
    let mut files = Vec::new();
    files_under(&data_dir, &mut files);
    let mut redacted_somewhere = false;
    for f in &files {
        let bytes = std::fs::read(f)?;
        assert_clean(&f.display().to_string(), &bytes);
        redacted_somewhere |= memchr::memmem::find(&bytes, b"[REDACTED:").is_some();
    }
    assert!(files.len() >= 5 && redacted_somewhere, "{files:?}");

    // Nor in the log, which did log the calls.
    let logged = std::fs::read(&log)?;
    assert_clean("the server log", &logged);
    let logged = String::from_utf8_lossy(&logged);
    for line in ["payload stored", "result offloaded", "history compacted"] {
        assert!(logged.contains(line), "{line}: {logged}");
    }
    Ok(())
}

/// Each level's rules are checked when set, but a tenant policy set later
/// may push an existing session's union over the limit: then its writes
/// are refused, never stored unredacted.
#[tokio::test]
async fn writes_are_refused_when_the_rule_union_outgrows_the_limit() -> anyhow::Result<()> {
    let server = TestServer::start().await;
    let session = server
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest {
            policy: Some(proto::Policy {
                redact: (0..60).map(|i| format!("x{i}y")).collect(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    PoliciesClient::with_interceptor(server.channel().await, Bearer(Some(ADMIN.into())))
        .set_policy(proto::SetPolicyRequest {
            tenant: "acme".into(),
            policy: Some(proto::Policy {
                redact: (0..5).map(|i| format!("z{i}z")).collect(),
                ..Default::default()
            }),
        })
        .await?;
    let mut payloads = server.payloads(ALICE).await;
    let err = upload(&mut payloads, header(&session.id, "a.txt"), b"x1y")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("policy.redact") && err.message().contains("nothing was stored"),
        "{err:?}"
    );
    let err = payloads
        .offload(proto::OffloadRequest {
            session_id: session.id.clone(),
            turn: 1,
            results: vec![proto::ToolResult {
                tool_call_id: "c".into(),
                content: b"x1y".to_vec().into(),
                ..Default::default()
            }],
            settings: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(session_files(&server.data_dir(), &session.id).is_empty());
    Ok(())
}
