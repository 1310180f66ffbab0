//! Payload bytes in S3-compatible object storage (`store.blobs =
//! "s3://bucket/prefix"`), for fleet mode: every replica reads what any
//! replica stored, and the bytes outgrow one disk.
//!
//! **Objects.** One per payload, at `<prefix>/<session_id>/<payload_id>`.
//! An upload goes to the object (multipart above [`PART_BYTES`]) after its
//! bytes are complete and hashed locally and before the metadata commits,
//! so an acknowledged payload is always whole in the bucket; an upload that
//! fails midway, or runs out of time, is aborted, which removes its parts.
//! A replica killed mid-upload cannot abort: the bucket's lifecycle rule
//! for incomplete multipart uploads removes those parts.
//!
//! **The local copy.** Exec preopens, Search's maps and Inspect read local
//! files, so the session directories on each replica are a cache of the
//! bucket: [`ObjectBlobs::fetch`] fills a missing copy (sha256 and size
//! verified before it becomes visible, one fetch per payload however many
//! readers wait), and [`LocalCache`] evicts least recently used copies past
//! its byte bound. Deletion removes the objects and every replica's copy
//! (see `super::delete`).
//!
//! **Blocking.** The store is blocking and object_store is async: calls run
//! on this room's [`Bridge`] and are waited for, with a timeout.
//!
//! **Retries.** A failed request is retried [`RETRIES`] times with a short
//! backoff, all within [`RETRY_WINDOW`]: enough to ride out a bucket's brief
//! stumble, short enough that an upload to a bucket that is down is refused
//! within 2.5 s rather than after object_store's default backoff of
//! ten retries (which took 12.7 s), while the client waits holding its
//! bytes.

use std::collections::HashMap;
use std::future::Future;
use std::io::{Read as _, Write as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore as _, PartId};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, MultipartId, ObjectStoreExt as _, PutPayload, RetryConfig};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio_stream::StreamExt as _;

use super::bridge::Bridge;
use crate::ids::{PayloadId, SessionId};

/// Uploads above this size go multipart, in parts of this size.
pub const PART_BYTES: usize = 8 << 20;
/// Parts in flight at once per upload.
const PART_CONCURRENCY: usize = 2;
/// How long the abort of a failed multipart upload may take.
const ABORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a failed request is retried.
pub const RETRIES: usize = 5;
/// How long after a request's first try no retry starts.
pub const RETRY_WINDOW: Duration = Duration::from_secs(5);

/// The bounded retry policy of every request (see the module doc): backoffs
/// of at most 0.1, 0.2, 0.4, 0.8 and 1 s, jittered: 2.5 s in all at the most.
fn retry_policy() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
        },
        max_retries: RETRIES,
        retry_timeout: RETRY_WINDOW,
    }
}

/// Refuses a file that does not hold the bytes the upload counted.
fn check_size(read: u64, size: u64) -> Result<(), ObjectError> {
    if read == size {
        return Ok(());
    }
    Err(ObjectError::Io(std::io::Error::other(format!(
        "the upload's local file holds {read} bytes where {size} were written; it changed before it reached the bucket"
    ))))
}

