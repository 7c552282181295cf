//! The web console on 3-node clusters. API level: each `/api` endpoint
//! answers what the gRPC API answers (also through a follower, whose
//! writes the gRPC path forwards to the leader); a missing or too weak token
//! gets 401/403; bad parameters get 400 naming the field; a POST without
//! `X-Kairos-Action` is refused and changes nothing. Browser: Debian's
//! headless chromium, driven over the WebDriver protocol (chromedriver),
//! shows each page as the API reports it, pauses a job, retries a failed
//! run, and shows a fired run live without a reload. Screenshots go to
//! `target/console-screenshots/`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kairos_client::worker::{Outcome, Task, Worker};
use kairos_client::{pb, Client};
use kairos_proto::v1::cluster_client::ClusterClient;
use kairos_tests::{create, every_job, free_port, wait_for, Cluster};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An error text a worker reports: the console must show it as text.
const HOSTILE: &str = "<img src=x onerror=alert(1)> boom";
const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- HTTP

struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 exchange. The answer ends at its Content-Length, its last
/// chunk or the connection's end (chromedriver keeps connections open).
async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        raw.extend_from_slice(&buf[..n]);
        if n == 0 || complete(&raw) {
            break;
        }
    }
    let raw = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head[9..12].parse().expect("status code");
    let body = if is_chunked(head) {
        unchunk(rest)
    } else {
        rest.to_string()
    };
    Answer {
        status,
        head: head.to_string(),
        body,
    }
}

fn is_chunked(head: &str) -> bool {
    head.to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
}

/// Whether `raw` holds a whole answer.
fn complete(raw: &[u8]) -> bool {
    let text = String::from_utf8_lossy(raw);
    let Some((head, rest)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    if is_chunked(head) {
        return rest.ends_with("0\r\n\r\n");
    }
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    length.is_some_and(|n| rest.len() >= n)
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

const ACTION: (&str, &str) = ("X-Kairos-Action", "1");

async fn get(addr: &str, path: &str) -> Value {
    let a = http(addr, "GET", path, &[], "").await;
    assert_eq!(a.status, 200, "GET {path}: {}", a.body);
    a.json()
}

async fn post(addr: &str, path: &str) -> Value {
    let a = http(addr, "POST", path, &[ACTION], "").await;
    assert_eq!(a.status, 200, "POST {path}: {}", a.body);
    a.json()
}

/// GET `path` expecting `status` with an error naming `field`.
async fn refused(addr: &str, method: &str, path: &str, status: u16, field: &str) {
    let a = http(addr, method, path, &[ACTION], "").await;
    assert_eq!(a.status, status, "{method} {path}: {}", a.body);
    let msg = a.json()["error"].as_str().unwrap_or("").to_string();
    assert!(
        msg.contains(field),
        "{method} {path}: {msg:?} does not name {field:?}"
    );
}

// ---------------------------------------------------------------- gRPC side

async fn grpc_jobs(c: &Client) -> Vec<pb::Job> {
    c.jobs(|mut j| async move {
        j.list_jobs(pb::ListJobsRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
    })
    .await
    .unwrap()
    .jobs
}

async fn grpc_job(c: &Client, id: &str) -> Result<pb::Job, tonic::Status> {
    let id = id.to_string();
    c.jobs(|mut j| {
        let id = id.clone();
        async move { j.get_job(pb::JobRef { id }).await }
    })
    .await
}

fn id_of(j: &pb::Job) -> String {
    j.spec.as_ref().map(|s| s.id.clone()).unwrap_or_default()
}

fn ids(v: &Value, list: &str, field: &str) -> Vec<String> {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list} in {v}"))
        .iter()
        .map(|x| x[field].as_str().unwrap().to_string())
        .collect()
}

/// A one-shot job of group "w" with one attempt: the worker fails it.
fn boom_job(id: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(0)),
        }),
        group: "w".into(),
        max_attempts: 1,
        ..Default::default()
    }
}

