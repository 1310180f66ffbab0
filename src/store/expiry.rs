//! What the reaper asks of the store: the expiry index read in key order
//! (time first), each due entry deleted through [`Store::delete`], held
//! sessions skipped.
//!
//! Entries are `expires_ms(be) kind id`: a payload (`P`, retention or the
//! session's TTL, whichever is earlier), a session (`S`, its TTL), or a
//! closed session whose payloads are to go (`C`, `delete_on_close`). An
//! entry that no longer matches its record is dropped.

use std::ops::Bound;

use super::delete::{EXPIRY_CLOSE, Request, Target};
use super::engine::Tree;
use super::records::{ReceiptRecord, keys};
use super::{Result, Store, StoreError};
use crate::clock::Millis;
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
}

impl Store {
    /// Deletes up to `max` due entries (expiry at or before `now`) after
    /// `after`, in expiry order.
    pub fn reap_due(&self, now: Millis, after: Option<&[u8]>, max: usize) -> Result<ReapStep> {
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
        for (key, _) in entries {
            self.reap_entry(&key, &mut step)?;
            step.cursor = Some(key);
        }
        Ok(step)
    }

    fn reap_entry(&self, key: &[u8], step: &mut ReapStep) -> Result<()> {
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

/// Splits an expiry key into its time, kind and ID.
fn parse_key(key: &[u8]) -> Option<(Millis, u8, &str)> {
    let (time, rest) = key.split_first_chunk::<8>()?;
    let (&kind, id) = rest.split_first()?;
    let when = Millis::try_from(u64::from_be_bytes(*time)).ok()?;
    Some((when, kind, std::str::from_utf8(id).ok()?))
}
