//! gRPC plumbing: one lazily-connected channel per node, the job calls the
//! workloads make, per-node local reads (`x-kairos-local: 1`), cluster status
//! and leader lookup, and the one place that decides whether a failed call
//! certainly did nothing (`fail`) or may have taken effect (`unknown`).

use crate::event::Outcome;
use kairos_proto::v1::{
    cluster_client::ClusterClient, jobs_client::JobsClient, schedule::Kind, AddLearnerRequest,
    CreateJobRequest, Job, JobRef, JobSpec, MembershipResponse, MisfirePolicy, NodeRef,
    PauseJobRequest, Schedule, StatusRequest, StatusResponse, UpdateJobRequest,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

/// Worker group of every job that should run on harness workers.
pub const WORKER_GROUP: &str = "jepsen";
/// Register jobs are scheduled here (2100-01-01) so they never fire.
pub const FAR_FUTURE_MS: i64 = 4_102_444_800_000;
/// Misfire grace for harness jobs: late occurrences still fire, so every
/// occurrence leaves a run record.
pub const MISFIRE_GRACE_MS: u64 = 3_600_000;
/// Run deadline: a lost finish is retried after this.
pub const RUN_TIMEOUT_MS: u64 = 5_000;

/// One slot of the cluster: a fixed address (namespace, ports) whose node id
/// changes when the membership nemesis replaces the node living there. Clones
/// share the id, so every workload sees a replacement at once.
#[derive(Clone)]
pub struct Node {
    pub slot: usize,
    id: Arc<AtomicU64>,
    pub addr: String,
    pub channel: NodeChannel,
}

impl Node {
    pub fn new(slot: usize, id: u64, addr: String, channel: NodeChannel) -> Node {
        Node {
            slot,
            id: Arc::new(AtomicU64::new(id)),
            addr,
            channel,
        }
    }

    /// The id of the node in this slot now.
    pub fn id(&self) -> u64 {
        self.id.load(Ordering::Relaxed)
    }

    pub fn set_id(&self, id: u64) {
        self.id.store(id, Ordering::Relaxed);
    }
}

/// How the harness reaches a secure cluster: its CA and the admin token.
/// The default (no CA, no token) is a plain development cluster.
#[derive(Clone, Default, Debug)]
pub struct Security {
    pub ca_pem: Option<Vec<u8>>,
    pub token: Option<String>,
}

/// Adds the bearer token (if any) to every request.
#[derive(Clone)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A channel whose requests carry the harness's token.
pub type NodeChannel = InterceptedService<Channel, Bearer>;

/// A lazily connecting channel with short connect and keep-alive timeouts,
/// so a paused or cut-off node is noticed quickly; TLS when `sec` has a CA.
pub fn channel(addr: &str, sec: &Security) -> anyhow::Result<NodeChannel> {
    let scheme = if sec.ca_pem.is_some() {
        "https"
    } else {
        "http"
    };
    let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))?
        .connect_timeout(Duration::from_millis(1_000))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(2))
        .keep_alive_timeout(Duration::from_secs(3))
        .keep_alive_while_idle(true);
    if let Some(ca) = &sec.ca_pem {
        ep = ep.tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))?;
    }
    let bearer = match &sec.token {
        Some(t) => Some(format!("Bearer {t}").parse()?),
        None => None,
    };
    Ok(InterceptedService::new(ep.connect_lazy(), Bearer(bearer)))
}

pub fn request<T>(msg: T, timeout: Duration) -> Request<T> {
    let mut r = Request::new(msg);
    r.set_timeout(timeout);
    r
}

/// A request answered from the receiving node's own state, not forwarded.
pub fn local<T>(msg: T, timeout: Duration) -> Request<T> {
    let mut r = request(msg, timeout);
    r.metadata_mut().insert(
        "x-kairos-local",
        tonic::metadata::MetadataValue::from_static("1"),
    );
    r
}

/// `fail` only when the request certainly had no effect: a definite
/// rejection, or a connection that was never made. Everything else that can
/// happen after the request left (timeouts, UNAVAILABLE from a forwarding
/// node, resets) is `unknown`.
pub fn classify(s: &Status) -> Outcome {
    match s.code() {
        Code::Ok => Outcome::Ok,
        Code::AlreadyExists
        | Code::FailedPrecondition
        | Code::NotFound
        | Code::InvalidArgument
        | Code::OutOfRange
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::Unimplemented => Outcome::Fail,
        Code::Unavailable if never_sent(s) => Outcome::Fail,
        _ => Outcome::Unknown,
    }
}

