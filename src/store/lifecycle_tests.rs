//! The store's lifecycle on both engines, with a manual clock: quotas under
//! concurrency, propagation of deletions, the reaper's expiry index, holds,
//! `delete_on_close`, and deletions interrupted after their intent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::delete::{Request, Target};
use super::engine::Tree;
use super::records::{self, DeletionIntent, LegalHold, removed};
use super::*;
use crate::clock::ManualClock;

const HOUR: Duration = Duration::from_secs(3600);

/// The reaper's lease, as the reaper takes it (Postgres fences the
/// reaper's deletions with it).
fn lease(store: &Store) -> engine::Lease {
    store
        .reaper_lease("lifecycle-test", HOUR)
        .unwrap()
        .expect("the only holder")
}

/// With Postgres, the database of the store in `dir` (made on first use,
/// remembered in the directory so a reopen finds it).
fn postgres_for(dir: &Path, engine: EngineKind) -> Option<PostgresSettings> {
    if engine != EngineKind::Postgres {
        return None;
    }
    let file = dir.join("test-postgres-url");
    let url = std::fs::read_to_string(&file).unwrap_or_else(|_| {
        let url = crate::testing::postgres::database().url();
        std::fs::write(&file, &url).unwrap();
        url
    });
    Some(PostgresSettings::new(url))
}

/// The tests' store settings: 1 MiB payloads, 24 h retention, 48 h
/// sessions.
fn settings(dir: &Path, engine: EngineKind) -> StoreSettings {
    StoreSettings {
        engine,
        max_payload_bytes: 1 << 20,
        retention: 24 * HOUR,
        session_ttl: 48 * HOUR,
        cache_bytes: engine::DEFAULT_CACHE_BYTES,
        postgres: postgres_for(dir, engine),
        objects: None,
    }
}

fn open(dir: &Path, engine: EngineKind, clock: &ManualClock) -> Store {
    open_with(
        dir,
        settings(dir, engine),
        clock,
        Arc::new(NoContentCache),
        &mut |_| Ok(()),
    )
    .0
}

/// Opens over a fresh engine, handing finished deletions to `finished`.
fn open_with(
    dir: &Path,
    settings: StoreSettings,
    clock: &ManualClock,
    cache: Arc<dyn ContentCache>,
    finished: &mut dyn FnMut(&ReceiptRecord) -> Result<()>,
) -> (Store, ReconcileReport) {
    let engine = open_engine(dir, &settings).unwrap();
    Store::open(
        engine,
        dir,
        settings,
        Arc::new(clock.clone()),
        cache,
        finished,
    )
    .unwrap()
}

fn each_engine(test: impl Fn(EngineKind)) {
    for engine in [EngineKind::Redb, EngineKind::Sled, EngineKind::Postgres] {
        test(engine);
    }
}

fn session(store: &Store) -> SessionRecord {
    store
        .create_session(NewSession {
            tenant: "acme".into(),
            owner: "alice".into(),
            ..Default::default()
        })
        .unwrap()
}

fn put(store: &Store, s: &SessionId, bytes: &[u8], meta: UploadMeta) -> Result<PayloadRecord> {
    let mut u = store.begin_upload(s, meta)?;
    u.write(bytes)?;
    u.finish()
}

/// Runs `test` on each engine, over a store in a fresh directory with
/// its clock at `now_ms`.
fn each_store(now_ms: Millis, test: impl Fn(&Store)) {
    each_engine(|engine| {
        let dir = tempfile::tempdir().unwrap();
        test(&open(dir.path(), engine, &ManualClock::new(now_ms)));
    });
}

/// Writes a record straight to the engine, as a step of the store would.
fn put_record<T: serde::Serialize>(store: &Store, tree: Tree, key: &str, record: &T) {
    store
        .engine
        .put(tree, key.as_bytes(), &records::encode(record))
        .unwrap();
}

/// Stores `bytes` with no metadata.
fn put_plain(store: &Store, s: &SessionId, bytes: &[u8]) -> PayloadRecord {
    put(store, s, bytes, UploadMeta::default()).unwrap()
}

