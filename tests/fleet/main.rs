//! Fleet mode: three real replicas (the release of `spillway serve` as
//! child processes), each with its own data directory, sharing one
//! Postgres database (metadata, audit chains, locks, leases) and one
//! SeaweedFS bucket (payload bytes), behind a real balancer (nginx with
//! deploy/nginx.conf, see `balancer`). All of them are started by the tests
//! (`spillway::testing`, `balancer::Nginx`) on free loopback ports.
//!
//! Tests whose point is a particular replica (a hold set on one, a deletion
//! on another) address it directly; the others go through the balancer.
//! Which replica served a call is read from the replicas' own metrics
//! (`spillway_rpc_requests_total`), each on its own free port.

mod balancer;
#[path = "../all/common.rs"]
#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use spillway::config::EngineKind;
use spillway::proto::{
    self, audit_client::AuditClient, payloads_client::PayloadsClient,
    policies_client::PoliciesClient, sessions_client::SessionsClient,
};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Three replicas over one database and one bucket, behind nginx.
struct Fleet {
    // Dropped first: the balancer stops before the replicas.
    balancer: balancer::Nginx,
    _dir: tempfile::TempDir,
    replicas: Vec<ProcessServer>,
    db: spillway::testing::postgres::Database,
    data_dirs: Vec<PathBuf>,
    /// Each replica's `metrics.listen` port.
    metrics_ports: Vec<u16>,
}

impl Fleet {
    async fn start(extra_config: &str) -> Fleet {
        Self::start_with_store(extra_config, "").await
    }

    /// With more `[store]` keys (TOML lines).
    async fn start_with_store(extra_config: &str, store: &str) -> Fleet {
        use_engine(EngineKind::Postgres);
        let dir = tempfile::tempdir().unwrap();
        let db = spillway::testing::postgres::database();
        let (bucket, s3) = spillway::testing::s3::bucket();
        let config = write_config(dir.path());
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&format!(
            "[store]\nblobs = {bucket:?}\n{store}\n[store.s3]\nendpoint = {:?}\nregion = {:?}\naccess_key_id = {:?}\nsecret_access_key = {:?}\nallow_http = true\n\n{extra_config}",
            s3.endpoint, s3.region, s3.access_key_id, s3.secret_access_key
        ));
        std::fs::write(&config, text).unwrap();
        let mut replicas = Vec::new();
        let mut data_dirs = Vec::new();
        let mut metrics_ports = Vec::new();
        for i in 0..3 {
            let data = dir.path().join(format!("replica-{i}"));
            std::fs::create_dir_all(&data).unwrap();
            // The same database for every replica (see postgres_url_for).
            std::fs::write(data.join("test-postgres-url"), db.url()).unwrap();
            let log = dir.path().join(format!("replica-{i}.log"));
            let port = free_port();
            let listen = format!("127.0.0.1:{port}");
            let env = [("SPILLWAY_METRICS__LISTEN", listen.as_str())];
            replicas.push(ProcessServer::start_with_env(Some(&config), &data, log, &env).await);
            data_dirs.push(data);
            metrics_ports.push(port);
        }
        let upstreams = [replicas[0].addr, replicas[1].addr, replicas[2].addr];
        let balancer = balancer::Nginx::start(&upstreams).await;
        Fleet {
            balancer,
            _dir: dir,
            replicas,
            db,
            data_dirs,
            metrics_ports,
        }
    }

    /// A channel to the balancer, and the Rust client's interceptor that
    /// names `session` in `x-spillway-session` on every call.
    async fn via(&self, session: &str) -> (Channel, spillway::client::Bearer) {
        let bearer = spillway::client::Bearer::new(ALICE)
            .unwrap()
            .for_session(session)
            .unwrap();
        (self.balancer.channel().await, bearer)
    }

    /// Alice's Payloads client through the balancer, for `session`.
    async fn payloads_via(&self, session: &str) -> PayloadsClient<Routed> {
        let (channel, bearer) = self.via(session).await;
        PayloadsClient::with_interceptor(channel, bearer).max_decoding_message_size(64 << 20)
    }

    /// Alice's Sessions client through the balancer, for `session`.
    async fn sessions_via(&self, session: &str) -> SessionsClient<Routed> {
        let (channel, bearer) = self.via(session).await;
        SessionsClient::with_interceptor(channel, bearer)
    }

    /// How many calls of `method` (e.g. `Sessions/GetSession`) each live
    /// replica has served, by its metrics; `None` for a dead one.
    fn served(&mut self, method: &str) -> Vec<Option<u64>> {
        let series = format!("spillway_rpc_requests_total{{method=\"/spillway.v1.{method}\",");
        let ports = self.metrics_ports.clone();
        self.replicas
            .iter_mut()
            .zip(ports)
            .map(|(r, port)| {
                if r.child.try_wait().unwrap().is_some() {
                    return None;
                }
                let text = scrape(port);
                // Every status code's series.
                Some(
                    text.lines()
                        .filter(|l| l.starts_with(&series))
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum::<f64>() as u64,
                )
            })
            .collect()
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.replicas[i].log).unwrap_or_default()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.replicas.len() {
                let log = self.log(i);
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                eprintln!("--- replica {i}, last lines of its log:");
                for l in tail.into_iter().rev() {
                    eprintln!("{l}");
                }
            }
            eprintln!("--- nginx's error log:\n{}", self.balancer.error_log());
        }
    }
}

