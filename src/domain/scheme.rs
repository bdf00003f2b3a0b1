//! The signature schemes dedupd verifies, by the name a source's `scheme`
//! setting gives them. The verifiers are in `gateway::signature`.

use serde::{Deserialize, Serialize};

/// A provider's signature scheme, as named in a source's `scheme` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// `X-Sume-Timestamp` and `X-Sume-Signature: v1=<hex>` over `"{timestamp}.{body}"`.
    Sume,
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>` over `"{id}.{timestamp}.{body}"`.
    StandardWebhooks,
    /// `Stripe-Signature: t=<ts>,v1=<hex>` over `"{t}.{body}"`.
    Stripe,
    /// `X-Hub-Signature-256: sha256=<hex>` over the body, without a timestamp.
    Github,
    /// `X-Slack-Request-Timestamp` and `X-Slack-Signature: v0=<hex>` over `"v0:{ts}:{body}"`.
    Slack,
    /// `X-Shopify-Hmac-Sha256: <base64>` over the body, without a timestamp.
    Shopify,
    /// Paddle Billing: `Paddle-Signature: ts=<ts>;h1=<hex>` over `"{ts}:{body}"`.
    Paddle,
    /// Standard Webhooks under Svix's header names (`svix-id`,
    /// `svix-timestamp`, `svix-signature`): Clerk, Resend and others.
    Svix,
    /// `x-square-hmacsha256-signature: <base64>` over the notification URL
    /// followed by the body, without a timestamp.
    Square,
    /// `x-zm-request-timestamp` and `x-zm-signature: v0=<hex>` over `"v0:{ts}:{body}"`.
    Zoom,
    /// `Linear-Signature: <hex>` over the body; the body's `webhookTimestamp`
    /// (milliseconds) is checked against the tolerance.
    Linear,
}

/// Every scheme, in the order the docs list them.
pub const ALL_SCHEMES: [Scheme; 11] = [
    Scheme::Sume,
    Scheme::StandardWebhooks,
    Scheme::Stripe,
    Scheme::Github,
    Scheme::Slack,
    Scheme::Shopify,
    Scheme::Paddle,
    Scheme::Svix,
    Scheme::Square,
    Scheme::Zoom,
    Scheme::Linear,
];

impl Scheme {
    /// Whether its signatures carry a timestamp that `tolerance` bounds.
    /// Without one, a captured request verifies forever.
    pub fn signs_timestamp(self) -> bool {
        !matches!(self, Scheme::Github | Scheme::Shopify | Scheme::Square)
    }

    /// Whether its secrets are `whsec_<base64>` keys (else they are used
    /// as text).
    pub fn base64_secrets(self) -> bool {
        matches!(self, Scheme::StandardWebhooks | Scheme::Svix)
    }

    /// The name as written in a source's `scheme` setting.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Sume => "sume",
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
            Scheme::Slack => "slack",
            Scheme::Shopify => "shopify",
            Scheme::Paddle => "paddle",
            Scheme::Svix => "svix",
            Scheme::Square => "square",
            Scheme::Zoom => "zoom",
            Scheme::Linear => "linear",
        }
    }
}
