//! `GET /ui`: the operator console, a page compiled into the binary.
//!
//! The page itself holds no data and needs no token: it is the same for
//! everyone. Everything it shows comes from the `/v1` API, called by its
//! script with the bearer token the operator types in. Every answer carries
//! a strict Content-Security-Policy (scripts, styles and requests from this
//! origin only; no inline script or style, no framing), and an ETag, so a
//! browser revalidates instead of running an old script after an upgrade.

use std::sync::LazyLock;

use actix_web::http::{Method, header};
use actix_web::{HttpRequest, HttpResponse, web};
use sha2::{Digest, Sha256};

use super::{Endpoint, Guard, register};
use crate::error::{ApiError, Problem};

/// The policy on every console answer.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A file of the console.
#[derive(Debug)]
struct Asset {
    /// Its name under `/ui/` (empty: the page itself, at `/ui`).
    name: &'static str,
    /// Its `Content-Type`.
    content_type: &'static str,
    /// Its bytes, embedded at build time.
    body: &'static [u8],
}

/// Every file, embedded: nothing is read from disk or fetched at run time.
static ASSETS: &[Asset] = &[
    Asset {
        name: "",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../../ui/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../ui/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../ui/app.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../../ui/favicon.svg"),
    },
];

/// Each asset's ETag (a quoted SHA-256 prefix of its bytes), in
/// [`ASSETS`] order.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| format!("\"{}\"", hex::encode(&Sha256::digest(a.body)[..12])))
        .collect()
});

/// The console's routes: the page and its files.
pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::new(Method::GET, "/ui", || web::route().to(page)),
        Endpoint::new(Method::GET, "/ui/{file}", || web::route().to(file)),
    ]
}

/// Registers the console routes: no bearer token, the files hold no data.
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

/// The operator console: a page that reads everything it shows from `/v1`
/// with the token the operator types in.
#[utoipa::path(get, path = "/ui", operation_id = "getConsole", tag = "console",
    responses(
        (status = 200, description = "The console's page", body = String, content_type = "text/html; charset=utf-8"),
        (status = 304, description = "The browser's copy is current (If-None-Match)"),
    ))]
pub(super) async fn page(req: HttpRequest) -> HttpResponse {
    serve(&req, 0)
}

/// One of the console's files (`app.js`, `app.css`, `favicon.svg`).
#[utoipa::path(get, path = "/ui/{file}", operation_id = "getConsoleFile", tag = "console",
    params(("file" = String, Path, description = "The file's name")),
    responses(
        (status = 200, description = "The file, with its content type", body = String),
        (status = 304, description = "The browser's copy is current (If-None-Match)"),
        (status = 404, description = "`not_found`", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn file(
    req: HttpRequest,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    match ASSETS
        .iter()
        .position(|a| !a.name.is_empty() && a.name == name.as_str())
    {
        Some(i) => Ok(serve(&req, i)),
        None => Err(ApiError::NotFound {
            code: "not_found",
            detail: format!("the console has no file named {:?}", name.as_str()),
        }),
    }
}

/// Answers with asset `i`, or 304 when the browser's copy is current.
fn serve(req: &HttpRequest, i: usize) -> HttpResponse {
    let asset = &ASSETS[i];
    let etag = ETAGS[i].as_str();
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut res = if fresh {
        HttpResponse::NotModified()
    } else {
        HttpResponse::Ok()
    };
    res.insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        // Revalidate every time (a 304 costs a round trip, not a download):
        // after an upgrade the browser never mixes old and new files.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::ETAG, etag));
    if fresh {
        res.finish()
    } else {
        res.content_type(asset.content_type).body(asset.body)
    }
}
