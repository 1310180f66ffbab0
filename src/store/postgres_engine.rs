//! [`Engine`] over PostgreSQL, for fleet mode: every replica opens the same
//! database, so the trees, the audit chain and the coordination (locks and
//! leases) live where the operators already back up and watch.
//!
//! **Schema.** One table holds every tree (`spillway_kv`: tree name, key,
//! value; `bytea` compares bytewise, so ranges scan in the same order as the
//! embedded engines), and `spillway_leases` holds the leases. The schema is
//! versioned in `spillway_schema`: startup applies the migrations it lacks
//! under an advisory lock (so replicas starting together migrate once), and
//! refuses to run against a schema newer than this binary knows.
//!
//! **Round trips.** A batch commits as one statement (a data-modifying CTE
//! that deletes and upserts from arrays), so an ordinary commit is one round
//! trip and atomic on its own; only a fenced batch needs a transaction.
//!
//! Every round trip is counted (`spillway_postgres_round_trips_total`, and
//! [`crate::metrics::postgres_round_trips`] for benches): a prepared
//! statement's execution is one, preparing it (once per connection) one
//! more, and `BEGIN` and `COMMIT` one each.
//!
//! **Locks** are session-level advisory locks, taken in ascending key order
//! on a connection of their own pool, so a holder that needs the engine
//! meanwhile never waits for its own lock's connection. Dropping the guard
//! unlocks; if that fails, the connection is closed, which releases them.
//!
//! **Blocking.** The trait is blocking (callers use `spawn_blocking`), and
//! tokio-postgres is async: the engine's [`Bridge`] drives the connections,
//! and each call waits for its task there.

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use super::bridge::Bridge;
use super::engine::{
    Batch, Engine, EngineError, EngineLock, Entry, KeyRange, Lease, LockKey, Tree,
};

const NAME: &str = "postgres";

/// The schema this binary writes; [`MIGRATIONS`]`[n]` brings a database
/// from version `n` to `n + 1`.
pub const SCHEMA_VERSION: i32 = 1;

const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [
    // 1: the trees and the leases.
    "CREATE TABLE spillway_kv (
         tree text NOT NULL,
         key bytea NOT NULL,
         value bytea NOT NULL,
         PRIMARY KEY (tree, key)
     );
     CREATE TABLE spillway_leases (
         name text PRIMARY KEY,
         holder text NOT NULL,
         token bigint NOT NULL,
         expires_at timestamptz NOT NULL
     );",
];

/// The advisory-lock key that serializes migrations.
const MIGRATION_LOCK: LockKey = 0x5350_494c_4c57_4159; // "SPILLWAY"

fn err(e: impl std::fmt::Display) -> EngineError {
    EngineError::new(NAME, e)
}

/// Whether a server's error says the database went away rather than that
/// the statement failed: class 08 (connection exception) and class 57
/// (operator intervention: `terminating connection due to administrator
/// command` when it is stopped, `the database system is starting up`).
/// A query cancelled on request (57014) is the statement's own failure.
fn server_went_away(code: &tokio_postgres::error::SqlState) -> bool {
    let code = code.code();
    code.starts_with("08") || (code.starts_with("57") && code != "57014")
}

/// A driver error with its cause chain (tokio-postgres puts the server's
/// message in the source), so logs and statuses say what Postgres said.
/// One the server did not send (a closed or failed connection), or one that
/// says the server is going away or not yet up, means the database is
/// unavailable.
fn pg_err(e: &tokio_postgres::Error) -> EngineError {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    if e.as_db_error().is_none_or(|db| server_went_away(db.code())) {
        EngineError::unavailable(
            NAME,
            format!("the Postgres connection failed ({text}); retry once the database is back"),
        )
    } else {
        err(text)
    }
}

/// Counts `n` round trips to the database.
fn trips(n: u64) {
    crate::metrics::postgres_round_trip(n);
}

/// `sql` prepared on `client` (from its cache after the first time), with
/// the round trip counted when it was not cached.
async fn prepared(
    client: &deadpool_postgres::ClientWrapper,
    sql: &str,
) -> Result<tokio_postgres::Statement, EngineError> {
    let before = client.statement_cache.size();
    let stmt = client.prepare_cached(sql).await.map_err(|e| pg_err(&e))?;
    if client.statement_cache.size() > before {
        trips(1);
    }
    Ok(stmt)
}

/// A connection from `pool`, with the wait counted in the metrics.
async fn connection(pool: &Pool) -> Result<Object, EngineError> {
    let start = std::time::Instant::now();
    let conn = pool.get().await;
    crate::metrics::pool_wait(start.elapsed());
    conn.map_err(pool_err)
}