/// Group "w": fails the first attempt of job "boom" with [`HOSTILE`], succeeds otherwise.
fn start_worker(cluster: &Cluster) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let worker = Worker::connect(cluster.endpoints(), "w")
        .id("w-console")
        .security(cluster.security.clone());
    tokio::spawn(worker.run(|t: Task| async move {
        if t.job == "boom" && t.attempt == 1 {
            Outcome::Failure {
                error: HOSTILE.into(),
                retryable: false,
            }
        } else {
            Outcome::Success(b"done".to_vec())
        }
    }))
}

/// Creates alpha-1 (h), alpha-2 (k), beta (h, paused) and boom (w, fails);
/// returns boom's failed run.
async fn seed(c: &Client) -> pb::Run {
    for (id, group) in [("alpha-1", "h"), ("alpha-2", "k"), ("beta", "h")] {
        create(c, every_job(id, group, 3_600_000)).await.unwrap();
    }
    c.jobs(|mut j| async move {
        j.pause_job(pb::PauseJobRequest {
            id: "beta".into(),
            note: String::new(),
        })
        .await
    })
    .await
    .unwrap();
    create(c, boom_job("boom")).await.unwrap();
    wait_for("boom to fail", WAIT, || async {
        let runs = c.list_runs("boom", 10).await.ok()?;
        runs.into_iter()
            .find(|r| r.state == pb::RunState::Failed as i32)
    })
    .await
}

async fn follower_http(cluster: &Cluster) -> String {
    let leader = cluster.wait_leader().await;
    let id = if leader == 1 { 2 } else { 1 };
    cluster.node(id).http.clone()
}

