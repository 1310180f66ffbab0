//! The real binary under `kill -9`: acknowledged uploads survive, nothing
//! half-written remains, and the store reopens cleanly. Also: an upload's
//! memory stays bounded whatever its size.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use spillway::proto;

use crate::common::*;

const ROUNDS: usize = 5;
const UPLOADS_PER_ROUND: usize = 200;

#[derive(Debug, Clone)]
struct Acked {
    id: String,
    session: String,
    sha256: String,
    size: u64,
}

/// Checks every acknowledged payload's metadata, the bytes of those in
/// `acked[bytes_from..]`, and that no stray file remains.
async fn verify_all(
    server: &ProcessServer,
    data_dir: &std::path::Path,
    acked: &[Acked],
    bytes_from: usize,
) {
    let mut p = server.payloads(ALICE).await;
    for (i, a) in acked.iter().enumerate() {
        let stat = p
            .stat(proto::PayloadRequest {
                payload_id: a.id.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("acknowledged payload {} lost: {e}", a.id))
            .into_inner();
        assert_eq!(
            (stat.sha256.as_str(), stat.size_bytes),
            (a.sha256.as_str(), a.size),
            "{}",
            a.id
        );
        if i >= bytes_from {
            let bytes = download(&mut p, &a.id).await.unwrap();
            assert_eq!(sha256_hex(&bytes), a.sha256, "bytes of {} changed", a.id);
        }
    }
    // No temporary or orphan file: each session directory holds exactly the
    // files its metadata names.
    let sessions = server
        .sessions(ALICE)
        .await
        .list_sessions(proto::ListSessionsRequest::default())
        .await
        .unwrap();
    for s in sessions.into_inner().sessions {
        let mut names = Vec::new();
        let mut token = String::new();
        loop {
            let page = p
                .list_payloads(proto::ListPayloadsRequest {
                    session_id: s.id.clone(),
                    page_size: 1000,
                    page_token: token,
                })
                .await
                .unwrap()
                .into_inner();
            names.extend(page.payloads.into_iter().map(|x| x.name));
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token;
        }
        names.sort();
        assert_eq!(
            session_files(data_dir, &s.id),
            names,
            "session {} holds stray files",
            s.id
        );
    }
    for entry in std::fs::read_dir(data_dir.join("sessions")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            name.starts_with("ses_"),
            "stray entry {name:?} in the sessions directory"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_uploads_survive_kill_9_and_leave_no_orphans() {
    let seed: u64 = std::env::var("SPILLWAY_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("crash test seed {seed} (set SPILLWAY_CRASH_SEED to replay)");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let data_dir = dir.path().join("data");
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let mut interrupted = 0usize;
    let mut verified_bytes = 0usize;

    for round in 0..ROUNDS {
        let mut server = ProcessServer::start(
            Some(&config),
            &data_dir,
            dir.path().join(format!("round{round}.log")),
        )
        .await;
        let snapshot = acked.lock().unwrap().clone();
        verify_all(&server, &data_dir, &snapshot, verified_bytes).await;
        verified_bytes = snapshot.len();

        let session = server
            .sessions(ALICE)
            .await
            .create_session(proto::CreateSessionRequest::default())
            .await
            .unwrap()
            .into_inner();
        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(server.payloads(ALICE).await);
        }
        // Kill at a random moment: once a random number of uploads have been
        // acknowledged, with the rest still in flight.
        let kill_after = rng.random_range(1..UPLOADS_PER_ROUND / 4);
        let acked_before = acked.lock().unwrap().len();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..UPLOADS_PER_ROUND {
            let size = rng.random_range(1_000..1_000_000);
            let mut data = vec![0u8; size];
            rng.fill_bytes(&mut data);
            let mut client = clients[i % clients.len()].clone();
            let session_id = session.id.clone();
            let acked = acked.clone();
            tasks.spawn(async move {
                let h = header(&session_id, &format!("r{round}-{i}.bin"));
                match upload(&mut client, h, &data).await {
                    Ok(p) => {
                        acked.lock().unwrap().push(Acked {
                            id: p.id,
                            session: session_id,
                            sha256: sha256_hex(&data),
                            size: data.len() as u64,
                        });
                        true
                    }
                    Err(_) => false,
                }
            });
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while acked.lock().unwrap().len() - acked_before < kill_after
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        server.kill9();
        while let Some(done) = tasks.join_next().await {
            if !done.unwrap() {
                interrupted += 1;
            }
        }
    }

    let server = ProcessServer::start(Some(&config), &data_dir, dir.path().join("final.log")).await;
    let acked = acked.lock().unwrap().clone();
    verify_all(&server, &data_dir, &acked, 0).await;
    let sessions: std::collections::HashSet<_> = acked.iter().map(|a| a.session.clone()).collect();
    eprintln!(
        "crash test: {} uploads acknowledged and verified across {} sessions, {interrupted} interrupted by kill -9",
        acked.len(),
        sessions.len()
    );
    assert!(
        !acked.is_empty(),
        "no upload was acknowledged: the test proved nothing"
    );
    assert!(
        interrupted > 0,
        "kill -9 never interrupted an upload: the test proved nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_1_gib_upload_grows_server_rss_by_less_than_64_mib() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let server = ProcessServer::start(
        Some(&config),
        &dir.path().join("data"),
        dir.path().join("server.log"),
    )
    .await;
    // Code mode loads its compiled images in the background at startup;
    // measure the upload, not that.
    server.wait_for_log("code mode images ready", Duration::from_secs(300));
    let session = server
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let baseline = server.rss_bytes();
    let sampler = RssSampler::start(server.child.id());

    const TOTAL: usize = 1 << 30;
    const CHUNK: usize = 1 << 20;
    let chunk: bytes::Bytes = (0..CHUNK)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
    for _ in 0..TOTAL / CHUNK {
        sha2::Digest::update(&mut hasher, &chunk);
    }
    let expected = hex::encode(sha2::Digest::finalize(hasher));
    let header_chunk = proto::UploadChunk {
        chunk: Some(proto::upload_chunk::Chunk::Header(header(
            &session.id,
            "huge.bin",
        ))),
    };
    let data_chunks = (0..TOTAL / CHUNK).map(move |_| proto::UploadChunk {
        chunk: Some(proto::upload_chunk::Chunk::Data(chunk.clone())),
    });
    let stream = tokio_stream::iter(std::iter::once(header_chunk).chain(data_chunks));
    let stored = server
        .payloads(ALICE)
        .await
        .upload(stream)
        .await
        .unwrap()
        .into_inner();
    let peak = sampler.stop();

    assert_eq!(stored.size_bytes, TOTAL as u64);
    assert_eq!(stored.sha256, expected);
    let growth = peak.saturating_sub(baseline);
    eprintln!("1 GiB upload: server RSS grew by {} MiB", growth >> 20);
    assert!(
        growth < 64 << 20,
        "server RSS grew by {} MiB during a 1 GiB upload",
        growth >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inspecting_a_1_gib_ndjson_keeps_server_rss_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let server = ProcessServer::start(
        Some(&config),
        &dir.path().join("data"),
        dir.path().join("server.log"),
    )
    .await;
    let session = server
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    // ~10 KiB records, 1 MiB chunks, 1 GiB in all.
    let blob = "x".repeat(10_000);
    let chunks = (0..1024u32).map(move |c| {
        let mut chunk = String::with_capacity(1 << 20);
        let mut i = 0;
        while chunk.len() + blob.len() + 64 < 1 << 20 {
            chunk.push_str(&format!(
                "{{\"id\":{},\"ok\":true,\"blob\":\"{blob}\"}}\n",
                c * 1000 + i
            ));
            i += 1;
        }
        proto::UploadChunk {
            chunk: Some(proto::upload_chunk::Chunk::Data(bytes::Bytes::from(chunk))),
        }
    });
    let mut h = header(&session.id, "huge.ndjson");
    h.content_type = "application/x-ndjson".into();
    let first = proto::UploadChunk {
        chunk: Some(proto::upload_chunk::Chunk::Header(h)),
    };
    let stored = server
        .payloads(ALICE)
        .await
        .upload(tokio_stream::iter(std::iter::once(first).chain(chunks)))
        .await
        .unwrap()
        .into_inner();
    assert!(stored.size_bytes > 1000 << 20, "{}", stored.size_bytes);

    server.wait_for_log("code mode images ready", Duration::from_secs(300));
    let baseline = server.rss_bytes();
    let sampler = RssSampler::start(server.child.id());
    let st = server
        .payloads(ALICE)
        .await
        .inspect(proto::PayloadRequest {
            payload_id: stored.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let peak = sampler.stop();
    let j = st.json.clone().unwrap();
    assert_eq!(st.detected_type, "ndjson");
    assert!(j.record_count > 100_000, "{}", j.record_count);
    assert_eq!(
        j.fields.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        ["id", "ok", "blob"]
    );
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "inspect of {} MiB NDJSON: server RSS grew by {} MiB",
        stored.size_bytes >> 20,
        growth >> 20
    );
    assert!(
        growth < 64 << 20,
        "server RSS grew by {} MiB while inspecting 1 GiB",
        growth >> 20
    );
}
