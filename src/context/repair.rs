//! Pairing repair (behaviour.md §4, rules 1–7): positional, per assistant
//! message, never one global ID map, because some providers reuse IDs every
//! turn.

use std::collections::{HashMap, HashSet, VecDeque};

use super::model::{Block, Message, Role, ToolResult};

/// The exact text of a synthetic result for a call that got none.
pub const MISSING_RESULT_TEXT: &str = "[Tool result missing — the tool execution was interrupted or failed silently. Do NOT retry this tool call. Analyze what went wrong and try a different approach.]";
/// The error code of a synthetic result.
pub const MISSING_RESULT_CODE: &str = "missing_result";

/// What repair did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Synthetic results added for calls without one.
    pub synthetic_results_injected: u64,
    /// Results that no call claimed, removed.
    pub orphan_results_removed: u64,
    /// Calls dropped: empty IDs and repeats within one assistant message.
    pub duplicate_tool_uses_pruned: u64,
    /// Claimed results moved back next to their call from behind another message.
    pub results_relocated: u64,
    /// IDs of calls that got a synthetic result.
    pub missing_tool_use_ids: Vec<String>,
    /// IDs of removed orphan results.
    pub orphan_tool_result_ids: Vec<String>,
}

impl RepairReport {
    /// True when nothing was changed.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// True when `messages` needs repair: some assistant message with calls is
/// not followed directly by exactly one result per call (in any order), a
/// call ID is empty or repeated within its message, or a result is left
/// over. One pass, no allocation.
pub fn needs_repair(messages: &[Message]) -> bool {
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        if !m.has_calls() {
            if m.has_results() {
                return true; // a result with no call right before it
            }
            i += 1;
            continue;
        }
        // The run of result-carrying messages right after it.
        let mut j = i + 1;
        while j < messages.len() && messages[j].role != Role::Assistant && messages[j].has_results()
        {
            j += 1;
        }
        let run = &messages[i + 1..j];
        let ok = if m.tool_uses().nth(SMALL).is_none() {
            pairs_exactly_small(m, run)
        } else {
            pairs_exactly_large(m, run)
        };
        if !ok {
            return true;
        }
        i = j;
    }
    false
}

/// Calls per message up to which the check compares pairwise (and so
/// allocates nothing); larger messages are checked with a hash map.
const SMALL: usize = 32;

fn pairs_exactly_small(m: &Message, run: &[Message]) -> bool {
    let mut n_calls = 0usize;
    for (k, u) in m.tool_uses().enumerate() {
        if u.id.is_empty() || m.tool_uses().take(k).any(|p| p.id == u.id) {
            return false;
        }
        n_calls += 1;
    }
    let mut n_results = 0usize;
    for r in run.iter().flat_map(Message::tool_results) {
        if !m.tool_uses().any(|u| u.id == r.tool_use_id) {
            return false;
        }
        n_results += 1;
    }
    // Equal counts, and each call answered once.
    n_results == n_calls
        && m.tool_uses().all(|u| {
            run.iter()
                .flat_map(Message::tool_results)
                .filter(|r| r.tool_use_id == u.id)
                .count()
                == 1
        })
}

fn pairs_exactly_large(m: &Message, run: &[Message]) -> bool {
    let mut answers: HashMap<&str, u32> = HashMap::new();
    for u in m.tool_uses() {
        if u.id.is_empty() || answers.insert(u.id.as_str(), 0).is_some() {
            return false;
        }
    }
    for r in run.iter().flat_map(Message::tool_results) {
        match answers.get_mut(r.tool_use_id.as_str()) {
            Some(n) if *n == 0 => *n = 1,
            _ => return false,
        }
    }
    answers.values().all(|&n| n == 1)
}

