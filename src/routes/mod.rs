//! HTTP resources, one module each. Handlers parse input into domain types
//! first and only then touch the store.

pub mod backup;
pub(crate) mod body;
pub mod claims;
pub mod count;
pub mod event;
pub mod health;
pub mod ingest;
pub mod jobs;
pub mod metrics;
pub mod openapi;
pub mod overview;
pub mod sources;
pub mod streams;
pub mod ui;

use std::borrow::Cow;
use std::sync::Arc;

use actix_web::http::Method;
use actix_web::middleware::from_fn;
use actix_web::{HttpRequest, web};

use crate::auth::require_bearer;
use crate::clock::SharedClock;
use crate::domain::{Invalid, TtlBounds};
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::gateway::delivery::Dispatcher;
use crate::store::Store;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub clock: SharedClock,
    /// TTL defaults and ceiling.
    pub ttl: TtlBounds,
    /// Retention of applied events and stream heads, milliseconds.
    pub retention_ms: u64,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Largest result a done keeps (`claims.max_result_bytes`).
    pub max_result_bytes: usize,
    /// The webhook gateway (sources, inbox).
    pub gateway: Arc<Gateway>,
    /// The delivery dispatcher, for each source's delivery state.
    pub dispatcher: Arc<Dispatcher>,
    /// How long ingest and `/v1` wait for a request body.
    pub body_timeout: std::time::Duration,
    /// Counters and histograms behind `GET /metrics`.
    pub metrics: Arc<crate::telemetry::metrics::Metrics>,
    /// Backups of the data file.
    pub backups: crate::store::redb::Backups,
}

/// Registers the `/v1` resources on `cfg`, each with [`Guard::Open`]:
/// `crate::gate` checks the origin and the token of everything under `/v1`.
pub fn configure_v1(cfg: &mut web::ServiceConfig) {
    claims::configure(cfg);
    streams::configure(cfg);
    overview::configure(cfg);
    sources::configure(cfg);
    count::configure(cfg);
    event::configure(cfg);
    jobs::configure(cfg);
    backup::configure(cfg);
}

/// Answers `req` with `route`; with traces on, in a span named by `name`
/// (from the segments and method [`below`] `prefix`), with its answer's
/// status. The claims and ordering dispatchers share it.
async fn traced<F, Fut>(
    req: HttpRequest,
    prefix: &str,
    name: fn(usize, Option<&str>, &Method) -> &'static str,
    route: F,
) -> Result<actix_web::HttpResponse, ApiError>
where
    F: FnOnce(HttpRequest) -> Fut,
    Fut: std::future::Future<Output = Result<actix_web::HttpResponse, ApiError>>,
{
    use crate::telemetry::traces;
    use actix_web::ResponseError;
    if !traces::on() {
        return route(req).await;
    }
    let (segments, action) = below(&req, prefix);
    let name = name(segments, action, req.method());
    traces::api(name, async move {
        let answer = route(req).await;
        match &answer {
            Ok(res) => traces::answered(res.status().as_u16(), None),
            Err(e) => traces::answered(e.status_code().as_u16(), Some(e.code())),
        }
        answer
    })
    .await
}

/// The request path below `prefix`, for the scopes that dispatch by hand:
/// how many segments it has, and the second one (the action). An empty
/// first segment counts as none, as a `{param}` pattern would not match it:
/// below `/v1/claims/`, `/v1/claims/k/done` is `(2, Some("done"))`, `/v1/claims/k`
/// is `(1, None)` and `/v1/claims/` or `/v1/claims//x` is `(0, _)`.
pub fn below<'a>(req: &'a HttpRequest, prefix: &str) -> (usize, Option<&'a str>) {
    let rest = req
        .uri()
        .path()
        .strip_prefix(prefix)
        .filter(|rest| !rest.is_empty() && !rest.starts_with('/'));
    let Some(rest) = rest else {
        return (0, None);
    };
    let mut segments = rest.split('/');
    segments.next();
    let action = segments.next();
    (1 + usize::from(action.is_some()) + segments.count(), action)
}

/// The 405 for a method a path does not take, naming the methods `allowed`
/// (in the `Allow` header too).
pub fn not_allowed(req: &HttpRequest, allowed: &str) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed {
        method: req.method().to_string(),
        allowed: allowed.to_owned(),
    })
}

