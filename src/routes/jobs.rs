//! Bulk jobs and erasure: `POST /v1/sources/{source}/jobs` starts a
//! redelivery or an erasure of every event a filter matches (or, with
//! `dry_run`, counts them), `GET /v1/jobs[/{id}]` shows progress,
//! `POST /v1/jobs/{id}/cancel` stops one, and
//! `DELETE /v1/sources/{source}/events/{event_id}` erases one event.

use actix_web::http::Method;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::body::read_json;
use super::count::{CountView, FilterQuery, count_in, invalid};
use super::sources::known_source;
use super::{AppState, Endpoint, Guard, path_segment, register};
use crate::clock::Millis;
use crate::domain::CreatedAt;
use crate::error::{ApiError, Problem};
use crate::gateway::filter::EventFilter;
use crate::gateway::jobs::{self, Job, JobKind, JobState, StartError};
use crate::store::inbox::{EraseOutcome, EventStatus};

/// The job and erase routes, relative to `/v1`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::POST, "/sources/{source}/jobs", || {
            web::route().to(start)
        }),
        Endpoint::new(Method::GET, "/jobs", || web::route().to(list)),
        Endpoint::new(Method::GET, "/jobs/{job}", || web::route().to(show)),
        Endpoint::new(Method::POST, "/jobs/{job}/cancel", || {
            web::route().to(cancel)
        }),
    ]
}

/// Registers the routes (in the `/v1` scope, behind its tokens). The
/// erase route ([`erase`]) is registered with the event's other methods,
/// in `event`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

/// A job to start.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    /// What to do to each match.
    kind: JobKind,
    /// Which events: the count's parameters.
    filter: FilterQuery,
    /// Count instead (the answer is the count's), start nothing.
    #[serde(default)]
    dry_run: bool,
}

/// A job's progress.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    /// `job_` and 16 hex digits; the `dedupd-replay` header of its
    /// deliveries.
    id: String,
    /// The source (or, with a `destination`, its lane).
    source: String,
    /// The lanes it reads: the source's own, and each destination's.
    lanes: Vec<String>,
    kind: JobKind,
    state: JobState,
    /// The filter, as it was posted; once the job ended, its texts
    /// (stream, body field value, error text) are dropped.
    filter: FilterView,
    /// Unix ms.
    created_ms: Millis,
    /// Unix ms, once done or cancelled.
    finished_ms: Option<Millis>,
    /// Marked cancelled (it ends once what it queued settled).
    cancelled: bool,
    /// Events read so far.
    scanned: u64,
    /// Events matched and taken on.
    matched: u64,
    /// Redeliver: queued now, not settled yet (at most half the source's
    /// `max_in_flight`).
    queued: u64,
    /// Redeliver: acknowledged by the destination.
    delivered: u64,
    /// Redeliver: dead (or stale) after the replay.
    failed: u64,
    /// Erase: erased.
    erased: u64,
    /// No longer there or no longer eligible when the job came to them.
    skipped: u64,
    /// Why it stopped early, if it did.
    error: Option<String>,
}

/// A job's filter, in the shape it is posted in.
#[derive(Debug, Serialize, ToSchema)]
pub struct FilterView {
    status: EventStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    received_from: Option<Millis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    received_to: Option<Millis>,
    /// RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    created_from: Option<String>,
    /// RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    created_to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<String>,
    /// A body field, as a JSON pointer.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_contains: Option<String>,
}

impl From<EventFilter> for FilterView {
    fn from(f: EventFilter) -> Self {
        let (field, value) = f.field.unzip();
        Self {
            status: f.status,
            received_from: f.received_from,
            received_to: f.received_to,
            created_from: f.created_from.map(CreatedAt::to_rfc3339),
            created_to: f.created_to.map(CreatedAt::to_rfc3339),
            stream: f.stream,
            field,
            value,
            error_contains: f.error_contains,
        }
    }
}

