//! What the reaper asks of the store: the expiry index read in key order
//! (time first), each due entry deleted through [`Store::delete`], held
//! sessions skipped.
//!
//! Entries are `expires_ms(be) kind id`: a payload (`P`, retention or the
//! session's TTL, whichever is earlier), a session (`S`, its TTL), or a
//! closed session whose payloads are to go (`C`, `delete_on_close`). An
//! entry that no longer matches its record is dropped.

use std::ops::{Bound, ControlFlow};
use std::time::Duration;

use super::delete::{EXPIRY_CLOSE, Request, Target};
use super::engine::{Batch, Lease, Tree};
use super::records::{self, ReceiptRecord, SessionRecord, keys};
use super::{Result, Store, StoreError};
use crate::clock::{self, Millis};
use crate::ids::{PayloadId, SessionId};

/// The principal deletions by the reaper are recorded under.
pub const REAPER: &str = "reaper";

/// What one step of reaping did.
#[derive(Debug, Default)]
pub struct ReapStep {
    /// Receipts of what was deleted.
    pub receipts: Vec<ReceiptRecord>,
    /// Due entries skipped because a legal hold stands.
    pub held: u64,
    /// Due entries whose deletion failed (logged; retried on a later pass).
    pub failed: u64,
    /// The last entry looked at: where the next step resumes.
    pub cursor: Option<Vec<u8>>,
    /// Whether more due entries may follow the cursor.
    pub more: bool,
    /// How far behind its due time the oldest entry looked at was (zero
    /// when nothing was due).
    pub lag_ms: u64,
}

impl Store {
    /// Deletes up to `max` due entries (expiry at or before `now`) after
    /// `after`, in expiry order.
    pub fn reap_due(
        &self,
        lease: &Lease,
        now: Millis,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<ReapStep> {
        let end = keys::expiry(now.saturating_add(1), 0, "");
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let entries =
            self.engine
                .range(Tree::Expiry, start, Bound::Excluded(end.as_slice()), max)?;
        let mut step = ReapStep {
            more: entries.len() == max,
            cursor: after.map(<[u8]>::to_vec),
            ..Default::default()
        };
        if let Some((when, _, _)) = entries.first().and_then(|(k, _)| parse_key(k)) {
            step.lag_ms = now.saturating_sub(when).max(0) as u64;
        }
        for (key, _) in entries {
            self.reap_entry(lease, &key, &mut step)?;
            step.cursor = Some(key);
        }
        Ok(step)
    }

    fn reap_entry(&self, lease: &Lease, key: &[u8], step: &mut ReapStep) -> Result<()> {
        let Some((when, kind, id)) = parse_key(key) else {
            tracing::error!("dropping a malformed expiry entry");
            return Ok(self.engine.delete(Tree::Expiry, key)?);
        };
        let (target, reason) = match kind {
            keys::EXPIRY_PAYLOAD => {
                let Ok(id) = PayloadId::parse(id) else {
                    return Ok(self.engine.delete(Tree::Expiry, key)?);
                };
                match self.payload_opt(&id)? {
                    Some(p) if p.expires_ms == when => {
                        if self.session(&p.session_id)?.legal_hold {
                            step.held += 1;
                            return Ok(());
                        }
                    }
                    _ => return Ok(self.engine.delete(Tree::Expiry, key)?),
                }
                (
                    Target::Payload(id),
                    "expired: the payload reached its retention or its session's TTL",
                )
            }
            keys::EXPIRY_SESSION | EXPIRY_CLOSE => {
                let Ok(id) = SessionId::parse(id) else {
                    return Ok(self.engine.delete(Tree::Expiry, key)?);
                };
                let current = match self.session_opt(&id)? {
                    Some(s) if kind == keys::EXPIRY_SESSION && s.expires_ms == when => s,
                    Some(s) if kind == EXPIRY_CLOSE && s.closed_ms == Some(when) => s,
                    _ => return Ok(self.engine.delete(Tree::Expiry, key)?),
                };
                if current.legal_hold {
                    step.held += 1;
                    return Ok(());
                }
                if kind == keys::EXPIRY_SESSION {
                    (Target::Session(id), "expired: the session reached its TTL")
                } else {
                    (
                        Target::SessionContents(id),
                        "session closed with delete_on_close",
                    )
                }
            }
            _ => return Ok(self.engine.delete(Tree::Expiry, key)?),
        };
        match self.delete(&Request {
            target,
            requested_by: REAPER,
            reason,
            fence: Some(lease),
        }) {
            Ok(r) => step.receipts.push(r),
            // A derived payload in a held session holds this one back.
            Err(StoreError::LegalHold { .. }) => step.held += 1,
            // Deleted meanwhile by someone else.
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => {
                tracing::error!(error = %e, "the reaper could not delete an expired entry; it will retry");
                step.failed += 1;
            }
        }
        Ok(())
    }
}

impl Store {
    /// Brings a tenant's sessions and payloads in line with shorter
    /// lifetimes after its policy changed: whatever now expires earlier
    /// gets the earlier time (record and expiry entry), nothing is
    /// extended. `lifetimes` gives a session's effective (retention,
    /// session TTL). Returns how many sessions and payloads changed.
    pub fn shorten_lifetimes(
        &self,
        tenant: &str,
        lifetimes: &dyn Fn(&SessionRecord) -> (Duration, Duration),
    ) -> Result<(u64, u64)> {
        let (mut sessions, mut payloads) = (0, 0);
        let prefix = keys::tenant_prefix(tenant);
        self.each_tenant_session(&prefix, None, |_, id| {
            let _guard = self.lock(&id)?;
            let Some(mut s) = self.session_opt(&id)? else {
                return Ok(ControlFlow::<()>::Continue(()));
            };
            let (retention, ttl) = lifetimes(&s);
            let mut b = Batch::new();
            let session_expires = clock::add(s.created_ms, ttl).min(s.expires_ms);
            let id = s.id.as_str();
            if shorten(
                &mut b,
                keys::EXPIRY_SESSION,
                id,
                &mut s.expires_ms,
                session_expires,
            ) {
                b.put(Tree::Sessions, id, records::encode(&s));
                sessions += 1;
            }
            for mut p in self.session_payloads(&s.id)? {
                let expires = clock::add(p.created_ms, retention).min(session_expires);
                let id = p.id.as_str();
                if shorten(&mut b, keys::EXPIRY_PAYLOAD, id, &mut p.expires_ms, expires) {
                    b.put(Tree::Payloads, id, records::encode(&p));
                    payloads += 1;
                }
            }
            if !b.is_empty() {
                self.engine.commit(&b)?;
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Ok((sessions, payloads))
    }
}

/// Moves `id`'s (of `kind`) expiry, and its expiry entry, to `new` when
/// that is earlier than `expires`; true when it moved.
fn shorten(b: &mut Batch, kind: u8, id: &str, expires: &mut Millis, new: Millis) -> bool {
    if new >= *expires {
        return false;
    }
    b.delete(Tree::Expiry, keys::expiry(*expires, kind, id))
        .put(Tree::Expiry, keys::expiry(new, kind, id), []);
    *expires = new;
    true
}

/// Splits an expiry key into its time, kind and ID.
fn parse_key(key: &[u8]) -> Option<(Millis, u8, &str)> {
    let (time, rest) = key.split_first_chunk::<8>()?;
    let (&kind, id) = rest.split_first()?;
    let when = Millis::try_from(u64::from_be_bytes(*time)).ok()?;
    Some((when, kind, std::str::from_utf8(id).ok()?))
}
