//! Building and running the application.
//!
//! [`Application::build`] opens the store, binds the listener (port 0 picks a
//! free port, which is how tests start the real app) and starts the reaper;
//! [`Application::run_until_stopped`] serves until [`StopHandle::stop`]
//! (the binary calls it on SIGTERM or SIGINT), then finishes in-flight
//! requests and deliveries, stops the reaper and closes the store so every
//! acknowledged write is committed. A backup being taken is not waited
//! for: the stop abandons it at once (see [`crate::connections`]).

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::{Server, ServerHandle};
use actix_web::{App, HttpServer, web};
use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::{ApiTokens, AuthLimiter};
use crate::clock::SharedClock;
use crate::config::sources::InboxPlace;
use crate::config::{Backend, Loaded};
use crate::connections::Connections;
use crate::gate::Gate;
use crate::gateway::alerts::Alerts;
use crate::gateway::delivery::{Coordination, DeliverySettings, Dispatcher};
use crate::gateway::filter;
use crate::gateway::jobs::Runner;
use crate::gateway::scan::{Budget, Scanner};
use crate::gateway::sources::{build_sources, source_names};
use crate::gateway::{Gateway, Sources};
use crate::peers::PeerConnections;
use crate::reaper::{Orphans, Reaper};
use crate::reload::Reloader;
use crate::resp::RespServer;
use crate::resp::connection::RespOptions;
use crate::routes::{self, AppState};
use crate::store::inbox::{Inbox, Retention};
use crate::store::redb::Backups;
use crate::store::{self, CommitMetrics, Opened, Store};
use crate::systemd::Liveness;
use crate::telemetry::metrics::Metrics;

/// A built, bound, not yet running application.
pub struct Application {
    port: u16,
    /// The HTTP server future.
    server: Server,
    /// Claims and ordering, closed after the server stops.
    store: Arc<dyn Store>,
    /// The data file's own store, closed last (the same as `store` with
    /// the embedded backend).
    file: Arc<dyn Store>,
    /// The gateway inbox, for the watchdog.
    inbox: Arc<dyn Inbox>,
    /// Tells the dispatcher and the reaper to stop.
    stop: watch::Sender<bool>,
    /// The delivery dispatcher task.
    dispatcher: JoinHandle<()>,
    /// The dispatcher itself, for the watchdog.
    dispatch: Arc<Dispatcher>,
    /// The reaper task.
    reaper: JoinHandle<()>,
    /// The Redis-protocol listener's port, when it is on.
    resp_port: Option<u16>,
    /// The Redis-protocol listener's task, when it is on.
    resp: Option<JoinHandle<()>>,
    /// What SIGHUP calls.
    reloader: Reloader,
    /// Backups of the data file: a stop abandons the one being taken.
    backups: Backups,
    /// The HTTP connections open, and those carrying a backup's answer.
    connections: Arc<Connections>,
}