impl From<Job> for JobView {
    fn from(j: Job) -> Self {
        Self {
            lanes: j.lanes(),
            filter: FilterView::from(j.filter),
            queued: j.window.len() as u64,
            id: j.id,
            source: j.source,
            kind: j.kind,
            state: j.state,
            created_ms: j.created_ms,
            finished_ms: j.finished_ms,
            cancelled: j.cancelled,
            scanned: j.scanned,
            matched: j.matched,
            delivered: j.delivered,
            failed: j.failed,
            erased: j.erased,
            skipped: j.skipped,
            error: j.error,
        }
    }
}

/// The job list.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobList {
    /// Newest first; the last 100 are kept.
    jobs: Vec<JobView>,
}

/// An erased event.
#[derive(Debug, Serialize, ToSchema)]
pub struct Erased {
    source: String,
    event_id: String,
    /// Always `erased`.
    status: EventStatus,
}

/// Starts a bulk redelivery or erasure of the events a filter matches.
/// Run the same filter with `dry_run` (or `GET …/count`) first.
#[utoipa::path(post, path = "/v1/sources/{source}/jobs", operation_id = "startJob", tag = "gateway",
    security(("bearer" = [])),
    params(("source" = String, Path, description = "A source name")),
    request_body = StartBody,
    responses(
        (status = 201, description = "Started", body = JobView),
        (status = 200, description = "`dry_run`: what it would touch", body = CountView),
        (status = 400, description = "The body or filter is wrong (`invalid_status` names the statuses a kind takes)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown_source`", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`too_many_jobs`: 8 run already", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be read or written now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn start(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let source = path_segment(&req, 3, "source")?;
    known_source(&state, &source).await?;
    let body: StartBody =
        read_json(&req, payload, state.max_body_bytes, state.body_timeout).await?;
    let filter = body.filter.filter()?;
    if body.filter.after.is_some() && !body.dry_run {
        return Err(invalid(
            "invalid_filter",
            "after",
            "a job reads every event its filter matches: `after` goes on from a count's cursor, \
             and only a dry run takes it",
        ));
    }
    let scope = body.filter.scope(&state, &source).await?;
    if body.kind == JobKind::Redeliver {
        super::sources::delivers(&state, &scope.name)?;
    }
    let takes: &[EventStatus] = match body.kind {
        JobKind::Redeliver => &[
            EventStatus::Delivered,
            EventStatus::Dead,
            EventStatus::Stale,
        ],
        JobKind::Erase => &[
            EventStatus::Pending,
            EventStatus::Delivered,
            EventStatus::Dead,
            EventStatus::Stale,
            EventStatus::Filtered,
        ],
    };
    if !takes.contains(&filter.status) {
        return Err(invalid(
            "invalid_status",
            "status",
            match body.kind {
                JobKind::Redeliver => "a redeliver job takes delivered, dead or stale events",
                JobKind::Erase => {
                    "an erase job takes pending, delivered, dead, stale or filtered events"
                }
            },
        ));
    }
    let inbox = state.gateway.inbox.as_ref();
    if body.dry_run {
        return Ok(HttpResponse::Ok().json(count_in(&state, scope, filter).await?));
    }
    if state.gateway.source(&source).is_none() {
        return Err(ApiError::Refused {
            code: "source_not_configured",
            detail: format!(
                "source {source:?} is no longer configured: its events can be listed, not redelivered or erased in bulk"
            ),
        });
    }
    let now = state.clock.now_ms();
    let mut job = Job::new(&scope.name, body.kind, filter, now);
    job.lanes = scope.lanes;
    match jobs::start(inbox, &job, now).await {
        Ok(()) => {}
        Err(StartError::Store(e)) => return Err(e.into()),
        Err(e @ StartError::TooMany) => {
            return Err(ApiError::Refused {
                code: "too_many_jobs",
                detail: e.to_string(),
            });
        }
    }
    state.gateway.jobs_wake.notify_one();
    tracing::info!(job = %job.id, source = %source, kind = ?job.kind, "job started");
    Ok(HttpResponse::Created().json(JobView::from(job)))
}

/// Every job kept (the last 100), newest first.
#[utoipa::path(get, path = "/v1/jobs", operation_id = "listJobs", tag = "gateway",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The jobs", body = JobList),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be read now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let jobs = jobs::list(state.gateway.inbox.as_ref()).await?;
    Ok(HttpResponse::Ok().json(JobList {
        jobs: jobs.into_iter().map(JobView::from).collect(),
    }))
}

