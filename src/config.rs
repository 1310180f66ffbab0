//! Server configuration: one typed tree, documented defaults, and a loader
//! with a fixed precedence.
//!
//! Precedence, strongest first: command-line flags, then `SPILLWAY_*`
//! environment variables, then the TOML file given with `--config`, then the
//! defaults below. Unknown keys are an error that names the key, wherever
//! they come from.
//!
//! Environment variables map onto keys by upper-casing the key path and
//! joining sections with a double underscore: `SPILLWAY_LISTEN`,
//! `SPILLWAY_DATA_DIR`, `SPILLWAY_STORE__ENGINE`,
//! `SPILLWAY_LIMITS__MAX_PAYLOAD_BYTES`. The client's own variables
//! (`SPILLWAY_ADDR`, `SPILLWAY_TOKEN`), `SPILLWAY_CONFIG`, the crash-test
//! point `SPILLWAY_CRASH_AT` ([`crate::faults`]) and the profiling switch
//! `SPILLWAY_WASM_PERF_MAP` ([`crate::sandbox::PERF_MAP_ENV`]) are not keys.
//! The loader takes the environment as an argument, so tests never touch the
//! process environment.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::auth::TokenConfig;
pub use crate::policy::PolicyDefaults;
pub use crate::store::{EngineKind, StoreConfig};
pub use crate::tls::TlsConfig;

/// The current configuration format version.
pub const CONFIG_VERSION: u32 = 1;

/// Environment variables that start with `SPILLWAY_` but are not config keys.
const NON_KEY_ENV: &[&str] = &[
    "SPILLWAY_ADDR",
    "SPILLWAY_TOKEN",
    "SPILLWAY_CONFIG",
    crate::faults::ENV,
    crate::sandbox::PERF_MAP_ENV,
];

/// Everything `spillway serve` can be told.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Format version of this file; only `1` exists.
    pub version: u32,
    /// Address the gRPC server listens on.
    pub listen: SocketAddr,
    /// Root of all state: the metadata store, the session directories, the
    /// dev token.
    pub data_dir: PathBuf,
    /// Bearer tokens and the principals they stand for.
    pub auth: AuthConfig,
    /// Optional TLS and mutual TLS.
    pub tls: TlsConfig,
    /// The metadata store.
    pub store: StoreConfig,
    /// Size and concurrency limits.
    pub limits: Limits,
    /// The server-wide default policy for sessions.
    pub policy: PolicyDefaults,
    /// Offload thresholds, estimator and previews.
    pub offload: crate::offload::OffloadConfig,
    /// Code mode: images, concurrency and per-exec caps.
    pub sandbox: crate::sandbox::SandboxConfig,
    /// The background deletion of what has expired.
    pub reaper: crate::reaper::ReaperConfig,
    /// The compliance console (see [`crate::console`]).
    pub console: ConsoleConfig,
    /// The Prometheus endpoint (`[metrics]`).
    pub metrics: crate::metrics::MetricsConfig,
    /// How long shutdown waits for in-flight calls before giving up on them.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            version: CONFIG_VERSION,
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            data_dir: PathBuf::from("./spillway-data"),
            auth: AuthConfig::default(),
            tls: TlsConfig::default(),
            store: StoreConfig::default(),
            limits: Limits::default(),
            policy: PolicyDefaults::default(),
            offload: crate::offload::OffloadConfig::default(),
            sandbox: crate::sandbox::SandboxConfig::default(),
            reaper: crate::reaper::ReaperConfig::default(),
            console: ConsoleConfig::default(),
            metrics: crate::metrics::MetricsConfig::default(),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// The `[auth]` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `[[auth.tokens]]` entries. When empty, the server runs in dev mode:
    /// it makes one random admin token, writes it to `<data_dir>/dev-token`,
    /// and listens on loopback only.
    pub tokens: Vec<TokenConfig>,
}