/// One step of the reaper, at the store's time.
fn reap(store: &Store) -> ReapStep {
    store
        .reap_due(&lease(store), store.now_ms(), None, 64)
        .unwrap()
}

/// Holds session `s` for `reason`, as carol.
fn hold(store: &Store, s: &SessionId, reason: &str) {
    store
        .set_legal_hold(
            s,
            Some(LegalHold {
                reason: reason.into(),
                by: "carol".into(),
                since_ms: 0,
            }),
        )
        .unwrap();
}

fn derived(from: &PayloadRecord) -> UploadMeta {
    UploadMeta {
        derived_from: vec![from.id.clone()],
        ..Default::default()
    }
}

fn file_names(store: &Store, s: &SessionId) -> Vec<String> {
    let mut names = blobs::list_names(&store.blobs.session_dir(s).unwrap()).unwrap();
    names.sort();
    names
}

fn kinds(r: &ReceiptRecord, kind: &str) -> Vec<String> {
    r.removed
        .iter()
        .filter(|i| i.kind == kind)
        .map(|i| i.id.clone())
        .collect()
}

#[test]
fn concurrent_uploads_never_overshoot_the_session_byte_quota() {
    each_engine(|engine| {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path(), engine, &ManualClock::new(0)));
        let s = session(&store);
        let quota = Quota {
            max_session_bytes: 10 * 100,
            ..Default::default()
        };
        let results: Vec<Result<PayloadRecord>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..50)
                .map(|i| {
                    let (store, sid) = (store.clone(), s.id.clone());
                    scope.spawn(move || {
                        let body = format!("{i:0>100}");
                        put(
                            &store,
                            &sid,
                            body.as_bytes(),
                            UploadMeta {
                                quota,
                                ..Default::default()
                            },
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 10, "{engine:?}: exactly the ten that fit are stored");
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            let StoreError::QuotaExceeded { quota, limit, .. } = e else {
                panic!("{engine:?}: unexpected error {e}");
            };
            assert_eq!((*quota, *limit), ("max_session_bytes", 1000));
        }
        let after = store.session(&s.id).unwrap();
        assert_eq!((after.usage_bytes, after.usage_payloads), (1000, 10));
        assert_eq!(
            file_names(&store, &s.id).len(),
            10,
            "no partial file is kept"
        );
    });
}

#[test]
fn deleting_a_payload_takes_what_derives_from_it_and_the_receipt_lists_everything() {
    each_engine(|engine| {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), engine, &ManualClock::new(0));
        let s = session(&store);
        let parent = put_plain(&store, &s.id, b"parent bytes\n");
        let output = put(&store, &s.id, b"output\n", derived(&parent)).unwrap();
        let grandchild = put(&store, &s.id, b"grandchild\n", derived(&output)).unwrap();
        let archive = put(
            &store,
            &s.id,
            b"archived notice\n",
            UploadMeta {
                archive_key: "00112233aabbccdd".into(),
                ..derived(&parent)
            },
        )
        .unwrap();
        // A deduplicated copy keeps the bytes alive.
        let copy = put_plain(&store, &s.id, b"parent bytes\n");
        let bystander = put_plain(&store, &s.id, b"unrelated\n");

        let r = store
            .delete(&Request {
                target: Target::Payload(parent.id.clone()),
                requested_by: "alice",
                reason: "test",
                fence: None,
            })
            .unwrap();
        assert_eq!(kinds(&r, removed::PAYLOAD), vec![parent.id.to_string()]);
        let mut derived_ids = kinds(&r, removed::DERIVED_PAYLOAD);
        derived_ids.sort();
        let mut want = vec![output.id.to_string(), grandchild.id.to_string()];
        want.sort();
        assert_eq!(derived_ids, want);
        assert_eq!(
            kinds(&r, removed::ARCHIVE_ENTRY),
            vec![archive.id.to_string()]
        );
        assert_eq!(kinds(&r, removed::LINE_INDEX).len(), 4);
        // The parent's bytes live on in the copy; the others' are freed.
        let blobs = kinds(&r, removed::CONTENT_BLOB);
        assert_eq!(blobs.len(), 3);
        assert!(!blobs.contains(&parent.sha256));
        assert!(store.verify_receipt(&crate::receipt::Signed::from(&r), &r.signature));

        for gone in [&parent, &output, &grandchild, &archive] {
            assert!(matches!(
                store.payload(&gone.id),
                Err(StoreError::NotFound { .. })
            ));
            assert_eq!(
                store
                    .deletion_receipt(gone.id.as_str())
                    .unwrap()
                    .unwrap()
                    .id,
                r.id
            );
        }
        let mut left = vec![copy.name.clone(), bystander.name.clone()];
        left.sort();
        assert_eq!(file_names(&store, &s.id), left);
        let after = store.session(&s.id).unwrap();
        assert_eq!(after.usage_payloads, 2);
        assert_eq!(after.usage_bytes, copy.size + bystander.size);
        assert!(
            store
                .engine
                .scan_prefix(Tree::Derived, b"", None, 10)
                .unwrap()
                .is_empty()
        );
    });
}

