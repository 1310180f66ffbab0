//! kill -9 at random points during mixed uploads, payload and session
//! deletions, reaper runs (a session per round whose payloads expire within
//! seconds) and audit appends (every RPC appends one); after each restart,
//! every acknowledged write is intact, every acknowledged deletion stays
//! deleted, the audit chain verifies and no orphan file remains.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use spillway::proto;
use tonic::Code;

use crate::harness::*;

#[derive(Clone)]
struct Acked {
    session: String,
    sha256: String,
    size: u64,
    bytes_checked: bool,
}

#[derive(Default)]
struct State {
    /// Acknowledged payloads not (being) deleted.
    live: BTreeMap<String, Acked>,
    /// Deletions in flight at the kill: either outcome is fine.
    maybe_deleted: BTreeMap<String, Acked>,
    /// Acknowledged payload deletions.
    deleted: BTreeSet<String>,
    /// Sessions of earlier rounds, which may be deleted whole.
    old_sessions: Vec<String>,
    /// Session deletions in flight at the kill.
    maybe_deleted_sessions: BTreeSet<String>,
    /// Acknowledged session deletions.
    deleted_sessions: BTreeSet<String>,
    /// Acknowledged payloads of short-retention sessions: intact, or
    /// deleted by the reaper.
    expiring: BTreeMap<String, Acked>,
    /// Those the reaper was seen to delete: they must stay deleted.
    reaped: BTreeSet<String>,
    uploads: u64,
    deletes: u64,
    session_deletes: u64,
}

