//! Connecting to a server: address and token resolution, including the dev
//! token discovery that makes a local dev server work with no setup; and the
//! metadata every call carries (the bearer token, and `x-spillway-session`
//! on calls that concern a session, for a balancer that hashes on it).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

/// Where the client connects and who it says it is.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// `http://host:port`, or `https://host:port` with TLS.
    pub endpoint: String,
    /// Bearer token.
    pub token: String,
    /// TLS files; `ca` is set exactly when the endpoint is `https://`.
    pub tls: TlsFiles,
}

/// The client's TLS files (PEM): `--ca`, `--cert`, `--key`.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// The CA that signed the server's certificate; turns TLS on.
    pub ca: Option<PathBuf>,
    /// The client's certificate, for servers that require one (mTLS).
    pub cert: Option<PathBuf>,
    /// The key of `cert`.
    pub key: Option<PathBuf>,
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
        tls: TlsFiles,
    ) -> anyhow::Result<Self> {
        let addr = addr.unwrap_or(DEFAULT_ADDR);
        let endpoint = if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.to_owned()
        } else if tls.ca.is_some() {
            format!("https://{addr}")
        } else {
            format!("http://{addr}")
        };
        match (endpoint.starts_with("https://"), &tls.ca) {
            (true, None) => bail!(
                "{endpoint} is a TLS address: pass --ca with the PEM certificate of the CA that signed the server's certificate"
            ),
            (false, Some(_)) => bail!(
                "--ca was given but {endpoint} is plaintext; use https://, or a bare host:port"
            ),
            _ => {}
        }
        if tls.cert.is_some() != tls.key.is_some() {
            bail!("--cert and --key go together: the client certificate and its private key");
        }
        if tls.cert.is_some() && tls.ca.is_none() {
            bail!("--cert needs --ca: client certificates are sent only over TLS");
        }
        let token = match token {
            Some(t) if !t.is_empty() => t.to_owned(),
            _ => {
                let dir = data_dir
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("./spillway-data"));
                let file = dir.join(crate::auth::DEV_TOKEN_FILE);
                match std::fs::read_to_string(&file) {
                    Ok(t) => t.trim().to_owned(),
                    Err(_) => bail!(
                        "no token: pass --token or set SPILLWAY_TOKEN (a local dev server writes one to {}; set SPILLWAY_DATA_DIR if its data dir is elsewhere)",
                        file.display()
                    ),
                }
            }
        };
        Ok(Self {
            endpoint,
            token,
            tls,
        })
    }
}

/// The metadata key naming the session a call concerns. Replicas ignore
/// it; a balancer hashes on it (deploy/nginx.conf), so a session's calls
/// land on the replica whose local cache holds its payloads.
pub const SESSION_HEADER: &str = "x-spillway-session";

/// Adds the bearer token to every call, and with [`Bearer::for_session`]
/// the session's `x-spillway-session` too.
#[derive(Debug, Clone)]
pub struct Bearer {
    token: MetadataValue<tonic::metadata::Ascii>,
    session: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl Bearer {
    /// Authenticates with `token`.
    pub fn new(token: &str) -> anyhow::Result<Self> {
        let token = format!("Bearer {token}")
            .parse()
            .context("the token contains characters that cannot go in a header")?;
        Ok(Self {
            token,
            session: None,
        })
    }

    /// The same token, and every call also names `session` in
    /// [`SESSION_HEADER`]. An empty `session` names none.
    pub fn for_session(&self, session: &str) -> anyhow::Result<Self> {
        let session = if session.is_empty() {
            None
        } else {
            Some(
                session
                    .parse()
                    .with_context(|| format!("the session ID {session:?} cannot go in a header"))?,
            )
        };
        Ok(Self {
            token: self.token.clone(),
            session,
        })
    }

    /// The session every call names, if any.
    pub fn session(&self) -> Option<&str> {
        self.session.as_ref().and_then(|s| s.to_str().ok())
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert("authorization", self.token.clone());
        if let Some(s) = &self.session {
            req.metadata_mut().insert(SESSION_HEADER, s.clone());
        }
        Ok(req)
    }
}

/// Opens a channel and the interceptor that authenticates it.
pub async fn connect(settings: &ClientSettings) -> anyhow::Result<(Channel, Bearer)> {
    let mut endpoint = Endpoint::from_shared(settings.endpoint.clone())
        .with_context(|| format!("invalid server address {}", settings.endpoint))?;
    if let Some(ca) = &settings.tls.ca {
        let identity = settings
            .tls
            .cert
            .as_deref()
            .zip(settings.tls.key.as_deref());
        let config = crate::tls::client_config(ca, identity)?;
        endpoint = endpoint
            .tls_config(config)
            .context("cannot set up TLS for the connection")?;
    }
    let channel = endpoint.connect().await.with_context(|| {
        let tls_hint = if settings.tls.ca.is_none() {
            " If it serves TLS, pass --ca (and --cert/--key when it requires client certificates)."
        } else {
            ""
        };
        format!(
            "cannot connect to {}; is `spillway serve` running?{tls_hint}",
            settings.endpoint
        )
    })?;
    Ok((channel, Bearer::new(&settings.token)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(bearer: &Bearer) -> tonic::metadata::MetadataMap {
        bearer
            .clone()
            .call(tonic::Request::new(()))
            .unwrap()
            .metadata()
            .clone()
    }

    #[test]
    fn a_session_bearer_sends_the_token_and_the_session_on_every_call() {
        let bearer = Bearer::new("tok-1").unwrap().for_session("ses_1").unwrap();
        for _ in 0..2 {
            let md = sent(&bearer);
            assert_eq!(md.get("authorization").unwrap(), "Bearer tok-1");
            assert_eq!(md.get(SESSION_HEADER).unwrap(), "ses_1");
        }
        assert_eq!(bearer.session(), Some("ses_1"));
    }

    #[test]
    fn a_plain_or_empty_session_bearer_sends_no_session_header() {
        let plain = Bearer::new("tok-1").unwrap();
        assert!(sent(&plain).get(SESSION_HEADER).is_none());
        let empty = plain.for_session("ses_1").unwrap().for_session("").unwrap();
        assert!(sent(&empty).get(SESSION_HEADER).is_none());
        assert_eq!(empty.session(), None);
    }

    #[test]
    fn a_session_id_that_cannot_be_a_header_is_refused() {
        let e = Bearer::new("tok-1")
            .unwrap()
            .for_session("ses\n1")
            .unwrap_err();
        assert!(e.to_string().contains("cannot go in a header"), "{e}");
    }
}
