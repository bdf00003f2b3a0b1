//! `GET /openapi.json`: the OpenAPI 3.1 description of every route, built
//! from the handlers' annotations. A test checks its paths and methods
//! against [`super::endpoints`], the list the app registers from.

use actix_web::http::Method;
use actix_web::{HttpResponse, web};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use super::{Endpoint, Guard, register};

#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "dedupd",
        description = "Webhook processing that happens once in effect: a claims API, \
            ordering by stream, and a webhook gateway. Errors are RFC 9457 problem \
            documents (`application/problem+json`) with a stable `code`."
    ),
    paths(
        super::health::healthz,
        super::health::readyz,
        super::metrics::scrape,
        openapi_json,
        super::ingest::ingest,
        super::claims::claim,
        super::claims::inspect,
        super::claims::release,
        super::claims::done,
        super::claims::extend,
        super::streams::apply,
        super::streams::get_head,
        super::overview::list,
        super::sources::show,
        super::sources::list,
        super::count::count,
        super::event::show,
        super::sources::redeliver,
        super::jobs::start,
        super::jobs::list,
        super::jobs::show,
        super::jobs::cancel,
        super::jobs::erase,
        super::backup::backup,
        super::ui::page,
        super::ui::file,
    ),
    modifiers(&BearerAuth, &Refusals),
    tags(
        (name = "claims", description = "Claim a key, mark it done, extend or release it"),
        (name = "streams", description = "Apply events of a stream in created_at order"),
        (name = "gateway", description = "Receive webhooks; see, redeliver and erase what was received, one event or in bulk"),
        (name = "operations", description = "Metrics, backups and this document"),
        (name = "console", description = "The operator console: a page in the binary that reads the /v1 API"),
        (name = "health", description = "Liveness and readiness"),
    )
)]
pub struct ApiDoc;

/// Adds the bearer scheme the `/v1` routes and `/metrics` name.
#[derive(Debug)]
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "One of the configured API tokens (api.tokens or api.tokens_file); a \
                         read-only one (api.read_tokens) for GET and HEAD only; not needed \
                         when none are configured (loopback only)",
                    ))
                    .build(),
            ),
        );
    }
}

/// Adds the refusals that come from the checks in front of the handlers
/// (`crate::auth`), not from a handler, to every operation they apply to.
#[derive(Debug)]
struct Refusals;

impl Modify for Refusals {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let problem = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/problem+json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build()
        };
        for (path, item) in &mut doc.paths.paths {
            let v1 = path.starts_with("/v1/");
            // Ingest and the probes answer whatever the Host.
            let any_host = path.starts_with("/ingest/") || path == "/healthz" || path == "/readyz";
            let bearer = v1 || path == "/metrics";
            for (method, op) in [
                ("get", &mut item.get),
                ("post", &mut item.post),
                ("put", &mut item.put),
                ("delete", &mut item.delete),
                ("patch", &mut item.patch),
            ] {
                let Some(op) = op else { continue };
                let mut add = |status: &str, description: &str| {
                    op.responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert_with(|| problem(description).into());
                };
                if !any_host {
                    add(
                        "421",
                        "`host_not_allowed`: no API tokens are configured and the request was \
                         not addressed to localhost, 127.0.0.1 or [::1]; `proxy_needs_tokens`: \
                         no API tokens are configured and the request came through a proxy \
                         (`Forwarded`, `Via`, `X-Forwarded-*`, `X-Real-IP` or HTTP/1.0)",
                    );
                }
                if bearer {
                    add(
                        "429",
                        "`auth_throttled`: too many failed authentications from this address; \
                         retry after `Retry-After` seconds",
                    );
                }
                if v1 {
                    add(
                        "403",
                        "`cross_origin`: sent by a page of another origin; `read_only_token`: \
                         a read-only token on a write",
                    );
                }
                if v1 && method != "get" {
                    add(
                        "415",
                        "`unsupported_media_type`: a body that is not `application/json`",
                    );
                }
                if v1 && op.request_body.is_some() {
                    add(
                        "408",
                        "`body_timeout`: the body did not arrive within http.body_timeout; \
                         the connection is closed",
                    );
                }
            }
        }
    }
}

/// `GET /openapi.json`.
pub fn endpoints() -> Vec<Endpoint> {
    vec![Endpoint::new(Method::GET, "/openapi.json", || {
        web::route().to(openapi_json)
    })]
}

/// Registers `/openapi.json`: the API's shape is no secret.
pub fn configure(cfg: &mut web::ServiceConfig) {
    register(cfg, endpoints(), Guard::Open);
}

#[utoipa::path(get, path = "/openapi.json", operation_id = "getOpenApiDocument", tag = "operations",
    responses((status = 200, description = "OpenAPI 3.1", content_type = "application/json")))]
async fn openapi_json() -> HttpResponse {
    // Built once: building and writing it took about a millisecond of a
    // worker's time a request, and anyone may ask for it (64 clients asking
    // over and over took an ingest's p99 from 5 ms to 2.5 s).
    static DOCUMENT: std::sync::OnceLock<web::Bytes> = std::sync::OnceLock::new();
    let document = DOCUMENT.get_or_init(|| {
        serde_json::to_vec(&ApiDoc::openapi())
            .map(web::Bytes::from)
            .unwrap_or_default()
    });
    HttpResponse::Ok()
        .content_type(actix_web::http::header::ContentType::json())
        .body(document.clone())
}