/// Segment `index` of the request path (`/v1/claims/{key}` has the key at
/// 3), percent-decoded strictly: a malformed escape or bytes that are not
/// UTF-8 are refused, never replaced, so two different raw keys can never
/// decode to the same key.
pub fn path_segment(
    req: &HttpRequest,
    index: usize,
    field: &'static str,
) -> Result<String, ApiError> {
    let raw = req.uri().path().split('/').nth(index).unwrap_or_default();
    let bytes = raw.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        {
            return Err(ApiError::Invalid(Invalid::new(
                "invalid_key",
                field,
                "malformed percent-encoding: '%' must be followed by two hex digits",
            )));
        }
    }
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            ApiError::Invalid(Invalid::new(
                "invalid_key",
                field,
                "must be UTF-8 once percent-decoded",
            ))
        })
}

/// The answer for a known path with a method it does not take.
pub fn method_not_allowed(allowed: String) -> actix_web::Route {
    web::route().to(move |req: HttpRequest| {
        let answer = not_allowed(&req, &allowed);
        async move { answer }
    })
}

/// One route the app serves: its method, its path pattern relative to the
/// scope it is registered in, and its handler. The app registers routes
/// only through [`register`] (or, for the claims and streams routes,
/// dispatches exactly these by hand), and [`endpoints`] lists them all: the OpenAPI
/// document is checked against that list, so the two cannot drift.
#[derive(Clone)]
pub struct Endpoint {
    pub method: Method,
    /// The pattern, relative to the scope.
    pub path: Cow<'static, str>,
    /// The handler; `None` where the scope dispatches by hand.
    pub route: Option<fn() -> actix_web::Route>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

impl Endpoint {
    /// A route served by `route`.
    pub fn new(method: Method, path: &'static str, route: fn() -> actix_web::Route) -> Self {
        Self {
            method,
            path: path.into(),
            route: Some(route),
        }
    }

    /// A route its scope dispatches by hand.
    pub fn by_hand(method: Method, path: &'static str) -> Self {
        Self {
            method,
            path: path.into(),
            route: None,
        }
    }
}

/// Whether [`register`] puts each resource behind the API tokens: for
/// routes outside `/v1` only (`crate::gate` checks every `/v1` request,
/// and a second check would count each bad credential twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Anyone who reaches the listener.
    Open,
    /// A bearer token, when tokens are configured.
    Bearer,
}

/// The methods a path with `methods` answers, for its `Allow` header:
/// each `GET` is followed by the `HEAD` it implies.
fn allow_header<'a>(methods: impl IntoIterator<Item = &'a Method>) -> String {
    let mut allowed: Vec<&str> = Vec::new();
    for m in methods {
        allowed.push(m.as_str());
        if *m == Method::GET {
            allowed.push(Method::HEAD.as_str());
        }
    }
    allowed.join(", ")
}

/// Registers `endpoints` as resources, one per path, each answering other
/// methods with 405 and the `Allow` header. A `GET` route answers `HEAD`
/// too, with the same handler: actix sends a `HEAD` answer's status and
/// headers (`Content-Length` included) and drops its body. The OpenAPI
/// document lists the `GET` only.
pub fn register(cfg: &mut web::ServiceConfig, endpoints: Vec<Endpoint>, guard: Guard) {
    let mut paths: Vec<Cow<'static, str>> = Vec::new();
    for e in &endpoints {
        if e.route.is_some() && !paths.contains(&e.path) {
            paths.push(e.path.clone());
        }
    }
    for path in paths {
        let here: Vec<&Endpoint> = endpoints.iter().filter(|e| e.path == path).collect();
        let allowed = allow_header(here.iter().map(|e| &e.method));
        let mut resource = web::resource(path.into_owned());
        for e in here {
            if let Some(route) = e.route {
                resource = resource.route(route().method(e.method.clone()));
                if e.method == Method::GET {
                    resource = resource.route(route().method(Method::HEAD));
                }
            }
        }
        let resource = resource.default_service(method_not_allowed(allowed));
        match guard {
            Guard::Open => cfg.service(resource),
            Guard::Bearer => cfg.service(resource.wrap(from_fn(require_bearer))),
        };
    }
}

/// Every route the app serves, with full paths.
pub fn endpoints() -> Vec<Endpoint> {
    let mut all: Vec<Endpoint> = health::endpoints()
        .into_iter()
        .chain(ingest::endpoints())
        .chain(metrics::endpoints())
        .chain(openapi::endpoints())
        .chain(ui::endpoints())
        .collect();
    for mut e in claims::endpoints()
        .into_iter()
        .chain(streams::endpoints())
        .chain(overview::endpoints())
        .chain(sources::endpoints())
        .chain(count::endpoints())
        .chain(event::endpoints())
        .chain(jobs::endpoints())
        .chain(backup::endpoints())
    {
        e.path = format!("/v1{}", e.path).into();
        all.push(e);
    }
    all
}

/// The answer for a path that does not exist.
pub async fn not_found(req: HttpRequest) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound {
        code: "not_found",
        detail: format!("no resource at {}", req.path()),
    })
}
