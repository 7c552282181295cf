//! Load generation shared by the scenarios: real workers over gRPC (the
//! worker SDK) that record every task they receive, job creation through
//! many concurrent clients, and small cluster queries (leader, applied
//! indexes, runs of many jobs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kairos_client::worker::{now_ms, Outcome, Task, Worker};
use kairos_client::{pb, Client};
use tonic::Code;

/// Most receipts a recorder keeps (about 100 bytes each).
pub const RECORD_MAX: usize = 20_000_000;
/// How long stopping workers may wait for their threads to end.
const WORKER_STOP_GRACE: Duration = Duration::from_secs(5);

/// One task as a worker received it.
#[derive(Debug, Clone)]
pub struct Rec {
    pub run_id: String,
    pub job: String,
    pub scheduled_at_ms: i64,
    pub fired_at_ms: i64,
    pub received_at_ms: i64,
    pub attempt: u32,
}

impl Rec {
    /// Worker receipt minus scheduled time.
    pub fn lateness_ms(&self) -> i64 {
        self.received_at_ms - self.scheduled_at_ms
    }
}

#[derive(Default)]
pub struct Recorder {
    recs: Mutex<Vec<Rec>>,
    pub received: AtomicU64,
    pub dropped: AtomicU64,
}

impl Recorder {
    fn push(&self, t: &Task) {
        self.received.fetch_add(1, Ordering::Relaxed);
        let mut v = self.recs.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() >= RECORD_MAX {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        v.push(Rec {
            run_id: t.run_id.clone(),
            job: t.job.clone(),
            scheduled_at_ms: t.scheduled_at_ms,
            fired_at_ms: t.fired_at_ms,
            received_at_ms: t.received_at_ms,
            attempt: t.attempt,
        });
    }

    /// A copy of every receipt so far.
    pub fn snapshot(&self) -> Vec<Rec> {
        self.recs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Several SDK workers in one group, each with its own stream, on its own
/// thread with a current-thread runtime: the SDK's `run_until` future is not
/// `Send` (it holds a `watch` borrow across an await), so it cannot be
/// `tokio::spawn`ed. Stopping drops the runtimes (no graceful drain: the
/// SDK's graceful path takes the `watch` write lock that borrow may hold).
pub struct Workers {
    pub rec: Arc<Recorder>,
    abort: tokio::sync::watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` workers of `capacity` in `group`; each task succeeds at once.
    pub fn start(endpoints: &[String], group: &str, n: u32, capacity: u32) -> Self {
        let rec = Arc::new(Recorder::default());
        let (abort, abort_rx) = tokio::sync::watch::channel(false);
        let threads = (0..n)
            .filter_map(|i| {
                let (rec, mut rx) = (rec.clone(), abort_rx.clone());
                let w = Worker::connect(endpoints.to_vec(), group)
                    .capacity(capacity)
                    .id(format!("bench-{group}-{i}"));
                let body = move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    rt.block_on(async move {
                        let handler = move |t: Task| {
                            rec.push(&t);
                            async { Outcome::Success(Vec::new()) }
                        };
                        tokio::select! {
                            r = w.run(handler) => if let Err(e) = r { eprintln!("worker {i}: {e}") },
                            _ = rx.wait_for(|s| *s) => {}
                        }
                    });
                };
                let name = format!("bench-worker-{i}");
                std::thread::Builder::new().name(name).spawn(body).ok()
            })
            .collect();
        Workers {
            rec,
            abort,
            threads,
        }
    }

    /// Stops the workers (their runtimes are dropped) and joins their threads.
    pub async fn stop(self) {
        let _ = self.abort.send(true);
        let join = tokio::task::spawn_blocking(move || {
            for t in self.threads {
                let _ = t.join();
            }
        });
        let _ = tokio::time::timeout(WORKER_STOP_GRACE, join).await;
    }
}

/// `n` independent clients (one connection each), the leader's address first.
pub async fn clients(endpoints: &[String], n: usize) -> anyhow::Result<Vec<Client>> {
    let eps = leader_first(endpoints).await?;
    Ok((0..n.max(1)).map(|_| Client::new(eps.clone())).collect())
}

/// The same, each reporting every attempt of its calls to `attempts`.
pub async fn observed_clients(
    endpoints: &[String],
    n: usize,
    attempts: &Arc<Attempts>,
) -> anyhow::Result<Vec<Client>> {
    let observer = attempts.observer();
    let plain = clients(endpoints, n).await?;
    Ok(plain
        .into_iter()
        .map(|c| c.with_attempt_observer(observer.clone()))
        .collect())
}

/// Every attempt the SDK made (first tries and retries): its outcome and
/// how long the server took to answer it.
#[derive(Default)]
pub struct Attempts {
    /// Each attempt's code, answer time and wall-clock end (ms).
    answer_ms: Mutex<Vec<(Code, i64, i64)>>,
    pub ok: AtomicU64,
    /// `RESOURCE_EXHAUSTED` answers (admission refusals).
    pub refused: AtomicU64,
    pub other: AtomicU64,
    /// How many attempts ended with each other code.
    other_codes: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Attempts {
    pub fn observer(self: &Arc<Self>) -> kairos_client::AttemptObserver {
        let me = self.clone();
        Arc::new(move |code: Code, took: Duration| {
            let counter = match code {
                Code::Ok => &me.ok,
                Code::ResourceExhausted => &me.refused,
                other => {
                    let mut m = me.other_codes.lock().unwrap_or_else(|e| e.into_inner());
                    *m.entry(format!("{other:?}")).or_default() += 1;
                    &me.other
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
            let mut v = me.answer_ms.lock().unwrap_or_else(|e| e.into_inner());
            if v.len() < RECORD_MAX {
                v.push((code, took.as_millis() as i64, wall_ms()));
            }
        })
    }

    /// The other codes, as `Code:count, ...`.
    pub fn other_codes(&self) -> String {
        let m = self.other_codes.lock().unwrap_or_else(|e| e.into_inner());
        let parts: Vec<String> = m.iter().map(|(c, n)| format!("{c}:{n}")).collect();
        parts.join(", ")
    }

    /// Answer times recorded so far of attempts whose code passes `keep`, in ms.
    pub fn answer_ms(&self, keep: impl Fn(Code) -> bool) -> Vec<i64> {
        let v = self.answer_ms.lock().unwrap_or_else(|e| e.into_inner());
        v.iter()
            .filter(|(c, _, _)| keep(*c))
            .map(|(_, ms, _)| *ms)
            .collect()
    }

    /// Wall-clock start and answer time (ms) of the first `n` attempts
    /// answered in more than `over_ms`, in the order they ended.
    pub fn slow(&self, over_ms: i64, n: usize) -> Vec<(i64, i64)> {
        let v = self.answer_ms.lock().unwrap_or_else(|e| e.into_inner());
        let slow = v.iter().filter(|(_, ms, _)| *ms > over_ms);
        slow.map(|(_, ms, end)| (end - ms, *ms)).take(n).collect()
    }
}

/// `endpoints` reordered so the current leader comes first.
pub async fn leader_first(endpoints: &[String]) -> anyhow::Result<Vec<String>> {
    let mut eps = endpoints.to_vec();
    if let Ok((_, addr)) = leader(&Client::new(endpoints.to_vec())).await {
        if let Some(i) = eps.iter().position(|e| *e == addr) {
            eps.swap(0, i);
        }
    }
    Ok(eps)
}

/// The leader's id and address.
pub async fn leader(c: &Client) -> anyhow::Result<(u64, String)> {
    let s = c.status().await?;
    anyhow::ensure!(s.leader != 0, "no leader known");
    let addr = (s.nodes.iter())
        .find(|n| n.id == s.leader)
        .map(|n| n.addr.clone())
        .unwrap_or_default();
    Ok((s.leader, addr))
}

#[derive(Debug, Default, Clone)]
pub struct CreateStats {
    pub ok: u64,
    pub existed: u64,
    /// Still refused by an overloaded leader after the SDK's retries.
    pub refused: u64,
    pub failed: u64,
    pub skipped: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
    /// Answer time of every call that got an answer (ok or not), in ms.
    pub answer_ms: Vec<i64>,
}

impl CreateStats {
    /// Counts one create's outcome.
    fn count(&mut self, r: Result<(), tonic::Status>) {
        match r {
            Ok(()) => self.ok += 1,
            Err(e) if e.code() == Code::AlreadyExists => self.existed += 1,
            Err(e) if e.code() == Code::ResourceExhausted => self.refused += 1,
            Err(e) => {
                self.failed += 1;
                self.first_error
                    .get_or_insert_with(|| format!("{:?}: {}", e.code(), e.message()));
            }
        }
    }

    pub fn per_s(&self) -> f64 {
        (self.ok + self.existed) as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Creates `specs` with `concurrency` calls in flight over `clients`;
/// specs not started by `deadline` are skipped.
pub async fn create_jobs(
    clients: &[Client],
    specs: impl Iterator<Item = pb::JobSpec>,
    concurrency: usize,
    deadline: Instant,
) -> CreateStats {
    let start = Instant::now();
    let calls = specs.enumerate().map(|(i, spec)| {
        let c = clients[i % clients.len()].clone();
        async move {
            if Instant::now() >= deadline {
                return (Err(None), 0);
            }
            let req = pb::CreateJobRequest { spec: Some(spec) };
            let asked = Instant::now();
            let r = c
                .jobs(|mut j| {
                    let r = req.clone();
                    async move { j.create_job(r).await }
                })
                .await
                .map_err(Some);
            (r, asked.elapsed().as_millis() as i64)
        }
    });
    let mut stream = futures::stream::iter(calls).buffer_unordered(concurrency.max(1));
    let mut st = CreateStats::default();
    while let Some((r, ms)) = stream.next().await {
        if !matches!(r, Err(None)) {
            st.answer_ms.push(ms);
        }
        match r {
            Err(None) => st.skipped += 1,
            Ok(_) => st.count(Ok(())),
            Err(Some(e)) => st.count(Err(e)),
        }
    }
    st.elapsed = start.elapsed();
    st
}

/// Creates `specs` in `Jobs.CreateJobs` calls of `batch` jobs each, with
/// `concurrency` calls in flight over `clients`; batches not started by
/// `deadline` are skipped. `answer_ms` has one entry per call.
pub async fn create_job_batches(
    clients: &[Client],
    specs: impl Iterator<Item = pb::JobSpec>,
    batch: usize,
    concurrency: usize,
    deadline: Instant,
) -> CreateStats {
    let start = Instant::now();
    let calls = futures::stream::iter(specs)
        .chunks(batch.max(1))
        .enumerate()
        .map(|(i, chunk)| {
            let c = clients[i % clients.len()].clone();
            async move {
                let n = chunk.len() as u64;
                if Instant::now() >= deadline {
                    return (Err(None), n, 0);
                }
                let asked = Instant::now();
                let r = c.create_job_batch(chunk).await.map_err(Some);
                (r, n, asked.elapsed().as_millis() as i64)
            }
        });
    let mut stream = calls.buffer_unordered(concurrency.max(1));
    let mut st = CreateStats::default();
    while let Some((r, n, ms)) = stream.next().await {
        let results = match r {
            Ok(results) => results,
            Err(None) => {
                st.skipped += n;
                continue;
            }
            Err(Some(e)) => (0..n).map(|_| Err(e.clone())).collect(),
        };
        st.answer_ms.push(ms);
        for r in results {
            st.count(r.map(|_| ()));
        }
    }
    st.elapsed = start.elapsed();
    st
}

/// A job spec in `group` with the given schedule.
pub fn spec(id: String, group: &str, kind: pb::schedule::Kind) -> pb::JobSpec {
    pb::JobSpec {
        id,
        schedule: Some(pb::Schedule { kind: Some(kind) }),
        group: group.to_string(),
        ..Default::default()
    }
}

/// Waits until every reachable node reports the same applied index (or the timeout).
pub async fn wait_applied_equal(c: &Client, timeout: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(s) = c.status().await {
            let idx: Vec<u64> = s.nodes.iter().map(|n| n.applied_index).collect();
            if !idx.is_empty() && idx.iter().all(|&i| i == idx[0] && i > 0) {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Runs of each job (up to `limit` each), `concurrency` jobs at a time.
pub async fn runs_of(
    c: &Client,
    jobs: Vec<String>,
    limit: usize,
    concurrency: usize,
) -> Vec<(String, Result<Vec<pb::Run>, tonic::Status>)> {
    let calls = jobs.into_iter().map(|j| async move {
        let r = c.list_runs(&j, limit).await;
        (j, r)
    });
    futures::stream::iter(calls)
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// Milliseconds since the epoch on this machine (the workers' clock).
pub fn wall_ms() -> i64 {
    now_ms()
}