fn pool_err(e: deadpool_postgres::PoolError) -> EngineError {
    EngineError::unavailable(
        NAME,
        format!(
            "no Postgres connection: {e}; check store.postgres_url and that the database is up, then retry"
        ),
    )
}

/// How the engine connects.
#[derive(Debug, Clone)]
pub struct PostgresSettings {
    /// A libpq-style URL or key=value string.
    pub url: String,
    /// Connections for reads and commits.
    pub pool_size: usize,
    /// Connections that hold locks; at most this many locks are held at
    /// once by this process (callers wait for one beyond it).
    pub lock_pool_size: usize,
    /// How long a call waits for a connection before failing.
    pub wait: Duration,
}

impl PostgresSettings {
    /// Settings for `url` with the default pool sizes.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            pool_size: 16,
            lock_pool_size: 16,
            wait: Duration::from_secs(10),
        }
    }
}

/// The Postgres engine.
pub struct PostgresEngine {
    bridge: Arc<Bridge>,
    pool: Pool,
    locks: Pool,
}

impl std::fmt::Debug for PostgresEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresEngine")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

fn build_pool(
    config: &tokio_postgres::Config,
    size: usize,
    wait: Duration,
) -> Result<Pool, EngineError> {
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .wait_timeout(Some(wait))
        .create_timeout(Some(wait))
        .recycle_timeout(Some(wait))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(err)
}

impl PostgresEngine {
    /// Connects, migrates the schema to `SCHEMA_VERSION`, and refuses a
    /// database whose schema is newer.
    pub fn open(settings: &PostgresSettings) -> Result<Self, EngineError> {
        let config: tokio_postgres::Config = settings
            .url
            .parse()
            .map_err(|e| err(format!("store.postgres_url is not a Postgres URL: {e}")))?;
        let bridge = Arc::new(Bridge::new("spillway-postgres").map_err(err)?);
        let (pool, locks) = {
            let _entered = bridge.handle().enter();
            (
                build_pool(&config, settings.pool_size, settings.wait)?,
                build_pool(&config, settings.lock_pool_size, settings.wait)?,
            )
        };
        let engine = Self {
            bridge,
            pool,
            locks,
        };
        engine.migrate()?;
        Ok(engine)
    }

    /// Runs `f` on the engine's runtime and waits for it.
    fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T, EngineError>> + Send + 'static,
    ) -> Result<T, EngineError> {
        self.bridge
            .wait(f)
            .ok_or_else(|| err("the Postgres engine's runtime stopped"))?
    }

    fn migrate(&self) -> Result<(), EngineError> {
        let pool = self.pool.clone();
        self.run(async move {
            let mut client = connection(&pool).await?;
            let txn = client.transaction().await.map_err(|e| pg_err(&e))?;
            txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(|e| pg_err(&e))?;
            txn.batch_execute("CREATE TABLE IF NOT EXISTS spillway_schema (version integer NOT NULL)")
                .await
                .map_err(|e| pg_err(&e))?;
            let row = txn
                .query_one("SELECT coalesce(max(version), 0) FROM spillway_schema", &[])
                .await
                .map_err(|e| pg_err(&e))?;
            let current: i32 = row.get(0);
            if current > SCHEMA_VERSION {
                return Err(err(format!(
                    "the database's schema is version {current}, newer than this binary's {SCHEMA_VERSION}: a newer Spillway migrated it; run that version (or newer) instead"
                )));
            }
            for (from, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
                txn.batch_execute(sql).await.map_err(|e| pg_err(&e))?;
                let to = from as i32 + 1;
                tracing::info!(from, to, "migrated the Postgres schema");
            }
            txn.execute("DELETE FROM spillway_schema", &[])
                .await
                .map_err(|e| pg_err(&e))?;
            txn.execute("INSERT INTO spillway_schema (version) VALUES ($1)", &[&SCHEMA_VERSION.max(current)])
                .await
                .map_err(|e| pg_err(&e))?;
            txn.commit().await.map_err(|e| pg_err(&e))
        })
    }

    /// The schema version the database is at.
    pub fn schema_version(&self) -> Result<i32, EngineError> {
        let pool = self.pool.clone();
        self.run(async move {
            let client = connection(&pool).await?;
            let row = client
                .query_one("SELECT coalesce(max(version), 0) FROM spillway_schema", &[])
                .await
                .map_err(|e| pg_err(&e))?;
            Ok(row.get(0))
        })
    }
}

