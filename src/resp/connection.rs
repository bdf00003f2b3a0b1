//! The listener and its connections.
//!
//! Each connection reads what the client sent, decodes every complete
//! request in it, and runs them in order. Keyspace writes are handed to
//! the writer one after another without waiting, so a pipeline's writes
//! share one commit; any other command first waits for the replies of the
//! writes before it, so it sees their effects. Replies are written in
//! request order, each write's only after its commit is on disk.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use super::command::{self, MAX_KEY_BYTES, MAX_VALUE_BYTES, Pending, Step};
use super::reply::{Protocol, Reply};
use super::{Context, Session};
use crate::auth::ApiTokens;
use crate::clock::SharedClock;
use crate::store::redb::RedbStore;

/// Largest request (one command with its arguments) accepted, in bytes: a
/// key and a value of the largest sizes stored, and room for options.
/// A longer one is a protocol error and the connection is closed.
pub const MAX_REQUEST_BYTES: usize = MAX_VALUE_BYTES + MAX_KEY_BYTES + 64 * 1024;

/// How the listener runs.
#[derive(Debug, Clone)]
pub struct RespOptions {
    /// Most open connections.
    pub max_connections: usize,
    /// A connection idle this long is closed.
    pub idle_timeout: Duration,
}

/// A bound, not yet running listener.
#[derive(Debug)]
pub struct RespServer {
    /// The socket, bound.
    listener: std::net::TcpListener,
    /// Shared by the connections.
    ctx: Arc<Context>,
    /// A connection idle this long is closed.
    idle_timeout: Duration,
}

impl RespServer {
    /// Binds `addr` (port 0 picks a free port).
    pub fn bind(
        addr: SocketAddr,
        store: Arc<RedbStore>,
        clock: SharedClock,
        tokens: ApiTokens,
        options: &RespOptions,
    ) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let max = options.max_connections.max(1);
        Ok(Self {
            listener,
            ctx: Arc::new(Context {
                store,
                clock,
                tokens,
                port,
                max_connections: max,
                slots: Arc::new(Semaphore::new(max)),
                last_id: AtomicI64::new(0),
            }),
            idle_timeout: options.idle_timeout,
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.ctx.port
    }

    /// Accepts connections until `stop` turns true; then each connection
    /// finishes the commands it has read (their replies are written) and
    /// closes, and this returns once all have.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let listener = match TcpListener::from_std(self.listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "the Redis-protocol listener cannot start");
                return;
            }
        };
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        break;
                    }
                }
                accepted = listener.accept() => match accepted {
                    Ok((socket, _)) => match self.ctx.slots.clone().try_acquire_owned() {
                        Ok(slot) => {
                            connections.spawn(serve(
                                self.ctx.clone(),
                                socket,
                                slot,
                                self.idle_timeout,
                                stop.clone(),
                            ));
                        }
                        Err(_) => {
                            connections.spawn(refuse(socket));
                        }
                    },
                    Err(e) => {
                        // Out of file descriptors, usually: let some close.
                        tracing::warn!(error = %e, "RESP accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(listener);
        while connections.join_next().await.is_some() {}
    }
}

/// Answers a connection over the limit as Redis does, and closes it.
async fn refuse(mut socket: TcpStream) {
    let _ = socket
        .write_all(b"-ERR max number of clients reached\r\n")
        .await;
    let _ = socket.shutdown().await;
}

/// A reply in the making: known, or waiting for a commit.
enum Queued {
    /// Known.
    Ready(Reply),
    /// Comes once the write is committed.
    Write(Pending),
}

/// Waits for every queued reply in order and encodes it.
async fn drain(queue: &mut VecDeque<Queued>, protocol: Protocol, out: &mut BytesMut) {
    while let Some(q) = queue.pop_front() {
        let reply = match q {
            Queued::Ready(r) => r,
            Queued::Write(p) => p.await,
        };
        reply.encode(protocol, out);
    }
}

/// Serves one connection until it closes, goes idle, breaks the protocol,
/// or the listener stops.
async fn serve(
    ctx: Arc<Context>,
    mut socket: TcpStream,
    _slot: OwnedSemaphorePermit,
    idle_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let _ = socket.set_nodelay(true);
    let mut session = Session::new(&ctx);
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut out = BytesMut::with_capacity(16 * 1024);
    let mut queue = VecDeque::new();
    loop {
        let mut broken = None;
        while !session.closing {
            let frame = match redis_protocol::resp2::decode::decode_bytes_mut(&mut input) {
                Ok(Some((frame, _, _))) => frame,
                Ok(None) => break,
                Err(e) => {
                    broken = Some(format!("Protocol error: {}", e.details()));
                    break;
                }
            };
            let Some(args) = command::words(frame) else {
                broken = Some("Protocol error: expected an array of bulk strings".into());
                break;
            };
            if args.is_empty() {
                continue;
            }
            if !command::is_queued(&args[0]) {
                drain(&mut queue, session.protocol, &mut out).await;
            }
            match command::run(&ctx, &mut session, args).await {
                Step::Reply(r) if queue.is_empty() => r.encode(session.protocol, &mut out),
                Step::Reply(r) => queue.push_back(Queued::Ready(r)),
                Step::Write(p) => queue.push_back(Queued::Write(p)),
            }
        }
        drain(&mut queue, session.protocol, &mut out).await;
        if broken.is_none() && input.len() > MAX_REQUEST_BYTES {
            broken = Some(format!(
                "Protocol error: a request of more than {MAX_REQUEST_BYTES} bytes"
            ));
        }
        if let Some(message) = &broken {
            Reply::err(message).encode(session.protocol, &mut out);
        }
        if !out.is_empty() {
            if socket.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if session.closing || broken.is_some() {
            let _ = socket.shutdown().await;
            return;
        }
        let read = tokio::select! {
            read = tokio::time::timeout(idle_timeout, socket.read_buf(&mut input)) => read,
            _ = stop.changed() => return,
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            // Closed by the client, failed, or idle too long.
            _ => return,
        }
    }
}
