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
}

impl Scheme {
    /// Whether its signatures carry a timestamp that `tolerance` bounds.
    /// Without one, a captured request verifies forever.
    pub fn signs_timestamp(self) -> bool {
        !matches!(self, Scheme::Github)
    }

    /// The name as written in a source's `scheme` setting.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Sume => "sume",
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
        }
    }
}
