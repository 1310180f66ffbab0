//! The per-turn offload decision (behaviour.md §1), as a pure function.
//!
//! 1. Early exit: when the turn's total is below the per-call threshold
//!    (the smallest that applies to any result), everything stays inline.
//! 2. Per-call: each result at or above its threshold is offloaded.
//! 3. Aggregate: the running total counts inline results whole and offloaded
//!    ones as their notices. While it is at or above the aggregate
//!    threshold, the largest inline result (the earliest on ties) is
//!    offloaded and its notice takes its place.

/// One result's estimate and the per-call threshold that applies to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    /// Estimated tokens of the original.
    pub tokens: u64,
    /// Its per-call threshold.
    pub threshold: u64,
}

/// What happens to one result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Stays in the context.
    Inline,
    /// Offloaded by the per-call rule.
    PerCall,
    /// Offloaded by the aggregate rule.
    Aggregate,
}

impl Disposition {
    /// True unless inline.
    pub fn offloaded(self) -> bool {
        self != Disposition::Inline
    }
}

/// Decides every result of a turn, in input order. `notice_tokens(i)` gives
/// the tokens of result `i`'s notice; it is asked only for offloaded results.
pub fn decide(
    items: &[Item],
    aggregate: u64,
    mut notice_tokens: impl FnMut(usize) -> u64,
) -> Vec<Disposition> {
    let mut out = vec![Disposition::Inline; items.len()];
    let total: u64 = items.iter().map(|i| i.tokens).sum();
    let early = items.iter().map(|i| i.threshold).min().unwrap_or(u64::MAX);
    if total < early {
        return out;
    }
    let mut running = 0u64;
    for (i, item) in items.iter().enumerate() {
        if item.tokens >= item.threshold {
            out[i] = Disposition::PerCall;
            running += notice_tokens(i);
        } else {
            running += item.tokens;
        }
    }
    while running >= aggregate {
        let largest = (0..items.len())
            .filter(|&i| out[i] == Disposition::Inline)
            .max_by(|&a, &b| items[a].tokens.cmp(&items[b].tokens).then(b.cmp(&a)));
        let Some(i) = largest else { break };
        out[i] = Disposition::Aggregate;
        running = running - items[i].tokens + notice_tokens(i);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::Disposition::{Aggregate as A, Inline as I, PerCall as P};
    use super::*;

    fn items(tokens: &[u64]) -> Vec<Item> {
        tokens
            .iter()
            .map(|&t| Item {
                tokens: t,
                threshold: 6000,
            })
            .collect()
    }

    /// The dispositions of results of these sizes (threshold 6000), under
    /// an aggregate of 10 000, with notices of 300 tokens.
    fn decided(tokens: &[u64]) -> Vec<Disposition> {
        decide(&items(tokens), 10_000, |_| 300)
    }

    #[test]
    fn all_under_threshold_stays_inline() {
        assert_eq!(decided(&[100, 2000, 3000]), vec![I, I, I]);
    }

    #[test]
    fn early_exit_asks_for_no_notice() {
        let mut asked = 0;
        decide(&items(&[10, 20]), 10_000, |_| {
            asked += 1;
            300
        });
        assert_eq!(asked, 0);
    }

    #[test]
    fn one_giant_is_offloaded_per_call() {
        assert_eq!(decided(&[200, 50_000, 300]), vec![I, P, I]);
    }

    #[test]
    fn four_medium_results_pass_per_call_but_trip_the_aggregate() {
        // 4 × 4000 = 16 000 ≥ 10 000: offload the largest until under.
        let d = decided(&[4000, 4100, 3900, 4000]);
        assert_eq!(d, vec![A, A, I, I]);
        // After: 300 + 300 + 3900 + 4000 = 8500 < 10 000.
    }

    #[test]
    fn ties_offload_the_earliest_first() {
        assert_eq!(decided(&[4000, 4000, 4000]), vec![A, I, I]);
    }

    #[test]
    fn exactly_at_a_threshold_counts_as_over() {
        assert_eq!(decided(&[6000]), vec![P]);
        assert_eq!(decided(&[5000, 5000]), vec![A, I]);
    }

    #[test]
    fn notices_count_toward_the_running_total() {
        // Per-call offloads leave 3 × 3000 of notices; with 1500 inline the
        // total is 10 500, so the inline result goes too.
        let d = decide(&items(&[7000, 7000, 7000, 1500]), 10_000, |_| 3000);
        assert_eq!(d, vec![P, P, P, A]);
    }

    #[test]
    fn stops_when_nothing_inline_remains() {
        let d = decide(&items(&[7000, 7000]), 100, |_| 3000);
        assert_eq!(d, vec![P, P]);
    }

    #[test]
    fn per_tool_thresholds_apply_per_result() {
        let v = vec![
            Item {
                tokens: 3000,
                threshold: 2000,
            },
            Item {
                tokens: 3000,
                threshold: 6000,
            },
        ];
        assert_eq!(decide(&v, 10_000, |_| 100), vec![P, I]);
    }
}
