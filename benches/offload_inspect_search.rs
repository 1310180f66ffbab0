//! Issue 3's benches, each a ratio against a reference measured in the same
//! run:
//!
//! - Offload of one turn of 8 results totalling 50 MB (decision, previews,
//!   durable storage) against raw write + fsync of the same 8 buffers;
//! - Offload decisions per second: turns of 8 small results that stay
//!   inline, against the same number of gRPC health checks (the floor of any
//!   call on the connection);
//! - Inspect of a 200 MB JSON array against `serde_json` parsing the same
//!   file into a `Value`;
//! - Search of a 500 MB text payload against `rg` on the same file.
//!
//! `make bench` runs it. Every round uses fresh content or a fresh session,
//! so no cache or deduplication shortcut is measured.

mod common;

use std::io::Write;
use std::process::Command;

use common::{BenchServer, machine, median, rounds, time_sync};
use spillway::proto;

const MB: usize = 1_000_000;

fn json_records(total: usize, salt: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(total + 256);
    out.push(b'[');
    let mut i = 0usize;
    while out.len() < total {
        if i > 0 {
            out.push(b',');
        }
        write!(
            out,
            "{{\"id\":{i},\"salt\":{salt},\"title\":\"Fix flaky test number {i} in the scheduler\",\"user\":{{\"login\":\"dev{}\",\"site_admin\":false}},\"labels\":[{{\"name\":\"bug\"}},{{\"name\":\"ci\"}}],\"comments\":{}}}",
            i % 977,
            i % 31
        )
        .unwrap();
        i += 1;
    }
    out.push(b']');
    out
}

fn log_text(total: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(total + 256);
    let mut i = 0usize;
    while out.len() < total {
        if i % 50_000 == 49_999 {
            writeln!(
                out,
                "2026-11-30T10:00:{:02}Z ERROR worker-{} quota_exceeded for tenant acme-{i}",
                i % 60,
                i % 7
            )
            .unwrap();
        } else {
            writeln!(
                out,
                "2026-11-30T10:00:{:02}Z INFO worker-{} processed batch {i} in {} ms",
                i % 60,
                i % 7,
                i % 997
            )
            .unwrap();
        }
        i += 1;
    }
    out
}

async fn new_session(server: &mut BenchServer) -> String {
    server
        .sessions
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .id
}

