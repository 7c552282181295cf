//! Public Jobs, Runs and Cluster services. Writes are validated at the
//! edge (so bad input costs no log entry), proposed, and validated again in
//! apply; reads go through a read index on the leader.

use std::sync::Arc;

use kairos_proto::v1::{
    self as pb, cluster_client::ClusterClient, jobs_client::JobsClient, runs_client::RunsClient,
};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::auth::{authorize, hash_secret, Need};
use super::convert::{
    backfill_overlap_in, firing_out, job_filter_in, job_out, job_stats_out, page_size,
    run_marked_out, schedule_in, spec_in,
};
use super::{error, forwarded, read_barrier, route, write_now_ms};
use crate::backup;
use crate::core::{
    limits, query, run_search, validate, Command, Job, JobSpec, Response as R, Role, RunId,
    Schedule, Token,
};
use crate::handover;
use crate::membership;
use crate::node::Node;

#[derive(Clone)]
pub struct Api {
    pub node: Arc<Node>,
}

/// Admits the call if the caller may do `$need`, then serves it on the
/// leader or forwards it there unchanged (with the caller's token and request
/// id). Evaluates to who is calling, for writes.
macro_rules! forward {
    ($self:ident, $req:ident, $need:expr, $client:ident, $method:ident) => {{
        let actor = authorize(&$self.node, &$req, $need)?;
        if let Some(ch) = route(&$self.node, &$req)? {
            return $client::new(ch).$method(forwarded($req)).await;
        }
        Caller {
            request_id: request_id(&$req),
            actor,
            rpc: stringify!($method),
        }
    }};
}

/// Who makes a write: the token's name, the client's request id, and the
/// method called (`create_job`).
struct Caller {
    request_id: Option<String>,
    actor: String,
    rpc: &'static str,
}

impl Caller {
    /// The `client_write` span of the call (`items` is set only by a
    /// `CreateJobs` call, which has one span for all its creates).
    fn span(&self) -> tracing::Span {
        tracing::info_span!(
            "client_write",
            rpc = self.rpc,
            request_id = self.request_id.as_deref().unwrap_or(""),
            actor = %self.actor,
            items = tracing::field::Empty,
        )
    }
}

/// The client's request id (`x-kairos-request-id`), if it sent one.
fn request_id<T>(req: &Request<T>) -> Option<String> {
    let v = req.metadata().get(kairos_client::REQUEST_ID_HEADER)?;
    Some(v.to_str().ok()?.to_string())
}

impl Api {
    /// Proposes a client write, recording who made it; with a request id it
    /// is applied at most once. Inside a `client_write` span (admission,
    /// proposal, commit and apply), exported with the run spans (`otel.rs`).
    async fn write(&self, who: Caller, cmd: Command) -> Result<R, Status> {
        let span = who.span();
        self.propose(who, cmd).instrument(span).await
    }

    async fn propose(&self, who: Caller, cmd: Command) -> Result<R, Status> {
        let cmd = match who.actor.is_empty() {
            true => cmd,
            false => Command::Authored {
                actor: who.actor,
                command: Box::new(cmd),
            },
        };
        let cmd = match who.request_id {
            Some(request_id) => {
                validate::request_id(&request_id).map_err(error::command)?;
                Command::Dedup {
                    request_id,
                    command: Box::new(cmd),
                }
            }
            None => cmd,
        };
        match self
            .node
            .propose_grouped(cmd)
            .await
            .map_err(error::propose)?
        {
            R::Error(e) => Err(error::command(e)),
            r => Ok(r),
        }
    }

    /// A run with the backfill that created it.
    fn run_out(&self, r: &crate::core::Run) -> pb::Run {
        run_marked_out(r, self.node.sm.run_backfill(&r.id))
    }

