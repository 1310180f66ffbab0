//! The Read line index against a plain scan: for content up to a few
//! strides long, fed in random chunk sizes, every anchor lies on the line
//! it names, at or before its target, and at most one stride before it.

use spillway::store::{LINE_INDEX_STRIDE as STRIDE, LineIndex, LineIndexBuilder};

/// Where the newlines are: the plain-scan oracle, built once per input so
/// that each check is a binary search (quadratic checks made this target
/// run at 19 inputs a second).
struct Newlines(Vec<u64>);

impl Newlines {
    fn scan(content: &[u8]) -> Self {
        Self(
            content
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(i, _)| i as u64)
                .collect(),
        )
    }

    /// 1-based line of byte `offset` (newlines before it, plus one).
    fn line_at(&self, offset: u64) -> u64 {
        self.0.partition_point(|&n| n < offset) as u64 + 1
    }

    /// Byte where 1-based `line` starts, if it exists.
    fn line_start(&self, line: u64) -> Option<u64> {
        match line {
            0 => None,
            1 => Some(0),
            _ => self.0.get(line as usize - 2).map(|n| n + 1),
        }
    }
}

/// What libFuzzer's bytes decode to (through `arbitrary`).
pub type Input<'a> = (u16, u16, u8, &'a [u8]);

/// The target's checks on one input: a panic is a finding.
pub fn check(input: Input<'_>) {
    let (len, chunk, newline_every, pattern) = input;
    // Random bytes alone are almost never past one stride: stretch the
    // pattern, with newlines sprinkled in at a fuzzer-chosen rhythm.
    let len = (len as usize * 8).min(5 * STRIDE as usize + 17);
    let mut content = Vec::with_capacity(len);
    for i in 0..len {
        let b = if pattern.is_empty() {
            b'x'
        } else {
            pattern[i % pattern.len()]
        };
        content.push(
            if newline_every > 0 && i % (newline_every as usize * 97 + 1) == 0 {
                b'\n'
            } else {
                b
            },
        );
    }
    let chunk = (chunk as usize).max(1);
    let mut builder = LineIndexBuilder::default();
    let mut offset = 0;
    for piece in content.chunks(chunk) {
        builder.update(offset, piece);
        offset += piece.len() as u64;
    }
    let oracle = Newlines::scan(&content);
    let newlines = oracle.0.len() as u64;
    assert_eq!(builder.newlines(), newlines);
    let index = LineIndex::decode(&builder.finish()).expect("a built index decodes");

    let size = content.len() as u64;
    let mut probes: Vec<u64> = (0..=size / STRIDE + 1)
        .flat_map(|k| {
            let b = k * STRIDE;
            [b.saturating_sub(1), b, b + 1]
        })
        .collect();
    probes.extend([0, size / 2, size.saturating_sub(1), size, size + 1]);
    for &o in &probes {
        let a = index.anchor_for_offset(o);
        assert!(a.offset <= o, "anchor {a:?} past offset {o}");
        if o <= size {
            assert!(o - a.offset <= STRIDE, "anchor {a:?} too far before {o}");
        }
        assert_eq!(
            a.line,
            oracle.line_at(a.offset),
            "anchor {a:?} names the wrong line"
        );
    }
    for line in [1, 2, newlines / 2 + 1, newlines, newlines + 1, newlines + 2] {
        let a = index.anchor_for_line(line);
        assert_eq!(
            a.line,
            oracle.line_at(a.offset),
            "anchor {a:?} names the wrong line"
        );
        if let Some(start) = oracle.line_start(line) {
            assert!(
                a.offset <= start,
                "anchor {a:?} past the start {start} of line {line}"
            );
            assert!(a.line <= line);
            if a.at_line_start {
                assert_eq!(a.line, oracle.line_at(a.offset));
            }
        }
    }
    // Arbitrary bytes as an encoded index: no panic.
    if let Some(i) = LineIndex::decode(pattern) {
        let _ = i.anchor_for_line(len as u64);
        let _ = i.anchor_for_offset(chunk as u64 * 1000);
    }
}
