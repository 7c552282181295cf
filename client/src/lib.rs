//! Kairos client library: a [`Client`] that finds the leader among the
//! given endpoints and retries transparently, and the worker SDK
//! ([`worker::Worker`]). `kairosctl` is built on both.

pub mod process;
pub mod worker;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use kairos_proto::v1 as pb;
use pb::{cluster_client::ClusterClient, jobs_client::JobsClient, runs_client::RunsClient};
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

/// Metadata key the server uses for the leader's address on a redirect.
pub const LEADER_HEADER: &str = "x-kairos-leader";
/// Metadata key with which an overloaded leader says how many milliseconds
/// to wait before retrying a refused (`RESOURCE_EXHAUSTED`) write.
pub const RETRY_AFTER_HEADER: &str = "retry-after-ms";
/// Metadata of a watch's "compacted" error: the oldest log index the node holds.
pub const OLDEST_INDEX_HEADER: &str = "x-kairos-oldest-index";
/// Response metadata of a watch: the log index its stream starts at.
pub const WATCH_FROM_INDEX_HEADER: &str = "x-kairos-watch-from-index";
/// Metadata key that asks a node for its local state (no forwarding).
pub const LOCAL_HEADER: &str = "x-kairos-local";

/// Metadata key carrying `Bearer <token>`.
pub const AUTH_HEADER: &str = "authorization";
/// Metadata key carrying the id of one logical call: every retry of it
/// sends the same id, and the cluster applies a write at most once per id.
pub const REQUEST_ID_HEADER: &str = "x-kairos-request-id";

#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Mutex<Vec<String>>,
    current: Mutex<usize>,
    channels: Mutex<HashMap<String, Channel>>,
    retry_for: Duration,
    security: Security,
    observer: Option<AttemptObserver>,
}

/// Called after every attempt of a call with its outcome (`Code::Ok` for
/// success) and how long the server took to answer it.
pub type AttemptObserver = Arc<dyn Fn(Code, Duration) + Send + Sync>;

/// Most times one call is retried after `RESOURCE_EXHAUSTED` (an
/// overloaded leader), and the longest hint it follows.
pub const OVERLOAD_RETRIES_MAX: u32 = 8;
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(5);
/// Most calls [`Client::create_jobs`] keeps outstanding at once.
pub const IN_FLIGHT_MAX: usize = 256;
/// Most jobs one `Jobs.CreateJobs` call creates ([`Client::create_job_batch`]).
pub const CREATE_BATCH_MAX: usize = 1000;
/// Most bytes of specs [`Client::create_job_batch`] puts in one call: room
/// under the server's 4 MiB message cap.
pub const CREATE_BATCH_BYTES: usize = 3 << 20;
/// Creates [`Client::create_job_batch`] keeps in flight when the leader
/// does not know `CreateJobs` and it creates one job per call instead.
const UNIMPLEMENTED_IN_FLIGHT: usize = 32;

/// How to reach a cluster: the CA to trust (TLS) and the token to present.
/// The default is plain TCP without a token (a development cluster).
#[derive(Clone, Default)]
pub struct Security {
    /// PEM of the cluster CA (`ca.crt` from `kairos certs init`).
    pub ca_pem: Option<Vec<u8>>,
    /// A token from `kairosctl token create` (or the first admin's).
    pub token: Option<String>,
}

impl Security {
    /// Reads the CA file (if any) and takes the token (if any).
    pub fn load(ca: Option<&std::path::Path>, token: Option<String>) -> Result<Security, Status> {
        let ca_pem = match ca {
            Some(p) => Some(
                std::fs::read(p)
                    .map_err(|e| Status::invalid_argument(format!("--ca {}: {e}", p.display())))?,
            ),
            None => None,
        };
        Ok(Security {
            ca_pem,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// The interceptor that adds the token to every request.
    pub fn auth(&self) -> Result<Auth, Status> {
        let token = match &self.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse::<AsciiMetadataValue>()
                    .map_err(|_| Status::invalid_argument("token: not printable ASCII"))?,
            ),
            None => None,
        };
        Ok(Auth {
            token,
            request_id: None,
        })
    }
}

/// Adds `authorization: Bearer <token>` (if there is a token) and the
/// call's request id (if it has one) to each request.
#[derive(Clone)]
pub struct Auth {
    token: Option<AsciiMetadataValue>,
    request_id: Option<AsciiMetadataValue>,
}

impl Auth {
    /// The same, tagging requests with `id` (one logical call, all its retries).
    pub fn with_request_id(mut self, id: &str) -> Self {
        self.request_id = id.parse().ok();
        self
    }
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(v) = &self.token {
            req.metadata_mut().insert(AUTH_HEADER, v.clone());
        }
        if let Some(v) = &self.request_id {
            req.metadata_mut().insert(REQUEST_ID_HEADER, v.clone());
        }
        Ok(req)
    }
}

