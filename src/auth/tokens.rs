//! The token table and the dev token.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{AuthError, Principal, Role};
use crate::fsutil::write_private;

/// One `[[auth.tokens]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// The token in plain text. Give either this or `token_sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Hex SHA-256 of the token, so that no secret sits in the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// The principal's ID, as it appears in sessions and the audit log.
    pub principal: String,
    /// The tenant the principal belongs to.
    pub tenant: String,
    /// Roles granted to the principal.
    pub roles: Vec<Role>,
}

/// Name of the dev token file inside the data directory.
pub const DEV_TOKEN_FILE: &str = "dev-token";
/// Principal and tenant that the dev token stands for.
pub const DEV_PRINCIPAL: &str = "dev";

/// Maps SHA-256 digests of bearer tokens to principals.
#[derive(Debug, Default, Clone)]
pub struct TokenTable {
    by_digest: HashMap<[u8; 32], Principal>,
}

/// The dev token that a server without configured tokens made for itself.
#[derive(Debug, Clone)]
pub struct DevToken {
    /// Where it was written.
    pub path: PathBuf,
}

impl TokenTable {
    /// Builds the table from validated config entries.
    pub fn from_config(entries: &[TokenConfig]) -> Self {
        let mut table = Self::default();
        for e in entries {
            let digest = match (&e.token, &e.token_sha256) {
                (Some(plain), _) => digest(plain),
                (None, Some(hex_digest)) => {
                    let mut d = [0u8; 32];
                    // Config validation already checked the form.
                    hex::decode_to_slice(hex_digest, &mut d).expect("validated token_sha256");
                    d
                }
                (None, None) => continue,
            };
            table.by_digest.insert(
                digest,
                Principal {
                    id: e.principal.clone(),
                    tenant: e.tenant.clone(),
                    roles: e.roles.clone(),
                },
            );
        }
        table
    }

    /// Makes a fresh random admin token for tenant `dev`, writes it with mode
    /// 0600 to `<data_dir>/dev-token` (replacing any earlier one), and returns
    /// the table that accepts it.
    pub fn with_dev_token(data_dir: &Path) -> std::io::Result<(Self, DevToken)> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(std::io::Error::other)?;
        let token = format!("spw_dev_{}", hex::encode(raw));
        let path = data_dir.join(DEV_TOKEN_FILE);
        write_private(&path, token.as_bytes())?;
        let mut table = Self::default();
        table.by_digest.insert(
            digest(&token),
            Principal {
                id: DEV_PRINCIPAL.into(),
                tenant: DEV_PRINCIPAL.into(),
                roles: vec![Role::Admin],
            },
        );
        Ok((table, DevToken { path }))
    }

    /// Resolves the value of an `authorization` header.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Principal, AuthError> {
        let header = header.ok_or(AuthError::MissingToken)?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or(AuthError::MissingToken)?
            .trim();
        if token.is_empty() {
            return Err(AuthError::MissingToken);
        }
        self.by_digest
            .get(&digest(token))
            .cloned()
            .ok_or(AuthError::UnknownToken)
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(token: Option<&str>, sha: Option<String>) -> TokenConfig {
        TokenConfig {
            token: token.map(str::to_owned),
            token_sha256: sha,
            principal: "agent-a".into(),
            tenant: "acme".into(),
            roles: vec![Role::Agent],
        }
    }

    #[test]
    fn accepts_plain_and_hashed_tokens() {
        let sha = hex::encode(Sha256::digest(b"hashed-secret"));
        let table = TokenTable::from_config(&[entry(Some("s3cret"), None), entry(None, Some(sha))]);
        assert_eq!(
            table.authenticate(Some("Bearer s3cret")).unwrap().tenant,
            "acme"
        );
        assert_eq!(
            table.authenticate(Some("Bearer hashed-secret")).unwrap().id,
            "agent-a"
        );
    }

    #[test]
    fn refuses_missing_malformed_and_unknown_tokens() {
        let table = TokenTable::from_config(&[entry(Some("s3cret"), None)]);
        assert_eq!(table.authenticate(None), Err(AuthError::MissingToken));
        assert_eq!(
            table.authenticate(Some("s3cret")),
            Err(AuthError::MissingToken)
        );
        assert_eq!(
            table.authenticate(Some("Bearer ")),
            Err(AuthError::MissingToken)
        );
        assert_eq!(
            table.authenticate(Some("Bearer nope")),
            Err(AuthError::UnknownToken)
        );
    }

    #[test]
    fn dev_token_is_private_and_admin_of_dev() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (table, dev) = TokenTable::with_dev_token(dir.path()).unwrap();
        let mode = std::fs::metadata(&dev.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let token = std::fs::read_to_string(&dev.path).unwrap();
        let p = table
            .authenticate(Some(&format!("Bearer {token}")))
            .unwrap();
        assert_eq!((p.id.as_str(), p.tenant.as_str()), ("dev", "dev"));
        assert!(p.has(Role::Admin));
    }
}
