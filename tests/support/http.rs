//! An HTTP client for tests, built the way dedupd builds its own (TLS on
//! ring: reqwest itself brings no crypto provider).

/// A client with reqwest's defaults.
pub fn client() -> reqwest::Client {
    dedupd::http_client::builder().build().expect("HTTP client")
}

/// `GET path` of the dedupd serving on `port`, as JSON.
pub async fn api(port: u16, path: &str) -> serde_json::Value {
    client()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// An event of source `sume` as the dedupd on `port` shows it.
pub async fn shown(port: u16, id: &str) -> serde_json::Value {
    api(port, &format!("/v1/sources/sume/events/{id}")).await
}