/// Repairs the pairing. A history that needs no repair comes back as it was.
pub fn repair(messages: Vec<Message>) -> (Vec<Message>, RepairReport) {
    let mut report = RepairReport::default();
    if !needs_repair(&messages) {
        return (messages, report);
    }
    let mut out = Vec::with_capacity(messages.len());
    let mut messages: Vec<Option<Message>> = messages.into_iter().map(Some).collect();
    let mut i = 0;
    while i < messages.len() {
        let Some(mut m) = messages[i].take() else {
            i += 1;
            continue;
        };
        if !m.has_calls() {
            // Results outside any stretch are orphans.
            strip_orphans(&mut m, &mut report);
            if !m.blocks.is_empty() {
                out.push(m);
            }
            i += 1;
            continue;
        }
        // Rule 5: drop empty IDs and repeats within this message.
        let mut seen: HashSet<String> = HashSet::new();
        m.blocks.retain(|b| match b {
            Block::ToolUse(u) if u.id.is_empty() || !seen.insert(u.id.clone()) => {
                report.duplicate_tool_uses_pruned += 1;
                false
            }
            _ => true,
        });
        // Rule 1: the stretch runs to the next assistant message.
        let end = (i + 1..messages.len())
            .find(|&j| {
                messages[j]
                    .as_ref()
                    .is_some_and(|x| x.role == Role::Assistant)
            })
            .unwrap_or(messages.len());
        // Where the directly following result run ends (for relocation).
        let run_end = (i + 1..end)
            .find(|&j| !messages[j].as_ref().is_some_and(Message::has_results))
            .unwrap_or(end);
        // Every result of the stretch, by ID, in order of appearance.
        let mut index: HashMap<String, VecDeque<(usize, usize)>> = HashMap::new();
        for (j, slot) in messages.iter().enumerate().take(end).skip(i + 1) {
            if let Some(msg) = slot {
                for (bi, b) in msg.blocks.iter().enumerate() {
                    if let Block::ToolResult(r) = b {
                        index
                            .entry(r.tool_use_id.clone())
                            .or_default()
                            .push_back((j, bi));
                    }
                }
            }
        }
        // Rules 2 and 3: claim the first unclaimed matching result, in call order.
        let calls: Vec<(String, String)> = m
            .tool_uses()
            .map(|u| (u.id.clone(), u.name.clone()))
            .collect();
        let mut claimed_at: HashSet<(usize, usize)> = HashSet::new();
        let mut results = Vec::with_capacity(calls.len());
        for (id, name) in &calls {
            let claimed = index
                .get_mut(id)
                .and_then(VecDeque::pop_front)
                .map(|(j, bi)| {
                    if j >= run_end {
                        report.results_relocated += 1;
                    }
                    claimed_at.insert((j, bi));
                    let msg = messages[j].as_mut().expect("indexed messages are present");
                    match std::mem::replace(&mut msg.blocks[bi], Block::Text(String::new())) {
                        Block::ToolResult(r) => r,
                        _ => unreachable!("indexed blocks are results"),
                    }
                });
            let r = claimed.unwrap_or_else(|| {
                // Rule 4: a synthetic error result.
                report.synthetic_results_injected += 1;
                report.missing_tool_use_ids.push(id.clone());
                ToolResult {
                    tool_use_id: id.clone(),
                    content: MISSING_RESULT_TEXT.to_owned(),
                    is_error: true,
                    error_code: MISSING_RESULT_CODE.to_owned(),
                    tool_name: name.clone(),
                }
            });
            results.push(Message {
                role: Role::Tool,
                blocks: vec![Block::ToolResult(r)],
            });
        }
        // Drop the placeholders left where claimed results were.
        for (j, slot) in messages.iter_mut().enumerate().take(end).skip(i + 1) {
            if let Some(msg) = slot {
                let mut bi = 0;
                msg.blocks.retain(|_| {
                    let keep = !claimed_at.contains(&(j, bi));
                    bi += 1;
                    keep
                });
            }
        }
        out.push(m);
        out.extend(results);
        // The rest of the stretch: unclaimed results are orphans (rule 6);
        // what else a message says stays where it was.
        for slot in messages.iter_mut().take(end).skip(i + 1) {
            if let Some(mut rest) = slot.take() {
                strip_orphans(&mut rest, &mut report);
                if !rest.blocks.is_empty() {
                    out.push(rest);
                }
            }
        }
        i = end;
    }
    (out, report)
}

