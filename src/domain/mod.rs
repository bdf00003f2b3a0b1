//! Parsed domain types. Input is parsed into these at the HTTP boundary, so
//! handlers and the store only ever see valid values.

mod auth_port;
mod claim_result;
mod created_at;
pub mod durability;
mod fingerprint;
mod key;
pub mod rate;
mod retry_after;
mod scheme;
mod source_name;
mod token;
mod ttl;

pub use auth_port::AuthPort;
pub use claim_result::{
    BadResult, ClaimResult, DEFAULT_MAX_RESULT_BYTES, MAX_RESULT_BYTES_LIMIT, MAX_RESULT_DEPTH,
    ResultTooLarge,
};
pub use created_at::{CreatedAt, CreatedAtFormat};
pub use durability::Durability;
pub use fingerprint::Fingerprint;
pub use key::{Key, MAX_KEY_BYTES, Namespace, ScopedKey};
pub use rate::Rate;
pub use retry_after::RetryAfter;
pub use scheme::{ALL_SCHEMES, Scheme};
pub use source_name::valid_source_name;
pub use token::Token;
pub use ttl::{Ttl, TtlBounds};

/// Why a piece of input could not be parsed into a domain type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Invalid {
    /// Stable machine-readable code, such as `invalid_key`.
    pub code: &'static str,
    /// The field or path parameter that was wrong, as the client named it.
    pub field: &'static str,
    /// What was expected, in words.
    pub reason: String,
    /// The largest value `field` takes, when it was over it: a client
    /// reads it instead of the reason's words.
    pub maximum: Option<u64>,
}

impl Invalid {
    /// An `Invalid` for `field` with the given code and reason.
    pub fn new(code: &'static str, field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            code,
            field,
            reason: reason.into(),
            maximum: None,
        }
    }

    /// The same, naming `maximum`, the largest value `field` takes.
    pub fn at_most(self, maximum: u64) -> Self {
        Self {
            maximum: Some(maximum),
            ..self
        }
    }
}
