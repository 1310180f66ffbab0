//! Fair shares of bounded resources, for every door that takes work from
//! many tenants (uploads, execs, module compiles).
//!
//! - [`KeyedSlots`]: a semaphore with a global bound and a bound per key
//!   (a tenant, a session). A key at its bound is refused (or waits) on its
//!   own; other keys keep the global slots that are left.
//! - [`RateFloor`]: a stream that must keep a minimum rate after a grace
//!   period, so a client that trickles a byte now and then cannot hold a
//!   slot for ever.
//!
//! Neither knows what it guards: the caller names the limits (config keys)
//! and words the refusal for its own callers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One bound: how many, and the config key that sets it (for messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// How many at once.
    pub limit: usize,
    /// The config key, e.g. `limits.max_concurrent_uploads`.
    pub key: &'static str,
}

/// Why a slot was not given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The key already holds its bound.
    #[error("{key:?} already holds {limit} of them ({config_key} = {limit})")]
    Key {
        /// The key (a tenant, a session).
        key: String,
        /// Its bound.
        limit: usize,
        /// The config key of that bound.
        config_key: &'static str,
    },
    /// Every slot is taken, server-wide.
    #[error("all {limit} are taken server-wide ({config_key} = {limit})")]
    Global {
        /// The global bound.
        limit: usize,
        /// Its config key.
        config_key: &'static str,
    },
    /// The slots were closed (shutting down).
    #[error("no more slots are given: the server is shutting down")]
    Closed,
}

impl Refused {
    /// The config key of the bound that refused, if any.
    pub fn config_key(&self) -> Option<&'static str> {
        match self {
            Refused::Key { config_key, .. } | Refused::Global { config_key, .. } => {
                Some(config_key)
            }
            Refused::Closed => None,
        }
    }
}

/// A semaphore with a global bound and a bound per key. Keys with no slot
/// taken are forgotten, so the table holds at most one entry per slot in
/// use.
#[derive(Debug, Clone)]
pub struct KeyedSlots {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    global: Arc<Semaphore>,
    global_bound: Bound,
    per_key: Bound,
    keys: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// Callers in [`KeyedSlots::acquire_within`]'s wait, at most the global
    /// limit.
    waiting: AtomicUsize,
}

/// A slot held; given back on drop.
#[derive(Debug)]
pub struct Slot {
    key_permit: Option<OwnedSemaphorePermit>,
    global_permit: Option<OwnedSemaphorePermit>,
    inner: Arc<Inner>,
    key: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.global_permit = None;
        self.key_permit = None;
        self.inner.forget_if_idle(&self.key);
    }
}

impl KeyedSlots {
    /// `global` slots in all, at most `per_key` of them for one key (a
    /// per-key bound above the global one is the global one).
    pub fn new(global: Bound, per_key: Bound) -> Self {
        let global_limit = global.limit.min(Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(Inner {
                global: Arc::new(Semaphore::new(global_limit)),
                global_bound: Bound {
                    limit: global_limit,
                    key: global.key,
                },
                per_key: Bound {
                    limit: per_key.limit.min(global_limit),
                    key: per_key.key,
                },
                keys: Mutex::new(HashMap::new()),
                waiting: AtomicUsize::new(0),
            }),
        }
    }

    /// The global bound.
    pub fn global(&self) -> Bound {
        self.inner.global_bound
    }

    /// The per-key bound.
    pub fn per_key(&self) -> Bound {
        self.inner.per_key
    }

    /// Slots `key` holds now.
    pub fn held_by(&self, key: &str) -> usize {
        let keys = self.inner.lock();
        keys.get(key)
            .map_or(0, |s| self.inner.per_key.limit - s.available_permits())
    }

    /// Slots held now, over all keys.
    pub fn held(&self) -> usize {
        self.inner.global_bound.limit - self.inner.global.available_permits()
    }

    /// A slot now, or why not. The key's bound is checked first, so a key
    /// at its bound is told about its own limit even when the server is full
    /// too.
    pub fn try_acquire(&self, key: &str) -> Result<Slot, Refused> {
        let sem = self.inner.key_semaphore(key);
        let mut slot = self.slot(key);
        slot.key_permit = Some(sem.try_acquire_owned().map_err(|e| match e {
            tokio::sync::TryAcquireError::Closed => Refused::Closed,
            // A per-key bound no lower than the global one is the global
            // one, and is named so.
            tokio::sync::TryAcquireError::NoPermits
                if self.inner.per_key.limit >= self.inner.global_bound.limit =>
            {
                Refused::Global {
                    limit: self.inner.global_bound.limit,
                    config_key: self.inner.global_bound.key,
                }
            }
            tokio::sync::TryAcquireError::NoPermits => Refused::Key {
                key: key.to_owned(),
                limit: self.inner.per_key.limit,
                config_key: self.inner.per_key.key,
            },
        })?);
        slot.global_permit = Some(self.inner.global.clone().try_acquire_owned().map_err(
            |e| match e {
                tokio::sync::TryAcquireError::Closed => Refused::Closed,
                tokio::sync::TryAcquireError::NoPermits => Refused::Global {
                    limit: self.inner.global_bound.limit,
                    config_key: self.inner.global_bound.key,
                },
            },
        )?);
        Ok(slot)
    }

