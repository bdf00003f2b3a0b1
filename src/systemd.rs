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
