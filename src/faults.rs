//! Named crash points for crash tests of the real binary.
//!
//! `SPILLWAY_CRASH_AT=<point>` makes the process abort (as abruptly as
//! `kill -9`: no destructors, no flush) the first time it reaches that
//! point. Unset, as in every deployment, [`hit`] is one relaxed atomic
//! load after the first call. The points are listed where they are hit:
//! `deletion.after_intent`, `deletion.after_files`.

use std::sync::OnceLock;

/// The environment variable naming the crash point.
pub const ENV: &str = "SPILLWAY_CRASH_AT";

static POINT: OnceLock<Option<String>> = OnceLock::new();

/// Aborts the process if `point` is the configured crash point.
pub fn hit(point: &str) {
    let armed = POINT.get_or_init(|| std::env::var(ENV).ok().filter(|p| !p.is_empty()));
    if armed.as_deref() == Some(point) {
        eprintln!("{ENV}={point}: aborting the process here, as a crash test asked");
        std::process::abort();
    }
}
