//! Payloads.Inspect and Payloads.Search through gRPC, on generated payloads
//! of every detected type.

use spillway::proto;
use tonic::Code;

use crate::common::*;

async fn stored(
    server: &TestServer,
    session: &str,
    name: &str,
    content_type: &str,
    data: &[u8],
) -> proto::Payload {
    let mut h = header(session, name);
    h.content_type = content_type.into();
    upload(&mut server.payloads(ALICE).await, h, data)
        .await
        .unwrap()
}

async fn inspect(server: &TestServer, id: &str) -> proto::Structure {
    server
        .payloads(ALICE)
        .await
        .inspect(proto::PayloadRequest {
            payload_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn inspect_describes_every_detected_type() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    let prs: String = format!(
        "[{}]",
        (0..300)
            .map(|i| format!(
                "{{\"id\":{i},\"user\":{{\"login\":\"u{i}\"}},\"draft\":{}}}",
                i % 2 == 0
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    let cases: Vec<(&str, &str, Vec<u8>, &str, &str)> = vec![
        ("a.json", "application/json", prs.into_bytes(), "json", "JSON array of 300 elements; fields id (int, 100%), user (object, 100%), user.login (string, 100%), draft (bool, 100%)"),
        ("b.json", "", br#"{"total":2,"items":[{"id":1}]}"#.to_vec(), "json", "JSON object with 2 top-level keys"),
        ("c.ndjson", "", b"{\"a\":1}\n{\"a\":2}\n".to_vec(), "ndjson", "NDJSON of 2 records; fields a (int, 100%)"),
        ("d.csv", "", b"id,name\n1,x\n2,y\n3,z\n".to_vec(), "csv", "CSV with 2 columns (id, name) and 3 data rows"),
        ("e.tsv", "", b"id\tname\n1\tx\n".to_vec(), "tsv", "TSV with 2 columns (id, name) and 1 data row"),
        ("f.txt", "", b"hello\nworld, longer line\n".to_vec(), "text", "Text of 2 lines; longest line 18 chars (line 2)"),
        ("g.py", "", b"import os\n\ndef main():\n    pass\n\nclass A:\n    pass\n\nif __name__ == '__main__':\n    main()\n".to_vec(), "python", "Python source of 10 lines"),
        ("h.bin", "", vec![0, 159, 146, 150, 0, 1], "binary", "Binary data, 6 bytes"),
        ("i.txt", "", Vec::new(), "text", "Text of 0 lines. 0 bytes in all."),
    ];
    for (name, ct, data, kind, summary) in cases {
        let p = stored(&server, &s, name, ct, &data).await;
        let st = inspect(&server, &p.id).await;
        assert_eq!(st.detected_type, kind, "{name}: {}", st.summary);
        assert!(st.summary.starts_with(summary), "{name}: {}", st.summary);
        assert_eq!(st.size_bytes, data.len() as u64);
    }
}

#[tokio::test]
async fn malformed_json_is_reported_at_its_byte_and_described_as_text() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    let p = stored(
        &server,
        &s,
        "bad.json",
        "application/json",
        b"[{\"a\":1}, {\"a\": tru}]",
    )
    .await;
    let st = inspect(&server, &p.id).await;
    // The parser notices the bad literal `tru` at the `}` after it.
    assert_eq!(st.invalid_json_at, Some(19));
    assert_eq!(st.detected_type, "text");
    assert!(
        st.summary.starts_with("Invalid JSON at byte 19"),
        "{}",
        st.summary
    );
}

#[tokio::test]
async fn one_huge_line_is_described_without_splitting_it() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    let line = "é".repeat(2_000_000);
    let p = stored(&server, &s, "line.txt", "", line.as_bytes()).await;
    let st = inspect(&server, &p.id).await;
    let t = st.text.unwrap();
    assert_eq!((t.longest_line, t.longest_line_number), (2_000_000, 1));
    assert!(t.sample_lines[0].chars().all(|c| c == 'é' || c == '…'));
}

#[tokio::test]
async fn inspect_is_repeatable_and_forgets_deleted_payloads() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    let p = stored(&server, &s, "a.json", "", b"[1,2,3]").await;
    let first = inspect(&server, &p.id).await;
    assert_eq!(inspect(&server, &p.id).await, first);
    let mut client = server.payloads(ALICE).await;
    client
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: p.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap();
    let err = client
        .inspect(proto::PayloadRequest {
            payload_id: p.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn search_finds_matches_with_context_across_payloads() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    let a = stored(
        &server,
        &s,
        "a.log",
        "",
        b"start\nERROR disk full\nretry\nok\n",
    )
    .await;
    let b = stored(&server, &s, "b.log", "", b"error: timeout\nfine\n").await;
    stored(
        &server,
        &s,
        "c.bin",
        "",
        &[0, 1, 2, b'E', b'R', b'R', b'O', b'R'],
    )
    .await;
    let mut client = server.payloads(ALICE).await;
    let r = client
        .search(proto::SearchRequest {
            session_id: s.clone(),
            pattern: "error".into(),
            case_insensitive: true,
            context_lines: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.matches.len(), 2, "{r:?}");
    let m = &r.matches[0];
    assert_eq!(
        (
            m.payload_id.as_str(),
            m.line_number,
            m.byte_offset,
            m.line.as_str()
        ),
        (a.id.as_str(), 2, 6, "ERROR disk full")
    );
    assert_eq!(
        (m.before.clone(), m.after.clone()),
        (vec!["start".to_string()], vec!["retry".to_string()])
    );
    assert_eq!(r.matches[1].payload_id, b.id);
    assert!(!r.truncated);
    assert!(r.note.contains("skipped binary payloads"), "{}", r.note);

    // Only the named payload, and a literal pattern.
    let r = client
        .search(proto::SearchRequest {
            session_id: s.clone(),
            payload_ids: vec![b.id.clone()],
            pattern: "error:".into(),
            fixed_string: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.matches.len(), 1);
}

#[tokio::test]
async fn search_caps_matches_and_says_it_truncated() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    stored(&server, &s, "many.txt", "", "hit\n".repeat(500).as_bytes()).await;
    let r = server
        .payloads(ALICE)
        .await
        .search(proto::SearchRequest {
            session_id: s,
            pattern: "hit".into(),
            max_matches: 7,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.matches.len(), 7);
    assert!(r.truncated);
    assert!(r.note.contains("max_matches (7)"), "{}", r.note);
}

#[tokio::test]
async fn bad_searches_are_invalid_argument_with_the_reason() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    let mut client = server.payloads(ALICE).await;
    let search = |pattern: &str| proto::SearchRequest {
        session_id: s.clone(),
        pattern: pattern.into(),
        ..Default::default()
    };
    let err = client.search(search("(unclosed")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("unclosed"), "{}", err.message());
    let err = client
        .search(search(r"\w{1000}\w{1000}\w{1000}"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    let err = client.search(search("")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let mut req = search("x");
    req.context_lines = 11;
    assert_eq!(
        client.search(req).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    // Another session's payload is not found through this session.
    let other = create_session(&server, ALICE).await.id;
    let foreign = stored(&server, &other, "o.txt", "", b"x").await;
    let mut req = search("x");
    req.payload_ids = vec![foreign.id];
    assert_eq!(client.search(req).await.unwrap_err().code(), Code::NotFound);
}

#[tokio::test]
async fn search_stops_at_the_time_limit_with_partial_results() {
    let server =
        TestServer::start_with(|c| c.limits.search_timeout = std::time::Duration::from_millis(1))
            .await;
    let s = create_session(&server, ALICE).await.id;
    stored(
        &server,
        &s,
        "big.txt",
        "",
        "needle in a haystack line\n".repeat(400_000).as_bytes(),
    )
    .await;
    let r = server
        .payloads(ALICE)
        .await
        .search(proto::SearchRequest {
            session_id: s,
            pattern: "needle".into(),
            max_matches: 10_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.truncated);
    assert!(r.note.contains("limits.search_timeout"), "{}", r.note);
}

#[tokio::test]
async fn the_same_bytes_under_two_content_types_are_inspected_separately() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    // The content type decides the detection here: CSV when declared, text when not.
    let bytes = b"hello world\nbye\n";
    let csv = stored(&server, &s, "t.csv", "text/csv", bytes).await;
    let plain = stored(&server, &s, "t.txt", "", bytes).await;
    assert_eq!(inspect(&server, &csv.id).await.detected_type, "csv");
    let second = inspect(&server, &plain.id).await;
    assert_eq!(second.detected_type, "text", "not the cached CSV answer");
    assert_eq!(second.payload_id, plain.id);
}

#[tokio::test]
async fn max_matches_above_the_ceiling_is_clamped_to_it() {
    let server = TestServer::start_with(|c| c.limits.max_search_matches = 5).await;
    let s = create_session(&server, ALICE).await.id;
    stored(&server, &s, "many.txt", "", "hit\n".repeat(50).as_bytes()).await;
    let r = server
        .payloads(ALICE)
        .await
        .search(proto::SearchRequest {
            session_id: s,
            pattern: "hit".into(),
            max_matches: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.matches.len(), 5);
    assert!(r.truncated);
    assert!(r.note.contains("ceiling 5"), "{}", r.note);
}

/// The usual shape of a large tool result: an 8 MB minified array on one
/// line. Each hit says where the match is (byte offset, record path) and
/// shows a window around the match, not the first 500 chars of the line;
/// the note's advice (a byte range centred on the hit) works as given.
#[tokio::test]
async fn search_inside_an_8_mb_one_line_array_reports_each_match_where_it_is() {
    let server = TestServer::start().await;
    let s = create_session(&server, ALICE).await.id;
    let records: Vec<String> = (0..80_000)
        .map(|i| {
            let login = if i == 37_243 { "octocat-42" } else { "someone" };
            format!(
                "{{\"id\":{i},\"title\":\"pull request {i} with a longer title\",\"user\":{{\"login\":\"{login}\",\"type\":\"User\"}},\"state\":\"open\"}}"
            )
        })
        .collect();
    let doc = format!("[{}]", records.join(","));
    assert!(doc.len() > 8_000_000 && !doc.contains('\n'));
    let p = stored(&server, &s, "prs.json", "application/json", doc.as_bytes()).await;
    let mut client = server.payloads(ALICE).await;
    let r = client
        .search(proto::SearchRequest {
            session_id: s.clone(),
            pattern: "octocat-[0-9]+".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.matches.len(), r.total_matches_seen), (1, 1), "{r:?}");
    let m = &r.matches[0];
    let at = doc.find("octocat-42").unwrap() as u64;
    assert_eq!(
        (
            m.line_number,
            m.byte_offset,
            m.match_offset,
            m.match_length,
            m.column
        ),
        (1, 0, at, 10, at)
    );
    assert_eq!(m.json_path, ".[37243].user.login");
    assert!(m.windowed && m.window_start < at && m.window_end > at + 10);
    assert!(m.window_end - m.window_start <= 480);
    assert!(
        m.line
            .starts_with(&format!("[…{} bytes before] ", group(m.window_start)))
            && m.line.contains("\"login\":\"octocat-42\"")
            && m.line.ends_with(&format!(
                " […{} bytes after]",
                group(doc.len() as u64 - m.window_end)
            )),
        "{}",
        m.line
    );
    assert_eq!(
        r.note,
        "1 of the 1 matches shown are in lines over 500 chars, so each shows a window of its line around the match, not the whole line; to see more, Read a byte range centred on its match_offset (for example offset match_offset-2048, length 4096), or Exec jq on its json_path"
    );
    // The advice, followed: a byte range centred on the hit.
    let read = client
        .read(proto::ReadRequest {
            payload_id: p.id.clone(),
            max_bytes: 0,
            range: Some(proto::read_request::Range::ByteRange(proto::ByteRange {
                offset: m.match_offset - 2048,
                length: 4096,
            })),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.data.len(), 4096);
    assert!(String::from_utf8_lossy(&read.data).contains("octocat-42"));
    // Many matches in the one line are hits of their own, up to the cap.
    let r = client
        .search(proto::SearchRequest {
            session_id: s,
            pattern: "\"login\":\"someone\"".into(),
            fixed_string: true,
            max_matches: 50,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.matches.len(), 50);
    assert!(
        r.truncated && r.total_matches_seen == 51,
        "{}",
        r.total_matches_seen
    );
    let paths: Vec<&str> = r.matches[..3]
        .iter()
        .map(|m| m.json_path.as_str())
        .collect();
    assert_eq!(paths, [".[0].user", ".[1].user", ".[2].user"]);
}

/// `1 234 567`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}
