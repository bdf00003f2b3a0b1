//! Starting the real application on port 0 with a temp data dir and a
//! manual clock.

use std::sync::Arc;
use std::time::Duration;

use dedupd::clock::ManualClock;
use dedupd::config::Loaded;
use dedupd::config::Secret;
use dedupd::config::Settings;
use dedupd::gateway::delivery::Coordination;
use dedupd::startup::Application;
use dedupd::startup::StopHandle;
use dedupd::store::CommitMetrics;
use dedupd::store::Opened;
use dedupd::store::Store;
use dedupd::store::redb::RedbOptions;
use dedupd::store::redb::RedbStore;
use reqwest::Response;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;
use tempfile::TempDir;
use tokio::task::JoinHandle;
/// The clock's starting point in tests: an ordinary 2027 instant.
pub const T0: u64 = 1_800_000_000_000;

/// A running app and what a test needs to talk to it.
pub struct TestApp {
    /// `http://127.0.0.1:{port}`.
    pub address: String,
    /// The HTTP client.
    pub client: reqwest::Client,
    /// The app's clock; move it to expire things.
    pub clock: ManualClock,
    /// The app's store, for reaper tests.
    pub store: Arc<dyn Store>,
    /// What the systemd watchdog checks.
    pub liveness: dedupd::systemd::Liveness,
    /// The settings it runs with.
    pub loaded: Loaded,
    /// The data directory, kept across restarts.
    pub dir: Arc<TempDir>,
    /// Bearer token sent with every `/v1` request, if any.
    pub token: Option<String>,
    /// The Redis-protocol listener's port, when `resp.listen` is set.
    pub resp_port: Option<u16>,
    /// What SIGHUP calls in `serve`.
    pub reloader: dedupd::reload::Reloader,
    handle: StopHandle,
    join: JoinHandle<std::io::Result<()>>,
}

/// Default test settings in `dir`: loopback port 0, one worker.
pub fn test_settings(dir: &TempDir) -> Loaded {
    let mut settings = Settings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        data_path: dir.path().join("dedupd.redb"),
        ..Settings::default()
    };
    settings.http.workers = 1;
    settings.storage.cache_bytes = 4 * 1024 * 1024;
    settings.http.shutdown_timeout = Duration::from_secs(5);
    Loaded::new(settings)
}

/// Starts an app whose clock stands at `clock` (moved by hand), after
/// `tweak` adjusts the settings.
pub async fn spawn_app_at(clock: ManualClock, tweak: impl FnOnce(&mut Loaded)) -> TestApp {
    let dir = Arc::new(TempDir::new().expect("temp dir"));
    let mut loaded = test_settings(&dir);
    tweak(&mut loaded);
    start(loaded, dir, clock).await
}

/// Starts an app with default test settings.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Starts an app after `tweak` adjusts the settings.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Loaded)) -> TestApp {
    let dir = Arc::new(TempDir::new().expect("temp dir"));
    let mut loaded = test_settings(&dir);
    tweak(&mut loaded);
    start(loaded, dir, ManualClock::new(T0)).await
}

/// Starts an app on a data file whose storage fails as `plan` says (the
/// embedded store, as `serve` runs it otherwise).
pub async fn spawn_faulty_app_with(
    tweak: impl FnOnce(&mut Loaded),
    plan: Arc<dedupd::store::redb::faults::FaultPlan>,
) -> TestApp {
    spawn_over_file(tweak, Some(plan), |opened| (opened, Coordination::Inbox))
}

/// Starts an app whose claims and stream heads go through `wrap(the data
/// file's claims)`, with delivery coordinated as with a store several
/// instances share (Redis): stream leases and event claims in that store.
pub async fn spawn_shared_app_with(
    tweak: impl FnOnce(&mut Loaded),
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
) -> TestApp {
    spawn_over_file(tweak, None, |opened| {
        let claims = wrap(opened.file.clone());
        let coordination = Coordination::Shared(claims.clone());
        (Opened { claims, ..opened }, coordination)
    })
}