// ---------------------------------------------------------------- API tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_endpoint_answers_what_grpc_answers() {
    let cluster = Cluster::start(3, &[]);
    let h = follower_http(&cluster).await;
    let c = cluster.client();
    let _worker = start_worker(&cluster);
    let failed = seed(&c).await;

    // Cluster: the same leader, nodes and roles.
    let status = c.status().await.unwrap();
    let api = get(&h, "/api/cluster").await;
    assert_eq!(api["leader"], status.leader, "{api}");
    let roles = |v: &Value| -> Vec<(u64, String)> {
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["id"].as_u64().unwrap(),
                    n["role"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let grpc_roles: Vec<_> = status
        .nodes
        .iter()
        .map(|n| (n.id, n.role.clone()))
        .collect();
    assert_eq!(roles(&api), grpc_roles);

    // Jobs: all, by prefix, group, state; pages.
    let all: Vec<String> = grpc_jobs(&c).await.iter().map(id_of).collect();
    assert_eq!(ids(&get(&h, "/api/jobs").await, "jobs", "id"), all);
    assert_eq!(
        ids(&get(&h, "/api/jobs?prefix=alpha").await, "jobs", "id"),
        ["alpha-1", "alpha-2"]
    );
    assert_eq!(
        ids(&get(&h, "/api/jobs?group=h").await, "jobs", "id"),
        ["alpha-1", "beta"]
    );
    assert_eq!(
        ids(&get(&h, "/api/jobs?state=paused").await, "jobs", "id"),
        ["beta"]
    );
    assert_eq!(
        ids(&get(&h, "/api/jobs?state=active").await, "jobs", "id"),
        ["alpha-1", "alpha-2"]
    );
    // A one-shot that fired is finished.
    assert_eq!(
        ids(&get(&h, "/api/jobs?state=finished").await, "jobs", "id"),
        ["boom"]
    );
    let first = get(&h, "/api/jobs?page_size=1").await;
    assert_eq!(
        (ids(&first, "jobs", "id"), &first["next_page_token"]),
        (vec!["alpha-1".to_string()], &json!("alpha-1"))
    );
    let second = get(&h, "/api/jobs?page_size=1&page_token=alpha-1").await;
    assert_eq!(ids(&second, "jobs", "id"), ["alpha-2"]);

    // One job: spec, next fires and stats as gRPC has them.
    let beta = grpc_job(&c, "beta").await.unwrap();
    let page = get(&h, "/api/jobs/beta").await;
    assert_eq!(page["job"]["paused"], true);
    assert_eq!(page["job"]["revision"], beta.revision);
    assert_eq!(page["job"]["schedule"]["every_ms"], 3_600_000);
    let next = c
        .jobs(|mut j| async move {
            j.next_fires(pb::NextFiresRequest {
                id: "alpha-1".into(),
                schedule: None,
                count: 5,
            })
            .await
        })
        .await
        .unwrap();
    assert_eq!(
        get(&h, "/api/jobs/alpha-1").await["next_fires"],
        json!(next.fire_at_ms)
    );
    let stats = c
        .jobs(|mut j| async move { j.job_stats(pb::JobRef { id: "boom".into() }).await })
        .await
        .unwrap();
    let boom = get(&h, "/api/jobs/boom").await;
    for (k, v) in [
        ("runs", stats.runs),
        ("failed", stats.failed),
        ("fired", stats.fired),
    ] {
        assert_eq!(boom["stats"][k], v, "{k}: {boom}");
    }
    assert_eq!(boom["stats"]["last_run"]["run_id"], failed.run_id);

    // Runs of a job (newest first) and failed runs across jobs.
    let runs = get(&h, "/api/jobs/boom/runs?count=5").await;
    let grpc_runs = c.list_runs("boom", 100).await.unwrap();
    let want: Vec<String> = grpc_runs.iter().rev().map(|r| r.run_id.clone()).collect();
    assert_eq!(ids(&runs, "runs", "run_id"), want);
    assert_eq!(runs["runs"][0]["state"], "failed");
    assert_eq!(runs["runs"][0]["error"], HOSTILE);
    assert_eq!(runs["runs"][0]["worker"], "w-console");
    let since = failed.scheduled_at_ms - 3_600_000;
    let across = get(&h, &format!("/api/runs?state=failed&since_ms={since}")).await;
    assert_eq!(
        ids(&across, "runs", "run_id"),
        std::slice::from_ref(&failed.run_id)
    );
    let none = get(
        &h,
        &format!("/api/runs?state=failed&group=h&since_ms={since}"),
    )
    .await;
    assert_eq!(ids(&none, "runs", "run_id"), Vec::<String>::new());
    let later = format!("/api/runs?since_ms={}", failed.finished_at_ms + 3_600_000);
    assert_eq!(
        ids(&get(&h, &later).await, "runs", "run_id"),
        Vec::<String>::new()
    );

    // The watch stream carries what Jobs.Watch carries, from the same index.
    let sse = first_sse_events(&h, "/api/watch?from_index=1", 4).await;
    let mut stream = c
        .jobs(|mut j| async move {
            j.watch(pb::WatchRequest {
                from_index: Some(1),
                ..Default::default()
            })
            .await
        })
        .await
        .unwrap();
    for e in &sse {
        let g = stream.message().await.unwrap().unwrap();
        assert_eq!(
            (e["index"].as_u64(), e["job"].as_str()),
            (Some(g.index), Some(g.job.as_str())),
            "{e}"
        );
    }

    // Actions through a follower reach the leader, as gRPC writes do.
    let paused = post(&h, "/api/jobs/alpha-1/pause?note=maintenance+window").await;
    assert_eq!(paused["job"]["paused"], true, "{paused}");
    let on_grpc = grpc_job(&c, "alpha-1").await.unwrap();
    assert!(on_grpc.paused);
    assert_eq!(on_grpc.pause_note, "maintenance window");
    assert_eq!(paused["job"]["pause_note"], "maintenance window");
    assert_eq!(
        post(&h, "/api/jobs/alpha-1/resume").await["job"]["paused"],
        false
    );
    assert!(!grpc_job(&c, "alpha-1").await.unwrap().paused);
    let retried = post(&h, &format!("/api/runs/retry?run_id={}", failed.run_id)).await;
    assert_eq!(retried["run"]["attempt"], 2, "{retried}");
    wait_for("the retry to succeed", WAIT, || async {
        let r = c.list_runs("boom", 10).await.ok()?.pop()?;
        (r.attempt == 2 && r.state == pb::RunState::Succeeded as i32).then_some(())
    })
    .await;
    let run = post(&h, "/api/jobs/alpha-2/trigger").await;
    let run_id = run["run"]["run_id"].as_str().unwrap().to_string();
    let on_grpc = c.list_runs("alpha-2", 10).await.unwrap();
    assert!(
        on_grpc.iter().any(|r| r.run_id == run_id),
        "{run} not in {on_grpc:?}"
    );
    assert_eq!(post(&h, "/api/jobs/beta/delete").await["deleted"], true);
    assert_eq!(
        grpc_job(&c, "beta").await.unwrap_err().code(),
        tonic::Code::NotFound
    );

    // Bad input: 400 naming the field; unknown things 404.
    refused(&h, "GET", "/api/jobs?page_size=0", 400, "page_size").await;
    refused(&h, "GET", "/api/jobs?page_size=501", 400, "page_size").await;
    refused(
        &h,
        "GET",
        &format!("/api/jobs?prefix={}", "a".repeat(129)),
        400,
        "prefix",
    )
    .await;
    refused(&h, "GET", "/api/jobs?state=sleeping", 400, "state").await;
    refused(&h, "GET", "/api/runs?state=sleeping", 400, "state").await;
    refused(&h, "GET", "/api/runs?since_ms=-1", 400, "since_ms").await;
    refused(&h, "GET", "/api/runs?page_token=x@y", 400, "page_token").await;
    refused(&h, "GET", "/api/jobs/boom/runs?count=101", 400, "count").await;
    refused(&h, "GET", "/api/jobs/bad%20id", 400, "id").await;
    refused(&h, "POST", "/api/runs/retry?run_id=nope", 400, "run_id").await;
    refused(&h, "GET", "/api/watch?from_index=x", 400, "from_index").await;
    refused(&h, "GET", "/api/jobs/ghost", 404, "ghost").await;
    refused(&h, "POST", "/api/jobs/alpha-2/explode", 404, "action").await;

    // A POST without the action header (what a cross-site form sends) changes nothing.
    let a = http(&h, "POST", "/api/jobs/alpha-2/pause", &[], "").await;
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("X-Kairos-Action"), "{}", a.body);
    assert!(!grpc_job(&c, "alpha-2").await.unwrap().paused);
}