/// The `[limits]` section. Every bound the server enforces lives here.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest payload one Upload may store (default 1 GiB).
    pub max_payload_bytes: u64,
    /// Largest single gRPC message the server accepts, unary request or one
    /// streamed chunk (default 4 MiB). Larger messages get
    /// `RESOURCE_EXHAUSTED`; bulk bytes belong in Upload chunks.
    pub max_request_message_bytes: usize,
    /// Largest Offload request (default 64 MiB): a whole turn of tool
    /// results arrives in one message. Larger turns get `RESOURCE_EXHAUSTED`.
    /// Context requests and replies (whole histories) share this limit.
    pub max_offload_request_bytes: usize,
    /// Largest single gRPC message the server sends (default 8 MiB).
    pub max_response_message_bytes: usize,
    /// Bytes a Read returns when the request names no `max_bytes`
    /// (default 64 KiB).
    pub read_default_bytes: u64,
    /// Ceiling on a Read's `max_bytes` (default 4 MiB); larger asks are
    /// clamped to it.
    pub read_max_bytes: u64,
    /// Size of the chunks Download streams (default 1 MiB).
    pub download_chunk_bytes: usize,
    /// Uploads in progress at once, server-wide (default 512). One more gets
    /// `RESOURCE_EXHAUSTED`.
    pub max_concurrent_uploads: usize,
    /// Uploads one tenant may have in progress at once (default 64); one
    /// more gets `RESOURCE_EXHAUSTED` naming this limit, and other tenants
    /// keep the rest of `max_concurrent_uploads`.
    pub max_concurrent_uploads_per_tenant: usize,
    /// Average bytes per second an upload must keep once
    /// `upload_rate_grace` has passed (default 1024; 0 turns it off): a
    /// trickle that is never idle long enough for `upload_idle_timeout`
    /// still ends.
    pub upload_min_bytes_per_sec: u64,
    /// Time an upload may take before `upload_min_bytes_per_sec` applies
    /// (default 30 s).
    #[serde(with = "humantime_serde")]
    pub upload_rate_grace: Duration,
    /// Searches running at once, server-wide (default 32). One more gets
    /// `RESOURCE_EXHAUSTED`.
    pub max_concurrent_searches: usize,
    /// Searches one tenant may run at once (default 8); one more gets
    /// `RESOURCE_EXHAUSTED` naming this limit, and other tenants keep the
    /// rest of `max_concurrent_searches`.
    pub max_concurrent_searches_per_tenant: usize,
    /// Inspects running at once, server-wide (default 16; a cached
    /// structure still takes a slot while it is looked up).
    pub max_concurrent_inspects: usize,
    /// Inspects one tenant may run at once (default 4).
    pub max_concurrent_inspects_per_tenant: usize,
    /// Longest a Search or Inspect waits for a slot before it is refused
    /// (default 5 s): a burst takes turns, a tenant that keeps its slots
    /// busy longer is told its limit. At most as many calls wait as there
    /// are slots in all; the next is refused at once.
    #[serde(with = "humantime_serde")]
    pub slot_wait: Duration,
    /// Concurrent streams per HTTP/2 connection (default 256).
    pub max_concurrent_streams: u32,
    /// Largest page a List call returns (default 1000).
    pub max_page_size: u32,
    /// Wall-time limit of one Search call (default 10 s); past it, the
    /// matches found so far come back with `truncated` set.
    #[serde(with = "humantime_serde")]
    pub search_timeout: Duration,
    /// Ceiling on a Search's `max_matches` (default 10 000).
    pub max_search_matches: u32,
    /// Longest wait for the next chunk of an upload (default 60 s); a
    /// stalled upload is then abandoned, and nothing of it is kept.
    #[serde(with = "humantime_serde")]
    pub upload_idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 1 << 30,
            max_request_message_bytes: 4 << 20,
            max_offload_request_bytes: 64 << 20,
            max_response_message_bytes: 8 << 20,
            read_default_bytes: 64 << 10,
            read_max_bytes: 4 << 20,
            download_chunk_bytes: 1 << 20,
            max_concurrent_uploads: 512,
            max_concurrent_uploads_per_tenant: 64,
            upload_min_bytes_per_sec: 1024,
            upload_rate_grace: Duration::from_secs(30),
            max_concurrent_searches: 32,
            max_concurrent_searches_per_tenant: 8,
            max_concurrent_inspects: 16,
            max_concurrent_inspects_per_tenant: 4,
            slot_wait: Duration::from_secs(5),
            max_concurrent_streams: 256,
            max_page_size: 1000,
            search_timeout: Duration::from_secs(10),
            max_search_matches: 10_000,
            upload_idle_timeout: Duration::from_secs(60),
        }
    }
}

