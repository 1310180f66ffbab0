//! Redaction: a policy's `redact` rules applied to bytes, in one shot or as
//! a stream, before anything is stored or previewed.
//!
//! A rule is either a built-in, `builtin:<name>`, or a custom regex in Rust
//! `regex` syntax, matched over bytes (`regex::bytes`), so payloads may be
//! binary or invalid UTF-8. Every match is replaced with
//! `[REDACTED:<name>]`, where the name is the built-in's (`aws_access_key`)
//! or `custom` for any custom regex. Bytes outside matches pass through
//! unchanged. Only counts are kept ([`RedactCounts`]), never the matched
//! values.
//!
//! | built-in | matches |
//! | --- | --- |
//! | `aws_access_key` | AWS access key IDs: `AKIA`, `ASIA`, `ABIA`, `ACCA` or `A3T?` and 16 base-32 chars, between word boundaries |
//! | `bearer_token` | `Bearer` (any case), blanks, and a token of 16 or more token68 chars: the whole of it |
//! | `private_key` | a PEM private key block of any key type: a `-----BEGIN … PRIVATE KEY-----` line (or `… PRIVATE KEY BLOCK-----`) through the first such `-----END` line after it |
//! | `email` | `local@domain.tld`, ASCII |
//! | `credit_card` | 13 to 19 digits, optionally separated by single spaces or dashes, between word boundaries, that pass the Luhn check |
//!
//! **Overlaps.** Matches are taken leftmost first across all rules: the match
//! that starts earliest wins; at the same start the longest wins; at the same
//! start and length the rule listed first names it. Scanning then resumes
//! after the winner, so a match that overlaps it is dropped. Each rule's own
//! match at a given start is the one its regex chooses (leftmost-first, as
//! `regex` does). Empty matches are ignored.
//!
//! **Windows.** Input is searched in windows of [`WINDOW`] bytes that overlap
//! by [`MAX_MATCH_LEN`], so a stream needs only a bounded tail of its input.
//! The windows sit at fixed offsets of the input, so streaming gives the same
//! bytes as one-shot redaction for any chunking. Every match of up to
//! [`MAX_MATCH_LEN`] bytes (16 KiB: a PEM block of an RSA-8192 key is about
//! 6.3 KiB) is found wherever it lies. A longer match is a limitation: the
//! regex sees the window's end as the end of the input, so the match is either
//! cut (a greedy regex matches the piece inside the window, and the rest is
//! searched afresh) or missed (a PEM block whose END line lies beyond the
//! window passes through unredacted).
//!
//! **Limits.** At most [`MAX_RULES`] distinct rules; a custom regex of at most
//! [`MAX_PATTERN_LEN`] bytes that compiles to at most [`MAX_REGEX_BYTES`] and
//! cannot match the empty string.

mod card;
mod rules;
mod stream;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use rules::{
    BUILTIN_NAMES, BUILTIN_PREFIX, CUSTOM, MAX_PATTERN_LEN, MAX_REGEX_BYTES, MAX_RULES,
};
pub use stream::{MAX_MATCH_LEN, RedactStream, WINDOW};

use rules::Rule;

