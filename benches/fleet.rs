//! Issue 17's bench: the same work on the embedded default (redb and a local
//! directory) and on one fleet-mode replica (Postgres for metadata, a
//! SeaweedFS bucket for bytes, both started by `spillway::testing` on free
//! loopback ports), each figure a ratio in the same run:
//!
//! - Upload of 1 MB and of 16 MB (multipart in the bucket), and the
//!   deletion of the 1 MB payload (its own work, under the fleet-wide
//!   deletion lock, without the wait for the purge confirmation);
//! - Offload of a turn of 8 small results that stay inline, and of a turn
//!   with one 1 MB result offloaded;
//! - Read of 10 lines, Search of a 16 MB log for a fixed string, and a jq
//!   exec over a 4 MB NDJSON payload, each with the replica's local copy
//!   present (warm) and removed first (cold: the call fetches the object);
//! - Postgres round trips per call, from `spillway::metrics`;
//! - throughput of 16 concurrent clients making all-inline Offloads,
//!   10-line Reads (each audited) or GetSessions, with the Postgres round
//!   trips per second they cause.
//!
//! The two servers run in this process one after the other on each round
//! (A/B alternating), with the reaper and the purge log quiet, so the
//! round trips are the calls' own. `make bench` runs it.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Auth, BenchServer, machine, median, rounds};
use spillway::config::EngineKind;
use spillway::proto::{self, code_mode_client::CodeModeClient};

const MB: usize = 1_000_000;

fn ndjson(total: usize, salt: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(total + 256);
    let mut i = 0usize;
    while out.len() < total {
        writeln!(
            out,
            "{{\"id\":{i},\"salt\":{salt},\"status\":\"{}\",\"amount\":{},\"note\":\"row {i} of the bench\"}}",
            ["open", "closed", "merged"][i % 3],
            i % 997
        )
        .unwrap();
        i += 1;
    }
    out
}

fn log_text(total: usize, salt: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(total + 256);
    let mut i = 0usize;
    while out.len() < total {
        if i % 50_000 == 49_999 {
            writeln!(
                out,
                "{salt} ERROR worker-{} quota_exceeded for tenant acme-{i}",
                i % 7
            )
            .unwrap();
        } else {
            writeln!(
                out,
                "{salt} INFO worker-{} processed batch {i} in {} ms",
                i % 7,
                i % 997
            )
            .unwrap();
        }
        i += 1;
    }
    out
}

/// One server under test, with what the bench needs of it.
struct Side {
    name: &'static str,
    server: BenchServer,
    code: CodeModeClient<common::Svc>,
    session: String,
    /// Fleet mode: local copies are a cache of the bucket.
    fleet: bool,
}

impl Side {
    async fn start(
        name: &'static str,
        fleet: Option<(&str, &str, spillway::store::S3Config)>,
    ) -> Side {
        let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-images");
        let is_fleet = fleet.is_some();
        let mut server = BenchServer::start(|c| {
            c.sandbox.images_dir = images.clone();
            c.sandbox.cache_dir = Some(images.join("build/compile-cache"));
            c.limits.max_offload_request_bytes = 64 << 20;
            c.reaper.interval = Duration::from_secs(3600);
            if let Some((url, bucket, s3)) = fleet {
                c.store.engine = EngineKind::Postgres;
                c.store.postgres_url = url.to_owned();
                c.store.blobs = bucket.to_owned();
                c.store.s3 = s3;
                c.store.purge_interval = Duration::from_secs(3600);
                // A deletion's own work, without waiting for the purge
                // confirmation (the purge log is quiet here).
                c.store.purge_confirm_timeout = Duration::ZERO;
            }
        })
        .await;
        let a: Auth = common::auth;
        let code = CodeModeClient::with_interceptor(server.channel.clone(), a)
            .max_decoding_message_size(64 << 20);
        let session = server
            .sessions
            .create_session(proto::CreateSessionRequest::default())
            .await
            .unwrap()
            .into_inner()
            .id;
        Side {
            name,
            server,
            code,
            session,
            fleet: is_fleet,
        }
    }

    async fn upload(&mut self, name: &str, data: &[u8]) -> proto::Payload {
        self.server.upload(&self.session, name, data).await
    }

    /// The replica's local copy of `p`.
    fn local_copy(&self, p: &proto::Payload) -> PathBuf {
        self.server
            .dir
            .path()
            .join("data/sessions")
            .join(&p.session_id)
            .join(&p.name)
    }