/// Reads up to `buf.len()` bytes, fewer only at the end of the file.
fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Puts `file` as the parts of multipart upload `id` (at most
/// [`PART_CONCURRENCY`] in flight) and completes it; the caller aborts it
/// on failure.
async fn put_parts(
    store: Arc<AmazonS3>,
    key: ObjectPath,
    id: MultipartId,
    mut file: std::fs::File,
    size: u64,
) -> Result<(), ObjectError> {
    let mut in_flight: tokio::task::JoinSet<PartResult> = tokio::task::JoinSet::new();
    let mut parts: Vec<(usize, PartId)> = Vec::new();
    let mut read = 0u64;
    for idx in 0.. {
        let mut buf = vec![0u8; PART_BYTES];
        let n = read_full(&mut file, &mut buf)?;
        if n == 0 {
            break;
        }
        buf.truncate(n);
        read += n as u64;
        while in_flight.len() >= PART_CONCURRENCY {
            parts.push(joined(in_flight.join_next().await)?);
        }
        let (store, key, id) = (store.clone(), key.clone(), id.clone());
        in_flight.spawn(async move {
            let part = store
                .put_part(&key, &id, idx, PutPayload::from(buf))
                .await
                .map_err(unavailable)?;
            Ok((idx, part))
        });
    }
    while let Some(done) = in_flight.join_next().await {
        parts.push(joined(Some(done))?);
    }
    check_size(read, size)?;
    parts.sort_by_key(|(idx, _)| *idx);
    store
        .complete_multipart(&key, &id, parts.into_iter().map(|(_, p)| p).collect())
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// A part's upload: its index and its ID in the upload.
type PartResult = Result<(usize, PartId), ObjectError>;

/// A part's upload task's result.
fn joined(done: Option<Result<PartResult, tokio::task::JoinError>>) -> PartResult {
    match done {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(unavailable(format!("a part's upload task failed: {e}"))),
        None => Err(unavailable("no part's upload was in flight")),
    }
}

/// The `[store.s3]` section: where the bucket is and how to sign. Empty
/// fields fall back to the standard `AWS_*` environment variables.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct S3Config {
    /// The endpoint, for S3-compatible stores (`http://127.0.0.1:8333`).
    pub endpoint: String,
    /// The region (`us-east-1` when neither this nor `AWS_REGION` is set).
    pub region: String,
    /// Access key ID (else `AWS_ACCESS_KEY_ID`).
    pub access_key_id: String,
    /// Secret access key (else `AWS_SECRET_ACCESS_KEY`).
    pub secret_access_key: String,
    /// Allow a plain-HTTP endpoint (loopback test stores).
    pub allow_http: bool,
}

/// Errors of object storage, with what to do.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The bucket could not be reached or refused the call.
    #[error(
        "object storage is unavailable: {0}; the payload bytes are safe where they were, retry once the bucket is reachable"
    )]
    Unavailable(String),
    /// A fetched copy did not match its record.
    #[error(
        "the stored object of payload {payload} does not match its record ({what}); it was not used"
    )]
    Corrupt {
        /// The payload.
        payload: PayloadId,
        /// What differed.
        what: String,
    },
    /// The configuration names no usable bucket.
    #[error("store.blobs: {0}")]
    Config(String),
    /// A local file operation failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Parses `s3://bucket/prefix` into the bucket and the prefix.
pub fn parse_url(url: &str) -> Result<(String, String), ObjectError> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| {
        ObjectError::Config(format!(
            "{url:?} is not an s3:// URL; use \"s3://bucket/prefix\" or leave it empty for the local disk"
        ))
    })?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(ObjectError::Config(format!("{url:?} names no bucket")));
    }
    Ok((bucket.to_owned(), prefix.trim_matches('/').to_owned()))
}

/// The bound, the recency order and the owner of the local copies. A copy
/// is known by its session and file name (the path execs see) and by the
/// payload it holds: a name can outlive its payload (deleted on another
/// replica, then reused before the purge arrived), and a copy of the old
/// payload must never be served for the new one.
#[derive(Debug)]
pub struct LocalCache {
    limit: u64,
    inner: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    entries: HashMap<(SessionId, String), Entry>,
    /// Bytes of copies held now.
    bytes: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    payload: PayloadId,
    size: u64,
    used: Instant,
}

/// What the cache knows of a local file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// It holds this payload.
    This,
    /// It holds another payload (a reused name): not to be served.
    Other,
    /// Not known to this process (a copy from before a restart).
    Unknown,
}

impl LocalCache {
    /// A cache that holds at most `limit` bytes of copies.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            inner: Mutex::new(CacheState::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the local file `name` of `session` is known to hold, for a read
    /// of `payload`; a read of the copy it holds counts as a hit.
    pub fn lookup(&self, session: &SessionId, name: &str, payload: &PayloadId) -> Known {
        let mut s = self.state();
        let Some(e) = s.entries.get_mut(&(session.clone(), name.to_owned())) else {
            return Known::Unknown;
        };
        if e.payload != *payload {
            return Known::Other;
        }
        e.used = Instant::now();
        crate::metrics::cache_hit();
        Known::This
    }

    /// Notes a copy of `payload` now present (stored here or fetched);
    /// returns the copies to evict, least recently used first, to get back
    /// under the bound (never the one just added).
    pub fn added(
        &self,
        session: &SessionId,
        name: &str,
        payload: &PayloadId,
        size: u64,
        fetched: bool,
    ) -> Vec<(SessionId, String)> {
        let mut s = self.state();
        if fetched {
            crate::metrics::cache_miss(size);
        }
        let key = (session.clone(), name.to_owned());
        let entry = Entry {
            payload: payload.clone(),
            size,
            used: Instant::now(),
        };
        match s.entries.insert(key.clone(), entry) {
            Some(old) => s.bytes = s.bytes - old.size + size,
            None => s.bytes += size,
        }
        let mut out = Vec::new();
        if s.bytes <= self.limit {
            return out;
        }
        let mut order: Vec<_> = s
            .entries
            .iter()
            .filter(|(k, _)| **k != key)
            .map(|(k, e)| (e.used, k.clone(), e.size))
            .collect();
        order.sort();
        for (_, k, size) in order {
            if s.bytes <= self.limit {
                break;
            }
            s.entries.remove(&k);
            s.bytes -= size;
            out.push(k);
        }
        crate::metrics::cache_evicted(out.len() as u64);
        out
    }

