//! Fleet mode under faults: three replicas of the real binary on one
//! Postgres cluster and one SeaweedFS server of the scenario's own
//! (`spillway::testing::{postgres, s3}::dedicated`), with clients on every
//! replica running mixed Upload, Offload, Read and Stat calls throughout.
//!
//! 1. **kill -9** of a random replica, then its restart on the same
//!    address, round after round: the clients of the other replicas see no
//!    error, and those of the killed one see UNAVAILABLE only while it is
//!    down (from the kill until a grace after it serves again).
//! 2. **Postgres restarted** (SIGINT, as `pg_ctl stop -m fast`, then
//!    started on the same port): calls fail with UNAVAILABLE naming
//!    Postgres, and every replica serves again on its own.
//! 3. **SeaweedFS stopped**, then started: uploads are refused with
//!    UNAVAILABLE naming object storage, while Reads of payloads a replica
//!    holds locally keep working.
//!
//! Afterwards every acknowledged payload is downloaded through a replica
//! and its sha256 compared with the one the client computed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use spillway::proto;
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::*;

const REPLICAS: usize = 3;
/// Clients per replica.
const WORKERS: usize = 2;
/// How long after a fault's end an error is still put down to it: a
/// client's channel reconnects on its next call.
const GRACE: Duration = Duration::from_secs(2);
/// How long an upload may take to be refused while the bucket is down: the
/// store retries 5 times, backing off 2.5 s at the most, within 5 s.
const REFUSAL_BOUND: Duration = Duration::from_secs(6);

/// One call's outcome, as the clients saw it.
#[derive(Debug, Clone)]
struct Event {
    replica: usize,
    rpc: &'static str,
    /// When the call began and ended.
    started: Instant,
    at: Instant,
    error: Option<(Code, String)>,
}

#[derive(Default)]
struct Shared {
    events: Mutex<Vec<Event>>,
    /// Acknowledged payloads: ID -> (replica it was uploaded to, sha256).
    acked: Mutex<BTreeMap<String, (usize, String)>>,
    stop: AtomicBool,
    calls: AtomicU64,
}

impl Shared {
    fn record(
        &self,
        replica: usize,
        rpc: &'static str,
        started: Instant,
        r: Result<(), tonic::Status>,
    ) -> bool {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let error = r
            .err()
            .map(|s| (s.code(), s.message().chars().take(200).collect()));
        let failed = error.is_some();
        self.events.lock().unwrap().push(Event {
            replica,
            rpc,
            started,
            at: Instant::now(),
            error,
        });
        !failed
    }

    /// Errors in `[from, to)`, optionally of one replica only.
    fn errors(&self, from: Instant, to: Instant, replica: Option<usize>) -> Vec<Event> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.error.is_some() && e.at >= from && e.at < to)
            .filter(|e| replica.is_none_or(|r| r == e.replica))
            .cloned()
            .collect()
    }

    /// Calls of `rpc` that began at `from` or later, and succeeded before `to`.
    fn successes(&self, from: Instant, to: Instant, rpc: &str) -> usize {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.error.is_none() && e.rpc == rpc && e.started >= from && e.at < to)
            .count()
    }
}

/// Error codes and messages of `events`, counted.
fn summary(events: &[Event]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for e in events {
        if let Some((code, msg)) = &e.error {
            let short: String = msg.chars().take(90).collect();
            *m.entry(format!("{}: {code:?}: {short}", e.rpc))
                .or_default() += 1;
        }
    }
    m
}

fn lazy_channel(server: &Server) -> Result<Channel> {
    Ok(Channel::from_shared(format!("http://{}", server.addr))?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(30))
        .connect_lazy())
}

