//! Seeded, pure generators: the fault schedule (by default a fault every
//! 5–10 s, held 5–15 s, then healed — `--fault-every` sets the density;
//! blackholes long enough to force a snapshot), the
//! partition shapes as (receiver, sender) drop pairs, and the choices the
//! workloads make (register operation mix, timer delays and cancellations,
//! interval periods), and the membership changes (`member_change`). Same
//! seed, same plan: runs can be replayed.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// Fault families the CLI accepts.
pub const FAMILIES: [&str; 12] = [
    "partition",
    "kill",
    "pause",
    "clock",
    "loss",
    "bandwidth",
    "snapshot",
    MEMBERSHIP,
    "power",
    "disk-full",
    "disk-error",
    "slow-disk",
];
/// The family that is not in the fault plan: membership changes run beside
/// it (`membership.rs`), so they meet the planned faults.
pub const MEMBERSHIP: &str = "membership";
/// Families that need network namespaces.
pub const NETWORK_FAMILIES: [&str; 4] = ["partition", "loss", "bandwidth", "snapshot"];

/// Whom a fault hits; `Leader`/`Follower` are resolved when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Leader,
    Follower,
    Node(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partition {
    /// Cut one node off from every other.
    Isolate(Target),
    /// Cut these nodes (a minority) off from the rest.
    Split(Vec<usize>),
    /// Five nodes in a ring, each seeing only its neighbours: every node sees
    /// a majority (itself and two), no two see the same one.
    MajoritiesRing(Vec<usize>),
    /// Two halves joined only through one bridge node (the middle of the order).
    Bridge(Vec<usize>),
    /// The target hears nobody (inbound) or nobody hears it (outbound).
    OneWay { target: Target, inbound: bool },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    Partition(Partition),
    Kill(Target),
    Pause(Target),
    ClockBump {
        target: Target,
        offset_s: i64,
    },
    ClockStrobe {
        target: Target,
        offset_s: i64,
        period_ms: u64,
    },
    Loss {
        target: Option<Target>,
        probability: f64,
    },
    Bandwidth {
        target: Target,
        rate_kbit: u32,
    },
    /// Blackhole a follower long enough that it needs a snapshot to catch up.
    Snapshot(Target),
    /// SIGKILL the nodes, cut their lazy disks' power (everything no fsync
    /// covered is lost; with `tear`, a prefix of each file's last unsynced
    /// page survives), restart them at heal.
    Power {
        scope: PowerScope,
        tear: bool,
    },
    /// The node's disk answers ENOSPC to every write until healed.
    DiskFull(Target),
    /// The node's next fsync fails with EIO (it is expected to stop; heal
    /// restarts it).
    DiskError(Target),
    /// Every fsync of the node (`None`: of every node) waits `ms` first.
    SlowDisk {
        target: Option<Target>,
        ms: u64,
    },
}

/// Whose power a `Power` fault cuts; the node sets are drawn by the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerScope {
    One(Target),
    /// Fewer than half the slots.
    Minority(Vec<usize>),
    /// More than half, not all.
    Majority(Vec<usize>),
    All,
}

