//! A real HTTP receiver standing in for the application behind the gateway:
//! it records what it gets and answers as the test tells it to.

use std::collections::HashMap;
use std::future::Future;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use actix_web::App;
use actix_web::HttpRequest;
use actix_web::HttpResponse;
use actix_web::HttpServer;
use actix_web::dev::ServerHandle;
use actix_web::web;
/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    /// Headers, names lowercased.
    pub headers: HashMap<String, String>,
    /// The body.
    pub body: Vec<u8>,
    /// The path and query it was sent to (`/hooks?n=1`).
    pub path: String,
    /// When it arrived.
    pub at: std::time::Instant,
}

impl Received {
    /// A header's value.
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
}

/// How the receiver answers.
#[derive(Debug, Clone, Copy)]
pub enum Behaviour {
    /// 204 to everything.
    Accept,
    /// 500 to the next `n` requests, then 204.
    FailTimes(usize),
    /// This status to everything.
    Always(u16),
    /// 307 to another path of itself.
    Redirect,
    /// 204 after this many milliseconds.
    Delay(u64),
    /// Holds requests (of this `run_id` only, or all) unanswered until
    /// [`Receiver::release`], then 204: a receiver that hangs, for as long
    /// as the test wants and no longer.
    Hold(Option<&'static str>),
    /// Holds requests whose query string is this one (`n=0`: one
    /// instance's, when each sends to its own `?n=I`), answers the others
    /// 204.
    HoldQuery(&'static str),
    /// This status with `Retry-After: value` to the next `times` requests,
    /// then 204.
    RetryAfter {
        status: u16,
        value: &'static str,
        times: usize,
    },
}

#[derive(Debug, Default)]
pub(crate) struct Concurrency {
    /// Requests being answered now, by the body's `run_id`.
    by_run: HashMap<String, usize>,
    /// Most requests of one run answered at once.
    max_per_run: usize,
    /// Requests being answered now.
    total: usize,
    /// Most requests answered at once.
    max_total: usize,
}

#[derive(Debug)]
pub(crate) struct State {
    received: Mutex<Vec<Received>>,
    behaviour: Mutex<Behaviour>,
    concurrency: Mutex<Concurrency>,
    /// Requests being held by [`Behaviour::Hold`] now.
    held: Mutex<usize>,
    /// Opens when the test releases held requests.
    released: tokio::sync::watch::Sender<bool>,
    /// The status held requests get when released.
    released_status: Mutex<u16>,
}

/// A running receiver.
pub struct Receiver {
    /// `http://127.0.0.1:{port}/hooks`.
    pub url: String,
    state: Arc<State>,
    handle: ServerHandle,
}

pub(crate) async fn hook(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<State>,
) -> HttpResponse {
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    state.received.lock().unwrap().push(Received {
        headers,
        body: body.to_vec(),
        path: req
            .uri()
            .path_and_query()
            .map_or_else(String::new, |p| p.as_str().to_owned()),
        at: std::time::Instant::now(),
    });
    let run_of = |body: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["run_id"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    let hold = match *state.behaviour.lock().unwrap() {
        Behaviour::Hold(None) => true,
        Behaviour::Hold(Some(run)) => run_of(&body) == run,
        Behaviour::HoldQuery(query) => req.query_string() == query,
        _ => false,
    };
    if hold {
        *state.held.lock().unwrap() += 1;
        let mut released = state.released.subscribe();
        let _ = released.wait_for(|r| *r).await;
        *state.held.lock().unwrap() -= 1;
        let status = *state.released_status.lock().unwrap();
        return HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
            .finish();
    }
    let delay = match *state.behaviour.lock().unwrap() {
        Behaviour::Delay(ms) => ms,
        _ => 0,
    };
    if delay > 0 {
        let run = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["run_id"].as_str().map(str::to_owned))
            .unwrap_or_default();
        {
            let mut c = state.concurrency.lock().unwrap();
            let n = c.by_run.entry(run.clone()).or_default();
            *n += 1;
            let n = *n;
            c.max_per_run = c.max_per_run.max(n);
            c.total += 1;
            c.max_total = c.max_total.max(c.total);
        }
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let mut c = state.concurrency.lock().unwrap();
        *c.by_run.entry(run).or_default() -= 1;
        c.total -= 1;
        return HttpResponse::NoContent().finish();
    }
    let mut behaviour = state.behaviour.lock().unwrap();
    match *behaviour {
        Behaviour::Accept | Behaviour::Delay(_) | Behaviour::Hold(_) | Behaviour::HoldQuery(_) => {
            HttpResponse::NoContent().finish()
        }
        Behaviour::FailTimes(0) => {
            *behaviour = Behaviour::Accept;
            HttpResponse::NoContent().finish()
        }
        Behaviour::FailTimes(n) => {
            *behaviour = Behaviour::FailTimes(n - 1);
            HttpResponse::InternalServerError().finish()
        }
        Behaviour::Always(code) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(code).unwrap()).finish()
        }
        Behaviour::Redirect => HttpResponse::TemporaryRedirect()
            .insert_header(("location", "/elsewhere"))
            .finish(),
        Behaviour::RetryAfter { times: 0, .. } => {
            *behaviour = Behaviour::Accept;
            HttpResponse::NoContent().finish()
        }
        Behaviour::RetryAfter {
            status,
            value,
            times,
        } => {
            *behaviour = Behaviour::RetryAfter {
                status,
                value,
                times: times - 1,
            };
            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
                .insert_header(("retry-after", value))
                .finish()
        }
    }
}

