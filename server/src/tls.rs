//! TLS: the cluster's certificates (`kairos certs init`), the listeners'
//! server configurations, the dialers' client configurations, and the check
//! that a peer's certificate names the node it speaks for.
//!
//! One cluster CA signs everything. A node certificate serves both of the
//! node's listeners and is its client identity towards peers; it names the
//! node as DNS `node-<id>.kairos-peer` (checked with webpki, like any host
//! name) and as URI `kairos://node/<id>`, plus the hosts clients dial. The
//! peer listener requires a client certificate from the CA (the handshake
//! fails without one); the peer service then requires that certificate to
//! name the node the request claims to come from.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use pki_types::{CertificateDer, ServerName};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::raft::NodeId;

pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const CLIENT_CERT: &str = "client.crt";
pub const CLIENT_KEY: &str = "client.key";
/// Days a generated certificate is valid.
const VALID_DAYS: i64 = 3 * 365;
/// Most nodes `certs init` issues for (ids 1..=N).
pub const NODES_MAX: u64 = 64;

/// The DNS name a node's certificate carries for peer checks.
pub fn node_name(id: NodeId) -> String {
    format!("node-{id}.kairos-peer")
}

pub fn node_cert_file(id: NodeId) -> String {
    format!("node-{id}.crt")
}

pub fn node_key_file(id: NodeId) -> String {
    format!("node-{id}.key")
}

/// Whether a certificate (already verified against the cluster CA by the
/// handshake) names node `id`.
pub fn names_node(der: &CertificateDer<'_>, id: NodeId) -> bool {
    let Ok(cert) = webpki::EndEntityCert::try_from(der) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(node_name(id)) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

/// A node's view of the cluster's TLS material (`--tls-dir`).
#[derive(Clone)]
pub struct NodeTls {
    ca: Certificate,
    identity: Identity,
}

impl NodeTls {
    /// Loads `ca.crt`, `node-<id>.crt` and `node-<id>.key` from `dir`.
    pub fn load(dir: &Path, id: NodeId) -> anyhow::Result<NodeTls> {
        let read = |name: &str| {
            let p = dir.join(name);
            std::fs::read(&p).with_context(|| format!("--tls-dir: reading {}", p.display()))
        };
        let ca = read(CA_CERT)?;
        let cert = read(&node_cert_file(id))?;
        let key = read(&node_key_file(id))?;
        let first = pem_certs(&cert)?;
        anyhow::ensure!(
            first.first().is_some_and(|c| names_node(c, id)),
            "--tls-dir: {} does not name node {id} ({}); it belongs to another node",
            node_cert_file(id),
            node_name(id)
        );
        Ok(NodeTls {
            ca: Certificate::from_pem(ca),
            identity: Identity::from_pem(cert, key),
        })
    }

    /// The public listener: server authentication only (clients bring tokens).
    pub fn public_server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(self.identity.clone())
    }

    /// The peer listener: a client certificate from the cluster CA is required.
    pub fn peer_server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
    }

    /// Dialing node `target`'s peer listener: it must prove to be that node.
    pub fn peer_client(&self, target: NodeId) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(self.identity.clone())
            .domain_name(node_name(target))
    }

    /// Dialing a public listener (forwarding to the leader).
    pub fn public_client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new().ca_certificate(self.ca.clone())
    }
}

fn pem_certs(pem: &[u8]) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    use pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("certificate PEM: {e}"))
}

/// Writes a new cluster CA, a certificate and key per node (ids 1..=nodes)
/// and a client certificate into `out`. Node certificates name each host in
/// `hosts` (DNS names or IP addresses) besides localhost and the loopback IPs.
/// Refuses to overwrite an existing CA. Returns the files written.
pub fn init(out: &Path, nodes: u64, hosts: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    anyhow::ensure!(
        (1..=NODES_MAX).contains(&nodes),
        "--nodes: between 1 and {NODES_MAX}, got {nodes}"
    );
    anyhow::ensure!(
        !out.join(CA_CERT).exists(),
        "--out {}: already holds a {CA_CERT}; refusing to replace a cluster CA (use a new directory)",
        out.display()
    );
    std::fs::create_dir_all(out).with_context(|| format!("--out {}", out.display()))?;
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = params("kairos cluster CA")?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
    let mut written = vec![
        write(out, CA_CERT, ca.pem().as_bytes(), false)?,
        write(out, CA_KEY, ca.key().serialize_pem().as_bytes(), true)?,
    ];
    for id in 1..=nodes {
        let mut p = params(&format!("kairos node {id}"))?;
        p.subject_alt_names = node_sans(id, hosts)?;
        let (cert, key) = leaf(p, &ca, true)?;
        written.push(write(out, &node_cert_file(id), cert.as_bytes(), false)?);
        written.push(write(out, &node_key_file(id), key.as_bytes(), true)?);
    }
    let mut p = params("kairos client")?;
    p.subject_alt_names = vec![rcgen::SanType::URI("kairos://client".try_into()?)];
    let (cert, key) = leaf(p, &ca, false)?;
    written.push(write(out, CLIENT_CERT, cert.as_bytes(), false)?);
    written.push(write(out, CLIENT_KEY, key.as_bytes(), true)?);
    Ok(written)
}

