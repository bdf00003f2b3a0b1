//! Bearer-token authentication for `/v1/*`.
//!
//! Tokens are compared as SHA-256 digests in constant time, and every
//! configured token is compared, so neither timing nor length reveals which
//! token (or how much of one) matched.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::web;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Secret;
use crate::error::ApiError;

/// The accepted tokens, as digests. Empty: no authentication.
#[derive(Debug, Clone, Default)]
pub struct ApiTokens {
    digests: Vec<[u8; 32]>,
}

impl ApiTokens {
    /// Digests of `tokens`.
    pub fn new(tokens: &[Secret]) -> Self {
        Self {
            digests: tokens.iter().map(|t| digest(t.expose())).collect(),
        }
    }

    /// True when no token is configured.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `presented` is one of the tokens.
    pub fn accepts(&self, presented: &str) -> bool {
        let d = digest(presented);
        self.digests
            .iter()
            .fold(subtle::Choice::from(0), |acc, t| acc | t.ct_eq(&d))
            .into()
    }
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Middleware: with tokens configured, requires `Authorization: Bearer <token>`.
pub async fn require_bearer(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let allowed = match req.app_data::<web::Data<ApiTokens>>() {
        // Fail closed: a route wired without its token set refuses
        // everyone rather than letting everyone in.
        None => {
            tracing::error!("bearer auth has no token set in the app state: refusing the request");
            false
        }
        // No tokens configured: open, which startup allows on loopback only.
        Some(tokens) if tokens.is_empty() => true,
        Some(tokens) => req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            // The scheme name is case-insensitive (RFC 9110, 11.1).
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .is_some_and(|(_, t)| tokens.accepts(t.trim())),
    };
    if !allowed {
        return Err(ApiError::Unauthorized.into());
    }
    next.call(req).await
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
        assert!(t.accepts("first-token-abcdefgh"));
        assert!(t.accepts("second-token-abcdefg"));
        assert!(!t.accepts("first-token-abcdefg"));
        assert!(!t.accepts(""));
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
