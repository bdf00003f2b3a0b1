//! Who may use the API, and how often a peer may fail to prove it.
//!
//! - Bearer tokens on `/v1/*` and `/metrics`: full tokens (`api.tokens`)
//!   may do everything; read-only tokens (`api.read_tokens`) only `GET` and
//!   `HEAD` (the console's views and listings, and `/metrics`), and not the
//!   Redis protocol. Tokens are compared as SHA-256 digests in constant
//!   time, and every configured token is compared, so neither timing nor
//!   length reveals which token (or how much of one) matched.
//! - [`limiter`]: failed authentications per peer, shared by every port.
//! - [`browser`]: what keeps a web page the operator visits from using the
//!   API (the `Host` and `Origin` checks, JSON bodies only).

pub mod browser;
pub mod limiter;

use std::sync::Arc;

use actix_web::ResponseError;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, header};
use actix_web::middleware::Next;
use actix_web::web;
use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

pub use self::limiter::{AuthLimiter, AuthPort, Peer, RetryAfter};
use crate::config::Secret;
use crate::error::ApiError;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `GET` and `HEAD` over HTTP; no Redis protocol.
    ReadOnly,
    /// Everything.
    Full,
}

/// A token's digest and what it may do.
type Digests = Vec<([u8; 32], Access)>;

/// The accepted tokens, as digests, and the limiter of failed attempts.
/// Empty: no authentication (which startup allows on loopback only).
/// Clones share both: a reload's [`ApiTokens::replace`] reaches every port.
#[derive(Debug, Clone, Default)]
pub struct ApiTokens {
    /// Read once per check: a request is judged against one set, the one
    /// in force when it was looked at.
    digests: Arc<ArcSwap<Digests>>,
    limiter: Arc<AuthLimiter>,
}

impl ApiTokens {
    /// Full-access `tokens`, with a limiter on the system clock that counts
    /// nothing in metrics (see [`ApiTokens::with_limiter`]).
    pub fn new(tokens: &[Secret]) -> Self {
        Self {
            digests: Arc::new(ArcSwap::from_pointee(digests(tokens, &[]))),
            limiter: Arc::default(),
        }
    }

    /// Adds read-only `tokens`.
    pub fn with_read_only(self, tokens: &[Secret]) -> Self {
        let mut all = Digests::clone(&self.digests.load());
        all.extend(digests(&[], tokens));
        self.digests.store(Arc::new(all));
        self
    }

    /// Makes `full` and `read_only` the accepted tokens, on every clone (a
    /// reload). A request already past its check goes on; every later one,
    /// and every later `AUTH`, is checked against these. A Redis-protocol
    /// connection that authenticated stays so (authentication is per
    /// connection, checked once). The limiter's counts stay.
    pub fn replace(&self, full: &[Secret], read_only: &[Secret]) {
        self.digests.store(Arc::new(digests(full, read_only)));
    }

    /// Counts failures in `limiter` (the app's, shared by every port).
    pub fn with_limiter(mut self, limiter: Arc<AuthLimiter>) -> Self {
        self.limiter = limiter;
        self
    }

    /// True when no token of either kind is configured.
    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    /// What `presented` may do, if it is one of the tokens.
    pub fn access(&self, presented: &str) -> Option<Access> {
        self.snapshot().access(presented)
    }

    /// The tokens in force now, for every check of one request: a reload
    /// in between does not make a request judged by two sets.
    pub fn snapshot(&self) -> TokenSnapshot<'_> {
        TokenSnapshot {
            tokens: self,
            digests: self.digests.load(),
        }
    }

    /// Whether `presented` is a full-access token: the Redis protocol's
    /// `AUTH` takes only those (every RESP connection may write).
    pub fn grants_full(&self, presented: &str) -> bool {
        self.access(presented) == Some(Access::Full)
    }

    /// The limiter of failed attempts, for every port that takes a token.
    pub fn limiter(&self) -> &AuthLimiter {
        &self.limiter
    }
}

/// The token set in force when a request was looked at
/// ([`ApiTokens::snapshot`]).
#[derive(Debug)]
pub struct TokenSnapshot<'a> {
    tokens: &'a ApiTokens,
    digests: arc_swap::Guard<Arc<Digests>>,
}

impl TokenSnapshot<'_> {
    /// True when no token of either kind is configured.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// What `presented` may do, if it is one of the tokens: every token is
    /// compared, in constant time.
    pub fn access(&self, presented: &str) -> Option<Access> {
        let d = digest(presented);
        let (mut full, mut read) = (Choice::from(0), Choice::from(0));
        for (t, access) in self.digests.iter() {
            let hit = t.ct_eq(&d);
            let is_full = Choice::from(u8::from(*access == Access::Full));
            full |= hit & is_full;
            read |= hit & !is_full;
        }
        if bool::from(full) {
            Some(Access::Full)
        } else if bool::from(read) {
            Some(Access::ReadOnly)
        } else {
            None
        }
    }
}

