//! History JSON through the adapters, repair and compaction: import then
//! export then import gives the same messages; repair leaves nothing to
//! repair and is idempotent; compaction keeps the history well-formed.

use std::collections::HashMap;

use spillway::context::{
    self, Archive, ArchiveInfo, Block, CompactSettings, Format, History, Message,
};

struct MemArchive(HashMap<String, String>);

impl Archive for MemArchive {
    type Error = std::convert::Infallible;
    fn find(&mut self, key: &str) -> Result<Option<ArchiveInfo>, Self::Error> {
        Ok(self.0.get(key).map(|c| context::describe(key, c)))
    }
    fn store(&mut self, key: &str, content: &str, _: &str) -> Result<ArchiveInfo, Self::Error> {
        self.0.insert(key.to_owned(), content.to_owned());
        Ok(context::describe(key, content))
    }
}

/// Every tool call and result, in order, as comparable text.
fn calls_and_results(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .flat_map(|m| &m.blocks)
        .filter_map(|b| match b {
            Block::ToolUse(u) => Some(format!("use {} {} {}", u.id, u.name, u.input_json)),
            Block::ToolResult(r) => Some(format!(
                "result {} {} {}",
                r.tool_use_id, r.is_error, r.content
            )),
            Block::Text(_) | Block::Part(_) => None,
        })
        .collect()
}

/// What libFuzzer's bytes decode to (through `arbitrary`).
pub type Input<'a> = (bool, u8, u8, &'a [u8]);

/// The target's checks on one input: a panic is a finding.
pub fn check(input: Input<'_>) {
    let (anthropic, turn, small, json) = input;
    let format = if anthropic {
        Format::Anthropic
    } else {
        Format::OpenAi
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else {
        return;
    };
    let Ok(history) = context::import_history(value, format) else {
        return;
    };
    // Export may reshape (Anthropic merges consecutive result messages into
    // one user message and folds system messages into `system`), but it
    // must give JSON that imports, with every call and result intact.
    let exported = context::export_history(&history, format);
    let again = context::import_history(exported.clone(), format)
        .unwrap_or_else(|e| panic!("export gave JSON import refuses: {e}\n{exported}"));
    assert_eq!(
        calls_and_results(&again.messages),
        calls_and_results(&history.messages),
        "round trip changed the calls or results\n{exported}"
    );

    let (repaired, _) = context::repair(history.messages.clone());
    assert!(
        !context::needs_repair(&repaired),
        "repair left something to repair"
    );
    let (twice, report) = context::repair(repaired.clone());
    assert!(report.is_empty(), "repair is not idempotent: {report:?}");
    assert_eq!(twice, repaired);

    // Small budgets so that every step of compaction has work to do.
    let s = u64::from(small);
    let settings = CompactSettings {
        per_result_chars: s * 4 + 1,
        per_turn_chars: s * 8 + 2,
        truncate_age: u32::from(small % 3),
        clear_age: u32::from(small % 3) + u32::from(small % 2),
        min_chars: s / 2,
        ..Default::default()
    };
    let mut archive = MemArchive(HashMap::new());
    let Ok((compacted, _, _)) =
        context::compact(history.messages, u32::from(turn), &settings, &mut archive);
    assert!(
        !context::needs_repair(&compacted),
        "compaction broke call/result pairing"
    );
    let _ = context::export_history(
        &History {
            messages: compacted,
            rest: None,
        },
        format,
    );
}
