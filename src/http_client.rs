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

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// A client built here speaks TLS on ring: its first bytes to an
    /// `https` URL are a TLS handshake record (and building it does not
    /// panic for want of a provider).
    #[tokio::test]
    async fn an_https_request_opens_with_a_tls_client_hello() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = builder().no_proxy().build().unwrap();
        let request = tokio::spawn(async move {
            client
                .post(format!("https://127.0.0.1:{port}/hooks"))
                .send()
                .await
        });
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = [0u8; 3];
        socket.read_exact(&mut head).await.unwrap();
        // A handshake record (0x16) of TLS 1.x (0x03 0x01 in a ClientHello).
        assert_eq!(head, [0x16, 0x03, 0x01]);
        drop(socket);
        assert!(request.await.unwrap().is_err());
    }
}
