//! Typed, unguessable identifiers: a type prefix plus 128 random bits in
//! lowercase hex (`ses_…`, `pl_…`, `rcpt_…`).
//!
//! Parsing is strict, so a malformed ID is rejected before it reaches the
//! store, and every ID is safe to use as a file or directory name.

use std::fmt;

/// Number of hex digits after the prefix (128 bits).
const HEX_LEN: usize = 32;

/// Why a string is not a valid ID of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "malformed {kind} ID {shown:?}: expected \"{prefix}\" followed by 32 lowercase hex digits{hint}"
)]
pub struct IdError {
    kind: &'static str,
    prefix: &'static str,
    shown: String,
    hint: &'static str,
}

/// What to do next when an ID names nothing the caller can see, by kind
/// ("session", "payload"): appended to "KIND ID not found".
pub fn not_found_next(kind: &str) -> &'static str {
    match kind {
        "payload" => {
            "; check the ID against ListPayloads (spillway ls --session S), which lists the payloads you can read, or store the data again"
        }
        "session" => {
            "; check the ID against ListSessions, which lists the sessions you can use, or start a new one with CreateSession"
        }
        _ => "; check the ID",
    }
}

/// A recall key (`<<ccr:KEY>>` or its 16 hex digits) given where an ID
/// belongs.
fn recall_key_hint(s: &str) -> &'static str {
    let t = s.trim();
    let bare = t.trim_start_matches("<<ccr:").trim_end_matches(">>");
    let is_key = bare.len() == 16 && bare.bytes().all(|b| b.is_ascii_hexdigit());
    if t.starts_with("<<ccr:") || is_key {
        "; that is a recall key from a <<ccr:KEY>> marker, not an ID: pass it to Recall (spillway_recall, or `spillway context recall`), which returns the archived result whole"
    } else {
        ""
    }
}

fn random_hex() -> String {
    let mut bytes = [0u8; HEX_LEN / 2];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    hex::encode(bytes)
}

fn parse(s: &str, kind: &'static str, prefix: &'static str) -> Result<String, IdError> {
    let valid = s.strip_prefix(prefix).is_some_and(|rest| {
        rest.len() == HEX_LEN && rest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    });
    if valid {
        Ok(s.to_owned())
    } else {
        // Never echo an unbounded string back into an error message.
        let shown: String = s.chars().take(80).collect();
        Err(IdError {
            kind,
            prefix,
            hint: recall_key_hint(s),
            shown,
        })
    }
}

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::parse(&s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl $name {
            /// The type prefix, including the underscore.
            pub const PREFIX: &'static str = $prefix;

            /// A fresh random ID.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, random_hex()))
            }

            /// Parses and validates an ID received from outside.
            pub fn parse(s: &str) -> Result<Self, IdError> {
                parse(s, $kind, $prefix).map(Self)
            }

            /// The ID as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::parse(s)
            }
        }
    };
}

typed_id!(
    /// Identifies a session.
    SessionId,
    "session",
    "ses_"
);
typed_id!(
    /// Identifies a stored payload.
    PayloadId,
    "payload",
    "pl_"
);
typed_id!(
    /// Identifies a deletion receipt.
    ReceiptId,
    "receipt",
    "rcpt_"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_round_trip_and_differ() {
        let a = SessionId::generate();
        let b = SessionId::generate();
        assert_ne!(a, b);
        assert_eq!(SessionId::parse(a.as_str()).unwrap(), a);
        assert!(a.as_str().starts_with("ses_"));
        assert_eq!(a.as_str().len(), 4 + 32);
    }

    #[test]
    fn rejects_wrong_prefix_length_case_and_path_tricks() {
        let good = PayloadId::generate();
        assert!(SessionId::parse(good.as_str()).is_err());
        assert!(PayloadId::parse(&good.as_str().to_uppercase()).is_err());
        assert!(PayloadId::parse(&good.as_str()[..20]).is_err());
        assert!(PayloadId::parse("pl_../../../../etc/passwd0000000000").is_err());
        assert!(PayloadId::parse("").is_err());
        let err = ReceiptId::parse("rcpt_nope").unwrap_err().to_string();
        assert!(err.contains("rcpt_"), "{err}");
    }

    /// A `<<ccr:…>>` marker pasted into Read gets pointed at Recall.
    #[test]
    fn a_recall_key_given_as_an_id_is_pointed_at_recall() {
        let err = PayloadId::parse("<<ccr:0123456789abcdef>>")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "malformed payload ID \"<<ccr:0123456789abcdef>>\": expected \"pl_\" followed by 32 lowercase hex digits; that is a recall key from a <<ccr:KEY>> marker, not an ID: pass it to Recall (spillway_recall, or `spillway context recall`), which returns the archived result whole"
        );
        assert!(
            PayloadId::parse("0123456789abcdef")
                .unwrap_err()
                .to_string()
                .contains("pass it to Recall")
        );
        assert!(
            !PayloadId::parse("pl_nope")
                .unwrap_err()
                .to_string()
                .contains("Recall")
        );
    }
}