/// Opens the data file itself (with `faults`, if any) and builds the app
/// over the handles and coordination `pick` makes of it.
pub(crate) fn spawn_over_file(
    tweak: impl FnOnce(&mut Loaded),
    faults: Option<Arc<dedupd::store::redb::faults::FaultPlan>>,
    pick: impl FnOnce(Opened) -> (Opened, Coordination),
) -> TestApp {
    let dir = Arc::new(TempDir::new().expect("temp dir"));
    let mut loaded = test_settings(&dir);
    tweak(&mut loaded);
    let clock = ManualClock::new(T0);
    let mut opts = RedbOptions::from_settings(&loaded.settings, CommitMetrics::default());
    opts.faults = faults;
    let file = RedbStore::open(&opts).expect("open store");
    let (opened, coordination) = pick(Opened::embedded(file));
    let app = Application::build_with_store(
        loaded.clone(),
        Arc::new(clock.clone()),
        opened,
        coordination,
    )
    .expect("build app");
    running(app, loaded, dir, clock)
}

pub(crate) async fn start(loaded: Loaded, dir: Arc<TempDir>, clock: ManualClock) -> TestApp {
    let app = Application::build(loaded.clone(), Arc::new(clock.clone()))
        .await
        .expect("build app");
    running(app, loaded, dir, clock)
}

pub(crate) fn running(
    app: Application,
    loaded: Loaded,
    dir: Arc<TempDir>,
    clock: ManualClock,
) -> TestApp {
    let address = format!("http://127.0.0.1:{}", app.port());
    let resp_port = app.resp_port();
    let handle = app.handle();
    let store = app.store();
    let liveness = app.liveness();
    let reloader = app.reloader();
    let join = tokio::spawn(app.run_until_stopped());
    let token = loaded.api_tokens.first().map(|t| t.expose().to_owned());
    TestApp {
        address,
        client: dedupd::http_client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client"),
        clock,
        store,
        liveness,
        loaded,
        dir,
        token,
        resp_port,
        reloader,
        handle,
        join,
    }
}

/// Starts a stopped app again (see [`TestApp::stop`]), perhaps with
/// changed settings, on the same data file and clock.
pub async fn start_again(mut loaded: Loaded, dir: Arc<TempDir>, clock: ManualClock) -> TestApp {
    loaded.settings.listen = "127.0.0.1:0".parse().expect("addr");
    if loaded.settings.resp.listen.is_some() {
        loaded.settings.resp.listen = Some("127.0.0.1:0".parse().expect("addr"));
    }
    start(loaded, dir, clock).await
}

/// Adds API tokens to the settings.
pub fn with_tokens(loaded: &mut Loaded, tokens: &[&str]) {
    loaded.api_tokens = tokens.iter().map(|t| Secret::new(*t)).collect();
}

/// Adds read-only API tokens to the settings.
pub fn with_read_tokens(loaded: &mut Loaded, tokens: &[&str]) {
    loaded.api_read_tokens = tokens.iter().map(|t| Secret::new(*t)).collect();
}

impl TestApp {
    /// The settings `test_settings` gives, as a configuration file's
    /// lines: what a reload finds unchanged (it names the others as
    /// needing a restart). `rest` follows (tables: sources, `[api]`).
    pub fn config_file(&self, rest: &str) -> String {
        let s = &self.loaded.settings;
        format!(
            "listen = {:?}\ndata_path = {:?}\n\n[http]\nworkers = {}\nshutdown_timeout = \"{}s\"\n\n\
             [storage]\ncache_bytes = {}\n\n{rest}",
            s.listen.to_string(),
            s.data_path.display().to_string(),
            s.http.workers,
            s.http.shutdown_timeout.as_secs(),
            s.storage.cache_bytes,
        )
    }

    /// Writes [`TestApp::config_file`] with `rest` as the app's
    /// configuration file and reloads from it as SIGHUP does in `serve`
    /// (the same call, off the async threads). A `DEDUPD_*` variable in
    /// the tests' environment is read too, as `serve` would.
    pub async fn reload(
        &self,
        rest: &str,
    ) -> Result<dedupd::reload::Reloaded, dedupd::config::ConfigErrors> {
        let path = self.dir.path().join("dedupd.toml");
        std::fs::write(&path, self.config_file(rest)).expect("write the configuration");
        let reloader = self.reloader.clone();
        tokio::task::spawn_blocking(move || reloader.reload(Some(&path)))
            .await
            .expect("the reload ran")
    }

    /// Stops gracefully and waits until the store is closed.
    pub async fn stop(self) -> (Loaded, Arc<TempDir>, ManualClock) {
        drop(self.store);
        self.handle.stop(true).await;
        self.join.await.expect("join").expect("server result");
        (self.loaded, self.dir, self.clock)
    }

