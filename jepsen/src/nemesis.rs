//! The nemesis: turns planned faults into actions on the live cluster and
//! undoes them. Targets named by role (leader, follower) are resolved when the
//! fault starts. Each fault is recorded as a `start` event taken before it is
//! applied and a `stop` event taken after it is healed, so recorded fault
//! periods always cover the real ones. Network faults are skipped (and said
//! so in the history) when there are no namespaces.
//!
//! The disk faults act on the slots' lazy disks (`disk.rs`): `power` kills
//! its targets and cuts their disks' power in one step (the report of what
//! each lost goes into the event's detail) and restarts them at heal;
//! `disk-full`, `disk-error` and `slow-disk` set the fault on the disk and
//! heal clears it (restarting a node a failed fsync stopped).

use crate::client::{find_leader, Node};
use crate::cluster::Cluster;
use crate::event::{Event, NemesisEvent, Phase};
use crate::generator::{partition_drops, Fault, Partition, PlannedFault, PowerScope, Target};
use crate::net::Net;
use crate::recorder::Recorder;
use crate::signal::Signal;
use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub struct Nemesis {
    pub cluster: Arc<Cluster>,
    pub net: Option<Arc<Net>>,
    pub nodes: Arc<Vec<Node>>,
    pub rec: Recorder,
    pub rng: StdRng,
}

/// What healing a fault has to do.
enum Undo {
    Network,
    Restart(usize),
    Resume(usize),
    Clock {
        idx: usize,
        strobe: Option<JoinHandle<()>>,
    },
    /// Start these slots' nodes again (after a power cut).
    RestartAll(Vec<usize>),
    /// Clear these slots' disk faults (restarting the node a failed fsync
    /// stopped).
    Disk(Vec<usize>),
}

impl Nemesis {
    pub fn new(
        cluster: Arc<Cluster>,
        net: Option<Arc<Net>>,
        nodes: Arc<Vec<Node>>,
        rec: Recorder,
        rng: StdRng,
    ) -> Nemesis {
        Nemesis {
            cluster,
            net,
            nodes,
            rec,
            rng,
        }
    }

    /// Applies the plan from `t0` until it ends or `stop` is set, healing the
    /// fault in progress before returning.
    pub async fn run_plan(
        &mut self,
        plan: Vec<PlannedFault>,
        t0: Instant,
        mut stop: watch::Receiver<bool>,
    ) {
        for p in plan {
            let at = t0 + Duration::from_millis(p.at_ms);
            if stopped_during(&mut stop, at).await {
                return;
            }
            let id = self.rec.next_nemesis_id();
            let start_ms = self.rec.now_ms();
            let applied = self.start(&p.fault).await;
            let (nodes, detail, undo) = match applied {
                Ok(x) => x,
                Err(e) => {
                    self.event(
                        id,
                        start_ms,
                        Phase::Info,
                        &p.fault,
                        vec![],
                        format!("not applied: {e:#}"),
                    )
                    .await;
                    self.heal_everything().await;
                    continue;
                }
            };
            self.event(id, start_ms, Phase::Start, &p.fault, nodes.clone(), detail)
                .await;
            stopped_during(&mut stop, Instant::now() + Duration::from_millis(p.hold_ms)).await;
            let healed = self.heal(undo).await;
            let note = healed
                .err()
                .map(|e| format!("heal error: {e:#}"))
                .unwrap_or_default();
            let now = self.rec.now_ms();
            self.event(id, now, Phase::Stop, &p.fault, nodes, note)
                .await;
        }
    }

    async fn event(
        &self,
        id: u64,
        time_ms: i64,
        phase: Phase,
        f: &Fault,
        nodes: Vec<u64>,
        detail: String,
    ) {
        let ev = NemesisEvent {
            id,
            time_ms,
            phase,
            fault: f.family().into(),
            kind: kind_name(f),
            nodes,
            detail,
        };
        self.rec.record(Event::Nemesis(ev)).await;
    }

    /// Node index for a target, and how it was chosen.
    async fn resolve(&mut self, t: Target) -> (usize, String) {
        let n = self.nodes.len();
        let leader = match t {
            Target::Node(i) => return (i % n, "random node".into()),
            _ => find_leader(&self.nodes)
                .await
                .and_then(|id| self.nodes.iter().position(|x| x.id() == id)),
        };
        match (t, leader) {
            (Target::Leader, Some(l)) => (l, "leader".into()),
            (Target::Follower, Some(l)) => (
                (l + self.rng.gen_range(1..n)) % n,
                format!("follower of {}", self.nodes[l].id()),
            ),
            _ => (
                self.rng.gen_range(0..n),
                "leader unknown: random node".into(),
            ),
        }
    }

