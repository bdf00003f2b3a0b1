//! A real Chromium, driven over WebDriver: each test starts its own
//! chromedriver on a free port, which starts a headless Chromium with a
//! fresh profile. Waits poll the page for a condition, up to a bound; no
//! test sleeps for a fixed time and hopes.

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use tempfile::TempDir;

/// How long a wait for the page lasts before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(50);

/// What to install when the browser or its driver is missing.
const INSTALL_HINT: &str = "the browser tests need Chromium and its WebDriver: on Debian \
    `apt-get install chromium chromium-driver` (.ci/run installs them when missing), or set \
    CHROMIUM and CHROMEDRIVER to their paths";

/// Chromium flags for a headless run as root on a machine without a
/// network: no sandbox (root), and nothing that phones home (the closed
/// network refuses those connections, and Chromium retries them).
const CHROMIUM_ARGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
];

/// A running chromedriver and the browser session it holds.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    /// chromedriver, leader of its own process group (Chromium's too).
    driver: Child,
    /// The browser profile, fresh for each test.
    _profile: TempDir,
}

/// `$env`, or the first of `names` found on the `PATH`.
fn find_tool(env: &str, names: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in names {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!("{} not found: {INSTALL_HINT}", names[0]);
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    pub async fn start() -> Self {
        use std::os::unix::process::CommandExt;
        let chromium = find_tool("CHROMIUM", &["chromium", "chromium-browser"]);
        let chromedriver = find_tool("CHROMEDRIVER", &["chromedriver"]);
        let profile = TempDir::new().unwrap();
        let port = crate::support::ports::free_port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                profile.path().join("chromedriver.log").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so Drop can end Chromium with it.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}; {INSTALL_HINT}",
                    chromedriver.display()
                )
            });
        let mut browser_args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| (*a).to_owned()).collect();
        browser_args.push(format!(
            "--user-data-dir={}",
            profile.path().join("profile").display()
        ));
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "binary": chromium, "args": browser_args }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + WAIT;
        // chromedriver takes a moment to listen: try until it answers.
        let client = loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(POLL).await;
                }
                Err(e) => panic!(
                    "no WebDriver session from {} with {}: {e}; {INSTALL_HINT}",
                    chromedriver.display(),
                    chromium.display()
                ),
            }
        };
        Self {
            client,
            driver,
            _profile: profile,
        }
    }

    /// Ends the session (Chromium exits) and chromedriver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: chromedriver and any Chromium it left behind.
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.wait();
    }
}

/// Runs `test` with a fresh browser, and ends the browser whether the test
/// passed or panicked (then the panic goes on).
pub async fn in_browser<F, Fut>(test: F)
where
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let browser = Browser::start().await;
    let outcome = tokio::spawn(test(browser.client.clone())).await;
    browser.close().await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Waits on the page: each look is one WebDriver round trip, repeated until
/// the condition holds or [`WAIT`] passes.
pub trait Page {
    /// The text of the first element matching `css`, if there is one.
    fn text_of(&self, css: &str) -> impl Future<Output = Option<String>> + Send;
    /// Waits until an element matches `css`.
    fn element(&self, css: &str) -> impl Future<Output = Element> + Send;
    /// Waits until the text of `css` satisfies `want`, described as `what`.
    fn until_text(
        &self,
        css: &str,
        what: &str,
        want: impl Fn(&str) -> bool + Send,
    ) -> impl Future<Output = String> + Send;
    /// Waits until the JavaScript expression `js` is true.
    fn until_js(&self, js: &str, what: &str) -> impl Future<Output = ()> + Send;
}

impl Page for Client {
    async fn text_of(&self, css: &str) -> Option<String> {
        let el = self.find(Locator::Css(css)).await.ok()?;
        el.text().await.ok()
    }

    async fn element(&self, css: &str) -> Element {
        self.wait()
            .at_most(WAIT)
            .every(POLL)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css} on the page: {e}"))
    }

    async fn until_text(
        &self,
        css: &str,
        what: &str,
        want: impl Fn(&str) -> bool + Send,
    ) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let text = self.text_of(css).await;
            if let Some(t) = &text
                && want(t)
            {
                return t.clone();
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {css} to show {what}; it shows {text:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    async fn until_js(&self, js: &str, what: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let v = self
                .execute(&format!("return Boolean({js});"), vec![])
                .await;
            if matches!(v, Ok(serde_json::Value::Bool(true))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} ({js}): {v:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }
}