fn never_sent(s: &Status) -> bool {
    let text = format!("{} {:?}", s.message(), std::error::Error::source(s)).to_lowercase();
    text.contains("connection refused")
        || text.contains("error trying to connect")
        || text.contains("tcp connect error")
}

/// The canonical upper-case gRPC code name.
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A harness job spec: fires go to the harness workers, late occurrences
/// still fire, and failed finishes are retried.
pub fn spec(id: &str, kind: Kind, payload: Vec<u8>, group: &str) -> JobSpec {
    JobSpec {
        id: id.to_string(),
        schedule: Some(Schedule { kind: Some(kind) }),
        group: group.to_string(),
        payload,
        misfire: MisfirePolicy::FireAll as i32,
        misfire_grace_ms: MISFIRE_GRACE_MS,
        timeout_ms: RUN_TIMEOUT_MS,
        max_attempts: 5,
        backoff_ms: 500,
        ..Default::default()
    }
}

/// The register value stored in a job's payload.
pub fn payload_value(job: &Job) -> Option<u64> {
    let spec = job.spec.as_ref()?;
    std::str::from_utf8(&spec.payload).ok()?.trim().parse().ok()
}

pub async fn create(ch: &NodeChannel, spec: JobSpec, t: Duration) -> Result<Job, Status> {
    let req = request(CreateJobRequest { spec: Some(spec) }, t);
    Ok(JobsClient::new(ch.clone())
        .create_job(req)
        .await?
        .into_inner())
}

pub async fn update(
    ch: &NodeChannel,
    spec: JobSpec,
    expected_revision: u64,
    t: Duration,
) -> Result<Job, Status> {
    let req = UpdateJobRequest {
        spec: Some(spec),
        expected_revision,
    };
    Ok(JobsClient::new(ch.clone())
        .update_job(request(req, t))
        .await?
        .into_inner())
}

pub async fn get(ch: &NodeChannel, id: &str, t: Duration) -> Result<Job, Status> {
    let req = JobRef { id: id.to_string() };
    Ok(JobsClient::new(ch.clone())
        .get_job(request(req, t))
        .await?
        .into_inner())
}

pub async fn delete(ch: &NodeChannel, id: &str, t: Duration) -> Result<bool, Status> {
    let req = JobRef { id: id.to_string() };
    Ok(JobsClient::new(ch.clone())
        .delete_job(request(req, t))
        .await?
        .into_inner()
        .deleted)
}

pub async fn pause(ch: &NodeChannel, id: &str, t: Duration) -> Result<Job, Status> {
    let req = PauseJobRequest {
        id: id.to_string(),
        note: String::new(),
    };
    Ok(JobsClient::new(ch.clone())
        .pause_job(request(req, t))
        .await?
        .into_inner())
}

/// This node's own view of the cluster.
pub async fn status(ch: &NodeChannel, t: Duration) -> Result<StatusResponse, Status> {
    let call = async {
        ClusterClient::new(ch.clone())
            .status(local(StatusRequest {}, t))
            .await
    };
    bounded(t, call).await
}

/// Adds node `id` (started with `--join`, listening for peers at
/// `peer_addr`) as a learner; any node forwards it to the leader.
pub async fn add_learner(
    ch: &NodeChannel,
    id: u64,
    peer_addr: &str,
    t: Duration,
) -> Result<MembershipResponse, Status> {
    let req = AddLearnerRequest {
        id,
        peer_addr: peer_addr.to_string(),
    };
    let call = async {
        ClusterClient::new(ch.clone())
            .add_learner(request(req, t))
            .await
    };
    bounded(t, call).await
}

/// Makes learner `id` a voter.
pub async fn promote(ch: &NodeChannel, id: u64, t: Duration) -> Result<MembershipResponse, Status> {
    let call = async {
        ClusterClient::new(ch.clone())
            .promote(request(NodeRef { id }, t))
            .await
    };
    bounded(t, call).await
}

/// Removes voter or learner `id` from the cluster.
pub async fn remove_node(
    ch: &NodeChannel,
    id: u64,
    t: Duration,
) -> Result<MembershipResponse, Status> {
    let call = async {
        ClusterClient::new(ch.clone())
            .remove_node(request(NodeRef { id }, t))
            .await
    };
    bounded(t, call).await
}

