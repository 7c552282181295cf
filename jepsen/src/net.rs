//! The test network: one bridge `kj<run>br` in the root namespace holding
//! 10.a.b.254/24, and per node a namespace `kj<run>n<i>` with a veth whose
//! inside end holds 10.a.b.<i>. The harness talks to nodes over the bridge;
//! faults are iptables rules (INPUT drops, optionally random with
//! `-m statistic`) and `tc tbf` qdiscs inside the node namespaces, so only
//! node-to-node traffic is cut and the harness always sees every node.
//! Traffic never leaves the bridge.

use crate::clean;
use anyhow::{bail, Context, Result};
use std::process::Command;

/// Ports every node listens on inside its namespace: public gRPC, HTTP, peer.
pub const GRPC_PORT: u16 = 7070;
pub const HTTP_PORT: u16 = 7080;
pub const PEER_PORT: u16 = 7170;

#[derive(Debug, Clone)]
pub struct NsNode {
    pub id: u64,
    pub ns: String,
    pub ip: String,
    pub host_if: String,
    pub ns_if: String,
}

#[derive(Debug)]
pub struct Net {
    pub bridge: String,
    /// "10.a.b"
    pub prefix: String,
    pub nodes: Vec<NsNode>,
}

/// Runs a command, failing with its stderr.
pub fn sh(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("spawn {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn in_ns(ns: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["netns", "exec", ns];
    full.extend_from_slice(args);
    sh("ip", &full)
}

/// Picks a 10.a.b.0/24 not present on any interface, from `salt`.
pub fn pick_prefix(salt: u64, in_use: &str) -> Option<String> {
    (0..64u64).find_map(|k| {
        let v = salt.wrapping_add(k.wrapping_mul(7919));
        let p = format!("10.{}.{}", 200 + v % 50, (v / 50) % 250 + 1);
        (!in_use.contains(&format!("{p}."))).then_some(p)
    })
}

impl Net {
    /// Creates the bridge and `n` namespaces; registers them for cleanup.
    pub fn create(run_id: &str, n: usize, salt: u64) -> Result<Net> {
        let in_use = sh("ip", &["-4", "-o", "addr", "show"])?;
        let prefix = pick_prefix(salt, &in_use).context("no free 10.x.y.0/24 subnet")?;
        let bridge = format!("kj{run_id}br");
        sh("ip", &["link", "add", &bridge, "type", "bridge"])?;
        clean::register_link(&bridge);
        sh(
            "ip",
            &["addr", "add", &format!("{prefix}.254/24"), "dev", &bridge],
        )?;
        sh("ip", &["link", "set", &bridge, "up"])?;
        let mut nodes = Vec::new();
        for i in 1..=n as u64 {
            let node = NsNode {
                id: i,
                ns: format!("kj{run_id}n{i}"),
                ip: format!("{prefix}.{i}"),
                host_if: format!("kj{run_id}h{i}"),
                ns_if: format!("kj{run_id}v{i}"),
            };
            Self::add_node(&bridge, &node)?;
            nodes.push(node);
        }
        Ok(Net {
            bridge,
            prefix,
            nodes,
        })
    }

    fn add_node(bridge: &str, n: &NsNode) -> Result<()> {
        sh("ip", &["netns", "add", &n.ns])?;
        clean::register_netns(&n.ns);
        sh(
            "ip",
            &[
                "link", "add", &n.host_if, "type", "veth", "peer", "name", &n.ns_if,
            ],
        )?;
        clean::register_link(&n.host_if);
        sh("ip", &["link", "set", &n.ns_if, "netns", &n.ns])?;
        sh("ip", &["link", "set", &n.host_if, "master", bridge])?;
        sh("ip", &["link", "set", &n.host_if, "up"])?;
        in_ns(
            &n.ns,
            &[
                "ip",
                "addr",
                "add",
                &format!("{}/24", n.ip),
                "dev",
                &n.ns_if,
            ],
        )?;
        in_ns(&n.ns, &["ip", "link", "set", &n.ns_if, "up"])?;
        in_ns(&n.ns, &["ip", "link", "set", "lo", "up"])?;
        Ok(())
    }

    pub fn ip(&self, idx: usize) -> &str {
        &self.nodes[idx].ip
    }

    /// Node `dst` drops packets from each node in `srcs`, with probability
    /// `p` when given (lossy link) or always (partition).
    pub fn drop_from(&self, dst: usize, srcs: &[usize], p: Option<f64>) -> Result<()> {
        let n = &self.nodes[dst];
        for &s in srcs.iter().filter(|s| **s != dst) {
            let src = self.nodes[s].ip.clone();
            let mut args = vec!["iptables", "-w", "-A", "INPUT", "-s", src.as_str()];
            let prob;
            if let Some(p) = p {
                prob = format!("{p:.3}");
                args.extend([
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    prob.as_str(),
                ]);
            }
            args.extend(["-j", "DROP"]);
            in_ns(&n.ns, &args)?;
        }
        Ok(())
    }

    /// Caps node `idx`'s outgoing bandwidth.
    pub fn limit_bandwidth(&self, idx: usize, rate_kbit: u32) -> Result<()> {
        let n = &self.nodes[idx];
        let rate = format!("{rate_kbit}kbit");
        in_ns(
            &n.ns,
            &[
                "tc", "qdisc", "replace", "dev", &n.ns_if, "root", "tbf", "rate", &rate, "burst",
                "32kbit", "latency", "400ms",
            ],
        )?;
        Ok(())
    }

    /// Removes every rule and qdisc from every node.
    pub fn heal_all(&self) -> Result<()> {
        let mut first_err = None;
        for n in &self.nodes {
            if let Err(e) = in_ns(&n.ns, &["iptables", "-w", "-F", "INPUT"]) {
                first_err.get_or_insert(e);
            }
            // Fails harmlessly when no qdisc is installed.
            let _ = in_ns(&n.ns, &["tc", "qdisc", "del", "dev", &n.ns_if, "root"]);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Deletes the namespaces and the bridge (their veths go with them).
    pub fn destroy(&self) {
        for n in &self.nodes {
            clean::quiet("ip", &["netns", "del", &n.ns]);
            clean::quiet("ip", &["link", "del", &n.host_if]);
        }
        clean::quiet("ip", &["link", "del", &self.bridge]);
    }
}

/// True when running as root with `ip` and `iptables` available and a
/// namespace can actually be created.
pub fn namespaces_available() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !(root && clean::quiet("ip", &["-V"]) && clean::quiet("iptables", &["--version"])) {
        return false;
    }
    // Root is not enough in some containers: try creating one.
    let probe = format!("kjprobe{}", std::process::id());
    let ok = clean::quiet("ip", &["netns", "add", &probe])
        && clean::quiet("ip", &["netns", "exec", &probe, "iptables", "-L", "INPUT"]);
    clean::quiet("ip", &["netns", "del", &probe]);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_avoids_subnets_in_use() {
        let p = pick_prefix(0, "").unwrap();
        assert_eq!(p, "10.200.1");
        let q = pick_prefix(0, "inet 10.200.1.5/24").unwrap();
        assert_ne!(q, p);
        assert!(q.starts_with("10.2"));
    }
}
