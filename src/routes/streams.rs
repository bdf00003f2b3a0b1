//! `/v1/streams/{stream}`: apply events in order, read the head.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use super::body::read_json;
use super::{AppState, method_not_allowed, path_segment};
use crate::domain::{CreatedAt, Key, ScopedKey};
use crate::error::ApiError;
use crate::store::{ApplyOutcome, Head};

/// Registers the stream routes.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/streams/{stream}")
            .route(web::get().to(get_head))
            .default_service(method_not_allowed("GET")),
    )
    .service(
        web::resource("/streams/{stream}/apply")
            .route(web::post().to(apply))
            .default_service(method_not_allowed("POST")),
    );
}

/// Body of apply.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyBody {
    /// The event's unique id.
    event_id: String,
    /// The event's RFC 3339 timestamp.
    created_at: String,
}

/// A head as the API shows it.
#[derive(Debug, Serialize)]
pub struct HeadView {
    /// Id of the newest applied event.
    pub event_id: String,
    /// Its `created_at`, RFC 3339 in UTC.
    pub created_at: String,
}

impl From<&Head> for HeadView {
    fn from(h: &Head) -> Self {
        Self {
            event_id: h.event_id.key_part().to_owned(),
            created_at: h.created_at.to_rfc3339(),
        }
    }
}

#[derive(Debug, Serialize)]
struct Applied<'a> {
    stream: &'a str,
    outcome: ApplyOutcome,
    head: Option<HeadView>,
}

async fn apply(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let stream = Key::parse(&path_segment(&req, 3, "stream")?, "stream")?;
    let body: ApplyBody = read_json(&req, payload, state.max_body_bytes).await?;
    let event_id = Key::parse(&body.event_id, "event_id")?;
    let created_at = CreatedAt::parse(&body.created_at, "created_at")?;
    let now = state.clock.now_ms();
    let result = state
        .store
        .apply(
            &ScopedKey::api(&stream),
            &ScopedKey::api(&event_id),
            created_at,
            state.retention_ms,
            now,
        )
        .await?;
    state.metrics.apply(match result.outcome {
        ApplyOutcome::Applied => "applied",
        ApplyOutcome::Stale => "stale",
        ApplyOutcome::Duplicate => "duplicate",
    });
    Ok(HttpResponse::Ok().json(Applied {
        stream: stream.as_str(),
        outcome: result.outcome,
        head: result.head.as_ref().map(HeadView::from),
    }))
}

async fn get_head(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let stream = Key::parse(&path_segment(&req, 3, "stream")?, "stream")?;
    let now = state.clock.now_ms();
    match state.store.head(&ScopedKey::api(&stream), now).await? {
        Some(head) => Ok(HttpResponse::Ok().json(serde_json::json!({
            "stream": stream.as_str(),
            "head": HeadView::from(&head),
        }))),
        None => Err(ApiError::NotFound {
            code: "not_found",
            detail: "no event has been applied to this stream (or its retention passed)".into(),
        }),
    }
}
