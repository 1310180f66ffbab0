//! The rules: the built-ins, custom regexes, and how one rule finds its next
//! match in a haystack.
//!
//! The built-ins are ASCII-only (`(?-u)`), so their word boundaries and
//! classes look at single bytes and never need more than one byte of context.
//! `credit_card` is the one rule with a check beyond its regex: the Luhn
//! checksum.

use std::ops::Range;
use std::sync::LazyLock;

use regex::bytes::{Regex, RegexBuilder};

use super::RedactError;

/// The prefix that names a built-in rule.
pub const BUILTIN_PREFIX: &str = "builtin:";

/// The name used in markers and counts for every custom regex.
pub const CUSTOM: &str = "custom";

/// The most rules one redactor holds (after duplicates are dropped).
pub const MAX_RULES: usize = 64;

/// The longest custom regex, in bytes of its source text.
pub const MAX_PATTERN_LEN: usize = 4096;

/// The compiled-size limit of one custom regex (`RegexBuilder::size_limit`).
pub const MAX_REGEX_BYTES: usize = 1 << 20;

/// What a rule checks beyond its regex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Nothing: every regex match counts.
    None,
    /// The match (or its longest group-aligned prefix) must pass the Luhn check.
    Luhn,
}

/// The built-ins: name, pattern, check.
const BUILTINS: [(&str, &str, Check); 5] = [
    (
        "aws_access_key",
        r"(?-u)\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}\b",
        Check::None,
    ),
    (
        "bearer_token",
        r"(?-u)\b(?i:bearer)[ \t]+[A-Za-z0-9._~+/-]{16,}=*",
        Check::None,
    ),
    (
        "private_key",
        r"(?-u)-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----(?s:.)*?-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----",
        Check::None,
    ),
    (
        "email",
        r"(?-u)[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
        Check::None,
    ),
    (
        "credit_card",
        r"(?-u)\b[0-9](?:[ -]?[0-9]){12,18}\b",
        Check::Luhn,
    ),
];

/// The built-in names, in the order the error messages list them.
pub const BUILTIN_NAMES: [&str; 5] = [
    BUILTINS[0].0,
    BUILTINS[1].0,
    BUILTINS[2].0,
    BUILTINS[3].0,
    BUILTINS[4].0,
];

/// The built-ins compiled once per process; a `Regex` clone shares it.
static COMPILED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    BUILTINS
        .iter()
        .map(|(_, pattern, _)| Regex::new(pattern).expect("built-in patterns compile"))
        .collect()
});

/// One compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    /// `aws_access_key`, …, or [`CUSTOM`].
    pub name: &'static str,
    /// `[REDACTED:<name>]`.
    pub marker: Box<[u8]>,
    re: Regex,
    check: Check,
}

impl Rule {
    /// Compiles rule number `index` of a policy's list.
    pub fn compile(index: usize, source: &str) -> Result<Rule, RedactError> {
        if let Some(name) = source.strip_prefix(BUILTIN_PREFIX) {
            let Some(i) = BUILTINS.iter().position(|(n, _, _)| *n == name) else {
                return Err(RedactError::UnknownBuiltin {
                    index,
                    rule: clip(source),
                });
            };
            let (name, _, check) = BUILTINS[i];
            return Ok(Rule::new(name, COMPILED[i].clone(), check));
        }
        let invalid = |message: String| RedactError::InvalidRegex {
            index,
            rule: clip(source),
            message,
        };
        if source.len() > MAX_PATTERN_LEN {
            return Err(RedactError::PatternTooLong {
                index,
                rule: clip(source),
                len: source.len(),
                limit: MAX_PATTERN_LEN,
            });
        }
        let re = RegexBuilder::new(source)
            .size_limit(MAX_REGEX_BYTES)
            .build()
            .map_err(|e| match e {
                regex::Error::CompiledTooBig(limit) => RedactError::RegexTooLarge {
                    index,
                    rule: clip(source),
                    limit,
                },
                regex::Error::Syntax(message) => invalid(message),
                other => invalid(other.to_string()),
            })?;
        if re.is_match(b"") {
            return Err(RedactError::MatchesEmpty {
                index,
                rule: clip(source),
            });
        }
        Ok(Rule::new(CUSTOM, re, Check::None))
    }

    fn new(name: &'static str, re: Regex, check: Check) -> Rule {
        let marker = format!("[REDACTED:{name}]").into_bytes().into_boxed_slice();
        Rule {
            name,
            marker,
            re,
            check,
        }
    }

    /// The leftmost non-empty match that starts at or after `from`, as the
    /// regex chooses it at that start (for `credit_card`: the longest
    /// group-aligned piece of it that passes Luhn). Bytes before `from` are
    /// look-behind context only.
    pub fn find(&self, hay: &[u8], mut from: usize) -> Option<Range<usize>> {
        while from <= hay.len() {
            let m = self.re.find_at(hay, from)?;
            if m.is_empty() {
                from = m.start() + 1;
                continue;
            }
            match self.check {
                Check::None => return Some(m.range()),
                Check::Luhn => match luhn_prefix(m.as_bytes()) {
                    Some(len) => return Some(m.start()..m.start() + len),
                    None => from = m.start() + 1,
                },
            }
        }
        None
    }
}

/// A rule's text, cut for an error message (a 4 KiB regex helps nobody).
fn clip(source: &str) -> String {
    const KEEP: usize = 120;
    if source.len() <= KEEP {
        return source.to_owned();
    }
    let mut end = KEEP;
    while !source.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &source[..end])
}

/// The length of the longest prefix of a card candidate (digits with single
/// separators) that ends at its end or before a separator, holds 13 to 19
/// digits and passes the Luhn check.
fn luhn_prefix(candidate: &[u8]) -> Option<usize> {
    let ends = std::iter::once(candidate.len()).chain(
        (0..candidate.len())
            .rev()
            .filter(|&i| !candidate[i].is_ascii_digit()),
    );
    for end in ends {
        let digits = candidate[..end].iter().filter(|b| b.is_ascii_digit());
        if (13..=19).contains(&digits.clone().count()) && luhn(digits.copied()) {
            return Some(end);
        }
    }
    None
}

/// The Luhn checksum over ASCII digits, most significant first.
fn luhn(digits: impl DoubleEndedIterator<Item = u8>) -> bool {
    let sum: u32 = digits
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_compiles() {
        assert_eq!(COMPILED.len(), BUILTINS.len());
    }

    #[test]
    fn luhn_accepts_known_test_numbers_and_rejects_a_changed_digit() {
        assert!(luhn(b"4111111111111111".iter().copied()));
        assert!(luhn(b"378282246310005".iter().copied()));
        assert!(luhn(b"5500000000000004".iter().copied()));
        assert!(!luhn(b"4111111111111112".iter().copied()));
        assert!(!luhn(b"378282246310006".iter().copied()));
    }

    #[test]
    fn card_candidate_falls_back_to_its_longest_valid_group_prefix() {
        // A card followed by a CVV: the 19 digits fail Luhn, the first 16 pass.
        assert_eq!(luhn_prefix(b"4111 1111 1111 1111 123"), Some(19));
        assert_eq!(luhn_prefix(b"4111-1111-1111-1111"), Some(19));
        assert_eq!(luhn_prefix(b"4111 1111 1111 1112"), None);
    }

    #[test]
    fn long_rules_are_clipped_in_messages_on_a_char_boundary() {
        let long = "é".repeat(100);
        let c = clip(&long);
        assert!(c.ends_with('…'));
        assert!(c.len() <= 124);
    }
}
