//! Upload and read throughput over loopback gRPC for a 256 MiB payload,
//! against the machine's raw sequential write + fsync (and raw read) of the
//! same size on the same file system, measured in the same run. The client
//! runs in this process, so on a 2-core machine it competes with the server
//! for CPU; the raw references run alone.
//!
//! `make bench` (or `cargo bench --bench io_throughput`). Set
//! `SPILLWAY_BENCH_MIB` to change the size and `SPILLWAY_BENCH_ROUNDS` the
//! number of rounds (median reported).

use std::io::{Read, Write};
use std::time::Instant;

mod common;

use common::{BenchServer, median};
use spillway::proto::{self, upload_chunk::Chunk};

const CHUNK: usize = 1 << 20;

fn raw_write_fsync(dir: &std::path::Path, bytes: usize, chunk: &[u8]) -> f64 {
    let path = dir.join("raw.bin");
    let start = Instant::now();
    let mut f = std::fs::File::create(&path).unwrap();
    for _ in 0..bytes / CHUNK {
        f.write_all(chunk).unwrap();
    }
    f.sync_all().unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
    start.elapsed().as_secs_f64()
}

/// The same, plus SHA-256 of every byte: the floor for an upload that must
/// verify integrity before it acknowledges.
fn raw_write_hash_fsync(dir: &std::path::Path, bytes: usize, chunk: &[u8]) -> f64 {
    use sha2::Digest;
    let path = dir.join("raw-hashed.bin");
    let start = Instant::now();
    let mut f = std::fs::File::create(&path).unwrap();
    let mut hasher = sha2::Sha256::new();
    for _ in 0..bytes / CHUNK {
        hasher.update(chunk);
        f.write_all(chunk).unwrap();
    }
    f.sync_all().unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
    std::hint::black_box(hasher.finalize());
    let secs = start.elapsed().as_secs_f64();
    std::fs::remove_file(path).unwrap();
    secs
}

fn raw_read(dir: &std::path::Path) -> f64 {
    let start = Instant::now();
    let mut f = std::fs::File::open(dir.join("raw.bin")).unwrap();
    let mut buf = vec![0u8; CHUNK];
    while f.read(&mut buf).unwrap() > 0 {}
    start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let mib: usize = std::env::var("SPILLWAY_BENCH_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let rounds: usize = std::env::var("SPILLWAY_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let bytes = mib << 20;
    let chunk: Vec<u8> = (0..CHUNK).map(|i| (i * 7 % 251) as u8).collect();

    let server = BenchServer::start(|_| {}).await;
    let dir = &server.dir;
    let mut sessions = server.sessions.clone();
    let mut payloads = server.payloads.clone();
    let session = sessions
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();

    let (mut raw_w, mut raw_wh, mut raw_r) = (vec![], vec![], vec![]);
    let (mut up, mut down, mut read) = (vec![], vec![], vec![]);
    for round in 0..rounds {
        raw_w.push(raw_write_fsync(dir.path(), bytes, &chunk));
        raw_wh.push(raw_write_hash_fsync(dir.path(), bytes, &chunk));
        raw_r.push(raw_read(dir.path()));
        std::fs::remove_file(dir.path().join("raw.bin")).unwrap();

        let header = proto::UploadChunk {
            chunk: Some(Chunk::Header(proto::UploadHeader {
                session_id: session.id.clone(),
                name: format!("bench-{round}.bin"),
                ..Default::default()
            })),
        };
        let data = bytes::Bytes::from(chunk.clone());
        let stream = tokio_stream::iter(std::iter::once(header).chain((0..bytes / CHUNK).map(
            move |_| proto::UploadChunk {
                chunk: Some(Chunk::Data(data.clone())),
            },
        )));
        let start = Instant::now();
        let stored = payloads.upload(stream).await.unwrap().into_inner();
        up.push(start.elapsed().as_secs_f64());
        assert_eq!(stored.size_bytes, bytes as u64);

        let start = Instant::now();
        let mut s = payloads
            .download(proto::PayloadRequest {
                payload_id: stored.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let mut got = 0usize;
        while let Some(c) = s.message().await.unwrap() {
            got += c.data.len();
        }
        down.push(start.elapsed().as_secs_f64());
        assert_eq!(got, bytes);

        let start = Instant::now();
        let mut offset = 0u64;
        while offset < bytes as u64 {
            let r = payloads
                .read(proto::ReadRequest {
                    payload_id: stored.id.clone(),
                    max_bytes: 4 << 20,
                    range: Some(proto::read_request::Range::ByteRange(proto::ByteRange {
                        offset,
                        length: 4 << 20,
                    })),
                })
                .await
                .unwrap()
                .into_inner();
            offset = r.end_offset;
        }
        read.push(start.elapsed().as_secs_f64());
        payloads
            .delete_payload(proto::DeletePayloadRequest {
                payload_id: stored.id,
                reason: String::new(),
            })
            .await
            .unwrap();
    }
    server.stop().await;

    let rate = |secs: f64| mib as f64 / secs;
    let (rw, rwh, rr) = (
        rate(median(raw_w)),
        rate(median(raw_wh)),
        rate(median(raw_r)),
    );
    let (u, d, r) = (rate(median(up)), rate(median(down)), rate(median(read)));
    println!(
        "payload {mib} MiB, {rounds} rounds, median MiB/s, {} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!("| measurement | MiB/s | reference | ratio |");
    println!("| --- | --- | --- | --- |");
    println!("| raw write + fsync | {rw:.0} | - | - |");
    println!("| raw write + SHA-256 + fsync (one thread) | {rwh:.0} | - | - |");
    println!("| raw sequential read (page cache) | {rr:.0} | - | - |");
    println!(
        "| Upload over gRPC (durable) | {u:.0} | raw write + fsync | {:.2} |",
        u / rw
    );
    println!(
        "| Upload over gRPC (durable) | {u:.0} | raw write + SHA-256 + fsync | {:.2} |",
        u / rwh
    );
    println!("| Download over gRPC | {d:.0} | raw read | {:.2} |", d / rr);
    println!(
        "| Read 4 MiB ranges over gRPC | {r:.0} | raw read | {:.2} |",
        r / rr
    );
}
