//! `GET /openapi.json`: the OpenAPI 3.1 description of every route, built
//! from the handlers' annotations. A test checks its paths and methods
//! against [`super::endpoints`], the list the app registers from.

use actix_web::http::Method;
use actix_web::{HttpResponse, web};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{Endpoint, Guard, register};

/// The document.
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
        super::event::show,
        super::sources::redeliver,
        super::ui::page,
        super::ui::file,
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "claims", description = "Claim a key, mark it done, extend or release it"),
        (name = "streams", description = "Apply events of a stream in created_at order"),
        (name = "gateway", description = "Receive webhooks; see and redeliver what was received"),
        (name = "operations", description = "Metrics and this document"),
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
                        "One of the configured API tokens (api.tokens or api.tokens_file); \
                         not needed when none are configured (loopback only)",
                    ))
                    .build(),
            ),
        );
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

/// This document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "getOpenApiDocument", tag = "operations",
    responses((status = 200, description = "OpenAPI 3.1", content_type = "application/json")))]
async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}
