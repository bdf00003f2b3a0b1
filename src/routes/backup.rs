//! `POST /v1/backup`: a backup of the data file, streamed while the
//! server serves (`dedupd backup` calls it). A write, so it takes a full
//! API token: a backup holds every event's body and the keys that open
//! them, as the data directory does.
//!
//! The snapshot is taken before the answer's status is sent, so a 200
//! holds every write acknowledged before the request; a refusal before
//! then is a problem document. A failure during the copy cuts the body
//! short (the server logs why): the file left is refused by every reader
//! of backups (`dedupd backup` removes it). So does a stop of the server:
//! it abandons the backup at once, and closes the answer's connection when
//! nothing else is in flight, however little its client reads (see
//! [`crate::connections`]).

use actix_web::http::Method;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};

use super::{AppState, Endpoint, Guard, register};
use crate::connections::Open;
use crate::error::{ApiError, Problem};
use crate::store::redb::backup::BackupError;

/// The backup route, relative to `/v1`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![Endpoint::new(Method::POST, "/backup", || {
        web::route().to(backup)
    })]
}

/// Registers the backup route (in the `/v1` scope, behind its tokens).
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

/// The media type of a backup file.
pub const MEDIA_TYPE: &str = "application/vnd.dedupd.backup";

/// `POST /v1/backup`.
#[utoipa::path(post, path = "/v1/backup", operation_id = "takeBackup", tag = "operations",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The backup, streamed: every write acknowledged before the \
            request, one self-checking file (`dedupd verify` reads it). Headers: \
            `X-Dedupd-Backup-Batch`, the last write-ahead-log batch it holds; \
            `Content-Disposition` with a file name. A body cut short is a backup that failed \
            midway", content_type = "application/vnd.dedupd.backup"),
        (status = 409, description = "`backup_running`: one is being taken; one at a time", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Tokens are configured and none matched", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The data file cannot be read now (a disk fault, stopping); retry", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn backup(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let now = state.clock.now_ms();
    let (header, chunks) = match state.backups.stream(now).await {
        Ok(started) => started,
        Err(BackupError::Busy) => {
            return Err(ApiError::Refused {
                code: "backup_running",
                detail: "a backup is being taken already: one at a time".into(),
            });
        }
        Err(e) => return Err(e.into_store_error().into()),
    };
    tracing::info!(
        batch = header.batch,
        data_file = %header.data_file,
        "backup started"
    );
    let name = format!(
        "attachment; filename=\"dedupd-{}-{}.backup\"",
        &header.data_file[..8.min(header.data_file.len())],
        header.taken_at_ms
    );
    let mut chunks = chunks;
    // Its connection carries a backup's answer as long as the body lives.
    let answer = req.conn_data::<Open>().map(Open::backup_answer);
    let body = futures_util::stream::poll_fn(move |cx| {
        let _carrying = &answer;
        chunks.poll_recv(cx)
    });
    let mut answer = HttpResponse::Ok();
    answer
        .content_type(MEDIA_TYPE)
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header(("x-dedupd-backup-batch", header.batch.to_string()));
    if let Ok(v) = HeaderValue::from_str(&name) {
        answer.insert_header((header::CONTENT_DISPOSITION, v));
    }
    Ok(answer.streaming(body))
}