/// A rule list that cannot be compiled. Messages name the rule by its index
/// in the list and its text, say what is wrong, and list the built-ins.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedactError {
    /// `builtin:<name>` with a name that is not a built-in.
    #[error(
        "redaction rule {index} ({rule:?}) names no built-in; the built-ins are {}. A rule that does not start with \"builtin:\" is read as a regex",
        builtin_list()
    )]
    UnknownBuiltin {
        /// Position in the rule list, from 0.
        index: usize,
        /// The rule's text.
        rule: String,
    },
    /// A custom rule that is not a valid regex.
    #[error(
        "redaction rule {index} ({rule:?}) is not a valid regex (Rust regex syntax): {message}. Fix the regex, or use a built-in: {}",
        builtin_list()
    )]
    InvalidRegex {
        /// Position in the rule list, from 0.
        index: usize,
        /// The rule's text (cut if long).
        rule: String,
        /// The parser's message.
        message: String,
    },
    /// A custom regex whose text is too long.
    #[error(
        "redaction rule {index} ({rule:?}) is {len} bytes long; the limit is {limit}. Use a shorter regex, or a built-in: {}",
        builtin_list()
    )]
    PatternTooLong {
        /// Position in the rule list, from 0.
        index: usize,
        /// The rule's text (cut).
        rule: String,
        /// Its length in bytes.
        len: usize,
        /// [`MAX_PATTERN_LEN`].
        limit: usize,
    },
    /// A custom regex that compiles past the size limit.
    #[error(
        "redaction rule {index} ({rule:?}) compiles to more than {limit} bytes; simplify it (large counted repetitions and Unicode classes such as \\w are costly; (?-u) makes classes ASCII), or use a built-in: {}",
        builtin_list()
    )]
    RegexTooLarge {
        /// Position in the rule list, from 0.
        index: usize,
        /// The rule's text (cut if long).
        rule: String,
        /// [`MAX_REGEX_BYTES`].
        limit: usize,
    },
    /// A custom regex that matches the empty string.
    #[error(
        "redaction rule {index} ({rule:?}) matches the empty string, so it would redact nothing meaningful; make it require at least one character (for example + instead of *)"
    )]
    MatchesEmpty {
        /// Position in the rule list, from 0.
        index: usize,
        /// The rule's text (cut if long).
        rule: String,
    },
    /// More distinct rules than [`MAX_RULES`].
    #[error(
        "the policy has {count} distinct redaction rules; the limit is {limit}. Combine custom regexes with | or drop some"
    )]
    TooManyRules {
        /// Distinct rules given.
        count: usize,
        /// [`MAX_RULES`].
        limit: usize,
    },
}