    /// Removes the local copy (fleet mode), so the next call fetches it.
    fn make_cold(&self, p: &proto::Payload) {
        if self.fleet {
            std::fs::remove_file(self.local_copy(p)).unwrap();
        }
    }
}

/// Seconds and Postgres round trips of one call.
async fn measure<Fut: std::future::Future<Output = ()>>(call: Fut) -> (f64, u64) {
    let trips = spillway::metrics::postgres_round_trips();
    let t = Instant::now();
    call.await;
    (
        t.elapsed().as_secs_f64(),
        spillway::metrics::postgres_round_trips() - trips,
    )
}

/// Per work item and side: seconds of each measured call, and round trips.
#[derive(Default)]
struct Samples {
    secs: Vec<f64>,
    trips: Vec<u64>,
}

impl Samples {
    fn add(&mut self, (s, t): (f64, u64)) {
        self.secs.push(s);
        self.trips.push(t);
    }
}

const WORK: [&str; 11] = [
    "Upload 1 MB",
    "DeletePayload (1 MB), no purge wait",
    "Upload 16 MB (multipart)",
    "Offload, 8 small results, all inline",
    "Offload, one 1 MB result offloaded",
    "Read 10 lines of 16 MB, warm",
    "Read 10 lines of 16 MB, cold",
    "Search 16 MB (fixed string), warm",
    "Search 16 MB (fixed string), cold",
    "jq exec over 4 MB NDJSON, warm",
    "jq exec over 4 MB NDJSON, cold",
];

async fn round(side: &mut Side, r: usize, out: &mut [Samples]) {
    let small = ndjson(MB, r);
    let big = log_text(16 * MB, r);
    let rows = ndjson(4 * MB, r + 1000);
    let tag = side.name;
    let mut one = None;
    out[0].add(
        measure(async { one = Some(side.upload(&format!("u1-{tag}-{r}"), &small).await) }).await,
    );
    let one = one.unwrap();
    let payloads = &mut side.server.payloads;
    out[1].add(
        measure(async {
            payloads
                .delete_payload(proto::DeletePayloadRequest {
                    payload_id: one.id.clone(),
                    reason: "bench".into(),
                })
                .await
                .unwrap();
        })
        .await,
    );
    let mut log = None;
    out[2].add(
        measure(async { log = Some(side.upload(&format!("u16-{tag}-{r}"), &big).await) }).await,
    );
    let log = log.unwrap();
    let session = side.session.clone();
    // 20 inline turns per round, each measured.
    for turn in 0..20u32 {
        let req = proto::OffloadRequest {
            session_id: session.clone(),
            turn: 1 + turn + 100 * r as u32,
            results: (0..8)
                .map(|i| proto::ToolResult {
                    tool_call_id: format!("c{i}"),
                    tool_name: "tool".into(),
                    content: format!("{{\"ok\":true,\"i\":{i}}}").into_bytes().into(),
                    ..Default::default()
                })
                .collect(),
            settings: None,
        };
        let payloads = &mut side.server.payloads;
        out[3].add(
            measure(async {
                let o = payloads.offload(req).await.unwrap().into_inner();
                assert!(o.outcomes.iter().all(|o| o.payload.is_none()));
            })
            .await,
        );
    }
    let req = proto::OffloadRequest {
        session_id: session.clone(),
        turn: 99_999 - r as u32,
        results: vec![proto::ToolResult {
            tool_call_id: "big".into(),
            tool_name: "tool".into(),
            content: ndjson(MB, r + 2000).into(),
            ..Default::default()
        }],
        settings: None,
    };
    let payloads = &mut side.server.payloads;
    out[4].add(
        measure(async {
            let o = payloads.offload(req).await.unwrap().into_inner();
            assert!(o.outcomes[0].payload.is_some());
        })
        .await,
    );

    let read = |line: u64| proto::ReadRequest {
        payload_id: log.id.clone(),
        range: Some(proto::read_request::Range::LineRange(proto::LineRange {
            start_line: line,
            end_line: line + 9,
        })),
        ..Default::default()
    };
    side.make_cold(&log);
    let payloads = &mut side.server.payloads;
    out[6].add(measure(async { drop(payloads.read(read(200_000)).await.unwrap()) }).await);
    for i in 0..20 {
        let payloads = &mut side.server.payloads;
        out[5]
            .add(measure(async { drop(payloads.read(read(1 + 9_000 * i)).await.unwrap()) }).await);
    }

    let search = || proto::SearchRequest {
        session_id: session.clone(),
        payload_ids: vec![log.id.clone()],
        pattern: "quota_exceeded".into(),
        fixed_string: true,
        max_matches: 100,
        ..Default::default()
    };
    side.make_cold(&log);
    let payloads = &mut side.server.payloads;
    out[8].add(
        measure(async {
            assert!(
                !payloads
                    .search(search())
                    .await
                    .unwrap()
                    .into_inner()
                    .matches
                    .is_empty()
            );
        })
        .await,
    );
    for _ in 0..3 {
        let payloads = &mut side.server.payloads;
        out[7].add(
            measure(async {
                assert!(
                    !payloads
                        .search(search())
                        .await
                        .unwrap()
                        .into_inner()
                        .matches
                        .is_empty()
                );
            })
            .await,
        );
    }

    let input = side.upload(&format!("rows-{tag}-{r}.ndjson"), &rows).await;
    let exec = || proto::ExecRequest {
        session_id: session.clone(),
        runtime: "jq".into(),
        source: "reduce inputs as $r ({}; .[$r.status] += $r.amount)".into(),
        inputs: vec![input.id.clone()],
        args: vec!["-n".into(), "-c".into()],
        ..Default::default()
    };
    side.make_cold(&input);
    let code = &mut side.code;
    out[10].add(
        measure(async {
            let o = code.exec(exec()).await.unwrap().into_inner();
            assert!(o.stdout.contains("open"), "{o:?}");
        })
        .await,
    );
    for _ in 0..3 {
        let code = &mut side.code;
        out[9].add(
            measure(async {
                let o = code.exec(exec()).await.unwrap().into_inner();
                assert!(o.stdout.contains("open"), "{o:?}");
            })
            .await,
        );
    }
}