    /// Stops and starts again on the same data file and clock.
    pub async fn restart(self) -> TestApp {
        let (loaded, dir, clock) = self.stop().await;
        start_again(loaded, dir, clock).await
    }

    /// Full URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// A request builder with the bearer token set.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.client.request(method, self.url(path));
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// `GET path`, its body as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        self.request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `POST /v1/claims/{key}` with a JSON body.
    pub async fn claim(&self, key: &str, body: Value) -> Response {
        self.request(reqwest::Method::POST, &claim_path(key))
            .json(&body)
            .send()
            .await
            .expect("claim")
    }

    /// Claims `key` and returns the token, asserting a 201.
    pub async fn claim_ok(&self, key: &str, body: Value) -> (String, u64, u64) {
        let res = self.claim(key, body).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let v: Value = res.json().await.expect("json");
        (
            v["token"].as_str().expect("token").to_owned(),
            v["fence"].as_u64().expect("fence"),
            v["expires_at_ms"].as_u64().expect("expiry"),
        )
    }

    /// `POST /v1/claims/{key}/done`.
    pub async fn done(&self, key: &str, body: Value) -> Response {
        self.request(reqwest::Method::POST, &format!("{}/done", claim_path(key)))
            .json(&body)
            .send()
            .await
            .expect("done")
    }

    /// `POST /v1/claims/{key}/extend`.
    pub async fn extend(&self, key: &str, body: Value) -> Response {
        self.request(
            reqwest::Method::POST,
            &format!("{}/extend", claim_path(key)),
        )
        .json(&body)
        .send()
        .await
        .expect("extend")
    }

    /// `DELETE /v1/claims/{key}`.
    pub async fn release(&self, key: &str, token: &str) -> Response {
        self.request(reqwest::Method::DELETE, &claim_path(key))
            .json(&json!({ "token": token }))
            .send()
            .await
            .expect("release")
    }

    /// `GET /v1/claims/{key}`.
    pub async fn get(&self, key: &str) -> Response {
        self.request(reqwest::Method::GET, &claim_path(key))
            .send()
            .await
            .expect("get")
    }

    /// `POST /v1/streams/{stream}/apply`.
    pub async fn apply(&self, stream: &str, event_id: &str, created_at: &str) -> Response {
        self.request(
            reqwest::Method::POST,
            &format!("/v1/streams/{}/apply", urlencoding::encode(stream)),
        )
        .json(&json!({ "event_id": event_id, "created_at": created_at }))
        .send()
        .await
        .expect("apply")
    }

    /// Applies and returns the parsed answer, asserting a 200.
    pub async fn apply_ok(&self, stream: &str, event_id: &str, created_at: &str) -> Value {
        let res = self.apply(stream, event_id, created_at).await;
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.expect("json")
    }

    /// `GET /v1/streams/{stream}`.
    pub async fn head(&self, stream: &str) -> Response {
        self.request(
            reqwest::Method::GET,
            &format!("/v1/streams/{}", urlencoding::encode(stream)),
        )
        .send()
        .await
        .expect("head")
    }
}

/// `/v1/claims/{key}` with the key percent-encoded.
pub fn claim_path(key: &str) -> String {
    format!("/v1/claims/{}", urlencoding::encode(key))
}

/// Asserts `res` is a problem document with `status` and `code`; returns it.
pub async fn assert_problem(res: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(res.status(), status, "status");
    let ct = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(ct, "application/problem+json");
    let v: Value = res.json().await.expect("problem json");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["status"], status.as_u16());
    assert_eq!(v["type"], format!("urn:dedupd:problem:{code}"));
    v
}

impl TestApp {
    /// Runs `window` (given its attempt, 0 to 2) until one run of it made
    /// the writer commit nothing; the commit count of that run, or `None`
    /// if all three committed. The dispatcher reads the inbox once more
    /// after the turn that leased an event (the ingest's wake-up is still
    /// stored), and on a loaded machine that read can land inside a window
    /// and commit what the writer holds; a read on every quiet poll commits
    /// in every window.
    pub async fn window_without_commits<F, Fut>(&self, mut window: F) -> Option<u64>
    where
        F: FnMut(usize) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        for attempt in 0..3 {
            let before = self.store.write_stats().commits;
            window(attempt).await;
            if self.store.write_stats().commits == before {
                return Some(before);
            }
        }
        None
    }
}