/// What the command line said; `None` leaves the decision to lower layers.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<String>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--engine`.
    pub engine: Option<EngineKind>,
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// An environment variable does not name a config key.
    #[error("environment variable {var} does not name a config key: {message}")]
    Env {
        /// The variable.
        var: String,
        /// Why.
        message: String,
    },
    /// The merged tree does not fit the schema: an unknown key or a wrong type.
    #[error("invalid configuration: {0}")]
    Schema(String),
    /// The values are individually fine but do not make sense together.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Loads the configuration with the documented precedence.
    pub fn load(
        file: Option<&Path>,
        env: &BTreeMap<String, String>,
        flags: &Overrides,
    ) -> Result<Self, ConfigError> {
        let mut tree = match file {
            Some(path) => read_file(path)?,
            None => toml::Table::new(),
        };
        let env_keys = apply_env(&mut tree, env)?;
        if let Some(listen) = &flags.listen {
            tree.insert("listen".into(), toml::Value::String(listen.clone()));
        }
        if let Some(dir) = &flags.data_dir {
            tree.insert(
                "data_dir".into(),
                toml::Value::String(dir.display().to_string()),
            );
        }
        if let Some(engine) = flags.engine {
            set_path(
                &mut tree,
                &["store", "engine"],
                toml::Value::String(engine.name().into()),
            );
        }
        let config: Config =
            toml::Value::Table(tree)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    let mut message = e.message().to_owned();
                    // Say where an env-made key came from, so it can be found.
                    if let Some((var, _)) = env_keys
                        .iter()
                        .find(|(_, key)| message.contains(&format!("`{key}`")))
                    {
                        message.push_str(&format!(" (from environment variable {var})"));
                    }
                    ConfigError::Schema(message)
                })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the rules that span several keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.version != CONFIG_VERSION {
            return Err(ConfigError::Invalid(format!(
                "version = {} is not supported; this server reads version = {CONFIG_VERSION}",
                self.version
            )));
        }
        match (&self.tls.cert, &self.tls.key) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(ConfigError::Invalid(
                    "tls.cert and tls.key go together: give both to serve TLS, or neither".into(),
                ));
            }
            (None, None) if self.tls.client_ca.is_some() => {
                return Err(ConfigError::Invalid(
                    "tls.client_ca needs tls.cert and tls.key: client certificates are checked only on a TLS listener".into(),
                ));
            }
            _ => {}
        }
        if self.store.engine == crate::store::EngineKind::Postgres
            && self.store.postgres_url.trim().is_empty()
        {
            return Err(ConfigError::Invalid(
                "store.engine = \"postgres\" needs store.postgres_url (postgres://user:password@host:port/db)".into(),
            ));
        }
        if let Err(e) = crate::redact::Redactor::compile(&self.policy.redact) {
            return Err(ConfigError::Invalid(format!("policy.redact: {e}")));
        }
        for (i, t) in self.auth.tokens.iter().enumerate() {
            match (&t.token, &t.token_sha256) {
                (Some(_), None) => {}
                (None, Some(h)) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {}
                (None, Some(_)) => {
                    return Err(ConfigError::Invalid(format!(
                        "auth.tokens[{i}].token_sha256 must be 64 hex digits"
                    )));
                }
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "auth.tokens[{i}] needs exactly one of token or token_sha256"
                    )));
                }
            }
            if t.principal.is_empty() || t.tenant.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "auth.tokens[{i}] needs a non-empty principal and tenant"
                )));
            }
            if t.roles.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "auth.tokens[{i}] grants no roles"
                )));
            }
        }
        let l = &self.limits;
        let positive = [
            ("limits.max_payload_bytes", l.max_payload_bytes),
            (
                "limits.max_request_message_bytes",
                l.max_request_message_bytes as u64,
            ),
            (
                "limits.max_response_message_bytes",
                l.max_response_message_bytes as u64,
            ),
            ("limits.read_default_bytes", l.read_default_bytes),
            ("limits.read_max_bytes", l.read_max_bytes),
            ("limits.download_chunk_bytes", l.download_chunk_bytes as u64),
            (
                "limits.max_concurrent_uploads",
                l.max_concurrent_uploads as u64,
            ),
            (
                "limits.max_concurrent_uploads_per_tenant",
                l.max_concurrent_uploads_per_tenant as u64,
            ),
            (
                "limits.max_concurrent_searches",
                l.max_concurrent_searches as u64,
            ),
            (
                "limits.max_concurrent_searches_per_tenant",
                l.max_concurrent_searches_per_tenant as u64,
            ),
            (
                "limits.max_concurrent_inspects",
                l.max_concurrent_inspects as u64,
            ),
            (
                "limits.max_concurrent_inspects_per_tenant",
                l.max_concurrent_inspects_per_tenant as u64,
            ),
            (
                "limits.max_concurrent_streams",
                u64::from(l.max_concurrent_streams),
            ),
            ("limits.max_page_size", u64::from(l.max_page_size)),
            ("limits.search_timeout", l.search_timeout.as_millis() as u64),
            ("limits.max_search_matches", u64::from(l.max_search_matches)),
            (
                "limits.upload_idle_timeout",
                l.upload_idle_timeout.as_millis() as u64,
            ),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::Invalid(format!(
                "{key} must be greater than zero"
            )));
        }
        if l.read_default_bytes > l.read_max_bytes {
            return Err(ConfigError::Invalid(
                "limits.read_default_bytes must not exceed limits.read_max_bytes".into(),
            ));
        }
        // A Read reply and a Download chunk must fit in one response message,
        // with room for the other fields.
        let reply_budget = l.max_response_message_bytes as u64 - 4096;
        if l.read_max_bytes > reply_budget || l.download_chunk_bytes as u64 > reply_budget {
            return Err(ConfigError::Invalid(
                "limits.read_max_bytes and limits.download_chunk_bytes must be at least 4 KiB below limits.max_response_message_bytes".into(),
            ));
        }
        self.offload.validate().map_err(ConfigError::Invalid)?;
        self.console.validate().map_err(ConfigError::Invalid)?;
        self.sandbox.validate().map_err(ConfigError::Invalid)?;
        Ok(())
    }

    /// True when no tokens are configured and the server makes its own.
    pub fn dev_mode(&self) -> bool {
        self.auth.tokens.is_empty()
    }
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

