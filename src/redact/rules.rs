//! The rules: the built-ins, custom regexes, and how one rule finds its next
//! match in a haystack.
//!
//! The built-ins are ASCII-only (`(?-u)`), so their word boundaries and
//! classes look at single bytes and never need more than one byte of context.
//! Three are plain regexes. `private_key` is a BEGIN-line regex followed by
//! an END-line regex, which equals `begin(?s:.)*?end` (a test checks it)
//! without the engine scanning back over the lazy middle on every search.
//! `credit_card` is matched by hand ([`card`]).

use std::ops::Range;
use std::sync::LazyLock;

use regex::bytes::{Regex, RegexBuilder};

use super::{RedactError, card};

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

/// How a rule finds matches.
#[derive(Debug, Clone)]
enum Matcher {
    /// Every non-empty regex match.
    Regex(Regex),
    /// A `begin` match, then everything up to the end of the first `end`
    /// match after it: `begin(?s:.)*?end`, without the regex engine's cost
    /// of scanning back over the lazy middle to find where a match starts.
    Block { begin: Regex, end: Regex },
    /// Card numbers ([`card`]).
    Card,
}

const PEM_BEGIN: &str = r"(?-u)-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----";
const PEM_END: &str = r"(?-u)-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----";

/// The built-in names, in the order the error messages list them.
pub const BUILTIN_NAMES: [&str; 5] = [
    "aws_access_key",
    "bearer_token",
    "private_key",
    "email",
    "credit_card",
];

/// The built-ins, compiled once per process (a `Regex` clone shares its
/// compiled form), in the order of [`BUILTIN_NAMES`].
static BUILTINS: LazyLock<[Matcher; 5]> = LazyLock::new(|| {
    let re = |pattern: &str| Regex::new(pattern).expect("built-in patterns compile");
    [
        Matcher::Regex(re(
            r"(?-u)\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}\b",
        )),
        Matcher::Regex(re(r"(?-u)\b(?i:bearer)[ \t]+[A-Za-z0-9._~+/-]{16,}=*")),
        Matcher::Block {
            begin: re(PEM_BEGIN),
            end: re(PEM_END),
        },
        Matcher::Regex(re(
            r"(?-u)[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
        )),
        Matcher::Card,
    ]
});

/// One compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    /// `aws_access_key`, …, or [`CUSTOM`].
    pub name: &'static str,
    /// `[REDACTED:<name>]`.
    pub marker: Box<[u8]>,
    matcher: Matcher,
}

impl Rule {
    /// Compiles rule number `index` of a policy's list.
    pub fn compile(index: usize, source: &str) -> Result<Rule, RedactError> {
        if let Some(name) = source.strip_prefix(BUILTIN_PREFIX) {
            let Some(i) = BUILTIN_NAMES.iter().position(|n| *n == name) else {
                return Err(RedactError::UnknownBuiltin {
                    index,
                    rule: clip(source),
                });
            };
            return Ok(Rule::new(BUILTIN_NAMES[i], BUILTINS[i].clone()));
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
        Ok(Rule::new(CUSTOM, Matcher::Regex(re)))
    }

    fn new(name: &'static str, matcher: Matcher) -> Rule {
        let marker = format!("[REDACTED:{name}]").into_bytes().into_boxed_slice();
        Rule {
            name,
            marker,
            matcher,
        }
    }

    /// The leftmost non-empty match that starts at or after `from`, as the
    /// rule chooses it at that start. Bytes before `from` are look-behind
    /// context only.
    pub fn find(&self, hay: &[u8], from: usize) -> Option<Range<usize>> {
        match &self.matcher {
            Matcher::Regex(re) => {
                let mut from = from;
                while from <= hay.len() {
                    let m = re.find_at(hay, from)?;
                    if !m.is_empty() {
                        return Some(m.range());
                    }
                    from = m.start() + 1;
                }
                None
            }
            Matcher::Block { begin, end } => {
                let b = begin.find_at(hay, from)?;
                let e = end.find_at(hay, b.end())?;
                Some(b.start()..e.end())
            }
            Matcher::Card => card::find(hay, from),
        }
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

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    #[test]
    fn every_builtin_compiles() {
        for (i, name) in BUILTIN_NAMES.iter().enumerate() {
            let rule = Rule::compile(i, &format!("{BUILTIN_PREFIX}{name}")).unwrap();
            assert_eq!(rule.name, *name);
            assert_eq!(&rule.marker[..], format!("[REDACTED:{name}]").as_bytes());
        }
    }

    #[test]
    fn key_blocks_match_as_the_lazy_regex_would() {
        let lazy = Regex::new(&format!("{PEM_BEGIN}(?s:.)*?{PEM_END}")).unwrap();
        let rule = Rule::compile(0, "builtin:private_key").unwrap();
        let pieces: [&[u8]; 8] = [
            b"-----BEGIN RSA PRIVATE KEY-----",
            b"-----END RSA PRIVATE KEY-----",
            b"-----BEGIN PGP PRIVATE KEY BLOCK-----",
            b"-----END PGP PRIVATE KEY BLOCK-----",
            b"-----BEGIN PUBLIC KEY-----",
            b"MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu\n",
            b"-----END ",
            b"\xff\n",
        ];
        let mut rng = StdRng::seed_from_u64(3);
        let mut found = 0;
        for _ in 0..3000 {
            let mut hay = Vec::new();
            for _ in 0..rng.random_range(0..10) {
                hay.extend_from_slice(pieces[rng.random_range(0..pieces.len())]);
            }
            let from = rng.random_range(0..=hay.len());
            found += super::super::agrees(
                &hay,
                from,
                |h, f| rule.find(h, f),
                |h, f| lazy.find_at(h, f).map(|m| m.range()),
            );
        }
        assert!(found > 200, "{found}");
    }

    #[test]
    fn long_rules_are_clipped_in_messages_on_a_char_boundary() {
        let long = "é".repeat(100);
        let c = clip(&long);
        assert!(c.ends_with('…'));
        assert!(c.len() <= 124);
    }
}
