//! Where payloads appear to scripts: the one place the sandbox's mount
//! point is spelled. A payload is at `/payloads/<name>` (its name is unique
//! in its session and never looks like a payload ID) and at
//! `/payloads/<id>`. Notices, `Payload.path` and the sandbox's links all
//! come from here, so they agree.

/// The read-only directory that holds a script's inputs.
pub const MOUNT: &str = "/payloads";

/// Where a payload named `name` appears to a script.
pub fn guest_path(name: &str) -> String {
    format!("{MOUNT}/{name}")
}

/// Whether `name` could be mistaken for a payload ID (`pl_` and 32 hex
/// digits): such a name would shadow that payload's `/payloads/<id>` link,
/// so the store never gives one.
pub fn looks_like_id(name: &str) -> bool {
    name.strip_prefix("pl_")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_of_the_id_shape_look_like_ids() {
        assert!(looks_like_id(&format!("pl_{}", "ab12".repeat(8))));
        assert!(!looks_like_id("pl_short"));
        assert!(!looks_like_id(&format!("pl_{}.json", "ab12".repeat(8))));
        assert_eq!(guest_path("prs.json"), "/payloads/prs.json");
    }
}