/// A fresh request id, unique per call: two randomly keyed SipHashes of the
/// time, the process id and a counter, as 32 hex digits.
pub fn new_request_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // Two independently keyed SipHashes of the time and a counter: unique
    // per process and unpredictable enough for an idempotency key.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let half = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(now);
        h.write_u64(n);
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", half(), half())
}

/// Ping interval and answer timeout of an SDK connection with a call open.
pub const KEEPALIVE: Duration = Duration::from_secs(5);

/// A channel whose requests carry the token.
pub type AuthChannel = InterceptedService<Channel, Auth>;

/// Opens a lazily connecting plain channel; `addr` is host:port or a URL.
pub fn channel(addr: &str) -> Result<Channel, Status> {
    channel_with(addr, &Security::default())
}

/// Opens a lazily connecting channel, over TLS when `sec` has a CA.
pub fn channel_with(addr: &str, sec: &Security) -> Result<Channel, Status> {
    let scheme = if sec.ca_pem.is_some() {
        "https"
    } else {
        "http"
    };
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("{scheme}://{addr}")
    };
    let bad =
        |e: tonic::transport::Error| Status::invalid_argument(format!("endpoint {addr:?}: {e}"));
    let mut ep = Endpoint::from_shared(url).map_err(bad)?;
    if let Some(ca) = &sec.ca_pem {
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        ep = ep.tls_config(tls).map_err(bad)?;
    }
    // While a call or stream is open, ping every 5 s and give up on a
    // connection whose ping is not answered in 5 s: a worker whose leader's
    // host vanished (or dropped off the network) then reconnects to the
    // other endpoints within ~10 s instead of waiting on TCP for minutes.
    Ok(ep
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .connect_lazy())
}

/// Whether a call may be retried on another node without changing its
/// meaning: the cluster was unavailable, or the connection failed (a write
/// retried then is applied at most once, by its request id).
fn retryable(s: &Status) -> bool {
    let transport = || {
        std::error::Error::source(s)
            .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
    };
    match s.code() {
        Code::Unavailable => true,
        Code::Unknown | Code::Internal | Code::Cancelled => {
            transport() || s.message().contains("transport") || s.message().contains("connection")
        }
        _ => false,
    }
}

/// The wait an overloaded leader asked for, if `s` is such a refusal
/// (`RESOURCE_EXHAUSTED` with `retry-after-ms`; other exhaustion, such as
/// a message over the size cap, is not retried).
pub fn retry_after(s: &Status) -> Option<Duration> {
    if s.code() != Code::ResourceExhausted {
        return None;
    }
    let ms: u64 = s
        .metadata()
        .get(RETRY_AFTER_HEADER)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms).min(RETRY_AFTER_MAX))
}

/// A `CreateJobs` item's failure as the `Status` a `CreateJob` would have
/// failed with (with `retry-after-ms` when the item was refused as overload).
fn item_status(code: Code, r: &pb::CreateJobsResult) -> Status {
    let code = if code == Code::Ok {
        Code::Internal
    } else {
        code
    };
    let mut s = Status::new(code, r.message.clone());
    if r.retry_after_ms > 0 {
        s.metadata_mut()
            .insert(RETRY_AFTER_HEADER, r.retry_after_ms.into());
    }
    s
}

/// `hint` stretched by a random 0–50 %, so refused clients do not all come
/// back at once.
fn jittered(hint: Duration) -> Duration {
    use std::hash::BuildHasher;
    // Each RandomState is keyed afresh, so this is a new random number.
    let per_mille = std::collections::hash_map::RandomState::new().hash_one(0u8) % 500;
    hint + hint * per_mille as u32 / 1000
}