    fn net(&self) -> Result<&Net> {
        self.net
            .as_deref()
            .context("needs network namespaces (run as root)")
    }

    /// Starts a fault: the nodes it hits, a description, and its undo.
    async fn start(&mut self, f: &Fault) -> Result<(Vec<u64>, String, Undo)> {
        match f {
            Fault::Partition(p) => self.partition(p).await,
            Fault::Loss {
                target,
                probability,
            } => self.loss(*target, *probability).await,
            Fault::Snapshot(t) => {
                self.net()?;
                let (i, why) = self.resolve(*t).await;
                let n = self.nodes.len();
                self.apply_drops(&partition_drops(&Partition::Isolate(*t), n, i))?;
                Ok((
                    vec![self.nodes[i].id()],
                    format!("blackhole {why}"),
                    Undo::Network,
                ))
            }
            Fault::Power { scope, tear } => self.power(scope, *tear).await,
            Fault::DiskFull(_) | Fault::DiskError(_) | Fault::SlowDisk { .. } => {
                self.disk_fault(f).await
            }
            Fault::Bandwidth { target, rate_kbit } => {
                self.net()?;
                let (i, why) = self.resolve(*target).await;
                self.net()?.limit_bandwidth(i, *rate_kbit)?;
                let detail = format!("tbf {rate_kbit} kbit/s out of {why}");
                Ok((vec![self.nodes[i].id()], detail, Undo::Network))
            }
            _ => self.process_fault(f).await,
        }
    }

    /// Faults on a node's process or clock.
    async fn process_fault(&mut self, f: &Fault) -> Result<(Vec<u64>, String, Undo)> {
        let (target, is_clock) = match f {
            Fault::Kill(t) | Fault::Pause(t) => (*t, false),
            Fault::ClockBump { target, .. } | Fault::ClockStrobe { target, .. } => (*target, true),
            _ => anyhow::bail!("not a process fault: {f:?}"),
        };
        anyhow::ensure!(
            !is_clock || self.cluster.faketime,
            "nodes were started without libfaketime"
        );
        let (i, why) = self.resolve(target).await;
        let Some(id) = self.cluster.id(i) else {
            anyhow::bail!("slot {i} is vacant (its node was removed)");
        };
        let hit = vec![id];
        Ok(match f {
            Fault::Kill(_) => {
                self.cluster.kill(i);
                (hit, format!("SIGKILL {why}"), Undo::Restart(i))
            }
            Fault::Pause(_) => {
                self.cluster.signal(i, Signal::STOP);
                (hit, format!("SIGSTOP {why}"), Undo::Resume(i))
            }
            Fault::ClockBump { offset_s, .. } => {
                self.cluster.set_clock_offset(i, *offset_s)?;
                (
                    hit,
                    format!("clock {offset_s:+}s {why}"),
                    Undo::Clock {
                        idx: i,
                        strobe: None,
                    },
                )
            }
            Fault::ClockStrobe {
                offset_s,
                period_ms,
                ..
            } => {
                let task = tokio::spawn(strobe(self.cluster.clone(), i, *offset_s, *period_ms));
                let detail = format!("clock strobe 0/{offset_s:+}s every {period_ms} ms {why}");
                (
                    hit,
                    detail,
                    Undo::Clock {
                        idx: i,
                        strobe: Some(task),
                    },
                )
            }
            _ => unreachable!("matched above"),
        })
    }

    /// Slots a power scope names, and how they were chosen.
    async fn power_targets(&mut self, scope: &PowerScope) -> (Vec<usize>, String) {
        match scope {
            PowerScope::One(t) => {
                let (i, why) = self.resolve(*t).await;
                (vec![i], why)
            }
            PowerScope::Minority(v) => (v.clone(), "minority".into()),
            PowerScope::Majority(v) => (v.clone(), "majority".into()),
            PowerScope::All => ((0..self.nodes.len()).collect(), "all nodes".into()),
        }
    }