    /// A slot, waiting for one: first for the key's own (so a key that
    /// waits on itself takes nothing from others), then for a global one.
    /// Bound the wait with a timeout; a dropped wait gives back what it
    /// held.
    pub async fn acquire(&self, key: &str) -> Result<Slot, Refused> {
        let sem = self.inner.key_semaphore(key);
        let mut slot = self.slot(key);
        slot.key_permit = Some(sem.acquire_owned().await.map_err(|_| Refused::Closed)?);
        slot.global_permit = Some(
            self.inner
                .global
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Refused::Closed)?,
        );
        Ok(slot)
    }

    /// A slot now, or within `wait`: a burst takes turns instead of being
    /// refused, while a key whose slots stay busy past `wait` gets the
    /// refusal `try_acquire` gave. At most as many callers wait as there are
    /// slots in all; one more is refused at once.
    pub async fn acquire_within(&self, key: &str, wait: Duration) -> Result<Slot, Refused> {
        let refused = match self.try_acquire(key) {
            Ok(slot) => return Ok(slot),
            Err(Refused::Closed) => return Err(Refused::Closed),
            Err(r) => r,
        };
        // Counted out on drop, so a cancelled call stops waiting too.
        let _waiter = Waiter::enter(&self.inner.waiting, self.inner.global_bound.limit)
            .ok_or_else(|| refused.clone())?;
        tokio::time::timeout(wait, self.acquire(key))
            .await
            .unwrap_or(Err(refused))
    }

    fn slot(&self, key: &str) -> Slot {
        Slot {
            key_permit: None,
            global_permit: None,
            inner: self.inner.clone(),
            key: key.to_owned(),
        }
    }
}

/// One caller counted in a wait of bounded size.
struct Waiter<'a>(&'a AtomicUsize);

impl<'a> Waiter<'a> {
    fn enter(count: &'a AtomicUsize, most: usize) -> Option<Self> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < most).then_some(n + 1)
            })
            .ok()
            .map(|_| Waiter(count))
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Semaphore>>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key_semaphore(&self, key: &str) -> Arc<Semaphore> {
        let mut keys = self.lock();
        keys.entry(key.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_key.limit)))
            .clone()
    }

    /// Drops the key's entry when nothing holds or waits on it: the table
    /// owns one reference, so a count of one means no slot and no waiter.
    fn forget_if_idle(&self, key: &str) {
        let mut keys = self.lock();
        if let Some(sem) = keys.get(key)
            && Arc::strong_count(sem) == 1
            && sem.available_permits() == self.per_key.limit
        {
            keys.remove(key);
        }
    }
}

/// A minimum rate after a grace period: by `grace + n / min_per_sec` after
/// the start, at least `n` units must have arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateFloor {
    /// Units (bytes) per second the stream must keep, on average since it
    /// started; zero turns the floor off.
    pub min_per_sec: u64,
    /// Time before the floor applies.
    pub grace: Duration,
}

/// A stream judged by a [`RateFloor`].
#[derive(Debug, Clone)]
pub struct RateCheck {
    floor: RateFloor,
    started: Instant,
    received: u64,
}

/// A stream that fell below its floor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{received} bytes arrived in {elapsed_ms} ms, an average of {rate} bytes/s, below the minimum of {min} bytes/s that applies after the first {grace_ms} ms"
)]
pub struct TooSlow {
    /// Units received.
    pub received: u64,
    /// Time since the start.
    pub elapsed_ms: u64,
    /// The average rate.
    pub rate: u64,
    /// The floor.
    pub min: u64,
    /// The grace period.
    pub grace_ms: u64,
}

impl RateCheck {
    /// Starts judging now.
    pub fn start(floor: RateFloor) -> Self {
        Self::start_at(floor, Instant::now())
    }

    /// Starts judging at `started` (for tests).
    pub fn start_at(floor: RateFloor, started: Instant) -> Self {
        Self {
            floor,
            started,
            received: 0,
        }
    }

    /// Counts `n` more units.
    pub fn record(&mut self, n: u64) {
        self.received = self.received.saturating_add(n);
    }