pub async fn crash(opts: &Opts) -> Result<Outcome> {
    let mut out = Outcome::new("crash");
    let rounds = if opts.smoke { 4 } else { 20 };
    let dir = tempfile::tempdir_in(&opts.work_dir)?;
    let config = write_config(opts, dir.path(), "")?;
    let data_dir = dir.path().join("data");
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let state: Arc<Mutex<State>> = Arc::default();
    let mut failures = Vec::new();
    let mut verified = 0u64;
    let mut kill_points = Vec::new();
    for round in 0..=rounds {
        let log = dir.path().join(format!("round{round}.log"));
        let mut server = Server::start(opts, &config, &data_dir, &log).await?;
        // Verify what the previous rounds acknowledged.
        let problems = verify(&server, &state).await?;
        verified += 1;
        if !problems.is_empty() {
            failures.push(format!("after kill {round}: {}", problems.join("; ")));
            if failures.len() > 3 {
                break;
            }
        }
        if round == rounds {
            server.stop();
            break;
        }
        // This round's sessions receive uploads; earlier ones may be deleted.
        let mut sessions = Vec::new();
        for _ in 0..2 {
            sessions.push(server.session(None).await?);
        }
        // Payloads here expire after 1-3 s: the reaper deletes them while
        // the other writes go on, and the kill may land in its deletions.
        let expiring_session = server
            .session(Some(proto::Policy {
                retention: Some(pbjson_types::Duration {
                    seconds: rng.random_range(1..=3),
                    nanos: 0,
                }),
                ..Default::default()
            }))
            .await?;
        // The workers stop at the kill (their next call fails) or, for those
        // with nothing to do, when `killed` is set; 30 s bounds them anyway.
        let stop = Instant::now() + Duration::from_secs(30);
        let killed = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for u in 0..6u64 {
            let mut p = server.payloads().await?;
            let sessions = sessions.clone();
            let state = state.clone();
            let killed = killed.clone();
            let mut rng = StdRng::seed_from_u64(rng.random::<u64>() ^ u);
            tasks.spawn(async move {
                let mut i = 0;
                while Instant::now() < stop && !killed.load(Ordering::Relaxed) {
                    i += 1;
                    let size = rng.random_range(1_000..256_000);
                    let mut data = vec![0u8; size];
                    rng.fill_bytes(&mut data);
                    let session = sessions[i % sessions.len()].clone();
                    match upload(&mut p, &session, &format!("r{round}-u{u}-{i}.bin"), &data).await {
                        Ok(pl) => {
                            let mut s = state.lock().unwrap();
                            s.uploads += 1;
                            s.live.insert(
                                pl.id,
                                Acked {
                                    session,
                                    sha256: sha256_hex(&data),
                                    size: size as u64,
                                    bytes_checked: false,
                                },
                            );
                        }
                        Err(_) => return,
                    }
                }
            });
        }
        {
            let mut p = server.payloads().await?;
            let state = state.clone();
            let killed = killed.clone();
            let session = expiring_session.clone();
            let mut rng = StdRng::seed_from_u64(rng.random::<u64>());
            tasks.spawn(async move {
                let mut i = 0;
                while Instant::now() < stop && !killed.load(Ordering::Relaxed) {
                    i += 1;
                    let mut data = vec![0u8; rng.random_range(1_000..64_000)];
                    rng.fill_bytes(&mut data);
                    match upload(&mut p, &session, &format!("r{round}-x{i}.bin"), &data).await {
                        Ok(pl) => {
                            let mut s = state.lock().unwrap();
                            s.uploads += 1;
                            s.expiring.insert(
                                pl.id,
                                Acked {
                                    session: session.clone(),
                                    sha256: sha256_hex(&data),
                                    size: data.len() as u64,
                                    bytes_checked: false,
                                },
                            );
                        }
                        Err(_) => return,
                    }
                    tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
                }
            });
        }
        {
            let mut p = server.payloads().await?;
            let state = state.clone();
            let killed = killed.clone();
            let mut rng = StdRng::seed_from_u64(rng.random::<u64>());
            tasks.spawn(async move {
                while Instant::now() < stop && !killed.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
                    let pick = {
                        let mut s = state.lock().unwrap();
                        if s.live.is_empty() {
                            continue;
                        }
                        let n = rng.random_range(0..s.live.len());
                        let id = s.live.keys().nth(n).cloned().unwrap_or_default();
                        if s.maybe_deleted_sessions.contains(&s.live[&id].session) {
                            continue;
                        }
                        let a = s.live.remove(&id).expect("picked from live");
                        s.maybe_deleted.insert(id.clone(), a);
                        id
                    };
                    let r = p
                        .delete_payload(proto::DeletePayloadRequest {
                            payload_id: pick.clone(),
                            reason: "crash test".into(),
                        })
                        .await;
                    if r.is_err() {
                        return;
                    }
                    let mut s = state.lock().unwrap();
                    s.maybe_deleted.remove(&pick);
                    s.deleted.insert(pick);
                    s.deletes += 1;
                }
            });
        }
        {
            let mut c = server.sessions().await?;
            let state = state.clone();
            let killed = killed.clone();
            let mut rng = StdRng::seed_from_u64(rng.random::<u64>());
            tasks.spawn(async move {
                while Instant::now() < stop && !killed.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
                    let pick = {
                        let mut s = state.lock().unwrap();
                        if s.old_sessions.is_empty() {
                            continue;
                        }
                        let n = rng.random_range(0..s.old_sessions.len());
                        let id = s.old_sessions.remove(n);
                        s.maybe_deleted_sessions.insert(id.clone());
                        id
                    };
                    let r = c
                        .delete_session(proto::DeleteSessionRequest {
                            session_id: pick.clone(),
                            reason: "crash test".into(),
                        })
                        .await;
                    if r.is_err() {
                        return;
                    }
                    let mut s = state.lock().unwrap();
                    s.maybe_deleted_sessions.remove(&pick);
                    s.deleted_sessions.insert(pick);
                    s.session_deletes += 1;
                }
            });
        }
        let kill_ms = rng.random_range(150..2500u64);
        kill_points.push(kill_ms);
        tokio::time::sleep(Duration::from_millis(kill_ms)).await;
        server.kill9();
        killed.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
        state.lock().unwrap().old_sessions.extend(sessions);
    }
    let s = state.lock().unwrap();
    out.figure(format!(
        "{} kills at {kill_points:?} ms; {} uploads, {} payload and {} session deletions acknowledged; {} payloads reaped on expiry; {verified} restarts verified",
        kill_points.len(),
        s.uploads,
        s.deletes,
        s.session_deletes,
        s.reaped.len()
    ));
    out.check(
        s.uploads > 0 && s.deletes > 0 && s.session_deletes > 0 && !s.reaped.is_empty(),
        "every kind of write, and reaping, happened at least once",
    );
    out.check(
        failures.is_empty(),
        format!(
            "after each restart: acknowledged writes intact, deletions stay deleted, audit verifies, no orphans ({})",
            failures.join(" | ")
        ),
    );
    Ok(out)
}

