//! The console's JSON handlers. Each calls the gRPC service methods (same
//! auth, validation, read barrier and leader forwarding) and converts the
//! answer with `json`. Limits: pages of at most `PAGE_SIZE_MAX` rows; a
//! job's newest runs are picked from at most `RUNS_SCAN_MAX` records.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kairos_proto::v1::{self as pb, cluster_server::Cluster, jobs_server::Jobs, runs_server::Runs};

use super::json::{self as j, obj, Json};
use super::{json_body, service, ApiError, Caller, Params, TOKEN_COOKIE};
use crate::grpc::auth::{authorize, Need};
use crate::node::Node;

/// Most rows in one console page.
pub const PAGE_SIZE_MAX: i64 = 500;
/// Most run records one run query looks at.
pub const RUNS_SCAN_MAX: usize = 10_000;
/// Most recent runs shown on a job page.
pub const RECENT_RUNS_MAX: i64 = 100;
/// Rows asked of the gRPC API per internal page.
const SCAN_PAGE: u32 = 1000;
/// Longest token accepted by the login form.
const TOKEN_MAX_BYTES: usize = 512;

type Answer = Result<Response, ApiError>;

/// Checks a token (reader or above, sent form-encoded as `token=...`) and
/// keeps it in an HttpOnly cookie.
pub async fn login(State(node): State<Arc<Node>>, body: String) -> Answer {
    let form = Params::parse(Some(&body))?;
    let token = form.text("token");
    if token.is_empty() || token.len() > TOKEN_MAX_BYTES {
        return Err(ApiError::field(
            "token",
            format!("1 to {TOKEN_MAX_BYTES} bytes"),
        ));
    }
    if !token
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b";,\"\\".contains(&b))
    {
        return Err(ApiError::field(
            "token",
            "printable ASCII without ; , \" \\",
        ));
    }
    let caller = Caller {
        token: Some(token.to_string()),
        request_id: None,
    };
    authorize(&node, &caller.request(())?, Need::Read)?;
    let cookie = format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
    let body = json_body(&obj([("auth", node.auth_required.into())]));
    Ok(([(header::SET_COOKIE, cookie)], body).into_response())
}