#[test]
fn derived_payloads_in_a_held_session_block_the_parents_deletion() {
    each_store(0, |store| {
        let parent_session = session(store);
        let child_session = session(store);
        let parent = put_plain(store, &parent_session.id, b"p\n");
        put(store, &child_session.id, b"c\n", derived(&parent)).unwrap();
        hold(store, &child_session.id, "litigation");
        let err = store.delete_payload(&parent.id, "alice", "").unwrap_err();
        let StoreError::LegalHold { session, .. } = err else {
            panic!("expected the hold, got {err}");
        };
        assert_eq!(session, child_session.id);
        assert!(store.payload(&parent.id).is_ok(), "nothing was deleted");
    });
}

#[test]
fn the_reaper_deletes_what_expired_skips_held_sessions_and_finds_overdue_work_after_a_restart() {
    each_engine(|engine| {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let (held_id, kept_id, expired_id, expired_session) = {
            let store = open(dir.path(), engine, &clock);
            let s = session(&store);
            let expired = put_plain(&store, &s.id, b"old\n");
            let held = session(&store);
            let held_payload = put_plain(&store, &held.id, b"held\n");
            hold(&store, &held.id, "audit");
            clock.advance(23 * HOUR);
            let kept = put_plain(&store, &s.id, b"new\n");
            // Nothing is due yet.
            let step = reap(&store);
            assert!(step.receipts.is_empty());
            (held_payload.id, kept.id, expired.id, s.id)
        };
        // Down for two hours: the first payloads' 24 h retention passes.
        clock.advance(2 * HOUR);
        let store = open(dir.path(), engine, &clock);
        let step = reap(&store);
        assert_eq!(step.receipts.len(), 1, "{engine:?}");
        assert_eq!(step.receipts[0].target_id, expired_id.as_str());
        assert_eq!(step.receipts[0].requested_by, expiry::REAPER);
        assert_eq!(step.held, 1);
        assert!(store.payload(&held_id).is_ok());
        assert!(store.payload(&kept_id).is_ok());

        // Lifting the hold makes the held payload deletable.
        let held_session = store.payload(&held_id).unwrap().session_id;
        store.set_legal_hold(&held_session, None).unwrap();
        let step = reap(&store);
        assert_eq!(step.receipts.len(), 1);
        assert!(store.payload(&held_id).is_err());

        // The session TTL (48 h) takes the session and what is left in it.
        clock.advance(24 * HOUR);
        let step = reap(&store);
        assert!(
            step.receipts
                .iter()
                .any(|r| r.target_id == expired_session.as_str())
        );
        assert!(store.session(&expired_session).is_err());
        assert!(store.payload(&kept_id).is_err());
    });
}