    /// SIGKILL and power cut; the nodes restart at heal.
    async fn power(&mut self, scope: &PowerScope, tear: bool) -> Result<(Vec<u64>, String, Undo)> {
        let (idxs, why) = self.power_targets(scope).await;
        let reports = self.cluster.kill_and_power(&idxs, tear)?;
        let mut hit = Vec::new();
        let mut lost = Vec::new();
        for (id, r) in reports {
            let who = id.map_or("vacant slot".to_string(), |id| format!("node {id}"));
            hit.extend(id);
            lost.push(format!(
                "{who}: {} files, {} bytes, {} namespace ops, {} inodes dropped, {} torn ({} bytes)",
                r.files, r.bytes, r.namespace_ops, r.inodes_dropped, r.torn_files, r.torn_bytes
            ));
        }
        let detail = format!(
            "SIGKILL + power cut{} {why}: {}",
            if tear { " (torn writes)" } else { "" },
            lost.join("; ")
        );
        Ok((hit, detail, Undo::RestartAll(idxs)))
    }

    /// disk-full, disk-error or slow-disk on one node (or, slow, on all).
    async fn disk_fault(&mut self, f: &Fault) -> Result<(Vec<u64>, String, Undo)> {
        let (idxs, why) = match f {
            Fault::DiskFull(t)
            | Fault::DiskError(t)
            | Fault::SlowDisk {
                target: Some(t), ..
            } => {
                let (i, why) = self.resolve(*t).await;
                (vec![i], why)
            }
            _ => ((0..self.nodes.len()).collect(), "all nodes".to_string()),
        };
        let what = match f {
            Fault::DiskFull(_) => "disk full (ENOSPC)".to_string(),
            Fault::DiskError(_) => "next fsync fails (EIO)".to_string(),
            Fault::SlowDisk { ms, .. } => format!("fsync +{ms} ms"),
            _ => anyhow::bail!("not a disk fault: {f:?}"),
        };
        let mut hit = Vec::new();
        for &i in &idxs {
            self.cluster.disk(i, |c| match f {
                Fault::DiskFull(_) => c.disk_full(true),
                Fault::DiskError(_) => c.disk_error(),
                Fault::SlowDisk { ms, .. } => c.slow_disk(*ms),
                _ => unreachable!("matched above"),
            })?;
            hit.extend(self.cluster.id(i));
        }
        Ok((hit, format!("{what} {why}"), Undo::Disk(idxs)))
    }

    /// Random drops on one node's links (both ways) or on every link.
    async fn loss(&mut self, target: Option<Target>, p: f64) -> Result<(Vec<u64>, String, Undo)> {
        self.net()?;
        let n = self.nodes.len();
        let all: Vec<usize> = (0..n).collect();
        let Some(t) = target else {
            for i in 0..n {
                self.net()?.drop_from(i, &all, Some(p / 2.0))?;
            }
            let hit = self.nodes.iter().map(|x| x.id()).collect();
            return Ok((
                hit,
                format!("drop {} on every link", p / 2.0),
                Undo::Network,
            ));
        };
        let (i, why) = self.resolve(t).await;
        let net = self.net()?;
        net.drop_from(i, &all, Some(p))?;
        for j in (0..n).filter(|j| *j != i) {
            net.drop_from(j, &[i], Some(p))?;
        }
        Ok((
            vec![self.nodes[i].id()],
            format!("drop {p} both ways {why}"),
            Undo::Network,
        ))
    }

    async fn partition(&mut self, p: &Partition) -> Result<(Vec<u64>, String, Undo)> {
        self.net()?;
        let (isolated, why) = match p {
            Partition::Isolate(t) | Partition::OneWay { target: t, .. } => self.resolve(*t).await,
            _ => (0, String::new()),
        };
        let drops = partition_drops(p, self.nodes.len(), isolated);
        self.apply_drops(&drops)?;
        let pairs: Vec<String> = drops
            .iter()
            .map(|(d, s)| format!("{}<-{}", self.nodes[*d].id(), self.nodes[*s].id()))
            .collect();
        let hit: Vec<u64> = match p {
            Partition::Isolate(_) | Partition::OneWay { .. } => vec![self.nodes[isolated].id()],
            Partition::Split(m) => m.iter().map(|i| self.nodes[*i].id()).collect(),
            Partition::MajoritiesRing(o) | Partition::Bridge(o) => {
                o.iter().map(|i| self.nodes[*i].id()).collect()
            }
        };
        Ok((
            hit,
            format!("{why} drops {}", pairs.join(" "))
                .trim()
                .to_string(),
            Undo::Network,
        ))
    }

