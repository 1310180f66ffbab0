//! Each tenant's stored bytes, payloads and sessions over time: one sample
//! per tenant per UTC day in [`Tree::UsageHistory`], kept for
//! [`HISTORY_DAYS`] days, so the compliance console can chart what was
//! stored even after the sessions that held it were deleted.
//!
//! The reaper calls [`Store::sample_usage`] on each pass; a sample is taken
//! at its first pass after startup, then at most every [`SAMPLE_EVERY`] of
//! store time (the time of the last one
//! is kept in [`Tree::Meta`], so restarts and other replicas see it). A
//! sample overwrites its tenant's row for the day, so a day's row is the
//! last figure seen that day; past days are never rewritten.

use std::collections::BTreeMap;
use std::ops::Bound;

use serde::{Deserialize, Serialize};

use super::engine::{Batch, Tree};
use super::records::{self, SessionRecord};
use super::{Result, Store};
use crate::clock::Millis;

/// Days of samples kept per tenant.
pub const HISTORY_DAYS: i64 = 400;
/// How often the usage is sampled at most.
pub const SAMPLE_EVERY: Millis = 60 * 60 * 1000;
const DAY_MS: Millis = 86_400_000;
/// `Tree::Meta` key of the last sample's time.
const LAST_SAMPLE: &[u8] = b"usage_history.last_sample_ms";
/// Sessions read per engine call while summing.
const PAGE: usize = 1000;

/// One tenant's figures on one day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageSample {
    /// Days since the Unix epoch (UTC).
    pub day: i64,
    /// When the sample was taken.
    pub at_ms: Millis,
    /// Bytes stored, as the sessions count them.
    pub bytes: u64,
    /// Payloads stored.
    pub payloads: u64,
    /// Sessions stored (open or closed).
    pub sessions: u64,
}

fn key(tenant: &str, day: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(tenant.len() + 9);
    k.extend_from_slice(tenant.as_bytes());
    k.push(0);
    // Days before 1970 do not occur; clamping keeps the keys in order.
    k.extend_from_slice(&(day.max(0) as u64).to_be_bytes());
    k
}

impl Store {
    /// Samples every tenant's usage when `force`d (the reaper's first pass
    /// after startup) or when the last sample is older than
    /// `SAMPLE_EVERY`; returns the tenants sampled (0 when not due).
    /// Reads every session record once.
    pub fn sample_usage(&self, force: bool) -> Result<usize> {
        let now = self.now_ms();
        let last = match self.engine.get(Tree::Meta, LAST_SAMPLE)? {
            Some(v) => records::decode::<Millis>(&v)?,
            None => Millis::MIN,
        };
        if !force && now.saturating_sub(last) < SAMPLE_EVERY {
            return Ok(0);
        }
        let day = now.div_euclid(DAY_MS);
        let mut sums: BTreeMap<String, UsageSample> = BTreeMap::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let start = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let page = self
                .engine
                .range(Tree::Sessions, start, Bound::Unbounded, PAGE)?;
            let Some((last_key, _)) = page.last() else {
                break;
            };
            after = Some(last_key.clone());
            for (_, v) in &page {
                let s: SessionRecord = records::decode(v)?;
                let e = sums.entry(s.tenant).or_insert(UsageSample {
                    day,
                    at_ms: now,
                    bytes: 0,
                    payloads: 0,
                    sessions: 0,
                });
                e.bytes += s.usage_bytes;
                e.payloads += s.usage_payloads;
                e.sessions += 1;
            }
            if page.len() < PAGE {
                break;
            }
        }
        // A tenant whose last session went since the last sample reads 0.
        for tenant in self.sampled_tenants()? {
            sums.entry(tenant).or_insert(UsageSample {
                day,
                at_ms: now,
                bytes: 0,
                payloads: 0,
                sessions: 0,
            });
        }
        let mut b = Batch::new();
        for (tenant, sample) in &sums {
            b.put(
                Tree::UsageHistory,
                key(tenant, day),
                records::encode(sample),
            );
            let old = self.engine.range(
                Tree::UsageHistory,
                Bound::Included(key(tenant, 0).as_slice()),
                Bound::Excluded(key(tenant, day - HISTORY_DAYS + 1).as_slice()),
                PAGE,
            )?;
            for (k, _) in old {
                b.delete(Tree::UsageHistory, k);
            }
        }
        b.put(Tree::Meta, LAST_SAMPLE, records::encode(&now));
        self.engine.commit(&b)?;
        Ok(sums.len())
    }

    /// The tenants that have samples.
    fn sampled_tenants(&self) -> Result<Vec<String>> {
        let mut tenants = Vec::new();
        let mut from = Vec::new();
        loop {
            let page = self.engine.range(
                Tree::UsageHistory,
                Bound::Included(from.as_slice()),
                Bound::Unbounded,
                1,
            )?;
            let Some((k, _)) = page.first() else {
                return Ok(tenants);
            };
            let end = k.iter().position(|b| *b == 0).unwrap_or(k.len());
            tenants.push(String::from_utf8_lossy(&k[..end]).into_owned());
            // The next tenant's keys start after this one's NUL.
            from = k[..end].to_vec();
            from.push(1);
        }
    }

    /// `tenant`'s samples of the last `days` days (today included), oldest
    /// first; days without a sample are absent.
    pub fn usage_history(&self, tenant: &str, days: i64) -> Result<Vec<UsageSample>> {
        let today = self.now_ms().div_euclid(DAY_MS);
        let days = days.clamp(1, HISTORY_DAYS);
        let page = self.engine.range(
            Tree::UsageHistory,
            Bound::Included(key(tenant, today - days + 1).as_slice()),
            Bound::Included(key(tenant, today).as_slice()),
            days as usize,
        )?;
        page.iter()
            .map(|(_, v)| records::decode(v).map_err(Into::into))
            .collect()
    }
}
