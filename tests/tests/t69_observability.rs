//! What an operator sees of a run: one JSON log line per fire, dispatch,
//! retry and finish on the leader only, each carrying the run id, attempt,
//! job, group and worker (`grep RUN_ID` tells the story); `job stats`
//! counting it; and every `kairos_*` name the shipped Grafana dashboard and
//! Prometheus rules use being exported by a real node's /metrics.

use std::collections::BTreeSet;
use std::time::Duration;

use kairos_client::pb;
use kairos_client::worker::{Outcome, Task, Worker};
use kairos_tests::{create, wait_for, Cluster};
use serde_json::Value;

/// Fails attempt 1 (retryable), succeeds attempt 2.
fn story_job() -> pb::JobSpec {
    pb::JobSpec {
        id: "story".into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(100)),
        }),
        group: "obs".into(),
        max_attempts: 2,
        backoff_ms: 100,
        ..Default::default()
    }
}

/// The JSON log lines of every node that mention `needle`, with the node id.
fn lines_with(cluster: &Cluster, needle: &str) -> Vec<(u64, Value)> {
    let mut found = Vec::new();
    for n in &cluster.nodes {
        let log = std::fs::read_to_string(n.data.with_extension("log")).unwrap_or_default();
        for line in log.lines().filter(|l| l.contains(needle)) {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| {
                panic!("node {} wrote a line that is not JSON ({e}): {line}", n.id)
            });
            found.push((n.id, v));
        }
    }
    found
}

/// The one line with `message` for `attempt`: its node and its span fields.
fn step<'a>(lines: &'a [(u64, Value)], message: &str, attempt: u64) -> (u64, &'a Value) {
    let hits: Vec<_> = lines
        .iter()
        .filter(|(_, v)| v["fields"]["message"] == message && v["span"]["attempt"] == attempt)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "one {message:?} line for attempt {attempt}: {lines:#?}"
    );
    (hits[0].0, &hits[0].1)
}