/// Calls per second, and Postgres round trips per second, of `clients`
/// concurrent clients each making `call` until `for_how_long` passes.
async fn throughput<F, Fut>(clients: usize, for_how_long: Duration, call: F) -> (f64, f64)
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let trips = spillway::metrics::postgres_round_trips();
    let start = Instant::now();
    let deadline = start + for_how_long;
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    call(c, n).await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut calls = 0;
    for t in tasks {
        calls += t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let trips = spillway::metrics::postgres_round_trips() - trips;
    (calls as f64 / secs, trips as f64 / secs)
}

/// The throughput table: each work item on each side, A/B.
async fn throughput_table(embedded: &mut Side, fleet: &mut Side, clients: usize, secs: u64) {
    println!(
        "\n## Throughput, {clients} concurrent clients for {secs} s per work item and side (one tenant)\n"
    );
    println!(
        "| work | embedded calls/s | fleet calls/s | fleet / embedded | fleet Postgres round trips/s |"
    );
    println!("| --- | --- | --- | --- | --- |");
    let d = Duration::from_secs(secs);
    let mut rows: Vec<(&str, [f64; 3])> = Vec::new();
    let mut logs = Vec::new();
    for side in [&mut *embedded, &mut *fleet] {
        let p = side.upload("tp-log", &log_text(16 * MB, 7)).await;
        logs.push(p);
    }
    for (w, name) in [
        "Offload, 8 small results, all inline",
        "Read 10 lines, warm",
        "GetSession",
    ]
    .into_iter()
    .enumerate()
    {
        let mut figures = [0.0; 3];
        for (i, side) in [&*embedded, &*fleet].into_iter().enumerate() {
            let payloads = side.server.payloads.clone();
            let sessions = side.server.sessions.clone();
            let session = side.session.clone();
            let log = logs[i].id.clone();
            let (calls, trips) = throughput(clients, d, move |c, n| {
                let (mut payloads, mut sessions) = (payloads.clone(), sessions.clone());
                let (session, log) = (session.clone(), log.clone());
                async move {
                    match w {
                        0 => {
                            let req = proto::OffloadRequest {
                                session_id: session,
                                turn: 1_000_000 + (c as u32) * 100_000 + n as u32,
                                results: (0..8)
                                    .map(|i| proto::ToolResult {
                                        tool_call_id: format!("c{i}"),
                                        tool_name: "tool".into(),
                                        content: format!("{{\"ok\":{i}}}").into_bytes().into(),
                                        ..Default::default()
                                    })
                                    .collect(),
                                settings: None,
                            };
                            payloads.offload(req).await.unwrap();
                        }
                        1 => {
                            let line = 1 + (n * 7919 + c as u64 * 104_729) % 300_000;
                            payloads
                                .read(proto::ReadRequest {
                                    payload_id: log,
                                    range: Some(proto::read_request::Range::LineRange(
                                        proto::LineRange {
                                            start_line: line,
                                            end_line: line + 9,
                                        },
                                    )),
                                    ..Default::default()
                                })
                                .await
                                .unwrap();
                        }
                        _ => {
                            sessions
                                .get_session(proto::GetSessionRequest {
                                    session_id: session,
                                })
                                .await
                                .unwrap();
                        }
                    }
                }
            })
            .await;
            figures[i] = calls;
            if i == 1 {
                figures[2] = trips;
            }
        }
        rows.push((name, figures));
    }
    for (name, [e, f, trips]) in rows {
        println!("| {name} | {e:.0} | {f:.0} | {:.2} | {trips:.0} |", f / e);
    }
}

