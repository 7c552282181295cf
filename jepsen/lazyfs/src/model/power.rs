//! The power cut: the durable state becomes the live one. Every directory
//! goes back to its durable entries, inodes no durable entry reaches from the
//! root are dropped, and every file goes back to its durable data — except,
//! with `tear`, a seeded-random prefix (1..4095 bytes) of the last page each
//! file wrote since its fsync, as a disk that lost power mid-write leaves it.
//!
//! A directory whose durable entries name a directory more than once (a
//! rename across parents made durable on both sides at different times)
//! keeps one of them as its `..`; nothing here loops on such shapes.

use super::{Body, Fs, Ino, ROOT};
use crate::protocol::PowerReport;
use std::collections::BTreeSet;

/// A small seeded generator (SplitMix64): the torn lengths depend on the
/// seed and the order of the cuts only.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix(pub u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

impl Fs {
    pub fn power(&mut self, tear: bool) -> PowerReport {
        let mut report = PowerReport::default();
        let reached = self.durably_reachable();
        let gone: Vec<Ino> = self
            .inodes
            .keys()
            .filter(|i| !reached.contains(i))
            .copied()
            .collect();
        for ino in gone {
            let node = self.inodes.remove(&ino).expect("listed above");
            report.inodes_dropped += 1;
            if let Body::File(f) = &node.body {
                report.files += 1;
                report.bytes += f.size().max(f.unsynced_bytes());
            }
            if let Body::Dir(d) = &node.body {
                report.namespace_ops += d.unsynced_ops;
            }
        }
        self.revert_survivors(tear, &mut report);
        self.relink();
        self.handles.retain(|_, ino| reached.contains(ino));
        for ino in self.handles.values() {
            if let Some(n) = self.inodes.get_mut(ino) {
                n.open += 1;
            }
        }
        self.used_bytes = self.inodes.values().map(|n| n.size()).sum();
        self.powers += 1;
        report
    }

    /// Inodes reached from the root through durable entries.
    fn durably_reachable(&self) -> BTreeSet<Ino> {
        let mut seen = BTreeSet::from([ROOT]);
        let mut work = vec![ROOT];
        while let Some(i) = work.pop() {
            let Some(Body::Dir(d)) = self.inodes.get(&i).map(|n| &n.body) else {
                continue;
            };
            for c in d.durable.values() {
                if self.inodes.contains_key(c) && seen.insert(*c) {
                    work.push(*c);
                }
            }
        }
        seen
    }

    fn revert_survivors(&mut self, tear: bool, report: &mut PowerReport) {
        for node in self.inodes.values_mut() {
            match &mut node.body {
                Body::File(f) if f.is_dirty() => {
                    let kept = if tear {
                        f.tear(self.rng.between(1, 4095) as usize)
                    } else {
                        0
                    };
                    report.files += 1;
                    report.bytes += f.unsynced_bytes().saturating_sub(kept);
                    if kept > 0 {
                        report.torn_files += 1;
                        report.torn_bytes += kept;
                    }
                    f.revert();
                }
                Body::Dir(d) => {
                    report.namespace_ops += d.unsynced_ops;
                    d.live = d.durable.clone();
                    d.unsynced_ops = 0;
                }
                _ => {}
            }
        }
    }

    /// Link counts and `..` from the (now equal) live and durable entries.
    fn relink(&mut self) {
        let mut edges = Vec::new();
        for (ino, node) in &self.inodes {
            if let Body::Dir(d) = &node.body {
                edges.extend(d.durable.values().map(|c| (*ino, *c)));
            }
        }
        for node in self.inodes.values_mut() {
            node.live_links = 0;
            node.durable_links = 0;
            node.open = 0;
        }
        let root = self
            .inodes
            .get_mut(&ROOT)
            .expect("the root is never dropped");
        root.live_links = 1;
        root.durable_links = 1;
        for (parent, child) in edges {
            let Some(n) = self.inodes.get_mut(&child) else {
                continue;
            };
            n.live_links += 1;
            n.durable_links += 1;
            if let Body::Dir(d) = &mut n.body {
                d.parent = parent;
            }
        }
    }
}