impl std::fmt::Debug for Application {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Application")
            .field("port", &self.port)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Application {
    /// Opens the store named by the settings and builds the app over it.
    pub async fn build(loaded: Loaded, clock: SharedClock) -> anyhow::Result<Self> {
        let s = &loaded.settings;
        let metrics = Arc::new(Metrics::new(&source_names(s)));
        let opened = store::open(
            s,
            CommitMetrics {
                seconds: metrics.store_commit.clone(),
                batch_size: metrics.store_batch.clone(),
                checkpoint_seconds: metrics.store_checkpoint.clone(),
            },
        )
        .await?;
        // A shared inbox holds the heads itself, as the data file does; local
        // inboxes of several instances meet in the shared store.
        let coordination = match (s.storage.backend, s.gateway.inbox) {
            (Backend::Redb, _) | (_, InboxPlace::Shared) => Coordination::Inbox,
            (Backend::Redis, InboxPlace::Local) => Coordination::Shared(opened.claims.clone()),
        };
        Self::build_over(loaded, clock, opened, coordination, metrics)
    }

    /// Builds the app over an already open store (see [`store::open`]),
    /// with delivery coordinated as `coordination` says. The reaper works
    /// on the data file (`opened.file`): Redis expires its own keys. The
    /// file must have been opened with the settings'
    /// `gateway.dedupe_window`.
    pub fn build_with_store(
        loaded: Loaded,
        clock: SharedClock,
        opened: Opened,
        coordination: Coordination,
    ) -> anyhow::Result<Self> {
        // The store was opened without these: its commit histograms stay
        // empty.
        let metrics = Arc::new(Metrics::new(&source_names(&loaded.settings)));
        Self::build_over(loaded, clock, opened, coordination, metrics)
    }

    fn build_over(
        loaded: Loaded,
        clock: SharedClock,
        opened: Opened,
        coordination: Coordination,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let s = &loaded.settings;
        let Opened {
            claims: store,
            file,
            inbox,
            keyspace,
            backups,
        } = opened;
        // The reaper writes the inbox's dedupe records with the file's
        // window: one opened otherwise would quietly protect for less. The
        // file keeps whole milliseconds.
        anyhow::ensure!(
            inbox.dedupe_window().as_millis() == s.gateway.dedupe_window.as_millis(),
            "the data file was opened with a dedupe window of {}, not gateway.dedupe_window = {}",
            humantime::format_duration(inbox.dedupe_window()),
            humantime::format_duration(s.gateway.dedupe_window),
        );
        let sources = build_sources(&loaded)?;
        let listener = TcpListener::bind(s.listen)
            .with_context(|| format!("cannot listen on {}", s.listen))?;
        let port = listener.local_addr()?.port();
        // One table of failed authentications for every port, so a peer
        // cannot guess on one port while throttled on the other.
        let limiter = Arc::new(AuthLimiter::new(clock.clone()).with_metrics(metrics.clone()));
        let api_tokens = ApiTokens::new(&loaded.api_tokens)
            .with_read_only(&loaded.api_read_tokens)
            .with_limiter(limiter);
        let resp = match s.resp.listen {
            None => None,
            Some(_) if s.storage.backend == Backend::Redis => anyhow::bail!(
                "resp.listen: with storage.backend = \"redis\", point Redis clients at that Redis directly"
            ),
            Some(addr) => Some(
                RespServer::bind(
                    addr,
                    keyspace,
                    clock.clone(),
                    api_tokens.clone(),
                    &RespOptions {
                        max_connections: s.resp.max_connections,
                        max_unauthenticated: s.resp.max_unauthenticated,
                        idle_timeout: s.resp.idle_timeout,
                        auth_timeout: s.resp.auth_timeout,
                        write_timeout: s.resp.write_timeout,
                    },
                )
                .with_context(|| format!("cannot listen for the Redis protocol on {addr}"))?,
            ),
        };
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let gateway = Arc::new(Gateway::new(
            Sources::new(sources.iter().cloned()),
            inbox.clone(),
            Retention {
                delivered_ms: ms(s.gateway.delivered_retention),
                dead_ms: ms(s.gateway.dead_retention),
            },
            s.alerts.as_ref().map(|a| {
                Arc::new(
                    Alerts::new(clock.clone(), a.every, a.backlog_after)
                        .with_metrics(metrics.clone()),
                )
            }),
            Scanner::start(
                Budget {
                    rows: filter::MAX_SCAN,
                    bytes: s.gateway.scan_bytes,
                    time: s.gateway.scan_time,
                },
                s.gateway.max_scans,
            )
            .context("cannot start the scan thread")?,
        ));
        let dispatcher = Arc::new(
            Dispatcher::new(
                gateway.clone(),
                coordination,
                clock.clone(),
                DeliverySettings {
                    max_in_flight: s.gateway.max_in_flight,
                    ordering_retention_ms: ms(s.ordering.retention),
                    metrics: metrics.clone(),
                },
            )
            .context("cannot build the delivery HTTP client")?,
        );
        let state = web::Data::new(AppState {
            store: store.clone(),
            clock: clock.clone(),
            ttl: s.ttl_bounds(),
            retention_ms: ms(s.ordering.retention),
            max_body_bytes: s.http.max_body_bytes,
            max_result_bytes: s.claims.max_result_bytes,
            gateway: gateway.clone(),
            dispatcher: dispatcher.clone(),
            body_timeout: s.http.body_timeout,
            metrics: metrics.clone(),
            backups: backups.clone(),
        });
        let tokens = web::Data::new(api_tokens.clone());
        // The request log's own handle on the metrics, so telemetry needs
        // nothing from the routes.
        let request_metrics = web::Data::from(metrics.clone());
        let peers = PeerConnections::new(s.http.max_connections_per_address, Some(metrics.clone()));
        let connections = Connections::new();
        let counted = connections.clone();
        let write_timeout = s.http.write_timeout;
        let server = HttpServer::new(move || {
            // On the worker's thread and runtime, as it starts.
            crate::store::on_http_worker_start();
            App::new()
                // The request's record, the host check, and on `/v1` the
                // origin and token checks: one layer for all, before
                // routing (no path-rewriting layer may go inside it).
                .wrap(Gate)
                .app_data(state.clone())
                .app_data(request_metrics.clone())
                .app_data(tokens.clone())
                // `/v1` first: actix tries resources in order, and the claims
                // (the hottest routes) then skip the regex matches of
                // `/ingest/{source}` and `/ui/{file}`. No path overlaps.
                .service(web::scope(crate::gate::V1).configure(routes::configure_v1))
                .configure(routes::health::configure)
                .configure(routes::ingest::configure)
                .configure(routes::metrics::configure)
                .configure(routes::openapi::configure)
                .configure(routes::ui::configure)
                .default_service(web::to(routes::not_found))
        })
        // Signals are handled by the caller (see `main`): actix treats SIGINT
        // as a forced stop, and both must finish in-flight requests.
        .disable_signals()
        // Before `listen`: actix captures the hook when the listener binds.
        .on_connect(move |io, data| {
            counted.on_connect(data);
            peers.on_connect(io, data);
            crate::connections::close_unread_after(io, write_timeout);
        })
        .workers(s.http.workers)
        // actix counts connections per worker.
        .max_connections(s.http.max_connections.div_ceil(s.http.workers.max(1)))
        .client_request_timeout(s.http.header_timeout)
        .client_disconnect_timeout(std::time::Duration::from_secs(1))
        .shutdown_timeout(s.http.shutdown_timeout.as_secs().max(1))
        .listen(listener)?
        .run();

        let (stop, stop_rx) = watch::channel(false);
        let dispatch = dispatcher.clone();
        let dispatcher = tokio::spawn(dispatcher.run(stop_rx.clone()));
        let (orphans, orphans_rx) = watch::channel(crate::reload::configured(&sources));
        let reaper = Reaper::new(
            file.clone(),
            clock.clone(),
            s.reaper.interval,
            s.reaper.batch_size,
        )
        .with_metrics(metrics.clone())
        .with_orphans(Orphans {
            inbox: inbox.clone(),
            configured: orphans_rx,
            retention_ms: ms(s.gateway.dead_retention),
        });
        let resp_port = resp.as_ref().map(RespServer::port);
        let resp = resp.map(|r| tokio::spawn(r.run(stop_rx.clone())));
        let reaper = tokio::spawn(reaper.run(stop_rx.clone()));
        let jobs = Runner::new(
            gateway.clone(),
            store.clone(),
            dispatch.clone(),
            clock.clone(),
        );
        tokio::spawn(jobs.run(stop_rx.clone()));
        if let Some(alerts) = gateway.alerts.clone() {
            tokio::spawn(alerts.run(gateway.clone(), store.clone(), stop_rx.clone()));
        }
        tokio::spawn(upkeep(metrics.clone(), stop_rx));
        let reloader = Reloader::new(
            loaded,
            gateway,
            dispatch.clone(),
            api_tokens,
            metrics,
            orphans,
        );
        Ok(Self {
            port,
            server,
            store,
            file,
            inbox,
            stop,
            dispatcher,
            dispatch,
            reaper,
            resp_port,
            resp,
            reloader,
            backups,
            connections,
        })
    }

    /// The port the Redis-protocol listener listens on, when it is on.
    pub fn resp_port(&self) -> Option<u16> {
        self.resp_port
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What reloads the configuration while serving (SIGHUP calls it).
    pub fn reloader(&self) -> Reloader {
        self.reloader.clone()
    }

    /// A handle that stops the app.
    pub fn handle(&self) -> StopHandle {
        StopHandle {
            server: self.server.handle(),
            backups: self.backups.clone(),
        }
    }

    /// What the systemd watchdog checks: the writer and the dispatcher.
    pub fn liveness(&self) -> Liveness {
        Liveness {
            inbox: self.inbox.clone(),
            dispatcher: self.dispatch.clone(),
        }
    }

    /// Turns true once the app has stopped serving.
    pub fn stopped(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// The store the app serves.
    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// Serves until stopped, then shuts down in order: HTTP (in-flight
    /// requests finish; a backup's answer, abandoned, does not: once only
    /// such answers are left, their connections are closed), the
    /// Redis-protocol listener (commands read are answered), deliveries in
    /// flight, reaper, store and inbox (queued writes commit).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let mut server = self.server;
        let (backups, connections) = (self.backups.clone(), self.connections.clone());
        let abandoned = async move {
            backups.stopping().await;
            connections.only_backups_left().await;
        };
        let served = tokio::select! {
            served = &mut server => served,
            () = abandoned => {
                tracing::info!(
                    "closing the connections of backups stopped by the shutdown: no other \
                     request is in flight"
                );
                // Dropping the server stops its workers at once, closing
                // what connections they hold: only those answers.
                drop(server);
                Ok(())
            }
        };
        // Whatever ended HTTP, no backup goes on: its copy has let go of
        // the data file before the store closes.
        self.backups.stop().await;
        let _ = self.stop.send(true);
        if let Some(resp) = self.resp {
            let _ = resp.await;
        }
        let _ = self.dispatcher.await;
        let _ = self.reaper.await;
        self.store.close().await;
        self.file.close().await;
        served
    }
}

/// Stops the app: what SIGTERM and SIGINT call.
#[derive(Debug, Clone)]
pub struct StopHandle {
    server: ServerHandle,
    backups: Backups,
}

impl StopHandle {
    /// Stops serving: the listener closes, a graceful stop lets in-flight
    /// requests finish (up to `http.shutdown_timeout`), and a backup being
    /// taken is abandoned at once (its answer ends with an error, so its
    /// file is refused). Returns once HTTP has stopped.
    pub async fn stop(&self, graceful: bool) {
        tokio::join!(self.backups.stop(), self.server.stop(graceful));
    }
}

/// Folds histogram samples into buckets every few seconds, so memory stays
/// bounded between scrapes (or without any).
async fn upkeep(metrics: Arc<Metrics>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tick.tick() => metrics.upkeep(),
            _ = stop.changed() => return,
        }
    }
}