impl Receiver {
    /// Starts a receiver on a free port.
    pub async fn start(behaviour: Behaviour) -> Self {
        Self::start_on(0, behaviour).await
    }

    /// Starts a receiver on `port` (0: any free port).
    pub async fn start_on(port: u16, behaviour: Behaviour) -> Self {
        let state = Arc::new(State {
            received: Mutex::new(Vec::new()),
            behaviour: Mutex::new(behaviour),
            concurrency: Mutex::new(Concurrency::default()),
            held: Mutex::new(0),
            released: tokio::sync::watch::Sender::new(false),
            released_status: Mutex::new(204),
        });
        let data = web::Data::from(state.clone());
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/hooks", web::post().to(hook))
                .route("/elsewhere", web::post().to(hook))
                // Where `dedupd trigger --url` posts: a receiver standing in
                // for a server that is not dedupd.
                .route("/ingest/{source}", web::post().to(hook))
        })
        .workers(1)
        .max_connections(100_000)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            url: format!("http://127.0.0.1:{port}/hooks"),
            state,
            handle,
        }
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// Changes how the receiver answers from now on.
    pub fn set(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().unwrap() = behaviour;
    }

    /// With [`Behaviour::Delay`]: the most requests of one `run_id`, and
    /// of all runs, that were being answered at the same time.
    pub fn max_concurrency(&self) -> (usize, usize) {
        let c = self.state.concurrency.lock().unwrap();
        (c.max_per_run, c.max_total)
    }

    /// Requests held unanswered right now ([`Behaviour::Hold`]).
    pub fn held(&self) -> usize {
        *self.state.held.lock().unwrap()
    }

    /// Answers every held request, and every later one, with 204.
    pub fn release(&self) {
        self.release_to(Behaviour::Accept);
    }

    /// Answers every held request with 204, and later ones as `behaviour`.
    pub fn release_to(&self, behaviour: Behaviour) {
        self.set(behaviour);
        self.state.released.send_replace(true);
    }

    /// Answers every held request with `status`, and later ones as
    /// `behaviour`.
    pub fn release_with(&self, status: u16, behaviour: Behaviour) {
        *self.state.released_status.lock().unwrap() = status;
        self.release_to(behaviour);
    }

    /// Stops the receiver.
    pub async fn stop(self) {
        self.handle.stop(false).await;
    }
}

/// Waits until `check` holds, up to 30 s; panics with `what` otherwise.
/// Tests wait for outcomes this way — they never assert how long those
/// took; backoff and pauses only pass when a test moves the app's clock.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