/// A client of the Rust client library's interceptor (token and session).
type Routed = InterceptedService<Channel, spillway::client::Bearer>;

/// `GET /metrics` of a replica, over plain HTTP/1.1.
fn scrape(port: u16) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// Per replica, `after - before` (0 for a replica dead at either time).
fn delta(before: &[Option<u64>], after: &[Option<u64>]) -> Vec<u64> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| match (b, a) {
            (Some(b), Some(a)) => a - b,
            _ => 0,
        })
        .collect()
}

fn payload_file(data_dir: &Path, session: &str, name: &str) -> PathBuf {
    data_dir.join("sessions").join(session).join(name)
}

/// A payload uploaded through the first replica and then read through
/// every replica, so that each holds a local copy.
async fn copied_everywhere(
    fleet: &Fleet,
    name: &str,
    bytes: &[u8],
) -> (proto::Session, proto::Payload) {
    let session = session_with(fleet, proto::Policy::default()).await;
    let stored = upload(
        &mut fleet.replicas[0].payloads(ALICE).await,
        header(&session.id, name),
        bytes,
    )
    .await
    .unwrap();
    for r in &fleet.replicas {
        download(&mut r.payloads(ALICE).await, &stored.id)
            .await
            .unwrap();
    }
    for d in &fleet.data_dirs {
        assert!(payload_file(d, &session.id, &stored.name).exists());
    }
    (session, stored)
}