    /// Forgets a copy that was removed.
    pub fn removed(&self, session: &SessionId, name: &str) {
        let mut s = self.state();
        if let Some(e) = s.entries.remove(&(session.clone(), name.to_owned())) {
            s.bytes -= e.size;
        }
    }

    /// Bytes of copies held now.
    pub fn bytes(&self) -> u64 {
        self.state().bytes
    }
}

/// The bucket, its runtime, and the fetches in flight.
pub struct ObjectBlobs {
    store: Arc<AmazonS3>,
    prefix: String,
    bridge: Bridge,
    /// One lock per payload being fetched, so concurrent readers wait for
    /// one fetch instead of starting their own.
    fetching: Mutex<HashMap<PayloadId, Arc<Mutex<()>>>>,
    /// The local copies' bound and order.
    pub cache: LocalCache,
    timeout: Duration,
}

impl std::fmt::Debug for ObjectBlobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectBlobs")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn unavailable(e: impl std::fmt::Display) -> ObjectError {
    ObjectError::Unavailable(e.to_string())
}

impl ObjectBlobs {
    /// Connects to the bucket of `url` (`s3://bucket/prefix`), keeping at
    /// most `cache_bytes` of local copies.
    pub fn open(url: &str, config: &S3Config, cache_bytes: u64) -> Result<Self, ObjectError> {
        // The HTTP client's TLS uses the process's rustls provider (ring,
        // as for the gRPC listener); installing it twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (bucket, prefix) = parse_url(url)?;
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if !config.endpoint.is_empty() {
            b = b
                .with_endpoint(&config.endpoint)
                .with_virtual_hosted_style_request(false);
        }
        if !config.region.is_empty() {
            b = b.with_region(&config.region);
        } else if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            b = b.with_region("us-east-1");
        }
        if !config.access_key_id.is_empty() {
            b = b.with_access_key_id(&config.access_key_id);
        }
        if !config.secret_access_key.is_empty() {
            b = b.with_secret_access_key(&config.secret_access_key);
        }
        let store = b
            .with_allow_http(config.allow_http)
            .with_retry(retry_policy())
            .build()
            .map_err(|e| ObjectError::Config(e.to_string()))?;
        Ok(Self {
            store: Arc::new(store),
            prefix,
            bridge: Bridge::new("spillway-objects")?,
            fetching: Mutex::new(HashMap::new()),
            cache: LocalCache::new(cache_bytes),
            timeout: Duration::from_secs(120),
        })
    }

    fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T, ObjectError>> + Send + 'static,
    ) -> Result<T, ObjectError> {
        self.run_within(self.timeout, f)
    }

    /// [`ObjectBlobs::run`] with a bound of the caller's.
    fn run_within<T: Send + 'static>(
        &self,
        timeout: Duration,
        f: impl Future<Output = Result<T, ObjectError>> + Send + 'static,
    ) -> Result<T, ObjectError> {
        self.bridge
            .wait(async move {
                match tokio::time::timeout(timeout, f).await {
                    Ok(r) => r,
                    Err(_) => Err(unavailable(format!(
                        "no answer within {} s",
                        timeout.as_secs()
                    ))),
                }
            })
            .ok_or_else(|| unavailable("the object-storage runtime stopped"))?
    }

    /// The object of a payload.
    pub fn key(&self, session: &SessionId, payload: &PayloadId) -> ObjectPath {
        let rel = format!("{session}/{payload}");
        if self.prefix.is_empty() {
            ObjectPath::from(rel)
        } else {
            ObjectPath::from(format!("{}/{rel}", self.prefix))
        }
    }

    /// Stores `file` (complete, `size` bytes) as the payload's object;
    /// returns once the object is complete. A file that does not hold
    /// exactly `size` bytes is refused. A multipart upload that fails for
    /// any reason, running out of time included, is aborted, so no parts
    /// are left behind (unless the abort cannot reach the bucket either:
    /// then the bucket's lifecycle rule removes them).
    pub fn put_file(
        &self,
        session: &SessionId,
        payload: &PayloadId,
        file: std::fs::File,
        size: u64,
    ) -> Result<(), ObjectError> {
        let store = self.store.clone();
        let key = self.key(session, payload);
        if size <= PART_BYTES as u64 {
            return self.run(async move {
                let mut file = file;
                let mut buf = Vec::with_capacity(size as usize);
                file.read_to_end(&mut buf)?;
                check_size(buf.len() as u64, size)?;
                store
                    .put(&key, PutPayload::from(buf))
                    .await
                    .map_err(unavailable)?;
                Ok(())
            });
        }
        let timeout = self.timeout;
        // The transfer has `timeout`; the abort after it its own bound.
        self.run_within(timeout + ABORT_TIMEOUT, async move {
            let id = store.create_multipart(&key).await.map_err(unavailable)?;
            let transfer = put_parts(store.clone(), key.clone(), id.clone(), file, size);
            let failure = match tokio::time::timeout(timeout, transfer).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => unavailable(format!(
                    "the multipart upload got no answer within {} s",
                    timeout.as_secs()
                )),
            };
            match tokio::time::timeout(ABORT_TIMEOUT, store.abort_multipart(&key, &id)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not abort a failed multipart upload; the bucket's lifecycle rule removes its parts");
                }
                Err(_) => {
                    tracing::warn!("the abort of a failed multipart upload got no answer; the bucket's lifecycle rule removes its parts");
                }
            }
            Err(failure)
        })
    }

    /// Fetches the payload's object into `dest` (a new temporary file),
    /// checking its size and SHA-256 against the record.
    pub fn get_into(
        &self,
        session: &SessionId,
        payload: &PayloadId,
        mut dest: std::fs::File,
        size: u64,
        sha256: &str,
    ) -> Result<(), ObjectError> {
        let store = self.store.clone();
        let key = self.key(session, payload);
        let (payload, sha256) = (payload.clone(), sha256.to_owned());
        self.run(async move {
            let got = store.get(&key).await.map_err(unavailable)?;
            let mut stream = got.into_stream();
            let mut hash = Sha256::new();
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(unavailable)?;
                n += chunk.len() as u64;
                if n > size {
                    break;
                }
                hash.update(&chunk);
                dest.write_all(&chunk)?;
            }
            let actual = hex::encode(hash.finalize());
            if n != size || actual != sha256 {
                return Err(ObjectError::Corrupt {
                    payload,
                    what: format!(
                        "{n} bytes with sha256 {actual}, expected {size} bytes with {sha256}"
                    ),
                });
            }
            dest.sync_all()?;
            Ok(())
        })
    }

    /// Removes the payloads' objects; one already gone is fine.
    pub fn delete_all(&self, objects: Vec<(SessionId, PayloadId)>) -> Result<(), ObjectError> {
        let store = self.store.clone();
        let keys: Vec<ObjectPath> = objects.iter().map(|(s, p)| self.key(s, p)).collect();
        self.run(async move {
            for key in keys {
                match store.delete(&key).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(unavailable(e)),
                }
            }
            Ok(())
        })
    }

    /// The lock that makes concurrent readers of one payload share one
    /// fetch; the caller holds it while it checks for and fills the copy.
    pub fn fetch_lock(&self, payload: &PayloadId) -> Arc<Mutex<()>> {
        let mut f = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
        if f.len() > 4096 {
            f.retain(|_, l| Arc::strong_count(l) > 1);
        }
        f.entry(payload.clone()).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_upload_of_three_parts_completes_whole_and_reads_back() {
        use sha2::Digest as _;
        use std::io::Seek as _;
        let (url, config) = crate::testing::s3::bucket();
        let blobs = ObjectBlobs::open(&url, &config, 1 << 20).unwrap();
        let data: Vec<u8> = (0..(PART_BYTES * 2 + 12_345) as u32)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&data).unwrap();
        file.rewind().unwrap();
        let (sid, pid) = (SessionId::generate(), PayloadId::generate());
        blobs.put_file(&sid, &pid, file, data.len() as u64).unwrap();
        let mut dest = tempfile::tempfile().unwrap();
        let sha = hex::encode(Sha256::digest(&data));
        blobs
            .get_into(
                &sid,
                &pid,
                dest.try_clone().unwrap(),
                data.len() as u64,
                &sha,
            )
            .unwrap();
        dest.rewind().unwrap();
        let mut back = Vec::new();
        dest.read_to_end(&mut back).unwrap();
        assert!(back == data, "the object's bytes differ from the file's");
    }

    #[test]
    fn a_multipart_upload_that_fails_midway_is_aborted_and_leaves_no_parts() {
        use std::io::Seek as _;
        let server = crate::testing::s3::dedicated();
        let blobs = ObjectBlobs::open(&server.url(), &server.config(), 1 << 20).unwrap();
        // The check sees an upload that is begun and not finished.
        let key = ObjectPath::from("probe/unfinished");
        let (store, k) = (blobs.store.clone(), key.clone());
        let id = blobs
            .run(async move { store.create_multipart(&k).await.map_err(unavailable) })
            .unwrap();
        assert_eq!(server.pending_multipart_uploads().len(), 1);
        let store = blobs.store.clone();
        let k = key.clone();
        blobs
            .run(async move { store.abort_multipart(&k, &id).await.map_err(unavailable) })
            .unwrap();
        assert!(server.pending_multipart_uploads().is_empty());

        // 12 MiB where 20 MiB were counted: the first part goes up, then
        // the file ends short, and the upload fails after its parts.
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![b'x'; 12 << 20]).unwrap();
        file.rewind().unwrap();
        let (sid, pid) = (SessionId::generate(), PayloadId::generate());
        let e = blobs.put_file(&sid, &pid, file, 20 << 20).unwrap_err();
        assert!(
            e.to_string()
                .contains("it changed before it reached the bucket"),
            "{e}"
        );
        assert_eq!(server.pending_multipart_uploads(), Vec::<String>::new());
        // And no object.
        let dest = tempfile::tempfile().unwrap();
        assert!(blobs.get_into(&sid, &pid, dest, 12 << 20, "00").is_err());
    }

    #[test]
    fn an_upload_to_a_bucket_that_is_down_is_refused_within_the_retry_window() {
        let server = crate::testing::s3::dedicated();
        let blobs = ObjectBlobs::open(&server.url(), &server.config(), 1 << 20).unwrap();
        let put = |name: &str| {
            let mut file = tempfile::tempfile().unwrap();
            file.write_all(name.as_bytes()).unwrap();
            std::io::Seek::rewind(&mut file).unwrap();
            let (sid, pid) = (SessionId::generate(), PayloadId::generate());
            blobs.put_file(&sid, &pid, file, name.len() as u64)
        };
        put("before").unwrap();
        server.stop();
        let t = Instant::now();
        let e = put("while down").unwrap_err();
        let took = t.elapsed();
        assert!(matches!(e, ObjectError::Unavailable(_)), "{e}");
        assert!(
            e.to_string().contains("object storage is unavailable"),
            "{e}"
        );
        // object_store's default policy took 12.7 s here; the bounded one
        // gives up after its retries, within the window plus a last try.
        assert!(
            took < RETRY_WINDOW + Duration::from_secs(1),
            "refused after {took:?}"
        );
        server.start_again();
        put("after").unwrap();
    }

    use super::*;

    #[test]
    fn a_bucket_url_splits_into_bucket_and_prefix() {
        assert_eq!(
            parse_url("s3://b/some/prefix/").unwrap(),
            ("b".into(), "some/prefix".into())
        );
        assert_eq!(parse_url("s3://b").unwrap(), ("b".into(), String::new()));
        assert!(
            parse_url("file:///x")
                .unwrap_err()
                .to_string()
                .contains("not an s3:// URL")
        );
        assert!(
            parse_url("s3:///x")
                .unwrap_err()
                .to_string()
                .contains("names no bucket")
        );
    }

    #[test]
    fn the_cache_evicts_least_recently_used_copies_past_its_bound() {
        let c = LocalCache::new(100);
        let s = SessionId::generate();
        let (a, b, d) = (
            PayloadId::generate(),
            PayloadId::generate(),
            PayloadId::generate(),
        );
        assert!(c.added(&s, "a", &a, 40, true).is_empty());
        assert!(c.added(&s, "b", &b, 40, true).is_empty());
        assert_eq!(c.lookup(&s, "a", &a), Known::This);
        // c pushes it to 120: b is the least recently used.
        assert_eq!(
            c.added(&s, "c", &d, 40, true),
            vec![(s.clone(), "b".to_owned())]
        );
        assert_eq!(c.bytes(), 80);
        c.removed(&s, "a");
        assert_eq!(c.bytes(), 40);
    }

    #[test]
    fn a_copy_under_a_reused_name_is_not_taken_for_the_new_payload() {
        let c = LocalCache::new(1 << 20);
        let s = SessionId::generate();
        let (old, new) = (PayloadId::generate(), PayloadId::generate());
        c.added(&s, "a.txt", &old, 10, false);
        assert_eq!(c.lookup(&s, "a.txt", &new), Known::Other);
        assert_eq!(c.lookup(&s, "b.txt", &new), Known::Unknown);
        c.added(&s, "a.txt", &new, 12, true);
        assert_eq!(c.lookup(&s, "a.txt", &new), Known::This);
        assert_eq!(c.bytes(), 12);
    }
}