async fn verify(server: &Server, state: &Arc<Mutex<State>>) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut p = server.payloads().await?;
    let (live, maybe, deleted, maybe_sessions) = {
        let s = state.lock().unwrap();
        (
            s.live.clone(),
            s.maybe_deleted.clone(),
            s.deleted.clone(),
            s.maybe_deleted_sessions.clone(),
        )
    };
    // Session deletions in flight: either outcome, then settled.
    let mut sc = server.sessions().await?;
    for id in &maybe_sessions {
        let gone = match sc
            .get_session(proto::GetSessionRequest {
                session_id: id.clone(),
            })
            .await
        {
            Err(e) if e.code() == Code::NotFound => true,
            Ok(r) => r.into_inner().state == proto::SessionState::Deleted as i32,
            Err(e) => {
                problems.push(format!("GetSession {id}: {e}"));
                false
            }
        };
        let mut s = state.lock().unwrap();
        s.maybe_deleted_sessions.remove(id);
        if gone {
            s.deleted_sessions.insert(id.clone());
        } else {
            s.old_sessions.push(id.clone());
        }
    }
    let deleted_sessions: BTreeSet<String> = {
        let s = state.lock().unwrap();
        s.deleted_sessions.clone()
    };
    for (id, a) in live.iter().chain(maybe.iter()) {
        let in_deleted_session = deleted_sessions.contains(&a.session);
        let may_be_gone = maybe.contains_key(id) || in_deleted_session;
        match p
            .stat(proto::PayloadRequest {
                payload_id: id.clone(),
            })
            .await
        {
            Ok(st) => {
                let st = st.into_inner();
                if in_deleted_session {
                    problems.push(format!("{id} outlived the deletion of its session"));
                    continue;
                }
                if (st.sha256.as_str(), st.size_bytes) != (a.sha256.as_str(), a.size) {
                    problems.push(format!("{id}: metadata changed"));
                    continue;
                }
                if !a.bytes_checked {
                    match download(&mut p, id).await {
                        Ok(bytes) if sha256_hex(&bytes) == a.sha256 => {}
                        Ok(_) => problems.push(format!("{id}: bytes changed")),
                        Err(e) => problems.push(format!("{id}: download failed: {e}")),
                    }
                }
                let mut s = state.lock().unwrap();
                let mut a = a.clone();
                a.bytes_checked = true;
                s.maybe_deleted.remove(id);
                s.live.insert(id.clone(), a);
            }
            Err(e) if e.code() == Code::NotFound && may_be_gone => {
                let mut s = state.lock().unwrap();
                s.maybe_deleted.remove(id);
                s.live.remove(id);
                s.deleted.insert(id.clone());
            }
            Err(e) => problems.push(format!("acknowledged payload {id} lost: {e}")),
        }
    }
    // Short-retention payloads: intact while they live; once the reaper
    // has deleted one (the NOT_FOUND names it), it stays deleted.
    let (expiring, reaped) = {
        let s = state.lock().unwrap();
        (s.expiring.clone(), s.reaped.clone())
    };
    for (id, a) in &expiring {
        match p
            .stat(proto::PayloadRequest {
                payload_id: id.clone(),
            })
            .await
        {
            Ok(st) => {
                let st = st.into_inner();
                if (st.sha256.as_str(), st.size_bytes) != (a.sha256.as_str(), a.size) {
                    problems.push(format!("{id}: metadata changed"));
                }
            }
            Err(e)
                if e.code() == Code::NotFound
                    && (e.message().contains("deleted by reaper")
                        || deleted_sessions.contains(&a.session)) =>
            {
                let mut s = state.lock().unwrap();
                s.expiring.remove(id);
                s.reaped.insert(id.clone());
            }
            Err(e) => problems.push(format!("expiring payload {id} lost, not reaped: {e}")),
        }
    }
    for id in deleted.iter().chain(reaped.iter()) {
        match p
            .stat(proto::PayloadRequest {
                payload_id: id.clone(),
            })
            .await
        {
            Err(e) if e.code() == Code::NotFound => {}
            Ok(_) => problems.push(format!("deleted payload {id} came back")),
            Err(e) => problems.push(format!("Stat of deleted {id}: {e}")),
        }
    }
    for id in &deleted_sessions {
        if server.data_dir.join("sessions").join(id).exists() {
            problems.push(format!("deleted session {id} still has a directory"));
        }
    }
    match verify_audit(server).await {
        Ok(v) if v.ok => {}
        Ok(v) => problems.push(format!(
            "audit chain broken at seq {} after {} events",
            v.first_bad_seq, v.events_checked
        )),
        Err(e) => problems.push(format!("VerifyAudit failed: {e}")),
    }
    problems.extend(orphan_check(server).await?);
    let temps = temp_files(&server.data_dir);
    if !temps.is_empty() {
        problems.push(format!("temporary files remain: {temps:?}"));
    }
    Ok(problems)
}