/// Header of a "not the leader" answer naming the leader's public address.
const LEADER_HEADER: &str = "x-kairos-leader";

/// The slot of the leader a "not the leader" answer names, if it is one of ours.
pub fn redirect(s: &Status, nodes: &[Node]) -> Option<usize> {
    if s.code() != Code::Unavailable {
        return None;
    }
    let addr = s.metadata().get(LEADER_HEADER)?.to_str().ok()?;
    nodes.iter().position(|n| n.addr == addr)
}

/// Runs a call with a deadline of its own besides the gRPC one, so a
/// paused node cannot hold the caller.
async fn bounded<T>(
    t: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(t + Duration::from_millis(500), call).await {
        Ok(r) => Ok(r?.into_inner()),
        Err(_) => Err(Status::deadline_exceeded("timed out")),
    }
}

/// The leader's own view of the cluster: the status read locally on the
/// slot most nodes name as leader, if that node says it leads. Its voter
/// flags are the latest membership the leader knows, its `lag`s are real.
pub async fn leader_view(nodes: &[Node]) -> Option<(usize, StatusResponse)> {
    let id = find_leader(nodes).await?;
    let slot = nodes.iter().position(|n| n.id() == id)?;
    let s = status(&nodes[slot].channel, Duration::from_millis(800))
        .await
        .ok()?;
    let leads = s.leader == id && s.nodes.iter().any(|n| n.id == id && n.role == "leader");
    leads.then_some((slot, s))
}

/// The leader id most nodes agree on, if any node knows one.
pub async fn find_leader(nodes: &[Node]) -> Option<u64> {
    let t = Duration::from_millis(800);
    let calls = nodes.iter().map(|n| {
        let ch = n.channel.clone();
        async move { status(&ch, t).await }
    });
    let mut votes: std::collections::BTreeMap<u64, usize> = Default::default();
    for r in join_all(calls).await.into_iter().flatten() {
        if r.leader != 0 {
            *votes.entry(r.leader).or_insert(0) += 1;
        }
    }
    votes.into_iter().max_by_key(|(_, v)| *v).map(|(id, _)| id)
}

/// Awaits futures concurrently (no `futures` dependency).
pub async fn join_all<F: std::future::Future + Send + 'static>(
    fs: impl IntoIterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_redirect_names_one_of_our_slots() {
        let nodes: Vec<Node> = (0..3)
            .map(|slot| {
                let addr = format!("10.0.0.{}:7070", slot + 1);
                let ch = channel(&addr, &Security::default()).unwrap();
                Node::new(slot, slot as u64 + 1, addr, ch)
            })
            .collect();
        let with_leader = |code: Code, addr: &str| {
            let mut s = Status::new(code, "not the leader");
            s.metadata_mut()
                .insert(LEADER_HEADER, addr.parse().unwrap());
            s
        };
        assert_eq!(
            redirect(&with_leader(Code::Unavailable, "10.0.0.3:7070"), &nodes),
            Some(2)
        );
        assert_eq!(
            redirect(&with_leader(Code::Unavailable, "10.9.9.9:7070"), &nodes),
            None
        );
        assert_eq!(
            redirect(&with_leader(Code::Internal, "10.0.0.3:7070"), &nodes),
            None
        );
        assert_eq!(
            redirect(&Status::unavailable("no leader elected yet"), &nodes),
            None
        );
        nodes[2].set_id(6);
        assert_eq!((nodes[2].id(), nodes[2].clone().id()), (6, 6));
    }

    #[test]
    fn definite_rejections_fail_and_timeouts_are_unknown() {
        assert_eq!(classify(&Status::already_exists("x")), Outcome::Fail);
        assert_eq!(classify(&Status::failed_precondition("rev")), Outcome::Fail);
        assert_eq!(classify(&Status::deadline_exceeded("t")), Outcome::Unknown);
        assert_eq!(
            classify(&Status::unavailable("no leader")),
            Outcome::Unknown
        );
        assert_eq!(
            classify(&Status::unavailable(
                "tcp connect error: Connection refused"
            )),
            Outcome::Fail
        );
        assert_eq!(classify(&Status::internal("boom")), Outcome::Unknown);
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
    }
}
