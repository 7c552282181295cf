//! Workflows (issue #15): upstream cycles decided in apply, by outputs.
//! Each job here finishes its runs through `Finish` reports, as workers do.

use super::*;
use crate::core::command::VersionedCommand;

fn downstream(id: &str, ups: &[&str], rule: TriggerRule, on_failure: OnUpstreamFailure) -> JobSpec {
    JobSpec {
        workflow: Some(Workflow {
            upstream: ups.iter().map(|u| u.to_string()).collect(),
            rule,
            on_failure,
        }),
        ..spec(id, ScheduleInput::Upstream)
    }
}

fn after(id: &str, ups: &[&str]) -> JobSpec {
    downstream(id, ups, TriggerRule::AllSuccess, OnUpstreamFailure::Block)
}

fn done(sim: &mut Sim, now: i64, run: &RunId, success: bool) -> Applied {
    let mut r = report(run, sim.run(run).attempt, success, 0);
    r.retryable = false;
    r.result = format!("{{\"from\": \"{}\"}}", run.job).into_bytes();
    let a = sim.finish(now, r);
    assert!(
        !matches!(a.response, Response::Error(_)),
        "{:?}",
        a.response
    );
    a
}

fn only_run(sim: &Sim, job: &str) -> Run {
    let runs = sim.runs_of(job);
    assert_eq!(runs.len(), 1, "{job}: {runs:?}");
    runs.into_iter().next().unwrap()
}

fn inputs(sim: &Sim, run: &RunId) -> Vec<(String, RunId)> {
    sim.view
        .get(&keys::run_inputs(run))
        .map(|b| decode(&b).unwrap())
        .unwrap_or_default()
}

/// A → B, A → C, B + C → D; A every second.
fn diamond() -> Sim {
    let mut sim = Sim::default();
    sim.create(every("a", 1000), T0);
    sim.create(after("b", &["a"]), T0);
    sim.create(after("c", &["a"]), T0);
    sim.create(after("d", &["b", "c"]), T0);
    sim
}

#[test]
fn a_diamond_runs_its_last_job_exactly_once_per_cycle_with_both_results() {
    let mut sim = diamond();
    for cycle in 1..=2 {
        let t = T0 + cycle * 1000;
        sim.fire_due(t);
        let a = rid("a", t);
        let fin = done(&mut sim, t + 10, &a, true);
        // The finish and the runs it starts are one apply.
        let started: Vec<&str> = fin
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::Ready(r) => Some(r.run.job.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(started, vec!["b", "c"], "cycle {cycle}");
        let b = sim.runs_of("b").last().unwrap().id.clone();
        let c = sim.runs_of("c").last().unwrap().id.clone();
        assert_eq!(inputs(&sim, &b), vec![("a".into(), a.clone())]);
        done(&mut sim, t + 20, &b, true);
        assert_eq!(sim.runs_of("d").len() as i64, cycle - 1, "d waits for c");
        assert!(sim
            .job("d")
            .cycle
            .describe(sim.job("d").workflow.as_ref().unwrap())
            .contains("waiting for upstream c"));
        let fin = done(&mut sim, t + 30, &c, true);
        assert!(fin
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Ready(r) if r.run.job == "d")));
        let d = sim.runs_of("d");
        assert_eq!(d.len() as i64, cycle, "d ran once for cycle {cycle}");
        let d = d.last().unwrap();
        assert_eq!(d.state, RunState::Pending);
        assert_eq!(inputs(&sim, &d.id), vec![("b".into(), b), ("c".into(), c)]);
        assert!(d.note.starts_with("workflow: after b@"), "{}", d.note);
        done(&mut sim, t + 40, &d.id, true);
    }
    assert_eq!(
        sim.job("d").cycle,
        Cycle {
            last_run_ms: T0 + 2030,
            ..Cycle::default()
        }
    );
}