#[test]
fn closing_with_delete_on_close_deletes_the_payloads_unless_held_then_the_reaper_does() {
    each_store(5_000, |store| {
        let s = session(store);
        let p = put_plain(store, &s.id, b"x\n");
        let (closed, receipt) = store.close_session(&s.id, true).unwrap();
        assert_eq!(closed.state, SessionState::Closed);
        let receipt = receipt.expect("deleted at close");
        assert_eq!(receipt.deleted_payload_ids, vec![p.id.clone()]);
        assert!(store.payload(&p.id).is_err());
        assert!(store.session(&s.id).is_ok(), "the closed session stays");

        let held = session(store);
        let q = put_plain(store, &held.id, b"y\n");
        hold(store, &held.id, "r");
        let (_, receipt) = store.close_session(&held.id, true).unwrap();
        assert!(receipt.is_none());
        assert_eq!(reap(store).held, 1);
        assert!(store.payload(&q.id).is_ok());
        store.set_legal_hold(&held.id, None).unwrap();
        let step = reap(store);
        assert_eq!(step.receipts.len(), 1);
        assert!(store.payload(&q.id).is_err());
        // Done: the pending entry is gone too.
        assert!(reap(store).receipts.is_empty());
    });
}

#[test]
fn a_deletion_interrupted_after_its_intent_is_finished_at_the_next_open() {
    each_engine(|engine| {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(0);
        let (s, gone, kept) = {
            let store = open(dir.path(), engine, &clock);
            let s = session(&store);
            let gone = put_plain(&store, &s.id, b"doomed\n");
            let kept = put_plain(&store, &s.id, b"kept\n");
            // What step 2 of a deletion writes, then a "crash" before any
            // file goes: the intent alone.
            let intent = DeletionIntent {
                receipt_id: ReceiptId::generate(),
                payloads: vec![gone.clone()],
                sessions: vec![],
                usage: vec![(s.id.clone(), gone.size, 1)],
                expiry_keys: vec![],
            };
            put_record(
                &store,
                Tree::DeletionIntents,
                intent.receipt_id.as_str(),
                &intent,
            );
            let receipt = ReceiptRecord {
                id: intent.receipt_id.clone(),
                target_id: gone.id.to_string(),
                reason: String::new(),
                requested_by: "alice".into(),
                tenant: "acme".into(),
                owner: "alice".into(),
                share_with: vec![],
                deleted_ms: 0,
                deleted_payload_ids: vec![gone.id.clone()],
                bytes_deleted: gone.size,
                content_sha256: vec![gone.sha256.clone()],
                removed: vec![],
                signature: String::new(),
                purge_confirmed: None,
            };
            put_record(&store, Tree::Receipts, receipt.id.as_str(), &receipt);
            (s, gone, kept)
        };
        let settings = settings(dir.path(), engine);
        let mut reported = Vec::new();
        let (store, report) = open_with(
            dir.path(),
            settings,
            &clock,
            Arc::new(NoContentCache),
            &mut |r| {
                reported.push(r.target_id.clone());
                Ok(())
            },
        );
        assert_eq!(report.deletions_finished, 1);
        assert_eq!(
            reported,
            vec![gone.id.to_string()],
            "the finished deletion is handed back to be audited"
        );
        assert!(
            report.missing_payloads.is_empty(),
            "finished before reconciling"
        );
        assert!(store.payload(&gone.id).is_err());
        assert_eq!(file_names(&store, &s.id), vec![kept.name.clone()]);
        let after = store.session(&s.id).unwrap();
        assert_eq!((after.usage_bytes, after.usage_payloads), (kept.size, 1));
    });
}

/// A content cache that holds what it is told to and records what it is
/// asked to forget.
#[derive(Default)]
struct Recording {
    held: Mutex<Vec<String>>,
    forgotten: Mutex<Vec<String>>,
}

impl ContentCache for Recording {
    fn holds(&self, sha256: &str) -> bool {
        self.held.lock().unwrap().iter().any(|h| h == sha256)
    }