fn ms(s: f64) -> String {
    if s < 0.01 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

#[tokio::main]
async fn main() {
    let rounds = rounds();
    let db = spillway::testing::postgres::database();
    let (bucket, s3) = spillway::testing::s3::bucket();
    let mut embedded = Side::start("embedded", None).await;
    let url = db.url();
    let mut fleet = Side::start("fleet", Some((&url, &bucket, s3))).await;
    // Compile the jq image once on each side before anything is timed.
    for side in [&mut embedded, &mut fleet] {
        let r = side
            .code
            .exec(proto::ExecRequest {
                session_id: side.session.clone(),
                runtime: "jq".into(),
                source: "1".into(),
                args: vec!["-n".into()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.stdout, "1\n", "{r:?}");
    }
    // One unmeasured round on each side first: connections, prepared
    // statements, the bucket's first writes.
    let mut warmup: Vec<Samples> = WORK.iter().map(|_| Samples::default()).collect();
    round(&mut embedded, 1_000, &mut warmup).await;
    round(&mut fleet, 1_000, &mut warmup).await;
    let mut e: Vec<Samples> = WORK.iter().map(|_| Samples::default()).collect();
    let mut f: Vec<Samples> = WORK.iter().map(|_| Samples::default()).collect();
    for r in 0..rounds {
        // Alternate which side goes first.
        if r % 2 == 0 {
            round(&mut embedded, r, &mut e).await;
            round(&mut fleet, r, &mut f).await;
        } else {
            round(&mut fleet, r, &mut f).await;
            round(&mut embedded, r, &mut e).await;
        }
    }
    println!(
        "# Fleet mode against embedded ({}, one replica, {rounds} rounds alternating A/B after one unmeasured round)\n",
        machine()
    );
    println!(
        "Embedded: redb and a local directory. Fleet: `store.engine = \"postgres\"` (PostgreSQL 15 on loopback) and `store.blobs = \"s3://…\"` (SeaweedFS on loopback), the server in this process. Warm: the replica's local copy is present; cold: removed before the call, which then fetches the object. Times are medians over the calls measured (Offload all-inline: 20 per round; warm Read: 20; warm Search and exec: 3; the rest: 1); DeletePayload on the fleet side does not wait for the purge confirmation (`purge_confirm_timeout = 0`), which adds about one `purge_interval`; ratio = fleet / embedded (above 1: fleet is slower). Round trips: Postgres round trips per fleet call, median (min-max).\n"
    );
    println!("| work | embedded | fleet | fleet / embedded | Postgres round trips |");
    println!("| --- | --- | --- | --- | --- |");
    for (i, w) in WORK.iter().enumerate() {
        let (es, fs) = (median(e[i].secs.clone()), median(f[i].secs.clone()));
        let trips = &f[i].trips;
        let mut sorted = trips.clone();
        sorted.sort_unstable();
        let (lo, hi, mid) = (
            sorted[0],
            sorted[sorted.len() - 1],
            sorted[sorted.len() / 2],
        );
        let range = if lo == hi {
            format!("{mid}")
        } else {
            format!("{mid} ({lo}-{hi})")
        };
        println!(
            "| {w} | {} | {} | {:.2} | {range} |",
            ms(es),
            ms(fs),
            fs / es
        );
    }
    throughput_table(&mut embedded, &mut fleet, 16, 5).await;
    embedded.server.stop().await;
    fleet.server.stop().await;
    drop(db);
}
