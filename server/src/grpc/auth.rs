//! Who may call what. Every public call names what it needs; a node started
//! with `--auth-token-file` checks the caller's bearer token against the
//! replicated token table (so a revoke holds on every node as soon as it is
//! applied there). Without it the node is in development mode and admits
//! every call (allowed only on loopback or with `--insecure`).

use kairos_client::AUTH_HEADER;
use sha2::{Digest, Sha256};
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::core::{Role, Token};
use crate::node::Node;

/// What a call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// get, list, status: reader, operator or admin.
    Read,
    /// jobs and runs: operator or admin.
    Write,
    /// tokens and membership: admin.
    Admin,
}

impl Need {
    fn allows(self, role: Role) -> bool {
        match self {
            Need::Read => matches!(role, Role::Admin | Role::Operator | Role::Reader),
            Need::Write => matches!(role, Role::Admin | Role::Operator),
            Need::Admin => role == Role::Admin,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Need::Read => "reading needs reader, operator or admin",
            Need::Write => "changing jobs and runs needs operator or admin",
            Need::Admin => "managing tokens and the cluster needs admin",
        }
    }
}

/// Lowercase hex SHA-256 of a token secret: what the cluster stores.
pub fn hash_secret(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The caller's token, or None in development mode.
fn caller(node: &Node, metadata: &MetadataMap) -> Result<Option<Token>, Status> {
    if !node.auth_required {
        return Ok(None);
    }
    let secret = metadata
        .get(AUTH_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            Status::unauthenticated(
                "missing token: send `authorization: Bearer <token>` (kairosctl --token or KAIROS_TOKEN)",
            )
        })?;
    node.sm
        .token_by_hash(&hash_secret(secret))
        .map(Some)
        .ok_or_else(|| Status::unauthenticated("unknown or revoked token"))
}

/// Admits the call if the caller's role covers `need`; returns the
/// caller's token name ("" in development mode).
pub fn authorize<T>(node: &Node, req: &Request<T>, need: Need) -> Result<String, Status> {
    match caller(node, req.metadata())? {
        Some(t) if !need.allows(t.role) => Err(Status::permission_denied(format!(
            "token {:?} has role {}; {}",
            t.name,
            t.role.as_str(),
            need.describe()
        ))),
        Some(t) => Ok(t.name),
        None => Ok(String::new()),
    }
}

/// Admits a worker session for `groups`: an admin token, or a worker token
/// naming every one of them.
pub fn authorize_worker(
    node: &Node,
    metadata: &MetadataMap,
    groups: &[String],
) -> Result<(), Status> {
    let Some(t) = caller(node, metadata)? else {
        return Ok(());
    };
    match t.role {
        Role::Admin => Ok(()),
        Role::Worker => match groups.iter().find(|g| !t.groups.contains(g)) {
            Some(g) => Err(Status::permission_denied(format!(
                "token {:?} may serve groups {:?}, not {g:?}",
                t.name, t.groups
            ))),
            None => Ok(()),
        },
        role => Err(Status::permission_denied(format!(
            "token {:?} has role {}; a worker session needs a worker token for its groups (or admin)",
            t.name,
            role.as_str()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_cover_what_they_should_and_no_more() {
        let table = [
            (Role::Admin, [true, true, true]),
            (Role::Operator, [true, true, false]),
            (Role::Reader, [true, false, false]),
            (Role::Worker, [false, false, false]),
        ];
        for (role, want) in table {
            let got = [Need::Read, Need::Write, Need::Admin].map(|n| n.allows(role));
            assert_eq!(got, want, "{role:?}");
        }
    }

    #[test]
    fn secrets_hash_to_sha256_hex() {
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