fn strip_orphans(m: &mut Message, report: &mut RepairReport) {
    m.blocks.retain(|b| match b {
        Block::ToolResult(r) => {
            report.orphan_results_removed += 1;
            report.orphan_tool_result_ids.push(r.tool_use_id.clone());
            false
        }
        _ => true,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::model::ToolUse;

    fn user(t: &str) -> Message {
        Message {
            role: Role::User,
            blocks: vec![Block::Text(t.into())],
        }
    }
    fn assistant(ids: &[&str]) -> Message {
        Message {
            role: Role::Assistant,
            blocks: ids
                .iter()
                .map(|id| {
                    Block::ToolUse(ToolUse {
                        id: (*id).into(),
                        name: "web_fetch".into(),
                        input_json: "{}".into(),
                    })
                })
                .collect(),
        }
    }
    fn result(id: &str, content: &str) -> Message {
        Message {
            role: Role::Tool,
            blocks: vec![Block::ToolResult(ToolResult {
                tool_use_id: id.into(),
                content: content.into(),
                is_error: false,
                error_code: String::new(),
                tool_name: String::new(),
            })],
        }
    }
    fn ids(ms: &[Message]) -> Vec<String> {
        ms.iter()
            .map(|m| match (m.role, m.blocks.first()) {
                (Role::Assistant, _) => format!(
                    "A[{}]",
                    m.tool_uses()
                        .map(|u| u.id.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                (_, Some(Block::ToolResult(r))) => format!(
                    "R:{}={}",
                    r.tool_use_id,
                    if r.error_code.is_empty() {
                        &r.content
                    } else {
                        "MISSING"
                    }
                ),
                (_, Some(Block::Text(t))) => format!("U:{t}"),
                _ => "?".into(),
            })
            .collect()
    }

    #[test]
    fn an_unchanged_valid_history_comes_back_as_is() {
        let h = vec![
            user("hi"),
            assistant(&["a", "b"]),
            result("b", "2"),
            result("a", "1"),
            user("next"),
        ];
        assert!(!needs_repair(&h));
        let (out, report) = repair(h.clone());
        assert_eq!(out, h, "results in any order need no repair");
        assert!(report.is_empty());
    }

    #[test]
    fn ids_repeated_across_turns_are_legal_the_kimi_case() {
        let h = vec![
            assistant(&["web_fetch:0"]),
            result("web_fetch:0", "first"),
            assistant(&["web_fetch:0"]),
            result("web_fetch:0", "second"),
        ];
        assert!(!needs_repair(&h));
        // With the second result missing, the first is not stolen by the second call.
        let h = vec![
            assistant(&["web_fetch:0"]),
            result("web_fetch:0", "first"),
            assistant(&["web_fetch:0"]),
            user("go on"),
        ];
        let (out, report) = repair(h);
        assert_eq!(
            ids(&out),
            [
                "A[web_fetch:0]",
                "R:web_fetch:0=first",
                "A[web_fetch:0]",
                "R:web_fetch:0=MISSING",
                "U:go on"
            ]
        );
        assert_eq!(report.missing_tool_use_ids, vec!["web_fetch:0"]);
    }

    #[test]
    fn a_dangling_first_call_with_a_later_call_answered() {
        let (out, report) = repair(vec![assistant(&["a", "b"]), result("b", "2")]);
        assert_eq!(ids(&out), ["A[a,b]", "R:a=MISSING", "R:b=2"]);
        assert_eq!(report.synthetic_results_injected, 1);
        let Block::ToolResult(r) = &out[1].blocks[0] else {
            panic!()
        };
        assert_eq!(
            (r.content.as_str(), r.is_error, r.error_code.as_str()),
            (MISSING_RESULT_TEXT, true, "missing_result")
        );
    }

    #[test]
    fn results_behind_an_interposed_user_message_are_relocated() {
        let (out, report) = repair(vec![
            assistant(&["a", "b"]),
            result("a", "1"),
            user("wait"),
            result("b", "2"),
        ]);
        assert_eq!(ids(&out), ["A[a,b]", "R:a=1", "R:b=2", "U:wait"]);
        assert_eq!(report.results_relocated, 1);
    }

    #[test]
    fn a_result_beyond_the_next_assistant_message_is_not_claimed() {
        let (out, report) = repair(vec![
            assistant(&["a"]),
            user("?"),
            assistant(&["b"]),
            result("b", "2"),
            result("a", "1"),
        ]);
        assert_eq!(ids(&out), ["A[a]", "R:a=MISSING", "U:?", "A[b]", "R:b=2"]);
        assert_eq!(report.orphan_tool_result_ids, vec!["a"]);
        assert_eq!(report.synthetic_results_injected, 1);
    }

    #[test]
    fn empty_and_repeated_ids_within_a_message_are_pruned() {
        let (out, report) = repair(vec![
            assistant(&["a", "", "a", "b"]),
            result("a", "1"),
            result("b", "2"),
        ]);
        assert_eq!(ids(&out), ["A[a,b]", "R:a=1", "R:b=2"]);
        assert_eq!(report.duplicate_tool_uses_pruned, 2);
    }

    #[test]
    fn partial_results_and_orphans_before_any_call() {
        let (out, report) = repair(vec![
            result("x", "stray"),
            user("hi"),
            assistant(&["a", "b", "c"]),
            result("c", "3"),
            result("a", "1"),
        ]);
        assert_eq!(
            ids(&out),
            ["U:hi", "A[a,b,c]", "R:a=1", "R:b=MISSING", "R:c=3"]
        );
        assert_eq!(
            (
                report.orphan_results_removed,
                report.synthetic_results_injected
            ),
            (1, 1)
        );
    }

    #[test]
    fn duplicate_results_for_one_call_leave_an_orphan() {
        let (out, report) = repair(vec![
            assistant(&["a"]),
            result("a", "1"),
            result("a", "again"),
        ]);
        assert_eq!(ids(&out), ["A[a]", "R:a=1"]);
        assert_eq!(report.orphan_tool_result_ids, vec!["a"]);
    }

    #[test]
    fn a_message_with_thousands_of_calls_is_checked_and_repaired() {
        let n = 20_000;
        let names: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut h = vec![assistant(&refs)];
        for id in refs.iter().rev() {
            h.push(result(id, "ok"));
        }
        assert!(!needs_repair(&h));
        h.remove(1); // one call loses its result
        let (out, report) = repair(h);
        assert_eq!(out.len(), n + 1);
        assert_eq!(report.synthetic_results_injected, 1);
    }

    #[test]
    fn repair_is_idempotent() {
        let (once, _) = repair(vec![
            assistant(&["a", "b"]),
            user("x"),
            result("b", "2"),
            result("z", "?"),
        ]);
        assert!(!needs_repair(&once));
        let (twice, report) = repair(once.clone());
        assert_eq!(twice, once);
        assert!(report.is_empty());
    }
}
