//! Who is calling: bearer tokens become [`Principal`]s, and the access table
//! in [`access`] decides what each principal may do.
//!
//! Tokens are kept only as SHA-256 digests in memory, so a token given as
//! `token_sha256` in the config never exists in plain text on the server.

pub mod access;
mod tokens;

use serde::{Deserialize, Serialize};

pub use tokens::{DEV_TOKEN_FILE, DevToken, TokenConfig, TokenTable};

/// A role a principal can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Creates sessions; offloads, reads and runs scripts in its own and shared sessions.
    Agent,
    /// Everything within its tenant.
    Admin,
    /// Policies, legal holds, audit and deletion within its tenant; no content.
    Compliance,
    /// Reads the audit log.
    Auditor,
}

impl Role {
    /// Every role, for tables and tests.
    pub const ALL: [Role; 4] = [Role::Agent, Role::Admin, Role::Compliance, Role::Auditor];

    /// The role's name as written in config.
    pub fn name(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Admin => "admin",
            Role::Compliance => "compliance",
            Role::Auditor => "auditor",
        }
    }

    /// Roles by name, comma-separated (`agent, admin`).
    pub fn names(roles: &[Role]) -> String {
        roles
            .iter()
            .map(|r| r.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The principal's ID.
    pub id: String,
    /// The tenant it acts within.
    pub tenant: String,
    /// Its roles.
    pub roles: Vec<Role>,
}

impl Principal {
    /// True when the principal holds `role`.
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}

/// Why a call was refused before it reached a handler's logic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization: Bearer …` metadata.
    #[error(
        "missing bearer token: send metadata `authorization: Bearer <token>` (the CLI takes --token or SPILLWAY_TOKEN)"
    )]
    MissingToken,
    /// A token that maps to no principal.
    #[error(
        "unknown bearer token: it matches no [[auth.tokens]] entry of this server (token or token_sha256); check the token you were given"
    )]
    UnknownToken,
    /// A known principal acting outside its roles.
    #[error("{principal} (roles: {roles}) may not call {rpc}: it needs one of {needed}")]
    RoleDenied {
        /// Who.
        principal: String,
        /// Its roles, comma-separated.
        roles: String,
        /// The RPC.
        rpc: &'static str,
        /// The roles that would do, comma-separated.
        needed: String,
    },
}
