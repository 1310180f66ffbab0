//! Optional TLS, and mutual TLS, for the gRPC listener and the CLI client,
//! through tonic's rustls (ring) support.
//!
//! The PEM files are read and parsed here, before tonic sees them, so that a
//! missing file or a file that holds no certificate or no key fails at
//! startup with the config key and the path in the message.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use serde::{Deserialize, Serialize};

/// The `[tls]` section: PEM file paths. Without `cert` and `key` the server
/// speaks plaintext gRPC (default).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// The server's certificate chain. With `key`, turns TLS on.
    pub cert: Option<PathBuf>,
    /// The private key of `cert`.
    pub key: Option<PathBuf>,
    /// CA certificates for client certificates: when set, every client must
    /// present a certificate one of them signed (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("{key}: cannot read {}: {source}", path.display())]
    Read {
        /// The config key or flag that named it.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A PEM file holds nothing usable.
    #[error("{key}: {} {message}", path.display())]
    Pem {
        /// The config key or flag that named it.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The files parse, but rustls does not accept them together.
    #[error("tls.cert, tls.key and tls.client_ca were refused: {0}")]
    Rejected(String),
}

impl TlsError {
    /// rustls refused the files as a whole (for example, a key that does
    /// not belong to the certificate).
    pub fn rejected(e: &(dyn std::error::Error + 'static)) -> TlsError {
        let mut message = e.to_string();
        let mut source = e.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        TlsError::Rejected(message)
    }
}

/// Reads a PEM file that must hold at least one certificate.
fn certificates(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(key, path)?;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| pem_error(key, path, format!("is not valid PEM: {e}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(pem_error(
            key,
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(pem)
}

/// Reads a PEM file that must hold a private key (PKCS#8, PKCS#1 or SEC1).
fn private_key(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        pem_error(
            key,
            path,
            format!("holds no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        )
    })?;
    Ok(pem)
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_owned(),
        source,
    })
}

fn pem_error(key: &'static str, path: &Path, message: String) -> TlsError {
    TlsError::Pem {
        key,
        path: path.to_owned(),
        message,
    }
}

/// The server's TLS settings, or `None` when `[tls]` is not configured.
/// With `client_ca`, every client must present a certificate it signed.
pub fn server_config(tls: &TlsConfig) -> Result<Option<ServerTlsConfig>, TlsError> {
    let (Some(cert), Some(key)) = (&tls.cert, &tls.key) else {
        return Ok(None);
    };
    let identity = Identity::from_pem(
        certificates("tls.cert", cert)?,
        private_key("tls.key", key)?,
    );
    let mut config = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &tls.client_ca {
        config = config
            .client_ca_root(Certificate::from_pem(certificates("tls.client_ca", ca)?))
            .client_auth_optional(false);
    }
    Ok(Some(config))
}

/// The client's TLS settings: the CA that signed the server's certificate,
/// and optionally the client's own certificate and key for mTLS.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientTlsConfig, TlsError> {
    let mut config =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(certificates("--ca", ca)?));
    if let Some((cert, key)) = identity {
        config = config.identity(Identity::from_pem(
            certificates("--cert", cert)?,
            private_key("--key", key)?,
        ));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_pem_files_are_named_by_key_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem at all\n").unwrap();
        let missing = dir.path().join("missing.pem");
        let tls = TlsConfig {
            cert: Some(missing.clone()),
            key: Some(empty.clone()),
            client_ca: None,
        };
        let err = server_config(&tls).unwrap_err().to_string();
        assert!(
            err.starts_with("tls.cert: cannot read") && err.contains("missing.pem"),
            "{err}"
        );
        let tls = TlsConfig {
            cert: Some(empty.clone()),
            ..tls
        };
        let err = server_config(&tls).unwrap_err().to_string();
        assert!(
            err.starts_with("tls.cert: ") && err.contains("holds no PEM certificate"),
            "{err}"
        );
        assert!(server_config(&TlsConfig::default()).unwrap().is_none());
    }
}
