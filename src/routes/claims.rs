//! `/v1/claims/{key}`: claim, done, extend, release, inspect.

use actix_web::http::Method;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::body::read_json;
use super::{AppState, Endpoint, below, path_segment};
use crate::clock::Millis;
use crate::domain::{ClaimResult, Fingerprint, Key, ScopedKey, Token};
use crate::error::{ApiError, Problem};
use crate::store::{ClaimOutcome, ClaimState, DoneOutcome, ExtendOutcome, ReleaseOutcome};
use crate::telemetry::{RouteName, traces};

/// Registers the claim routes: `/claims/{key}` (POST claim, GET or HEAD
/// inspect, DELETE release), `/claims/{key}/done` and `/claims/{key}/extend` (POST).
///
/// The hottest routes of the service are dispatched here by hand under a
/// static prefix: actix matches `{key}` patterns with a regex engine, which
/// cost about a tenth of a request's CPU in a profile of the claims path.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::scope("/claims").default_service(web::to(dispatch)));
}

/// The claims routes, all dispatched by hand in [`dispatch`].
pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::by_hand(Method::POST, KEY),
        Endpoint::by_hand(Method::GET, KEY),
        Endpoint::by_hand(Method::DELETE, KEY),
        Endpoint::by_hand(Method::POST, DONE),
        Endpoint::by_hand(Method::POST, EXTEND),
    ]
}

/// A done's body limit above `claims.max_result_bytes`: its token, TTL
/// and field names, with room to spare.
const DONE_BODY_ROOM: usize = 4096;

/// The patterns, relative to `/v1`.
const KEY: &str = "/claims/{key}";
const DONE: &str = "/claims/{key}/done";
const EXTEND: &str = "/claims/{key}/extend";

/// Routes `/claims/...`; with traces on, each request is a span.
async fn dispatch(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    super::traced(req, "/v1/claims/", span_name, |req| {
        route(state, req, payload)
    })
    .await
}

/// A claims request's span name.
fn span_name(segments: usize, action: Option<&str>, method: &Method) -> &'static str {
    match (segments, action) {
        (1, _) if method == Method::POST => "claim",
        (1, _) if method == Method::DELETE => "release",
        (2, Some("done")) => "done",
        (2, Some("extend")) => "extend",
        _ => "inspect",
    }
}

/// Routes `/claims/...` by its segments and method.
async fn route(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    // An empty key is no resource (404), as with the `{key}` pattern.
    let (segments, action) = below(&req, "/v1/claims/");
    let method = req.method();
    let route = match (segments, action) {
        (2, Some("done")) => "/v1/claims/{key}/done",
        (2, Some("extend")) => "/v1/claims/{key}/extend",
        (1, _) => "/v1/claims/{key}",
        _ => "unmatched",
    };
    req.extensions_mut().insert(RouteName(route));
    match (segments, action) {
        (1, _) if method == Method::POST => claim(state, req, payload).await,
        // `HEAD` as `GET`: actix drops the body of a `HEAD` answer.
        (1, _) if method == Method::GET || method == Method::HEAD => inspect(state, req).await,
        (1, _) if method == Method::DELETE => release(state, req, payload).await,
        (1, _) => super::not_allowed(&req, "GET, HEAD, POST, DELETE"),
        (2, Some("done")) if method == Method::POST => done(state, req, payload).await,
        (2, Some("extend")) if method == Method::POST => extend(state, req, payload).await,
        (2, Some("done" | "extend")) => super::not_allowed(&req, "POST"),
        _ => super::not_found(req).await,
    }
}

/// Body of a claim; every field optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    /// TTL of the claim; the configured default when absent.
    ttl_ms: Option<u64>,
    /// Digest of the payload.
    fingerprint: Option<String>,
}

/// Body of done.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DoneBody {
    /// The owner token from the claim.
    token: String,
    /// How long the done record lives; the configured default when absent.
    ttl_ms: Option<u64>,
    /// What the work returned, any JSON value (`null`: none): kept with the
    /// done record as sent, and returned by a read of the key and in the
    /// `409 done` a later claim gets. At most `claims.max_result_bytes` of
    /// JSON text (default 64 KiB; larger: 413 `result_too_large`, nothing
    /// changed). A repeated done keeps the first done's result.
    #[schema(value_type = Option<serde_json::Value>)]
    result: Option<Box<RawValue>>,
}

