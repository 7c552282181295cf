//! The `check` entry point flags each kind of doctored history: a duplicated
//! fire record, a removed fire record, a receipt moved before its scheduled
//! time, and an acknowledged create dropped from the final state. Each case
//! writes a history.jsonl to a temp directory and checks it like `check DIR`.

use kairos_jepsen::check::{check_dir, HISTORY_FILE};
use kairos_jepsen::event::Event;
use kairos_jepsen::history::write_history;
use kairos_jepsen::testkit::{edit_finals, healthy_history, BASE_MS};
use std::path::PathBuf;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kairos-jepsen-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes the history, runs `check`, returns the failing checker names.
fn failed_checkers(name: &str, events: &[Event]) -> Vec<String> {
    let dir = temp_dir(name);
    write_history(&dir.join(HISTORY_FILE), events).unwrap();
    let summary = check_dir(&dir).unwrap();
    for f in ["results.json", "lateness.svg", "timeline.html"] {
        assert!(dir.join(f).exists(), "{f} not written");
    }
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["valid"], summary.valid);
    std::fs::remove_dir_all(&dir).unwrap();
    summary.failed().into_iter().map(String::from).collect()
}

#[test]
fn healthy_history_passes_every_checker() {
    assert_eq!(
        failed_checkers("healthy", &healthy_history()),
        Vec::<String>::new()
    );
}

#[test]
fn duplicated_fire_record_is_flagged() {
    let mut ev = healthy_history();
    edit_finals(&mut ev, |f| {
        if f.node == 2 {
            let dup = f.runs[5].clone();
            f.runs.push(dup);
        }
    });
    let failed = failed_checkers("dup-fire", &ev);
    assert!(
        failed.contains(&"exactly-once-fires".to_string()),
        "{failed:?}"
    );
}

#[test]
fn duplicated_receipt_alone_is_fine() {
    // At-least-once: the same (run, attempt) may be delivered twice.
    let mut ev = healthy_history();
    let r = ev
        .iter()
        .find(|e| matches!(e, Event::Receipt(_)))
        .unwrap()
        .clone();
    ev.push(r);
    assert_eq!(failed_checkers("dup-receipt", &ev), Vec::<String>::new());
}

#[test]
fn removed_fire_record_is_flagged() {
    let t = BASE_MS + 2_000;
    let mut everywhere = healthy_history();
    edit_finals(&mut everywhere, |f| {
        f.runs.retain(|r| r.scheduled_at_ms != t)
    });
    let failed = failed_checkers("removed-all", &everywhere);
    for c in ["no-missed-occurrence", "receipt-has-fire-record"] {
        assert!(failed.contains(&c.to_string()), "{c} not in {failed:?}");
    }
    let mut one = healthy_history();
    edit_finals(&mut one, |f| {
        if f.node == 3 {
            f.runs.retain(|r| r.scheduled_at_ms != t);
        }
    });
    let failed = failed_checkers("removed-one", &one);
    assert!(failed.contains(&"replicas-agree".to_string()), "{failed:?}");
}

#[test]
fn receipt_before_scheduled_time_is_flagged() {
    let mut ev = healthy_history();
    for e in ev.iter_mut() {
        if let Event::Receipt(r) = e {
            if r.scheduled_at_ms == BASE_MS + 6_000 {
                r.received_at_ms = r.scheduled_at_ms - 1_500;
            }
        }
    }
    let failed = failed_checkers("early-receipt", &ev);
    assert_eq!(failed, vec!["never-early".to_string()]);
}

#[test]
fn dropped_acknowledged_create_is_flagged() {
    let mut ev = healthy_history();
    edit_finals(&mut ev, |f| f.jobs.retain(|j| j.id != "reg-0"));
    let failed = failed_checkers("dropped-create", &ev);
    assert_eq!(failed, vec!["no-lost-jobs".to_string()]);
}