    async fn write_job(&self, rid: Caller, cmd: Command) -> Result<Response<pb::Job>, Status> {
        match self.write(rid, cmd).await? {
            R::Job(j) => Ok(Response::new(job_out(&j))),
            other => Err(Status::internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn write_firing(
        &self,
        rid: Caller,
        cmd: Command,
    ) -> Result<Response<pb::FiringStatus>, Status> {
        match self.write(rid, cmd).await? {
            R::Firing(p) => Ok(Response::new(firing_out(p))),
            other => Err(Status::internal(format!("unexpected response {other:?}"))),
        }
    }

    fn job_id(id: &str) -> Result<(), Status> {
        validate::job_id(id).map_err(error::command)
    }
}

// The SDK sends at most what the server accepts in one call.
const _: () = assert!(limits::CREATE_BATCH_MAX == kairos_client::CREATE_BATCH_MAX);

/// The items of a `CreateJobs` call as specs to create, each with its
/// request id: its own, else `<call's request id>-<index>` (so a retried
/// call is applied once), else none. Refuses the whole call, naming the
/// item, if any item is invalid or repeats another's job id or request id.
fn batch_in(
    items: Vec<pb::CreateJobsItem>,
    call_request_id: Option<&str>,
    now_ms: i64,
) -> Result<Vec<(Option<String>, JobSpec)>, Status> {
    let n = items.len();
    if n == 0 || n > limits::CREATE_BATCH_MAX {
        return Err(Status::invalid_argument(format!(
            "items: 1 to {} per call, got {n}",
            limits::CREATE_BATCH_MAX
        )));
    }
    let mut ids = std::collections::HashMap::with_capacity(n);
    let mut request_ids = std::collections::HashMap::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    for (i, item) in items.into_iter().enumerate() {
        let at = |msg: &str| Status::invalid_argument(format!("items[{i}].{msg}"));
        let spec = item.spec.ok_or_else(|| at("spec: required"))?;
        let spec = spec_in(Some(spec)).map_err(|e| at(&format!("spec.{}", e.message())))?;
        let spec = with_seed(spec);
        validate::job_spec(&spec, now_ms).map_err(|e| at(&format!("spec.{e}")))?;
        let request_id = match (item.request_id.as_str(), call_request_id) {
            ("", None) => None,
            ("", Some(call)) => Some(format!("{call}-{i}")),
            (own, _) => Some(own.to_string()),
        };
        if let Some(r) = &request_id {
            if item.request_id.is_empty() && r.len() > limits::REQUEST_ID_MAX_BYTES {
                return Err(Status::invalid_argument(format!(
                    "x-kairos-request-id: items without a request id of their own get \
                     `<call's id>-<index>`, at most {} bytes; items[{i}]'s would be {} \
                     (send a shorter id, or one per item)",
                    limits::REQUEST_ID_MAX_BYTES,
                    r.len()
                )));
            }
            validate::request_id(r).map_err(|e| at(&e.to_string()))?;
            if let Some(first) = request_ids.insert(r.clone(), i) {
                return Err(at(&format!("request_id: {r:?} is also items[{first}]'s")));
            }
        }
        if let Some(first) = ids.insert(spec.id.clone(), i) {
            return Err(at(&format!(
                "spec.id: {:?} is also items[{first}]'s",
                spec.id
            )));
        }
        out.push((request_id, spec));
    }
    Ok(out)
}

/// One item's outcome in a `CreateJobs` answer.
fn batch_result(r: Result<R, Status>) -> pb::CreateJobsResult {
    match r {
        Ok(R::Job(j)) => pb::CreateJobsResult {
            job: Some(job_out(&j)),
            ..Default::default()
        },
        Ok(other) => pb::CreateJobsResult {
            code: tonic::Code::Internal as i32,
            message: format!("unexpected response {other:?}"),
            ..Default::default()
        },
        Err(s) => pb::CreateJobsResult {
            job: None,
            code: s.code() as i32,
            message: s.message().to_string(),
            retry_after_ms: kairos_client::retry_after(&s).map_or(0, |d| d.as_millis() as u64),
        },
    }
}

/// Draws a jitter's seed on the leader (these handlers run there after
/// forwarding), never in apply: it travels in the command, so every replica
/// computes the same offsets. Apply keeps the seed of a job that already
/// has a jitter.
fn with_seed(mut spec: JobSpec) -> JobSpec {
    if let Some(j) = spec.jitter.as_mut() {
        j.seed = rand::random();
    }
    spec
}

#[tonic::async_trait]
impl pb::jobs_server::Jobs for Api {
    type WatchStream = super::watch::WatchStream;

    /// Served here, never forwarded: every node holds the same events.
    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        authorize(&self.node, &req, Need::Read)?;
        super::watch::start(self.node.sm.watch(), req.into_inner())
    }

    async fn create_job(
        &self,
        req: Request<pb::CreateJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let rid = forward!(self, req, Need::Write, JobsClient, create_job);
        let spec = with_seed(spec_in(req.into_inner().spec)?);
        let now_ms = write_now_ms(&self.node).await?;
        validate::job_spec(&spec, now_ms).map_err(error::command)?;
        self.write_job(rid, Command::create_job(spec, now_ms)).await
    }

    async fn create_jobs(
        &self,
        req: Request<pb::CreateJobsRequest>,
    ) -> Result<Response<pb::CreateJobsResponse>, Status> {
        let who = forward!(self, req, Need::Write, JobsClient, create_jobs);
        let now_ms = write_now_ms(&self.node).await?;
        let items = batch_in(req.into_inner().items, who.request_id.as_deref(), now_ms)?;
        // One `client_write` span for the call, not one per item.
        let span = who.span();
        span.record("items", items.len());
        // Each item is a CreateJob of its own; proposed together, they go
        // into the log in the same group commits.
        let writes = items.into_iter().map(|(request_id, spec)| {
            let caller = Caller {
                request_id,
                actor: who.actor.clone(),
                rpc: who.rpc,
            };
            self.propose(caller, Command::create_job(spec, now_ms))
        });
        let results = futures::future::join_all(writes).instrument(span).await;
        let results = results.into_iter().map(batch_result).collect();
        Ok(Response::new(pb::CreateJobsResponse { results }))
    }

    async fn update_job(
        &self,
        req: Request<pb::UpdateJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let rid = forward!(self, req, Need::Write, JobsClient, update_job);
        let r = req.into_inner();
        let spec = with_seed(spec_in(r.spec)?);
        let now_ms = write_now_ms(&self.node).await?;
        // The schedule is checked in apply, which knows whether it changed.
        validate::job_spec_with(&spec, now_ms, false).map_err(error::command)?;
        self.write_job(rid, Command::update_job(spec, r.expected_revision, now_ms))
            .await
    }

    async fn job_history(
        &self,
        req: Request<pb::JobRef>,
    ) -> Result<Response<pb::JobHistoryResponse>, Status> {
        forward!(self, req, Need::Read, JobsClient, job_history);
        read_barrier(&self.node, &req).await?;
        let id = req.into_inner().id;
        Self::job_id(&id)?;
        let revisions = (self.node.sm.job_history(&id).into_iter())
            .map(|r| pb::JobRevision {
                revision: r.revision,
                at_ms: r.at_ms,
                by: r.by,
                action: r.action,
            })
            .collect();
        Ok(Response::new(pb::JobHistoryResponse { revisions }))
    }

    async fn job_stats(
        &self,
        req: Request<pb::JobRef>,
    ) -> Result<Response<pb::JobStatsResponse>, Status> {
        forward!(self, req, Need::Read, JobsClient, job_stats);
        read_barrier(&self.node, &req).await?;
        let id = req.into_inner().id;
        Self::job_id(&id)?;
        if self.node.sm.get_job(&id).is_none() {
            return Err(Status::not_found(format!("job {id:?} not found")));
        }
        let st = self.node.sm.job_stats(&id);
        Ok(Response::new(job_stats_out(&id, &st)))
    }

    async fn get_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::Job>, Status> {
        forward!(self, req, Need::Read, JobsClient, get_job);
        read_barrier(&self.node, &req).await?;
        let id = req.into_inner().id;
        Self::job_id(&id)?;
        let job = self
            .node
            .sm
            .get_job(&id)
            .ok_or_else(|| Status::not_found(format!("job {id:?} not found")))?;
        let mut out = job_out(&job);
        out.downstream = self.node.sm.downstreams(&id);
        Ok(Response::new(out))
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        forward!(self, req, Need::Read, JobsClient, list_jobs);
        read_barrier(&self.node, &req).await?;
        let r = req.into_inner();
        let n = page_size(r.page_size)?;
        let filter = job_filter_in(&r)?;
        let page = self.node.sm.jobs_page(&filter, &r.page_token, n);
        Ok(Response::new(pb::ListJobsResponse {
            jobs: page.jobs.iter().map(job_out).collect(),
            next_page_token: page.next_after,
        }))
    }

    async fn delete_job(
        &self,
        req: Request<pb::JobRef>,
    ) -> Result<Response<pb::DeleteJobResponse>, Status> {
        let rid = forward!(self, req, Need::Write, JobsClient, delete_job);
        let id = req.into_inner().id;
        Self::job_id(&id)?;
        match self
            .write(
                rid,
                Command::DeleteJob {
                    id,
                    now_ms: write_now_ms(&self.node).await?,
                },
            )
            .await?
        {
            R::Deleted(deleted) => Ok(Response::new(pb::DeleteJobResponse { deleted })),
            other => Err(Status::internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn pause_job(
        &self,
        req: Request<pb::PauseJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let rid = forward!(self, req, Need::Write, JobsClient, pause_job);
        let pb::PauseJobRequest { id, note } = req.into_inner();
        Self::job_id(&id)?;
        validate::pause_note(&note).map_err(error::command)?;
        self.write_job(
            rid,
            Command::pause_job(id, note, write_now_ms(&self.node).await?),
        )
        .await
    }

    async fn resume_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::Job>, Status> {
        let rid = forward!(self, req, Need::Write, JobsClient, resume_job);
        let id = req.into_inner().id;
        Self::job_id(&id)?;
        self.write_job(
            rid,
            Command::ResumeJob {
                id,
                now_ms: write_now_ms(&self.node).await?,
            },
        )
        .await
    }

    async fn trigger_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::Run>, Status> {
        let rid = forward!(self, req, Need::Write, JobsClient, trigger_job);
        let id = req.into_inner().id;
        Self::job_id(&id)?;
        match self
            .write(
                rid,
                Command::TriggerJob {
                    id,
                    now_ms: write_now_ms(&self.node).await?,
                    widths: self.node.dispatcher.widths(),
                },
            )
            .await?
        {
            R::Run(run) => Ok(Response::new(self.run_out(&run))),
            other => Err(Status::internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn backfill_job(
        &self,
        req: Request<pb::BackfillJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let rid = forward!(self, req, Need::Write, JobsClient, backfill_job);
        let r = req.into_inner();
        Self::job_id(&r.id)?;
        let cmd = Command::StartBackfill {
            overlap: backfill_overlap_in(&r.overlap)?,
            id: r.id,
            from_ms: r.from_ms,
            to_ms: r.to_ms,
            now_ms: write_now_ms(&self.node).await?,
        };
        self.write_job(rid, cmd).await
    }

    async fn cancel_backfill(&self, req: Request<pb::JobRef>) -> Result<Response<pb::Job>, Status> {
        let rid = forward!(self, req, Need::Write, JobsClient, cancel_backfill);
        let id = req.into_inner().id;
        Self::job_id(&id)?;
        let cmd = Command::CancelBackfill {
            id,
            now_ms: write_now_ms(&self.node).await?,
        };
        self.write_job(rid, cmd).await
    }

    async fn next_fires(
        &self,
        req: Request<pb::NextFiresRequest>,
    ) -> Result<Response<pb::NextFiresResponse>, Status> {
        forward!(self, req, Need::Read, JobsClient, next_fires);
        read_barrier(&self.node, &req).await?;
        let r = req.into_inner();
        let count = r.count as usize;
        if count == 0 || count > limits::PREVIEW_MAX {
            return Err(Status::invalid_argument(format!(
                "count: must be between 1 and {}, got {count}",
                limits::PREVIEW_MAX
            )));
        }
        let now = self.node.clock.now_ms();
        let (schedule, job): (Schedule, Option<Job>) = if r.schedule.is_some() {
            let input = schedule_in(r.schedule)?;
            validate::schedule(&input, now).map_err(error::command)?;
            (input.resolve(now), None)
        } else {
            Self::job_id(&r.id)?;
            let job = self
                .node
                .sm
                .get_job(&r.id)
                .ok_or_else(|| Status::not_found(format!("job {:?} not found", r.id)))?;
            (job.schedule.clone(), Some(job))
        };
        let fire_at_ms = schedule
            .preview(now, count)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let dst_notes = (fire_at_ms.iter())
            .map(|t| schedule.dst_note(*t).unwrap_or_default())
            .collect();
        let jitter = job.as_ref().and_then(|j| j.jitter);
        let offsets_ms = match (&job, jitter) {
            (Some(j), Some(_)) => fire_at_ms.iter().map(|t| j.offset_ms(*t)).collect(),
            _ => Vec::new(),
        };
        Ok(Response::new(pb::NextFiresResponse {
            fire_at_ms,
            dst_notes,
            jitter_ms: jitter.map_or(0, |j| j.ms),
            offsets_ms,
        }))
    }
}

#[tonic::async_trait]
impl pb::runs_server::Runs for Api {
    async fn list_runs(
        &self,
        req: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, Status> {
        forward!(self, req, Need::Read, RunsClient, list_runs);
        read_barrier(&self.node, &req).await?;
        let r = req.into_inner();
        Self::job_id(&r.job)?;
        let n = page_size(r.page_size)?;
        let after = (r.after_scheduled_at_ms != 0 || r.after_shard != 0)
            .then(|| RunId::shard(&r.job, r.after_scheduled_at_ms, r.after_shard));
        let mut runs = query::runs_after(&self.node.sm.view(), &r.job, after.as_ref(), n);
        // A page is also cut by bytes (results are up to 512 KiB each).
        let fits = page_prefix_within(&runs, limits::LIST_PAGE_MAX_BYTES);
        let cut = fits < runs.len();
        runs.truncate(fits);
        let next = runs
            .last()
            .filter(|_| cut || runs.len() == n)
            .map(|r| &r.id);
        Ok(Response::new(pb::ListRunsResponse {
            next_after_scheduled_at_ms: next.map_or(0, |id| id.scheduled_at_ms),
            next_after_shard: next.map_or(0, |id| id.shard),
            runs: runs.iter().map(|r| self.run_out(r)).collect(),
        }))
    }

    async fn get_run(&self, req: Request<pb::RunRef>) -> Result<Response<pb::Run>, Status> {
        forward!(self, req, Need::Read, RunsClient, get_run);
        read_barrier(&self.node, &req).await?;
        let id = req.into_inner().run_id;
        let run_id = parse_run_id(&id)?;
        let run = self
            .node
            .sm
            .get_run(&run_id)
            .ok_or_else(|| Status::not_found(format!("run {id} not found")))?;
        let mut out = self.run_out(&run);
        out.upstream_runs = (self.node.sm.run_inputs(&run_id).iter())
            .map(|(_, r)| r.to_string())
            .collect();
        Ok(Response::new(out))
    }

    async fn retry_run(&self, req: Request<pb::RunRef>) -> Result<Response<pb::Run>, Status> {
        let rid = forward!(self, req, Need::Write, RunsClient, retry_run);
        let run = parse_run_id(&req.into_inner().run_id)?;
        let cmd = Command::RetryRun {
            run,
            now_ms: write_now_ms(&self.node).await?,
        };
        match self.write(rid, cmd).await? {
            R::Run(run) => Ok(Response::new(self.run_out(&run))),
            other => Err(Status::internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn search_runs(
        &self,
        req: Request<pb::SearchRunsRequest>,
    ) -> Result<Response<pb::SearchRunsResponse>, Status> {
        forward!(self, req, Need::Read, RunsClient, search_runs);
        read_barrier(&self.node, &req).await?;
        let r = req.into_inner();
        let (filter, after, n) = search_in(&r)?;
        let page = run_search::search(
            &self.node.sm.view(),
            &filter,
            after.as_ref(),
            n,
            run_search::SCAN_MAX,
        );
        let mut runs = page.runs;
        // A page is also cut by bytes (results are up to 512 KiB each); it
        // then goes on after the last run it holds.
        let fits = page_prefix_within(&runs, limits::LIST_PAGE_MAX_BYTES);
        let next = if fits < runs.len() {
            runs.truncate(fits);
            runs.last().map(|r| r.id.clone())
        } else {
            page.next_after
        };
        Ok(Response::new(pb::SearchRunsResponse {
            runs: runs.iter().map(|r| self.run_out(r)).collect(),
            next_page_token: next.map(|id| id.to_string()).unwrap_or_default(),
        }))
    }
}

/// A search request as a filter, a cursor and a page size, each checked.
fn search_in(
    r: &pb::SearchRunsRequest,
) -> Result<(run_search::RunFilter, Option<RunId>, usize), Status> {
    let n = match r.page_size as usize {
        0 => limits::PAGE_SIZE_DEFAULT,
        n if n <= run_search::PAGE_MAX => n,
        n => {
            return Err(Status::invalid_argument(format!(
                "page_size: at most {}, got {n}",
                run_search::PAGE_MAX
            )))
        }
    };
    let job = (!r.job.is_empty()).then(|| r.job.clone());
    if let Some(job) = &job {
        validate::name("job", job, limits::ID_MAX_BYTES).map_err(error::command)?;
    }
    let group = (!r.group.is_empty()).then(|| r.group.clone());
    if let Some(group) = &group {
        validate::name("group", group, limits::GROUP_MAX_BYTES).map_err(error::command)?;
    }
    let states_max = 16;
    if r.states.len() > states_max {
        return Err(Status::invalid_argument(format!(
            "states: at most {states_max}, got {}",
            r.states.len()
        )));
    }
    let mut states = Vec::new();
    for s in &r.states {
        let name = pb::RunState::try_from(*s)
            .ok()
            .filter(|s| *s != pb::RunState::Unspecified)
            .map(|s| {
                s.as_str_name()
                    .trim_start_matches("RUN_STATE_")
                    .to_lowercase()
            });
        let core = name.as_deref().and_then(run_search::states_named);
        let core =
            core.ok_or_else(|| Status::invalid_argument(format!("states: unknown run state {s}")))?;
        states.extend_from_slice(core);
    }
    let after = match r.page_token.as_str() {
        "" => None,
        t => Some(parse_run_id(t).map_err(|_| {
            Status::invalid_argument(format!(
                "page_token: not a token from a previous page: {t:?}"
            ))
        })?),
    };
    let filter = run_search::RunFilter {
        job,
        group,
        states,
        since_ms: (r.since_ms != 0).then_some(r.since_ms),
    };
    Ok((filter, after, n))
}

/// A run id in its text form, with the job id checked as an id.
fn parse_run_id(id: &str) -> Result<RunId, Status> {
    let run = RunId::parse(id).ok_or_else(|| {
        Status::invalid_argument(format!(
            "run_id: expected <job>@<scheduled_at_ms> or <job>@<scheduled_at_ms>/s<shard>, got {id:?}"
        ))
    })?;
    validate::job_id(&run.job).map_err(|e| Status::invalid_argument(format!("run_id: {e}")))?;
    Ok(run)
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for Api {
    async fn create_token(
        &self,
        req: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let rid = forward!(self, req, Need::Admin, ClusterClient, create_token);
        let r = req.into_inner();
        let role = Role::parse(&r.role).ok_or_else(|| {
            Status::invalid_argument(format!(
                "role: one of admin, operator, reader, worker; got {:?}",
                r.role
            ))
        })?;
        let secret = new_secret();
        let token = Token {
            name: r.name,
            role,
            groups: r.groups,
            hash: hash_secret(&secret),
            created_at_ms: 0,
        };
        validate::token(&token).map_err(error::command)?;
        let now_ms = write_now_ms(&self.node).await?;
        match self
            .write(
                rid,
                Command::PutToken {
                    token,
                    first: false,
                    now_ms,
                },
            )
            .await?
        {
            R::Token(t) => Ok(Response::new(pb::CreateTokenResponse {
                token: Some(token_out(&t)),
                secret,
            })),
            other => Err(Status::internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn list_tokens(
        &self,
        req: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        forward!(self, req, Need::Admin, ClusterClient, list_tokens);
        read_barrier(&self.node, &req).await?;
        let tokens = self.node.sm.list_tokens().iter().map(token_out).collect();
        Ok(Response::new(pb::ListTokensResponse { tokens }))
    }

    async fn revoke_token(
        &self,
        req: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        let rid = forward!(self, req, Need::Admin, ClusterClient, revoke_token);
        let name = req.into_inner().name;
        validate::name("name", &name, limits::ID_MAX_BYTES).map_err(error::command)?;
        let now_ms = write_now_ms(&self.node).await?;
        match self
            .write(rid, Command::RevokeToken { name, now_ms })
            .await?
        {
            R::Deleted(revoked) => Ok(Response::new(pb::RevokeTokenResponse { revoked })),
            other => Err(Status::internal(format!("unexpected response {other:?}"))),
        }
    }

    async fn pause_firing(
        &self,
        req: Request<pb::PauseFiringRequest>,
    ) -> Result<Response<pb::FiringStatus>, Status> {
        let rid = forward!(self, req, Need::Admin, ClusterClient, pause_firing);
        let note = req.into_inner().note;
        validate::pause_note(&note).map_err(error::command)?;
        let now_ms = write_now_ms(&self.node).await?;
        self.write_firing(rid, Command::PauseFiring { note, now_ms })
            .await
    }

    async fn resume_firing(
        &self,
        req: Request<pb::ResumeFiringRequest>,
    ) -> Result<Response<pb::FiringStatus>, Status> {
        let rid = forward!(self, req, Need::Admin, ClusterClient, resume_firing);
        let now_ms = write_now_ms(&self.node).await?;
        self.write_firing(rid, Command::ResumeFiring { now_ms })
            .await
    }

    type SaveSnapshotStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::SnapshotChunk, Status>> + Send + 'static>,
    >;

    async fn save_snapshot(
        &self,
        req: Request<pb::SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        authorize(&self.node, &req, Need::Admin)?;
        let path = backup::fresh_snapshot(&self.node)
            .await
            .map_err(error::backup)?;
        // Opened now: a newer snapshot renamed over the path later does not
        // change what this stream sends.
        let file = std::fs::File::open(&path)
            .map_err(|e| Status::internal(format!("opening {}: {e}", path.display())))?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || stream_file(file, tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn restore_snapshot(
        &self,
        req: Request<tonic::Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::RestoreSnapshotResponse>, Status> {
        authorize(&self.node, &req, Need::Admin)?;
        if !self.node.is_leader() {
            return Err(error::not_leader(self.node.leader()));
        }
        let upload = self.node.sm.snapshot_file().with_extension("upload");
        let received = receive_file(req.into_inner(), &upload).await;
        let restored = match received {
            Ok(()) => backup::restore(&self.node, &upload)
                .await
                .map_err(error::backup),
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&upload);
        let r = restored?;
        Ok(Response::new(pb::RestoreSnapshotResponse {
            pairs: r.pairs,
            backup_index: r.backup_index,
        }))
    }

    async fn add_learner(
        &self,
        req: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        forward!(self, req, Need::Admin, ClusterClient, add_learner);
        let r = req.into_inner();
        let m = membership::add_learner(&self.node, r.id, &r.peer_addr).await;
        members_out(m)
    }

    async fn promote(
        &self,
        req: Request<pb::NodeRef>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        forward!(self, req, Need::Admin, ClusterClient, promote);
        members_out(membership::promote(&self.node, req.into_inner().id).await)
    }

    async fn remove_node(
        &self,
        req: Request<pb::NodeRef>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        forward!(self, req, Need::Admin, ClusterClient, remove_node);
        members_out(membership::remove(&self.node, req.into_inner().id).await)
    }

    async fn transfer_leader(
        &self,
        req: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
        forward!(self, req, Need::Admin, ClusterClient, transfer_leader);
        let to = Some(req.into_inner().id).filter(|id| *id != 0);
        let h = handover::transfer_leader(&self.node, to)
            .await
            .map_err(error::handover)?;
        Ok(Response::new(pb::TransferLeaderResponse {
            leader: h.leader,
            previous: h.previous,
            took_ms: h.took_ms.max(0) as u64,
        }))
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        authorize(&self.node, &req, Need::Read)?;
        let voters: std::collections::BTreeSet<u64> =
            self.node.voters().into_iter().map(|(id, _)| id).collect();
        let lags = self.node.replication_lags();
        let members = self.node.members();
        let offsets = self.node.clock.peer_offsets();
        let calls = members.iter().map(|(id, addr)| {
            let node = self.node.clone();
            let (id, addr) = (*id, addr.clone());
            async move {
                let s = if id == node.id {
                    Some(super::peer::local_status(&node, true).await)
                } else {
                    node.peer_status(id, &addr, true).await
                };
                if let Some(s) = &s {
                    node.learn_api_addr(id, &s.api_addr);
                }
                (id, addr, s)
            }
        });
        let results = futures::future::join_all(calls).await;
        let mut leader = 0;
        let nodes = results
            .into_iter()
            .map(|(id, peer_addr, s)| {
                let addr = self.node.api_addr(id).unwrap_or_default();
                let clock_offset_ms = offsets
                    .iter()
                    .find(|(p, _)| *p == id)
                    .map(|(_, o)| *o)
                    .unwrap_or(0);
                match s {
                    Some(s) => {
                        if s.role == "leader" {
                            leader = id;
                        }
                        pb::NodeStatus {
                            log_format_max: crate::upgrade::reads(&s),
                            id,
                            addr,
                            role: s.role,
                            applied_index: s.applied_index,
                            // A release before it hashed at `applied_index`.
                            digest_index: s.digest_index.unwrap_or(s.applied_index),
                            state_digest: s.state_digest,
                            term: s.term,
                            clock_offset_ms,
                            peer_addr,
                            voter: voters.contains(&id),
                            lag: lags.get(&id).copied().unwrap_or(0),
                            tzdata: s.tzdata,
                            refusal: s.refusal,
                        }
                    }
                    None => pb::NodeStatus {
                        id,
                        addr,
                        peer_addr,
                        voter: voters.contains(&id),
                        lag: lags.get(&id).copied().unwrap_or(0),
                        role: "unreachable".into(),
                        clock_offset_ms,
                        ..Default::default()
                    },
                }
            })
            .collect();
        if leader == 0 {
            leader = self.node.leader().map(|(id, _)| id).unwrap_or(0);
        }
        Ok(Response::new(pb::StatusResponse {
            leader,
            nodes,
            membership_changing: self.node.membership_changing(),
            firing: Some(firing_out(self.node.sm.firing_paused())),
            log_format: self.node.sm.log_format(),
        }))
    }
}

/// A new token secret: 32 random bytes, hex, with a recognisable prefix.
fn new_secret() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("kairos_{hex}")
}

fn token_out(t: &Token) -> pb::TokenInfo {
    pb::TokenInfo {
        name: t.name.clone(),
        role: t.role.as_str().to_string(),
        groups: t.groups.clone(),
        created_at_ms: t.created_at_ms,
    }
}

/// How many leading runs fit in `max_bytes` of results, errors and notes
/// (at least one, so a page always makes progress).
fn page_prefix_within(runs: &[crate::core::Run], max_bytes: usize) -> usize {
    let mut bytes = 0usize;
    let over = runs.iter().position(|r| {
        bytes = bytes.saturating_add(r.result.len() + r.error.len() + r.note.len() + 256);
        bytes > max_bytes
    });
    over.map_or(runs.len(), |i| i.max(1))
}

fn members_out(
    m: Result<membership::Members, membership::MembershipError>,
) -> Result<Response<pb::MembershipResponse>, Status> {
    let m = m.map_err(error::membership)?;
    Ok(Response::new(pb::MembershipResponse {
        voters: m.voters.into_iter().collect(),
        learners: m.learners.into_iter().collect(),
    }))
}

/// Bytes of one backup stream message.
const CHUNK_BYTES: usize = 1 << 20;
/// Largest backup file a restore accepts.
const UPLOAD_MAX_BYTES: u64 = 16 << 30;

/// Sends a file's bytes in chunks until it ends, the receiver goes away, or a read fails.
fn stream_file(
    mut file: std::fs::File,
    tx: tokio::sync::mpsc::Sender<Result<pb::SnapshotChunk, Status>>,
) {
    use std::io::Read;
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let msg = match file.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => Ok(pb::SnapshotChunk {
                data: buf[..n].to_vec(),
            }),
            Err(e) => Err(Status::internal(format!("reading the snapshot: {e}"))),
        };
        let failed = msg.is_err();
        if tx.blocking_send(msg).is_err() || failed {
            return;
        }
    }
}

/// Writes an uploaded backup to `path`, up to `UPLOAD_MAX_BYTES`.
async fn receive_file(
    mut chunks: tonic::Streaming<pb::SnapshotChunk>,
    path: &std::path::Path,
) -> Result<(), Status> {
    use tokio::io::AsyncWriteExt;
    let io = |e: std::io::Error| Status::internal(format!("writing {}: {e}", path.display()));
    let mut f = tokio::fs::File::create(path).await.map_err(io)?;
    let mut total = 0u64;
    while let Some(chunk) = chunks.message().await? {
        total += chunk.data.len() as u64;
        if total > UPLOAD_MAX_BYTES {
            return Err(Status::resource_exhausted(format!(
                "backup file: larger than {UPLOAD_MAX_BYTES} bytes"
            )));
        }
        f.write_all(&chunk.data).await.map_err(io)?;
    }
    f.sync_all().await.map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Run, RunState};

    fn run_with_result(bytes: usize) -> Run {
        Run {
            id: RunId::new("j", 1),
            group: "g".into(),
            priority: 5,
            fired_at_ms: 0,
            state: RunState::Succeeded,
            attempt: 1,
            worker: String::new(),
            received_at_ms: 0,
            finished_at_ms: 0,
            result: vec![b'x'; bytes],
            error: String::new(),
            note: String::new(),
            retry_at_ms: None,
            shard_count: 1,
            offset_ms: 0,
        }
    }

    #[test]
    fn a_page_is_cut_by_bytes_but_always_holds_one_run() {
        let runs: Vec<Run> = (0..10).map(|_| run_with_result(500 * 1024)).collect();
        let fit = page_prefix_within(&runs, limits::LIST_PAGE_MAX_BYTES);
        assert_eq!(fit, 8, "8 results of 500 KiB fit in 4 MiB, 9 do not");
        assert_eq!(
            page_prefix_within(&runs[..3], limits::LIST_PAGE_MAX_BYTES),
            3
        );
        assert_eq!(page_prefix_within(&[run_with_result(8 << 20)], 1024), 1);
        assert_eq!(page_prefix_within(&[], 1024), 0);
    }
}