/// The SQL of one range scan: which bounds it has decides the statement.
fn range_sql(start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> String {
    let mut sql = String::from("SELECT key, value FROM spillway_kv WHERE tree = $1");
    match start {
        Bound::Included(_) => sql.push_str(" AND key >= $3"),
        Bound::Excluded(_) => sql.push_str(" AND key > $3"),
        Bound::Unbounded => sql.push_str(" AND $3::bytea IS NULL"),
    }
    match end {
        Bound::Included(_) => sql.push_str(" AND key <= $4"),
        Bound::Excluded(_) => sql.push_str(" AND key < $4"),
        Bound::Unbounded => sql.push_str(" AND $4::bytea IS NULL"),
    }
    sql.push_str(" ORDER BY key LIMIT $2");
    sql
}

fn bound_value(b: &Bound<Vec<u8>>) -> Option<Vec<u8>> {
    match b {
        Bound::Included(v) | Bound::Excluded(v) => Some(v.clone()),
        Bound::Unbounded => None,
    }
}

/// The batch's writes with later ones winning, split into deletes and
/// upserts (disjoint, so one statement can apply both).
type Columns = (Vec<String>, Vec<Vec<u8>>);
fn columns(batch: &Batch) -> (Columns, Columns, Vec<Vec<u8>>) {
    let mut last: BTreeMap<(&'static str, &[u8]), Option<&[u8]>> = BTreeMap::new();
    for op in batch.ops() {
        last.insert((op.tree.name(), op.key.as_slice()), op.value.as_deref());
    }
    let (mut del_t, mut del_k) = (Vec::new(), Vec::new());
    let (mut put_t, mut put_k, mut put_v) = (Vec::new(), Vec::new(), Vec::new());
    for ((tree, key), value) in last {
        match value {
            None => {
                del_t.push(tree.to_owned());
                del_k.push(key.to_vec());
            }
            Some(v) => {
                put_t.push(tree.to_owned());
                put_k.push(key.to_vec());
                put_v.push(v.to_vec());
            }
        }
    }
    ((del_t, del_k), (put_t, put_k), put_v)
}

const COMMIT_SQL: &str = "WITH gone AS (
        DELETE FROM spillway_kv kv
        USING unnest($1::text[], $2::bytea[]) AS d(tree, key)
        WHERE kv.tree = d.tree AND kv.key = d.key
    )
    INSERT INTO spillway_kv (tree, key, value)
    SELECT * FROM unnest($3::text[], $4::bytea[], $5::bytea[])
    ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value";

const FENCE_SQL: &str = "SELECT 1 FROM spillway_leases WHERE name = $1 AND token = $2 AND expires_at > now() FOR UPDATE";

const LEASE_SQL: &str = "INSERT INTO spillway_leases AS l (name, holder, token, expires_at)
        VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond')
    ON CONFLICT (name) DO UPDATE SET
        holder = EXCLUDED.holder,
        token = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now()
                     THEN l.token ELSE l.token + 1 END,
        expires_at = EXCLUDED.expires_at
    WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now()
    RETURNING token";

impl Engine for PostgresEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let pool = self.pool.clone();
        let key = key.to_vec();
        self.run(async move {
            let client = connection(&pool).await?;
            let stmt = prepared(
                &client,
                "SELECT value FROM spillway_kv WHERE tree = $1 AND key = $2",
            )
            .await?;
            trips(1);
            let row = client
                .query_opt(&stmt, &[&tree.name(), &key])
                .await
                .map_err(|e| pg_err(&e))?;
            Ok(row.map(|r| r.get::<_, Vec<u8>>(0)))
        })
    }

    fn scan(&self, tree: Tree, keys: KeyRange<'_>) -> Result<Vec<Entry>, EngineError> {
        let pool = self.pool.clone();
        let start = keys.start.map(<[u8]>::to_vec);
        let end = keys.end.map(<[u8]>::to_vec);
        let limit = i64::try_from(keys.limit).unwrap_or(i64::MAX);
        self.run(async move {
            let client = connection(&pool).await?;
            let stmt = prepared(&client, &range_sql(&start, &end)).await?;
            trips(1);
            let rows = client
                .query(
                    &stmt,
                    &[
                        &tree.name(),
                        &limit,
                        &bound_value(&start),
                        &bound_value(&end),
                    ],
                )
                .await
                .map_err(|e| pg_err(&e))?;
            Ok(rows
                .into_iter()
                .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1)))
                .collect())
        })
    }

    fn commit(&self, batch: &Batch) -> Result<(), EngineError> {
        if batch.is_empty() {
            return Ok(());
        }
        let ((del_t, del_k), (put_t, put_k), put_v) = columns(batch);
        let fence = batch.fenced_by().cloned();
        let pool = self.pool.clone();
        self.run(async move {
            let mut client = connection(&pool).await?;
            let stmt = prepared(&client, COMMIT_SQL).await?;
            let Some(lease) = fence else {
                trips(1);
                client
                    .execute(&stmt, &[&del_t, &del_k, &put_t, &put_k, &put_v])
                    .await
                    .map_err(|e| pg_err(&e))?;
                return Ok(());
            };
            let fence_stmt = prepared(&client, FENCE_SQL).await?;
            trips(1);
            let txn = client.transaction().await.map_err(|e| pg_err(&e))?;
            let token = i64::try_from(lease.token).map_err(err)?;
            trips(1);
            if txn
                .query_opt(&fence_stmt, &[&lease.name, &token])
                .await
                .map_err(|e| pg_err(&e))?
                .is_none()
            {
                return Err(err(format!(
                    "the {} lease (token {}) was lost to another replica; this write was refused, and the new holder carries on",
                    lease.name, lease.token
                )));
            }
            trips(2);
            txn.execute(&stmt, &[&del_t, &del_k, &put_t, &put_k, &put_v])
                .await
                .map_err(|e| pg_err(&e))?;
            txn.commit().await.map_err(|e| pg_err(&e))
        })
    }

    fn flush(&self) -> Result<(), EngineError> {
        // Every commit is durable once Postgres acknowledges it.
        Ok(())
    }

    fn shared(&self) -> bool {
        true
    }

    fn lock(&self, keys: &[LockKey]) -> Result<EngineLock, EngineError> {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        let locks = self.locks.clone();
        let conn = self.run(async move {
            let conn = connection(&locks).await?;
            let stmt = prepared(&conn, "SELECT pg_advisory_lock($1)").await?;
            for k in &keys {
                trips(1);
                if let Err(e) = conn.execute(&stmt, &[k]).await {
                    // Closing the connection releases what it took so far.
                    drop(Object::take(conn));
                    return Err(pg_err(&e));
                }
            }
            Ok(conn)
        })?;
        Ok(EngineLock::holding(Held {
            conn: Some(conn),
            bridge: self.bridge.clone(),
        }))
    }

    fn release_lease(&self, name: &'static str, holder: &str) -> Result<(), EngineError> {
        self.release(name, holder)
    }

    fn lease(
        &self,
        name: &'static str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, EngineError> {
        let pool = self.pool.clone();
        let holder = holder.to_owned();
        let ttl_ms = ttl.as_millis() as f64;
        self.run(async move {
            let client = connection(&pool).await?;
            let stmt = prepared(&client, LEASE_SQL).await?;
            trips(1);
            let row = client
                .query_opt(&stmt, &[&name, &holder, &ttl_ms])
                .await
                .map_err(|e| pg_err(&e))?;
            Ok(row.map(|r| Lease {
                name,
                token: u64::try_from(r.get::<_, i64>(0)).unwrap_or(0),
            }))
        })
    }
}

