//! `builtin:credit_card`, matched by hand because text is full of digits and
//! a regex engine slows down on every one of them.
//!
//! The matcher gives exactly what this procedure gives (a test compares
//! them): find the leftmost match of `(?-u)\b[0-9](?:[ -]?[0-9]){12,18}\b`;
//! keep its longest prefix that ends at its end or before a separator, holds
//! 13 to 19 digits and passes the Luhn check; if there is none, search again
//! one byte after the match's start. It does so in one pass over each run of
//! digits, where the regex would restart at every group of one.

use std::ops::Range;

/// The next card number at or after `from`; bytes before `from` are
/// look-behind context only.
pub fn find(hay: &[u8], from: usize) -> Option<Range<usize>> {
    let mut at = from;
    while let Some(first) = next_digit(hay, at) {
        match scan_run(hay, first) {
            Ok(found) => return Some(found),
            Err(after) => at = after,
        }
    }
    None
}

/// Digits held for the starts still to decide: a start needs 18 more.
const RING: usize = 32;

/// Scans the run of digits joined by single separators that begins at
/// `first`, in one pass: each digit is a possible start (when a word boundary
/// precedes it) and a possible end (when one follows it), and the Luhn sum of
/// any stretch comes from running sums by digit parity. Returns the leftmost
/// card, or where the run ends.
fn scan_run(hay: &[u8], first: usize) -> Result<Range<usize>, usize> {
    // Most runs are short numbers: skip those without 13 digits cheaply.
    let mut digits = 0;
    let mut p = first;
    while digits < 13 {
        digits += 1;
        match hay.get(p + 1) {
            Some(b) if b.is_ascii_digit() => p += 1,
            Some(b' ' | b'-') if hay.get(p + 2).is_some_and(u8::is_ascii_digit) => p += 2,
            _ if digits < 13 => return Err(p + 1),
            _ => break,
        }
    }
    let mut pos = [0usize; RING];
    // Running sums before each digit: as is and Luhn-doubled, by index parity.
    let mut sums = [[0u32; 4]; RING];
    let mut start = [false; RING];
    let mut end = [false; RING];
    let mut total = [0u32; 4];
    let mut decided = 0;
    let mut j = 0;
    let mut p = first;
    loop {
        let r = j % RING;
        pos[r] = p;
        sums[r] = total;
        start[r] = if j == 0 {
            first == 0 || !is_word(hay[first - 1])
        } else {
            !hay[p - 1].is_ascii_digit()
        };
        let d = u32::from(hay[p] - b'0');
        // Wrapping: only differences of sums are used, and those stay exact.
        total[j % 2] = total[j % 2].wrapping_add(d);
        total[2 + j % 2] = total[2 + j % 2].wrapping_add(if d > 4 { d * 2 - 9 } else { d * 2 });
        let q = p + 1;
        let next = match hay.get(q) {
            Some(b) if b.is_ascii_digit() => Some(q),
            Some(b' ' | b'-') if hay.get(q + 1).is_some_and(u8::is_ascii_digit) => Some(q + 1),
            _ => None,
        };
        end[r] = match next {
            Some(n) => n != q,
            None => hay.get(q).is_none_or(|&b| !is_word(b)),
        };
        let last = next.is_none();
        while decided + 18 <= j || (last && decided <= j) {
            if let Some(found) = decide(decided, j, &pos, &sums, &start, &end, total) {
                return Ok(found);
            }
            decided += 1;
        }
        match next {
            Some(n) => {
                p = n;
                j += 1;
            }
            None => return Err(q),
        }
    }
}

/// The card starting at digit `i` of the run, if any: the most digits, 13 to
/// 19, that end before a word boundary and pass Luhn. Digits up to `j` are
/// known; `total` holds the running sums after digit `j`.
fn decide(
    i: usize,
    j: usize,
    pos: &[usize; RING],
    sums: &[[u32; 4]; RING],
    start: &[bool; RING],
    end: &[bool; RING],
    total: [u32; 4],
) -> Option<Range<usize>> {
    if !start[i % RING] || j < i + 12 {
        return None;
    }
    let before = sums[i % RING];
    (i + 12..=j.min(i + 18))
        .rev()
        .filter(|e| end[e % RING])
        .find_map(|e| {
            let after = if e == j { total } else { sums[(e + 1) % RING] };
            // The last digit is as is, the one before it doubled, and so on.
            let (plain, doubled) = (e % 2, 2 + (e + 1) % 2);
            let sum = (after[plain].wrapping_sub(before[plain]))
                .wrapping_add(after[doubled].wrapping_sub(before[doubled]));
            sum.is_multiple_of(10)
                .then(|| pos[i % RING]..pos[e % RING] + 1)
        })
}