#[test]
fn block_ends_the_cycle_and_says_why_skip_runs_anyway_wait_for_retry_runs_after_the_retry() {
    let mut sim = Sim::default();
    sim.create(every("a", 1000), T0);
    sim.create(after("block", &["a"]), T0);
    sim.create(
        downstream(
            "skip",
            &["a"],
            TriggerRule::AllSuccess,
            OnUpstreamFailure::Skip,
        ),
        T0,
    );
    sim.create(
        downstream(
            "wait",
            &["a"],
            TriggerRule::AllSuccess,
            OnUpstreamFailure::WaitForRetry,
        ),
        T0,
    );
    sim.fire_due(T0 + 1000);
    let a = rid("a", T0 + 1000);
    done(&mut sim, T0 + 1010, &a, false);
    assert!(sim.runs_of("block").is_empty());
    let blocked = sim.job("block");
    let why = blocked.cycle.describe(blocked.workflow.as_ref().unwrap());
    assert!(
        why.starts_with("blocked: upstream \"a\" run") && why.contains("failed"),
        "{why}"
    );
    assert_eq!(only_run(&sim, "skip").state, RunState::Pending);
    assert!(sim.runs_of("wait").is_empty());
    let waiting = sim.job("wait");
    assert!(waiting
        .cycle
        .describe(waiting.workflow.as_ref().unwrap())
        .starts_with("waiting for a retry of upstream \"a\""));

    // A manual retry of a's run succeeds: wait runs, block does not (its
    // cycle ended), and a new cycle of block runs.
    let r = sim.exec(Command::RetryRun {
        run: a.clone(),
        now_ms: T0 + 1100,
    });
    assert!(matches!(r.response, Response::Run(_)), "{:?}", r.response);
    done(&mut sim, T0 + 1110, &a, true);
    assert_eq!(only_run(&sim, "wait").state, RunState::Pending);
    assert_eq!(
        inputs(&sim, &only_run(&sim, "wait").id),
        vec![("a".into(), a)]
    );
    assert_eq!(
        only_run(&sim, "block").state,
        RunState::Pending,
        "the retried run is a new cycle"
    );
    assert_eq!(sim.job("block").cycle.blocked, None);
}

#[test]
fn each_trigger_rule_decides_on_the_outcomes_it_names() {
    let mut sim = Sim::default();
    sim.create(every("x", 1000), T0);
    sim.create(every("y", 1000), T0);
    for rule in TriggerRule::ALL {
        sim.create(
            downstream(rule.as_str(), &["x", "y"], rule, OnUpstreamFailure::Block),
            T0,
        );
    }
    sim.fire_due(T0 + 1000);
    done(&mut sim, T0 + 1010, &rid("x", T0 + 1000), false);
    let ran = |sim: &Sim| -> Vec<&'static str> {
        TriggerRule::ALL
            .into_iter()
            .filter(|r| !sim.runs_of(r.as_str()).is_empty())
            .map(|r| r.as_str())
            .collect()
    };
    assert_eq!(ran(&sim), vec!["one-failed"], "after x failed");
    assert!(sim.job("all-success").cycle.blocked.is_some());
    assert!(sim.job("none-failed").cycle.blocked.is_some());
    done(&mut sim, T0 + 1020, &rid("y", T0 + 1000), true);
    assert_eq!(
        ran(&sim),
        vec!["all-done", "one-success", "one-failed"],
        "after y succeeded"
    );
    // y's run opens the next cycle of the rules whose cycle x's failure ended.
    let next = sim.job("all-success");
    assert_eq!(
        next.cycle.describe(next.workflow.as_ref().unwrap()),
        "waiting for upstream x"
    );
}

#[test]
fn a_job_with_its_own_schedule_runs_when_both_its_time_and_a_cycle_have_come() {
    let mut sim = Sim::default();
    sim.create(spec("a", ScheduleInput::At { at_ms: T0 + 5000 }), T0);
    let mut d = after("d", &["a"]);
    d.schedule = ScheduleInput::Every { every_ms: 1000 };
    sim.create(d, T0);
    // Its time comes first: the occurrence waits (a newer one replaces it).
    sim.fire_due(T0 + 1000);
    sim.fire_due(T0 + 2000);
    assert_eq!(sim.job("d").cycle.held_at_ms, Some(T0 + 2000));
    let skipped = only_run(&sim, "d");
    assert_eq!(
        (skipped.id.scheduled_at_ms, skipped.state),
        (T0 + 1000, RunState::Skipped)
    );
    assert!(
        skipped.note.starts_with("workflow: no upstream cycle"),
        "{}",
        skipped.note
    );
    // The cycle completes: the held occurrence runs, at its own time.
    while !sim.due(T0 + 5000).is_empty() {
        sim.fire_due(T0 + 5000);
    }
    assert_eq!(sim.job("d").cycle.held_at_ms, Some(T0 + 5000));
    done(&mut sim, T0 + 5100, &rid("a", T0 + 5000), true);
    let states: Vec<RunState> = sim.runs_of("d").iter().map(|r| r.state).collect();
    assert_eq!(
        states,
        [vec![RunState::Skipped; 4], vec![RunState::Pending]].concat()
    );
    let run = sim.run(&rid("d", T0 + 5000));
    assert_eq!(run.state, RunState::Pending);
    assert_eq!(
        inputs(&sim, &run.id),
        vec![("a".into(), rid("a", T0 + 5000))]
    );
}

#[test]
fn a_cycle_completed_before_the_next_occurrence_waits_for_it() {
    let mut sim = Sim::default();
    sim.create(spec("a", ScheduleInput::At { at_ms: T0 + 500 }), T0);
    let mut d = after("d", &["a"]);
    d.schedule = ScheduleInput::Every { every_ms: 1000 };
    sim.create(d, T0);
    sim.fire_due(T0 + 500);
    done(&mut sim, T0 + 600, &rid("a", T0 + 500), true);
    assert!(sim.runs_of("d").is_empty());
    assert!(sim.job("d").cycle.ready.is_some());
    sim.fire_due(T0 + 1000);
    let run = only_run(&sim, "d");
    assert_eq!(
        (run.id.scheduled_at_ms, run.state),
        (T0 + 1000, RunState::Pending)
    );
    assert_eq!(
        inputs(&sim, &run.id),
        vec![("a".into(), rid("a", T0 + 500))]
    );
}