    fn forget(&self, sha256: &str) {
        self.held.lock().unwrap().retain(|h| h != sha256);
        self.forgotten.lock().unwrap().push(sha256.to_owned());
    }
}

#[test]
fn freeing_bytes_forgets_their_cached_inspect_result_and_the_receipt_lists_it() {
    each_engine(|engine| {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(0);
        let settings = settings(dir.path(), engine);
        let cache = Arc::new(Recording::default());
        let (store, _) = open_with(dir.path(), settings, &clock, cache.clone(), &mut |_| Ok(()));
        let s = session(&store);
        let a = put(&store, &s.id, b"{\"same\":1}", UploadMeta::default()).unwrap();
        let b = put(&store, &s.id, b"{\"same\":1}", UploadMeta::default()).unwrap();
        cache.held.lock().unwrap().push(a.sha256.clone());

        // The bytes survive in `b`: nothing is freed, nothing forgotten.
        let r = store.delete_payload(&a.id, "alice", "").unwrap();
        assert!(kinds(&r, removed::CONTENT_BLOB).is_empty());
        assert!(kinds(&r, removed::INSPECT_CACHE).is_empty());
        assert!(cache.forgotten.lock().unwrap().is_empty());

        // The last copy goes: its cached structure goes with it.
        let r = store.delete_payload(&b.id, "alice", "").unwrap();
        assert_eq!(kinds(&r, removed::CONTENT_BLOB), vec![b.sha256.clone()]);
        assert_eq!(kinds(&r, removed::INSPECT_CACHE), vec![b.sha256.clone()]);
        assert_eq!(*cache.forgotten.lock().unwrap(), vec![b.sha256.clone()]);
        assert!(!cache.holds(&b.sha256));
    });
}

#[test]
fn usage_history_keeps_a_deleted_sessions_day_and_survives_a_reopen() {
    const DAY: Duration = Duration::from_secs(86_400);
    each_engine(|engine| {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(0);
        clock.advance(100 * DAY);
        {
            let store = open(dir.path(), engine, &clock);
            let s = session(&store);
            put_plain(&store, &s.id, b"first day's bytes\n");
            assert_eq!(store.sample_usage(false).unwrap(), 1, "{engine:?}");
            // Not due again within the hour, unless forced.
            clock.advance(HOUR / 2);
            assert_eq!(store.sample_usage(false).unwrap(), 0, "{engine:?}");
            assert_eq!(store.sample_usage(true).unwrap(), 1, "{engine:?}");
            store
                .delete(&Request {
                    target: Target::Session(s.id.clone()),
                    requested_by: "alice",
                    reason: "test",
                    fence: None,
                })
                .unwrap();
            clock.advance(DAY);
            assert_eq!(store.sample_usage(false).unwrap(), 1, "{engine:?}");
        }
        let store = open(dir.path(), engine, &clock);
        let h = store.usage_history("acme", 30).unwrap();
        assert_eq!(h.len(), 2, "{engine:?}: {h:?}");
        assert_eq!(
            (h[0].day, h[0].bytes, h[0].payloads, h[0].sessions),
            (100, 18, 1, 1)
        );
        assert_eq!(
            (h[1].day, h[1].bytes, h[1].payloads, h[1].sessions),
            (101, 0, 0, 0)
        );
        assert!(store.usage_history("other", 30).unwrap().is_empty());
        // Past the kept days, the old samples go.
        clock.advance(HISTORY_DAYS as u32 * DAY);
        store.sample_usage(false).unwrap();
        let h = store.usage_history("acme", HISTORY_DAYS).unwrap();
        assert_eq!(h.len(), 1, "{engine:?}: {h:?}");
    });
}