async fn found(state: &AppState, id: &str) -> Result<Job, ApiError> {
    jobs::get(state.gateway.inbox.as_ref(), id)
        .await?
        .ok_or_else(|| ApiError::NotFound {
            code: "unknown_job",
            detail: format!("no job {id:?} (the last 100 are kept)"),
        })
}

/// One job's progress.
#[utoipa::path(get, path = "/v1/jobs/{job}", operation_id = "getJob", tag = "gateway",
    security(("bearer" = [])),
    params(("job" = String, Path, description = "The job's id")),
    responses(
        (status = 200, description = "The job", body = JobView),
        (status = 404, description = "`unknown_job`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be read now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn show(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let id = path_segment(&req, 3, "job")?;
    Ok(HttpResponse::Ok().json(JobView::from(found(&state, &id).await?)))
}

/// Cancels a job: it queues nothing more, and ends once what it queued
/// (at most half the source's slots) settled.
#[utoipa::path(post, path = "/v1/jobs/{job}/cancel", operation_id = "cancelJob", tag = "gateway",
    security(("bearer" = [])),
    params(("job" = String, Path, description = "The job's id")),
    responses(
        (status = 202, description = "Cancelled (or finished already: see `state`)", body = JobView),
        (status = 404, description = "`unknown_job`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be written now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn cancel(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let id = path_segment(&req, 3, "job")?;
    let mut job = found(&state, &id).await?;
    if job.state == JobState::Running {
        let now = state.clock.now_ms();
        if !state.gateway.inbox.cancel_job(&id, now).await? {
            return Err(ApiError::NotFound {
                code: "unknown_job",
                detail: format!("no job {id:?} (the last 100 are kept)"),
            });
        }
        job.cancelled = true;
        state.gateway.jobs_wake.notify_one();
        tracing::info!(job = %id, "job cancelled");
    }
    Ok(HttpResponse::Accepted().json(JobView::from(job)))
}

/// Erases one event: its body and stored headers are deleted; it stays
/// listed as `erased` until the source's dead retention, and its id stays
/// a duplicate, so a late retry of it is not taken again. A pending event
/// is never delivered.
#[utoipa::path(delete, path = "/v1/sources/{source}/events/{event_id}", operation_id = "eraseEvent", tag = "gateway",
    security(("bearer" = [])),
    params(
        ("source" = String, Path, description = "A source name"),
        ("event_id" = String, Path, description = "The provider's event id"),
    ),
    responses(
        (status = 200, description = "Erased (or erased before)", body = Erased),
        (status = 404, description = "`unknown_source` or `unknown_event`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be written now; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn erase(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let source = path_segment(&req, 3, "source")?;
    let event_id = path_segment(&req, 5, "event_id")?;
    known_source(&state, &source).await?;
    let retention = state
        .gateway
        .source(&source)
        .map_or(state.gateway.retention, |s| {
            s.retention(state.gateway.retention)
        })
        .dead_ms;
    let now = state.clock.now_ms();
    // Every destination's copy of it.
    match state
        .gateway
        .erase_everywhere(
            &state.gateway.lanes_to_erase(&source).await?,
            &event_id,
            retention,
            now,
        )
        .await?
    {
        EraseOutcome::Erased | EraseOutcome::AlreadyErased => {
            tracing::info!(source = %source, event_id = %event_id, "event erased");
            // A pending event the dispatcher leased ahead (its body in
            // memory) must not go out: what it holds ahead goes back.
            state.gateway.arrivals.push_unknown();
            // A pending event left its stream: the next one may run.
            state.gateway.wake.notify_one();
            Ok(HttpResponse::Ok().json(Erased {
                source,
                event_id,
                status: EventStatus::Erased,
            }))
        }
        EraseOutcome::NotFound => Err(ApiError::NotFound {
            code: "unknown_event",
            detail: format!(
                "source {source:?} has no event {event_id:?} (it may have been reaped)"
            ),
        }),
    }
}
