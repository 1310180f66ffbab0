//! Payloads.Offload through gRPC: decisions, notices, byte-identical
//! storage, deduplication and errors.

use spillway::proto::{self, Disposition, OffloadReason};
use tonic::Code;

use crate::common::*;

fn result(id: &str, tool: &str, content: &[u8], content_type: &str) -> proto::ToolResult {
    proto::ToolResult {
        tool_call_id: id.into(),
        tool_name: tool.into(),
        content: content.to_vec().into(),
        content_type: content_type.into(),
        is_error: false,
    }
}

fn prs(n: usize) -> Vec<u8> {
    let items: Vec<String> = (0..n).map(|i| format!("{{\"id\":{i},\"title\":\"Fix flaky test {i}\",\"user\":{{\"login\":\"dev{i}\"}},\"labels\":[\"bug\"]}}")).collect();
    format!("[{}]", items.join(",")).into_bytes()
}

async fn offload(
    server: &TestServer,
    session: &str,
    results: Vec<proto::ToolResult>,
    settings: Option<proto::OffloadSettings>,
) -> Result<proto::OffloadResponse, tonic::Status> {
    server
        .payloads(ALICE)
        .await
        .offload(proto::OffloadRequest {
            session_id: session.into(),
            turn: 1,
            results,
            settings,
        })
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn one_giant_result_is_offloaded_and_reads_back_byte_identical() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let giant = prs(2000);
    let reply = offload(
        &server,
        &session.id,
        vec![
            result("call_1", "ls", b"a.txt\nb.txt\n", "text/plain"),
            result("call_7", "github_list_prs", &giant, "application/json"),
            result("call_9", "echo", b"done", ""),
        ],
        None,
    )
    .await
    .unwrap();
    let ids: Vec<&str> = reply
        .outcomes
        .iter()
        .map(|o| o.tool_call_id.as_str())
        .collect();
    assert_eq!(
        ids,
        ["call_1", "call_7", "call_9"],
        "outcomes come back in input order"
    );
    assert_eq!(reply.outcomes[0].disposition, Disposition::Inline as i32);
    assert_eq!(reply.outcomes[0].content, "a.txt\nb.txt\n");
    let big = &reply.outcomes[1];
    assert_eq!(
        (big.disposition, big.reason),
        (Disposition::Offloaded as i32, OffloadReason::PerCall as i32)
    );
    assert_eq!(big.estimated_tokens, (giant.len() as u64).div_ceil(4));
    let p = big.payload.clone().unwrap();
    assert_eq!(p.path, "/payloads/github_list_prs-call_7.json");
    assert_eq!(p.content_type, "application/json");
    assert!(
        big.content.contains(&p.id) && big.content.contains(&p.path),
        "{}",
        big.content
    );
    assert!(
        big.content.contains("JSON array of 2 000 records"),
        "{}",
        big.content
    );
    assert!(
        big.content_tokens < 600,
        "notice has {} tokens",
        big.content_tokens
    );
    let mut client = server.payloads(ALICE).await;
    assert_eq!(download(&mut client, &p.id).await.unwrap(), giant);
    assert_eq!(reply.offloaded_tokens, big.estimated_tokens);
    assert_eq!(
        reply.inline_tokens,
        reply.outcomes.iter().map(|o| o.content_tokens).sum::<u64>()
    );
}

#[tokio::test]
async fn four_medium_results_pass_per_call_but_trip_the_aggregate() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    // 4 results of 4 000 tokens: each under 6 000, 16 000 together.
    let sizes = [16_000usize, 16_400, 15_600, 16_000];
    let results: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            result(
                &format!("c{i}"),
                "search",
                "x".repeat(n).as_bytes(),
                "text/plain",
            )
        })
        .collect();
    let reply = offload(&server, &session.id, results, None).await.unwrap();
    let reasons: Vec<i32> = reply.outcomes.iter().map(|o| o.reason).collect();
    let agg = OffloadReason::Aggregate as i32;
    let none = OffloadReason::None as i32;
    // Largest first (c1), then the earliest of the 4 000-token ties (c0).
    assert_eq!(reasons, [agg, agg, none, none]);
    assert!(reply.inline_tokens < 10_000, "{}", reply.inline_tokens);
}

#[tokio::test]
async fn error_results_are_offloaded_whole_and_keep_is_error() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let trace = "Traceback (most recent call last):\n  File \"x.py\", line 1\n".repeat(2000);
    let mut r = result("call_e", "run_tests", trace.as_bytes(), "text/plain");
    r.is_error = true;
    let reply = offload(&server, &session.id, vec![r], None).await.unwrap();
    let o = &reply.outcomes[0];
    assert_eq!(o.disposition, Disposition::Offloaded as i32);
    assert!(
        o.content.contains("returned an error result"),
        "{}",
        o.content
    );
    let p = o.payload.clone().unwrap();
    assert!(p.is_error);
    assert_eq!(p.size_bytes, trace.len() as u64);
    let mut client = server.payloads(ALICE).await;
    assert_eq!(
        download(&mut client, &p.id).await.unwrap(),
        trace.as_bytes()
    );
}

