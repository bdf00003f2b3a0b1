//! Reading JSON bodies with our own limits and error messages.
//!
//! actix's `Json` extractor answers overflows and parse errors in its own
//! format; reading the payload here keeps every refusal a problem document
//! that names the offending field.

use std::time::Duration;

use actix_web::HttpRequest;
use actix_web::http::header;
use actix_web::web;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Reads the raw body, refusing more than `limit` bytes (413) whether or not
/// the client announced its length.
pub async fn read_bytes(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::BytesMut, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::MalformedBody(format!("cannot read request body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::BodyTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// [`read_bytes`] within `timeout` (`http.body_timeout`): a body that has
/// not all arrived by then gets 408, and the connection is closed.
pub async fn read_bytes_within(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
    timeout: Duration,
) -> Result<web::BytesMut, ApiError> {
    tokio::time::timeout(timeout, read_bytes(req, payload, limit))
        .await
        .unwrap_or(Err(ApiError::BodyTimeout { after: timeout }))
}

/// Reads the body (at most `limit` bytes, within `timeout`) and parses it
/// as `T`. An empty body parses as `{}`, so endpoints whose fields are all
/// optional accept it.
pub async fn read_json<T: DeserializeOwned>(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
    timeout: Duration,
) -> Result<T, ApiError> {
    let body = read_bytes_within(req, payload, limit, timeout).await?;
    let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &body
    };
    let de = &mut serde_json::Deserializer::from_slice(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            ApiError::MalformedBody(format!("invalid JSON body: {inner}"))
        } else {
            ApiError::MalformedBody(format!("invalid JSON body at `{path}`: {inner}"))
        }
    })
}