async fn wait_final(c: &kairos_client::Client) -> pb::Run {
    wait_for(
        "the story run to succeed",
        Duration::from_secs(60),
        || async {
            let r = c.list_runs("story", 1).await.ok()?.into_iter().next()?;
            (r.state == pb::RunState::Succeeded as i32).then_some(r)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_traced_counted_and_every_dashboard_metric_is_exported() {
    let cluster = Cluster::start(3, &["--log-format", "json"]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    let worker = Worker::connect(cluster.endpoints(), "obs").id("w-obs");
    let handle = tokio::spawn(worker.run(|t: Task| async move {
        if t.attempt == 1 {
            Outcome::Failure {
                error: "first attempt fails".into(),
                retryable: true,
            }
        } else {
            Outcome::Success(b"ok".to_vec())
        }
    }));
    create(&c, story_job()).await.unwrap();
    let run = wait_final(&c).await;
    handle.abort();

    // The story, from the leader's log only: fired, dispatched, retry
    // ready, dispatched again, finished — followers apply the same entries
    // and write none of it.
    let id = run.run_id.clone();
    let lines = wait_for(
        "the finish line in the logs",
        Duration::from_secs(10),
        || async {
            let lines = lines_with(&cluster, &format!("\"run\":\"{id}\""));
            lines
                .iter()
                .any(|(_, v)| v["fields"]["message"] == "run finished")
                .then_some(lines)
        },
    )
    .await;
    let fired = step(&lines, "run fired", 1);
    let first = step(&lines, "run dispatched", 1);
    let retry = step(&lines, "run retry ready", 2);
    let second = step(&lines, "run dispatched", 2);
    let finished = step(&lines, "run finished", 2);
    assert_eq!(lines.len(), 5, "{lines:#?}");
    let steps = [
        (fired, "run.fire"),
        (first, "run.dispatch"),
        (retry, "run.retry"),
        (second, "run.dispatch"),
        (finished, "run.finish"),
    ];
    for ((node, v), name) in steps {
        assert_eq!(node, leader, "logged by the leader: {v}");
        let span = &v["span"];
        assert_eq!(
            (&span["name"], &span["run"], &span["job"], &span["group"]),
            (
                &name.into(),
                &Value::from(id.as_str()),
                &"story".into(),
                &"obs".into()
            ),
            "{v}"
        );
    }
    assert_eq!(first.1["span"]["worker"], "w-obs");
    assert_eq!(finished.1["span"]["worker"], "w-obs");
    assert_eq!(finished.1["fields"]["outcome"], "succeeded");
    assert!(fired.1["fields"]["late_ms"].is_i64(), "{}", fired.1);

    // Job statistics, through kairosctl, from a follower (forwarded).
    let (ok, out) = cluster.kairosctl(&["--output", "json", "job", "stats", "story"]);
    assert!(ok, "{out}");
    let st: Value = serde_json::from_str(out.trim()).expect(&out);
    let counts = [
        "runs",
        "fired",
        "succeeded",
        "failed",
        "timed_out",
        "skipped",
        "active",
    ]
    .map(|k| st[k].as_u64().unwrap_or(u64::MAX));
    assert_eq!(counts, [1, 1, 1, 0, 0, 0, 0], "{st}");
    assert_eq!(st["lateness_runs"], 1, "{st}");
    assert!(st["lateness_ms_p99"].as_i64() >= Some(0), "{st}");
    assert_eq!(st["last_run"]["run_id"], Value::from(id.as_str()), "{st}");
    let (ok, text) = cluster.kairosctl(&["job", "stats", "story"]);
    assert!(ok && text.contains("succeeded  1"), "{text}");

    // An unknown job: NOT_FOUND naming it, through the API and kairosctl.
    let e = c
        .jobs(|mut j| async move { j.job_stats(pb::JobRef { id: "ghost".into() }).await })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    assert!(e.message().contains("\"ghost\""), "{e}");
    let (ok, out) = cluster.kairosctl(&["job", "stats", "ghost"]);
    assert!(
        !ok && out.contains("ghost") && out.contains("not found"),
        "{out}"
    );

    // Counted on the leader as apply reported it.
    let m = |name: &str| cluster.metric(leader, name).unwrap_or(-1.0);
    let succeeded = "kairos_runs_finished_total{group=\"obs\",outcome=\"succeeded\"}";
    assert_eq!(m(succeeded), 1.0);
    assert_eq!(m("kairos_fires_total{group=\"obs\"}"), 1.0);
    assert!(m("kairos_log_append_seconds_count") >= 1.0);
    // Every append reached a durable sync, which answered it.
    assert!(m("kairos_disk_sync_seconds_count") >= 1.0);
    assert!(m("kairos_disk_sync_requests_total") >= m("kairos_disk_sync_seconds_count"));
    wait_for("a disk reading", Duration::from_secs(30), || async {
        (m("kairos_disk_free_bytes") > 0.0).then_some(())
    })
    .await;
    assert_eq!(m("kairos_disk_reserve_bytes"), (64u64 << 20) as f64);
    // The runtime lag probe wakes every 10 ms from the start.
    wait_for("runtime lag samples", Duration::from_secs(30), || async {
        (m("kairos_runtime_lag_seconds_count") >= 10.0).then_some(())
    })
    .await;
    assert!(m("kairos_raft_commit_index") >= 1.0);
    // The applied state reaches the store within a flush window (1 s).
    wait_for("a state flush", Duration::from_secs(30), || async {
        (m("kairos_state_flush_seconds_count") >= 1.0).then_some(())
    })
    .await;
    // The one-shot job has no next occurrence and its run no retry left:
    // the gauge counts the wheel entries in sled, so it settles once the
    // windows holding the fire are written (within a flush window or two).
    wait_for("no pending timers", Duration::from_secs(30), || async {
        (m("kairos_pending_timers") == 0.0).then_some(())
    })
    .await;

    // Every name the dashboard and the rules use is exported.
    let scraped = scrape(&cluster, leader);
    let exported = exported_names(&scraped);
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    for file in ["grafana/kairos.json", "prometheus/alerts.yml"] {
        let text = std::fs::read_to_string(deploy.join(file)).expect(file);
        let used = referenced_names(&text);
        assert!(used.len() >= 10, "{file} uses {used:?}");
        let missing: Vec<_> = used.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{file} uses names /metrics lacks: {missing:?}"
        );
    }

    // Prometheus' own linter accepts the exposition and the alert rules.
    let (_, body) = scraped.split_once("\r\n\r\n").expect("an HTTP answer");
    promtool(&["check", "metrics"], Some(body));
    promtool(
        &[
            "check",
            "rules",
            &deploy.join("prometheus/alerts.yml").display().to_string(),
        ],
        None,
    );
}

/// Runs Debian's `promtool` (package `prometheus`, installed by `.ci/run`)
/// with `stdin`, failing on any complaint.
fn promtool(args: &[&str], stdin: Option<&str>) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("promtool is missing ({e}): apt-get install --no-install-recommends prometheus")
        });
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    // `check metrics` prints lint findings and exits non-zero on them.
    assert!(out.status.success(), "promtool {args:?}: {text}");
    if args[1] == "metrics" {
        assert!(text.trim().is_empty(), "promtool {args:?}: {text}");
    }
}

fn scrape(cluster: &Cluster, id: u64) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&cluster.node(id).http).expect("http port");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// Sample names a scrape can carry: those present, and those a declared
/// family yields once it has a series (a counter's own `_total` name, a
/// histogram's `_bucket`, `_sum` and `_count`).
fn exported_names(metrics: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in metrics.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut parts = decl.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if line.starts_with("kairos_") {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

fn referenced_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("kairos_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}
