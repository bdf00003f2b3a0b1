//! systemd integration over `sd_notify`: `READY=1` once the store is open
//! and the listener bound, `WATCHDOG=1` while the writer and the dispatcher
//! are alive, `STOPPING=1` on SIGTERM, and `STATUS=` lines saying which.
//! Outside systemd (no `NOTIFY_SOCKET`) every call does nothing.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::watch;

use crate::gateway::delivery::Dispatcher;
use crate::store::inbox::Inbox;

/// What must be alive for the service to be: the store's writer (a commit
/// or sync that never returns stops it) and the delivery dispatcher.
#[derive(Debug, Clone)]
pub struct Liveness {
    /// The inbox whose writer is asked (the data file's writer, which
    /// every write of the file goes through).
    pub inbox: Arc<dyn Inbox>,
    /// The dispatcher whose loop must go round.
    pub dispatcher: Arc<Dispatcher>,
}

impl Liveness {
    /// `Ok` when both answer within `within`; otherwise which one does not.
    pub async fn check(&self, within: Duration) -> Result<(), &'static str> {
        if !self.inbox.writer_responds(within).await {
            return Err("the store's writer does not respond");
        }
        if !self.dispatcher.is_alive(within) {
            return Err("the delivery dispatcher does not respond");
        }
        Ok(())
    }
}

/// How much more time each extension of the start asks for.
const EXTEND_BY: Duration = Duration::from_secs(60);
/// How often an extension is sent: well within [`EXTEND_BY`].
const EXTEND_EVERY: Duration = Duration::from_secs(20);
/// The longest start extended: past it, `TimeoutStartSec=` applies again
/// and a start that hangs is killed.
const EXTEND_FOR: Duration = Duration::from_secs(3600);

/// While the service starts: asks systemd for a minute more at once and
/// every 20 s (`EXTEND_TIMEOUT_USEC`), for an hour at most, until the
/// returned guard is dropped (before [`ready`]). Opening a large data file
/// replays its log, and after an upgrade may migrate its schema in one
/// transaction: past `TimeoutStartSec=` systemd killed it, the migration
/// rolled back, and `Restart=` began it again, for ever.
pub fn extend_start() -> StartExtension {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return StartExtension::default();
    }
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let usec = u32::try_from(EXTEND_BY.as_micros()).unwrap_or(u32::MAX);
    let thread = std::thread::Builder::new()
        .name("dedupd-start".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            loop {
                send(&[
                    NotifyState::ExtendTimeoutUsec(usec),
                    NotifyState::Status("starting: opening the data file"),
                ]);
                match wait.recv_timeout(EXTEND_EVERY) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                        if started.elapsed() < EXTEND_FOR => {}
                    _ => return,
                }
            }
        })
        .ok();
    StartExtension {
        done: Some(done),
        thread,
    }
}

/// Extends the start until dropped ([`extend_start`]).
#[derive(Debug, Default)]
pub struct StartExtension {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for StartExtension {
    fn drop(&mut self) {
        // Its thread sends nothing after this returns, so `READY=1` and
        // its status come last.
        self.done.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Tells systemd the service is ready, with a status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Sets the status line `systemctl status` shows (after a reload).
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Tells systemd the service is stopping.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// The watchdog period systemd asked for (`WATCHDOG_USEC`), if any.
pub fn watchdog_period() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|d| !d.is_zero())
}

/// Pings systemd's watchdog every half `period` while `liveness` holds,
/// until `stop`. When a part stops answering the pings stop too, so
/// systemd restarts the service after `period`; the status says why.
pub async fn watchdog(liveness: Liveness, period: Duration, mut stop: watch::Receiver<bool>) {
    let every = period / 2;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        // Answering within a quarter of the period leaves time to ping.
        match liveness.check(every / 2).await {
            Ok(()) => {
                if failing {
                    tracing::info!("writer and dispatcher respond again: watchdog pings resume");
                    send(&[NotifyState::Watchdog, NotifyState::Status("serving")]);
                } else {
                    send(&[NotifyState::Watchdog]);
                }
                failing = false;
            }
            Err(what) => {
                if !failing {
                    tracing::error!(
                        problem = what,
                        "watchdog pings stop: systemd restarts dedupd unless it recovers"
                    );
                    send(&[NotifyState::Status(what)]);
                }
                failing = true;
            }
        }
    }
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}
