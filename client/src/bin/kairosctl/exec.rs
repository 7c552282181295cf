//! The ready worker behind `kairosctl worker`: runs each assignment's
//! payload as a shell command or POSTs it to an HTTP URL. It executes what
//! jobs send it, so it is opt-in and says so in `--help`.
//!
//! What it kills, and when: each shell run is a process group of its own
//! (`kairos_client::process`). At the run's deadline, or when the worker is
//! told to stop and its drain time is up, the group gets SIGTERM, then
//! SIGKILL after `--kill-grace`; a command that exits leaves nothing behind
//! (stragglers of its group get SIGKILL). Signals go through `kill(2)` on
//! that group id only, never through a spawned `kill` program.

use std::process::Stdio;
use std::time::Duration;

use clap::{Args, ValueEnum};
use kairos_client::process::{ProcessGroup, StopSignals, Stopped};
use kairos_client::worker::{now_ms, Outcome, Task, Worker};
use kairos_client::Security;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Bytes of stdout/stderr (or HTTP response) kept as the run's result.
const TAIL_BYTES: usize = 4096;
/// After a command exits, how long its output pipes may stay open (held by
/// a process that left the run's group) before the output is cut.
const PIPE_CLOSE_WAIT: Duration = Duration::from_secs(1);

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
    /// Shell runs: time between SIGTERM and SIGKILL to a run's process group
    /// when it passes its deadline or the worker stops (at most 50s).
    #[arg(long, default_value = "5s", value_parser = grace_ms)]
    kill_grace: u64,
    /// On SIGINT/SIGTERM: no new runs are taken and runs in flight get this
    /// long to finish; then they are stopped and released for a retry. A
    /// second signal stops them at once.
    #[arg(long, default_value = "30s", value_parser = crate::duration_ms)]
    drain_timeout: u64,
}

/// The leader accepts a stop grace of at most 60 s; keep room for the report.
const KILL_GRACE_MAX_MS: u64 = 50_000;
/// Time for the outcome to reach the leader after the kill.
const REPORT_SLACK_MS: u64 = 2_000;

fn grace_ms(s: &str) -> anyhow::Result<u64> {
    let ms = crate::duration_ms(s)?;
    anyhow::ensure!(
        ms <= KILL_GRACE_MAX_MS,
        "--kill-grace: at most {}s, got {s}",
        KILL_GRACE_MAX_MS / 1000
    );
    Ok(ms)
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Exec {
    Shell,
    Http,
}

/// What every run of this worker shares: how to stop, and when to give up.
#[derive(Clone)]
struct RunCtx {
    exec: Exec,
    url: String,
    kill_grace: Duration,
    /// Becomes true when runs in flight must be stopped and released.
    release: watch::Receiver<bool>,
}

pub async fn run(endpoints: Vec<String>, security: Security, a: WorkerArgs) -> anyhow::Result<()> {
    if a.exec == Exec::Http {
        anyhow::ensure!(
            a.url.as_deref().is_some_and(|u| u.starts_with("http://")),
            "--url: required for --exec http, http:// only"
        );
    }
    let kill_grace = Duration::from_millis(a.kill_grace);
    let mut w = Worker::connect(endpoints, &a.group)
        .capacity(a.concurrency)
        .stop_grace(kill_grace + Duration::from_millis(REPORT_SLACK_MS))
        .security(security);
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
    let (release_tx, release) = watch::channel(false);
    let ctx = RunCtx {
        exec: a.exec,
        url: a.url.unwrap_or_default(),
        kill_grace,
        release,
    };
    let drain = Duration::from_millis(a.drain_timeout);
    let shutdown = async move {
        let mut stop = StopSignals::new();
        stop.next().await;
        eprintln!(
            "kairosctl worker: stopping; runs in flight get {} ms to finish (signal again to stop them now)",
            drain.as_millis()
        );
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(drain) => {}
                _ = stop.next() => {}
            }
            let _ = release_tx.send(true);
        });
    };
    w.run_until(
        move |t: Task| {
            let ctx = ctx.clone();
            async move {
                eprintln!(
                    "run {} attempt {} (late {} ms)",
                    t.run_id,
                    t.attempt,
                    t.received_at_ms - t.scheduled_at_ms
                );
                match ctx.exec {
                    Exec::Shell => shell(&t, &ctx).await,
                    Exec::Http => http_post(&t, &ctx).await,
                }
            }
        },
        shutdown,
    )
    .await
}

/// Why a run was cut short.
enum Cut {
    Deadline,
    Released,
}

/// Resolves at the task's deadline or when runs are released, whichever is first.
async fn cut(t: &Task, release: &mut watch::Receiver<bool>) -> Cut {
    let budget = Duration::from_millis((t.deadline_ms - now_ms()).max(0) as u64);
    tokio::select! {
        _ = tokio::time::sleep(budget) => Cut::Deadline,
        _ = release.wait_for(|r| *r) => Cut::Released,
    }
}

/// The outcome of a run that was cut short; `how` says how it ended.
fn cut_outcome(why: Cut, t: &Task, how: &str) -> Outcome {
    match why {
        Cut::Deadline => Outcome::TimedOut {
            error: format!(
                "timed out at the run deadline ({} ms after it was received): {how}",
                t.deadline_ms - t.received_at_ms
            ),
        },
        Cut::Released => Outcome::Failure {
            error: format!("released: the worker was stopped while the run was in flight; {how}"),
            retryable: true,
        },
    }
}

