//! The API's one error type, rendered as RFC 9457 problem details
//! (`application/problem+json`) with a stable `code` (also in `type`, as
//! `urn:dedupd:problem:{code}`).
//!
//! 5xx answers tell the client nothing about the cause; the cause is logged.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::clock::Millis;
use crate::domain::{BadResult, ClaimResult, Invalid, ResultTooLarge, RetryAfter};
use crate::gateway::ingest::IngestError;
use crate::gateway::signature::VerifyError;
use crate::store::inbox::EventStatus;
use crate::store::{ClaimState, StoreError};

/// Everything a handler can refuse with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A field or path parameter failed to parse (400).
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// The body is not the JSON the endpoint takes (400).
    #[error("{0}")]
    MalformedBody(String),
    /// The body is over the configured limit (413).
    #[error("request body exceeds the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// A done's result is over `claims.max_result_bytes` (413).
    #[error(transparent)]
    ResultTooLarge(#[from] ResultTooLarge),
    /// The body did not arrive in time (408).
    #[error("the request body did not arrive within {after:?}")]
    BodyTimeout {
        /// The configured `http.body_timeout`.
        after: std::time::Duration,
    },
    /// No valid bearer token (401).
    #[error("missing or invalid bearer token")]
    Unauthorized,
    /// A read-only token on a write (403).
    #[error("this token is read-only: {method} needs one of api.tokens")]
    ReadOnlyToken { method: String },
    /// Too many failed authentications from this peer (429).
    #[error(
        "too many failed authentications from this address: retry in {} s",
        retry_after.secs
    )]
    AuthThrottled {
        /// When the peer may try again.
        retry_after: RetryAfter,
    },
    /// `/readyz`: the store cannot take writes now (503), and why.
    #[error("{detail}")]
    NotReady {
        /// Machine-readable: `disk_low` or `store_unavailable`.
        reason: &'static str,
        /// Why, for people.
        detail: String,
    },
    /// Without API tokens, a request addressed to a name that is not
    /// loopback (421): a web page may have pointed its own name at us.
    #[error(
        "without API tokens, dedupd serves only requests addressed to localhost, 127.0.0.1 \
         or [::1]; configure api.tokens to serve other names"
    )]
    HostNotAllowed,
    /// Without API tokens, a request that came through a reverse proxy
    /// (421): whoever reaches the proxy would be served as a local client.
    #[error(
        "a request through a proxy needs api.tokens: without API tokens, dedupd serves only \
         clients on this machine, and this request came through a proxy ({mark}); configure \
         api.tokens and send a token to use the API through a proxy"
    )]
    ProxiedWithoutTokens {
        /// What gave the proxy away: a header's name, or `HTTP/1.0`.
        mark: &'static str,
    },
    /// An `Origin` (or `Sec-Fetch-Site`) that is not this server's (403).
    #[error("requests from another origin (a web page of another site) are refused")]
    CrossOrigin,
    /// A `/v1` body that is not JSON (415).
    #[error("request bodies must be JSON: send Content-Type: application/json")]
    UnsupportedMediaType,
    /// A webhook's signature or timestamp was refused (401).
    #[error("{0}")]
    Signature(#[from] VerifyError),
    /// Nothing at this path (404).
    #[error("{detail}")]
    NotFound {
        /// Stable code, such as `not_found` or `lost`.
        code: &'static str,
        /// What was not found.
        detail: String,
    },
    /// The path exists but not with this method (405).
    #[error("method {method} is not allowed here; allowed: {allowed}")]
    MethodNotAllowed {
        method: String,
        /// The methods the resource takes, comma-separated.
        allowed: String,
    },
    /// The state of the key refuses the operation (409).
    #[error("{detail}")]
    Conflict {
        /// `busy`, `done` or `not_owner`.
        code: &'static str,
        /// Human explanation.
        detail: String,
        /// State of the existing record.
        state: ClaimState,
        expires_at_ms: Millis,
        /// The result the done record keeps (`done` only).
        result: Option<ClaimResult>,
    },
    /// The request conflicts with the state of what it names (409): a
    /// source no longer configured, too many jobs.
    #[error("{detail}")]
    Refused {
        /// Stable code.
        code: &'static str,
        /// Human explanation.
        detail: String,
    },
    /// Only dead and stale gateway events can be redelivered (409).
    #[error("the event is {status:?}: only dead and stale events can be redelivered")]
    NotRedeliverable { status: EventStatus },
    /// Same key, different payload fingerprint (422).
    #[error("the key is held with a different fingerprint")]
    FingerprintMismatch {
        /// State of the existing record.
        state: ClaimState,
        expires_at_ms: Millis,
    },
    /// Too many counts and jobs wait to read the inbox already (429).
    #[error(
        "too many counts wait to read the inbox already (gateway.max_scans run at once); retry \
         in a moment"
    )]
    ScansBusy,
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        match e {
            IngestError::Signature(e) => ApiError::Signature(e),
            IngestError::MalformedBody(m) => ApiError::MalformedBody(m),
            IngestError::Invalid(i) => ApiError::Invalid(i),
        }
    }
}

