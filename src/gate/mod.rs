//! The one middleware in front of every route: the request's record (its
//! latency and log line) and the checks of who may reach what, in this
//! order:
//!
//! 1. the record starts, so every answer below is counted, refusals too;
//! 2. [`browser::check_host`], for every path: without API tokens, loopback
//!    names only and no proxy;
//! 3. on `/v1`: [`browser::check_v1`] (a cross-origin page is refused
//!    before its credential, if any, is looked at), then the bearer token
//!    ([`auth::authorize`]);
//! 4. the route.
//!
//! They were four `from_fn` layers, each with its own boxed future and
//! call through a boxed service per request; one layer does the same work
//! for about a tenth of a claim's HTTP overhead less.
//!
//! `/v1` is recognised as actix's router recognises its scope: on the
//! path the router matches (percent-decoded but for `%`, `/` and `+`), as
//! `/v1` itself or anything under `/v1/`. So `/%76%31/sources`, which the
//! router serves as `/v1/sources`, is checked as it is.

use std::future::{Ready, ready};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::web;
use futures_util::future::Either;
use pin_project_lite::pin_project;

use crate::auth::{self, ApiTokens, TokenSnapshot, browser, refuse};

mod unread;

use crate::error::ApiError;
use crate::telemetry::{RequestRecord, WorkerHistograms};
use unread::KeepsPayload;

/// The scope whose routes need a token (when tokens are configured) and a
/// same-origin JSON request: `startup` mounts them under this very prefix.
/// The gate decides before routing, so no middleware that rewrites paths
/// (`NormalizePath`) may sit between it and the router.
pub const V1: &str = "/v1";

/// The middleware: `App::new().wrap(Gate)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gate;

impl<S, B> Transform<S, ServiceRequest> for Gate
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    type Response = ServiceResponse<KeepsPayload<EitherBody<B>>>;
    type Error = actix_web::Error;
    type Transform = GateService<S>;
    type InitError = ();
    type Future = Ready<Result<GateService<S>, ()>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(GateService {
            service,
            histograms: Rc::default(),
        }))
    }
}

/// [`Gate`] on one HTTP worker.
#[derive(Debug)]
pub struct GateService<S> {
    service: S,
    /// This worker's latency series (see [`WorkerHistograms`]).
    histograms: Rc<WorkerHistograms>,
}

impl<S, B> Service<ServiceRequest> for GateService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    type Response = ServiceResponse<KeepsPayload<EitherBody<B>>>;
    type Error = actix_web::Error;
    type Future = Either<Ready<Result<Self::Response, Self::Error>>, Answer<S::Future>>;

    forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        let record = RequestRecord::start(&req);
        let held = unread::hold(&mut req);
        if let Err(e) = admit(&req) {
            let res = Ok(refuse(req, &e));
            record.finish(&res, &self.histograms);
            return Either::Left(ready(
                res.map(|res| res.map_body(|_, body| KeepsPayload::new(body, held))),
            ));
        }
        Either::Right(Answer {
            inner: self.service.call(req),
            done: Some((record, self.histograms.clone())),
            held,
        })
    }
}

/// Whether `req` may go on to its route (see the module doc). Every check
/// reads the one token set the request found: a reload between them
/// cannot make it judged by two.
fn admit(req: &ServiceRequest) -> Result<(), ApiError> {
    let tokens = req.app_data::<web::Data<ApiTokens>>().map(|t| t.snapshot());
    browser::check_host(req, tokens.as_ref().is_none_or(TokenSnapshot::is_empty))?;
    if under_v1(req.match_info().as_str()) {
        browser::check_v1(req)?;
        auth::authorize(tokens.as_ref(), req)?;
    }
    Ok(())
}

/// Whether the router's `path` is in the `/v1` scope: actix matches a
/// scope's prefix whole, up to a `/` or the end.
fn under_v1(path: &str) -> bool {
    path.strip_prefix(V1)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

pin_project! {
    /// The route's answer, recorded when it is ready.
    pub struct Answer<F> {
        #[pin]
        inner: F,
        done: Option<(RequestRecord, Rc<WorkerHistograms>)>,
        held: Option<unread::Held>,
    }
}

impl<F, B> Future for Answer<F>
where
    F: Future<Output = Result<ServiceResponse<B>, actix_web::Error>>,
{
    type Output = Result<ServiceResponse<KeepsPayload<EitherBody<B>>>, actix_web::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = std::task::ready!(this.inner.poll(cx));
        if let Some((record, histograms)) = this.done.take() {
            record.finish(&res, &histograms);
        }
        let held = this.held.take();
        Poll::Ready(res.map(|res| {
            res.map_into_left_body()
                .map_body(|_, body| KeepsPayload::new(body, held))
        }))
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::StatusCode;
    use actix_web::test as http_test;
    use actix_web::{App, HttpResponse, web};

    use super::{Gate, V1, under_v1};
    use crate::auth::ApiTokens;
    use crate::config::Secret;

    #[test]
    fn the_v1_scope_is_its_prefix_whole() {
        for path in ["/v1", "/v1/", "/v1/claims/k", "/v1//x"] {
            assert!(under_v1(path), "{path}");
        }
        for path in [
            "/",
            "/v10",
            "/v1claims",
            "/V1/claims",
            "//v1/claims",
            "/ingest/v1",
        ] {
            assert!(!under_v1(path), "{path}");
        }
    }

    /// The gate checks a request as `/v1` exactly when actix's router
    /// serves it from the `/v1` scope, however its path is spelled: a
    /// request the scope serves without a token would be a way around it.
    #[actix_web::test]
    async fn the_gate_checks_exactly_what_the_router_serves_as_v1() {
        const TOKEN: &str = "gate-test-token-0123456789";
        let app = http_test::init_service(
            App::new()
                .wrap(Gate)
                .app_data(web::Data::new(ApiTokens::new(&[Secret::new(TOKEN)])))
                .service(
                    web::scope(V1)
                        .default_service(web::to(|| async { HttpResponse::Ok().body("v1") })),
                )
                .default_service(web::to(|| async { HttpResponse::ImATeapot().finish() })),
        )
        .await;
        let paths = [
            "/v1",
            "/v1/",
            "/v1//x",
            "/v1/x",
            "/%76%31",
            "/%76%31/x",
            "/v%31/x",
            "/V1/x",
            "/v1%2Fx",
            "/v1%2fx",
            "/%2Fv1/x",
            "//v1/x",
            "/v1;x",
            "/v1%3Bx",
            "/v1%FF/x",
            "/%FFv1/x",
            "/v10",
            "/v1?x=1",
            "/v1x",
            "http://127.0.0.1/%76%31/x",
            "http://127.0.0.1/v1",
            "/%2576%2531/x",
        ];
        let mut served = 0;
        for path in paths {
            let bare =
                http_test::call_service(&app, http_test::TestRequest::get().uri(path).to_request())
                    .await
                    .status();
            let res = http_test::call_service(
                &app,
                http_test::TestRequest::get()
                    .uri(path)
                    .insert_header(("authorization", format!("Bearer {TOKEN}")))
                    .to_request(),
            )
            .await;
            let by_scope =
                res.status() == StatusCode::OK && http_test::read_body(res).await.as_ref() == b"v1";
            served += usize::from(by_scope);
            assert_eq!(
                bare == StatusCode::UNAUTHORIZED,
                by_scope,
                "{path}: without a token {bare}; the scope serves it: {by_scope}"
            );
        }
        assert!(served >= 8, "the scope served only {served} of the paths");
    }
}
