//! What a newcomer reads matches what the code does.
//!
//! - Every field of the protos says what it does.

use std::path::{Path, PathBuf};

/// Every field of every proto carries a comment on the line above it.
#[test]
fn every_proto_field_says_what_it_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/spillway/v1");
    let mut missing = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "{files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        // What encloses each line: message, enum, oneof or service.
        let mut stack: Vec<&str> = Vec::new();
        let mut previous = "";
        for (n, line) in text.lines().enumerate() {
            let t = line.trim();
            let opens = ["message ", "enum ", "oneof ", "service "]
                .into_iter()
                .find(|k| t.starts_with(k) && t.ends_with('{'));
            let in_fields = matches!(stack.last(), Some(&"message ") | Some(&"oneof "));
            let is_field = in_fields
                && opens.is_none()
                && t.ends_with(';')
                && t.contains(" = ")
                && !t.starts_with("//")
                && !t.starts_with("reserved");
            if is_field && !previous.starts_with("//") {
                missing.push(format!(
                    "{}:{}: {t}",
                    path.file_name().unwrap().to_string_lossy(),
                    n + 1
                ));
            }
            if let Some(k) = opens {
                stack.push(k);
            } else if t.starts_with('}') {
                stack.pop();
            }
            previous = t;
        }
    }
    assert!(
        missing.is_empty(),
        "fields without a comment:\n{}",
        missing.join("\n")
    );
}