fn builtin_list() -> String {
    BUILTIN_NAMES
        .iter()
        .map(|n| format!("{BUILTIN_PREFIX}{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How many matches each rule replaced. Serializes as
/// `{"total":3,"by_rule":{"custom":1,"email":2}}`, rule names sorted; rules
/// that matched nothing are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedactCounts {
    /// Matches replaced, over all rules.
    pub total: u64,
    /// Matches replaced per rule name (`custom` sums every custom regex).
    pub by_rule: BTreeMap<String, u64>,
}

impl RedactCounts {
    /// Whether nothing was replaced.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Matches replaced by the rule of this name (`email`, `custom`, …).
    pub fn get(&self, name: &str) -> u64 {
        self.by_rule.get(name).copied().unwrap_or(0)
    }

    /// Adds another result's counts to these (for example over a turn).
    pub fn add(&mut self, other: &RedactCounts) {
        self.total += other.total;
        for (name, n) in &other.by_rule {
            *self.by_rule.entry(name.clone()).or_default() += n;
        }
    }

    /// Counts from per-rule tallies.
    fn from_tallies(rules: &[Rule], tallies: &[u64]) -> RedactCounts {
        let mut counts = RedactCounts::default();
        for (rule, &n) in rules.iter().zip(tallies).filter(|(_, n)| **n > 0) {
            counts.total += n;
            *counts.by_rule.entry(rule.name.to_owned()).or_default() += n;
        }
        counts
    }
}

/// A compiled rule list. Cloning is cheap (the compiled rules are shared).
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    sources: Arc<[String]>,
    rules: Arc<[Rule]>,
}

impl Redactor {
    /// Compiles a policy's `redact` list. Duplicates are dropped (the first
    /// one stays), and the list order breaks ties between rules (see the
    /// module docs).
    pub fn compile(rules: &[String]) -> Result<Redactor, RedactError> {
        let sources = union(rules, &[]);
        if sources.len() > MAX_RULES {
            return Err(RedactError::TooManyRules {
                count: sources.len(),
                limit: MAX_RULES,
            });
        }
        let compiled = sources
            .iter()
            .map(|s| {
                let index = rules.iter().position(|r| r == s).unwrap_or_default();
                Rule::compile(index, s)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Redactor {
            sources: sources.into(),
            rules: compiled.into(),
        })
    }

    /// Whether there are no rules: redaction then passes input through
    /// without copying or buffering.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules' texts, duplicates dropped, in order.
    pub fn rules(&self) -> &[String] {
        &self.sources
    }

    /// A stream that redacts input pushed in chunks of any size.
    pub fn stream(&self) -> RedactStream {
        RedactStream::new(self.rules.clone())
    }

    /// Redacts `input` in one shot. Borrows it when nothing matched. Meant for
    /// small inputs (previews, notices, history text); it gives the same
    /// bytes as [`Redactor::stream`].
    pub fn redact<'a>(&self, input: &'a [u8]) -> (Cow<'a, [u8]>, RedactCounts) {
        if self.is_empty() {
            return (Cow::Borrowed(input), RedactCounts::default());
        }
        let mut out = stream::Lazy::new(input);
        let tallies = stream::redact_all(&self.rules, input, &mut out);
        let counts = RedactCounts::from_tallies(&self.rules, &tallies);
        (out.into_cow(), counts)
    }

    /// [`Redactor::redact`] for text. The built-ins only ever replace ASCII,
    /// so valid UTF-8 stays valid; a custom regex written to match raw bytes
    /// (`(?-u)`) could cut a character, and such a cut shows as U+FFFD.
    pub fn redact_str<'a>(&self, input: &'a str) -> (Cow<'a, str>, RedactCounts) {
        let (bytes, counts) = self.redact(input.as_bytes());
        let text = match bytes {
            Cow::Borrowed(_) => Cow::Borrowed(input),
            Cow::Owned(v) => match String::from_utf8(v) {
                Ok(s) => Cow::Owned(s),
                Err(e) => Cow::Owned(String::from_utf8_lossy(e.as_bytes()).into_owned()),
            },
        };
        (text, counts)
    }
}

/// The union of two rule lists, as policies merge them: `a`'s rules, then
/// `b`'s that `a` lacks, each once, in first-seen order.
pub fn union(a: &[String], b: &[String]) -> Vec<String> {
    let mut seen = HashSet::with_capacity(a.len() + b.len());
    a.iter()
        .chain(b)
        .filter(|rule| seen.insert(rule.as_str()))
        .cloned()
        .collect()
}

