//! HTTP connections as a stop sees them: how many are open, and how many
//! of those carry a backup's answer.
//!
//! A graceful stop (SIGTERM, SIGINT) lets in-flight requests finish:
//! actix-web waits, up to `http.shutdown_timeout`, until every connection
//! has closed. A backup's answer is the one that need not finish: the stop
//! abandons the backup at once ([`crate::store::redb::Backups::stop`]; its
//! stream ends with an error), but the connection its answer goes out on
//! stays open until its client has read what was already sent, and actix
//! looks at the answer again only then: never, for a client that stopped
//! reading. So the app counts its connections in actix-web's `on_connect`
//! hook and the backup route marks the one its answer goes out on; once
//! every connection left carries a backup's answer, the stop closes them
//! (see [`crate::startup::Application::run_until_stopped`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use actix_web::dev::Extensions;
use tokio::sync::Notify;

/// The server's open connections, and those carrying a backup's answer.
#[derive(Debug, Default)]
pub struct Connections {
    counts: Mutex<Counts>,
    /// Told of every change of `counts`.
    changed: Notify,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    open: usize,
    /// Open connections with a backup's answer going out.
    backups: usize,
}

/// One open connection, in its connection data: counted until actix drops
/// it with the connection.
#[derive(Debug)]
pub struct Open(Arc<Connection>);

/// A connection's state; changed only under [`Connections::counts`].
#[derive(Debug)]
struct Connection {
    connections: Arc<Connections>,
    /// Backup answers on it (one at a time over HTTP/1).
    answers: AtomicUsize,
    closed: AtomicBool,
}

/// Marks its connection as carrying a backup's answer until dropped (with
/// the answer's body).
#[derive(Debug)]
pub struct BackupAnswer(Arc<Connection>);

impl Connections {
    /// None open yet.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the counts, then wakes whoever waits on them.
    fn update(&self, change: impl FnOnce(&mut Counts)) {
        change(&mut self.lock());
        self.changed.notify_waiters();
    }

    /// For `HttpServer::on_connect`: counts the connection while it is
    /// open.
    pub fn on_connect(self: &Arc<Self>, data: &mut Extensions) {
        self.update(|c| c.open += 1);
        data.insert(Open(Arc::new(Connection {
            connections: Arc::clone(self),
            answers: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        })));
    }

    /// Resolves once a backup's answer is going out and every open
    /// connection carries one: what a stop has left once it abandoned the
    /// backups.
    pub async fn only_backups_left(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the counts are read: no change is missed.
            changed.as_mut().enable();
            let c = *self.lock();
            if c.backups > 0 && c.open == c.backups {
                return;
            }
            changed.await;
        }
    }
}

impl Open {
    /// Marks this connection as carrying a backup's answer while the
    /// returned guard lives.
    pub fn backup_answer(&self) -> BackupAnswer {
        let conn = &self.0;
        conn.connections.update(|c| {
            if conn.answers.fetch_add(1, Ordering::Relaxed) == 0
                && !conn.closed.load(Ordering::Relaxed)
            {
                c.backups += 1;
            }
        });
        BackupAnswer(Arc::clone(conn))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let conn = &self.0;
        conn.connections.update(|c| {
            conn.closed.store(true, Ordering::Relaxed);
            c.open -= 1;
            if conn.answers.load(Ordering::Relaxed) > 0 {
                c.backups -= 1;
            }
        });
    }
}

impl Drop for BackupAnswer {
    fn drop(&mut self) {
        let conn = &self.0;
        conn.connections.update(|c| {
            if conn.answers.fetch_sub(1, Ordering::Relaxed) == 1
                && !conn.closed.load(Ordering::Relaxed)
            {
                c.backups -= 1;
            }
        });
    }
}

/// For `HttpServer::on_connect`: a connection whose answer is not read
/// (or not acknowledged) for `timeout` is closed by the kernel
/// (`TCP_USER_TIMEOUT`). actix has no write timeout of its own: a client
/// that pipelined requests and never read held its connection for ever,
/// and ten addresses doing it took every connection (an attack run).
pub fn close_unread_after(io: &dyn std::any::Any, timeout: std::time::Duration) {
    if let Some(stream) = io.downcast_ref::<tokio::net::TcpStream>()
        && let Err(e) = socket2::SockRef::from(stream).set_tcp_user_timeout(Some(timeout))
    {
        tracing::debug!(error = %e, "cannot set TCP_USER_TIMEOUT on a connection");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(connections: &Arc<Connections>) -> Extensions {
        let mut data = Extensions::new();
        connections.on_connect(&mut data);
        data
    }

    fn counts(connections: &Connections) -> (usize, usize) {
        let c = *connections.lock();
        (c.open, c.backups)
    }

    #[test]
    fn connections_are_counted_while_open_and_backup_answers_while_they_go_out() {
        let connections = Connections::new();
        let a = connect(&connections);
        let b = connect(&connections);
        assert_eq!(counts(&connections), (2, 0));
        let answer = a.get::<Open>().unwrap().backup_answer();
        assert_eq!(counts(&connections), (2, 1));
        // The answer ends first (the connection is kept alive)...
        drop(answer);
        assert_eq!(counts(&connections), (2, 0));
        // ...or the connection closes first (its answer dropped after).
        let answer = b.get::<Open>().unwrap().backup_answer();
        drop(b);
        assert_eq!(counts(&connections), (1, 0));
        drop(answer);
        assert_eq!(counts(&connections), (1, 0));
        drop(a);
        assert_eq!(counts(&connections), (0, 0));
    }

    /// A waker that records that it was woken.
    #[derive(Default)]
    struct Woken(AtomicBool);

    impl std::task::Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn only_backups_left_waits_for_every_other_connection_to_close() {
        use std::future::Future;
        let connections = Connections::new();
        let woken = Arc::new(Woken::default());
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut waiting = std::pin::pin!(connections.only_backups_left());
        // No connection: nothing to close.
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        let busy = connect(&connections);
        let backup = connect(&connections);
        let answer = backup.get::<Open>().unwrap().backup_answer();
        assert!(woken.0.swap(false, Ordering::SeqCst));
        // Another connection is open.
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        drop(busy);
        assert!(woken.0.load(Ordering::SeqCst), "the change wakes it");
        assert!(waiting.as_mut().poll(&mut cx).is_ready());
        drop(answer);
    }
}
