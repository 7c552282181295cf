//! Builders for small synthetic histories, shared by the checkers' unit tests
//! and the doctored-history integration test. `healthy_history` is a short,
//! fully valid run (an interval job, a fired timer, a cancelled timer, register
//! operations, a kill fault, a probe write, quiesce and three agreeing final
//! states) that tests corrupt one way at a time.

use crate::event::*;

pub const BASE_MS: i64 = 1_700_000_000_000;

pub fn invoke(op: u64, process: u64, t: i64, workload: Workload, f: OpF, key: &str) -> Event {
    Event::Invoke(Invoke::new(op, process, 1, t, workload, f, key))
}

pub fn done(op: u64, process: u64, t: i64, outcome: Outcome) -> Event {
    Event::Complete(Complete::bare(op, process, t, outcome))
}

pub fn nemesis(id: u64, t: i64, phase: Phase, fault: &str) -> Event {
    Event::Nemesis(NemesisEvent {
        id,
        time_ms: t,
        phase,
        fault: fault.to_string(),
        kind: fault.to_string(),
        nodes: vec![2],
        detail: String::new(),
    })
}

/// A register operation completing 5 ms after its invocation. Failures carry
/// the code a definite rejection of `f` would have.
#[allow(clippy::too_many_arguments)]
pub fn reg_op(
    op: u64,
    process: u64,
    t: i64,
    f: OpF,
    value: Option<u64>,
    expected_revision: Option<u64>,
    outcome: Outcome,
    revision: Option<u64>,
    read_value: Option<u64>,
) -> Vec<Event> {
    let mut i = invoke(op, process, t, Workload::Register, f, "reg-0");
    if let Event::Invoke(inv) = &mut i {
        inv.value = value;
        inv.expected_revision = expected_revision;
    }
    let mut c = Complete::bare(op, process, t + 5, outcome);
    c.revision = revision;
    c.value = read_value.or(if f == OpF::Get { None } else { value });
    if f == OpF::Delete && outcome == Outcome::Ok {
        c.deleted = Some(true);
    }
    if outcome == Outcome::Fail {
        c.code = Some(
            match f {
                OpF::Create => "ALREADY_EXISTS",
                OpF::Update => "FAILED_PRECONDITION",
                _ => "NOT_FOUND",
            }
            .to_string(),
        );
    }
    if outcome == Outcome::Unknown {
        c.code = Some("DEADLINE_EXCEEDED".to_string());
    }
    vec![i, Event::Complete(c)]
}

/// A get that found nothing.
pub fn reg_get_missing(op: u64, process: u64, t: i64) -> Vec<Event> {
    let i = invoke(op, process, t, Workload::Register, OpF::Get, "reg-0");
    let mut c = Complete::bare(op, process, t + 5, Outcome::Ok);
    c.found = Some(false);
    vec![i, Event::Complete(c)]
}

/// An acknowledged create of a scheduled job whose first fire is `next_fire_at_ms`.
pub fn create_ok(
    op: u64,
    t: i64,
    workload: Workload,
    key: &str,
    next_fire_at_ms: i64,
) -> Vec<Event> {
    let mut i = invoke(op, 100 + op, t, workload, OpF::Create, key);
    if let Event::Invoke(inv) = &mut i {
        match workload {
            Workload::Interval => inv.every_ms = Some(1_000),
            _ => inv.at_ms = Some(next_fire_at_ms),
        }
    }
    let mut c = Complete::bare(op, 100 + op, t + 10, Outcome::Ok);
    c.revision = Some(1);
    c.created_at_ms = Some(t + 5);
    c.next_fire_at_ms = Some(next_fire_at_ms);
    vec![i, Event::Complete(c)]
}

/// An acknowledged operation with no result fields (a delete or pause).
pub fn simple_ok(op: u64, t: i64, workload: Workload, f: OpF, key: &str) -> Vec<Event> {
    let i = invoke(op, 100 + op, t, workload, f, key);
    let mut c = Complete::bare(op, 100 + op, t + 10, Outcome::Ok);
    if f == OpF::Delete {
        c.deleted = Some(true);
    }
    vec![i, Event::Complete(c)]
}

pub fn fire(job: &str, scheduled_at_ms: i64, fired_at_ms: i64) -> FinalRun {
    FinalRun {
        run_id: format!("{job}@{scheduled_at_ms}"),
        job: job.to_string(),
        scheduled_at_ms,
        fired_at_ms,
        state: "SUCCEEDED".to_string(),
        attempt: 1,
        ..Default::default()
    }
}

pub fn receipt(job: &str, scheduled_at_ms: i64, received_at_ms: i64, attempt: u32) -> Event {
    Event::Receipt(Receipt {
        worker: "w0".to_string(),
        node: 1,
        run_id: format!("{job}@{scheduled_at_ms}"),
        job: job.to_string(),
        scheduled_at_ms,
        fired_at_ms: scheduled_at_ms,
        received_at_ms,
        attempt,
    })
}

