//! Structured logs through `tracing`, filtered by `RUST_LOG` (default
//! `info`), written to stderr. Logs carry IDs, sizes and hashes, never
//! payload content, tokens or host paths.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Safe to call more than once.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