/// Body of extend.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenTtlBody {
    /// The owner token from the claim.
    token: String,
    /// New TTL; the configured default when absent.
    ttl_ms: Option<u64>,
}

/// Body of release.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// The owner token from the claim.
    token: String,
}

/// A new claim: the token is shown once, here.
#[derive(Debug, Serialize, ToSchema)]
pub struct Claimed<'a> {
    /// The key as given.
    key: &'a str,
    /// Always `processing`.
    state: ClaimState,
    /// The owner token (32 hex digits) that done, extend and release need.
    token: String,
    /// Grows with every claim of any key: pass it to downstream writes to
    /// refuse a slower, older owner's.
    fence: u64,
    /// When the claim lapses unless extended or done, Unix ms.
    expires_at_ms: Millis,
}

/// A key's state.
#[derive(Debug, Serialize, ToSchema)]
pub struct StateAnswer<'a> {
    /// The key as given.
    key: &'a str,
    /// `processing` or `done`.
    state: ClaimState,
    /// The fence of the claim that holds the key (inspect only).
    #[serde(skip_serializing_if = "Option::is_none")]
    fence: Option<u64>,
    /// When this state lapses, Unix ms.
    expires_at_ms: Millis,
    /// The result the done record keeps (inspect of a done key that keeps
    /// one).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    result: Option<&'a RawValue>,
}

fn parse_key(req: &HttpRequest) -> Result<(Key, ScopedKey), ApiError> {
    let key = Key::parse(&path_segment(req, 3, "key")?, "key")?;
    traces::note_key(key.as_str());
    let scoped = ScopedKey::api(&key);
    Ok((key, scoped))
}

fn busy(expires_at_ms: Millis) -> ApiError {
    ApiError::Conflict {
        code: "busy",
        detail: "another worker holds this key".into(),
        state: ClaimState::Processing,
        expires_at_ms,
        result: None,
    }
}

fn already_done(expires_at_ms: Millis, result: Option<ClaimResult>) -> ApiError {
    ApiError::Conflict {
        code: "done",
        detail: "the work for this key is done".into(),
        state: ClaimState::Done,
        expires_at_ms,
        result,
    }
}

fn not_owner(state: ClaimState, expires_at_ms: Millis) -> ApiError {
    ApiError::Conflict {
        code: "not_owner",
        detail: "the token does not own this key".into(),
        state,
        expires_at_ms,
        result: None,
    }
}