#[tokio::test]
async fn an_all_small_turn_stores_nothing() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let reply = offload(
        &server,
        &session.id,
        vec![
            result("a", "t", b"small", ""),
            result("b", "t", b"also small", ""),
        ],
        None,
    )
    .await
    .unwrap();
    assert!(
        reply
            .outcomes
            .iter()
            .all(|o| o.disposition == Disposition::Inline as i32 && o.payload.is_none())
    );
    assert!(session_files(&server.data_dir(), &session.id).is_empty());
}

#[tokio::test]
async fn identical_bytes_are_stored_once_and_deletion_stays_correct() {
    use std::os::unix::fs::MetadataExt;
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let giant = prs(1000);
    let reply = offload(
        &server,
        &session.id,
        vec![
            result("c1", "list", &giant, "application/json"),
            result("c2", "list", &giant, "application/json"),
        ],
        None,
    )
    .await
    .unwrap();
    let a = reply.outcomes[0].payload.clone().unwrap();
    let b = reply.outcomes[1].payload.clone().unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(a.sha256, b.sha256);
    let dir = server.data_dir().join("sessions").join(&session.id);
    let (ma, mb) = (
        std::fs::metadata(dir.join(&a.name)).unwrap(),
        std::fs::metadata(dir.join(&b.name)).unwrap(),
    );
    assert_eq!(ma.ino(), mb.ino(), "the bytes are stored once");
    assert_eq!(usage_bytes(&server, &session.id).await, giant.len() as u64);

    let mut client = server.payloads(ALICE).await;
    client
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: a.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(
        download(&mut client, &b.id).await.unwrap(),
        giant,
        "the other handle still reads"
    );
    assert_eq!(usage_bytes(&server, &session.id).await, giant.len() as u64);
    client
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: b.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(usage_bytes(&server, &session.id).await, 0);
    assert!(session_files(&server.data_dir(), &session.id).is_empty());
}

#[tokio::test]
async fn bad_settings_are_invalid_argument_and_store_nothing() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let giant = prs(500);
    let settings = proto::OffloadSettings {
        per_call_tokens: Some(20_000),
        aggregate_tokens: Some(10_000),
        ..Default::default()
    };
    let err = offload(
        &server,
        &session.id,
        vec![result("c", "t", &giant, "")],
        Some(settings),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("per_call_tokens (20000)"),
        "{}",
        err.message()
    );
    let settings = proto::OffloadSettings {
        estimator: Some("bogus".into()),
        ..Default::default()
    };
    assert_eq!(
        offload(&server, &session.id, vec![], Some(settings))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert!(session_files(&server.data_dir(), &session.id).is_empty());
}

#[tokio::test]
async fn exact_estimators_and_other_preview_styles_work_end_to_end() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let giant = prs(3000);
    let settings = proto::OffloadSettings {
        estimator: Some("o200k".into()),
        preview_style: Some("edges".into()),
        ..Default::default()
    };
    let reply = offload(
        &server,
        &session.id,
        vec![result("c", "t", &giant, "application/json")],
        Some(settings),
    )
    .await
    .unwrap();
    let o = &reply.outcomes[0];
    assert_eq!(o.disposition, Disposition::Offloaded as i32);
    assert!(
        o.estimate_is_lower_bound,
        "a 230 KB result is over 6 000 tokens without tokenizing it"
    );
    assert!(o.preview.starts_with("[{\"id\":0"), "{}", o.preview);
    assert!(
        o.preview.contains("chars omitted — full payload:"),
        "{}",
        o.preview
    );
}