/// An RFC 9457 problem document (`application/problem+json`): every error
/// answer of the API.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem<'a> {
    /// `urn:dedupd:problem:{code}`.
    #[serde(rename = "type")]
    type_: String,
    /// A short summary of the kind of problem.
    title: &'a str,
    status: u16,
    /// What happened, for people.
    detail: String,
    /// Stable machine-readable code: branch on this (e.g. `busy`, `done`,
    /// `not_owner`, `invalid_key`, `bad_signature`, `store_unavailable`).
    code: &'a str,
    /// The input field at fault (400 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    /// The largest value `field` takes, when the request's was over it
    /// (400 `invalid_ttl`: `claims.max_ttl` in ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    maximum: Option<u64>,
    /// The key's state (409 and 422 of the claims API).
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<ClaimState>,
    /// When the key's current state expires, Unix ms (409 and 422).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<Millis>,
    /// The result the done record keeps, as `done` was given it (409
    /// `done` of the claims API, when it keeps one).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    result: Option<&'a RawValue>,
}

impl From<BadResult> for ApiError {
    fn from(e: BadResult) -> Self {
        match e {
            BadResult::TooLarge(e) => ApiError::ResultTooLarge(e),
            BadResult::Invalid(e) => ApiError::Invalid(e),
        }
    }
}

