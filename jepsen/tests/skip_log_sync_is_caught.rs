//! Proof that the power nemesis and the checkers bite: a real 3-node
//! cluster on lazy disks, every power fault cutting every node at once,
//! under the register and timers workloads.
//!
//! - With `KAIROS_FAILPOINT=skip-log-sync` (the Raft log is no longer
//!   fdatasynced before openraft is told it is stored: the old behaviour)
//!   the run must be invalid, and the failing checkers must name
//!   acknowledged writes that the cluster lost.
//! - The same run without the failpoint must be valid.
//!
//! Runs the `kairos-jepsen` binary against `target/<profile>/kairos` and
//! `kairos-lazyfs` (a workspace build makes both; CI builds before it
//! tests). Needs root (network namespaces, FUSE) and /dev/fuse.

use std::path::{Path, PathBuf};
use std::process::Command;

fn target_bin(name: &str) -> PathBuf {
    // target/<profile>/deps/<this test> -> target/<profile>/<name>
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .with_file_name(name);
    assert!(
        bin.is_file(),
        "{} missing: build the workspace first (cargo build --workspace)",
        bin.display()
    );
    bin
}

/// Runs the power-all scenario; returns the exit code and results.json.
fn power_all_run(tag: &str, failpoint: Option<&str>) -> (i32, serde_json::Value) {
    assert!(
        rustix::process::geteuid().is_root() && Path::new("/dev/fuse").exists(),
        "this test runs nodes in network namespaces on FUSE disks: it needs root and /dev/fuse"
    );
    let out = std::env::temp_dir().join(format!("kj-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kairos-jepsen"));
    cmd.args(["run", "--nodes", "3", "--time-limit", "40"])
        .args(["--nemesis", "power", "--power-all", "--fault-every", "6"])
        .args([
            "--workload",
            "register,timers",
            "--rate",
            "20",
            "--seed",
            "1",
        ])
        .arg("--bin")
        .arg(target_bin("kairos"))
        .arg("--out")
        .arg(&out)
        .env("KAIROS_LAZYFS_BIN", target_bin("kairos-lazyfs"));
    if let Some(f) = failpoint {
        cmd.args(["--failpoint", f]);
    }
    let done = cmd.output().expect("kairos-jepsen runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    );
    let code = done.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "the run had no verdict (exit {code}):\n{said}"
    );
    let results = std::fs::read_to_string(out.join("results.json"))
        .unwrap_or_else(|e| panic!("results.json: {e}\n{said}"));
    let results: serde_json::Value = serde_json::from_str(&results).unwrap();
    let history = std::fs::read_to_string(out.join("history.jsonl")).unwrap();
    let cuts = history
        .lines()
        .filter(|l| l.contains("\"phase\":\"start\"") && l.contains("\"kind\":\"power-all"))
        .count();
    assert!(cuts >= 3, "only {cuts} power-all cuts:\n{said}");
    let _ = std::fs::remove_dir_all(&out);
    (code, results)
}

#[test]
fn with_skip_log_sync_a_power_cut_of_every_node_loses_acknowledged_writes_and_the_run_says_so() {
    let (code, results) = power_all_run("skip-sync", Some("skip-log-sync"));
    assert_eq!(code, 1, "the run must be invalid: {results}");
    assert_eq!(results["failpoint"], "skip-log-sync", "{results}");
    // The checkers that judge acknowledged writes against the final state:
    // at least one fails, and each that fails names acknowledged operations.
    let failed: Vec<&str> = results["failed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f.as_str())
        .filter(|f| ["no-lost-jobs", "no-undone-writes", "linearizable-register"].contains(f))
        .collect();
    assert!(
        !failed.is_empty(),
        "no checker of acknowledged writes failed: {results}"
    );
    for name in failed {
        let c = &results["checkers"][name];
        let examples = c["counterexamples"].as_array().unwrap();
        // The register checker's counterexample is a history window; the
        // others name each acknowledged operation that was lost or undone.
        let named = name == "linearizable-register"
            || examples
                .iter()
                .all(|e| e.get("acknowledged_at_ms").is_some() && e.get("op").is_some());
        assert!(
            !examples.is_empty() && named,
            "{name} does not name the acknowledged operations it lost: {c}"
        );
    }
}

#[test]
fn without_the_failpoint_the_same_power_cuts_lose_nothing() {
    let (code, results) = power_all_run("synced", None);
    assert_eq!(code, 0, "the run must be valid: {results}");
    assert!(
        results.get("failpoint").is_none_or(|f| f == ""),
        "{results}"
    );
}
