//! An HTTP client for tests, built the way dedupd builds its own (TLS on
//! ring: reqwest itself brings no crypto provider).

/// A client with reqwest's defaults.
pub fn client() -> reqwest::Client {
    dedupd::http_client::builder().build().expect("HTTP client")
}
