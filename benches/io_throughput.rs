//! Upload and read throughput over loopback gRPC for a 256 MiB payload,
//! against the machine's raw sequential write + fsync (and raw read) of the
//! same size on the same file system, measured in the same rounds. Uploads
//! are driven two ways: by a client in this process (which competes with
//! the server for CPU on 2 cores), and by the `spillway upload` CLI, the
//! client users run, in its own process. During the CLI's upload this
//! process only serves, so its CPU time per uploaded byte is the server's.
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
/// verify integrity before it acknowledges. `pipelined`: the hash runs on a
/// second thread beside the writes, as the server's network and disk sides
/// overlap; otherwise one thread hashes and writes in turn, which is slower
/// than the hash and the disk each allow.
fn raw_write_hash_fsync(dir: &std::path::Path, bytes: usize, chunk: &[u8], pipelined: bool) -> f64 {
    use sha2::Digest;
    let path = dir.join("raw-hashed.bin");
    let hash_all = || {
        let mut hasher = sha2::Sha256::new();
        for _ in 0..bytes / CHUNK {
            hasher.update(chunk);
        }
        std::hint::black_box(hasher.finalize());
    };
    let start = Instant::now();
    let mut f = std::fs::File::create(&path).unwrap();
    std::thread::scope(|s| {
        if pipelined {
            s.spawn(hash_all);
        }
        let mut hasher = sha2::Sha256::new();
        for _ in 0..bytes / CHUNK {
            if !pipelined {
                hasher.update(chunk);
            }
            f.write_all(chunk).unwrap();
        }
        f.sync_all().unwrap();
        std::fs::File::open(dir).unwrap().sync_all().unwrap();
        std::hint::black_box(hasher.finalize());
    });
    start.elapsed().as_secs_f64()
}

/// CPU seconds (user + system) this process has used so far.
fn process_cpu() -> f64 {
    let usage = common::rusage();
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Uploads `file` with the `spillway upload` CLI against `server`; returns
/// its wall time, the server's CPU seconds over it and the payload's id.
fn cli_upload(
    server: &BenchServer,
    session: &str,
    name: &str,
    file: &std::path::Path,
    bytes: usize,
) -> (f64, f64, String) {
    let cpu = process_cpu();
    let start = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["upload", "--json", "--session", session, "--name", name])
        .arg(file)
        .env("SPILLWAY_ADDR", server.addr.to_string())
        .env("SPILLWAY_TOKEN", "bench")
        .output()
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    let cpu = process_cpu() - cpu;
    assert!(
        out.status.success(),
        "spillway upload failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        stored["sizeBytes"].as_str(),
        Some(bytes.to_string().as_str()),
        "{stored}"
    );
    (secs, cpu, stored["id"].as_str().unwrap().to_owned())
}

fn raw_read(dir: &std::path::Path) -> f64 {
    let start = Instant::now();
    let mut f = std::fs::File::open(dir.join("raw.bin")).unwrap();
    let mut buf = vec![0u8; CHUNK];
    while f.read(&mut buf).unwrap() > 0 {}
    start.elapsed().as_secs_f64()
}

