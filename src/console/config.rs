//! The `[console]` section of the server configuration.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where the console listens in dev mode when `console.listen` is not set.
pub const DEV_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 50052);

/// The `[console]` section: the compliance console, a web front door over
/// the same service layer as gRPC.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Address the console listens on. Unset: `127.0.0.1:50052` in dev
    /// mode, off otherwise.
    pub listen: Option<SocketAddr>,
    /// `false` turns the console off, dev mode included (default: on when
    /// it has an address).
    pub enabled: bool,
    /// Longest life of a signed-in console session, however active
    /// (default 8 h).
    #[serde(with = "humantime_serde")]
    pub session_lifetime: Duration,
    /// A console session unused for this long ends (default 30 min).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Most signed-in console sessions at once (default 1000); one more
    /// sign-in is refused until one ends.
    pub max_sessions: usize,
    /// Largest request body the console reads (default 64 KiB).
    pub max_body_bytes: usize,
    /// Longest time one page may take (default 30 s).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Sessions the overview reads at most to draw its charts
    /// (default 20 000).
    pub overview_max_sessions: usize,
    /// Sets `Secure` on the cookie, for a console behind a TLS-terminating
    /// proxy; also required to listen on a non-loopback address.
    pub secure_cookie: bool,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            listen: None,
            enabled: true,
            session_lifetime: Duration::from_secs(8 * 3600),
            idle_timeout: Duration::from_secs(30 * 60),
            max_sessions: 1000,
            max_body_bytes: 64 << 10,
            request_timeout: Duration::from_secs(30),
            overview_max_sessions: 20_000,
            secure_cookie: false,
        }
    }
}

impl ConsoleConfig {
    /// Where the console listens, if anywhere.
    pub fn address(&self, dev_mode: bool) -> Option<SocketAddr> {
        if !self.enabled {
            return None;
        }
        self.listen.or(dev_mode.then_some(DEV_LISTEN))
    }

    /// Checks the section against the rest of the configuration; the
    /// message names the key to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.session_lifetime.is_zero() || self.idle_timeout.is_zero() {
            return Err(
                "console.session_lifetime and console.idle_timeout must be greater than zero"
                    .into(),
            );
        }
        for (key, v) in [
            ("console.max_sessions", self.max_sessions),
            ("console.max_body_bytes", self.max_body_bytes),
            ("console.overview_max_sessions", self.overview_max_sessions),
        ] {
            if v == 0 {
                return Err(format!("{key} must be greater than zero"));
            }
        }
        if let Some(addr) = self.listen
            && self.enabled
            && !addr.ip().is_loopback()
            && !self.secure_cookie
        {
            return Err(format!(
                "console.listen = {addr} is not loopback, and the console speaks plain HTTP: put it behind a TLS-terminating proxy and set console.secure_cookie = true, or listen on 127.0.0.1"
            ));
        }
        Ok(())
    }
}
