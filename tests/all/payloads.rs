//! Payloads RPCs: upload, stat, list, read, download, delete, and their
//! error paths.

use spillway::proto::{self, read_request::Range, upload_chunk::Chunk};
use tonic::Code;

use crate::common::*;

fn numbered_lines(n: usize) -> Vec<u8> {
    (1..=n)
        .map(|i| format!("{{\"id\":{i},\"title\":\"item {i}\"}}\n"))
        .collect::<String>()
        .into_bytes()
}

#[tokio::test]
async fn upload_stat_read_download_round_trip_byte_identical() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let data = numbered_lines(20_000);
    let mut h = header(&session.id, "");
    h.tool_name = "github_list_prs".into();
    h.tool_call_id = "call_7".into();
    h.content_type = "application/x-ndjson".into();
    h.expected_sha256 = sha256_hex(&data);
    let stored = upload(&mut p, h, &data).await.unwrap();
    assert!(stored.id.starts_with("pl_"));
    assert_eq!(stored.name, "github_list_prs-call_7.ndjson");
    assert_eq!(stored.path, "/payloads/github_list_prs-call_7.ndjson");
    assert_eq!(stored.size_bytes, data.len() as u64);
    assert_eq!(stored.line_count, 20_000);
    assert_eq!(stored.sha256, sha256_hex(&data));
    assert_eq!(stored.estimated_tokens, (data.len() as u64).div_ceil(4));

    let stat = p
        .stat(proto::PayloadRequest {
            payload_id: stored.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stat, stored);
    assert_eq!(download(&mut p, &stored.id).await.unwrap(), data);

    let r = p
        .read(proto::ReadRequest {
            payload_id: stored.id.clone(),
            max_bytes: 0,
            range: Some(Range::LineRange(proto::LineRange {
                start_line: 12_345,
                end_line: 12_346,
            })),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.data,
        b"{\"id\":12345,\"title\":\"item 12345\"}\n{\"id\":12346,\"title\":\"item 12346\"}\n"
    );
    assert_eq!(
        (r.first_line, r.last_line, r.total_lines, r.eof),
        (12_345, 12_346, 20_000, false)
    );
    assert_eq!(
        &data[r.start_offset as usize..r.end_offset as usize],
        r.data.as_slice()
    );

    let r = p
        .read(proto::ReadRequest {
            payload_id: stored.id.clone(),
            max_bytes: 10,
            range: Some(Range::ByteRange(proto::ByteRange {
                offset: 5,
                length: 1000,
            })),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.data, &data[5..15]);
    assert_eq!(r.total_bytes, data.len() as u64);
}

#[tokio::test]
async fn read_defaults_to_64_kib_and_clamps_to_the_ceiling() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let data = vec![b'x'; 6 << 20];
    let stored = upload(&mut p, header(&session.id, "big.txt"), &data)
        .await
        .unwrap();
    let r = p
        .read(proto::ReadRequest {
            payload_id: stored.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.data.len(), 64 << 10);
    let r = p
        .read(proto::ReadRequest {
            payload_id: stored.id.clone(),
            max_bytes: 1 << 30,
            range: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.data.len() as u64, (4 << 20) - REPLY_FRAMING);
}

/// The framing the server keeps out of a Read's data.
const REPLY_FRAMING: u64 = 256;

/// A stock gRPC client (grpcio, grpc-go, grpc-java, tonic) refuses replies
/// over 4 194 304 bytes. A Read of the documented 4 MiB maximum, even at the
/// end of a payload whose offsets need the longest varints, must fit.
#[tokio::test]
async fn a_read_of_the_4_mib_maximum_fits_a_default_clients_receive_limit() {
    use prost::Message as _;
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let data = numbered_lines(400_000);
    assert!(data.len() > 9 << 20);
    let stored = upload(&mut p, header(&session.id, "big.ndjson"), &data)
        .await
        .unwrap();
    // The default decoding limit is 4 MiB, as in every stock client.
    let mut stock = proto::payloads_client::PayloadsClient::with_interceptor(
        server.channel().await,
        Bearer(Some(ALICE.into())),
    );
    for (max_bytes, range) in [
        (4 << 20, None),
        (
            4 << 20,
            Some(Range::ByteRange(proto::ByteRange {
                offset: (data.len() - (4 << 20)) as u64 - 1000,
                length: 4 << 20,
            })),
        ),
        (
            8 << 20,
            Some(Range::LineRange(proto::LineRange {
                start_line: 200_000,
                end_line: 400_000,
            })),
        ),
    ] {
        let r = stock
            .read(proto::ReadRequest {
                payload_id: stored.id.clone(),
                max_bytes,
                range,
            })
            .await
            .expect("a 4 MiB Read fits a default client")
            .into_inner();
        assert!(r.encoded_len() <= 4_194_304, "{} bytes", r.encoded_len());
        assert!(
            r.data.len() as u64 <= (4 << 20) - REPLY_FRAMING
                && r.data.len() as u64 > (4 << 20) - REPLY_FRAMING - 100,
            "{}",
            r.data.len()
        );
        assert_eq!(
            &r.data[..],
            &data[r.start_offset as usize..r.end_offset as usize]
        );
    }
}

#[tokio::test]
async fn line_range_past_the_end_is_out_of_range_with_the_line_count() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let stored = upload(&mut p, header(&session.id, "l.txt"), b"one\ntwo\n")
        .await
        .unwrap();
    let err = p
        .read(proto::ReadRequest {
            payload_id: stored.id,
            max_bytes: 0,
            range: Some(Range::LineRange(proto::LineRange {
                start_line: 3,
                end_line: 4,
            })),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange);
    assert!(err.message().contains("has 2 lines"), "{}", err.message());
}

#[tokio::test]
async fn sha256_mismatch_is_invalid_argument_and_stores_nothing() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let mut h = header(&session.id, "x.txt");
    h.expected_sha256 = sha256_hex(b"something else");
    let err = upload(&mut p, h, b"actual bytes").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("nothing was stored"),
        "{}",
        err.message()
    );
    assert!(payloads_of(&server, &session.id).await.is_empty());
    assert!(session_files(&server.data_dir(), &session.id).is_empty());
}

#[tokio::test]
async fn upload_over_the_payload_limit_is_resource_exhausted_and_stores_nothing() {
    let server = TestServer::start_with(|c| c.limits.max_payload_bytes = 100_000).await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let err = upload(&mut p, header(&session.id, "big.bin"), &vec![1u8; 100_001])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message()
            .contains("limits.max_payload_bytes is 100000 bytes"),
        "{}",
        err.message()
    );
    assert!(session_files(&server.data_dir(), &session.id).is_empty());
    // Exactly at the limit is fine.
    upload(&mut p, header(&session.id, "ok.bin"), &vec![1u8; 100_000])
        .await
        .unwrap();
}