fn tail(b: &[u8]) -> Vec<u8> {
    b[b.len().saturating_sub(TAIL_BYTES)..].to_vec()
}

/// Reads a pipe to its end, keeping only the last `TAIL_BYTES`.
async fn read_tail(mut r: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut keep = Vec::new();
    let mut chunk = [0u8; 8192];
    while let Ok(n @ 1..) = r.read(&mut chunk).await {
        keep.extend_from_slice(&chunk[..n]);
        if keep.len() > 2 * TAIL_BYTES {
            keep.drain(..keep.len() - TAIL_BYTES);
        }
    }
    tail(&keep)
}

/// The upstream results of a workflow run, in a file of its own for the
/// shell command (`KAIROS_UPSTREAM_FILE`), removed when the run ends.
struct UpstreamFile(std::path::PathBuf);

impl UpstreamFile {
    fn create(t: &Task) -> std::io::Result<Option<UpstreamFile>> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        if t.upstream_results.is_empty() {
            return Ok(None);
        }
        let safe: String = (t.fencing_token.chars())
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = std::env::temp_dir().join(format!(
            "kairos-upstream-{}-{safe}.json",
            std::process::id()
        ));
        // A new file only this user reads: never one someone placed there.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(&t.upstream_results)?;
        Ok(Some(UpstreamFile(path)))
    }
}

impl Drop for UpstreamFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn shell(t: &Task, ctx: &RunCtx) -> Outcome {
    let upstream = match UpstreamFile::create(t) {
        Ok(f) => f,
        Err(e) => {
            return Outcome::Failure {
                error: format!("writing the upstream results file: {e}"),
                retryable: true,
            }
        }
    };
    let mut cmd = std::process::Command::new("sh");
    if let Some(f) = &upstream {
        cmd.env("KAIROS_UPSTREAM_FILE", &f.0);
    }
    cmd.arg("-c")
        .arg(String::from_utf8_lossy(&t.payload).to_string())
        .env("KAIROS_RUN_ID", &t.run_id)
        .env("KAIROS_JOB", &t.job)
        .env("KAIROS_SCHEDULED_AT", t.scheduled_at_ms.to_string())
        .env("KAIROS_ATTEMPT", t.attempt.to_string())
        .env("KAIROS_SHARD", t.shard.to_string())
        .env("KAIROS_SHARD_COUNT", t.shard_count.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawn_failed = |e: std::io::Error| Outcome::Failure {
        error: format!("spawn sh: {e}"),
        retryable: true,
    };
    let mut group = match ProcessGroup::spawn(cmd) {
        Ok(g) => g,
        Err(e) => return spawn_failed(e),
    };
    let pipes = (
        group
            .child_mut()
            .stdout
            .take()
            .map(tokio::process::ChildStdout::from_std),
        group
            .child_mut()
            .stderr
            .take()
            .map(tokio::process::ChildStderr::from_std),
    );
    let (Some(Ok(stdout)), Some(Ok(stderr))) = pipes else {
        return spawn_failed(std::io::Error::other("no output pipes"));
    };
    let output = tokio::spawn(async move {
        let (mut out, err) = tokio::join!(read_tail(stdout), read_tail(stderr));
        out.extend_from_slice(&err);
        tail(&out)
    });
    let mut release = ctx.release.clone();
    let ended = tokio::select! {
        r = group.exited() => Ok(r),
        why = cut(t, &mut release) => Err(why),
    };
    let result = match ended {
        Ok(Err(e)) => Err(format!("wait: {e}")),
        Ok(Ok(())) => group.finish().map_err(|e| format!("reap: {e}")),
        Err(why) => {
            let how = match group.stop(ctx.kill_grace).await {
                Ok(Stopped::AlreadyExited) => "it had just exited".to_string(),
                Ok(Stopped::Terminated) => "its process group exited on SIGTERM".to_string(),
                Ok(Stopped::Killed) => format!(
                    "its process group got SIGKILL after {} ms of SIGTERM grace",
                    ctx.kill_grace.as_millis()
                ),
                Err(e) => format!("stopping its process group failed: {e}"),
            };
            eprintln!("run {} attempt {}: {how}", t.run_id, t.attempt);
            return cut_outcome(why, t, &how);
        }
    };
    let text = tokio::time::timeout(PIPE_CLOSE_WAIT, output)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    match result {
        Ok(Some(0)) => Outcome::Success(text),
        Ok(code) => Outcome::Failure {
            error: format!("exit {code:?}: {}", String::from_utf8_lossy(&text)),
            retryable: true,
        },
        Err(error) => Outcome::Failure {
            error,
            retryable: true,
        },
    }
}

/// A minimal HTTP/1.1 POST (no TLS): 2xx is success.
async fn http_post(t: &Task, ctx: &RunCtx) -> Outcome {
    let url = ctx.url.as_str();
    let fail = |e: String| Outcome::Failure {
        error: e,
        retryable: true,
    };
    let rest = url.trim_start_matches("http://");
    let (hostport, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
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
    let mut release = ctx.release.clone();
    let resp = tokio::select! {
        r = io => match r {
            Ok(r) => r,
            Err(e) => return fail(format!("POST {url}: {e}")),
        },
        // Dropping the request closes the connection; nothing else to stop.
        why = cut(t, &mut release) => return cut_outcome(why, t, "the request was abandoned"),
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