impl Client {
    /// A client over `endpoints` (host:port). Retries for up to 10 s by default.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        let endpoints: Vec<String> = endpoints
            .into_iter()
            .map(Into::into)
            .filter(|s: &String| !s.is_empty())
            .collect();
        Client {
            inner: Arc::new(Inner {
                endpoints: Mutex::new(endpoints),
                current: Mutex::new(0),
                channels: Mutex::new(HashMap::new()),
                retry_for: Duration::from_secs(10),
                security: Security::default(),
                observer: None,
            }),
        }
    }

    fn rebuilt(&self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Inner {
            endpoints: Mutex::new(self.endpoints()),
            current: Mutex::new(0),
            channels: Mutex::new(HashMap::new()),
            retry_for: self.inner.retry_for,
            security: self.inner.security.clone(),
            observer: self.inner.observer.clone(),
        };
        change(&mut inner);
        Client {
            inner: Arc::new(inner),
        }
    }

    /// How long a call keeps retrying through leader changes and overload.
    pub fn with_retry_for(self, d: Duration) -> Self {
        self.rebuilt(|i| i.retry_for = d)
    }

    /// TLS trust and token for every call.
    pub fn with_security(self, sec: Security) -> Self {
        self.rebuilt(|i| i.security = sec)
    }

    /// Reports every attempt of every call (for load tools and metrics).
    pub fn with_attempt_observer(self, f: AttemptObserver) -> Self {
        self.rebuilt(|i| i.observer = Some(f))
    }

    pub fn security(&self) -> &Security {
        &self.inner.security
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.inner
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn current(&self) -> Option<String> {
        let eps = self
            .inner
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let i = *self.inner.current.lock().unwrap_or_else(|e| e.into_inner());
        eps.get(i % eps.len().max(1)).cloned()
    }

    fn rotate(&self, hint: Option<String>) {
        let mut eps = self
            .inner
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut cur = self.inner.current.lock().unwrap_or_else(|e| e.into_inner());
        match hint {
            Some(h) => {
                let i = eps.iter().position(|e| *e == h).unwrap_or_else(|| {
                    eps.push(h);
                    eps.len() - 1
                });
                *cur = i;
            }
            None => *cur = (*cur + 1) % eps.len().max(1),
        }
    }

    /// A channel to `addr` whose requests carry this client's token.
    pub fn channel_to(&self, addr: &str) -> Result<AuthChannel, Status> {
        self.channel_tagged(addr, None)
    }

    fn channel_tagged(&self, addr: &str, request_id: Option<&str>) -> Result<AuthChannel, Status> {
        let mut auth = self.inner.security.auth()?;
        if let Some(id) = request_id {
            auth = auth.with_request_id(id);
        }
        let mut map = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(addr) {
            return Ok(InterceptedService::new(c.clone(), auth));
        }
        let c = channel_with(addr, &self.inner.security)?;
        map.insert(addr.to_string(), c.clone());
        Ok(InterceptedService::new(c, auth))
    }

    /// Runs `f` against the current endpoint, following leader hints,
    /// trying other endpoints while the cluster is unavailable, and waiting
    /// out an overloaded leader's retry hint (at most
    /// `OVERLOAD_RETRIES_MAX` times, with jitter).
    pub async fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(AuthChannel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let deadline = Instant::now() + self.inner.retry_for;
        let (mut attempt, mut overloads) = (0u32, 0u32);
        // One id for the call and all its retries: a write whose response
        // was lost is not applied again when retried.
        let request_id = new_request_id();
        loop {
            let addr = self
                .current()
                .ok_or_else(|| Status::invalid_argument("endpoints: none given"))?;
            let started = Instant::now();
            let res = f(self.channel_tagged(&addr, Some(&request_id))?).await;
            if let Some(observe) = &self.inner.observer {
                let code = res.as_ref().map_or_else(Status::code, |_| Code::Ok);
                observe(code, started.elapsed());
            }
            let err = match res {
                Ok(r) => return Ok(r.into_inner()),
                Err(e) => e,
            };
            if let Some(hint) = retry_after(&err) {
                overloads += 1;
                let wait = jittered(hint);
                if overloads > OVERLOAD_RETRIES_MAX || Instant::now() + wait >= deadline {
                    return Err(err);
                }
                tokio::time::sleep(wait).await;
                continue;
            }
            if !retryable(&err) || Instant::now() >= deadline {
                return Err(err);
            }
            let hint = err
                .metadata()
                .get(LEADER_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            self.rotate(hint.filter(|h| *h != addr));
            attempt += 1;
            tokio::time::sleep(Duration::from_millis((25u64 << attempt.min(4)).min(400))).await;
        }
    }

    pub async fn jobs<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(JobsClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call(|c| f(JobsClient::new(c).max_decoding_message_size(8 << 20)))
            .await
    }

    pub async fn runs<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(RunsClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call(|c| f(RunsClient::new(c).max_decoding_message_size(64 << 20)))
            .await
    }

    /// Creates `specs` with up to `in_flight` calls outstanding at once
    /// (clamped to 1..=`IN_FLIGHT_MAX`), all multiplexed over this client's
    /// one HTTP/2 channel per node; the leader commits creates that arrive
    /// together in one log entry, so pipelining is what lets a single client
    /// reach the server's create rate. Each call retries as [`Client::call`]
    /// does. Results come back in the order of `specs`.
    pub async fn create_jobs(
        &self,
        specs: Vec<pb::JobSpec>,
        in_flight: usize,
    ) -> Vec<Result<pb::Job, Status>> {
        use futures::StreamExt;
        let calls = specs.into_iter().map(|spec| {
            let req = pb::CreateJobRequest { spec: Some(spec) };
            self.jobs(move |mut c| {
                let r = req.clone();
                async move { c.create_job(r).await }
            })
        });
        futures::stream::iter(calls)
            .buffered(in_flight.clamp(1, IN_FLIGHT_MAX))
            .collect()
            .await
    }

    /// Creates `specs` with `Jobs.CreateJobs`: one result per spec, in
    /// order. Up to [`CREATE_BATCH_MAX`] specs and [`CREATE_BATCH_BYTES`]
    /// go in one call; more go in several, one after another, and a call
    /// refused whole (an invalid spec, say) ends the batch with its error,
    /// naming the specs it held; the calls before it stand. Every item
    /// carries a request id of its own; items the leader refused as
    /// overloaded (`RESOURCE_EXHAUSTED`), could not propose (`UNAVAILABLE`)
    /// or did not answer in time (`DEADLINE_EXCEEDED`) are sent again with
    /// the same ids, after the longest wait the refusals asked for, at most
    /// `OVERLOAD_RETRIES_MAX` times and within the client's retry time.
    /// A leader of a release before `CreateJobs` (`UNIMPLEMENTED`, during a
    /// rolling upgrade) gets one `CreateJob` call per spec instead.
    pub async fn create_job_batch(
        &self,
        specs: Vec<pb::JobSpec>,
    ) -> Result<Vec<Result<pb::Job, Status>>, Status> {
        let mut out = Vec::with_capacity(specs.len());
        let (mut call, mut bytes) = (Vec::new(), 0);
        let total = specs.len();
        for spec in specs {
            // The spec, its request id and the item's framing.
            let len = prost::Message::encoded_len(&spec) + 48;
            if !call.is_empty()
                && (call.len() == CREATE_BATCH_MAX || bytes + len > CREATE_BATCH_BYTES)
            {
                let first = out.len();
                out.extend(
                    self.create_job_call(std::mem::take(&mut call), first, total)
                        .await?,
                );
                bytes = 0;
            }
            bytes += len;
            call.push(spec);
        }
        if !call.is_empty() {
            let first = out.len();
            out.extend(self.create_job_call(call, first, total).await?);
        }
        Ok(out)
    }

    /// One `CreateJobs` call of [`Client::create_job_batch`]: `specs` are
    /// `[first, first + specs.len())` of `total`.
    async fn create_job_call(
        &self,
        specs: Vec<pb::JobSpec>,
        first: usize,
        total: usize,
    ) -> Result<Vec<Result<pb::Job, Status>>, Status> {
        let deadline = Instant::now() + self.inner.retry_for;
        let specs_len = specs.len();
        let mut out: Vec<Option<Result<pb::Job, Status>>> = specs.iter().map(|_| None).collect();
        let mut items: Vec<(usize, pb::CreateJobsItem)> = (specs.into_iter().enumerate())
            .map(|(i, spec)| {
                let request_id = new_request_id();
                (
                    i,
                    pb::CreateJobsItem {
                        spec: Some(spec),
                        request_id,
                    },
                )
            })
            .collect();
        for round in 0.. {
            let req = pb::CreateJobsRequest {
                items: items.iter().map(|(_, item)| item.clone()).collect(),
            };
            let answer = self
                .jobs(|mut c| {
                    let r = req.clone();
                    async move { c.create_jobs(r).await }
                })
                .await;
            let answer = match answer {
                // A leader of an older release (a rolling upgrade): one call
                // per job, as before CreateJobs.
                Err(e) if e.code() == Code::Unimplemented && round == 0 => {
                    let specs = (items.into_iter())
                        .map(|(_, item)| item.spec.unwrap_or_default())
                        .collect();
                    return Ok(self.create_jobs(specs, UNIMPLEMENTED_IN_FLIGHT).await);
                }
                Err(e) if total > specs_len => {
                    let end = first + specs_len;
                    let msg = format!("specs[{first}..{end}] of {total}: {}", e.message());
                    return Err(Status::new(e.code(), msg));
                }
                other => other?,
            };
            if answer.results.len() != items.len() {
                return Err(Status::internal(format!(
                    "CreateJobs answered {} results for {} items",
                    answer.results.len(),
                    items.len()
                )));
            }
            let (mut again, mut wait) = (Vec::new(), Duration::ZERO);
            for ((i, item), r) in items.into_iter().zip(answer.results) {
                let code = Code::from_i32(r.code);
                out[i] = Some(match r.job {
                    Some(job) if code == Code::Ok => Ok(job),
                    _ => Err(item_status(code, &r)),
                });
                // Sent again with its id, an item is applied at most once:
                // also when its first answer (a timeout) left that open.
                let again_ok = [
                    Code::ResourceExhausted,
                    Code::Unavailable,
                    Code::DeadlineExceeded,
                ];
                if again_ok.contains(&code) {
                    wait = wait.max(Duration::from_millis(r.retry_after_ms));
                    again.push((i, item));
                }
            }
            let wait = jittered(wait.clamp(Duration::from_millis(25), RETRY_AFTER_MAX));
            if again.is_empty()
                || round >= OVERLOAD_RETRIES_MAX
                || Instant::now() + wait >= deadline
            {
                break;
            }
            tokio::time::sleep(wait).await;
            items = again;
        }
        let missing = || Status::internal("CreateJobs: an item got no result");
        Ok(out
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(missing())))
            .collect())
    }

    /// Runs a finished run again as its next attempt (`Runs.RetryRun`).
    pub async fn retry_run(&self, run_id: &str) -> Result<pb::Run, Status> {
        let req = pb::RunRef {
            run_id: run_id.to_string(),
        };
        self.runs(|mut c| {
            let r = req.clone();
            async move { c.retry_run(r).await }
        })
        .await
    }

    pub async fn status(&self) -> Result<pb::StatusResponse, Status> {
        self.call(|c| async move { ClusterClient::new(c).status(pb::StatusRequest {}).await })
            .await
    }

    /// One page of `Jobs.ListJobs` (page on with its `next_page_token`).
    pub async fn list_jobs(
        &self,
        req: pb::ListJobsRequest,
    ) -> Result<pb::ListJobsResponse, Status> {
        self.jobs(|mut j| {
            let r = req.clone();
            async move { j.list_jobs(r).await }
        })
        .await
    }

    /// Runs of `job` in scheduled order, paging through the server's pages up to `limit`.
    pub async fn list_runs(&self, job: &str, limit: usize) -> Result<Vec<pb::Run>, Status> {
        let mut out = Vec::new();
        let (mut after, mut after_shard) = (0i64, 0u32);
        while out.len() < limit {
            let page_size = (limit - out.len()).min(1000) as u32;
            let req = pb::ListRunsRequest {
                job: job.to_string(),
                page_size,
                after_scheduled_at_ms: after,
                after_shard,
            };
            let page = self.runs(|mut c| {
                let req = req.clone();
                async move { c.list_runs(req).await }
            });
            let page = page.await?;
            out.extend(page.runs);
            if page.next_after_scheduled_at_ms == 0 && page.next_after_shard == 0 {
                break;
            }
            (after, after_shard) = (page.next_after_scheduled_at_ms, page.next_after_shard);
        }
        Ok(out)
    }

    /// Runs of `job` as stored on the node at `addr` itself (no forwarding, no read index).
    pub async fn list_runs_local(
        &self,
        addr: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<pb::Run>, Status> {
        let mut out = Vec::new();
        let (mut after, mut after_shard) = (0i64, 0u32);
        let mut client =
            RunsClient::new(self.channel_to(addr)?).max_decoding_message_size(64 << 20);
        while out.len() < limit {
            let page_size = (limit - out.len()).min(1000) as u32;
            let mut req = tonic::Request::new(pb::ListRunsRequest {
                job: job.to_string(),
                page_size,
                after_scheduled_at_ms: after,
                after_shard,
            });
            req.metadata_mut().insert(
                LOCAL_HEADER,
                tonic::metadata::MetadataValue::from_static("1"),
            );
            let page = client.list_runs(req).await?.into_inner();
            out.extend(page.runs);
            if page.next_after_scheduled_at_ms == 0 && page.next_after_shard == 0 {
                break;
            }
            (after, after_shard) = (page.next_after_scheduled_at_ms, page.next_after_shard);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(ms: &str) -> Status {
        let mut s = Status::resource_exhausted("leader overloaded");
        s.metadata_mut()
            .insert(RETRY_AFTER_HEADER, ms.parse().unwrap());
        s
    }

    #[test]
    fn only_a_refusal_with_a_hint_is_waited_out() {
        assert_eq!(
            retry_after(&refusal("120")),
            Some(Duration::from_millis(120))
        );
        assert_eq!(retry_after(&refusal("999999")), Some(RETRY_AFTER_MAX));
        assert_eq!(retry_after(&refusal("soon")), None);
        // Exhaustion without a hint (e.g. a message over the size cap) is final.
        assert_eq!(retry_after(&Status::resource_exhausted("too big")), None);
        let mut other = Status::unavailable("x");
        other
            .metadata_mut()
            .insert(RETRY_AFTER_HEADER, "5".parse().unwrap());
        assert_eq!(retry_after(&other), None);
    }

    /// Runs one call whose first `refusals` attempts are refused (with
    /// `hint`, if any); returns its result and the attempts the observer saw.
    async fn call_refused(refusals: u32, hint: Option<&'static str>) -> (Result<u32, Status>, u32) {
        use std::sync::atomic::{AtomicU32, Ordering};
        let (tries, seen) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let count = seen.clone();
        let client = Client::new(["127.0.0.1:1"]).with_attempt_observer(Arc::new(move |_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        }));
        let res = client
            .call(|_channel| {
                let n = tries.fetch_add(1, Ordering::Relaxed);
                async move {
                    match (n < refusals, hint) {
                        (false, _) => Ok(tonic::Response::new(7)),
                        (true, Some(ms)) => Err(refusal(ms)),
                        (true, None) => Err(Status::resource_exhausted("too big")),
                    }
                }
            })
            .await;
        assert_eq!(seen.load(Ordering::Relaxed), tries.load(Ordering::Relaxed));
        (res, tries.load(Ordering::Relaxed))
    }

    #[tokio::test]
    async fn a_refused_call_is_retried_as_hinted_until_admitted() {
        let (res, tries) = call_refused(3, Some("1")).await;
        assert_eq!((res.ok(), tries), (Some(7), 4));
    }

    #[tokio::test]
    async fn overload_retries_are_bounded_and_a_hintless_refusal_is_final() {
        let (res, tries) = call_refused(u32::MAX, Some("1")).await;
        assert_eq!(res.unwrap_err().code(), Code::ResourceExhausted);
        assert_eq!(tries, OVERLOAD_RETRIES_MAX + 1);
        let (res, tries) = call_refused(u32::MAX, None).await;
        assert_eq!(
            (res.unwrap_err().code(), tries),
            (Code::ResourceExhausted, 1)
        );
    }

    #[test]
    fn jitter_stretches_the_hint_by_at_most_half() {
        let hint = Duration::from_millis(200);
        let waits: Vec<Duration> = (0..200).map(|_| jittered(hint)).collect();
        assert!(waits.iter().all(|w| *w >= hint && *w < hint * 3 / 2));
        assert!(waits.iter().any(|w| *w != waits[0]), "no jitter at all");
    }
}