#[tokio::test]
async fn oversize_upload_chunk_is_resource_exhausted_and_stores_nothing() {
    let server = TestServer::start_with(|c| c.limits.max_request_message_bytes = 64 * 1024).await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let chunks = vec![
        proto::UploadChunk {
            chunk: Some(Chunk::Header(header(&session.id, "c.bin"))),
        },
        proto::UploadChunk {
            chunk: Some(Chunk::Data(vec![0u8; 200_000].into())),
        },
    ];
    let err = p.upload(tokio_stream::iter(chunks)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(
        err.message().contains("max_request_message_bytes"),
        "{}",
        err.message()
    );
    assert!(session_files(&server.data_dir(), &session.id).is_empty());
}

#[tokio::test]
async fn upload_stream_must_start_with_one_header() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let data_first = vec![proto::UploadChunk {
        chunk: Some(Chunk::Data(bytes::Bytes::from_static(b"x"))),
    }];
    assert_eq!(
        p.upload(tokio_stream::iter(data_first))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let empty: Vec<proto::UploadChunk> = vec![];
    assert_eq!(
        p.upload(tokio_stream::iter(empty))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let two_headers = vec![
        proto::UploadChunk {
            chunk: Some(Chunk::Header(header(&session.id, "a"))),
        },
        proto::UploadChunk {
            chunk: Some(Chunk::Header(header(&session.id, "b"))),
        },
    ];
    assert_eq!(
        p.upload(tokio_stream::iter(two_headers))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert!(session_files(&server.data_dir(), &session.id).is_empty());
}

#[tokio::test]
async fn closed_session_refuses_uploads_with_failed_precondition() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    server
        .sessions(ALICE)
        .await
        .close_session(proto::CloseSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap();
    let mut p = server.payloads(ALICE).await;
    let err = upload(&mut p, header(&session.id, "late.txt"), b"late")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("read-only"), "{}", err.message());
}

#[tokio::test]
async fn payload_access_follows_session_visibility() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let stored = upload(&mut p, header(&session.id, "secret.txt"), b"alice only")
        .await
        .unwrap();
    for token in [BOB, MALLORY] {
        let mut other = server.payloads(token).await;
        let err = other
            .stat(proto::PayloadRequest {
                payload_id: stored.id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{token}");
        let err = download(&mut other, &stored.id).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{token}");
        let err = upload(&mut other, header(&session.id, "intruder.txt"), b"x")
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{token}");
    }
    // Compliance sees metadata but not content.
    let mut carol = server.payloads("tok-carol").await;
    carol
        .stat(proto::PayloadRequest {
            payload_id: stored.id.clone(),
        })
        .await
        .unwrap();
    let err = carol
        .read(proto::ReadRequest {
            payload_id: stored.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn shared_principal_can_read_and_upload() {
    let server = TestServer::start().await;
    let session = server
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest {
            share_with: vec!["bob".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut alice = server.payloads(ALICE).await;
    let stored = upload(&mut alice, header(&session.id, "shared.txt"), b"for bob")
        .await
        .unwrap();
    let mut bob = server.payloads(BOB).await;
    assert_eq!(download(&mut bob, &stored.id).await.unwrap(), b"for bob");
    upload(&mut bob, header(&session.id, "from-bob.txt"), b"hi")
        .await
        .unwrap();
}

#[tokio::test]
async fn unknown_and_malformed_payload_ids() {
    let server = TestServer::start().await;
    let mut p = server.payloads(ALICE).await;
    let err = p
        .stat(proto::PayloadRequest {
            payload_id: "pl_nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("pl_"), "{}", err.message());
    let err = p
        .stat(proto::PayloadRequest {
            payload_id: format!("pl_{}", "a".repeat(32)),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // What happened, then what to do next.
    assert_eq!(
        err.message(),
        format!(
            "payload pl_{} not found; check the ID against ListPayloads (spillway ls --session S), which lists the payloads you can read, or store the data again",
            "a".repeat(32)
        )
    );
    // A recall marker pasted into Read is pointed at Recall.
    let err = p
        .read(proto::ReadRequest {
            payload_id: "<<ccr:0123456789abcdef>>".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().ends_with("that is a recall key from a <<ccr:KEY>> marker, not an ID: pass it to Recall (spillway_recall, or `spillway context recall`), which returns the archived result whole"),
        "{}",
        err.message()
    );
    let err = p
        .stat(proto::PayloadRequest {
            payload_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn names_are_sanitized_and_made_unique() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let a = upload(&mut p, header(&session.id, "../../etc/passwd"), b"1")
        .await
        .unwrap();
    let b = upload(&mut p, header(&session.id, "../../etc/passwd"), b"2")
        .await
        .unwrap();
    assert_eq!(a.name, "_.._etc_passwd");
    assert_eq!(b.name, "_.._etc_passwd-2");
    let files = session_files(&server.data_dir(), &session.id);
    assert_eq!(
        files,
        vec!["_.._etc_passwd".to_string(), "_.._etc_passwd-2".to_string()]
    );
}

#[tokio::test]
async fn delete_payload_returns_a_receipt_and_removes_file_and_metadata() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let stored = upload(&mut p, header(&session.id, "gone.txt"), b"bye")
        .await
        .unwrap();
    let receipt = p
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: stored.id.clone(),
            reason: "cleanup".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(receipt.deleted_payload_ids, vec![stored.id.clone()]);
    assert_eq!(receipt.content_sha256, vec![stored.sha256.clone()]);
    assert_eq!(receipt.bytes_deleted, 3);
    let err = p
        .stat(proto::PayloadRequest {
            payload_id: stored.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        err.message().contains(&receipt.id),
        "the error names the receipt: {}",
        err.message()
    );
    // Another tenant learns nothing from it.
    let err = server
        .payloads(MALLORY)
        .await
        .stat(proto::PayloadRequest {
            payload_id: stored.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(!err.message().contains("deleted"), "{}", err.message());
    assert!(session_files(&server.data_dir(), &session.id).is_empty());
    let s = server
        .sessions(ALICE)
        .await
        .get_session(proto::GetSessionRequest {
            session_id: session.id,
        })
        .await
        .unwrap();
    assert_eq!(s.into_inner().usage.unwrap().payloads, 0);
}

#[tokio::test]
async fn delete_session_receipt_lists_every_payload() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            upload(
                &mut p,
                header(&session.id, &format!("{i}.txt")),
                format!("payload {i}").as_bytes(),
            )
            .await
            .unwrap()
            .id,
        );
    }
    let receipt = server
        .sessions(ALICE)
        .await
        .delete_session(proto::DeleteSessionRequest {
            session_id: session.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut got = receipt.deleted_payload_ids.clone();
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
    assert_eq!(receipt.bytes_deleted, 27);
    for id in ids {
        assert_eq!(
            p.stat(proto::PayloadRequest { payload_id: id })
                .await
                .unwrap_err()
                .code(),
            Code::NotFound
        );
    }
}

#[tokio::test]
async fn list_payloads_pages_in_creation_order() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            upload(&mut p, header(&session.id, &format!("{i}.txt")), b"x")
                .await
                .unwrap()
                .id,
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = p
            .list_payloads(proto::ListPayloadsRequest {
                session_id: session.id.clone(),
                page_size: 2,
                page_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        seen.extend(page.payloads.into_iter().map(|x| x.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, ids);
}

#[tokio::test]
async fn uploads_beyond_the_concurrency_limit_are_resource_exhausted() {
    let server = TestServer::start_with(|c| c.limits.max_concurrent_uploads = 1).await;
    let session = create_session(&server, ALICE).await;
    let mut first_client = server.payloads(ALICE).await;
    let (tx, stream) = open_upload(&session.id, "slow.txt", b"part one").await;
    let first = tokio::spawn(async move { first_client.upload(stream).await });
    // Wait until the first upload holds the only slot.
    let mut p = server.payloads(ALICE).await;
    let mut refused = None;
    for _ in 0..200 {
        match upload(&mut p, header(&session.id, "second.txt"), b"x").await {
            Err(e) if e.code() == Code::ResourceExhausted => {
                refused = Some(e);
                break;
            }
            Ok(stored) => {
                p.delete_payload(proto::DeletePayloadRequest {
                    payload_id: stored.id,
                    reason: String::new(),
                })
                .await
                .unwrap();
            }
            Err(e) => panic!("unexpected {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let refused = refused.expect("the second upload was never refused");
    assert!(
        refused
            .message()
            .contains("limits.max_concurrent_uploads (1)"),
        "{}",
        refused.message()
    );
    drop(tx);
    let stored = first.await.unwrap().unwrap().into_inner();
    assert_eq!(stored.size_bytes, 8);
    upload(&mut p, header(&session.id, "third.txt"), b"slot free again")
        .await
        .unwrap();
}

#[tokio::test]
async fn download_streams_chunks_no_larger_than_the_limit() {
    let server = TestServer::start_with(|c| c.limits.download_chunk_bytes = 1000).await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let data: Vec<u8> = (0..10_500u32).map(|i| (i % 256) as u8).collect();
    let stored = upload(&mut p, header(&session.id, "d.bin"), &data)
        .await
        .unwrap();
    let mut stream = p
        .download(proto::PayloadRequest {
            payload_id: stored.id,
        })
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    let mut chunks = 0;
    while let Some(c) = stream.message().await.unwrap() {
        assert!(c.data.len() <= 1000);
        got.extend_from_slice(&c.data);
        chunks += 1;
    }
    assert_eq!(got, data);
    assert_eq!(chunks, 11);
}

#[tokio::test]
async fn list_payloads_page_size_is_clamped_to_the_configured_maximum() {
    let server = TestServer::start_with(|c| c.limits.max_page_size = 2).await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    for i in 0..3 {
        upload(&mut p, header(&session.id, &format!("{i}.txt")), b"x")
            .await
            .unwrap();
    }
    let page = p
        .list_payloads(proto::ListPayloadsRequest {
            session_id: session.id,
            page_size: 5000,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.payloads.len(), 2);
    assert!(!page.next_page_token.is_empty());
}

#[tokio::test]
async fn download_is_refused_when_the_policy_disallows_it() {
    let server = TestServer::start_with(|c| c.policy.allow_download = false).await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let stored = upload(&mut p, header(&session.id, "x.txt"), b"secret")
        .await
        .unwrap();
    let err = download(&mut p, &stored.id).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(
        err.message().contains("allow_download"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn a_deletion_receipt_is_named_only_to_those_who_could_see_the_session() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let stored = upload(&mut p, header(&session.id, "x.txt"), b"gone soon")
        .await
        .unwrap();
    p.delete_payload(proto::DeletePayloadRequest {
        payload_id: stored.id.clone(),
        reason: "cleanup".into(),
    })
    .await
    .unwrap();
    // Bob is in the same tenant but was never shared the session.
    let err = server
        .payloads(BOB)
        .await
        .stat(proto::PayloadRequest {
            payload_id: stored.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        !err.message().contains("deleted") && !err.message().contains("cleanup"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn a_stalled_upload_is_abandoned_and_leaves_nothing() {
    let server = TestServer::start_with(|c| {
        c.limits.upload_idle_timeout = std::time::Duration::from_millis(300)
    })
    .await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    // The stream is kept open without sending more.
    let (tx, stream) = open_upload(&session.id, "stalled.txt", b"first part").await;
    let err = p.upload(stream).await.unwrap_err();
    drop(tx);
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(
        err.message().contains("limits.upload_idle_timeout"),
        "{}",
        err.message()
    );
    assert!(
        session_files(&server.data_dir(), &session.id).is_empty(),
        "no temp file remains"
    );
    // The slot is free again.
    upload(&mut p, header(&session.id, "next.txt"), b"ok")
        .await
        .unwrap();
}