async fn delete(
    payloads: &mut proto::payloads_client::PayloadsClient<common::Svc>,
    payload_id: String,
) {
    payloads
        .delete_payload(proto::DeletePayloadRequest {
            payload_id,
            reason: String::new(),
        })
        .await
        .unwrap();
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

    // The CLI uploads a file; written once, untimed, so it is in the page
    // cache like a tool result just written.
    let source = dir.path().join("source.bin");
    {
        let mut f = std::fs::File::create(&source).unwrap();
        for _ in 0..bytes / CHUNK {
            f.write_all(&chunk).unwrap();
        }
    }

    // The raw references write beside the payloads, in the session's
    // directory, where the file system allocates for both alike. Every
    // write's file goes before the next write starts, so each reuses the
    // blocks the one before it freed: this virtual disk rewrites freed
    // blocks several times faster than it writes new ones, and a write
    // that got new blocks would not be comparable. One unmeasured write
    // first frees the blocks the first measured write reuses.
    let raw_dir = dir.path().join("data/sessions").join(&session.id);
    assert!(
        raw_dir.is_dir(),
        "no session directory at {}",
        raw_dir.display()
    );
    let mut raw_cpu = vec![];
    let (mut raw_w, mut raw_wh, mut raw_wh2, mut raw_r) = (vec![], vec![], vec![], vec![]);
    let (mut up, mut cli, mut cli_cpu, mut down, mut read) =
        (vec![], vec![], vec![], vec![], vec![]);
    raw_write_fsync(&raw_dir, bytes, &chunk);
    std::fs::remove_file(raw_dir.join("raw.bin")).unwrap();
    for round in 0..rounds {
        let cpu = process_cpu();
        raw_w.push(raw_write_fsync(&raw_dir, bytes, &chunk));
        raw_cpu.push(process_cpu() - cpu);
        raw_r.push(raw_read(&raw_dir));
        std::fs::remove_file(raw_dir.join("raw.bin")).unwrap();
        for (pipelined, times) in [(false, &mut raw_wh), (true, &mut raw_wh2)] {
            times.push(raw_write_hash_fsync(&raw_dir, bytes, &chunk, pipelined));
            std::fs::remove_file(raw_dir.join("raw-hashed.bin")).unwrap();
        }

        let (secs, cpu, cli_id) = cli_upload(
            &server,
            &session.id,
            &format!("cli-{round}.bin"),
            &source,
            bytes,
        );
        cli.push(secs);
        cli_cpu.push(cpu);
        delete(&mut payloads, cli_id).await;

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
        delete(&mut payloads, stored.id).await;
    }
    server.stop().await;

    let rate = |secs: f64| mib as f64 / secs;
    // Each round's figures too: this disk writes at two speeds (see the
    // round loop), and the medians hide which each round got.
    let per_round = |v: &[f64]| {
        v.iter()
            .map(|&s| format!("{:.0}", rate(s)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let rounds_note = format!(
        "Each round, MiB/s: raw write + fsync {}; raw write + SHA-256 + fsync, two threads {}; CLI upload {}; in-process upload {}.",
        per_round(&raw_w),
        per_round(&raw_wh2),
        per_round(&cli),
        per_round(&up)
    );
    let (rw, rwh, rwh2, rr) = (
        rate(median(raw_w)),
        rate(median(raw_wh)),
        rate(median(raw_wh2)),
        rate(median(raw_r)),
    );
    let (u, c, d, r) = (
        rate(median(up)),
        rate(median(cli)),
        rate(median(down)),
        rate(median(read)),
    );
    let ns_per_byte = median(cli_cpu) * 1e9 / bytes as f64;
    let raw_ns_per_byte = median(raw_cpu) * 1e9 / bytes as f64;
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
    println!("| raw write + SHA-256 + fsync (hash on a second thread) | {rwh2:.0} | - | - |");
    println!("| raw sequential read (page cache) | {rr:.0} | - | - |");
    println!(
        "| Upload, `spillway upload` CLI (durable) | {c:.0} | raw write + fsync | {:.2} |",
        c / rw
    );
    println!(
        "| Upload, `spillway upload` CLI (durable) | {c:.0} | raw write + SHA-256 + fsync, two threads | {:.2} |",
        c / rwh2
    );
    println!(
        "| Upload, client in the bench process (durable) | {u:.0} | raw write + fsync | {:.2} |",
        u / rw
    );
    println!(
        "| Upload, client in the bench process (durable) | {u:.0} | raw write + SHA-256 + fsync, two threads | {:.2} |",
        u / rwh2
    );
    println!("| Download over gRPC | {d:.0} | raw read | {:.2} |", d / rr);
    println!(
        "| Read 4 MiB ranges over gRPC | {r:.0} | raw read | {:.2} |",
        r / rr
    );
    println!();
    println!("{rounds_note}");
    println!();
    println!(
        "Server CPU during the CLI's uploads (user + system, median): {ns_per_byte:.2} ns per uploaded byte; the raw write + fsync of the same bytes took {raw_ns_per_byte:.2} ns per byte (the kernel's copy into the page cache)."
    );
}