/// Claims a key for processing: the first caller gets the token.
#[utoipa::path(post, path = "/v1/claims/{key}", operation_id = "claimKey", tag = "claims",
    security(("bearer" = [])),
    params(("key" = String, Path, description = "The idempotency key, 1 to 512 bytes of UTF-8 (percent-encode `/`, `%`, spaces)")),
    request_body(content = ClaimBody, content_type = "application/json",
        description = "Optional; an empty body takes the default TTL"),
    responses(
        (status = 201, description = "Claimed: do the work, then done (or release)", body = Claimed),
        (status = 409, description = "`busy` (another worker holds it) or `done` (already processed; the problem carries the `result` the done kept, if any)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`fingerprint_mismatch`: the key was claimed with another payload digest", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid key, token, TTL or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be reached or written; retry", body = Problem, content_type = "application/problem+json"),
        (status = 507, description = "`insufficient_storage` (the disk is at `storage.min_free_bytes`) or `keys_in_memory_full` (the keys held in memory are at `storage.max_key_memory_bytes`): nothing was changed; retry after `Retry-After`", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn claim(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (key, scoped) = parse_key(&req)?;
    let body: ClaimBody =
        read_json(&req, payload, state.max_body_bytes, state.body_timeout).await?;
    let ttl = state.ttl.parse(body.ttl_ms, state.ttl.default_claim)?;
    let fingerprint = body
        .fingerprint
        .as_deref()
        .map(Fingerprint::parse)
        .transpose()?;
    let now = state.clock.now_ms();
    let outcome = state.store.claim(&scoped, ttl, fingerprint, now).await?;
    let named = match outcome {
        ClaimOutcome::Claimed { .. } => "claimed",
        ClaimOutcome::Busy { .. } => "busy",
        ClaimOutcome::Done { .. } => "done",
        ClaimOutcome::FingerprintMismatch { .. } => "fingerprint_mismatch",
    };
    state.metrics.claim(named);
    traces::outcome(named);
    if let ClaimOutcome::Claimed { fence, .. } = &outcome {
        traces::note_fence(*fence);
    }
    match outcome {
        ClaimOutcome::Claimed {
            token,
            fence,
            expires_at_ms,
        } => Ok(HttpResponse::Created().json(Claimed {
            key: key.as_str(),
            state: ClaimState::Processing,
            token: token.to_hex(),
            fence,
            expires_at_ms,
        })),
        ClaimOutcome::Busy { expires_at_ms } => Err(busy(expires_at_ms)),
        ClaimOutcome::Done {
            expires_at_ms,
            result,
        } => Err(already_done(expires_at_ms, result)),
        ClaimOutcome::FingerprintMismatch {
            state,
            expires_at_ms,
        } => Err(ApiError::FingerprintMismatch {
            state,
            expires_at_ms,
        }),
    }
}

/// Marks the owner's claim done: repeats of the key are refused for the
/// TTL.
#[utoipa::path(post, path = "/v1/claims/{key}/done", operation_id = "markDone", tag = "claims",
    security(("bearer" = [])),
    params(("key" = String, Path, description = "The idempotency key, 1 to 512 bytes of UTF-8 (percent-encode `/`, `%`, spaces)")),
    request_body(content = DoneBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Done", body = StateAnswer),
        (status = 413, description = "`result_too_large`: the result is over `claims.max_result_bytes` (nothing was changed); or `body_too_large`", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not_owner`: the token does not hold this key", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid key, token, TTL or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be reached or written; retry", body = Problem, content_type = "application/problem+json"),
        (status = 507, description = "`insufficient_storage` (the disk is at `storage.min_free_bytes`) or `keys_in_memory_full` (a done of a key never claimed, while the keys held in memory are at `storage.max_key_memory_bytes`): nothing was changed; retry after `Retry-After`", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn done(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (key, scoped) = parse_key(&req)?;
    // Room for a result as large as `claims.max_result_bytes` allows, and
    // the token and TTL around it.
    let limit = state
        .max_body_bytes
        .max(state.max_result_bytes.saturating_add(DONE_BODY_ROOM));
    let body: DoneBody = read_json(&req, payload, limit, state.body_timeout).await?;
    let token = Token::parse(&body.token)?;
    let ttl = state.ttl.parse(body.ttl_ms, state.ttl.default_done)?;
    let result = body
        .result
        .as_deref()
        .map(|r| ClaimResult::parse(r, state.max_result_bytes))
        .transpose()?
        .flatten();
    let now = state.clock.now_ms();
    let outcome = state
        .store
        .done_with(&scoped, token, ttl, result, now)
        .await?;
    let named = match outcome {
        DoneOutcome::Done { .. } => "done",
        DoneOutcome::NotOwner { .. } => "not_owner",
    };
    state.metrics.claim_op("done", named);
    traces::outcome(named);
    match outcome {
        DoneOutcome::Done { expires_at_ms } => Ok(HttpResponse::Ok().json(StateAnswer {
            key: key.as_str(),
            state: ClaimState::Done,
            fence: None,
            expires_at_ms,
            result: None,
        })),
        DoneOutcome::NotOwner {
            state,
            expires_at_ms,
        } => Err(not_owner(state, expires_at_ms)),
    }
}

/// Extends the owner's claim.
#[utoipa::path(post, path = "/v1/claims/{key}/extend", operation_id = "extendClaim", tag = "claims",
    security(("bearer" = [])),
    params(("key" = String, Path, description = "The idempotency key, 1 to 512 bytes of UTF-8 (percent-encode `/`, `%`, spaces)")),
    request_body(content = TokenTtlBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Extended", body = StateAnswer),
        (status = 404, description = "`lost`: the claim expired; claim again", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not_owner` or `done`", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid key, token, TTL or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be reached or written; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn extend(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (key, scoped) = parse_key(&req)?;
    let body: TokenTtlBody =
        read_json(&req, payload, state.max_body_bytes, state.body_timeout).await?;
    let token = Token::parse(&body.token)?;
    let ttl = state.ttl.parse(body.ttl_ms, state.ttl.default_claim)?;
    let now = state.clock.now_ms();
    let outcome = state.store.extend(&scoped, token, ttl, now).await?;
    let named = match outcome {
        ExtendOutcome::Extended { .. } => "extended",
        ExtendOutcome::Lost => "lost",
        ExtendOutcome::NotOwner { .. } => "not_owner",
        ExtendOutcome::Done { .. } => "done",
    };
    state.metrics.claim_op("extend", named);
    traces::outcome(named);
    match outcome {
        ExtendOutcome::Extended { expires_at_ms } => Ok(HttpResponse::Ok().json(StateAnswer {
            key: key.as_str(),
            state: ClaimState::Processing,
            fence: None,
            expires_at_ms,
            result: None,
        })),
        ExtendOutcome::Lost => Err(ApiError::NotFound {
            code: "lost",
            detail: "the claim expired or never existed; claim the key again".into(),
        }),
        ExtendOutcome::NotOwner { expires_at_ms } => {
            Err(not_owner(ClaimState::Processing, expires_at_ms))
        }
        ExtendOutcome::Done { expires_at_ms } => Err(already_done(expires_at_ms, None)),
    }
}

/// Releases the owner's claim so a retry can claim the key again.
#[utoipa::path(delete, path = "/v1/claims/{key}", operation_id = "releaseClaim", tag = "claims",
    security(("bearer" = [])),
    params(("key" = String, Path, description = "The idempotency key, 1 to 512 bytes of UTF-8 (percent-encode `/`, `%`, spaces)")),
    request_body(content = TokenBody, content_type = "application/json"),
    responses(
        (status = 204, description = "Released (or not held by anyone)"),
        (status = 409, description = "`not_owner` or `done`", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid key, token, TTL or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be reached or written; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn release(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (_, scoped) = parse_key(&req)?;
    let body: TokenBody =
        read_json(&req, payload, state.max_body_bytes, state.body_timeout).await?;
    let token = Token::parse(&body.token)?;
    let now = state.clock.now_ms();
    let outcome = state.store.release(&scoped, token, now).await?;
    let named = match outcome {
        ReleaseOutcome::Released => "released",
        ReleaseOutcome::NotHeld => "not_held",
        ReleaseOutcome::NotOwner { .. } => "not_owner",
        ReleaseOutcome::Done { .. } => "done",
    };
    state.metrics.claim_op("release", named);
    traces::outcome(named);
    match outcome {
        ReleaseOutcome::Released | ReleaseOutcome::NotHeld => {
            Ok(HttpResponse::NoContent().finish())
        }
        ReleaseOutcome::NotOwner { expires_at_ms } => {
            Err(not_owner(ClaimState::Processing, expires_at_ms))
        }
        ReleaseOutcome::Done { expires_at_ms } => Err(already_done(expires_at_ms, None)),
    }
}

/// A key's live state.
#[utoipa::path(get, path = "/v1/claims/{key}", operation_id = "getClaim", tag = "claims",
    security(("bearer" = [])),
    params(("key" = String, Path, description = "The idempotency key, 1 to 512 bytes of UTF-8 (percent-encode `/`, `%`, spaces)")),
    responses(
        (status = 200, description = "The key's state", body = StateAnswer),
        (status = 404, description = "No live claim for this key", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid key, token, TTL or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot be reached or written; retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn inspect(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (key, scoped) = parse_key(&req)?;
    let now = state.clock.now_ms();
    match state.store.get(&scoped, now).await? {
        Some(view) => {
            traces::outcome(match view.state {
                ClaimState::Processing => "processing",
                ClaimState::Done => "done",
            });
            Ok(HttpResponse::Ok().json(StateAnswer {
                key: key.as_str(),
                state: view.state,
                fence: Some(view.fence),
                expires_at_ms: view.expires_at_ms,
                result: view.result.as_ref().map(ClaimResult::as_raw),
            }))
        }
        None => Err(ApiError::NotFound {
            code: "not_found",
            detail: "no live claim for this key".into(),
        }),
    }
}