/// An ASCII word byte, as `(?-u)\b` sees it.
fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The first ASCII digit at or after `at`, eight bytes at a time.
fn next_digit(hay: &[u8], mut at: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    while let Some(word) = hay.get(at..at + 8) {
        let v = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        // Digits become 0..=9; flag bytes below 10. The lowest flag is exact.
        let t = v ^ (b'0' as u64 * ONES);
        let flags = t.wrapping_sub(10 * ONES) & !t & (0x80 * ONES);
        if flags != 0 {
            return Some(at + (flags.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = hay.get(at..)?;
    tail.iter().position(u8::is_ascii_digit).map(|p| at + p)
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};
    use regex::bytes::Regex;

    use super::*;

    /// The Luhn checksum over ASCII digits, most significant first.
    fn luhn(digits: &[u8]) -> bool {
        let sum: u32 = digits
            .iter()
            .rev()
            .enumerate()
            .map(|(i, d)| {
                let d = u32::from(d - b'0');
                if i % 2 == 1 {
                    let twice = d * 2;
                    if twice > 9 { twice - 9 } else { twice }
                } else {
                    d
                }
            })
            .sum();
        sum.is_multiple_of(10)
    }

    /// The longest prefix of a regex match that ends at its end or before a
    /// separator, holds 13 to 19 digits and passes Luhn.
    fn luhn_prefix(m: &[u8]) -> Option<usize> {
        let ends =
            std::iter::once(m.len()).chain((0..m.len()).rev().filter(|&i| !m[i].is_ascii_digit()));
        ends.into_iter().find(|&end| {
            let digits: Vec<u8> = m[..end]
                .iter()
                .copied()
                .filter(u8::is_ascii_digit)
                .collect();
            (13..=19).contains(&digits.len()) && luhn(&digits)
        })
    }

    /// The procedure the module docs define, with the regex engine.
    fn by_regex(re: &Regex, hay: &[u8], mut from: usize) -> Option<Range<usize>> {
        while from <= hay.len() {
            let m = re.find_at(hay, from)?;
            if let Some(len) = luhn_prefix(m.as_bytes()) {
                return Some(m.start()..m.start() + len);
            }
            from = m.start() + 1;
        }
        None
    }

    #[test]
    fn the_one_pass_matcher_agrees_with_the_regex_definition() {
        let re = Regex::new(r"(?-u)\b[0-9](?:[ -]?[0-9]){12,18}\b").unwrap();
        let cards: [&[u8]; 4] = [
            b"4111111111111111",
            b"4111 1111 1111 1111",
            b"5500-0000-0000-0004",
            b"378282246310005",
        ];
        let noise = b"0123456789  --a_.\n\xff";
        let mut rng = StdRng::seed_from_u64(7);
        let mut found = 0;
        for _ in 0..4000 {
            let mut hay = Vec::new();
            let len = rng.random_range(0..200);
            while hay.len() < len {
                match rng.random_range(0..12) {
                    0 => hay.extend_from_slice(cards[rng.random_range(0..cards.len())]),
                    1..=4 => hay.push(noise[rng.random_range(0..noise.len())]),
                    _ => hay.push(b'0' + rng.random_range(0..10u8)),
                }
            }
            let from = rng.random_range(0..=hay.len());
            found += super::super::agrees(&hay, from, find, |h, f| by_regex(&re, h, f));
        }
        assert!(found > 500, "{found}");
    }

    #[test]
    fn a_card_followed_by_more_digits_is_cut_at_its_longest_valid_group() {
        // The 19 digits fail Luhn; the first 16 pass.
        assert_eq!(find(b"4111 1111 1111 1111 123", 0), Some(0..19));
        assert_eq!(find(b"x 4111-1111-1111-1111.", 0), Some(2..21));
        assert_eq!(find(b"4111 1111 1111 1112", 0), None);
        // 20 digits in a row hold no card.
        assert_eq!(find(b"41111111111111111111", 0), None);
    }

    #[test]
    fn luhn_accepts_known_test_numbers_and_rejects_a_changed_digit() {
        assert!(luhn(b"4111111111111111"));
        assert!(luhn(b"378282246310005"));
        assert!(luhn(b"5500000000000004"));
        assert!(!luhn(b"4111111111111112"));
        assert!(!luhn(b"378282246310006"));
    }

    #[test]
    fn next_digit_finds_the_first_digit_in_any_position() {
        for len in 0..20 {
            for at in 0..len {
                let mut hay = vec![b'/'; len];
                hay[at] = b'7';
                hay.push(b'1');
                assert_eq!(next_digit(&hay, 0), Some(at));
                assert_eq!(next_digit(&hay, at + 1), Some(len));
            }
        }
        assert_eq!(next_digit(b":/@\xb0\xb9 9", 0), Some(6));
        assert_eq!(next_digit(b"abc", 3), None);
    }
}