    /// Units received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The instant by which more must arrive, or `None` when there is no
    /// floor. Waiting for the next unit with this as the deadline judges a
    /// silent stream as promptly as a trickling one.
    pub fn deadline(&self) -> Option<Instant> {
        if self.floor.min_per_sec == 0 {
            return None;
        }
        let credit = Duration::from_secs_f64(self.received as f64 / self.floor.min_per_sec as f64);
        Some(self.started + self.floor.grace + credit.min(Duration::from_secs(1 << 32)))
    }

    /// `Err` when, at `now`, the stream is below its floor.
    pub fn check_at(&self, now: Instant) -> Result<(), TooSlow> {
        let Some(deadline) = self.deadline() else {
            return Ok(());
        };
        if now < deadline {
            return Ok(());
        }
        let elapsed = now.saturating_duration_since(self.started);
        let secs = elapsed.as_secs_f64().max(0.001);
        Err(TooSlow {
            received: self.received,
            elapsed_ms: elapsed.as_millis() as u64,
            rate: (self.received as f64 / secs) as u64,
            min: self.floor.min_per_sec,
            grace_ms: self.floor.grace.as_millis() as u64,
        })
    }

    /// [`RateCheck::check_at`] now.
    pub fn check(&self) -> Result<(), TooSlow> {
        self.check_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(global: usize, per_key: usize) -> KeyedSlots {
        KeyedSlots::new(
            Bound {
                limit: global,
                key: "x.global",
            },
            Bound {
                limit: per_key,
                key: "x.per_tenant",
            },
        )
    }

    #[test]
    fn a_key_at_its_bound_is_refused_with_its_own_limit_and_others_still_get_slots() {
        let s = slots(4, 2);
        let a1 = s.try_acquire("a").unwrap();
        let _a2 = s.try_acquire("a").unwrap();
        let err = s.try_acquire("a").unwrap_err();
        assert_eq!(
            err,
            Refused::Key {
                key: "a".into(),
                limit: 2,
                config_key: "x.per_tenant"
            }
        );
        let _b1 = s.try_acquire("b").unwrap();
        let _b2 = s.try_acquire("b").unwrap();
        assert_eq!(s.held(), 4);
        assert_eq!(
            s.try_acquire("c").unwrap_err().config_key(),
            Some("x.global")
        );
        drop(a1);
        assert_eq!(s.held_by("a"), 1);
        let _c = s.try_acquire("c").unwrap();
    }

    #[test]
    fn a_refused_global_slot_gives_back_the_keys_slot() {
        let s = slots(1, 1);
        let _a = s.try_acquire("a").unwrap();
        assert!(s.try_acquire("b").is_err());
        assert_eq!(s.held_by("b"), 0);
        assert_eq!(s.inner.lock().len(), 1, "b's entry is forgotten");
    }

    #[test]
    fn a_per_key_bound_equal_to_the_global_one_is_reported_as_global() {
        let s = slots(1, 5);
        let _a = s.try_acquire("a").unwrap();
        assert_eq!(
            s.try_acquire("a").unwrap_err().config_key(),
            Some("x.global")
        );
    }

    #[test]
    fn idle_keys_are_forgotten() {
        let s = slots(8, 2);
        for i in 0..100 {
            drop(s.try_acquire(&format!("k{i}")).unwrap());
        }
        assert!(s.inner.lock().is_empty());
    }

    #[tokio::test]
    async fn a_key_waiting_on_its_own_bound_does_not_take_a_global_slot() {
        let s = slots(2, 1);
        let a1 = s.acquire("a").await.unwrap();
        let waiter = {
            let s = s.clone();
            tokio::spawn(async move { s.acquire("a").await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        // b still gets the second global slot while a's second waits.
        let b = s.try_acquire("b").unwrap();
        assert!(!waiter.is_finished());
        drop(b);
        drop(a1);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_trickle_fails_the_floor_and_a_steady_stream_passes() {
        let t0 = Instant::now();
        let floor = RateFloor {
            min_per_sec: 1000,
            grace: Duration::from_secs(10),
        };
        let mut c = RateCheck::start_at(floor, t0);
        assert!(c.check_at(t0 + Duration::from_secs(9)).is_ok(), "grace");
        let err = c.check_at(t0 + Duration::from_secs(10)).unwrap_err();
        assert_eq!((err.received, err.min), (0, 1000));
        c.record(5000);
        // 5000 bytes buy five more seconds at 1000/s.
        assert!(c.check_at(t0 + Duration::from_millis(14_999)).is_ok());
        assert!(c.check_at(t0 + Duration::from_secs(15)).is_err());
        assert_eq!(c.deadline(), Some(t0 + Duration::from_secs(15)));
    }

    #[test]
    fn a_zero_floor_never_fails() {
        let c = RateCheck::start(RateFloor {
            min_per_sec: 0,
            grace: Duration::ZERO,
        });
        assert!(c.deadline().is_none());
        assert!(
            c.check_at(Instant::now() + Duration::from_secs(3600))
                .is_ok()
        );
    }
}