/// Checks that `find` gives the matches `reference` does in `hay`, from
/// `from` on to the last; returns how many there were.
#[cfg(test)]
fn agrees(
    hay: &[u8],
    mut from: usize,
    find: impl Fn(&[u8], usize) -> Option<std::ops::Range<usize>>,
    reference: impl Fn(&[u8], usize) -> Option<std::ops::Range<usize>>,
) -> u64 {
    let mut found = 0;
    while let Some(m) = reference(hay, from) {
        assert_eq!(
            find(hay, from),
            Some(m.clone()),
            "{:?} from {from}",
            String::from_utf8_lossy(hay)
        );
        found += 1;
        from = m.end;
    }
    assert_eq!(
        find(hay, from),
        None,
        "{:?} from {from}",
        String::from_utf8_lossy(hay)
    );
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(rules: &[&str]) -> Result<Redactor, RedactError> {
        let rules: Vec<String> = rules.iter().map(|r| (*r).to_owned()).collect();
        Redactor::compile(&rules)
    }

    fn redact(rules: &[&str], input: &str) -> (String, RedactCounts) {
        let (out, counts) = compile(rules).unwrap().redact(input.as_bytes());
        (String::from_utf8(out.into_owned()).unwrap(), counts)
    }

    fn pem(kind: &str, body_lines: usize) -> String {
        let line = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun";
        let body = vec![line; body_lines].join("\n");
        format!("-----BEGIN {kind}-----\n{body}\n-----END {kind}-----")
    }

    #[test]
    fn each_builtin_replaces_its_matches_with_its_marker() {
        let cases = [
            (
                "builtin:aws_access_key",
                "id=AKIAIOSFODNN7EXAMPLE;",
                "id=[REDACTED:aws_access_key];",
            ),
            (
                "builtin:bearer_token",
                "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc_DEF-123==\n",
                "Authorization: [REDACTED:bearer_token]\n",
            ),
            (
                "builtin:bearer_token",
                "authorization: BEARER\tAbCdEfGhIjKlMnOpQrSt",
                "authorization: [REDACTED:bearer_token]",
            ),
            (
                "builtin:email",
                "mail <jane.doe+x@mail.example.co.uk>.",
                "mail <[REDACTED:email]>.",
            ),
            (
                "builtin:credit_card",
                "visa 4111 1111 1111 1111, mc 5500-0000-0000-0004, amex 378282246310005.",
                "visa [REDACTED:credit_card], mc [REDACTED:credit_card], amex [REDACTED:credit_card].",
            ),
        ];
        for (rule, input, want) in cases {
            let (out, counts) = redact(&[rule], input);
            assert_eq!(out, want, "{rule}");
            assert_eq!(counts.total, want.matches("[REDACTED:").count() as u64);
        }
    }

    #[test]
    fn private_key_blocks_of_any_key_type_are_redacted_whole() {
        for kind in [
            "PRIVATE KEY",
            "RSA PRIVATE KEY",
            "EC PRIVATE KEY",
            "ENCRYPTED PRIVATE KEY",
            "OPENSSH PRIVATE KEY",
            "PGP PRIVATE KEY BLOCK",
        ] {
            let input = format!("key:\n{}\nafter", pem(kind, 25));
            let (out, counts) = redact(&["builtin:private_key"], &input);
            assert_eq!(out, "key:\n[REDACTED:private_key]\nafter", "{kind}");
            assert_eq!(counts.get("private_key"), 1);
        }
        let public = pem("PUBLIC KEY", 3);
        assert_eq!(redact(&["builtin:private_key"], &public).0, public);
    }

    #[test]
    fn look_alikes_of_builtins_pass_through() {
        let cases = [
            (
                "builtin:bearer_token",
                "the bearer of bad news is here today",
            ),
            ("builtin:bearer_token", "Bearer short"),
            (
                "builtin:aws_access_key",
                "XAKIAIOSFODNN7EXAMPLE and AKIAIOSFODNN7EXAMPL",
            ),
            ("builtin:credit_card", "4111 1111 1111 1112 fails Luhn"),
            ("builtin:credit_card", "12345678901234567890123 is too long"),
            (
                "builtin:credit_card",
                "4111  1111 1111 1111 has a double space",
            ),
            ("builtin:credit_card", "x4111111111111111 is inside a word"),
            ("builtin:email", "user@localhost and @example.com"),
        ];
        for (rule, input) in cases {
            assert_eq!(redact(&[rule], input).0, input, "{rule}: {input}");
        }
    }

    #[test]
    fn a_card_followed_by_more_digits_is_redacted_up_to_its_valid_end() {
        let (out, _) = redact(&["builtin:credit_card"], "card 4111 1111 1111 1111 123 ok");
        assert_eq!(out, "card [REDACTED:credit_card] 123 ok");
        let (out, _) = redact(&["builtin:credit_card"], "ref 123 4111 1111 1111 1111 ok");
        assert_eq!(out, "ref 123 [REDACTED:credit_card] ok");
    }

    #[test]
    fn custom_regexes_are_named_custom_and_counted_together() {
        let (out, counts) = redact(&["sk-[a-z0-9]{8}", r"ghp_\w+"], "a sk-abcd1234 b ghp_XYZ c");
        assert_eq!(out, "a [REDACTED:custom] b [REDACTED:custom] c");
        assert_eq!(counts.get(CUSTOM), 2);
        assert_eq!(counts.total, 2);
    }

    #[test]
    fn bytes_outside_matches_pass_through_even_when_not_utf8() {
        let r = compile(&["builtin:email", "builtin:aws_access_key"]).unwrap();
        let input = b"\xff\xfe\x00bob@example.org\x80\xc3(AKIAIOSFODNN7EXAMPLE\x00\xff";
        let (out, counts) = r.redact(input);
        assert_eq!(
            &out[..],
            b"\xff\xfe\x00[REDACTED:email]\x80\xc3([REDACTED:aws_access_key]\x00\xff"
        );
        assert_eq!(counts.total, 2);
    }

    #[test]
    fn the_leftmost_match_wins_and_overlapping_ones_are_dropped() {
        // The key block starts first; the email inside it is not counted.
        let input = format!("{}\nmail a@b.io", pem("RSA PRIVATE KEY", 2))
            .replace("MIIEowIBAAKCAQEAu1SU", "admin@corp.example.com");
        let (out, counts) = redact(&["builtin:email", "builtin:private_key"], &input);
        assert_eq!(out, "[REDACTED:private_key]\nmail [REDACTED:email]");
        assert_eq!((counts.get("private_key"), counts.get("email")), (1, 1));
        // "ab" wins at 0; "bc" at 1 overlaps it and is dropped; scanning
        // resumes at 2 and finds "bc" at 3.
        let (out, counts) = redact(&["bc", "ab"], "abcbc");
        assert_eq!(out, "[REDACTED:custom]c[REDACTED:custom]");
        assert_eq!(counts.total, 2);
    }

    #[test]
    fn the_longest_match_wins_at_the_same_start() {
        let (out, _) = redact(&["AKIA", "builtin:aws_access_key"], "AKIAIOSFODNN7EXAMPLE!");
        assert_eq!(out, "[REDACTED:aws_access_key]!");
        let (out, _) = redact(
            &["builtin:aws_access_key", "AKIA[A-Z0-9]{16}!"],
            "AKIAIOSFODNN7EXAMPLE!",
        );
        assert_eq!(out, "[REDACTED:custom]");
    }

    #[test]
    fn equal_matches_are_named_by_the_rule_listed_first() {
        let input = "AKIAIOSFODNN7EXAMPLE";
        let (out, _) = redact(&["AKIA[A-Z0-9]{16}", "builtin:aws_access_key"], input);
        assert_eq!(out, "[REDACTED:custom]");
        let (out, _) = redact(&["builtin:aws_access_key", "AKIA[A-Z0-9]{16}"], input);
        assert_eq!(out, "[REDACTED:aws_access_key]");
    }

    #[test]
    fn an_empty_rule_list_passes_input_through_untouched() {
        let r = compile(&[]).unwrap();
        assert!(r.is_empty());
        let (out, counts) = r.redact(b"AKIAIOSFODNN7EXAMPLE");
        assert!(matches!(out, Cow::Borrowed(_)));
        assert!(counts.is_empty());
        let mut s = r.stream();
        let mut out = Vec::new();
        s.push(b"bob@example.org", &mut out);
        assert_eq!(out, b"bob@example.org", "no buffering without rules");
        assert!(s.finish(&mut out).is_empty());
    }

    #[test]
    fn one_shot_borrows_when_nothing_matches() {
        let r = compile(&["builtin:email"]).unwrap();
        assert!(matches!(r.redact(b"nothing here").0, Cow::Borrowed(_)));
        assert!(matches!(r.redact(b"a@b.io").0, Cow::Owned(_)));
        assert!(matches!(r.redact_str("nothing").0, Cow::Borrowed(_)));
        assert_eq!(r.redact_str("é a@b.io é").0, "é [REDACTED:email] é");
    }

    #[test]
    fn unknown_builtins_are_refused_with_the_list_of_valid_ones() {
        let e = compile(&["builtin:email", "builtin:aws_key"]).unwrap_err();
        assert_eq!(
            e,
            RedactError::UnknownBuiltin {
                index: 1,
                rule: "builtin:aws_key".into()
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains("redaction rule 1 (\"builtin:aws_key\")"),
            "{msg}"
        );
        for name in BUILTIN_NAMES {
            assert!(msg.contains(&format!("builtin:{name}")), "{msg}");
        }
    }

    #[test]
    fn invalid_regexes_are_refused_naming_the_rule_and_the_problem() {
        let e = compile(&["ok+", "(unclosed"]).unwrap_err();
        let RedactError::InvalidRegex {
            index,
            rule,
            message,
        } = &e
        else {
            panic!("{e:?}");
        };
        assert_eq!((*index, rule.as_str()), (1, "(unclosed"));
        assert!(message.contains("unclosed group"), "{message}");
        assert!(e.to_string().contains("builtin:credit_card"));
    }

    #[test]
    fn custom_regexes_are_bounded_in_length_and_compiled_size() {
        let long = "a".repeat(MAX_PATTERN_LEN + 1);
        assert!(matches!(
            compile(&[&long]),
            Err(RedactError::PatternTooLong { index: 0, len, limit: MAX_PATTERN_LEN, .. }) if len == MAX_PATTERN_LEN + 1
        ));
        assert!(matches!(
            compile(&[r"\w{500}"]),
            Err(RedactError::RegexTooLarge {
                index: 0,
                limit: MAX_REGEX_BYTES,
                ..
            })
        ));
        assert!(
            compile(&[r"(?-u)\w{500}"]).is_ok(),
            "ASCII classes are small"
        );
    }

    #[test]
    fn regexes_that_match_the_empty_string_are_refused() {
        for rule in ["", "a*", "(?:x)?"] {
            assert!(
                matches!(
                    compile(&[rule]),
                    Err(RedactError::MatchesEmpty { index: 0, .. })
                ),
                "{rule:?}"
            );
        }
    }

    #[test]
    fn the_rule_count_is_bounded_after_dropping_duplicates() {
        let distinct: Vec<String> = (0..=MAX_RULES).map(|i| format!("x{i}y")).collect();
        assert_eq!(
            Redactor::compile(&distinct).unwrap_err(),
            RedactError::TooManyRules {
                count: MAX_RULES + 1,
                limit: MAX_RULES
            }
        );
        let mut with_dups = distinct[..MAX_RULES].to_vec();
        with_dups.extend_from_slice(&distinct[..10]);
        assert_eq!(
            Redactor::compile(&with_dups).unwrap().rules().len(),
            MAX_RULES
        );
    }

    #[test]
    fn counts_serialize_as_a_total_and_sorted_rule_names() {
        let (_, counts) = redact(
            &["builtin:email", "x+y", "builtin:aws_access_key"],
            "xy a@b.io AKIAIOSFODNN7EXAMPLE c@d.io",
        );
        let json = serde_json::to_string(&counts).unwrap();
        assert_eq!(
            json,
            r#"{"total":4,"by_rule":{"aws_access_key":1,"custom":1,"email":2}}"#
        );
        assert_eq!(serde_json::from_str::<RedactCounts>(&json).unwrap(), counts);
        let mut sum = counts.clone();
        sum.add(&counts);
        assert_eq!((sum.total, sum.get("email")), (8, 4));
    }

    #[test]
    fn union_keeps_first_seen_order_and_drops_duplicates() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            union(
                &s(&["builtin:email", "a+", "builtin:email"]),
                &s(&["b+", "a+", "builtin:private_key"])
            ),
            s(&["builtin:email", "a+", "b+", "builtin:private_key"])
        );
        assert!(union(&[], &[]).is_empty());
    }
}