#[test]
fn cycles_unknown_sharded_and_deleted_upstreams_are_refused_naming_what_is_wrong() {
    let mut sim = diamond();
    // a → b → d: making a follow d closes a cycle.
    let mut a = every("a", 1000);
    a.workflow = after("a", &["d"]).workflow;
    let r = sim.exec(update(a, 0, T0 + 1));
    assert_eq!(
        invalid_msg(&r),
        "upstream: would close a cycle a -> c -> d -> a"
    );
    assert_nothing_done(&r);
    let r = sim.exec(Command::create_job(after("e", &["nope"]), T0 + 1));
    assert_eq!(invalid_msg(&r), "upstream: job \"nope\" not found");
    assert_nothing_done(&r);
    let mut sharded = every("s", 1000);
    sharded.policy.fanout = Fanout::Shards(2);
    sim.create(sharded, T0 + 1);
    let r = sim.exec(Command::create_job(after("e", &["s"]), T0 + 2));
    assert!(
        invalid_msg(&r).contains("sharded or broadcast"),
        "{}",
        invalid_msg(&r)
    );
    // An upstream with downstreams is neither deleted nor made sharded.
    let r = sim.exec(Command::DeleteJob {
        id: "b".into(),
        now_ms: T0 + 3,
    });
    match &r.response {
        Response::Error(CommandError::FailedPrecondition(m)) => {
            assert!(m.contains("upstream of \"d\""), "{m}")
        }
        other => panic!("{other:?}"),
    }
    let mut b = after("b", &["a"]);
    b.policy.fanout = Fanout::Broadcast;
    assert!(matches!(
        sim.exec(update(b, 0, T0 + 3)).response,
        Response::Error(CommandError::FailedPrecondition(_))
    ));
    // Deleting the downstream first unlinks it; then the upstream goes.
    assert_eq!(
        sim.exec(Command::DeleteJob {
            id: "d".into(),
            now_ms: T0 + 4
        })
        .response,
        Response::Deleted(true)
    );
    assert_eq!(
        sim.exec(Command::DeleteJob {
            id: "b".into(),
            now_ms: T0 + 5
        })
        .response,
        Response::Deleted(true)
    );
    assert!(sim.view.get(&keys::downstream("b", "d")).is_none());
    for bad in [
        (
            after("e", &[]),
            "upstream: must list 1 to 32 job ids, got 0",
        ),
        (
            after("e", &["e"]),
            "upstream: a job cannot be its own upstream (\"e\")",
        ),
        (after("e", &["a", "a"]), "upstream: \"a\" is listed twice"),
        (
            spec("e", ScheduleInput::Upstream),
            "upstream: a job without a schedule of its own needs 1 to 32 upstream jobs",
        ),
    ] {
        let r = sim.exec(Command::create_job(bad.0, T0 + 6));
        assert_eq!(invalid_msg(&r), bad.1);
        assert_nothing_done(&r);
    }
}

#[test]
fn a_paused_downstream_does_not_follow_and_workflows_need_log_format_3() {
    let mut sim = Sim::default();
    sim.create(every("a", 1000), T0);
    sim.create(after("b", &["a"]), T0);
    sim.exec(Command::pause_job("b".into(), String::new(), T0 + 1));
    sim.fire_due(T0 + 1000);
    done(&mut sim, T0 + 1010, &rid("a", T0 + 1000), true);
    assert!(sim.runs_of("b").is_empty());
    assert_eq!(sim.job("b").cycle, Cycle::default());
    let restore = |pairs: Vec<(Vec<u8>, Vec<u8>)>| Command::RestorePairs {
        pairs,
        first: true,
        last: true,
        now_ms: T0,
    };
    let plain = sim.view.get(&keys::job("a")).unwrap();
    let tailed = sim.view.get(&keys::job("b")).unwrap();
    assert!(!Job::record_has_tail(&plain) && Job::record_has_tail(&tailed));
    assert_eq!(restore(vec![(keys::job("a"), plain)]).min_format(), 1);
    for cmd in [
        Command::create_job(after("c", &["a"]), T0),
        Command::create_job(spec("c", ScheduleInput::Upstream), T0),
        restore(vec![(keys::job("b"), tailed)]),
        restore(vec![(keys::downstream("a", "b"), Vec::new())]),
    ] {
        assert_eq!(cmd.min_format(), 3, "{cmd:?}");
        assert!(VersionedCommand::at(&cmd, 2).is_err());
    }
}