/// Fleet mode's two replicas in one process: stores over one Postgres
/// database and one bucket, each with its own directory of local copies,
/// on one manual clock.
fn replicas(clock: &ManualClock, dirs: [&Path; 2]) -> [Store; 2] {
    let url = crate::testing::postgres::database().url();
    let (bucket, s3) = crate::testing::s3::bucket();
    dirs.map(|dir| {
        let settings = StoreSettings {
            engine: EngineKind::Postgres,
            max_payload_bytes: 1 << 20,
            retention: 24 * HOUR,
            session_ttl: 48 * HOUR,
            cache_bytes: engine::DEFAULT_CACHE_BYTES,
            postgres: Some(PostgresSettings::new(url.clone())),
            objects: Some(ObjectSettings {
                url: bucket.clone(),
                s3: s3.clone(),
                local_cache_bytes: 1 << 20,
                // Nobody tails here but the test: no waiting for it.
                purge_confirm_timeout: Duration::ZERO,
            }),
        };
        open_with(dir, settings, clock, Arc::new(NoContentCache), &mut |_| {
            Ok(())
        })
        .0
    })
}

#[test]
fn a_replica_tailing_the_purge_log_purges_a_deletion_made_after_the_clock_stepped_back() {
    let clock = ManualClock::new(1_800_000_000_000);
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let [a, b] = replicas(&clock, [dir_a.path(), dir_b.path()]);
    let s = session(&a);
    let first = put(&a, &s.id, b"first\n", UploadMeta::default()).unwrap();
    let second = put(&a, &s.id, b"second\n", UploadMeta::default()).unwrap();
    // Replica b reads both, so it holds a local copy of each.
    for p in [&first, &second] {
        b.open_payload(&b.payload(&p.id).unwrap()).unwrap();
    }
    let every = Duration::from_millis(250);
    let mut tail = b.purge_step("b", every, &PurgeStep::default()).unwrap();
    assert!(file_names(&b, &s.id).contains(&second.name));

    a.delete_payload(&first.id, "alice", "").unwrap();
    tail = b.purge_step("b", every, &tail).unwrap();
    assert_eq!(tail.removed, 1);
    assert!(!file_names(&b, &s.id).contains(&first.name));

    // The deleting clock steps back a minute (NTP, or another replica's
    // clock behind this one's): the next entry still sorts after b's cursor.
    clock.set(clock.now_ms() - 60_000);
    a.delete_payload(&second.id, "alice", "").unwrap();
    tail = b.purge_step("b", every, &tail).unwrap();
    assert_eq!(
        tail.removed, 1,
        "b missed the second deletion's purge entry"
    );
    assert!(!file_names(&b, &s.id).contains(&second.name));
}

#[test]
fn a_payload_past_the_scan_threshold_is_stored_and_described_exactly_however_it_is_written() {
    use sha2::{Digest, Sha256};
    use std::io::Read as _;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path(), EngineKind::Redb);
    settings.max_payload_bytes = 64 << 20;
    let clock = ManualClock::new(1_000);
    let (store, _) = open_with(
        dir.path(),
        settings,
        &clock,
        Arc::new(NoContentCache),
        &mut |_| Ok(()),
    );
    let s = session(&store).id;
    // 20 MiB of lines, past the 8 MiB at which the content pass moves to
    // its own thread.
    let line = "{\"id\":1,\"name\":\"héllo 🌍\"}\n";
    let data = line.repeat((20 << 20) / line.len()).into_bytes();
    let lines = (data.len() / line.len()) as u64;
    for how in ["one slice", "shared chunks of 3 MiB + 1"] {
        let mut u = store.begin_upload(&s, UploadMeta::default()).unwrap();
        if how == "one slice" {
            u.write(&data).unwrap();
        } else {
            for c in data.chunks((3 << 20) + 1) {
                u.write_shared(Bytes::copy_from_slice(c)).unwrap();
            }
        }
        let record = u.finish().unwrap();
        assert_eq!(record.size, data.len() as u64, "{how}");
        assert_eq!(record.line_count, lines, "{how}");
        assert_eq!(record.sha256, hex::encode(Sha256::digest(&data)), "{how}");
        let mut stored = Vec::new();
        store
            .open_payload(&record)
            .unwrap()
            .into_std()
            .read_to_end(&mut stored)
            .unwrap();
        assert!(stored == data, "{how}: the stored bytes differ");
    }
}
