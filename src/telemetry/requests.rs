//! One record per answered request: a log line and the latency histogram.

use std::time::Instant;

use actix_web::HttpMessage;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;

use super::metrics::Metrics;

/// The route pattern of a request that actix does not match by pattern
/// (the claims routes are dispatched by hand), set by its handler as a
/// request extension for the latency histogram's `route` label.
#[derive(Debug, Clone, Copy)]
pub struct RouteName(pub &'static str);

/// Records each request once it is answered in the latency histogram, and
/// logs it: `debug` with method, path, status and duration, `error` for
/// 5xx. Client refusals such as `409 busy` are ordinary outcomes of a
/// dedupe service, not warnings. A line per request is `debug`, not
/// `info`: at the default level it would cost about a fifth of the
/// claims path's CPU and write gigabytes an hour to the journal at full
/// load, while the histogram already counts every request.
///
/// Nothing is formatted unless the event is enabled: a request path costs
/// a clock read and a status check (a span-per-request logger with a random
/// request id cost several percent of the claims path's CPU).
pub async fn observe_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let start = Instant::now();
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let each = tracing::enabled!(tracing::Level::DEBUG);
    let (method, path) = if each {
        (req.method().clone(), req.path().to_owned())
    } else {
        (actix_web::http::Method::GET, String::new())
    };
    let res = next.call(req).await;
    let status = match &res {
        Ok(r) => r.status(),
        Err(e) => e.as_response_error().status_code(),
    };
    let elapsed = start.elapsed().as_secs_f64();
    if let (Some(metrics), Ok(r)) = (&metrics, &res) {
        let named = r.request().extensions().get::<RouteName>().map(|n| n.0);
        let route: std::borrow::Cow<'static, str> = match named {
            Some(name) => name.into(),
            None => r
                .request()
                .match_pattern()
                // Never the raw path: anyone could grow the label set.
                .map_or("unmatched".into(), Into::into),
        };
        metrics.http_request(
            method_label(r.request().method()),
            &route,
            status.as_u16(),
            elapsed,
        );
    }
    let ms = elapsed * 1e3;
    if status.is_server_error() {
        let (method, path) = match &res {
            Ok(r) => (
                r.request().method().to_string(),
                r.request().path().to_owned(),
            ),
            Err(_) => (method.to_string(), path),
        };
        tracing::error!(%method, %path, status = status.as_u16(), ms, "request failed");
    } else if each {
        tracing::debug!(%method, %path, status = status.as_u16(), ms, "request done");
    }
    res
}

/// The `method` label: the standard methods by name, any other as `OTHER`
/// (a client may send any token as a method; each would be a new series).
fn method_label(method: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "OTHER",
    }
}