    fn apply_drops(&self, drops: &[(usize, usize)]) -> Result<()> {
        let net = self.net()?;
        for (dst, src) in drops {
            net.drop_from(*dst, &[*src], None)?;
        }
        Ok(())
    }

    async fn heal(&self, undo: Undo) -> Result<()> {
        match undo {
            Undo::Network => self.net()?.heal_all(),
            // The slot may host a new node by now, or none: start whoever lives there.
            Undo::Restart(i) => self.cluster.restart_if_down(i).map(|_| ()),
            Undo::Resume(i) => {
                self.cluster.signal(i, Signal::CONT);
                Ok(())
            }
            Undo::Clock { idx, strobe } => {
                if let Some(s) = strobe {
                    s.abort();
                    let _ = s.await;
                }
                self.cluster.set_clock_offset(idx, 0)
            }
            Undo::RestartAll(idxs) => idxs
                .into_iter()
                .try_for_each(|i| self.cluster.restart_if_down(i).map(|_| ())),
            Undo::Disk(idxs) => idxs.into_iter().try_for_each(|i| {
                self.cluster.disk(i, |c| c.heal())?;
                self.cluster.restart_if_down(i).map(|_| ())
            }),
        }
    }

    /// Undoes every kind of fault on every node; safe to repeat.
    pub async fn heal_everything(&self) {
        if let Some(net) = &self.net {
            let _ = net.heal_all();
        }
        for i in 0..self.nodes.len() {
            self.cluster.signal(i, Signal::CONT);
            if self.cluster.faketime {
                let _ = self.cluster.set_clock_offset(i, 0);
            }
            if self.cluster.has_disks() {
                let _ = self.cluster.disk(i, |c| c.heal());
            }
            let _ = self.cluster.restart_if_down(i);
        }
    }
}

/// Sleeps until `at`; true if stop was signalled first.
pub async fn stopped_during(stop: &mut watch::Receiver<bool>, at: Instant) -> bool {
    loop {
        if *stop.borrow() {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(at) => return *stop.borrow(),
            r = stop.changed() => if r.is_err() { return false },
        }
    }
}

/// Returns once stop is signalled; never if the sender went away without.
pub async fn until_stopped(mut stop: watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn strobe(cluster: Arc<Cluster>, idx: usize, offset_s: i64, period_ms: u64) {
    let mut on = true;
    loop {
        let _ = cluster.set_clock_offset(idx, if on { offset_s } else { 0 });
        on = !on;
        tokio::time::sleep(Duration::from_millis(period_ms)).await;
    }
}

/// The concrete fault's name, as recorded in `kind`.
pub fn kind_name(f: &Fault) -> String {
    match f {
        Fault::Partition(p) => match p {
            Partition::Isolate(Target::Leader) => "isolate-leader",
            Partition::Isolate(_) => "isolate-node",
            Partition::Split(_) => "majority-minority",
            Partition::MajoritiesRing(_) => "majorities-ring",
            Partition::Bridge(_) => "bridge",
            Partition::OneWay { inbound: true, .. } => "one-way-inbound",
            Partition::OneWay { .. } => "one-way-outbound",
        },
        Fault::Kill(Target::Leader) => "kill-leader",
        Fault::Kill(_) => "kill-node",
        Fault::Pause(Target::Leader) => "pause-leader",
        Fault::Pause(_) => "pause-node",
        Fault::ClockBump { .. } => "clock-bump",
        Fault::ClockStrobe { .. } => "clock-strobe",
        Fault::Loss { target: None, .. } => "loss-all-links",
        Fault::Loss { .. } => "loss-node",
        Fault::Bandwidth { .. } => "bandwidth",
        Fault::Snapshot(_) => "blackhole-follower",
        Fault::Power { scope, tear } => {
            let who = match scope {
                PowerScope::One(Target::Leader) => "leader",
                PowerScope::One(_) => "node",
                PowerScope::Minority(_) => "minority",
                PowerScope::Majority(_) => "majority",
                PowerScope::All => "all",
            };
            return format!("power-{who}{}", if *tear { "-torn" } else { "" });
        }
        Fault::DiskFull(_) => "disk-full",
        Fault::DiskError(_) => "disk-error",
        Fault::SlowDisk { target: None, .. } => "slow-disk-all",
        Fault::SlowDisk { .. } => "slow-disk-node",
    }
    .to_string()
}
