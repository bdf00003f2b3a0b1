//! The ports a client authenticates on with a token. The limiter in
//! `auth` counts failures per port, and the metrics label them.

/// The port an authentication attempt came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthPort {
    /// The HTTP API and `/metrics`.
    Http = 0,
    /// The Redis-protocol listener (`AUTH`, `HELLO … AUTH`).
    Resp = 1,
}

impl AuthPort {
    /// Every port, each at its discriminant.
    pub const ALL: [AuthPort; 2] = [AuthPort::Http, AuthPort::Resp];

    /// The `port` label value.
    pub fn label(self) -> &'static str {
        match self {
            AuthPort::Http => "http",
            AuthPort::Resp => "resp",
        }
    }
}
