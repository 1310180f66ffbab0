//! Connecting to a server: address and token resolution, including the dev
//! token discovery that makes a local dev server work with no setup.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

/// Where the client connects and who it says it is.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// `http://host:port`.
    pub endpoint: String,
    /// Bearer token.
    pub token: String,
}

/// Default server address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:50051";

impl ClientSettings {
    /// Resolves settings from flags/env (already merged by clap) and, when no
    /// token is given, the dev token in the local data directory.
    pub fn resolve(
        addr: Option<&str>,
        token: Option<&str>,
        data_dir: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let addr = addr.unwrap_or(DEFAULT_ADDR);
        let endpoint = if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.to_owned()
        } else {
            format!("http://{addr}")
        };
        let token = match token {
            Some(t) if !t.is_empty() => t.to_owned(),
            _ => {
                let dir = data_dir
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("./spillway-data"));
                let file = dir.join(crate::auth::tokens::DEV_TOKEN_FILE);
                match std::fs::read_to_string(&file) {
                    Ok(t) => t.trim().to_owned(),
                    Err(_) => bail!(
                        "no token: pass --token or set SPILLWAY_TOKEN (a local dev server writes one to {}; set SPILLWAY_DATA_DIR if its data dir is elsewhere)",
                        file.display()
                    ),
                }
            }
        };
        Ok(Self { endpoint, token })
    }
}

/// Adds the bearer token to every call.
#[derive(Debug, Clone)]
pub struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// Opens a channel and the interceptor that authenticates it.
pub async fn connect(settings: &ClientSettings) -> anyhow::Result<(Channel, Bearer)> {
    let endpoint = Endpoint::from_shared(settings.endpoint.clone())
        .with_context(|| format!("invalid server address {}", settings.endpoint))?;
    let channel = endpoint.connect().await.with_context(|| {
        format!(
            "cannot connect to {}; is `spillway serve` running?",
            settings.endpoint
        )
    })?;
    let value = format!("Bearer {}", settings.token)
        .parse()
        .context("the token contains characters that cannot go in a header")?;
    Ok((channel, Bearer(value)))
}
