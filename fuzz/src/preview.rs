//! The preview cutter: any bytes, any style and size. Checks the cut
//! functions' contracts: heads are prefixes, tails are suffixes, and the
//! omitted count is what lies between them.

use spillway::offload::{Style, build_preview};
use spillway::text;

/// What libFuzzer's bytes decode to (through `arbitrary`).
pub type Input<'a> = (u8, u16, &'a str, &'a [u8]);

/// The target's checks on one input: a panic is a finding.
pub fn check(input: Input<'_>) {
    let (style, chars, content_type, content) = input;
    let style = [Style::Structured, Style::Edges, Style::Lines][style as usize % 3];
    let chars = (chars != 0).then_some(chars as usize);
    let p = build_preview(content, content_type, style, chars);
    let _ = p.render("sessions/ses_x/p.txt", "pay_x");

    let Ok(text) = std::str::from_utf8(content) else {
        return;
    };
    let n = chars.unwrap_or(0) % 4096;
    let total = text.chars().count() as u64;
    let head = text::head_chars(text, n);
    assert!(text.starts_with(head));
    assert_eq!(head.chars().count(), n.min(total as usize));
    let tail = text::tail_chars(text, n);
    assert!(text.ends_with(tail));
    assert_eq!(tail.chars().count(), n.min(total as usize));
    for cut in [text::cut_edges(text, n), text::cut_lines(text, n, n / 4)]
        .into_iter()
        .flatten()
    {
        assert!(text.starts_with(cut.head));
        assert!(text.ends_with(cut.tail));
        assert_eq!(
            cut.head.chars().count() as u64 + cut.omitted + cut.tail.chars().count() as u64,
            total
        );
    }
}