/// The digests of `full` and `read_only` tokens.
fn digests(full: &[Secret], read_only: &[Secret]) -> Digests {
    full.iter()
        .map(|t| (digest(t.expose()), Access::Full))
        .chain(
            read_only
                .iter()
                .map(|t| (digest(t.expose()), Access::ReadOnly)),
        )
        .collect()
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// The methods a read-only token may use.
fn reads_only(method: &Method) -> bool {
    *method == Method::GET || *method == Method::HEAD
}

/// Middleware: with tokens configured, requires `Authorization: Bearer
/// <token>`, a full one for anything but `GET` and `HEAD`. A peer over the
/// limiter's count of failures gets 429 without its token being looked at.
/// For routes outside `/v1` (`crate::gate` checks `/v1` itself).
pub async fn require_bearer<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let verdict = {
        let tokens = req.app_data::<web::Data<ApiTokens>>().map(|t| t.snapshot());
        authorize(tokens.as_ref(), &req)
    };
    match verdict {
        Ok(()) => Ok(next.call(req).await?.map_into_left_body()),
        Err(e) => Ok(refuse(req, &e)),
    }
}

/// Answers `req` with `e` from a middleware. An answer, not an error, so
/// the request log and its histogram count it like any other.
pub(crate) fn refuse<B>(req: ServiceRequest, e: &ApiError) -> ServiceResponse<EitherBody<B>> {
    req.into_response(e.error_response()).map_into_right_body()
}

/// [`require_bearer`]'s decision, against `tokens`: the app's token set
/// as the request found it (`None` when the app has none in its state).
pub(crate) fn authorize(
    tokens: Option<&TokenSnapshot<'_>>,
    req: &ServiceRequest,
) -> Result<(), ApiError> {
    let Some(tokens) = tokens else {
        // Fail closed: a route wired without its token set refuses
        // everyone rather than letting everyone in.
        tracing::error!("bearer auth has no token set in the app state: refusing the request");
        return Err(ApiError::Unauthorized);
    };
    // No tokens configured: open, which startup allows on loopback only
    // (and `browser::check_host` keeps to loopback names).
    if tokens.is_empty() {
        return Ok(());
    }
    let peer = req.peer_addr().map(|a| a.ip());
    if let Some(ip) = peer {
        tokens
            .tokens
            .limiter()
            .allow(AuthPort::Http, ip)
            .map_err(|r| ApiError::AuthThrottled { retry_after: r })?;
    }
    let authorization = req.headers().get(header::AUTHORIZATION);
    let access = authorization
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        // The scheme name is case-insensitive (RFC 9110, 11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .and_then(|(_, t)| tokens.access(t.trim()));
    match access {
        None => {
            // A request without credentials guesses nothing: only a
            // credential that fails counts against the peer.
            if let (Some(ip), Some(_)) = (peer, authorization) {
                tokens.tokens.limiter().failed(AuthPort::Http, ip);
            }
            Err(ApiError::Unauthorized)
        }
        Some(Access::ReadOnly) if !reads_only(req.method()) => Err(ApiError::ReadOnlyToken {
            method: req.method().to_string(),
        }),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_configured_tokens_are_accepted() {
        let t = ApiTokens::new(&[
            Secret::new("first-token-abcdefgh"),
            Secret::new("second-token-abcdefg"),
        ]);
        assert_eq!(t.access("first-token-abcdefgh"), Some(Access::Full));
        assert_eq!(t.access("second-token-abcdefg"), Some(Access::Full));
        assert_eq!(t.access("first-token-abcdefg"), None);
        assert_eq!(t.access(""), None);
    }

    #[test]
    fn a_read_only_token_reads_and_is_no_redis_password() {
        let t = ApiTokens::new(&[Secret::new("first-token-abcdefgh")])
            .with_read_only(&[Secret::new("reader-token-abcdefg")]);
        assert_eq!(t.access("reader-token-abcdefg"), Some(Access::ReadOnly));
        assert!(!t.grants_full("reader-token-abcdefg"));
        assert!(t.grants_full("first-token-abcdefgh"));
        assert!(
            !ApiTokens::new(&[])
                .with_read_only(&[Secret::new("reader-token-abcdefg")])
                .is_empty()
        );
    }

    async fn status_of(app_tokens: Option<ApiTokens>, bearer: Option<&str>) -> u16 {
        use actix_web::{App, HttpResponse, middleware::from_fn, test};
        let mut app = App::new();
        if let Some(t) = app_tokens {
            app = app.app_data(web::Data::new(t));
        }
        let app = test::init_service(
            app.wrap(from_fn(require_bearer))
                .route("/x", web::get().to(HttpResponse::Ok)),
        )
        .await;
        let mut req = test::TestRequest::get().uri("/x");
        if let Some(b) = bearer {
            req = req.insert_header((header::AUTHORIZATION, format!("Bearer {b}")));
        }
        match test::try_call_service(&app, req.to_request()).await {
            Ok(res) => res.status().as_u16(),
            Err(e) => e.as_response_error().status_code().as_u16(),
        }
    }

    #[actix_web::test]
    async fn without_its_token_set_the_middleware_refuses_everyone() {
        assert_eq!(status_of(None, None).await, 401);
        assert_eq!(status_of(None, Some("first-token-abcdefgh")).await, 401);
    }

    #[actix_web::test]
    async fn with_tokens_only_a_configured_bearer_passes_and_without_tokens_all_do() {
        let tokens = || ApiTokens::new(&[Secret::new("first-token-abcdefgh")]);
        assert_eq!(
            status_of(Some(tokens()), Some("first-token-abcdefgh")).await,
            200
        );
        assert_eq!(
            status_of(Some(tokens()), Some("nope-nope-nope-nope")).await,
            401
        );
        assert_eq!(status_of(Some(tokens()), None).await, 401);
        assert_eq!(status_of(Some(ApiTokens::new(&[])), None).await, 200);
    }
}