#[tokio::main]
async fn main() {
    let rounds = rounds();
    let mut server = BenchServer::start(|c| c.limits.max_offload_request_bytes = 128 << 20).await;
    let dir = server.dir.path().to_path_buf();
    println!(
        "# Offload, Inspect and Search ({}, median of {rounds} rounds)\n",
        machine()
    );
    println!("| measurement | time | throughput | reference | reference time | ratio |");
    println!("| --- | --- | --- | --- | --- | --- |");

    // Offload: 8 results, 50 MB.
    let sizes = [
        20 * MB,
        10 * MB,
        8 * MB,
        5 * MB,
        3 * MB,
        2 * MB,
        1_500_000,
        500_000,
    ];
    let total: usize = sizes.iter().sum();
    let mut offload_times = Vec::new();
    let mut raw_times = Vec::new();
    for round in 0..rounds {
        let contents: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| json_records(n, round * 100 + i))
            .collect();
        // Reference: write and fsync the same buffers.
        raw_times.push(time_sync(1, || {
            let raw = dir.join(format!("raw-offload-{round}"));
            std::fs::create_dir_all(&raw).unwrap();
            for (i, c) in contents.iter().enumerate() {
                let mut f = std::fs::File::create(raw.join(format!("{i}.json"))).unwrap();
                f.write_all(c).unwrap();
                f.sync_all().unwrap();
            }
            std::fs::File::open(&raw).unwrap().sync_all().unwrap();
        }));
        let session = new_session(&mut server).await;
        let results = contents
            .into_iter()
            .enumerate()
            .map(|(i, c)| proto::ToolResult {
                tool_call_id: format!("call_{i}"),
                tool_name: "github_list_prs".into(),
                content: c.into(),
                content_type: "application/json".into(),
                is_error: false,
            })
            .collect();
        let t = std::time::Instant::now();
        let reply = server
            .payloads
            .offload(proto::OffloadRequest {
                session_id: session,
                turn: 1,
                results,
                settings: None,
            })
            .await
            .unwrap()
            .into_inner();
        offload_times.push(t.elapsed().as_secs_f64());
        assert!(
            reply.outcomes.iter().all(|o| o.payload.is_some()),
            "every result is offloaded"
        );
    }
    let (o, r) = (median(offload_times), median(raw_times));
    println!(
        "| Offload, 8 results, {} MB | {:.0} ms | {:.0} MB/s | raw write + fsync of the 8 | {:.0} ms | {:.2} |",
        total / MB,
        o * 1e3,
        total as f64 / MB as f64 / o,
        r * 1e3,
        r / o
    );

    // Offload decisions: turns of 8 small results that all stay inline, one
    // after another, against the floor of any RPC on the same connection (a
    // gRPC health check).
    let calls = 2000;
    let session = new_session(&mut server).await;
    let small: Vec<proto::ToolResult> = (0..8)
        .map(|i| proto::ToolResult {
            tool_call_id: format!("call_{i}"),
            tool_name: "grep".into(),
            content: json_records(2_000, i).into(),
            content_type: "application/json".into(),
            is_error: false,
        })
        .collect();
    let mut decide_times = Vec::new();
    let mut floor_times = Vec::new();
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel.clone());
    for _ in 0..rounds {
        let t = std::time::Instant::now();
        for turn in 0..calls {
            let reply = server
                .payloads
                .offload(proto::OffloadRequest {
                    session_id: session.clone(),
                    turn,
                    results: small.clone(),
                    settings: None,
                })
                .await
                .unwrap()
                .into_inner();
            assert!(reply.outcomes.iter().all(|o| o.payload.is_none()));
        }
        decide_times.push(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        for _ in 0..calls {
            health
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .unwrap();
        }
        floor_times.push(t.elapsed().as_secs_f64());
    }
    let (d, f) = (median(decide_times), median(floor_times));
    println!(
        "| Offload decisions, {calls} turns of 8 × 2 KB inline results | {:.0} ms | {:.0} decisions/s ({:.0} turns/s) | {calls} gRPC health checks | {:.0} ms | {:.2} |",
        d * 1e3,
        f64::from(calls) * 8.0 / d,
        f64::from(calls) / d,
        f * 1e3,
        f / d
    );

    // Inspect: 200 MB JSON array vs serde_json.
    let json = json_records(200 * MB, 0);
    let json_path = dir.join("inspect-reference.json");
    std::fs::write(&json_path, &json).unwrap();
    let mut inspect_times = Vec::new();
    let mut records = 0;
    for round in 0..rounds {
        // Other bytes each round: Inspect results are cached by content
        // hash, and identical bytes would measure the cache.
        let json = json_records(200 * MB, round + 1);
        let session = new_session(&mut server).await;
        let p = server.upload(&session, "prs.json", &json).await;
        let t = std::time::Instant::now();
        let s = server
            .payloads
            .inspect(proto::PayloadRequest { payload_id: p.id })
            .await
            .unwrap()
            .into_inner();
        inspect_times.push(t.elapsed().as_secs_f64());
        records = s.json.unwrap().record_count;
    }
    let serde_time = time_sync(rounds, || {
        let bytes = std::fs::read(&json_path).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v.as_array().unwrap().len() as u64, records);
    });
    let i = median(inspect_times);
    println!(
        "| Inspect, 200 MB JSON array ({records} records) | {:.0} ms | {:.0} MB/s | serde_json::from_slice to Value | {:.0} ms | {:.2} |",
        i * 1e3,
        200.0 / i,
        serde_time * 1e3,
        serde_time / i
    );

    // Search: 500 MB text vs ripgrep.
    let text = log_text(500 * MB);
    let text_path = dir.join("search-reference.log");
    std::fs::write(&text_path, &text).unwrap();
    let session = new_session(&mut server).await;
    let p = server.upload(&session, "app.log", &text).await;
    let pattern = "ERROR worker-[0-9]+ quota_exceeded";
    let mut found = 0;
    let mut search_times = Vec::new();
    for _ in 0..rounds {
        let t = std::time::Instant::now();
        let r = server
            .payloads
            .search(proto::SearchRequest {
                session_id: session.clone(),
                payload_ids: vec![p.id.clone()],
                pattern: pattern.into(),
                max_matches: 10_000,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        search_times.push(t.elapsed().as_secs_f64());
        assert!(!r.truncated);
        found = r.matches.len();
    }
    let s = median(search_times);
    let rg = Command::new("rg").arg("--version").output().is_ok();
    if rg {
        let rg_time = time_sync(rounds, || {
            let out = Command::new("rg")
                .args(["-n", pattern])
                .arg(&text_path)
                .output()
                .unwrap();
            assert_eq!(out.stdout.iter().filter(|&&b| b == b'\n').count(), found);
        });
        println!(
            "| Search, 500 MB text ({found} matches) | {:.0} ms | {:.0} MB/s | rg -n on the same file | {:.0} ms | {:.2} |",
            s * 1e3,
            500.0 / s,
            rg_time * 1e3,
            rg_time / s
        );
    } else {
        println!(
            "| Search, 500 MB text ({found} matches) | {:.0} ms | {:.0} MB/s | rg not installed | - | - |",
            s * 1e3,
            500.0 / s
        );
    }
    println!("\nratio = reference time / Spillway time: above 1 means Spillway was faster.");
    server.stop().await;
}
