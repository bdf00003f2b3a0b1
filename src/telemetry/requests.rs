//! One record per answered request: a log line and the latency histogram.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Instant;

use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::{HttpMessage, HttpRequest, web};
use metrics::Histogram;

use super::metrics::Metrics;

/// The route pattern of a request that actix does not match by pattern
/// (the claims routes are dispatched by hand), set by its handler as a
/// request extension for the latency histogram's `route` label.
#[derive(Debug, Clone, Copy)]
pub struct RouteName(pub &'static str);

/// One request on its way: started when it arrived, recorded once it is
/// answered (by `crate::gate`, the one middleware in front of every
/// route) in the latency histogram, and logged: `debug` with method,
/// path, status and duration, `error` for 5xx. Client refusals such as
/// `409 busy` are ordinary outcomes of a dedupe service, not warnings. A
/// line per request is `debug`, not `info`: at the default level it would
/// cost about a fifth of the claims path's CPU and write gigabytes an hour
/// to the journal at full load, while the histogram already counts every
/// request.
///
/// Nothing is formatted unless the event is enabled: a request costs two
/// clock reads, a status check and a lookup in its worker's own table of
/// histograms (a span-per-request logger with a random request id cost
/// several percent of the claims path's CPU).
#[derive(Debug)]
pub struct RequestRecord {
    start: Instant,
    /// Method and path, kept only when every request is logged, for an
    /// answer that comes as an error (which carries no request).
    each: Option<(Method, String)>,
}

impl RequestRecord {
    /// Starts the record of `req`.
    pub fn start(req: &ServiceRequest) -> Self {
        let each = tracing::enabled!(tracing::Level::DEBUG)
            .then(|| (req.method().clone(), req.path().to_owned()));
        Self {
            start: Instant::now(),
            each,
        }
    }

    /// Records the answer (or error) `res` in `histograms` and the log.
    pub fn finish<B>(
        self,
        res: &Result<ServiceResponse<B>, actix_web::Error>,
        histograms: &WorkerHistograms,
    ) {
        let status = match res {
            Ok(r) => r.status(),
            Err(e) => e.as_response_error().status_code(),
        };
        let elapsed = self.start.elapsed().as_secs_f64();
        if let Ok(r) = res {
            histograms.record(r.request(), status.as_u16(), elapsed);
        }
        let ms = elapsed * 1e3;
        if !status.is_server_error() && self.each.is_none() {
            return;
        }
        let (method, path) = match (res, self.each) {
            (Ok(r), _) => (r.request().method().clone(), r.request().path().to_owned()),
            (Err(_), Some(each)) => each,
            (Err(_), None) => (Method::GET, String::new()),
        };
        if status.is_server_error() {
            tracing::error!(%method, %path, status = status.as_u16(), ms, "request failed");
        } else {
            tracing::debug!(%method, %path, status = status.as_u16(), ms, "request done");
        }
    }
}

/// A method label, a status and their histogram.
type Series = (&'static str, u16, Histogram);

/// One HTTP worker's handles on the latency histogram's series, so that
/// recording a request takes no lock and no reference count shared with
/// the other workers (they passed both cache lines back and forth at every
/// request). The series themselves, one bucket per label set, are shared:
/// every worker adds to the same counts.
/// Per worker: actix builds the app, and its middleware, on each worker's
/// own thread.
#[derive(Debug, Default)]
pub struct WorkerHistograms {
    /// By route, then method and status: few of each.
    series: RefCell<HashMap<String, Vec<Series>>>,
}

impl WorkerHistograms {
    /// Records that `req` got `status` after `seconds`, if the app has
    /// metrics.
    fn record(&self, req: &HttpRequest, status: u16, seconds: f64) {
        let Some(metrics) = req.app_data::<web::Data<Metrics>>() else {
            return;
        };
        let method = method_label(req.method());
        let named = req.extensions().get::<RouteName>().map(|n| n.0);
        let route: Cow<'static, str> = match named {
            Some(name) => name.into(),
            None => req
                .match_pattern()
                // Never the raw path: anyone could grow the label set.
                .map_or("unmatched".into(), Into::into),
        };
        let mut series = self.series.borrow_mut();
        let known = series.get(route.as_ref()).and_then(|s| {
            s.iter()
                .find(|(m, st, _)| *m == method && *st == status)
                .map(|(_, _, h)| h)
        });
        if let Some(h) = known {
            h.record(seconds);
            return;
        }
        let h = metrics.http_histogram(method, &route, status);
        h.record(seconds);
        series
            .entry(route.into_owned())
            .or_default()
            .push((method, status, h));
    }
}

/// The `method` label: the standard methods by name, any other as `OTHER`
/// (a client may send any token as a method; each would be a new series).
fn method_label(method: &Method) -> &'static str {
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