/// The first `n` events of an SSE stream, as JSON.
async fn first_sse_events(addr: &str, path: &str, n: usize) -> Vec<Value> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        while text.matches("\ndata: ").count() < n {
            let k = s.read(&mut buf).await.unwrap();
            assert!(k > 0, "stream ended: {text}");
            text.push_str(&String::from_utf8_lossy(&buf[..k]));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {n} events: {text}"));
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.split("\ndata: ")
        .skip(1)
        .take(n)
        .map(|d| serde_json::from_str(d.lines().next().unwrap()).expect(d))
        .collect()
}

async fn new_token(c: &Client, name: &str, role: &str) -> String {
    let req = pb::CreateTokenRequest {
        name: name.into(),
        role: role.into(),
        groups: vec![],
    };
    c.call(|ch| {
        let req = req.clone();
        async move { ClusterClient::new(ch).create_token(req).await }
    })
    .await
    .expect("admin creates a token")
    .secret
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_needs_a_token_of_the_role_the_grpc_call_needs() {
    let cluster = Cluster::start_secure(3, &[]);
    let h = follower_http(&cluster).await;
    let admin = cluster.client();
    create(&admin, every_job("nightly", "g", 3_600_000))
        .await
        .unwrap();
    let reader = new_token(&admin, "console-reader", "reader").await;
    let operator = new_token(&admin, "console-ops", "operator").await;
    let bearer = |t: &str| format!("Bearer {t}");
    let call = |method: &'static str, path: &'static str, auth: Option<String>| {
        let h = h.clone();
        async move {
            let mut headers = vec![ACTION];
            let auth = auth.unwrap_or_default();
            if !auth.is_empty() {
                headers.push(("Authorization", &auth));
            }
            http(&h, method, path, &headers, "").await
        }
    };

    // The page itself is static and open; its data is not.
    let page = http(&h, "GET", "/", &[], "").await;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("app.js") && !page.body.contains("nightly"),
        "{}",
        page.body
    );
    for path in [
        "/api/cluster",
        "/api/jobs",
        "/api/jobs/nightly",
        "/api/runs",
        "/api/watch",
    ] {
        let a = http(&h, "GET", path, &[], "").await;
        assert_eq!(a.status, 401, "{path} without a token: {}", a.body);
        let a = http(
            &h,
            "GET",
            path,
            &[("Authorization", "Bearer kairos_wrong")],
            "",
        )
        .await;
        assert_eq!(a.status, 401, "{path} with an unknown token: {}", a.body);
    }
    // A follower just started may not know the leader's address yet (503,
    // "retry shortly"), as a gRPC client would be told; wait that out.
    let a = wait_for(
        "the follower to forward",
        Duration::from_secs(30),
        || async {
            let a = call("GET", "/api/jobs", Some(bearer(&reader))).await;
            (a.status != 503).then_some(a)
        },
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);

    // A reader cannot act; an operator can (and the change is real).
    let a = call("POST", "/api/jobs/nightly/pause", Some(bearer(&reader))).await;
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(
        a.json()["error"]
            .as_str()
            .unwrap()
            .contains("operator or admin"),
        "{}",
        a.body
    );
    assert!(!grpc_job(&admin, "nightly").await.unwrap().paused);
    let a = call("POST", "/api/jobs/nightly/pause", Some(bearer(&operator))).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(grpc_job(&admin, "nightly").await.unwrap().paused);

    // Login keeps the token in an HttpOnly, SameSite=Strict cookie.
    let form = format!("token={reader}");
    let form_type = ("Content-Type", "application/x-www-form-urlencoded");
    let a = http(&h, "POST", "/api/login", &[ACTION, form_type], &form).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let cookie_line = a
        .head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .expect("a cookie");
    for part in [
        format!("kairos_token={reader}"),
        "HttpOnly".into(),
        "SameSite=Strict".into(),
    ] {
        assert!(cookie_line.contains(&part), "{cookie_line} lacks {part}");
    }
    let cookie = format!("kairos_token={reader}");
    let a = http(&h, "GET", "/api/jobs", &[("Cookie", &cookie)], "").await;
    assert_eq!(
        (a.status, ids(&a.json(), "jobs", "id")),
        (200, vec!["nightly".to_string()])
    );
    let a = http(
        &h,
        "POST",
        "/api/jobs/nightly/resume",
        &[ACTION, ("Cookie", &cookie)],
        "",
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.body);
    // Login is refused without the action header, for an unknown token, and for a malformed one.
    assert_eq!(
        http(&h, "POST", "/api/login", &[form_type], &form)
            .await
            .status,
        403
    );
    let a = http(
        &h,
        "POST",
        "/api/login",
        &[ACTION, form_type],
        "token=kairos_wrong",
    )
    .await;
    assert_eq!(a.status, 401, "{}", a.body);
    let a = http(
        &h,
        "POST",
        "/api/login",
        &[ACTION, form_type],
        "token=a%3Bb",
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("token"), "{}", a.body);
    let a = http(&h, "POST", "/api/logout", &[ACTION], "").await;
    assert!(a.head.contains("Max-Age=0"), "{}", a.head);
}

