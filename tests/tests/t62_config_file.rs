//! Issue #12: `kairos config check FILE` validates a `serve --config` file
//! without starting: unknown keys and bad values are refused naming the key,
//! and the `KAIROS_*` environment overrides the file.

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