pub fn final_node(node: u64, applied_index: u64, runs: Vec<FinalRun>) -> FinalNode {
    FinalNode {
        time_ms: BASE_MS + 16_000,
        node,
        reachable: true,
        role: if node == 1 { "leader" } else { "follower" }.to_string(),
        leader: 1,
        term: 2,
        applied_index,
        state_digest: format!("digest-{applied_index}"),
        digest_index: applied_index,
        applied_index_after: applied_index,
        voters: vec![1, 2, 3],
        learners: Vec::new(),
        membership_changing: false,
        error: None,
        jobs: Vec::new(),
        runs,
    }
}

fn job(id: &str, paused: bool, next_fire_at_ms: i64) -> FinalJob {
    FinalJob {
        id: id.to_string(),
        revision: 1,
        paused,
        created_at_ms: BASE_MS,
        next_fire_at_ms,
        ..Default::default()
    }
}

/// Interval job `int-0` fires every second from +2 s to +14 s; timer `tmr-0`
/// fires at +4.51 s; timer `tmr-1` is cancelled long before +20 s.
pub fn healthy_history() -> Vec<Event> {
    let b = BASE_MS;
    let mut ev = vec![healthy_meta()];
    ev.extend(healthy_ops());
    ev.push(nemesis(1, b + 5_000, Phase::Start, "kill"));
    ev.push(nemesis(1, b + 8_000, Phase::Stop, "kill"));
    let mut runs = Vec::new();
    for k in 0..13 {
        let t = b + 2_000 + k * 1_000;
        runs.push(fire("int-0", t, t + 20));
        ev.push(receipt("int-0", t, t + 40, 1));
    }
    runs.push(fire("tmr-0", b + 4_510, b + 4_530));
    ev.push(receipt("tmr-0", b + 4_510, b + 4_550, 1));
    ev.extend(simple_ok(
        8,
        b + 14_000,
        Workload::Probe,
        OpF::Create,
        "probe-test",
    ));
    ev.extend(simple_ok(
        9,
        b + 14_500,
        Workload::Quiesce,
        OpF::Pause,
        "int-0",
    ));
    for node in 1..=3 {
        let mut f = final_node(node, 100, runs.clone());
        let far = b + 10_000_000;
        f.jobs = vec![
            job("int-0", true, 0),
            job("tmr-0", false, 0),
            job("reg-0", false, far),
            job("probe-test", false, far),
        ];
        ev.push(Event::Final(f));
    }
    ev
}

fn healthy_meta() -> Event {
    Event::Meta(Meta {
        run_id: "test".into(),
        seed: 1,
        mode: "netns".into(),
        nodes: (1..=3)
            .map(|id| NodeInfo {
                id,
                addr: format!("10.0.0.{id}:7070"),
            })
            .collect(),
        start_ms: BASE_MS,
        time_limit_s: 15,
        nemeses: vec!["kill".into()],
        workloads: ["register", "interval", "timers", "execution"]
            .map(String::from)
            .to_vec(),
        bounds: Bounds {
            execution_grace_ms: 2_000,
            ..Bounds::default()
        },
        dropped_nemeses: Vec::new(),
        failpoint: String::new(),
        power_all: false,
    })
}

/// Creates, the timely cancel of `tmr-1`, and register create/update/get.
fn healthy_ops() -> Vec<Event> {
    let b = BASE_MS;
    let (ok, get, create, update) = (Outcome::Ok, OpF::Get, OpF::Create, OpF::Update);
    [
        create_ok(1, b + 1_000, Workload::Interval, "int-0", b + 2_000),
        create_ok(2, b + 1_500, Workload::Timers, "tmr-0", b + 4_510),
        create_ok(3, b + 1_600, Workload::Timers, "tmr-1", b + 20_000),
        simple_ok(4, b + 2_000, Workload::Timers, OpF::Delete, "tmr-1"),
        reg_op(5, 0, b + 2_100, create, Some(1), None, ok, Some(1), None),
        reg_op(6, 0, b + 2_200, update, Some(2), Some(1), ok, Some(2), None),
        reg_op(7, 1, b + 2_300, get, None, None, ok, Some(2), Some(2)),
    ]
    .concat()
}

/// `node` claims to lead `term`, as seen by `reporter` at `t` through `source`.
pub fn leader_claim(t: i64, term: u64, node: u64, reporter: u64, source: &str) -> Event {
    Event::Leader(LeaderClaim {
        time_ms: t,
        term,
        node,
        source: source.to_string(),
        reporter,
        node_time: String::new(),
    })
}

/// Applies `f` to every final node state of `events`.
pub fn edit_finals(events: &mut [Event], mut f: impl FnMut(&mut FinalNode)) {
    for e in events.iter_mut() {
        if let Event::Final(n) = e {
            f(n);
        }
    }
}
