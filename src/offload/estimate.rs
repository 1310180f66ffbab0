//! Token estimates: `chars / 4` (the default), or exact counts with the
//! `o200k` and `cl100k` vocabularies that tiktoken-rs ships. An exact count
//! stops early when `bytes / 8` already reaches the threshold in question:
//! such a result is over however it tokenizes, so megabytes are never
//! tokenized just to learn that they are big.

use std::fmt;
use std::str::FromStr;

/// How tokens are estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Estimator {
    /// Unicode scalars / 4, rounded up.
    #[default]
    Chars4,
    /// OpenAI's o200k_base vocabulary.
    O200k,
    /// OpenAI's cl100k_base vocabulary.
    Cl100k,
}

impl FromStr for Estimator {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let names = [
            ("chars4", Estimator::Chars4),
            ("o200k", Estimator::O200k),
            ("cl100k", Estimator::Cl100k),
        ];
        crate::text::one_of("estimator", s, &names)
    }
}

impl fmt::Display for Estimator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Estimator::Chars4 => "chars4",
            Estimator::O200k => "o200k",
            Estimator::Cl100k => "cl100k",
        })
    }
}

/// Most bytes an exact estimator tokenizes; past this the estimate is the
/// `bytes / 8` lower bound.
pub const MAX_TOKENIZED_BYTES: usize = 1 << 20;
/// Text is tokenized in pieces of at most this many bytes (cut at char
/// boundaries): BPE cost grows with the square of a piece's length, so an
/// adversarial run of letters must not become one huge piece. A cut can
/// split one token in two, so counts may be high by one per piece.
const TOKENIZE_PIECE: usize = 1024;

/// An estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// Tokens.
    pub tokens: u64,
    /// True when `tokens` is only a lower bound (the exact count stopped early).
    pub lower_bound: bool,
}

/// Unicode scalars of possibly invalid UTF-8 (bytes when invalid).
pub fn chars(content: &[u8]) -> u64 {
    if std::str::from_utf8(content).is_ok() {
        bytecount::num_chars(content) as u64
    } else {
        content.len() as u64
    }
}

/// Estimates `content`. `threshold` is the smallest threshold the answer
/// will be compared with; exact estimators stop once it is clearly reached.
pub fn estimate(content: &[u8], estimator: Estimator, threshold: u64) -> Estimate {
    let exact = |bpe: &tiktoken_rs::CoreBPE| {
        let lower = (content.len() as u64) / 8;
        if lower >= threshold || content.len() > MAX_TOKENIZED_BYTES {
            return Estimate {
                tokens: lower,
                lower_bound: true,
            };
        }
        let text = String::from_utf8_lossy(content);
        let mut tokens = 0u64;
        let mut rest: &str = &text;
        while !rest.is_empty() {
            let mut cut = rest.len().min(TOKENIZE_PIECE);
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            tokens += bpe.count_ordinary(&rest[..cut]) as u64;
            rest = &rest[cut..];
        }
        Estimate {
            tokens,
            lower_bound: false,
        }
    };
    match estimator {
        Estimator::Chars4 => Estimate {
            tokens: chars(content).div_ceil(4),
            lower_bound: false,
        },
        Estimator::O200k => exact(tiktoken_rs::o200k_base_singleton()),
        Estimator::Cl100k => exact(tiktoken_rs::cl100k_base_singleton()),
    }
}

/// Tokens of a text the server wrote itself (notices).
pub fn estimate_text(text: &str, estimator: Estimator) -> u64 {
    estimate(text.as_bytes(), estimator, u64::MAX).tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chars4_counts_unicode_scalars_rounded_up() {
        assert_eq!(estimate(b"", Estimator::Chars4, 10).tokens, 0);
        assert_eq!(estimate(b"abcde", Estimator::Chars4, 10).tokens, 2);
        assert_eq!(
            estimate("🌍🌍🌍🌍".as_bytes(), Estimator::Chars4, 10).tokens,
            1
        );
        assert_eq!(estimate(&[0xff; 9], Estimator::Chars4, 10).tokens, 3);
    }

    #[test]
    fn exact_estimators_count_tokens_of_small_inputs() {
        let e = estimate(b"hello world", Estimator::O200k, 6000);
        assert_eq!(
            e,
            Estimate {
                tokens: 2,
                lower_bound: false
            }
        );
        assert_eq!(estimate(b"hello world", Estimator::Cl100k, 6000).tokens, 2);
    }

    #[test]
    fn exact_estimators_stop_early_on_clearly_large_inputs() {
        let big = vec![b'a'; 8 * 6000];
        let e = estimate(&big, Estimator::O200k, 6000);
        assert_eq!(
            e,
            Estimate {
                tokens: 6000,
                lower_bound: true
            }
        );
    }

    #[test]
    fn exact_estimates_stay_bounded_on_adversarial_text() {
        // One 900 KB run of letters is tokenized in bounded pieces.
        let run = vec![b'q'; 900_000];
        let e = estimate(&run, Estimator::O200k, u64::MAX);
        assert!(!e.lower_bound && e.tokens > 0);
        let huge = vec![b'a'; MAX_TOKENIZED_BYTES + 1];
        assert!(estimate(&huge, Estimator::Cl100k, u64::MAX).lower_bound);
    }

    #[test]
    fn parses_names() {
        assert_eq!("o200k".parse::<Estimator>(), Ok(Estimator::O200k));
        assert!("gpt".parse::<Estimator>().unwrap_err().contains("chars4"));
    }
}
