//! How dedupd builds an HTTP client (delivery, the operator CLI): reqwest
//! over rustls with the ring crypto provider, installed once per process.
//!
//! ring, not reqwest's default aws-lc-rs: aws-lc-sys's build script (a C
//! build of AWS-LC) took 32 s of a 5 min 53 s cold `cargo test` on the
//! 2-core VM, ring's a few seconds (docs/development.md, "A cold build").
//! Both give the same TLS 1.2 and 1.3 suites to a destination.

use std::sync::Once;

/// A reqwest client builder whose TLS runs on ring. Use it for every
/// client: reqwest built without a provider of its own panics on `build`
/// when none is installed.
pub fn builder() -> reqwest::ClientBuilder {
    install_crypto();
    reqwest::Client::builder()
}

/// Installs ring as the process's rustls provider, once (a provider
/// installed before stays).
pub fn install_crypto() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
