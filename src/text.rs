//! Numbers in words for notices, previews and structures: grouped digits
//! and counted nouns. A leaf: depends on nothing else in the crate.

/// `1 line`, `2 lines`, with grouped digits.
pub fn count_of(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{} {noun}s", group(n))
    }
}

/// `48210` → `48 210`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// A content type's essence: its media type without parameters, in lower
/// case (`Application/JSON; charset=utf-8` is `application/json`).
pub fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The value that `s` names in `names`; or, for the setting `what`, an
/// error that lists the names (`what "x" is not one of a, b`).
pub fn one_of<T: Copy>(what: &str, s: &str, names: &[(&str, T)]) -> Result<T, String> {
    match names.iter().find(|(name, _)| *name == s) {
        Some((_, value)) => Ok(*value),
        None => {
            let all: Vec<&str> = names.iter().map(|(name, _)| *name).collect();
            Err(format!("{what} {s:?} is not one of {}", all.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits_with_spaces() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(48_210), "48 210");
        assert_eq!(group(1_234_567), "1 234 567");
    }

    #[test]
    fn one_is_singular_and_others_are_plural_with_grouped_digits() {
        assert_eq!(count_of(1, "line"), "1 line");
        assert_eq!(count_of(0, "line"), "0 lines");
        assert_eq!(count_of(48_210, "byte"), "48 210 bytes");
    }
}
