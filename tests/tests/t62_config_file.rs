//! Issue #12: `kairos config check FILE` validates a `serve --config` file
//! without starting: unknown keys and bad values are refused naming the key,
//! and the `KAIROS_*` environment overrides the file. SIGTERM stops a node
//! cleanly (exit status 0) and it restarts from its data.

use std::process::Command;

use kairos_tests::kairos_bin;

fn check(file_text: &str, env: &[(&str, &str)]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kairos.toml");
    std::fs::write(&path, file_text).unwrap();
    let mut cmd = Command::new(kairos_bin());
    cmd.args(["config", "check"]).arg(&path);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

const GOOD: &str = r#"
id = 2
listen = "127.0.0.1:7072"
peer_listen = "127.0.0.1:7172"
http = "127.0.0.1:7082"
peers = ["1=127.0.0.1:7171", "2=127.0.0.1:7172", "3=127.0.0.1:7173"]
election_min_ms = 300
election_max_ms = 500
"#;

#[test]
fn a_valid_file_passes_and_bad_ones_name_the_key() {
    let (ok, text) = check(GOOD, &[]);
    assert!(ok && text.contains(": ok"), "{text}");

    let (ok, text) = check(&format!("{GOOD}\nheartbeat = 100\n"), &[]);
    assert!(!ok && text.contains("unknown key \"heartbeat\""), "{text}");

    let (ok, text) = check(&GOOD.replace("\"1=127.0.0.1:7171\", ", ""), &[]);
    assert!(ok, "peers may omit others: {text}");
    let (ok, text) = check(&GOOD.replace("id = 2", "id = 9"), &[]);
    assert!(
        !ok && text.contains("peers: must include this node's own id 9"),
        "{text}"
    );

    let (ok, text) = check(
        &GOOD.replace("listen = \"127.0.0.1:7072\"", "listen = \"10.1.2.3:7072\""),
        &[],
    );
    assert!(
        !ok && text.contains("refusing to serve on non-loopback"),
        "{text}"
    );
}

#[test]
fn the_environment_overrides_the_file() {
    // The file's timeouts are valid; the environment's election minimum is not.
    let (ok, text) = check(GOOD, &[("KAIROS_ELECTION_MIN_MS", "900")]);
    assert!(!ok && text.contains("election timeouts"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_node_cleanly_and_it_restarts_from_its_data() {
    let mut cluster = kairos_tests::Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    kairos_tests::create(&c, kairos_tests::every_job("kept", "g", 60_000))
        .await
        .unwrap();
    let status = cluster
        .terminate(1, std::time::Duration::from_secs(30))
        .expect("the node exits on SIGTERM");
    assert!(status.success(), "exit status {status:?}");
    cluster.start_node(1);
    cluster.wait_leader().await;
    let job = c
        .jobs(|mut j| async move {
            j.get_job(kairos_client::pb::JobRef { id: "kept".into() })
                .await
        })
        .await
        .expect("the job survives the restart");
    assert_eq!(job.spec.map(|s| s.id), Some("kept".to_string()));
}