impl Fault {
    pub fn family(&self) -> &'static str {
        match self {
            Fault::Partition(_) => "partition",
            Fault::Kill(_) => "kill",
            Fault::Pause(_) => "pause",
            Fault::ClockBump { .. } | Fault::ClockStrobe { .. } => "clock",
            Fault::Loss { .. } => "loss",
            Fault::Bandwidth { .. } => "bandwidth",
            Fault::Snapshot(_) => "snapshot",
            Fault::Power { .. } => "power",
            Fault::DiskFull(_) => "disk-full",
            Fault::DiskError(_) => "disk-error",
            Fault::SlowDisk { .. } => "slow-disk",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlannedFault {
    /// Offset from the start of the workload phase.
    pub at_ms: u64,
    pub hold_ms: u64,
    pub fault: Fault,
}

/// Mean spacing between fault starts by default: a 5–10 s gap, then a
/// fault held 5–15 s (3–5 faults in 90 s).
pub const DEFAULT_FAULT_EVERY_MS: u64 = 17_500;
/// `--fault-every` bounds.
pub const MIN_FAULT_EVERY_MS: u64 = 2_000;
pub const MAX_FAULT_EVERY_MS: u64 = 3_600_000;
/// Densest spacing that keeps today's 5–15 s holds (a 2.5 s mean gap).
const FULL_HOLD_EVERY_MS: u64 = 12_500;

/// The fault schedule for a run of `limit_ms` at the default density.
pub fn fault_plan(
    rng: &mut StdRng,
    families: &[String],
    nodes: usize,
    limit_ms: u64,
) -> Vec<PlannedFault> {
    fault_plan_every(rng, families, nodes, limit_ms, DEFAULT_FAULT_EVERY_MS)
}

/// Gap and hold ranges (ms, inclusive) for a mean spacing of `every_ms`
/// between fault starts: holds stay 5–15 s while that leaves a gap of at
/// least 2.5 s on average, the gap takes the rest (⅔–4⁄3 of its mean);
/// denser schedules shrink holds and gaps together. Blackholes (snapshot)
/// keep their 25–40 s, so they stretch the spacing where they are drawn.
pub fn density(every_ms: u64) -> ((u64, u64), (u64, u64)) {
    let every = every_ms.clamp(MIN_FAULT_EVERY_MS, MAX_FAULT_EVERY_MS);
    let (hold, gap_mean) = if every >= FULL_HOLD_EVERY_MS {
        ((5_000, 15_000), every - 10_000)
    } else {
        let scale = |ms: u64| ms * every / FULL_HOLD_EVERY_MS;
        ((scale(5_000), scale(15_000)), every / 5)
    };
    ((gap_mean * 2 / 3, gap_mean * 4 / 3), hold)
}

/// The fault schedule for a run of `limit_ms`, a fault starting every
/// `every_ms` on average; faults never overlap. `membership` is not planned
/// here (see [`member_change`]).
pub fn fault_plan_every(
    rng: &mut StdRng,
    families: &[String],
    nodes: usize,
    limit_ms: u64,
    every_ms: u64,
) -> Vec<PlannedFault> {
    let mut plan = Vec::new();
    let families: Vec<&String> = families.iter().filter(|f| *f != MEMBERSHIP).collect();
    if families.is_empty() {
        return plan;
    }
    let ((gap_lo, gap_hi), (hold_lo, hold_hi)) = density(every_ms);
    let mut t = 0u64;
    loop {
        t += rng.gen_range(gap_lo..=gap_hi);
        if t + 1_000 >= limit_ms {
            break;
        }
        let family = families.choose(rng).expect("non-empty").as_str();
        let fault = fault_of(rng, family, nodes);
        let want = match fault {
            Fault::Snapshot(_) => rng.gen_range(25_000..=40_000),
            _ => rng.gen_range(hold_lo..=hold_hi),
        };
        let hold_ms = want.min(limit_ms - t);
        plan.push(PlannedFault {
            at_ms: t,
            hold_ms,
            fault,
        });
        t += hold_ms;
    }
    plan
}

fn target(rng: &mut StdRng, nodes: usize) -> Target {
    if rng.gen_bool(0.5) {
        Target::Leader
    } else {
        Target::Node(rng.gen_range(0..nodes))
    }
}

fn fault_of(rng: &mut StdRng, family: &str, nodes: usize) -> Fault {
    match family {
        "partition" => Fault::Partition(partition_of(rng, nodes)),
        "kill" => Fault::Kill(target(rng, nodes)),
        "pause" => Fault::Pause(target(rng, nodes)),
        "clock" => {
            let offset_s = *[-30i64, -10, -5, -2, 2, 5, 10, 30]
                .choose(rng)
                .expect("non-empty");
            let t = target(rng, nodes);
            if rng.gen_bool(0.5) {
                Fault::ClockBump {
                    target: t,
                    offset_s,
                }
            } else {
                Fault::ClockStrobe {
                    target: t,
                    offset_s,
                    period_ms: rng.gen_range(100..=500),
                }
            }
        }
        "loss" => Fault::Loss {
            target: rng.gen_bool(0.5).then(|| target(rng, nodes)),
            probability: [0.1, 0.2, 0.3, 0.5][rng.gen_range(0..4)],
        },
        "bandwidth" => Fault::Bandwidth {
            target: target(rng, nodes),
            rate_kbit: [128, 256, 512, 1024][rng.gen_range(0..4)],
        },
        "snapshot" => Fault::Snapshot(Target::Follower),
        "power" => Fault::Power {
            scope: power_scope(rng, nodes),
            tear: rng.gen_bool(0.5),
        },
        "disk-full" => Fault::DiskFull(target(rng, nodes)),
        "disk-error" => Fault::DiskError(target(rng, nodes)),
        "slow-disk" => Fault::SlowDisk {
            target: rng.gen_bool(0.5).then(|| target(rng, nodes)),
            ms: rng.gen_range(50..=300),
        },
        other => unreachable!("unknown fault family {other}"),
    }
}

/// The plan with every power fault's scope widened to every node
/// (`--power-all`); other faults and every time are kept.
pub fn power_all(plan: Vec<PlannedFault>) -> Vec<PlannedFault> {
    plan.into_iter()
        .map(|mut p| {
            if let Fault::Power { scope, .. } = &mut p.fault {
                *scope = PowerScope::All;
            }
            p
        })
        .collect()
}

/// One node (leader or any), a minority, a majority, or every node, a
/// quarter each. A 1-node cluster has only one and all.
fn power_scope(rng: &mut StdRng, nodes: usize) -> PowerScope {
    let mut order: Vec<usize> = (0..nodes).collect();
    order.shuffle(rng);
    let minority = (nodes - 1) / 2;
    let majority = nodes / 2 + 1;
    match rng.gen_range(0..4) {
        1 if minority > 0 => PowerScope::Minority(order[..minority].to_vec()),
        2 if majority < nodes => PowerScope::Majority(order[..majority].to_vec()),
        3 => PowerScope::All,
        _ => PowerScope::One(target(rng, nodes)),
    }
}

fn partition_of(rng: &mut StdRng, nodes: usize) -> Partition {
    let mut order: Vec<usize> = (0..nodes).collect();
    order.shuffle(rng);
    // The ring and bridge shapes need five nodes.
    let kinds = if nodes >= 5 { 6 } else { 4 };
    match rng.gen_range(0..kinds) {
        0 => Partition::Isolate(Target::Leader),
        1 => Partition::Isolate(Target::Node(order[0])),
        2 => Partition::Split(order[..(nodes - 1) / 2].to_vec()),
        3 => Partition::OneWay {
            target: target(rng, nodes),
            inbound: rng.gen_bool(0.5),
        },
        4 => Partition::MajoritiesRing(order),
        _ => Partition::Bridge(order),
    }
}

/// (receiver, sender) pairs to drop for a partition with targets resolved.
/// `isolated` is the resolved target of `Isolate`/`OneWay`.
pub fn partition_drops(p: &Partition, nodes: usize, isolated: usize) -> Vec<(usize, usize)> {
    let all = 0..nodes;
    let mut drops = Vec::new();
    let cut = |a: &[usize], b: &[usize], drops: &mut Vec<(usize, usize)>| {
        for &x in a {
            for &y in b {
                drops.push((x, y));
                drops.push((y, x));
            }
        }
    };
    match p {
        Partition::Isolate(_) => {
            let rest: Vec<usize> = all.filter(|i| *i != isolated).collect();
            cut(&[isolated], &rest, &mut drops);
        }
        Partition::Split(minority) => {
            let rest: Vec<usize> = all.filter(|i| !minority.contains(i)).collect();
            cut(minority, &rest, &mut drops);
        }
        Partition::MajoritiesRing(order) => {
            let n = order.len();
            for (pos, &x) in order.iter().enumerate() {
                for (qos, &y) in order.iter().enumerate() {
                    let d = (pos + n - qos) % n;
                    if d != 0 && d != 1 && d != n - 1 {
                        drops.push((x, y));
                    }
                }
            }
        }
        Partition::Bridge(order) => {
            let mid = order.len() / 2;
            cut(&order[..mid], &order[mid + 1..], &mut drops);
        }
        Partition::OneWay { inbound, .. } => {
            for other in all.filter(|i| *i != isolated) {
                drops.push(if *inbound {
                    (isolated, other)
                } else {
                    (other, isolated)
                });
            }
        }
    }
    drops.sort();
    drops.dedup();
    drops
}

/// What a membership change does to the voter it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Remove it and put a fresh node (new id) in its slot.
    Replace,
    /// Remove it and leave its slot vacant when every slot holds a voter;
    /// otherwise fill the vacant slot with a fresh node.
    Resize,
}

/// The next membership change, drawn when none is in progress.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemberChange {
    /// Quiet time before it starts.
    pub gap_ms: u64,
    pub kind: ChangeKind,
    /// The voter removed (`Follower` is not drawn).
    pub target: Target,
    /// SIGKILL the leader this far into the call that changes the voters
    /// (a fraction of how long such a call took last), so the change may be
    /// cut between its two log entries, which come at the end of the call.
    pub kill_leader_at: Option<f64>,
}

