//! `kairosctl` and API polish, through the real binary against real
//! clusters: runs across jobs (`Runs.SearchRuns`, `runs list --group
//! --state --since`), gRPC reflection in v1 and v1alpha, tables that a long
//! id does not break, `job get` with every field, `job update` changing
//! only the flags given (compare-and-set on the revision), `job apply` /
//! `job export` round trips in TOML, JSON and YAML, and shell completions.

use std::time::Duration;

use kairos_client::worker::{Outcome, Task, Worker};
use kairos_client::{pb, Client};
use kairos_tests::{create, every_job, wait_for, Cluster};
use serde_json::Value;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(60);

fn run_ids(v: &Value) -> Vec<String> {
    let runs = v.as_array().expect("an array of runs");
    runs.iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect()
}

async fn search(
    c: &Client,
    req: pb::SearchRunsRequest,
) -> Result<pb::SearchRunsResponse, tonic::Status> {
    c.runs(|mut r| {
        let q = req.clone();
        async move { r.search_runs(q).await }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_across_jobs_filter_by_group_state_and_since_page_by_page() {
    let cluster = Cluster::start(3, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    for (id, group) in [("ok", "ga"), ("bad", "ga"), ("other", "gb")] {
        create(&c, every_job(id, group, 200)).await.expect("create");
    }
    let w = Worker::connect(cluster.endpoints(), "ga")
        .group("gb")
        .capacity(8);
    let worker = tokio::spawn(async move {
        let _ = w
            .run(|t: Task| async move {
                match t.job.as_str() {
                    "bad" => Outcome::Failure {
                        error: "boom".into(),
                        retryable: false,
                    },
                    _ => Outcome::Success(Vec::new()),
                }
            })
            .await;
    });
    wait_for("3 failed runs of bad", WAIT, || async {
        let runs = c.list_runs("bad", 1000).await.ok()?;
        let failed = pb::RunState::Failed as i32;
        (runs.iter().filter(|r| r.state == failed).count() >= 3).then_some(())
    })
    .await;
    for id in ["ok", "bad", "other"] {
        let (ok, out) = cluster.kairosctl(&["job", "pause", id]);
        assert!(ok, "{out}");
    }
    // Every run has ended: the listing no longer moves.
    let all: Vec<pb::Run> = wait_for("every run finished", WAIT, || async {
        let mut runs = Vec::new();
        for id in ["bad", "ok", "other"] {
            runs.extend(c.list_runs(id, 10_000).await.ok()?);
        }
        let active = [pb::RunState::Pending as i32, pb::RunState::Running as i32];
        (!runs.iter().any(|r| active.contains(&r.state))).then_some(runs)
    })
    .await;
    worker.abort();
    let ids_where = |f: &dyn Fn(&pb::Run) -> bool| -> Vec<String> {
        all.iter()
            .filter(|r| f(r))
            .map(|r| r.run_id.clone())
            .collect()
    };

    // Across jobs, in (job, scheduled time) order: "bad" sorts before "ok" (same length).
    let failed_ga = cluster.kairosctl_json(&[
        "runs", "list", "--group", "ga", "--state", "failed", "--limit", "100000",
    ]);
    let want = ids_where(&|r| r.job == "bad" && r.state == pb::RunState::Failed as i32);
    assert!(want.len() >= 3);
    assert_eq!(run_ids(&failed_ga), want);
    let gb = cluster.kairosctl_json(&[
        "runs",
        "list",
        "--group",
        "gb",
        "--state",
        "succeeded,failed",
        "--limit",
        "100000",
    ]);
    let want = ids_where(&|r| r.job == "other" && r.state == pb::RunState::Succeeded as i32);
    assert!(!want.is_empty());
    assert_eq!(run_ids(&gb), want);
    let everything =
        cluster.kairosctl_json(&["runs", "list", "--since", "1h", "--limit", "100000"]);
    let mut want = ids_where(&|_| true);
    want.sort_by_key(|id| {
        let r = all.iter().find(|r| &r.run_id == id).unwrap();
        (r.job.len(), r.job.clone(), r.scheduled_at_ms, r.shard)
    });
    assert_eq!(run_ids(&everything), want);
    let future = cluster.kairosctl_json(&["runs", "list", "--since", "2099-01-01T00:00:00Z"]);
    assert_eq!(run_ids(&future), Vec::<String>::new());
    let none = cluster.kairosctl_json(&["runs", "list", "--job", "bad", "--state", "succeeded"]);
    assert_eq!(run_ids(&none), Vec::<String>::new());
    // With a job and no filter: that job's runs, as before.
    let bad = cluster.kairosctl_json(&["runs", "list", "--job", "bad", "--limit", "100000"]);
    assert_eq!(run_ids(&bad), ids_where(&|r| r.job == "bad"));
    let (ok, table) = cluster.kairosctl(&["runs", "list", "--group", "ga", "--state", "failed"]);
    assert!(
        ok && table.starts_with("RUN") && table.contains("bad@") && table.contains("boom"),
        "{table}"
    );

    // Pages of 2 chained by their tokens give the same runs as one page.
    let (mut paged, mut token) = (Vec::new(), String::new());
    loop {
        let page = search(
            &c,
            pb::SearchRunsRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            },
        )
        .await
        .expect("page");
        assert!(page.runs.len() <= 2);
        paged.extend(page.runs.into_iter().map(|r| r.run_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(paged, want);

    // Bad input: refused, naming the field.
    let bad_reqs = [
        (
            pb::SearchRunsRequest {
                page_size: 501,
                ..Default::default()
            },
            "page_size: at most 500",
        ),
        (
            pb::SearchRunsRequest {
                page_token: "nope".into(),
                ..Default::default()
            },
            "page_token",
        ),
        (
            pb::SearchRunsRequest {
                states: vec![99],
                ..Default::default()
            },
            "states: unknown run state 99",
        ),
        (
            pb::SearchRunsRequest {
                states: vec![1; 17],
                ..Default::default()
            },
            "states: at most 16, got 17",
        ),
        (
            pb::SearchRunsRequest {
                group: "a b".into(),
                ..Default::default()
            },
            "group: character",
        ),
        (
            pb::SearchRunsRequest {
                job: "x".repeat(200),
                ..Default::default()
            },
            "job: at most",
        ),
    ];
    for (req, why) in bad_reqs {
        let e = search(&c, req).await.expect_err(why);
        assert!(
            e.code() == Code::InvalidArgument && e.message().contains(why),
            "{why}: {e:?}"
        );
    }
    cluster.kairosctl_refused(&["runs", "list", "--since", "5x"], "--since \"5x\"");
    cluster.kairosctl_refused(&["runs", "list", "--state", "done"], "invalid value 'done'");
}

/// The service names reflection version `$v` (a module of
/// `tonic_reflection::pb`) lists on `channel`, sorted.
macro_rules! listed_services {
    ($v:ident, $channel:expr) => {{
        use tonic_reflection::pb::$v as r;
        let req = r::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(r::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        };
        let mut client = r::server_reflection_client::ServerReflectionClient::new($channel);
        let mut answers = client
            .server_reflection_info(tokio_stream::iter([req]))
            .await
            .expect(stringify!($v))
            .into_inner();
        let answer = answers
            .message()
            .await
            .expect("an answer")
            .expect("one answer");
        let Some(r::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
            answer.message_response
        else {
            panic!("{}: not a service list: {answer:?}", stringify!($v));
        };
        let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        names.sort();
        names
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_in_v1_and_v1alpha() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let addr = cluster.endpoints()[0].clone();
    let want = [
        "grpc.health.v1.Health",
        "kairos.v1.Cluster",
        "kairos.v1.Jobs",
        "kairos.v1.Runs",
        "kairos.v1.Workers",
    ];
    assert_eq!(listed_services!(v1, c.channel_to(&addr).unwrap()), want);
    assert_eq!(
        listed_services!(v1alpha, c.channel_to(&addr).unwrap()),
        want
    );
}

/// The job as `job get --output json` shows it.
fn get(cluster: &Cluster, id: &str) -> Value {
    cluster.kairosctl_json(&["job", "get", id])[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_get_update_and_long_ids_in_tables() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let long = "l".repeat(120);
    for (id, group) in [(long.as_str(), "g"), ("short", "a-much-longer-group-name")] {
        let (ok, out) =
            cluster.kairosctl(&["job", "create", id, "--every", "1h", "--group", group]);
        assert!(ok, "{out}");
    }
    // The columns stay aligned: GROUP starts at the same place on every line.
    let (ok, table) = cluster.kairosctl(&["job", "list"]);
    assert!(ok, "{table}");
    let lines: Vec<&str> = table.lines().collect();
    let col = lines[0].find("GROUP").unwrap();
    assert!(col > 120, "{table}");
    assert_eq!(lines.len(), 3, "{table}");
    for l in &lines[1..] {
        assert!(
            l[col..].starts_with('g') || l[col..].starts_with('a'),
            "{table}"
        );
        assert_eq!(&l[col - 1..col], " ", "{table}");
    }

    let args = [
        "job",
        "create",
        "j",
        "--cron",
        "*/5 * * * *",
        "--tz",
        "Europe/Paris",
        "--group",
        "g",
        "--payload",
        "hello",
        "--misfire",
        "skip",
        "--grace",
        "2m",
        "--timeout",
        "30s",
        "--max-attempts",
        "3",
        "--backoff",
        "2s",
        "--priority",
        "7",
        "--overlap",
        "forbid",
        "--route",
        "label",
        "--route-label",
        "zone=eu",
        "--label",
        "team=web",
        "--max-runs",
        "1000",
        "--start-at",
        "2026-01-01T00:00:00Z",
        "--keep-runs",
        "50",
        "--keep-for",
        "7d",
    ];
    let (ok, out) = cluster.kairosctl(&args);
    assert!(ok, "{out}");
    let before = get(&cluster, "j");
    let expect = [
        ("cron", "*/5 * * * *"),
        ("tz", "Europe/Paris"),
        ("group", "g"),
        ("payload", "hello"),
        ("misfire", "skip"),
        ("grace", "2m"),
        ("timeout", "30s"),
        ("backoff", "2s"),
        ("overlap", "forbid"),
        ("route", "label"),
        ("keep_for", "7d"),
        ("start_at", "2026-01-01T00:00:00.000Z"),
        ("state", "active"),
    ];
    for (k, v) in expect {
        assert_eq!(before[k], v, "{k}: {before}");
    }
    assert_eq!(
        (
            &before["max_attempts"],
            &before["priority"],
            &before["keep_runs"]
        ),
        (&3.into(), &7.into(), &50.into())
    );
    assert_eq!(before["route_labels"]["zone"], "eu", "{before}");
    assert_eq!(before["labels"]["team"], "web", "{before}");
    assert_eq!(before["max_runs"], 1000, "{before}");
    assert_eq!(before["revision"], 1, "{before}");
    assert!(before["next_fire_at_ms"].as_i64().unwrap() > 0, "{before}");
    assert_eq!(before["paused"], false, "{before}");
    let (ok, text) = cluster.kairosctl(&["job", "get", "j"]);
    for field in [
        "misfire",
        "skip (grace 2m)",
        "3 attempts, backoff 2s",
        "route labels",
        "zone=eu",
        "team=web",
        "max runs",
        "2026-01-01T00:00:00.000Z",
        "50 runs/7d",
        "Europe/Paris",
    ] {
        assert!(ok && text.contains(field), "{field}: {text}");
    }

    // One flag changes; every other field stays as it was.
    let (ok, out) = cluster.kairosctl(&["job", "update", "j", "--priority", "2"]);
    assert!(ok, "{out}");
    let after = get(&cluster, "j");
    let mut want = before.clone();
    for (k, v) in [("priority", Value::from(2)), ("revision", 2.into())] {
        want[k] = v;
    }
    for k in ["updated_at_ms", "next_fire_at_ms"] {
        want[k] = after[k].clone();
    }
    assert_eq!(after, want);
    // A schedule flag replaces the schedule and nothing else.
    let (ok, out) = cluster.kairosctl(&["job", "update", "j", "--every", "10m"]);
    assert!(ok, "{out}");
    let after = get(&cluster, "j");
    assert_eq!(
        (&after["every"], &after["cron"], &after["tz"]),
        (&"10m".into(), &Value::Null, &Value::Null)
    );
    assert_eq!(
        (&after["priority"], &after["payload"]),
        (&2.into(), &"hello".into())
    );

    // A stale revision is refused, by the client's check and by the server's
    // compare-and-set (--replace sends it as is), and changes nothing.
    cluster.kairosctl_refused(
        &["job", "update", "j", "--revision", "1", "--priority", "9"],
        "not 1: it changed since",
    );
    let (ok, out) = cluster.kairosctl(&[
        "job",
        "update",
        "j",
        "--replace",
        "--revision",
        "1",
        "--every",
        "1m",
        "--group",
        "g",
    ]);
    assert!(!ok && out.contains("revision"), "{out}");
    assert_eq!(get(&cluster, "j")["revision"], 3);
    cluster.kairosctl_refused(&["job", "update", "ghost", "--priority", "9"], "not found");

    // --replace: flags not given take their defaults.
    let (ok, out) = cluster.kairosctl(&[
        "job",
        "update",
        "j",
        "--replace",
        "--every",
        "1m",
        "--group",
        "g",
    ]);
    assert!(ok, "{out}");
    let replaced = get(&cluster, "j");
    assert_eq!(
        (
            &replaced["priority"],
            &replaced["payload"],
            &replaced["route"]
        ),
        (&5.into(), &Value::Null, &"least-loaded".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_is_idempotent_and_export_round_trips_in_every_format() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.toml");
    let text = "[[jobs]]\nid = \"a\"\ngroup = \"g\"\nevery = \"1h\"\npriority = 3\n\n\
                [[jobs]]\nid = \"b\"\ngroup = \"h\"\ncron = \"0 9 * * 1-5\"\ntz = \"Europe/Paris\"\n\
                route = \"label\"\nroute_labels = { zone = \"eu\" }\n";
    std::fs::write(&file, text).unwrap();
    let path = file.to_str().unwrap();
    let (ok, out) = cluster.kairosctl(&["job", "apply", "-f", path, "--dry-run"]);
    assert!(
        ok && out == "created a (dry run)\ncreated b (dry run)\n",
        "{out}"
    );
    cluster.kairosctl_refused(&["job", "get", "a"], "not found");
    let (ok, out) = cluster.kairosctl(&["job", "apply", "-f", path]);
    assert!(ok && out == "created a\ncreated b\n", "{out}");
    let (ok, out) = cluster.kairosctl(&["job", "apply", "-f", path]);
    assert!(ok && out == "unchanged a\nunchanged b\n", "{out}");
    assert_eq!(get(&cluster, "b")["route_labels"]["zone"], "eu");

    std::fs::write(&file, text.replace("priority = 3", "priority = 4")).unwrap();
    let (ok, out) = cluster.kairosctl(&["job", "apply", "-f", path]);
    assert!(ok && out == "updated a\nunchanged b\n", "{out}");
    assert_eq!(
        (
            &get(&cluster, "a")["priority"],
            &get(&cluster, "a")["revision"]
        ),
        (&4.into(), &2.into())
    );

    // export | apply: unchanged, in every format.
    let (ok, out) = cluster.kairosctl(&[
        "job",
        "create",
        "c",
        "--every",
        "5m",
        "--group",
        "g",
        "--shards",
        "3",
        "--payload",
        "x y",
        "--label",
        "team=web",
        "--max-runs",
        "99",
        "--end-at",
        "2099-01-01T00:00:00Z",
    ]);
    assert!(ok, "{out}");
    for (format, ext) in [("toml", "toml"), ("json", "json"), ("yaml", "yaml")] {
        let (ok, exported) = cluster.kairosctl(&["job", "export", "--format", format]);
        assert!(ok, "{exported}");
        let f = dir.path().join(format!("export.{ext}"));
        std::fs::write(&f, &exported).unwrap();
        let (ok, out) = cluster.kairosctl(&["job", "apply", "-f", f.to_str().unwrap()]);
        assert!(
            ok && out == "unchanged a\nunchanged b\nunchanged c\n",
            "{format}: {out}\n{exported}"
        );
    }
    let (ok, out) = cluster.kairosctl(&["job", "export", "--group", "h", "--format", "json"]);
    let only_h: Value = serde_json::from_str(&out).unwrap();
    assert!(
        ok && only_h["jobs"].as_array().unwrap().len() == 1 && only_h["jobs"][0]["id"] == "b",
        "{out}"
    );

    // A bad entry refuses the whole file before anything changes.
    let bad = [
        ("[[jobs]]\nid = \"new1\"\ngroup = \"g\"\nevery = \"1h\"\n\n[[jobs]]\nid = \"new2\"\ngroup = \"g\"\nevery = \"1x\"\n", "jobs[1] (new2)"),
        ("[[jobs]]\nid = \"new1\"\ngroup = \"g\"\nevery = \"1h\"\n\n[[jobs]]\nid = \"new2\"\ngroup = \"g\"\ncron = \"61 * * * *\"\n", "job new2: schedule"),
        ("[[jobs]]\nid = \"new1\"\ngroup = \"g\"\nevery = \"1h\"\n\n[[jobs]]\nid = \"new2\"\ngroup = \"g\"\nevery = \"1h\"\npriority = 11\n", "jobs[1] (new2): priority: 1 to 10"),
        ("[[jobs]]\nid = \"new1\"\ngroup = \"g\"\nafter = \"1h\"\n", "jobs[0] (new1): after: not allowed"),
        ("[[jobs]]\nid = \"new1\"\ngroup = \"g\"\nevery = \"1h\"\ncolour = \"red\"\n", "colour"),
    ];
    for (text, why) in bad {
        std::fs::write(&file, text).unwrap();
        cluster.kairosctl_refused(&["job", "apply", "-f", path], why);
        cluster.kairosctl_refused(&["job", "get", "new1"], "not found");
    }
    let big = dir.path().join("big.json");
    std::fs::write(&big, vec![b' '; 5 << 20]).unwrap();
    cluster.kairosctl_refused(
        &["job", "apply", "-f", big.to_str().unwrap()],
        "at most 4194304 bytes",
    );
    let odd = dir.path().join("jobs.ini");
    std::fs::write(&odd, "").unwrap();
    cluster.kairosctl_refused(
        &["job", "apply", "-f", odd.to_str().unwrap()],
        "unknown format",
    );
}

#[test]
fn completions_name_the_subcommands_in_every_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(kairos_tests::kairosctl_bin())
            .args(["completion", shell])
            .output()
            .expect("kairosctl completion");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{shell}: {text}");
        for word in ["job", "runs", "apply", "export", "completion", "--route"] {
            assert!(text.contains(word), "{shell}: {word} missing");
        }
    }
    let out = std::process::Command::new(kairos_tests::kairosctl_bin())
        .args(["completion", "tcsh"])
        .output()
        .expect("kairosctl completion");
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("invalid value 'tcsh'")
    );
}