/// Applies `SPILLWAY_*` variables; returns each variable with the last
/// segment of the key it set.
fn apply_env(
    tree: &mut toml::Table,
    env: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut applied = Vec::new();
    for (var, raw) in env {
        let Some(rest) = var.strip_prefix("SPILLWAY_") else {
            continue;
        };
        if NON_KEY_ENV.contains(&var.as_str()) || rest.is_empty() {
            continue;
        }
        let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        if path.iter().any(String::is_empty) {
            return Err(ConfigError::Env {
                var: var.clone(),
                message: "empty path segment".into(),
            });
        }
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        set_path(tree, &refs, env_value(raw));
        applied.push((var.clone(), path.last().cloned().unwrap_or_default()));
    }
    Ok(applied)
}

/// Reads an environment value as a TOML scalar when it parses as one
/// (numbers, booleans), and as a string otherwise.
fn env_value(raw: &str) -> toml::Value {
    if let Ok(v) = raw.parse::<i64>() {
        return toml::Value::Integer(v);
    }
    match raw {
        "true" => toml::Value::Boolean(true),
        "false" => toml::Value::Boolean(false),
        _ => toml::Value::String(raw.to_owned()),
    }
}

fn set_path(tree: &mut toml::Table, path: &[&str], value: toml::Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = tree;
    for key in parents {
        let entry = node
            .entry((*key).to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        node = entry.as_table_mut().expect("just made a table");
    }
    node.insert((*last).to_owned(), value);
}

// ---- [console] -------------------------------------------------------------
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    /// An environment of these variables.
    fn vars(vars: &[(&str, &str)]) -> BTreeMap<String, String> {
        vars.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Why loading `file` with `env` and no flags fails.
    fn refusal(file: Option<&Path>, env: &BTreeMap<String, String>) -> String {
        Config::load(file, env, &Overrides::default())
            .unwrap_err()
            .to_string()
    }

    /// Why loading a file of `text` fails.
    fn file_refusal(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        refusal(Some(&write(&dir, text)), &BTreeMap::new())
    }

    /// Why loading these environment variables fails.
    fn env_refusal(env: &[(&str, &str)]) -> String {
        refusal(None, &vars(env))
    }

    fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("spillway.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn defaults_apply_when_nothing_is_given() {
        let c = Config::load(None, &BTreeMap::new(), &Overrides::default()).unwrap();
        assert_eq!(c, Config::default());
        assert!(c.dev_mode());
        assert_eq!(c.store.engine, EngineKind::Redb);
    }

    #[test]
    fn flags_beat_env_beat_file_beat_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            &dir,
            r#"
listen = "127.0.0.1:1111"
data_dir = "/from/file"
[store]
engine = "sled"
[limits]
max_payload_bytes = 10
[[auth.tokens]]
token = "s3cret"
principal = "agent-a"
tenant = "acme"
roles = ["agent"]
"#,
        );
        let env = vars(&[
            ("SPILLWAY_DATA_DIR", "/from/env"),
            ("SPILLWAY_LISTEN", "127.0.0.1:2222"),
            ("SPILLWAY_ADDR", "ignored:1"),
        ]);
        let flags = Overrides {
            listen: Some("127.0.0.1:3333".into()),
            ..Default::default()
        };
        let c = Config::load(Some(&file), &env, &flags).unwrap();
        assert_eq!(c.listen.port(), 3333);
        assert_eq!(c.data_dir, PathBuf::from("/from/env"));
        assert_eq!(c.store.engine, EngineKind::Sled);
        assert_eq!(c.limits.max_payload_bytes, 10);
        assert_eq!(c.limits.read_max_bytes, Limits::default().read_max_bytes);
        assert_eq!(c.auth.tokens[0].roles, vec![Role::Agent]);
    }

    #[test]
    fn the_perf_map_switch_is_not_read_as_a_config_key() {
        let env = vars(&[
            (crate::sandbox::PERF_MAP_ENV, "1"),
            ("SPILLWAY_LISTEN", "127.0.0.1:2222"),
        ]);
        let c = Config::load(None, &env, &Overrides::default()).unwrap();
        assert_eq!(c.listen.port(), 2222);
    }

    #[test]
    fn unknown_key_in_file_is_an_error_naming_it() {
        let err = file_refusal("[store]\nengnie = \"redb\"\n");
        assert!(err.contains("engnie"), "{err}");
    }

    #[test]
    fn unknown_env_key_is_an_error_naming_it() {
        let err = env_refusal(&[("SPILLWAY_LIMITS__MAX_BANANAS", "3")]);
        assert!(err.contains("max_bananas"), "{err}");
        assert!(err.contains("SPILLWAY_LIMITS__MAX_BANANAS"), "{err}");
    }

    #[test]
    fn env_reaches_nested_keys_with_typed_values() {
        let env = vars(&[
            ("SPILLWAY_STORE__ENGINE", "sled"),
            ("SPILLWAY_LIMITS__MAX_PAYLOAD_BYTES", "4096"),
        ]);
        let c = Config::load(None, &env, &Overrides::default()).unwrap();
        assert_eq!(c.store.engine, EngineKind::Sled);
        assert_eq!(c.limits.max_payload_bytes, 4096);
    }

    #[test]
    fn token_entries_need_exactly_one_secret_form() {
        let err = file_refusal(
            "[[auth.tokens]]\ntoken = \"a\"\ntoken_sha256 = \"00\"\nprincipal = \"p\"\ntenant = \"t\"\nroles = [\"agent\"]\n",
        );
        assert!(err.contains("exactly one"), "{err}");
    }

    #[test]
    fn tls_keys_come_from_file_and_env_and_cert_and_key_go_together() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(&dir, "[tls]\ncert = \"/etc/s/server.pem\"\n");
        let env = vars(&[("SPILLWAY_TLS__KEY", "/etc/s/server.key")]);
        let c = Config::load(Some(&file), &env, &Overrides::default()).unwrap();
        assert_eq!(c.tls.key.as_deref(), Some(Path::new("/etc/s/server.key")));
        assert!(c.tls.client_ca.is_none());
        let err = refusal(Some(&file), &BTreeMap::new());
        assert!(err.contains("tls.cert and tls.key"), "{err}");
        let err = env_refusal(&[("SPILLWAY_TLS__CLIENT_CA", "/etc/s/ca.pem")]);
        assert!(err.contains("tls.client_ca needs"), "{err}");
    }

    #[test]
    fn unknown_role_is_refused() {
        let err = file_refusal(
            "[[auth.tokens]]\ntoken = \"a\"\nprincipal = \"p\"\ntenant = \"t\"\nroles = [\"root\"]\n",
        );
        assert!(err.contains("root"), "{err}");
    }

    #[test]
    fn zero_limits_are_refused_by_name() {
        let err = env_refusal(&[("SPILLWAY_LIMITS__READ_MAX_BYTES", "0")]);
        assert!(err.contains("limits.read_max_bytes"), "{err}");
    }

    #[test]
    fn keep_resident_sizes_past_their_bound_are_refused_by_name() {
        let err = file_refusal(
            "version = 1\n[sandbox]\nmemory_keep_resident_bytes = 9223372036854775807\n",
        );
        assert!(err.contains("sandbox.memory_keep_resident_bytes"), "{err}");
        assert!(err.contains("1 GiB"), "{err}");
        let err = env_refusal(&[("SPILLWAY_SANDBOX__TABLE_KEEP_RESIDENT_BYTES", "2147483648")]);
        assert!(err.contains("sandbox.table_keep_resident_bytes"), "{err}");
        let at_bound = vars(&[("SPILLWAY_SANDBOX__MEMORY_KEEP_RESIDENT_BYTES", "1073741824")]);
        let c = Config::load(None, &at_bound, &Overrides::default()).unwrap();
        assert_eq!(c.sandbox.memory_keep_resident_bytes, 1 << 30);
    }

    #[test]
    fn the_kubernetes_config_map_is_a_valid_fleet_configuration() {
        let yaml = include_str!("../deploy/kubernetes/spillway.yaml");
        let start = yaml
            .find("spillway.toml: |\n")
            .expect("the ConfigMap's file")
            + 17;
        let toml_text: String = yaml[start..]
            .lines()
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("spillway.toml");
        std::fs::write(&file, &toml_text).unwrap();
        // The Secret supplies the database URL.
        let env = vars(&[(
            "SPILLWAY_STORE__POSTGRES_URL",
            "postgres://u:p@db:5432/spillway",
        )]);
        let c = Config::load(Some(&file), &env, &Overrides::default()).unwrap();
        assert_eq!(c.store.engine, EngineKind::Postgres);
        assert!(c.store.blobs.starts_with("s3://"));
        assert!(c.metrics.listen.is_some());
    }
}
