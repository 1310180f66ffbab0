//! Type detection and Inspect's structure inference over any bytes, read in
//! small pieces: never a panic, and the counts agree with the content.

use std::io::Read;

use spillway::inspect::{detect, infer};

/// A reader that hands out at most `step` bytes per call, so that every
/// boundary case of the streaming parsers is reached.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// What libFuzzer's bytes decode to (through `arbitrary`).
pub type Input<'a> = (u8, &'a str, &'a [u8]);

/// The target's checks on one input: a panic is a finding.
pub fn check(input: Input<'_>) {
    let (step, content_type, content) = input;
    let _ = detect(content, content_type);
    let lines = content.iter().filter(|&&b| b == b'\n').count() as u64
        + u64::from(!content.is_empty() && !content.ends_with(b"\n"));
    let reader = Trickle {
        data: content,
        step: (step as usize % 64) + 1,
    };
    let s = infer(reader, content.len() as u64, lines, content_type)
        .expect("reading from memory cannot fail");
    assert_eq!(s.size_bytes, content.len() as u64);
    if let Some(at) = s.invalid_json_at {
        assert!(
            at <= content.len() as u64,
            "invalid_json_at {at} past the end"
        );
    }
}
