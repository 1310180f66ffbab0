//! CompactHistory (behaviour.md §4), in order: repair, per-result and
//! per-turn budgets, then microcompaction by age. Every lossy step first
//! archives the original (through [`Archive`]) and leaves a `<<ccr:KEY>>`
//! marker, KEY being the first 16 hex digits of the original's SHA-256.
//! Markers carry over between levels and are never duplicated, and a second
//! run over its own output archives nothing new.

use sha2::{Digest, Sha256};

use super::model::{Block, Message, Role};
use super::repair::{self, RepairReport};
use crate::inspect::detect;
use crate::text::cut_lines;
use crate::text::{count_of, group};

/// Settings of one compaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactSettings {
    /// Most chars one result may keep (default 20 000).
    pub per_result_chars: u64,
    /// Most chars the results of one turn may keep (default 200 000).
    pub per_turn_chars: u64,
    /// Age at which old results are truncated (default 2).
    pub truncate_age: u32,
    /// Age at which old results are cleared to one line (default 4).
    pub clear_age: u32,
    /// Results under this many chars are never touched (default 3000).
    pub min_chars: u64,
    /// Tools whose name contains any of these are exempt (default write,
    /// edit, exec, run, shell, bash).
    pub exempt_tools: Vec<String>,
}

impl Default for CompactSettings {
    fn default() -> Self {
        Self {
            per_result_chars: 20_000,
            per_turn_chars: 200_000,
            truncate_age: 2,
            clear_age: 4,
            min_chars: 3000,
            exempt_tools: ["write", "edit", "exec", "run", "shell", "bash"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// Facts about an archived original.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveInfo {
    /// Recall key.
    pub key: String,
    /// Lines of the original.
    pub lines: u64,
    /// Chars of the original.
    pub chars: u64,
    /// What the original looks like (`JSON array`, `Go source`, …).
    pub kind: String,
}

/// Where originals are kept.
pub trait Archive {
    /// The error of the archive.
    type Error;
    /// The archived original with this key, if any.
    fn find(&mut self, key: &str) -> Result<Option<ArchiveInfo>, Self::Error>;
    /// Archives `content` (whose key is `key`) and describes it.
    fn store(
        &mut self,
        key: &str,
        content: &str,
        tool_name: &str,
    ) -> Result<ArchiveInfo, Self::Error>;
}

/// What compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Results truncated by age.
    pub truncated: u64,
    /// Results cleared to one line by age.
    pub summarized: u64,
    /// Results reduced by the per-result or per-turn budget.
    pub budget_offloaded: u64,
    /// Chars removed from the history.
    pub chars_saved: u64,
    /// The key of every archived original that a marker in the returned
    /// history stands for, once each, in history order: a repeat
    /// compaction reports the same keys again.
    pub archived_keys: Vec<String>,
    /// The keys of the originals this call stored (empty when nothing new
    /// was archived).
    pub stored_keys: Vec<String>,
}

/// The recall key of a text: the first 16 hex digits of its SHA-256.
pub fn recall_key(content: &str) -> String {
    hex::encode(&Sha256::digest(content.as_bytes())[..8])
}

/// The marker that lets the model recall an original.
pub fn marker(key: &str) -> String {
    format!("<<ccr:{key}>>")
}

/// The one line an old result is cleared to: what it was, and how to get
/// it back.
pub fn cleared_stub(info: &ArchiveInfo) -> String {
    format!(
        "[Old tool result cleared — {}, {}, {}; Recall with this marker returns it whole] {}",
        count_of(info.lines, "line"),
        count_of(info.chars, "char"),
        info.kind,
        marker(&info.key)
    )
}

/// Finds a recall key in compacted text.
pub fn find_marker(content: &str) -> Option<&str> {
    let start = content.find("<<ccr:")? + 6;
    let key = content.get(start..start + 16)?;
    (content.get(start + 16..start + 18) == Some(">>")
        && key.bytes().all(|b| b.is_ascii_hexdigit()))
    .then_some(key)
}

/// The recall key of text this module produced (a budget preview, a
/// truncation or a cleared stub), and only of such text. A tool result that
/// merely quotes a marker is an original in its own right and is archived
/// under its own key.
pub fn stub_key(content: &str) -> Option<&str> {
    let key = find_marker(content)?;
    if content.matches("<<ccr:").count() != 1 {
        return None;
    }
    let ours = (content.starts_with("[Old tool result cleared — ") && content.ends_with(">>"))
        || (content.contains(" chars omitted from old tool result ...]\n")
            && content.ends_with(">>"))
        || content.contains(" chars omitted — the whole result is archived; recall it with <<ccr:");
    ours.then_some(key)
}

fn chars(s: &str) -> u64 {
    bytecount::num_chars(s.as_bytes()) as u64
}

/// Runs the three steps. `current_turn` counts assistant messages (1-based).
pub fn compact<A: Archive>(
    messages: Vec<Message>,
    current_turn: u32,
    settings: &CompactSettings,
    archive: &mut A,
) -> Result<(Vec<Message>, RepairReport, CompactReport), A::Error> {
    let (mut messages, repair_report) = repair::repair(messages);
    let mut report = CompactReport::default();
    budgets(&mut messages, settings, archive, &mut report)?;
    microcompact(&mut messages, current_turn, settings, archive, &mut report)?;
    report.archived_keys = archived_keys(&messages, archive)?;
    Ok((messages, repair_report, report))
}

/// The keys of the archived originals behind the markers of `messages`
/// (only this module's own stubs, and only keys the archive holds), once
/// each, in order.
fn archived_keys<A: Archive>(
    messages: &[Message],
    archive: &mut A,
) -> Result<Vec<String>, A::Error> {
    let mut seen = std::collections::HashSet::new();
    let mut keys = Vec::new();
    for m in messages {
        for b in &m.blocks {
            let Block::ToolResult(r) = b else { continue };
            let Some(key) = stub_key(&r.content) else {
                continue;
            };
            if seen.insert(key) && archive.find(key)?.is_some() {
                keys.push(key.to_owned());
            }
        }
    }
    Ok(keys)
}

/// Positions of results: (message index, block index, turn, tool name).
fn result_positions(messages: &[Message]) -> Vec<(usize, usize, u32, String)> {
    let mut turn = 0u32;
    let mut names: Vec<(String, String)> = Vec::new();
    let mut out = Vec::new();
    for (mi, m) in messages.iter().enumerate() {
        if m.role == Role::Assistant {
            turn += 1;
            names = m
                .tool_uses()
                .map(|u| (u.id.clone(), u.name.clone()))
                .collect();
        }
        for (bi, b) in m.blocks.iter().enumerate() {
            if let Block::ToolResult(r) = b {
                let name = if r.tool_name.is_empty() {
                    names
                        .iter()
                        .find(|(id, _)| *id == r.tool_use_id)
                        .map(|(_, n)| n.clone())
                        .unwrap_or_default()
                } else {
                    r.tool_name.clone()
                };
                out.push((mi, bi, turn, name));
            }
        }
    }
    out
}

fn content_mut(messages: &mut [Message], mi: usize, bi: usize) -> &mut String {
    match &mut messages[mi].blocks[bi] {
        Block::ToolResult(r) => &mut r.content,
        _ => unreachable!("positions point at results"),
    }
}

/// Archives `content` unless it is already compacted; returns the original's facts.
fn original<A: Archive>(
    content: &str,
    tool: &str,
    archive: &mut A,
    report: &mut CompactReport,
) -> Result<ArchiveInfo, A::Error> {
    if let Some(key) = stub_key(content)
        && let Some(info) = archive.find(key)?
    {
        return Ok(info);
    }
    let key = recall_key(content);
    if let Some(info) = archive.find(&key)? {
        return Ok(info);
    }
    let info = archive.store(&key, content, tool)?;
    report.stored_keys.push(key);
    Ok(info)
}

/// The `lines`-style reduction that budgets apply.
fn reduce_to_preview(content: &str, key: &str) -> String {
    let body = strip_marker(content);
    match cut_lines(&body, 4000, 1000) {
        Some(c) => format!(
            "{}\n[... {} chars omitted — the whole result is archived; recall it with {}]\n{}",
            c.head,
            group(c.omitted),
            marker(key),
            c.tail
        ),
        None => content.to_owned(),
    }
}

fn strip_marker(content: &str) -> String {
    match stub_key(content) {
        Some(key) => content.replace(&marker(key), ""),
        None => content.to_owned(),
    }
}

fn budgets<A: Archive>(
    messages: &mut [Message],
    s: &CompactSettings,
    archive: &mut A,
    report: &mut CompactReport,
) -> Result<(), A::Error> {
    let positions = result_positions(messages);
    let mut turn_start = 0;
    while turn_start < positions.len() {
        let turn = positions[turn_start].2;
        let turn_end = positions[turn_start..]
            .iter()
            .position(|p| p.2 != turn)
            .map_or(positions.len(), |k| turn_start + k);
        let mut reduced = vec![false; turn_end - turn_start];
        let mut sizes: Vec<u64> = positions[turn_start..turn_end]
            .iter()
            .map(|(mi, bi, _, _)| chars(content_mut(messages, *mi, *bi)))
            .collect();
        loop {
            let total: u64 = sizes.iter().sum();
            // Over the per-result limit first, then the largest while the turn is over.
            let pick = (0..sizes.len())
                .filter(|&k| !reduced[k] && sizes[k] > s.per_result_chars)
                .max_by_key(|&k| sizes[k])
                .or_else(|| {
                    (total > s.per_turn_chars)
                        .then(|| {
                            (0..sizes.len())
                                .filter(|&k| !reduced[k])
                                .max_by_key(|&k| sizes[k])
                        })
                        .flatten()
                });
            let Some(k) = pick else { break };
            reduced[k] = true;
            let (mi, bi, _, tool) = &positions[turn_start + k];
            let content = content_mut(messages, *mi, *bi).clone();
            if stub_key(&content).is_some() && sizes[k] <= 5200 {
                continue; // already a budget preview
            }
            let info = original(&content, tool, archive, report)?;
            let new = reduce_to_preview(&content, &info.key);
            if chars(&new) < sizes[k] {
                report.budget_offloaded += 1;
                report.chars_saved += sizes[k] - chars(&new);
                sizes[k] = chars(&new);
                *content_mut(messages, *mi, *bi) = new;
            }
        }
        turn_start = turn_end;
    }
    Ok(())
}

fn microcompact<A: Archive>(
    messages: &mut [Message],
    current_turn: u32,
    s: &CompactSettings,
    archive: &mut A,
    report: &mut CompactReport,
) -> Result<(), A::Error> {
    for (mi, bi, turn, tool) in result_positions(messages) {
        let age = current_turn.saturating_sub(turn);
        if age < s.truncate_age
            || s.exempt_tools
                .iter()
                .any(|e| !e.is_empty() && tool.to_ascii_lowercase().contains(e.as_str()))
        {
            continue;
        }
        let content = content_mut(messages, mi, bi).clone();
        let existing = stub_key(&content).map(str::to_owned);
        // The size rule applies to the original, which a marker stands for.
        let original_chars = match &existing {
            Some(key) => archive.find(key)?.map_or(chars(&content), |i| i.chars),
            None => chars(&content),
        };
        if original_chars < s.min_chars {
            continue;
        }
        let current = chars(&content);
        if age >= s.clear_age {
            if content.starts_with("[Old tool result cleared") {
                continue;
            }
            let info = original(&content, &tool, archive, report)?;
            let stub = cleared_stub(&info);
            report.summarized += 1;
            report.chars_saved += current.saturating_sub(chars(&stub));
            *content_mut(messages, mi, bi) = stub;
        } else {
            if content.contains("chars omitted from old tool result") {
                continue;
            }
            let body = strip_marker(&content);
            let Some(c) = cut_lines(&body, 2000, 500) else {
                continue;
            };
            let info = original(&content, &tool, archive, report)?;
            let new = format!(
                "{}\n[... {} chars omitted from old tool result ...]\n{}\nRecall returns the whole result: {}",
                c.head,
                group(c.omitted),
                c.tail,
                marker(&info.key)
            );
            report.truncated += 1;
            report.chars_saved += current.saturating_sub(chars(&new));
            *content_mut(messages, mi, bi) = new;
        }
    }
    Ok(())
}

/// Describes a text for [`ArchiveInfo`].
pub fn describe(key: &str, content: &str) -> ArchiveInfo {
    let newlines = memchr::memchr_iter(b'\n', content.as_bytes()).count() as u64;
    let lines = match content.as_bytes().last() {
        None => 0,
        Some(b'\n') => newlines,
        Some(_) => newlines + 1,
    };
    ArchiveInfo {
        key: key.to_owned(),
        lines,
        chars: chars(content),
        kind: detect(content.as_bytes(), "").to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::model::{ToolResult, ToolUse};
    use std::collections::HashMap;

    #[derive(Default)]
    struct MemArchive(HashMap<String, String>);

    impl Archive for MemArchive {
        type Error = std::convert::Infallible;
        fn find(&mut self, key: &str) -> Result<Option<ArchiveInfo>, Self::Error> {
            Ok(self.0.get(key).map(|c| describe(key, c)))
        }
        fn store(&mut self, key: &str, content: &str, _: &str) -> Result<ArchiveInfo, Self::Error> {
            self.0.insert(key.to_owned(), content.to_owned());
            Ok(describe(key, content))
        }
    }

    fn turn(id: &str, tool: &str, content: String) -> Vec<Message> {
        vec![
            Message {
                role: Role::Assistant,
                blocks: vec![Block::ToolUse(ToolUse {
                    id: id.into(),
                    name: tool.into(),
                    input_json: "{}".into(),
                })],
            },
            Message {
                role: Role::Tool,
                blocks: vec![Block::ToolResult(ToolResult {
                    tool_use_id: id.into(),
                    content,
                    is_error: false,
                    error_code: String::new(),
                    tool_name: String::new(),
                })],
            },
        ]
    }

    fn content(m: &[Message], i: usize) -> &str {
        match &m[i].blocks[0] {
            Block::ToolResult(r) => &r.content,
            _ => panic!("not a result"),
        }
    }

    fn go_source(lines: usize) -> String {
        let mut s = String::from("package main\n\nimport \"fmt\"\n\n");
        for i in 0..lines {
            s.push_str(&format!("func f{i}() {{ x := {i}; fmt.Println(x) }}\n"));
        }
        s
    }

    #[test]
    fn clears_truncates_and_leaves_by_age_size_and_tool() {
        let big = || go_source(200);
        let mut h = Vec::new();
        h.extend(turn("t1", "read_file", big())); // age 4: cleared
        h.extend(turn("t2", "read_file", big().replace("main", "util"))); // age 3: truncated
        h.extend(turn("t3", "run_tests", big().replace("main", "other"))); // exempt
        h.extend(turn("t4", "read_file", "small".into())); // under 3000
        h.extend(turn("t5", "read_file", big().replace("main", "fresh"))); // age 1: kept
        let mut archive = MemArchive::default();
        let (out, _, report) = compact(h, 5, &CompactSettings::default(), &mut archive).unwrap();
        let cleared = content(&out, 1);
        assert!(
            cleared.starts_with("[Old tool result cleared — 204 lines, "),
            "{cleared}"
        );
        // The stub says how to get the result back, not only that it went.
        assert!(
            cleared.contains(", Go source; Recall with this marker returns it whole] <<ccr:"),
            "{cleared}"
        );
        let truncated = content(&out, 3);
        assert!(
            truncated.contains("chars omitted from old tool result ...]"),
            "{truncated}"
        );
        let key = find_marker(truncated).unwrap();
        assert!(
            truncated.ends_with(&format!("\nRecall returns the whole result: <<ccr:{key}>>")),
            "{truncated}"
        );
        assert_eq!(truncated.matches("<<ccr:").count(), 1);
        assert_eq!(content(&out, 5), big().replace("main", "other"));
        assert_eq!(content(&out, 7), "small");
        assert_eq!(content(&out, 9), big().replace("main", "fresh"));
        assert_eq!((report.summarized, report.truncated), (1, 1));
        // Every marker recalls the exact original.
        let key = find_marker(cleared).unwrap();
        assert_eq!(archive.0[key], big());
        let key = find_marker(truncated).unwrap();
        assert_eq!(archive.0[key], big().replace("main", "util"));
    }

    #[test]
    fn a_second_run_stores_nothing_and_changes_nothing() {
        let mut h = Vec::new();
        for i in 0..6 {
            h.extend(turn(&format!("t{i}"), "read_file", go_source(150 + i)));
        }
        let mut archive = MemArchive::default();
        let s = CompactSettings::default();
        let (once, _, first) = compact(h, 6, &s, &mut archive).unwrap();
        assert!(!first.stored_keys.is_empty());
        let mut stored = first.stored_keys.clone();
        stored.sort();
        let mut archived = first.archived_keys.clone();
        archived.sort();
        assert_eq!(archived, stored, "a first run stores every key it reports");
        let (twice, _, second) = compact(once.clone(), 6, &s, &mut archive).unwrap();
        assert_eq!(twice, once);
        assert_eq!(
            second,
            CompactReport {
                archived_keys: first.archived_keys.clone(),
                ..CompactReport::default()
            },
            "nothing new is stored, and the same archives stand behind the markers"
        );
    }

    #[test]
    fn markers_carry_over_from_truncation_to_clearing() {
        let h = turn("t1", "read_file", go_source(300));
        let mut archive = MemArchive::default();
        let s = CompactSettings::default();
        let (at2, _, r2) = compact(h, 3, &s, &mut archive).unwrap();
        let key = find_marker(content(&at2, 1)).unwrap().to_owned();
        let (at4, _, r4) = compact(at2, 5, &s, &mut archive).unwrap();
        assert_eq!(r2.stored_keys, vec![key.clone()]);
        assert!(r4.stored_keys.is_empty(), "the original was archived once");
        assert_eq!(
            r4.archived_keys,
            vec![key.clone()],
            "and its key is reported"
        );
        let stub = content(&at4, 1);
        assert_eq!(find_marker(stub), Some(key.as_str()));
        assert_eq!(stub.matches("<<ccr:").count(), 1);
        assert!(stub.contains("304 lines"), "{stub}");
    }

    #[test]
    fn budgets_reduce_oversized_results_and_the_largest_first() {
        // Per-result: 30 000 chars > 20 000.
        let mut h = turn("a", "search", "x\n".repeat(15_000));
        let mut archive = MemArchive::default();
        let (out, _, report) =
            compact(h.clone(), 1, &CompactSettings::default(), &mut archive).unwrap();
        assert_eq!(report.budget_offloaded, 1);
        assert!(content(&out, 1).contains("the whole result is archived; recall it with <<ccr:"));
        // Per-turn: three results of 15 000 over a 40 000 turn budget.
        h = vec![Message {
            role: Role::Assistant,
            blocks: ["a", "b", "c"]
                .iter()
                .map(|id| {
                    Block::ToolUse(ToolUse {
                        id: (*id).into(),
                        name: "search".into(),
                        input_json: "{}".into(),
                    })
                })
                .collect(),
        }];
        for (id, n) in [("a", 7000), ("b", 7600), ("c", 7300)] {
            h.extend(turn(id, "search", "y\n".repeat(n)).into_iter().skip(1));
        }
        let s = CompactSettings {
            per_turn_chars: 40_000,
            ..Default::default()
        };
        let (out, _, report) = compact(h, 1, &s, &mut archive).unwrap();
        assert_eq!(report.budget_offloaded, 1);
        assert!(
            content(&out, 2).contains("<<ccr:"),
            "the largest (b) was reduced"
        );
        assert!(!content(&out, 1).contains("<<ccr:"));
    }

    #[test]
    fn a_result_that_quotes_a_marker_is_archived_under_its_own_key() {
        let mut archive = MemArchive::default();
        let other = "unrelated original".to_owned();
        let other_key = recall_key(&other);
        archive.0.insert(other_key.clone(), other);
        let quoting = format!(
            "{}\nlog says: [Old tool result cleared — 3 lines, 9 chars, text] <<ccr:{other_key}>>\n",
            go_source(200)
        );
        let (out, _, report) = compact(
            turn("t1", "read_file", quoting.clone()),
            5,
            &CompactSettings::default(),
            &mut archive,
        )
        .unwrap();
        let stub = content(&out, 1);
        let key = find_marker(stub).unwrap();
        assert_ne!(key, other_key, "the quoted marker is not trusted");
        assert_eq!(
            archive.0[key], quoting,
            "the quoting result itself is archived"
        );
        assert_eq!(report.archived_keys, vec![key.to_owned()]);
        assert_eq!(report.stored_keys, vec![key.to_owned()]);
    }

    #[test]
    fn markers_are_found_only_in_their_exact_form() {
        assert_eq!(
            find_marker("x <<ccr:0123456789abcdef>> y"),
            Some("0123456789abcdef")
        );
        assert_eq!(find_marker("<<ccr:0123>>"), None);
        assert_eq!(find_marker("<<ccr:zzzzzzzzzzzzzzzz>>"), None);
        assert_eq!(recall_key("hello").len(), 16);
    }
}