impl PostgresEngine {
    fn release(&self, name: &'static str, holder: &str) -> Result<(), EngineError> {
        let pool = self.pool.clone();
        let holder = holder.to_owned();
        self.run(async move {
            let client = connection(&pool).await?;
            trips(2);
            client
                .execute(
                    "UPDATE spillway_leases SET expires_at = now() WHERE name = $1 AND holder = $2",
                    &[&name, &holder],
                )
                .await
                .map_err(|e| pg_err(&e))?;
            Ok(())
        })
    }
}

/// Advisory locks held on one connection of the lock pool.
struct Held {
    conn: Option<Object>,
    bridge: Arc<Bridge>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // Waits, so the next taker in this process finds the locks free.
        self.bridge.wait(async move {
            let unlocked = match prepared(&conn, "SELECT pg_advisory_unlock_all()").await {
                Ok(stmt) => {
                    trips(1);
                    conn.execute(&stmt, &[]).await.map_err(|e| pg_err(&e))
                }
                Err(e) => Err(e),
            };
            if let Err(e) = unlocked {
                tracing::warn!(error = %e, "could not release advisory locks; closing their connection, which releases them");
                drop(Object::take(conn));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> (crate::testing::postgres::Database, PostgresEngine) {
        let db = crate::testing::postgres::database();
        let engine = PostgresEngine::open(&PostgresSettings::new(db.url())).unwrap();
        (db, engine)
    }

    #[test]
    fn passes_the_engine_conformance_suite() {
        let (_db, engine) = engine();
        super::super::engine::conformance(&engine);
    }

    #[test]
    fn two_replicas_share_locks_leases_and_fences() {
        let (db, a) = engine();
        let b = PostgresEngine::open(&PostgresSettings::new(db.url())).unwrap();
        super::super::engine::shared_conformance(&a, &b);
    }

    #[test]
    fn migrates_once_and_refuses_a_newer_schema() {
        let (db, engine) = engine();
        assert_eq!(engine.schema_version().unwrap(), SCHEMA_VERSION);
        // A second open (another replica) finds the schema current.
        let again = PostgresEngine::open(&PostgresSettings::new(db.url())).unwrap();
        again.put(Tree::Meta, b"k", b"v").unwrap();
        assert_eq!(engine.get(Tree::Meta, b"k").unwrap(), Some(b"v".to_vec()));
        db.sql("UPDATE spillway_schema SET version = 99");
        let e = PostgresEngine::open(&PostgresSettings::new(db.url())).unwrap_err();
        assert!(
            e.message
                .contains("schema is version 99, newer than this binary's 1"),
            "{e}"
        );
    }

    #[test]
    fn a_restarted_database_fails_calls_as_unavailable_then_serves_them_again() {
        let cluster = crate::testing::postgres::dedicated();
        let db = cluster.database();
        let settings = PostgresSettings {
            wait: Duration::from_secs(2),
            ..PostgresSettings::new(db.url())
        };
        let engine = PostgresEngine::open(&settings).unwrap();
        engine.put(Tree::Meta, b"k", b"before").unwrap();
        cluster.stop_fast();
        let e = engine.get(Tree::Meta, b"k").unwrap_err();
        assert!(e.unavailable, "{e}");
        assert!(e.message.contains("retry"), "{e}");
        let e = engine.put(Tree::Meta, b"k", b"during").unwrap_err();
        assert!(e.unavailable, "{e}");
        cluster.start_again();
        // The pool drops the dead connections and opens new ones.
        assert_eq!(
            engine.get(Tree::Meta, b"k").unwrap(),
            Some(b"before".to_vec())
        );
        engine.put(Tree::Meta, b"k", b"after").unwrap();
        assert_eq!(
            engine.get(Tree::Meta, b"k").unwrap(),
            Some(b"after".to_vec())
        );
        let _lock = engine.lock(&[7]).unwrap();
    }

    #[test]
    fn a_call_waiting_in_postgres_when_it_stops_fails_as_unavailable() {
        let cluster = crate::testing::postgres::dedicated();
        let db = cluster.database();
        let engine = Arc::new(PostgresEngine::open(&PostgresSettings::new(db.url())).unwrap());
        let held = engine.lock(&[11]).unwrap();
        // A second taker waits inside Postgres, in pg_advisory_lock.
        let waiter = {
            let engine = engine.clone();
            std::thread::spawn(move || engine.lock(&[11]).map(drop))
        };
        std::thread::sleep(Duration::from_millis(500));
        // The server ends that connection with FATAL 57P01
        // ("terminating connection due to administrator command").
        cluster.stop_fast();
        let e = waiter.join().unwrap().unwrap_err();
        assert!(e.unavailable, "{e}");
        assert!(e.message.contains("retry"), "{e}");
        drop(held);
        cluster.start_again();
        drop(engine.lock(&[11]).unwrap());
    }

    #[test]
    fn only_lost_or_stopping_servers_count_as_unavailable() {
        use tokio_postgres::error::SqlState;
        assert!(server_went_away(&SqlState::ADMIN_SHUTDOWN));
        assert!(server_went_away(&SqlState::CANNOT_CONNECT_NOW));
        assert!(server_went_away(&SqlState::CONNECTION_FAILURE));
        assert!(!server_went_away(&SqlState::QUERY_CANCELED));
        assert!(!server_went_away(&SqlState::UNIQUE_VIOLATION));
        assert!(!server_went_away(&SqlState::UNDEFINED_TABLE));
    }

    #[test]
    fn an_unreachable_database_fails_with_what_to_check() {
        let settings = PostgresSettings {
            wait: Duration::from_secs(2),
            ..PostgresSettings::new(format!(
                "postgres://spillway@127.0.0.1:{}/spillway",
                crate::testing::postgres::free_port()
            ))
        };
        let e = PostgresEngine::open(&settings).unwrap_err();
        assert!(e.message.contains("check store.postgres_url"), "{e}");
    }
}