// ---------------------------------------------------------------- browser

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one headless chromium session in it.
struct Browser {
    driver: Child,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    async fn start() -> Browser {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: the console test needs Debian's chromium and chromedriver \
                 (apt-get install -y chromium chromium-driver; .ci/run installs them)"
            );
        }
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = tempfile::tempdir().unwrap();
        let mut b = Browser {
            driver,
            addr: format!("127.0.0.1:{port}"),
            session: String::new(),
            _profile: profile,
        };
        wait_for("chromedriver to be ready", WAIT, || async {
            let s = tokio::net::TcpStream::connect(&b.addr).await.ok()?;
            drop(s);
            let a = http(&b.addr, "GET", "/status", &[], "").await;
            (a.json()["value"]["ready"] == true).then_some(())
        })
        .await;
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,1000", format!("--user-data-dir={}", b._profile.path().display())],
            },
        }}});
        let v = b.call("POST", "/session", caps).await;
        b.session = v["sessionId"].as_str().expect("a session id").to_string();
        b
    }

    /// One WebDriver command; its `value`, or a panic with the driver's error.
    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let a = http(
            &self.addr,
            method,
            path,
            &[("Content-Type", "application/json")],
            &body,
        )
        .await;
        let v = a.json();
        assert_eq!(a.status, 200, "webdriver {method} {path}: {v}");
        v["value"].clone()
    }

    async fn cmd(&self, method: &str, path: &str, body: Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
            .await
    }

    async fn js(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Opens `hash` and waits until page `name` has rendered it.
    async fn open(&self, base: &str, hash: &str, name: &str) {
        self.cmd(
            "POST",
            "/url",
            json!({"url": format!("http://{base}/{hash}")}),
        )
        .await;
        let script = format!(
            "const b = document.body.dataset; \
             return b.hash === '{hash}' && b.page === '{name}' && b.ready === '1'"
        );
        self.until(&format!("page {hash} to render"), &script).await;
    }

    /// Polls a script until it returns true.
    async fn until(&self, what: &str, script: &str) {
        wait_for(what, WAIT, || async {
            (self.js(script).await == true).then_some(())
        })
        .await;
    }

    async fn click(&self, css: &str) {
        let e = self
            .cmd(
                "POST",
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        let id = e[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {e}"))
            .to_string();
        self.cmd("POST", &format!("/element/{id}/click"), json!({}))
            .await;
    }

    /// Clicks `css` and accepts the confirmation dialog it opens.
    async fn click_and_confirm(&self, css: &str) {
        self.click(css).await;
        let path = format!("/session/{}/alert/text", self.session);
        wait_for("the confirmation dialog", WAIT, || async {
            let a = http(&self.addr, "GET", &path, &[], "").await;
            (a.status == 200).then_some(())
        })
        .await;
        self.cmd("POST", "/alert/accept", json!({})).await;
    }

    async fn texts(&self, css: &str, attr: &str) -> Vec<String> {
        let script = format!(
            "return [...document.querySelectorAll('{css}')].map(e => e.getAttribute('{attr}'))"
        );
        let v = self.js(&script).await;
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap_or("").to_string())
            .collect()
    }

    async fn screenshot(&self, name: &str) {
        let png = base64_decode(
            self.cmd("GET", "/screenshot", Value::Null)
                .await
                .as_str()
                .unwrap(),
        );
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

/// `target/console-screenshots` (CARGO_TARGET_DIR aware).
fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("console-screenshots")
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = s
        .bytes()
        .filter(|c| !matches!(c, b'=' | b'\n' | b'\r'))
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | (u32::from(val(c)) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_sees_every_page_acts_and_updates_live() {
    let browser = Browser::start().await;
    let cluster = Cluster::start(3, &[]);
    let base = follower_http(&cluster).await;
    let c = cluster.client();
    let _worker = start_worker(&cluster);
    let failed = seed(&c).await;
    create(&c, every_job("live", "w", 3_600_000)).await.unwrap();

    // Cluster: the leader and the three nodes the API reports.
    browser.open(&base, "#/cluster", "cluster").await;
    let status = c.status().await.unwrap();
    let leader = browser
        .js("return document.getElementById('cluster-leader').textContent")
        .await;
    assert_eq!(leader, status.leader.to_string());
    let mut nodes = browser.texts("tr[data-node]", "data-node").await;
    nodes.sort();
    assert_eq!(nodes, ["1", "2", "3"]);
    browser.screenshot("cluster").await;

    // Jobs: the API's ids, then filtered by prefix through the form.
    browser.open(&base, "#/jobs", "jobs").await;
    let all: Vec<String> = grpc_jobs(&c).await.iter().map(id_of).collect();
    assert_eq!(browser.texts("tr[data-job]", "data-job").await, all);
    let paused = browser
        .js("return document.querySelector('tr[data-job=\"beta\"] .state').textContent")
        .await;
    assert_eq!(paused, "paused");
    browser
        .js("document.getElementById('filter-prefix').value = 'alpha'; return true")
        .await;
    browser.click("#filter-apply").await;
    browser
        .until("the prefix filter", "return document.querySelectorAll('tr[data-job]').length === 2 && location.hash.includes('prefix=alpha')")
        .await;
    assert_eq!(
        browser.texts("tr[data-job]", "data-job").await,
        ["alpha-1", "alpha-2"]
    );
    browser.screenshot("jobs").await;

    // A job page: spec and next fires, then pause with confirmation.
    browser.open(&base, "#/job/alpha-1", "job").await;
    assert_eq!(
        browser
            .js("return document.getElementById('job-id').textContent")
            .await,
        "alpha-1"
    );
    assert_eq!(
        browser
            .js("return document.querySelectorAll('#next-fires li').length")
            .await,
        5
    );
    browser.click_and_confirm("#action-pause").await;
    wait_for("alpha-1 paused", WAIT, || async {
        grpc_job(&c, "alpha-1").await.ok()?.paused.then_some(())
    })
    .await;
    browser
        .until(
            "the resume button",
            "return document.getElementById('action-resume') !== null",
        )
        .await;
    browser.screenshot("job").await;

    // Runs across jobs: the failed run, its hostile error shown as text; retry it.
    browser.open(&base, "#/runs", "runs").await;
    let row = format!("tr[data-run=\"{}\"]", failed.run_id);
    assert_eq!(
        browser.texts("tr[data-run]", "data-run").await,
        std::slice::from_ref(&failed.run_id)
    );
    let error = browser
        .js(&format!(
            "return document.querySelector('{row} td.err').textContent"
        ))
        .await;
    assert_eq!(error, HOSTILE);
    assert_eq!(
        browser
            .js("return document.querySelectorAll('main img').length")
            .await,
        0
    );
    browser.screenshot("runs").await;
    browser
        .click_and_confirm(&format!("{row} button.retry"))
        .await;
    wait_for("a second attempt", WAIT, || async {
        let r = c.list_runs("boom", 10).await.ok()?.pop()?;
        (r.attempt == 2 && r.state == pb::RunState::Succeeded as i32).then_some(())
    })
    .await;
    browser.open(&base, "#/job/boom", "job").await;
    let attempt = browser
        .js(&format!(
            "return document.querySelector('{row} .attempt').textContent"
        ))
        .await;
    assert_eq!(attempt, "2");

    // Live: a run fired through gRPC appears on the open job page without a reload.
    browser.open(&base, "#/job/live", "job").await;
    browser
        .until(
            "the watch stream",
            "return document.getElementById('live').classList.contains('on')",
        )
        .await;
    browser.js("window.kairosMarker = 42; return true").await;
    assert_eq!(
        browser
            .js("return document.querySelectorAll('tr[data-run]').length")
            .await,
        0
    );
    let run = c
        .jobs(|mut j| async move { j.trigger_job(pb::JobRef { id: "live".into() }).await })
        .await
        .unwrap();
    let shown = format!(
        "return document.querySelector('tr[data-run=\"{}\"]') !== null",
        run.run_id
    );
    browser.until("the fired run to show up", &shown).await;
    assert_eq!(
        browser.js("return window.kairosMarker").await,
        42,
        "the page was reloaded"
    );
    browser.screenshot("live").await;
    browser.cmd("DELETE", "", Value::Null).await;
}