/// A session made through the balancer (no session yet: any replica).
async fn session_with(fleet: &Fleet, policy: proto::Policy) -> proto::Session {
    fleet
        .balancer
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest {
            label: "fleet".into(),
            policy: Some(policy),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn a_payload_stored_through_one_replica_is_read_whole_through_the_others() {
    let fleet = Fleet::start("").await;
    let session = session_with(&fleet, proto::Policy::default()).await;
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let stored = upload(
        &mut fleet.replicas[0].payloads(ALICE).await,
        header(&session.id, "big.bin"),
        &data,
    )
    .await
    .unwrap();
    assert_eq!(stored.sha256, sha256_hex(&data));
    for r in &fleet.replicas[1..] {
        let got = download(&mut r.payloads(ALICE).await, &stored.id)
            .await
            .unwrap();
        assert_eq!(
            sha256_hex(&got),
            stored.sha256,
            "read through another replica"
        );
    }
    // The second replica now has a local copy, verified on the way in.
    assert!(payload_file(&fleet.data_dirs[1], &session.id, &stored.name).exists());
}

#[tokio::test]
async fn twenty_concurrent_cold_readers_fetch_the_object_once() {
    let fleet = Fleet::start("").await;
    let session = session_with(&fleet, proto::Policy::default()).await;
    let data = b"{\"k\":1}\n".repeat(200_000);
    let stored = upload(
        &mut fleet.replicas[0].payloads(ALICE).await,
        header(&session.id, "rows.ndjson"),
        &data,
    )
    .await
    .unwrap();
    let mut readers = Vec::new();
    for _ in 0..20 {
        let mut client = fleet.replicas[2].payloads(ALICE).await;
        let id = stored.id.clone();
        readers.push(tokio::spawn(
            async move { download(&mut client, &id).await },
        ));
    }
    for r in readers {
        assert_eq!(r.await.unwrap().unwrap().len(), data.len());
    }
    let fetches = fleet
        .log(2)
        .matches("fetched a payload from object storage")
        .count();
    assert_eq!(fetches, 1, "one fetch for twenty readers");
}

#[tokio::test]
async fn quotas_stay_exact_when_50_uploads_race_through_3_replicas() {
    let fleet = Fleet::start("").await;
    let session = session_with(
        &fleet,
        proto::Policy {
            max_payloads: 10,
            ..Default::default()
        },
    )
    .await;
    let mut uploads = Vec::new();
    for i in 0..50 {
        let mut client = fleet.replicas[i % 3].payloads(ALICE).await;
        let sid = session.id.clone();
        uploads.push(tokio::spawn(async move {
            let body = format!("payload {i}\n").repeat(100);
            upload(
                &mut client,
                header(&sid, &format!("p{i}.txt")),
                body.as_bytes(),
            )
            .await
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for u in uploads {
        match u.await.unwrap() {
            Ok(_) => ok += 1,
            Err(s) if s.code() == Code::ResourceExhausted => {
                assert!(s.message().contains("max_payloads"), "{}", s.message());
                refused += 1;
            }
            Err(s) => panic!("unexpected {s:?}"),
        }
    }
    assert_eq!((ok, refused), (10, 40));
    let s = fleet.replicas[1]
        .sessions(ALICE)
        .await
        .get_session(proto::GetSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.usage.unwrap().payloads, 10);
    let listed = fleet.replicas[2]
        .payloads(ALICE)
        .await
        .list_payloads(proto::ListPayloadsRequest {
            session_id: session.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.payloads.len(), 10);
}

#[tokio::test]
async fn three_replicas_appending_at_once_keep_one_unbroken_audit_chain() {
    let fleet = Fleet::start("").await;
    let mut tasks = Vec::new();
    for i in 0..60 {
        let mut client = fleet.replicas[i % 3].sessions(ALICE).await;
        tasks.push(tokio::spawn(async move {
            client
                .create_session(proto::CreateSessionRequest {
                    label: format!("s{i}"),
                    ..Default::default()
                })
                .await
                .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let channel = fleet.replicas[1].channel().await;
    let mut audit = AuditClient::with_interceptor(channel, Bearer(Some("tok-audrey".into())));
    let v = audit
        .verify_audit(proto::VerifyAuditRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(v.ok, "{v:?}");
    assert!(v.events_checked >= 60, "{v:?}");
    // One chain: the seqs run 1..=n with none missing or twice (keys are
    // unique, so count = max means gapless).
    let row = fleet.db.sql(
        "SELECT count(*) || ' ' || max(('x' || encode(substring(key from length(key) - 7), 'hex'))::bit(64)::bigint) \
         FROM spillway_kv WHERE tree = 'audit.v1' AND key >= 'acme\\000'::bytea AND key < 'acme\\001'::bytea",
    );
    let (count, max) = row.split_once(' ').unwrap();
    assert_eq!(count, max, "{row}");
    assert!(count.parse::<u64>().unwrap() >= v.events_checked);
}

#[tokio::test]
async fn a_hold_placed_on_one_replica_blocks_a_deletion_on_another() {
    let fleet = Fleet::start("").await;
    let session = session_with(&fleet, proto::Policy::default()).await;
    let stored = upload(
        &mut fleet.replicas[0].payloads(ALICE).await,
        header(&session.id, "kept.txt"),
        b"evidence\n",
    )
    .await
    .unwrap();
    let channel = fleet.replicas[1].channel().await;
    let mut policies = PoliciesClient::with_interceptor(channel, Bearer(Some("tok-carol".into())));
    policies
        .set_legal_hold(proto::SetLegalHoldRequest {
            session_id: session.id.clone(),
            hold: true,
            reason: "case 7".into(),
        })
        .await
        .unwrap();
    let refused = fleet.replicas[2]
        .payloads(ALICE)
        .await
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: stored.id.clone(),
            reason: "cleanup".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("legal hold"),
        "{}",
        refused.message()
    );
    // Still whole, through the third replica too.
    let got = download(&mut fleet.replicas[2].payloads(ALICE).await, &stored.id)
        .await
        .unwrap();
    assert_eq!(got, b"evidence\n");
}

#[tokio::test]
async fn a_deletion_on_one_replica_purges_every_replicas_copy_and_the_object() {
    let fleet = Fleet::start("").await;
    let (session, stored) = copied_everywhere(&fleet, "secret.txt", b"to be forgotten\n").await;
    let start = Instant::now();
    let receipt = fleet.replicas[2]
        .payloads(ALICE)
        .await
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: stored.id.clone(),
            reason: "user asked".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        receipt.removed.iter().any(|r| r.kind == "object"),
        "the receipt lists the object: {:?}",
        receipt.removed
    );
    let bound = Duration::from_secs(3);
    loop {
        let left: Vec<_> = fleet
            .data_dirs
            .iter()
            .filter(|d| payload_file(d, &session.id, &stored.name).exists())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < bound,
            "copies left after {bound:?}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "every replica's copy purged {:?} after the deletion call began",
        start.elapsed()
    );
    // The object is gone, and no replica serves the payload.
    for r in &fleet.replicas {
        let e = download(&mut r.payloads(ALICE).await, &stored.id)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }
    // The receipt is the same on every replica (one signing key).
    let channel = fleet.replicas[0].channel().await;
    let mut audit = AuditClient::with_interceptor(channel, Bearer(Some("tok-audrey".into())));
    let again = audit
        .get_receipt(proto::GetReceiptRequest {
            receipt_id: receipt.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.signature, receipt.signature);
}

#[tokio::test]
async fn a_deletion_answers_once_every_replica_purged_its_copy_and_the_receipt_signs_when() {
    let fleet = Fleet::start("").await;
    let (session, stored) = copied_everywhere(
        &fleet,
        "confirmed.txt",
        b"purged everywhere, and the receipt says so\n",
    )
    .await;
    // Every replica has reported its purge progress (each does at start).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    let receipt = fleet.replicas[1]
        .payloads(ALICE)
        .await
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: stored.id.clone(),
            reason: "confirm".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let answered = start.elapsed();
    // By the time the call answers, no replica has a copy.
    let left: Vec<_> = fleet
        .data_dirs
        .iter()
        .filter(|d| payload_file(d, &session.id, &stored.name).exists())
        .collect();
    assert!(
        left.is_empty(),
        "copies left when the deletion answered: {left:?}"
    );
    let confirmed = receipt
        .purge_confirmed_at
        .expect("the receipt carries the purge confirmation");
    assert_eq!(receipt.purge_replicas, 3);
    let deleted = receipt.deleted_at.unwrap();
    let ms = spillway::receipt::timestamp_millis;
    let confirm_ms = ms(confirmed.seconds, confirmed.nanos) - ms(deleted.seconds, deleted.nanos);
    assert!(
        confirm_ms >= 0,
        "confirmed before the deletion: {confirm_ms} ms"
    );
    eprintln!(
        "purge confirmed by 3 replicas {confirm_ms} ms after the deletion committed; the call took {answered:?}"
    );
    // The stored receipt is the confirmed one, on every replica.
    let channel = fleet.replicas[2].channel().await;
    let mut audit = AuditClient::with_interceptor(channel, Bearer(Some("tok-audrey".into())));
    let again = audit
        .get_receipt(proto::GetReceiptRequest {
            receipt_id: receipt.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, receipt);
    // The CLI verifies it with the fleet's key (any replica's copy), and
    // refuses it with the confirmation dropped or changed.
    let file = fleet.data_dirs[0].join("receipt.json");
    let verify = |json: String| {
        std::fs::write(&file, json).unwrap();
        command()
            .args(["audit", "verify-receipt", file.to_str().unwrap()])
            .args(["--data-dir", fleet.data_dirs[0].to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = verify(serde_json::to_string(&receipt).unwrap());
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("verifies"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut dropped = receipt.clone();
    dropped.purge_confirmed_at = None;
    let mut fewer = receipt.clone();
    fewer.purge_replicas = 2;
    for forged in [dropped, fewer] {
        let out = verify(serde_json::to_string(&forged).unwrap());
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("does NOT verify"));
    }
}

#[tokio::test]
async fn a_killed_replica_stops_counting_for_the_purge_confirmation_within_its_liveness_bound() {
    let mut fleet = Fleet::start("").await;
    let (session, stored) = copied_everywhere(
        &fleet,
        "outlived.txt",
        b"one replica will not see this go\n",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    fleet.replicas[2].kill9();
    let start = Instant::now();
    let receipt = fleet.replicas[0]
        .payloads(ALICE)
        .await
        .delete_payload(proto::DeletePayloadRequest {
            payload_id: stored.id.clone(),
            reason: "one replica is gone".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let answered = start.elapsed();
    eprintln!("with one replica killed, the deletion answered in {answered:?}");
    // The dead replica's last report ages out (3 s) before the 5 s wait
    // runs out: the two live replicas confirm.
    assert!(
        receipt.purge_confirmed_at.is_some(),
        "no confirmation after {answered:?}"
    );
    assert_eq!(receipt.purge_replicas, 2);
    assert!(answered < Duration::from_millis(4500), "{answered:?}");
    for d in &fleet.data_dirs[..2] {
        assert!(!payload_file(d, &session.id, &stored.name).exists());
    }
}

#[tokio::test]
async fn another_replica_takes_over_the_reaper_when_its_holder_is_killed() {
    let mut fleet = Fleet::start("[reaper]\nlease_ttl = \"2s\"\ninterval = \"200ms\"\n").await;
    let holder = |fleet: &Fleet| -> Option<usize> {
        let row = fleet
            .db
            .sql("SELECT holder FROM spillway_leases WHERE name = 'reaper' AND expires_at > now()");
        fleet
            .replicas
            .iter()
            .position(|r| row.split('/').nth(1) == Some(&r.child.id().to_string()))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(i) = holder(&fleet) {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "no replica took the reaper's lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    fleet.replicas[first].kill9();
    let killed = Instant::now();
    let survivor = (first + 1) % 3;
    // A payload that expires at once: only a live reaper deletes it.
    let session = fleet.replicas[survivor]
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest {
            label: "short".into(),
            policy: Some(proto::Policy {
                retention: Some(pbjson_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let stored = upload(
        &mut fleet.replicas[survivor].payloads(ALICE).await,
        header(&session.id, "brief.txt"),
        b"brief\n",
    )
    .await
    .unwrap();
    let bound = Duration::from_secs(30);
    loop {
        let gone = fleet.replicas[survivor]
            .payloads(ALICE)
            .await
            .stat(proto::PayloadRequest {
                payload_id: stored.id.clone(),
            })
            .await
            .is_err_and(|s| s.code() == Code::NotFound);
        if gone {
            break;
        }
        assert!(
            killed.elapsed() < bound,
            "no replica reaped within {bound:?} of the holder's death"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = holder(&fleet).expect("a live holder");
    assert_ne!(now, first);
    eprintln!(
        "reaper taken over and the expired payload deleted {:?} after kill -9",
        killed.elapsed()
    );
}

#[tokio::test]
async fn a_reused_name_never_serves_the_deleted_payloads_local_copy() {
    // No purge comes in time: the second replica still has the old copy.
    let fleet = Fleet::start_with_store("", "purge_interval = \"1h\"\n").await;
    let session = session_with(&fleet, proto::Policy::default()).await;
    let mut a = fleet.replicas[0].payloads(ALICE).await;
    let mut b = fleet.replicas[1].payloads(ALICE).await;
    let old = upload(&mut a, header(&session.id, "a.txt"), b"the old bytes\n")
        .await
        .unwrap();
    // The second replica keeps a copy of it under the name a.txt.
    assert_eq!(download(&mut b, &old.id).await.unwrap(), b"the old bytes\n");
    a.delete_payload(proto::DeletePayloadRequest {
        payload_id: old.id.clone(),
        reason: "replaced".into(),
    })
    .await
    .unwrap();
    // At once, before the purge reaches the second replica: the same name.
    let new = upload(
        &mut a,
        header(&session.id, "a.txt"),
        b"the NEW bytes, longer\n",
    )
    .await
    .unwrap();
    assert_eq!(new.name, old.name, "the name is free again");
    assert_eq!(
        download(&mut b, &new.id).await.unwrap(),
        b"the NEW bytes, longer\n"
    );
}

#[tokio::test]
async fn calls_naming_one_session_land_on_one_replica_and_sessions_spread_over_replicas() {
    let mut fleet = Fleet::start("").await;
    let mut homes = Vec::new();
    for _ in 0..12 {
        let session = session_with(&fleet, proto::Policy::default()).await;
        let before = fleet.served("Sessions/GetSession");
        for _ in 0..5 {
            // A new connection to the balancer for every call: the hash
            // routes each call, not a connection's stickiness.
            fleet
                .sessions_via(&session.id)
                .await
                .get_session(proto::GetSessionRequest {
                    session_id: session.id.clone(),
                })
                .await
                .unwrap();
        }
        let d = delta(&before, &fleet.served("Sessions/GetSession"));
        let home = d
            .iter()
            .position(|&n| n == 5)
            .filter(|_| d.iter().sum::<u64>() == 5)
            .unwrap_or_else(|| panic!("the session's five calls went to {d:?}"));
        homes.push(home);
    }
    let per_replica: Vec<usize> = (0..3)
        .map(|i| homes.iter().filter(|&&h| h == i).count())
        .collect();
    eprintln!("12 sessions' homes per replica: {per_replica:?}");
    assert!(
        per_replica.iter().filter(|&&n| n > 0).count() >= 2,
        "sessions spread over replicas: {per_replica:?}"
    );
    // Calls naming no session spread too (the balancer hashes a request ID).
    let session = session_with(&fleet, proto::Policy::default()).await;
    let before = fleet.served("Sessions/GetSession");
    let mut plain = fleet.balancer.sessions(ALICE).await;
    for _ in 0..30 {
        plain
            .get_session(proto::GetSessionRequest {
                session_id: session.id.clone(),
            })
            .await
            .unwrap();
    }
    let d = delta(&before, &fleet.served("Sessions/GetSession"));
    eprintln!("30 calls without x-spillway-session per replica: {d:?}");
    assert_eq!(d.iter().sum::<u64>(), 30);
    assert!(d.iter().filter(|&&n| n > 0).count() >= 2, "{d:?}");
}

#[tokio::test]
async fn killing_a_sessions_replica_moves_its_calls_to_another_with_the_data_intact() {
    let mut fleet = Fleet::start("").await;
    let session = session_with(&fleet, proto::Policy::default()).await;
    let before = fleet.served("Payloads/Upload");
    let mut stored = Vec::new();
    for (i, size) in [10usize, 200_000, 3_000_000].into_iter().enumerate() {
        let data: Vec<u8> = (0..size).map(|j| ((i * 7 + j) % 251) as u8).collect();
        let p = upload(
            &mut fleet.payloads_via(&session.id).await,
            header(&session.id, &format!("p{i}.bin")),
            &data,
        )
        .await
        .unwrap();
        assert_eq!(p.sha256, sha256_hex(&data));
        stored.push((p, data));
    }
    let d = delta(&before, &fleet.served("Payloads/Upload"));
    let home = d
        .iter()
        .position(|&n| n == 3)
        .unwrap_or_else(|| panic!("the session's uploads went to {d:?}"));
    for (p, _) in &stored {
        assert!(payload_file(&fleet.data_dirs[home], &session.id, &p.name).exists());
    }
    fleet.replicas[home].kill9();
    let killed = Instant::now();
    let before = fleet.served("Payloads/Download");
    // Every acknowledged payload, whole, through the balancer.
    for (i, (p, data)) in stored.iter().enumerate() {
        let got = download(&mut fleet.payloads_via(&session.id).await, &p.id)
            .await
            .unwrap_or_else(|e| panic!("payload {i} after the kill: {e:?}"));
        assert_eq!(sha256_hex(&got), p.sha256);
        assert_eq!(&got, data);
        if i == 0 {
            eprintln!(
                "first call after kill -9 of the session's replica answered {:?} after the kill",
                killed.elapsed()
            );
        }
    }
    let d = delta(&before, &fleet.served("Payloads/Download"));
    let next = d
        .iter()
        .position(|&n| n == 3)
        .filter(|&n| n != home && d.iter().sum::<u64>() == 3)
        .unwrap_or_else(|| {
            panic!("the session's reads after the kill went to {d:?} (replica {home} is dead)")
        });
    // The new replica now caches them, and takes the session's new work.
    for (p, _) in &stored {
        assert!(payload_file(&fleet.data_dirs[next], &session.id, &p.name).exists());
    }
    let more = upload(
        &mut fleet.payloads_via(&session.id).await,
        header(&session.id, "after.txt"),
        b"after the failover\n",
    )
    .await
    .unwrap();
    let listed = fleet
        .payloads_via(&session.id)
        .await
        .list_payloads(proto::ListPayloadsRequest {
            session_id: session.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut names: Vec<String> = listed.payloads.iter().map(|p| p.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["after.txt", "p0.bin", "p1.bin", "p2.bin"]);
    assert!(payload_file(&fleet.data_dirs[next], &session.id, &more.name).exists());
    // nginx's own account: the session's calls after the kill named the
    // survivor as their upstream.
    let survivor = fleet.replicas[next].addr.to_string();
    let log = fleet.balancer.access_log();
    let after: Vec<&str> = log
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some(session.id.as_str()))
        .skip(3)
        .collect();
    assert!(!after.is_empty(), "{log}");
    assert!(after.iter().all(|l| l.ends_with(&survivor)), "{log}");
}

#[tokio::test]
async fn the_cli_names_its_session_so_its_calls_land_on_one_replica() {
    let mut fleet = Fleet::start("").await;
    let session = session_with(&fleet, proto::Policy::default()).await;
    let stored = upload(
        &mut fleet.balancer.payloads(ALICE).await,
        header(&session.id, "cli.txt"),
        b"through the command line\n",
    )
    .await
    .unwrap();
    let addr = fleet.balancer.addr.to_string();
    let cli = |args: &[&str]| {
        let out = command()
            .args(["--addr", &addr, "--token", ALICE])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let before = fleet.served("Payloads/ListPayloads");
    for _ in 0..6 {
        assert!(cli(&["ls", "--session", &session.id]).contains("cli.txt"));
    }
    let d = delta(&before, &fleet.served("Payloads/ListPayloads"));
    assert!(d.contains(&6) && d.iter().sum::<u64>() == 6, "{d:?}");
    let home = d.iter().position(|&n| n == 6).unwrap();
    // A payload command given the session goes to the same replica.
    let before = fleet.served("Payloads/Read");
    for _ in 0..3 {
        assert!(
            cli(&["read", &stored.id, "--session", &session.id]).contains("through the command")
        );
    }
    let d = delta(&before, &fleet.served("Payloads/Read"));
    assert_eq!(d[home], 3, "{d:?}");
}

/// Round trips to Postgres replica `port`'s process has made so far, by
/// its metrics.
fn round_trips_so_far(port: u16) -> u64 {
    scrape(port)
        .lines()
        .find_map(|l| {
            l.strip_prefix("spillway_postgres_round_trips_total ")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .expect("the replica counts its Postgres round trips") as u64
}

/// Postgres round trips of each of `n` calls `call` makes to one replica
/// (whose metrics are on `port`), one call at a time.
async fn round_trips_each<F, Fut, T>(port: u16, n: usize, mut call: F) -> (Vec<u64>, Vec<T>)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let (mut trips, mut outs) = (Vec::new(), Vec::new());
    for i in 0..n {
        let before = round_trips_so_far(port);
        outs.push(call(i).await);
        trips.push(round_trips_so_far(port) - before);
    }
    (trips, outs)
}

/// A turn's tool result.
fn tool_result(id: &str, content: &[u8]) -> proto::ToolResult {
    proto::ToolResult {
        tool_call_id: id.into(),
        tool_name: "tool".into(),
        content: content.to_vec().into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn postgres_round_trips_per_rpc_are_counted_and_an_all_inline_offload_takes_at_most_3() {
    // Background work (the reaper, the purge log) quiet, so a replica's
    // round trips are its calls' own.
    let fleet =
        Fleet::start_with_store("[reaper]\ninterval = \"1h\"\n", "purge_interval = \"1h\"").await;
    let port = fleet.metrics_ports[0];
    let r = &fleet.replicas[0];
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n = 5;
    let mut report: Vec<(&str, Vec<u64>)> = Vec::new();

    let sessions = r.sessions(ALICE).await;
    let (trips, mut created) = round_trips_each(port, n, |_| {
        let mut sessions = sessions.clone();
        async move {
            sessions
                .create_session(proto::CreateSessionRequest::default())
                .await
                .unwrap()
                .into_inner()
        }
    })
    .await;
    report.push(("CreateSession", trips));
    let session = created.pop().unwrap();
    let sid = session.id.clone();
    let (trips, _) = round_trips_each(port, n, |_| {
        let mut sessions = sessions.clone();
        let sid = sid.clone();
        async move {
            sessions
                .get_session(proto::GetSessionRequest { session_id: sid })
                .await
                .unwrap();
        }
    })
    .await;
    report.push(("GetSession", trips));

    let payloads = r.payloads(ALICE).await;
    let rows: String = (0..2000)
        .map(|i| format!("{{\"id\":{i},\"state\":\"open\",\"note\":\"row {i}\"}}\n"))
        .collect();
    let (trips, stored) = round_trips_each(port, n, |i| {
        let mut payloads = payloads.clone();
        let (sid, rows) = (sid.clone(), rows.clone());
        async move {
            upload(
                &mut payloads,
                header(&sid, &format!("rows-{i}.ndjson")),
                rows.as_bytes(),
            )
            .await
            .unwrap()
        }
    })
    .await;
    report.push(("Upload (80 KB)", trips));
    let target = stored[0].id.clone();

    let inline = |turn: u32| proto::OffloadRequest {
        session_id: sid.clone(),
        turn,
        results: vec![
            tool_result("c1", b"{\"ok\":true}"),
            tool_result("c2", b"a short answer"),
        ],
        ..Default::default()
    };
    let (trips, _) = round_trips_each(port, n, |i| {
        let mut payloads = payloads.clone();
        let req = inline(i as u32 + 1);
        async move {
            let out = payloads.offload(req).await.unwrap().into_inner();
            assert!(out.outcomes.iter().all(|o| o.payload.is_none()), "{out:?}");
        }
    })
    .await;
    report.push(("Offload, all inline", trips.clone()));
    let all_inline = trips;

    let (trips, _) = round_trips_each(port, n, |i| {
        let mut payloads = payloads.clone();
        let mut req = inline(100 + i as u32);
        req.results
            .push(tool_result(&format!("big{i}"), rows.as_bytes()));
        req.settings = Some(proto::OffloadSettings {
            per_call_tokens: Some(1000),
            ..Default::default()
        });
        async move {
            let out = payloads.offload(req).await.unwrap().into_inner();
            assert_eq!(
                out.outcomes.iter().filter(|o| o.payload.is_some()).count(),
                1,
                "{out:?}"
            );
        }
    })
    .await;
    report.push(("Offload, one result offloaded", trips));

    let (trips, _) = round_trips_each(port, n, |i| {
        let mut payloads = payloads.clone();
        let target = target.clone();
        async move {
            payloads
                .read(proto::ReadRequest {
                    payload_id: target,
                    range: Some(proto::read_request::Range::LineRange(proto::LineRange {
                        start_line: 100 + i as u64,
                        end_line: 109 + i as u64,
                    })),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
    })
    .await;
    report.push(("Read (10 lines)", trips));

    let (trips, _) = round_trips_each(port, n, |_| {
        let mut payloads = payloads.clone();
        let (sid, target) = (sid.clone(), target.clone());
        async move {
            let out = payloads
                .search(proto::SearchRequest {
                    session_id: sid,
                    payload_ids: vec![target],
                    pattern: "row 1999".into(),
                    fixed_string: true,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert!(!out.matches.is_empty());
        }
    })
    .await;
    report.push(("Search (one payload)", trips));

    let code = r.codemode(ALICE).await;
    let (trips, _) = round_trips_each(port, n, |_| {
        let mut code = code.clone();
        let (sid, target) = (sid.clone(), target.clone());
        async move {
            let out = code
                .exec(proto::ExecRequest {
                    session_id: sid,
                    runtime: "jq".into(),
                    source: "[inputs | .id] | length".into(),
                    inputs: vec![target],
                    args: vec!["-n".into()],
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(out.stdout, "2000\n", "{out:?}");
        }
    })
    .await;
    report.push(("Exec (jq, one input)", trips));

    for (rpc, trips) in &report {
        eprintln!("postgres round trips per call: {rpc}: {trips:?}");
    }
    assert!(
        all_inline.iter().all(|&t| t <= 3),
        "an all-inline Offload took {all_inline:?} round trips (goal: at most 3)"
    );
}

#[tokio::test]
async fn an_idle_replica_costs_postgres_a_bounded_trickle_of_round_trips() {
    // Default intervals: the purge log tailed every 250 ms, the reaper's
    // lease tried every second.
    let fleet = Fleet::start("").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before: Vec<u64> = fleet
        .metrics_ports
        .iter()
        .map(|&p| round_trips_so_far(p))
        .collect();
    let window = Duration::from_secs(5);
    tokio::time::sleep(window).await;
    let per_second: Vec<f64> = fleet
        .metrics_ports
        .iter()
        .zip(&before)
        .map(|(&p, b)| (round_trips_so_far(p) - b) as f64 / window.as_secs_f64())
        .collect();
    eprintln!("idle round trips per second, per replica: {per_second:?}");
    assert!(
        per_second.iter().all(|&r| r > 0.0 && r < 30.0),
        "{per_second:?}"
    );
}