pub async fn logout() -> Response {
    let cookie = format!("{TOKEN_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], json_body(&obj([]))).into_response()
}

pub async fn cluster(State(node): State<Arc<Node>>, headers: HeaderMap) -> Answer {
    let caller = Caller::from_headers(&headers);
    let s = service(&node)
        .status(caller.request(pb::StatusRequest {})?)
        .await?;
    let v = j::status(s.get_ref())
        .with("auth", node.auth_required)
        .with("answered_by", node.id);
    Ok(json_body(&v))
}

fn page_size(p: &Params) -> Result<usize, ApiError> {
    Ok(p.number("page_size", 1, PAGE_SIZE_MAX, 50)? as usize)
}

/// Jobs in id order, filtered by `ListJobs` itself: id `prefix`, `group`,
/// label `selector` (`k=v,...`) and `state` (active | paused | finished).
/// A page may hold fewer than `page_size` jobs with a `next_page_token`.
pub async fn jobs(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Answer {
    let p = Params::parse(q.as_deref())?;
    let req = pb::ListJobsRequest {
        page_size: page_size(&p)? as u32,
        page_token: p.text("page_token").to_string(),
        group: p.text("group").to_string(),
        selector: p.text("selector").to_string(),
        state: p.text("state").to_string(),
        id_prefix: p.text("prefix").to_string(),
    };
    let caller = Caller::from_headers(&headers);
    let page = service(&node)
        .list_jobs(caller.request(req)?)
        .await?
        .into_inner();
    Ok(json_body(&obj([
        ("jobs", Json::Arr(page.jobs.iter().map(j::job).collect())),
        ("next_page_token", page.next_page_token.into()),
    ])))
}

/// One job: its spec, its next fires and its statistics.
pub async fn job(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let (api, caller) = (service(&node), Caller::from_headers(&headers));
    let job = api
        .get_job(caller.request(pb::JobRef { id: id.clone() })?)
        .await?;
    let stats = api
        .job_stats(caller.request(pb::JobRef { id: id.clone() })?)
        .await?;
    let next = pb::NextFiresRequest {
        id,
        schedule: None,
        count: 5,
    };
    // A job with nothing ahead (a fired one-shot) still has a page.
    let next_fires = match api.next_fires(caller.request(next)?).await {
        Ok(r) => r.into_inner().fire_at_ms,
        Err(_) => Vec::new(),
    };
    Ok(json_body(&obj([
        ("job", j::job(job.get_ref())),
        ("stats", j::stats(stats.get_ref())),
        ("next_fires", next_fires.into()),
    ])))
}

/// The newest `count` runs of a job scheduled at or after `since_ms`, newest first.
pub async fn job_runs(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Answer {
    let p = Params::parse(q.as_deref())?;
    let count = p.number("count", 1, RECENT_RUNS_MAX, 20)? as usize;
    let since_ms = p.number("since_ms", 0, i64::MAX, 0)?;
    let (api, caller) = (service(&node), Caller::from_headers(&headers));
    let mut after = since_after(since_ms);
    let (mut recent, mut scanned) = (std::collections::VecDeque::new(), 0);
    loop {
        let req = pb::ListRunsRequest {
            job: id.clone(),
            page_size: SCAN_PAGE,
            after_scheduled_at_ms: after.0,
            after_shard: after.1,
        };
        let page = api.list_runs(caller.request(req)?).await?.into_inner();
        scanned += page.runs.len();
        for r in page.runs {
            if recent.len() == count {
                recent.pop_front();
            }
            recent.push_back(r);
        }
        after = (page.next_after_scheduled_at_ms, page.next_after_shard);
        if after == (0, 0) || scanned >= RUNS_SCAN_MAX {
            break;
        }
    }
    let runs = recent.iter().rev().map(j::run).collect();
    Ok(json_body(&obj([
        ("runs", Json::Arr(runs)),
        ("scanned", scanned.into()),
        ("truncated", (after != (0, 0)).into()),
    ])))
}

/// The ListRuns cursor that starts at `since_ms` (0: from the first run).
fn since_after(since_ms: i64) -> (i64, u32) {
    match since_ms {
        0 => (0, 0),
        s => (s - 1, u32::MAX),
    }
}

/// `pause`, `resume`, `trigger` or `delete` a job.
pub async fn job_action(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Answer {
    let p = Params::parse(q.as_deref())?;
    let (api, caller) = (service(&node), Caller::from_headers(&headers));
    let job = || caller.request(pb::JobRef { id: id.clone() });
    let v = match action.as_str() {
        "pause" => {
            let note = p.text("note").to_string();
            let r = caller.request(pb::PauseJobRequest {
                id: id.clone(),
                note,
            })?;
            obj([("job", j::job(api.pause_job(r).await?.get_ref()))])
        }
        "resume" => obj([("job", j::job(api.resume_job(job()?).await?.get_ref()))]),
        "trigger" => obj([("run", j::run(api.trigger_job(job()?).await?.get_ref()))]),
        "delete" => obj([(
            "deleted",
            api.delete_job(job()?).await?.get_ref().deleted.into(),
        )]),
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("action: one of pause, resume, trigger, delete; got {other:?}"),
            ))
        }
    };
    Ok(json_body(&v))
}

pub async fn retry_run(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Answer {
    let p = Params::parse(q.as_deref())?;
    let run_id = p.text("run_id").to_string();
    let caller = Caller::from_headers(&headers);
    let run = service(&node)
        .retry_run(caller.request(pb::RunRef { run_id })?)
        .await?;
    Ok(json_body(&obj([("run", j::run(run.get_ref()))])))
}

/// Runs across jobs: `SearchRuns` with one `state` (all if empty), a
/// `group`, a `job` and `since_ms` (finished then or later, or still active
/// and fired then or later).
pub async fn runs(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Answer {
    let p = Params::parse(q.as_deref())?;
    let states = match p.text("state") {
        "" | "all" => Vec::new(),
        s => {
            let state =
                pb::RunState::from_str_name(&format!("RUN_STATE_{}", s.to_ascii_uppercase()))
                    .filter(|st| *st != pb::RunState::Unspecified)
                    .ok_or_else(|| {
                        ApiError::field(
                            "state",
                            format!("one of all, {}; got {s:?}", RUN_STATES.join(", ")),
                        )
                    })?;
            vec![state as i32]
        }
    };
    let req = pb::SearchRunsRequest {
        job: p.text("job").to_string(),
        group: p.text("group").to_string(),
        states,
        since_ms: p.number("since_ms", 0, i64::MAX, 0)?,
        page_size: page_size(&p)? as u32,
        page_token: p.text("page_token").to_string(),
    };
    let caller = Caller::from_headers(&headers);
    let page = service(&node)
        .search_runs(caller.request(req)?)
        .await?
        .into_inner();
    Ok(json_body(&obj([
        ("runs", Json::Arr(page.runs.iter().map(j::run).collect())),
        ("next_page_token", page.next_page_token.into()),
    ])))
}

/// Run states a run query may ask for.
const RUN_STATES: [&str; 7] = [
    "pending",
    "running",
    "succeeded",
    "failed",
    "timed_out",
    "skipped",
    "cancelled",
];