fn params(common_name: &str) -> anyhow::Result<rcgen::CertificateParams> {
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    let now = rcgen::date_time_ymd(1970, 1, 1)
        + std::time::Duration::from_secs(chrono::Utc::now().timestamp().max(0) as u64);
    p.not_before = now - std::time::Duration::from_secs(3600);
    p.not_after = now + std::time::Duration::from_secs(VALID_DAYS as u64 * 86_400);
    Ok(p)
}

fn node_sans(id: NodeId, hosts: &[String]) -> anyhow::Result<Vec<rcgen::SanType>> {
    let mut sans = vec![
        rcgen::SanType::DnsName(node_name(id).try_into()?),
        rcgen::SanType::URI(format!("kairos://node/{id}").try_into()?),
        rcgen::SanType::DnsName("localhost".try_into()?),
        rcgen::SanType::IpAddress(IpAddr::from([127, 0, 0, 1])),
        rcgen::SanType::IpAddress(IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])),
    ];
    for h in hosts {
        let dns_ok = !h.is_empty()
            && h.len() <= 253
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        sans.push(match h.parse::<IpAddr>() {
            Ok(ip) => rcgen::SanType::IpAddress(ip),
            Err(_) if dns_ok => rcgen::SanType::DnsName(h.as_str().try_into()?),
            Err(_) => anyhow::bail!("--host {h:?}: not a DNS name or IP address"),
        });
    }
    Ok(sans)
}

/// A certificate signed by the CA, for a server and client (`server`) or a client only.
fn leaf(
    mut p: rcgen::CertificateParams,
    ca: &rcgen::CertifiedIssuer<'_, rcgen::KeyPair>,
    server: bool,
) -> anyhow::Result<(String, String)> {
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    if server {
        p.extended_key_usages
            .push(rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    }
    p.use_authority_key_identifier_extension = true;
    let key = rcgen::KeyPair::generate()?;
    let cert = p.signed_by(&key, ca)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn write(dir: &Path, name: &str, bytes: &[u8], secret: bool) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let mode = if secret { 0o600 } else { 0o644 };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_certificates_name_their_node_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), 3, &["kairos.example".into(), "10.0.0.7".into()]).unwrap();
        for id in 1..=3 {
            let pem = std::fs::read(dir.path().join(node_cert_file(id))).unwrap();
            let cert = &pem_certs(&pem).unwrap()[0];
            for other in 1..=3 {
                assert_eq!(
                    names_node(cert, other),
                    id == other,
                    "cert {id} vs node {other}"
                );
            }
            assert!(NodeTls::load(dir.path(), id).is_ok());
        }
        let client = std::fs::read(dir.path().join(CLIENT_CERT)).unwrap();
        assert!(!names_node(&pem_certs(&client).unwrap()[0], 1));
    }

    #[test]
    fn init_refuses_to_replace_a_ca_and_bad_arguments() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), 1, &[]).unwrap();
        let e = init(dir.path(), 1, &[]).unwrap_err().to_string();
        assert!(e.contains("refusing to replace a cluster CA"), "{e}");
        let e = init(&dir.path().join("x"), 0, &[]).unwrap_err().to_string();
        assert!(e.contains("--nodes: between 1 and 64"), "{e}");
        let e = init(&dir.path().join("y"), 1, &["bad host!".into()]).unwrap_err();
        assert!(format!("{e:#}").contains("--host \"bad host!\""), "{e:#}");
    }

    #[test]
    fn a_node_refuses_another_node_s_certificate_as_its_own() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), 2, &[]).unwrap();
        std::fs::copy(
            dir.path().join(node_cert_file(2)),
            dir.path().join(node_cert_file(1)),
        )
        .unwrap();
        let e = NodeTls::load(dir.path(), 1).err().unwrap().to_string();
        assert!(e.contains("does not name node 1"), "{e}");
    }

    #[test]
    fn keys_are_private_to_the_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for p in init(dir.path(), 1, &[]).unwrap() {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            let secret = p.extension().is_some_and(|e| e == "key");
            assert_eq!(mode, if secret { 0o600 } else { 0o644 }, "{}", p.display());
        }
    }
}