#[tokio::test]
async fn offload_follows_session_state_and_visibility() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let giant = prs(500);
    let err = server
        .payloads(MALLORY)
        .await
        .offload(proto::OffloadRequest {
            session_id: session.id.clone(),
            turn: 1,
            results: vec![result("c", "t", &giant, "")],
            settings: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    server
        .sessions(ALICE)
        .await
        .close_session(proto::CloseSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap();
    let err = offload(
        &server,
        &session.id,
        vec![result("c", "t", &giant, "")],
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    // Even a turn that would stay inline is refused on a closed session.
    let err = offload(
        &server,
        &session.id,
        vec![result("c", "t", b"tiny", "")],
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn a_turn_over_the_offload_message_limit_is_resource_exhausted() {
    let server = TestServer::start_with(|c| {
        c.limits.max_request_message_bytes = 64 * 1024;
        c.limits.max_offload_request_bytes = 256 * 1024;
    })
    .await;
    let session = create_session(&server, ALICE).await;
    let err = offload(
        &server,
        &session.id,
        vec![result("c", "t", &vec![b'x'; 300 * 1024], "")],
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(
        err.message()
            .contains("limits.max_offload_request_bytes (262144 bytes)"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn a_turn_with_more_results_than_allowed_is_resource_exhausted() {
    let server = TestServer::start_with(|c| c.offload.max_results = 2).await;
    let session = create_session(&server, ALICE).await;
    let results = (0..3)
        .map(|i| result(&format!("c{i}"), "t", b"x", ""))
        .collect();
    let err = offload(&server, &session.id, results, None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("offload.max_results is 2"),
        "{}",
        err.message()
    );
}

/// A turn of small results that all stay inline is answered in about a
/// millisecond on a warm connection. Its 16 KB request makes the server
/// send a WINDOW_UPDATE first; without TCP_NODELAY on accepted
/// connections, Nagle's algorithm then held the reply until the client's
/// delayed ACK, 40 ms later, on every call.
#[tokio::test]
async fn a_small_inline_turn_is_not_held_by_nagle() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let results: Vec<proto::ToolResult> = (0..8)
        .map(|i| proto::ToolResult {
            tool_call_id: format!("call_{i}"),
            tool_name: "grep".into(),
            content: format!("{{\"line\": {i}, \"text\": \"{}\"}}", "x".repeat(2000)).into(),
            content_type: "application/json".into(),
            is_error: false,
        })
        .collect();
    let mut took = Vec::new();
    for turn in 0..30 {
        let started = std::time::Instant::now();
        let r = p
            .offload(proto::OffloadRequest {
                session_id: session.id.clone(),
                turn,
                results: results.clone(),
                settings: None,
            })
            .await
            .unwrap()
            .into_inner();
        took.push(started.elapsed());
        assert!(r.outcomes.iter().all(|o| o.payload.is_none()));
    }
    took.sort();
    let median = took[took.len() / 2];
    assert!(
        median < std::time::Duration::from_millis(20),
        "median Offload took {median:?}: {took:?}"
    );
}

/// The notice of a 3 MB one-line array counts its records exactly (as
/// Inspect does) and never offers line ranges; a binary result's notice
/// offers byte ranges and a Python decoder, never Search, and no line
/// count. The exact words the model reads are checked.
#[tokio::test]
async fn notices_fit_the_shape_one_line_json_and_binary() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    let json = prs(37_243);
    assert!(
        json.len() > 3_000_000 && json.len() < 3_600_000,
        "{}",
        json.len()
    );
    let binary: Vec<u8> = (0..100_000u32)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    let r = offload(
        &server,
        &s,
        vec![
            result("call_1", "list_prs", &json, "application/json"),
            result(
                "call_2",
                "fetch_artifact",
                &binary,
                "application/octet-stream",
            ),
        ],
        None,
    )
    .await
    .unwrap();
    let (one_line, bin) = (&r.outcomes[0], &r.outcomes[1]);
    let p = one_line.payload.as_ref().unwrap();
    assert!(
        one_line
            .content
            .contains("\nStructure: JSON array of 37 243 records; "),
        "{}",
        one_line.content
    );
    assert!(
        one_line.content.ends_with(&format!(
            "\nNext: 1) Inspect {}; 2) confirm shape and count; 3) Search it (hits give byte offsets and JSON paths) or Read byte ranges (it is one line, so no line ranges); 4) filter or group with Exec (jq, javascript, python) on its path; 5) print only the evidence; 6) keep the handle.",
            p.id
        )),
        "{}",
        one_line.content
    );
    let inspected = server
        .payloads(ALICE)
        .await
        .inspect(proto::PayloadRequest {
            payload_id: p.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(inspected.json.unwrap().record_count, 37_243);
    let b = bin.payload.as_ref().unwrap();
    assert!(
        bin.content.contains(&format!(
            "Handle {} at {}: 400 000 bytes, binary, application/octet-stream.\n",
            b.id, b.path
        )),
        "{}",
        bin.content
    );
    assert!(
        bin.content.ends_with(&format!(
            "\nNext: 1) Read byte ranges of {} (Search skips binary data); 2) decode it with Exec python, opening its path with open(path, 'rb'); 3) print only the evidence; 4) keep the handle.",
            b.id
        )),
        "{}",
        bin.content
    );
    assert!(!bin.content.contains("line"), "{}", bin.content);
}