/// 3–8 s apart; 60% replace, 40% shrink or grow; half aim at the leader;
/// a third have the leader killed in the second half of the call.
pub fn member_change(rng: &mut StdRng, nodes: usize) -> MemberChange {
    MemberChange {
        gap_ms: rng.gen_range(3_000..=8_000),
        kind: if rng.gen_bool(0.6) {
            ChangeKind::Replace
        } else {
            ChangeKind::Resize
        },
        target: target(rng, nodes),
        kill_leader_at: rng.gen_bool(1.0 / 3.0).then(|| rng.gen_range(0.5..1.0)),
    }
}

/// What a register client does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterChoice {
    pub f: crate::event::OpF,
    /// For updates: 0 means unconditional.
    pub expected_revision: u64,
}

/// Mix: 35% get, 35% CAS update, 15% create, 15% delete. Updates usually
/// expect the last revision this client saw, sometimes a neighbour of it
/// (to exercise mismatches), rarely none at all.
pub fn register_choice(rng: &mut StdRng, known_revision: Option<u64>) -> RegisterChoice {
    use crate::event::OpF;
    let roll = rng.gen_range(0..100);
    let f = match roll {
        0..=34 => OpF::Get,
        35..=69 => OpF::Update,
        70..=84 => OpF::Create,
        _ => OpF::Delete,
    };
    let base = known_revision.unwrap_or(1);
    let expected_revision = match rng.gen_range(0..100) {
        0..=4 => 0,
        5..=19 => base + 1,
        _ => base,
    };
    RegisterChoice {
        f,
        expected_revision,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerPlan {
    pub delay_ms: u64,
    /// Use `at_ms` (harness clock + delay) instead of `after_ms`.
    pub absolute: bool,
    /// Delete it this long after the create was acknowledged.
    pub cancel_after_ms: Option<u64>,
}

pub fn timer_plan(rng: &mut StdRng) -> TimerPlan {
    let delay_ms = rng.gen_range(1_000..=30_000);
    TimerPlan {
        delay_ms,
        absolute: rng.gen_bool(0.5),
        cancel_after_ms: rng
            .gen_bool(0.3)
            .then(|| rng.gen_range(delay_ms / 10..=delay_ms * 9 / 10)),
    }
}

/// Period of the `k`-th interval job: the first is always fast.
pub fn interval_every_ms(rng: &mut StdRng, k: usize) -> u64 {
    if k == 0 {
        return 200;
    }
    *[300u64, 500, 700, 1_000, 1_500, 2_000]
        .choose(rng)
        .expect("non-empty")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn fams(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plan_is_deterministic_bounded_and_sequential() {
        let f = fams(&FAMILIES);
        let a = fault_plan(&mut StdRng::seed_from_u64(7), &f, 5, 300_000);
        let b = fault_plan(&mut StdRng::seed_from_u64(7), &f, 5, 300_000);
        assert_eq!(a, b);
        assert!(a.len() >= 10, "{}", a.len());
        let mut end = 0;
        for p in &a {
            assert!(p.at_ms >= end + 5_000 && p.at_ms <= end + 10_000, "{p:?}");
            assert!(p.at_ms + p.hold_ms <= 300_000);
            if !matches!(p.fault, Fault::Snapshot(_)) {
                assert!(p.hold_ms <= 15_000);
            }
            end = p.at_ms + p.hold_ms;
        }
        let c = fault_plan(&mut StdRng::seed_from_u64(8), &f, 5, 300_000);
        assert_ne!(a, c);
    }

    #[test]
    fn fault_every_sets_the_mean_spacing_and_keeps_the_default_plan() {
        assert_eq!(
            density(DEFAULT_FAULT_EVERY_MS),
            ((5_000, 10_000), (5_000, 15_000))
        );
        let f = fams(&["kill", "pause", "clock"]);
        let old = fault_plan(&mut StdRng::seed_from_u64(9), &f, 3, 600_000);
        let same = fault_plan_every(
            &mut StdRng::seed_from_u64(9),
            &f,
            3,
            600_000,
            DEFAULT_FAULT_EVERY_MS,
        );
        assert_eq!(old, same);
        for every_ms in [3_000u64, 6_000, 12_500, 17_500, 40_000] {
            let limit_ms = every_ms * 400;
            let plan = fault_plan_every(&mut StdRng::seed_from_u64(3), &f, 3, limit_ms, every_ms);
            let mean = plan.last().unwrap().at_ms as f64 / plan.len() as f64;
            let err = (mean - every_ms as f64).abs() / every_ms as f64;
            assert!(err < 0.1, "every {every_ms}: mean {mean}");
            let mut end = 0;
            for p in &plan {
                assert!(p.at_ms > end, "faults overlap at {every_ms}: {p:?}");
                end = p.at_ms + p.hold_ms;
            }
        }
        // 90 s at the default: 3–5 faults.
        let n = fault_plan(&mut StdRng::seed_from_u64(4), &f, 3, 90_000).len();
        assert!((3..=5).contains(&n), "{n}");
    }

    #[test]
    fn membership_is_never_in_the_fault_plan() {
        let f = fams(&["kill", MEMBERSHIP]);
        let plan = fault_plan(&mut StdRng::seed_from_u64(2), &f, 3, 120_000);
        assert!(!plan.is_empty());
        assert!(plan.iter().all(|p| matches!(p.fault, Fault::Kill(_))));
        assert!(fault_plan(
            &mut StdRng::seed_from_u64(2),
            &fams(&[MEMBERSHIP]),
            3,
            120_000
        )
        .is_empty());
    }

    #[test]
    fn member_changes_cover_every_kind_and_stay_in_range() {
        let mut rng = StdRng::seed_from_u64(6);
        let cs: Vec<_> = (0..300).map(|_| member_change(&mut rng, 3)).collect();
        assert!(cs.iter().all(|c| (3_000..=8_000).contains(&c.gap_ms)));
        assert!(cs
            .iter()
            .all(|c| c.kill_leader_at.is_none_or(|f| (0.5..1.0).contains(&f))));
        assert!(cs.iter().all(|c| c.target != Target::Follower));
        assert!(cs
            .iter()
            .all(|c| !matches!(c.target, Target::Node(i) if i >= 3)));
        for kind in [ChangeKind::Replace, ChangeKind::Resize] {
            assert!(cs.iter().any(|c| c.kind == kind), "{kind:?}");
        }
        assert!(cs.iter().any(|c| c.target == Target::Leader));
        let killed = cs.iter().filter(|c| c.kill_leader_at.is_some()).count();
        assert!((60..140).contains(&killed), "{killed}");
    }

    #[test]
    fn disk_faults_are_planned_with_every_scope_and_in_range() {
        let f = fams(&["power", "disk-full", "disk-error", "slow-disk"]);
        let mut rng = StdRng::seed_from_u64(9);
        let plan: Vec<Fault> = (0..40)
            .flat_map(|_| fault_plan(&mut rng, &f, 5, 300_000))
            .map(|p| p.fault)
            .collect();
        for family in ["power", "disk-full", "disk-error", "slow-disk"] {
            assert!(plan.iter().any(|p| p.family() == family), "{family}");
        }
        let powers: Vec<(&PowerScope, bool)> = plan
            .iter()
            .filter_map(|p| match p {
                Fault::Power { scope, tear } => Some((scope, *tear)),
                _ => None,
            })
            .collect();
        let torn = powers.iter().filter(|(_, t)| *t).count();
        assert!(
            torn * 3 > powers.len() && torn * 3 < 2 * powers.len(),
            "{torn}/{}",
            powers.len()
        );
        assert!(powers.iter().any(|(s, _)| matches!(s, PowerScope::One(_))));
        assert!(powers.iter().any(|(s, _)| **s == PowerScope::All));
        for (s, _) in &powers {
            match s {
                PowerScope::Minority(v) => assert_eq!(v.len(), 2),
                PowerScope::Majority(v) => assert_eq!(v.len(), 3),
                _ => {}
            }
        }
        assert!(powers
            .iter()
            .any(|(s, _)| matches!(s, PowerScope::Minority(_))));
        assert!(powers
            .iter()
            .any(|(s, _)| matches!(s, PowerScope::Majority(_))));
        for p in &plan {
            if let Fault::SlowDisk { ms, .. } = p {
                assert!((50..=300).contains(ms), "{ms}");
            }
        }
        let mut rng = StdRng::seed_from_u64(2);
        assert!((0..100).all(|_| matches!(
            power_scope(&mut rng, 1),
            PowerScope::One(_) | PowerScope::All
        )));
    }

    #[test]
    fn power_all_widens_only_power_faults() {
        let f = fams(&["power", "kill"]);
        let plan = fault_plan(&mut StdRng::seed_from_u64(4), &f, 5, 600_000);
        let wide = power_all(plan.clone());
        assert_eq!(plan.len(), wide.len());
        assert!(plan.iter().any(|p| p.fault.family() == "power"));
        assert!(plan
            .iter()
            .any(|p| matches!(&p.fault, Fault::Power { scope, .. } if *scope != PowerScope::All)));
        for (a, b) in plan.iter().zip(&wide) {
            assert_eq!((a.at_ms, a.hold_ms), (b.at_ms, b.hold_ms));
            match (&a.fault, &b.fault) {
                (Fault::Power { tear: t1, .. }, Fault::Power { scope, tear: t2 }) => {
                    assert_eq!((scope, t1), (&PowerScope::All, t2))
                }
                (x, y) => assert_eq!(x, y),
            }
        }
    }

    #[test]
    fn plan_uses_only_requested_families() {
        let plan = fault_plan(
            &mut StdRng::seed_from_u64(1),
            &fams(&["kill", "pause"]),
            3,
            120_000,
        );
        assert!(!plan.is_empty());
        assert!(plan
            .iter()
            .all(|p| matches!(p.fault, Fault::Kill(_) | Fault::Pause(_))));
        assert!(fault_plan(&mut StdRng::seed_from_u64(1), &[], 3, 120_000).is_empty());
    }

    /// Who can each node hear, given drop pairs?
    fn hears(drops: &[(usize, usize)], n: usize) -> Vec<Vec<usize>> {
        (0..n)
            .map(|x| {
                (0..n)
                    .filter(|y| *y != x && !drops.contains(&(x, *y)))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn majorities_ring_gives_everyone_a_distinct_majority() {
        let d = partition_drops(&Partition::MajoritiesRing(vec![0, 1, 2, 3, 4]), 5, 0);
        let h = hears(&d, 5);
        for (x, peers) in h.iter().enumerate() {
            assert_eq!(peers.len(), 2, "node {x} hears {peers:?}");
        }
        assert_eq!(h[0], vec![1, 4]);
        assert_eq!(h[2], vec![1, 3]);
    }

    #[test]
    fn bridge_node_hears_both_halves() {
        let d = partition_drops(&Partition::Bridge(vec![4, 3, 2, 1, 0]), 5, 0);
        let h = hears(&d, 5);
        assert_eq!(h[2], vec![0, 1, 3, 4]);
        assert_eq!(h[4], vec![2, 3]);
        assert_eq!(h[0], vec![1, 2]);
    }

    #[test]
    fn isolate_split_and_one_way() {
        let d = partition_drops(&Partition::Isolate(Target::Leader), 3, 1);
        assert_eq!(hears(&d, 3), vec![vec![2], vec![], vec![0]]);
        let d = partition_drops(&Partition::Split(vec![0, 3]), 5, 0);
        assert_eq!(hears(&d, 5)[0], vec![3]);
        assert_eq!(hears(&d, 5)[1], vec![2, 4]);
        let d = partition_drops(
            &Partition::OneWay {
                target: Target::Node(0),
                inbound: true,
            },
            3,
            0,
        );
        assert_eq!(hears(&d, 3), vec![vec![], vec![0, 2], vec![0, 1]]);
    }

    #[test]
    fn every_partition_shape_is_generated() {
        let mut rng = StdRng::seed_from_u64(5);
        let kinds: std::collections::BTreeSet<String> = (0..400)
            .map(|_| crate::nemesis::kind_name(&Fault::Partition(partition_of(&mut rng, 5))))
            .collect();
        for k in [
            "isolate-leader",
            "isolate-node",
            "majority-minority",
            "majorities-ring",
            "bridge",
        ] {
            assert!(kinds.contains(k), "{k} missing from {kinds:?}");
        }
        let mut rng = StdRng::seed_from_u64(5);
        assert!((0..200).all(|_| !matches!(
            partition_of(&mut rng, 3),
            Partition::MajoritiesRing(_) | Partition::Bridge(_)
        )));
    }

    #[test]
    fn timer_cancels_land_before_the_fire_time() {
        let mut rng = StdRng::seed_from_u64(3);
        let plans: Vec<_> = (0..500).map(|_| timer_plan(&mut rng)).collect();
        assert!(plans.iter().all(|p| (1_000..=30_000).contains(&p.delay_ms)));
        let cancelled = plans.iter().filter(|p| p.cancel_after_ms.is_some()).count();
        assert!((100..200).contains(&cancelled), "{cancelled}");
        assert!(plans
            .iter()
            .all(|p| p.cancel_after_ms.is_none_or(|c| c < p.delay_ms)));
    }

    #[test]
    fn register_mix_covers_every_op() {
        use crate::event::OpF;
        let mut rng = StdRng::seed_from_u64(4);
        let picks: Vec<_> = (0..1_000)
            .map(|_| register_choice(&mut rng, Some(3)))
            .collect();
        for f in [OpF::Get, OpF::Update, OpF::Create, OpF::Delete] {
            assert!(picks.iter().filter(|c| c.f == f).count() > 100, "{f:?}");
        }
        assert!(picks.iter().any(|c| c.expected_revision == 4));
        assert_eq!(interval_every_ms(&mut rng, 0), 200);
    }
}