impl ApiError {
    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Invalid(i) => i.code,
            ApiError::MalformedBody(_) => "malformed_body",
            ApiError::BodyTooLarge { .. } => "body_too_large",
            ApiError::ResultTooLarge(_) => "result_too_large",
            ApiError::BodyTimeout { .. } => "body_timeout",
            ApiError::Unauthorized => "unauthorized",
            ApiError::ReadOnlyToken { .. } => "read_only_token",
            ApiError::AuthThrottled { .. } => "auth_throttled",
            ApiError::ScansBusy => "too_many_scans",
            ApiError::HostNotAllowed => "host_not_allowed",
            ApiError::NotReady { reason, .. } => reason,
            ApiError::ProxiedWithoutTokens { .. } => "proxy_needs_tokens",
            ApiError::CrossOrigin => "cross_origin",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::Signature(e) => match e {
                VerifyError::MissingHeader(_) => "missing_signature",
                VerifyError::Malformed(_) => "malformed_signature",
                VerifyError::TimestampOutOfTolerance { .. } => "timestamp_out_of_tolerance",
                VerifyError::BadSignature => "bad_signature",
            },
            ApiError::NotFound { code, .. } | ApiError::Conflict { code, .. } => code,
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::NotRedeliverable { .. } => "not_redeliverable",
            ApiError::Refused { code, .. } => code,
            ApiError::FingerprintMismatch { .. } => "fingerprint_mismatch",
            ApiError::Store(StoreError::Unavailable(_)) => "store_unavailable",
            ApiError::Store(StoreError::Failed(_)) => "internal",
            ApiError::Store(StoreError::LowSpace { .. }) => "insufficient_storage",
            ApiError::Store(StoreError::KeysFull { .. }) => "keys_in_memory_full",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            ApiError::Invalid(_) => "Invalid input",
            ApiError::MalformedBody(_) => "Malformed request body",
            ApiError::BodyTooLarge { .. } => "Request body too large",
            ApiError::ResultTooLarge(_) => "Result too large",
            ApiError::BodyTimeout { .. } => "Request timeout",
            ApiError::Unauthorized => "Unauthorized",
            ApiError::ReadOnlyToken { .. } | ApiError::CrossOrigin => "Forbidden",
            ApiError::AuthThrottled { .. } | ApiError::ScansBusy => "Too many requests",
            ApiError::HostNotAllowed | ApiError::ProxiedWithoutTokens { .. } => {
                "Misdirected request"
            }
            ApiError::NotReady { .. } => "Not ready",
            ApiError::UnsupportedMediaType => "Unsupported media type",
            ApiError::Signature(_) => "Signature refused",
            ApiError::NotFound { .. } => "Not found",
            ApiError::MethodNotAllowed { .. } => "Method not allowed",
            ApiError::Conflict { .. }
            | ApiError::NotRedeliverable { .. }
            | ApiError::Refused { .. } => "Conflict",
            ApiError::FingerprintMismatch { .. } => "Fingerprint mismatch",
            ApiError::Store(StoreError::Unavailable(_)) => "Store unavailable",
            ApiError::Store(StoreError::Failed(_)) => "Internal error",
            ApiError::Store(StoreError::LowSpace { .. } | StoreError::KeysFull { .. }) => {
                "Insufficient storage"
            }
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Invalid(_) | ApiError::MalformedBody(_) => StatusCode::BAD_REQUEST,
            ApiError::BodyTooLarge { .. } | ApiError::ResultTooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unauthorized | ApiError::Signature(_) => StatusCode::UNAUTHORIZED,
            ApiError::ReadOnlyToken { .. } | ApiError::CrossOrigin => StatusCode::FORBIDDEN,
            ApiError::AuthThrottled { .. } | ApiError::ScansBusy => StatusCode::TOO_MANY_REQUESTS,
            ApiError::HostNotAllowed | ApiError::ProxiedWithoutTokens { .. } => {
                StatusCode::MISDIRECTED_REQUEST
            }
            ApiError::NotReady { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict { .. }
            | ApiError::NotRedeliverable { .. }
            | ApiError::Refused { .. } => StatusCode::CONFLICT,
            ApiError::FingerprintMismatch { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Store(StoreError::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(StoreError::Failed(_)) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Store(StoreError::LowSpace { .. } | StoreError::KeysFull { .. }) => {
                StatusCode::INSUFFICIENT_STORAGE
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let detail = match self {
            ApiError::Store(e) => {
                // The client hears nothing of the cause; the log has all of it.
                match e {
                    StoreError::Unavailable(_) => {
                        tracing::warn!(error = %e.chain(), "store unavailable");
                    }
                    StoreError::Failed(_) => tracing::error!(error = %e.chain(), "store error"),
                    // Logged once when the watermark or the cap is reached,
                    // not per request.
                    StoreError::LowSpace { .. } | StoreError::KeysFull { .. } => {}
                }
                match e {
                    StoreError::Unavailable(_) => {
                        "the store cannot be reached; retry later".to_owned()
                    }
                    StoreError::Failed(_) => "the request failed; nothing was changed".to_owned(),
                    StoreError::LowSpace { .. } => "free disk space is below the server's \
                        watermark: writes are refused until space frees; nothing was changed; \
                        retry later"
                        .to_owned(),
                    StoreError::KeysFull { .. } => "the server's keys take as much memory as \
                        storage.max_key_memory_bytes allows: new keys are refused until expired \
                        ones are reaped; nothing was changed; retry later"
                        .to_owned(),
                }
            }
            other => other.to_string(),
        };
        let (state, expires_at_ms) = match self {
            ApiError::Conflict {
                state,
                expires_at_ms,
                ..
            }
            | ApiError::FingerprintMismatch {
                state,
                expires_at_ms,
            } => (Some(*state), Some(*expires_at_ms)),
            _ => (None, None),
        };
        let result = match self {
            ApiError::Conflict {
                result: Some(result),
                ..
            } => Some(result.as_raw()),
            _ => None,
        };
        let problem = Problem {
            type_: format!("urn:dedupd:problem:{}", self.code()),
            title: self.title(),
            status: status.as_u16(),
            detail,
            code: self.code(),
            field: match self {
                ApiError::Invalid(i) => Some(i.field),
                _ => None,
            },
            maximum: match self {
                ApiError::Invalid(i) => i.maximum,
                _ => None,
            },
            state,
            expires_at_ms,
            result,
        };
        let mut res = HttpResponse::build(status);
        res.content_type("application/problem+json");
        match self {
            ApiError::Unauthorized => {
                res.insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")));
            }
            ApiError::MethodNotAllowed { allowed, .. } => {
                if let Ok(v) = HeaderValue::from_str(allowed) {
                    res.insert_header((header::ALLOW, v));
                }
            }
            ApiError::Store(StoreError::Unavailable(_)) | ApiError::ScansBusy => {
                res.insert_header((header::RETRY_AFTER, HeaderValue::from_static("1")));
            }
            ApiError::Store(StoreError::LowSpace { .. } | StoreError::KeysFull { .. }) => {
                res.insert_header((header::RETRY_AFTER, HeaderValue::from_static("30")));
            }
            ApiError::AuthThrottled { retry_after } => {
                res.insert_header((header::RETRY_AFTER, retry_after.secs.to_string()));
            }
            // The body was not read (in time): closing stops a client
            // that would go on sending it.
            ApiError::BodyTimeout { .. } | ApiError::BodyTooLarge { .. } => {
                res.force_close();
            }
            _ => {}
        }
        res.json(problem)
    }
}

#[cfg(test)]
mod tests {
    use actix_web::body::MessageBody;

    use super::*;

    fn detail(res: HttpResponse) -> serde_json::Value {
        let body = res.into_body().try_into_bytes().expect("a full body");
        serde_json::from_slice(&body).expect("problem json")
    }

    /// A store failure's cause (here a path and a redb message) stays in
    /// the log: the client learns the status and a fixed sentence.
    #[test]
    fn a_store_error_answers_without_its_cause() {
        let cause = "DB corrupted: page 7 of /var/lib/dedupd/dedupd.redb";
        let failed = ApiError::Store(StoreError::failed(cause));
        let res = failed.error_response();
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let v = detail(res);
        assert_eq!(v["code"], "internal");
        assert_eq!(v["detail"], "the request failed; nothing was changed");
        assert!(!v.to_string().contains("page 7"), "{v}");

        let unavailable = ApiError::Store(StoreError::unavailable(cause));
        let res = unavailable.error_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            res.headers().get(header::RETRY_AFTER),
            Some(&HeaderValue::from_static("1"))
        );
        let v = detail(res);
        assert_eq!(v["code"], "store_unavailable");
        assert_eq!(v["detail"], "the store cannot be reached; retry later");
        assert!(!v.to_string().contains("page 7"), "{v}");
    }
}