/// One client's loop on one replica until `stop`.
async fn worker(shared: Arc<Shared>, replica: usize, channel: Channel, session: String, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut p = payloads_on(channel);
    let mut mine: Vec<String> = Vec::new();
    let mut n = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        n += 1;
        let op = rng.random_range(0..100u32);
        let t = Instant::now();
        let ok = match op {
            0..40 => {
                let size = rng.random_range(1_000..200_000);
                let mut data = vec![0u8; size];
                rng.fill_bytes(&mut data);
                let name = format!("w{replica}-{seed:x}-{n}.bin");
                match upload(&mut p, &session, &name, &data).await {
                    Ok(pl) => {
                        shared
                            .acked
                            .lock()
                            .unwrap()
                            .insert(pl.id.clone(), (replica, sha256_hex(&data)));
                        mine.push(pl.id);
                        shared.record(replica, "Upload", t, Ok(()))
                    }
                    Err(s) => shared.record(replica, "Upload", t, Err(s)),
                }
            }
            40..60 => {
                let big: String = "offloaded tool output line\n".repeat(160);
                let req = proto::OffloadRequest {
                    session_id: session.clone(),
                    turn: n as u32,
                    results: vec![
                        proto::ToolResult {
                            tool_call_id: format!("c{seed:x}-{n}-a"),
                            tool_name: "fleet".into(),
                            content: b"small result".to_vec().into(),
                            ..Default::default()
                        },
                        proto::ToolResult {
                            tool_call_id: format!("c{seed:x}-{n}-b"),
                            tool_name: "fleet".into(),
                            content: big.into_bytes().into(),
                            ..Default::default()
                        },
                    ],
                    settings: Some(proto::OffloadSettings {
                        per_call_tokens: Some(500),
                        aggregate_tokens: Some(1000),
                        ..Default::default()
                    }),
                };
                let r = p.offload(req).await.map(|_| ());
                shared.record(replica, "Offload", t, r)
            }
            60..85 if !mine.is_empty() => {
                let id = mine[rng.random_range(0..mine.len())].clone();
                let req = proto::ReadRequest {
                    payload_id: id,
                    max_bytes: 16 << 10,
                    range: None,
                };
                let r = p.read(req).await.map(|_| ());
                shared.record(replica, "Read", t, r)
            }
            _ if !mine.is_empty() => {
                let id = mine[rng.random_range(0..mine.len())].clone();
                let r = p
                    .stat(proto::PayloadRequest { payload_id: id })
                    .await
                    .map(|_| ());
                shared.record(replica, "Stat", t, r)
            }
            _ => true,
        };
        if !ok {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Waits until every replica has served a call that began after `since`;
/// returns how long after `since` the last one did.
async fn recovered(shared: &Shared, since: Instant, bound: Duration) -> Option<Duration> {
    let deadline = since + bound;
    loop {
        let last = {
            let events = shared.events.lock().unwrap();
            (0..REPLICAS)
                .map(|r| {
                    events
                        .iter()
                        .filter(|e| e.replica == r && e.error.is_none() && e.at > since)
                        .map(|e| e.at)
                        .min()
                })
                .collect::<Option<Vec<_>>>()
                .map(|v| v.into_iter().max().unwrap_or(since))
        };
        if let Some(at) = last {
            return Some(at - since);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn fleet(opts: &Opts) -> Result<Outcome> {
    let mut out = Outcome::new("fleet");
    let rounds = if opts.smoke { 4 } else { 20 };
    let mut rng = StdRng::seed_from_u64(opts.seed ^ 0xf1ee7);
    let (pg, db_url, s3) = tokio::task::spawn_blocking(|| {
        let pg = spillway::testing::postgres::dedicated();
        let url = pg.database().url();
        (pg, url, spillway::testing::s3::dedicated())
    })
    .await
    .context("starting Postgres and SeaweedFS (make postgres seaweedfs installs them)")?;
    let s3c = s3.config();
    let dir = tempfile::tempdir_in(&opts.work_dir)?;
    let extra = format!(
        "[store]\npostgres_url = {db_url:?}\nblobs = {:?}\n\n[store.s3]\nendpoint = {:?}\nregion = {:?}\naccess_key_id = {:?}\nsecret_access_key = {:?}\nallow_http = true\n",
        s3.url(),
        s3c.endpoint,
        s3c.region,
        s3c.access_key_id,
        s3c.secret_access_key
    );
    let config = write_config(opts, dir.path(), &extra)?;
    let fopts = Opts {
        engine: "postgres".into(),
        ..opts.clone()
    };
    let mut replicas = Vec::new();
    for i in 0..REPLICAS {
        let data = dir.path().join(format!("replica-{i}"));
        let log = dir.path().join(format!("replica-{i}.log"));
        replicas.push(Server::start(&fopts, &config, &data, &log).await?);
    }
    let shared = Arc::new(Shared::default());
    let mut tasks = tokio::task::JoinSet::new();
    let mut sessions = Vec::new();
    for (i, server) in replicas.iter().enumerate() {
        for w in 0..WORKERS {
            let session = server.session(None).await?;
            sessions.push(session.clone());
            tasks.spawn(worker(
                shared.clone(),
                i,
                lazy_channel(server)?,
                session,
                rng.random::<u64>() ^ (i * WORKERS + w) as u64,
            ));
        }
    }
    let load_started = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 1. kill -9 of a random replica, round after round.
    let kills_started = Instant::now();
    let mut downs: Vec<(usize, Instant, Instant)> = Vec::new();
    let mut restart_ms = Vec::new();
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
        let victim = rng.random_range(0..REPLICAS);
        let down_at = Instant::now();
        replicas[victim].kill9();
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
        let log = dir
            .path()
            .join(format!("replica-{victim}-round{round}.log"));
        let t = Instant::now();
        replicas[victim] = replicas[victim].restart(&log).await?;
        restart_ms.push(t.elapsed().as_millis() as u64);
        downs.push((victim, down_at, Instant::now()));
    }
    tokio::time::sleep(GRACE).await;
    let kills_ended = Instant::now();
    let mut outside = Vec::new();
    let mut inside = Vec::new();
    let mut in_flight = Vec::new();
    for e in shared.errors(kills_started, kills_ended, None) {
        // The replica's latest kill before the error.
        let Some(&(_, down_at, _)) = downs
            .iter()
            .rev()
            .find(|&&(r, from, to)| r == e.replica && e.at >= from && e.at < to + GRACE)
        else {
            outside.push(e);
            continue;
        };
        match &e.error {
            Some((Code::Unavailable, _)) => inside.push(e),
            // A call on a connection the kill cut: it reset before the
            // server sent any status, which tonic's client reports as
            // UNKNOWN ("transport error", "h2 protocol error"), or, for a
            // client stream (Upload) still sending its body when the
            // connection went, as hyper's own CANCELLED "operation was
            // canceled"; no server chose that code or those words.
            Some((Code::Unknown, m))
                if e.started < down_at + GRACE
                    && (m.contains("transport error") || m.contains("h2 protocol error")) =>
            {
                in_flight.push(e)
            }
            Some((Code::Cancelled, m))
                if e.started < down_at + GRACE && m == "operation was canceled" =>
            {
                in_flight.push(e)
            }
            _ => outside.push(e),
        }
    }
    restart_ms.sort_unstable();
    out.figure(format!(
        "{rounds} kill -9 rounds: restart to SERVING p50/max {}/{} ms; {} UNAVAILABLE on the killed replica while down, {} calls on a connection the kill cut",
        pct(&restart_ms, 50.0),
        restart_ms.last().copied().unwrap_or(0),
        inside.len(),
        in_flight.len()
    ));
    out.notes.push(format!(
        "calls on a connection a kill cut (no status from any server): {:?}",
        summary(&in_flight)
    ));
    for e in &outside {
        let near: Vec<String> = downs
            .iter()
            .map(|&(r, from, to)| {
                format!(
                    "replica {r} down {:+} ms .. {:+} ms",
                    from.duration_since(e.started).as_millis() as i64
                        - e.started.duration_since(from).as_millis() as i64,
                    to.duration_since(e.started).as_millis() as i64
                        - e.started.duration_since(to).as_millis() as i64
                )
            })
            .collect();
        out.notes.push(format!(
            "unexpected: replica {} {} took {} ms: {:?}; relative to its start: {}",
            e.replica,
            e.rpc,
            (e.at - e.started).as_millis(),
            e.error,
            near.join(", ")
        ));
    }
    out.check(
        outside.is_empty(),
        format!(
            "clients saw errors only on their own replica while it was down: UNAVAILABLE, or for a call on a connection the kill cut tonic's UNKNOWN transport error or hyper's CANCELLED \"operation was canceled\" ({:?})",
            summary(&outside)
        ),
    );

    // 2. Postgres restarted mid-load.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pg_down = Instant::now();
    tokio::task::spawn_blocking(move || pg.stop_fast()).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::spawn_blocking(move || pg.start_again()).await?;
    let pg_up = Instant::now();
    let back = recovered(&shared, pg_up, Duration::from_secs(30)).await;
    tokio::time::sleep(GRACE).await;
    let pg_errors = shared.errors(pg_down, Instant::now(), None);
    let unclear: Vec<Event> = pg_errors
        .iter()
        .filter(|e| {
            !e.error.as_ref().is_some_and(|(c, m)| {
                *c == Code::Unavailable && m.contains("Postgres") && m.contains("retry")
            })
        })
        .cloned()
        .collect();
    let late: Vec<&Event> = pg_errors
        .iter()
        .filter(|e| e.at > pg_up + back.unwrap_or_default() + GRACE)
        .collect();
    out.figure(format!(
        "Postgres down {:.1} s: {} calls failed, every replica served again {} after it was back",
        (pg_up - pg_down).as_secs_f64(),
        pg_errors.len(),
        back.map_or("never (30 s)".into(), |d| format!("{} ms", d.as_millis()))
    ));
    out.check(
        !pg_errors.is_empty(),
        "calls failed while Postgres was down",
    );
    out.check(
        unclear.is_empty(),
        format!(
            "every failure while Postgres was down was UNAVAILABLE naming Postgres and saying to retry ({:?})",
            summary(&unclear)
        ),
    );
    out.check(
        back.is_some() && late.is_empty(),
        format!(
            "every replica recovered on its own, with no failures after ({} late)",
            late.len()
        ),
    );
    out.notes.push(format!(
        "while Postgres was down: {:?}",
        summary(&pg_errors)
    ));

    // 3. SeaweedFS stopped, then started.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Payloads each replica holds locally (uploaded there, so cached).
    let mut cached: Vec<(usize, String, String)> = Vec::new();
    for (i, server) in replicas.iter().enumerate() {
        let mut p = server.payloads().await?;
        for j in 0..3 {
            let data = format!("cached on replica {i}, number {j}\n").repeat(100);
            let pl = upload(
                &mut p,
                &sessions[i * WORKERS],
                &format!("cached-{i}-{j}.txt"),
                data.as_bytes(),
            )
            .await?;
            shared
                .acked
                .lock()
                .unwrap()
                .insert(pl.id.clone(), (i, sha256_hex(data.as_bytes())));
            cached.push((i, pl.id, sha256_hex(data.as_bytes())));
        }
    }
    let s3_down = Instant::now();
    tokio::task::spawn_blocking(move || s3.stop()).await?;
    let s3_stopped = Instant::now();
    out.notes.push(format!(
        "SeaweedFS took {} ms to stop",
        (s3_stopped - s3_down).as_millis()
    ));
    // Let the workers run into it for a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut refusal_ms = Vec::new();
    let mut refusals = Vec::new();
    let mut cached_reads = 0;
    let mut cached_failures = Vec::new();
    for (i, server) in replicas.iter().enumerate() {
        let mut p = server.payloads().await?;
        let t = Instant::now();
        match upload(
            &mut p,
            &sessions[i * WORKERS],
            &format!("refused-{i}.txt"),
            b"no bucket\n",
        )
        .await
        {
            Ok(_) => refusals.push(format!("replica {i} acknowledged an upload with S3 down")),
            Err(s) if s.code() == Code::Unavailable && s.message().contains("object storage") => {
                refusal_ms.push(t.elapsed().as_millis() as u64);
            }
            Err(s) => refusals.push(format!("replica {i}: {:?}: {}", s.code(), s.message())),
        }
    }
    for (i, id, sha) in &cached {
        let mut p = replicas[*i].payloads().await?;
        match download(&mut p, id).await {
            Ok(bytes) if &sha256_hex(&bytes) == sha => cached_reads += 1,
            Ok(_) => cached_failures.push(format!("{id}: bytes differ")),
            Err(s) => cached_failures.push(format!("{id}: {:?}: {}", s.code(), s.message())),
        }
        let r = p
            .read(proto::ReadRequest {
                payload_id: id.clone(),
                max_bytes: 4096,
                range: None,
            })
            .await;
        match r {
            Ok(_) => cached_reads += 1,
            Err(s) => cached_failures.push(format!("Read {id}: {:?}: {}", s.code(), s.message())),
        }
    }
    let s3_start = Instant::now();
    tokio::task::spawn_blocking(move || s3.start_again()).await?;
    let s3_up = Instant::now();
    out.notes.push(format!(
        "SeaweedFS took {} ms to start again and take a write",
        (s3_up - s3_start).as_millis()
    ));
    // Uploads through every replica succeed again.
    let mut upload_back = Vec::new();
    for (i, server) in replicas.iter().enumerate() {
        let mut p = server.payloads().await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let data = format!("after the bucket came back, replica {i}\n");
            match upload(
                &mut p,
                &sessions[i * WORKERS],
                &format!("back-{i}-{}.txt", rng.random::<u32>()),
                data.as_bytes(),
            )
            .await
            {
                Ok(pl) => {
                    shared
                        .acked
                        .lock()
                        .unwrap()
                        .insert(pl.id, (i, sha256_hex(data.as_bytes())));
                    upload_back.push(s3_up.elapsed().as_millis() as u64);
                    break;
                }
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(s) => {
                    refusals.push(format!(
                        "replica {i} still refuses uploads 30 s after S3 came back: {s}"
                    ));
                    break;
                }
            }
        }
    }
    tokio::time::sleep(GRACE).await;
    let s3_window = shared.errors(s3_down, Instant::now(), None);
    let wrong: Vec<Event> = s3_window
        .iter()
        .filter(|e| {
            !(e.rpc == "Upload" || e.rpc == "Offload")
                || !e
                    .error
                    .as_ref()
                    .is_some_and(|(c, m)| *c == Code::Unavailable && m.contains("object storage"))
        })
        .cloned()
        .collect();
    let worker_reads = shared.successes(s3_stopped, s3_start, "Read");
    let worker_uploads = shared.successes(s3_stopped, s3_start, "Upload");
    refusal_ms.sort_unstable();
    out.figure(format!(
        "SeaweedFS down {:.1} s: uploads refused in {} ms (max), {} Reads of local copies served meanwhile, uploads through every replica again {} ms after it was back",
        (s3_up - s3_down).as_secs_f64(),
        refusal_ms.last().copied().unwrap_or(0),
        cached_reads + worker_reads,
        upload_back.iter().max().copied().unwrap_or(0)
    ));
    // A refusal that takes longer than the store's bounded retry policy
    // allows means the bound is gone.
    let slowest = refusal_ms.last().copied().unwrap_or(0);
    out.check(
        slowest <= REFUSAL_BOUND.as_millis() as u64,
        format!(
            "with S3 down, each upload was refused within {} s ({slowest} ms at the most)",
            REFUSAL_BOUND.as_secs()
        ),
    );
    out.check(
        refusals.is_empty() && refusal_ms.len() == REPLICAS,
        format!(
            "with S3 down, every replica refused an upload with UNAVAILABLE naming object storage, and took them again once it was back ({})",
            refusals.join("; ")
        ),
    );
    out.check(
        worker_uploads == 0,
        format!("no upload begun while S3 was down was acknowledged ({worker_uploads})"),
    );
    out.check(
        cached_failures.is_empty(),
        format!(
            "Download and Read of payloads a replica holds locally worked while S3 was down ({cached_reads} ok; {})",
            cached_failures.join("; ")
        ),
    );
    out.check(
        wrong.is_empty(),
        format!(
            "while S3 was down only uploads and offloads failed, with UNAVAILABLE naming object storage ({:?})",
            summary(&wrong)
        ),
    );
    out.notes
        .push(format!("while S3 was down: {:?}", summary(&s3_window)));

    // Afterwards: every acknowledged payload, whole.
    shared.stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    let load_secs = load_started.elapsed().as_secs_f64();
    let acked = shared.acked.lock().unwrap().clone();
    let mut lost = Vec::new();
    let mut clients = Vec::new();
    for server in &replicas {
        clients.push(server.payloads().await?);
    }
    for (n, (id, (_, sha))) in acked.iter().enumerate() {
        // Through another replica than the one it went to, in turn.
        let p = &mut clients[n % REPLICAS];
        match download(p, id).await {
            Ok(bytes) if &sha256_hex(&bytes) == sha => {}
            Ok(_) => lost.push(format!("{id}: bytes differ")),
            Err(s) => lost.push(format!("{id}: {:?}: {}", s.code(), s.message())),
        }
    }
    let calls = shared.calls.load(Ordering::Relaxed);
    out.figure(format!(
        "{calls} calls in {load_secs:.0} s from {} clients; {} acknowledged payloads read back, {} lost or corrupted",
        REPLICAS * WORKERS,
        acked.len(),
        lost.len()
    ));
    out.check(
        !acked.is_empty() && lost.is_empty(),
        format!(
            "every acknowledged payload read back with its sha256 ({})",
            lost.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        ),
    );
    match verify_audit(&replicas[0]).await {
        Ok(v) => out.check(
            v.ok,
            format!(
                "the fleet's audit chain verifies ({} events)",
                v.events_checked
            ),
        ),
        Err(e) => out.check(false, format!("VerifyAudit failed: {e:#}")),
    }
    for r in &replicas {
        for l in r.log_problems() {
            out.notes.push(format!("log: {l}"));
        }
    }
    for r in &mut replicas {
        r.stop();
    }
    Ok(out)
}
