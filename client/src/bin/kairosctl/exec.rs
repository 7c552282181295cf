//! The ready worker behind `kairosctl worker`: runs each assignment's
//! payload as a shell command or POSTs it to an HTTP URL. It executes what
//! jobs send it, so it is opt-in and says so in `--help`.

use std::process::Stdio;
use std::time::Duration;

use clap::{Args, ValueEnum};
use kairos_client::worker::{now_ms, Outcome, Task, Worker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes of stdout/stderr (or HTTP response) kept as the run's result.
const TAIL_BYTES: usize = 4096;

#[derive(Args)]
pub struct WorkerArgs {
    /// Group whose runs this worker executes.
    #[arg(long)]
    group: String,
    /// shell: run the payload with `sh -c`; http: POST the payload to --url.
    #[arg(long, value_enum)]
    exec: Exec,
    /// Runs executed at once.
    #[arg(long, default_value_t = 4)]
    concurrency: u32,
    /// Worker id (default: derived from host process id).
    #[arg(long)]
    id: Option<String>,
    /// For --exec http: the URL to POST to (http:// only).
    #[arg(long)]
    url: Option<String>,
    /// A label key=value announced to the leader, matched by jobs with
    /// `--route label --label key=value` (repeatable).
    #[arg(long = "label", value_parser = crate::label_pair)]
    labels: Vec<(String, String)>,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Exec {
    Shell,
    Http,
}

pub async fn run(endpoints: Vec<String>, a: WorkerArgs) -> anyhow::Result<()> {
    if a.exec == Exec::Http {
        anyhow::ensure!(
            a.url.as_deref().is_some_and(|u| u.starts_with("http://")),
            "--url: required for --exec http, http:// only"
        );
    }
    let mut w = Worker::connect(endpoints, &a.group).capacity(a.concurrency);
    if let Some(id) = &a.id {
        w = w.id(id.clone());
    }
    for (k, v) in &a.labels {
        w = w.label(k, v);
    }
    eprintln!(
        "kairosctl worker: executing runs of group {:?} with {} (Ctrl-C to stop)",
        a.group,
        if a.exec == Exec::Shell {
            "sh -c"
        } else {
            "HTTP POST"
        }
    );
    let (exec, url) = (a.exec, a.url.unwrap_or_default());
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    w.run_until(
        move |t: Task| {
            let url = url.clone();
            async move {
                eprintln!(
                    "run {} attempt {} (late {} ms)",
                    t.run_id,
                    t.attempt,
                    t.received_at_ms - t.scheduled_at_ms
                );
                match exec {
                    Exec::Shell => shell(&t).await,
                    Exec::Http => http_post(&url, &t).await,
                }
            }
        },
        shutdown,
    )
    .await
}

fn tail(b: &[u8]) -> Vec<u8> {
    b[b.len().saturating_sub(TAIL_BYTES)..].to_vec()
}

async fn shell(t: &Task) -> Outcome {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(String::from_utf8_lossy(&t.payload).to_string())
        .env("KAIROS_RUN_ID", &t.run_id)
        .env("KAIROS_JOB", &t.job)
        .env("KAIROS_SCHEDULED_AT", t.scheduled_at_ms.to_string())
        .env("KAIROS_ATTEMPT", t.attempt.to_string())
        .env("KAIROS_SHARD", t.shard.to_string())
        .env("KAIROS_SHARD_COUNT", t.shard_count.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome::Failure {
                error: format!("spawn sh: {e}"),
                retryable: true,
            }
        }
    };
    let pgid = child.id();
    let budget = Duration::from_millis((t.deadline_ms - now_ms()).max(0) as u64);
    match tokio::time::timeout(budget, child.wait_with_output()).await {
        Ok(Ok(out)) => {
            let mut text = out.stdout;
            text.extend_from_slice(&out.stderr);
            match out.status.code() {
                Some(0) => Outcome::Success(tail(&text)),
                code => Outcome::Failure {
                    error: format!("exit {code:?}: {}", String::from_utf8_lossy(&tail(&text))),
                    retryable: true,
                },
            }
        }
        Ok(Err(e)) => Outcome::Failure {
            error: format!("wait: {e}"),
            retryable: true,
        },
        Err(_) => {
            if let Some(pid) = pgid {
                // The whole process group, so children of the command die too.
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &format!("-{pid}")])
                    .status();
            }
            Outcome::Failure {
                error: "killed at the run deadline".into(),
                retryable: true,
            }
        }
    }
}

/// A minimal HTTP/1.1 POST (no TLS): 2xx is success.
async fn http_post(url: &str, t: &Task) -> Outcome {
    let fail = |e: String| Outcome::Failure {
        error: e,
        retryable: true,
    };
    let rest = url.trim_start_matches("http://");
    let (hostport, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let budget = Duration::from_millis((t.deadline_ms - now_ms()).max(0) as u64);
    let io = async {
        let mut s = tokio::net::TcpStream::connect(hostport).await?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: {}\r\nConnection: close\r\nX-Kairos-Run-Id: {}\r\nX-Kairos-Attempt: {}\r\n\r\n",
            t.payload.len(),
            t.run_id,
            t.attempt
        );
        s.write_all(head.as_bytes()).await?;
        s.write_all(&t.payload).await?;
        let mut resp = Vec::new();
        s.take(1 << 20).read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = match tokio::time::timeout(budget, io).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return fail(format!("POST {url}: {e}")),
        Err(_) => return fail("POST timed out at the run deadline".into()),
    };
    let status: u16 = String::from_utf8_lossy(&resp)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    if (200..300).contains(&status) {
        Outcome::Success(tail(&resp))
    } else {
        fail(format!("POST {url}: status {status}"))
    }
}
