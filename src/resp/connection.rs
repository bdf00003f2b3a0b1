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
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::command::{self, MAX_KEY_BYTES, MAX_VALUE_BYTES, Pending, Step};
use super::frame::{self, Limits, Parsed};
use super::reply::{Protocol, Reply};
use super::{Context, Session};
use crate::auth::ApiTokens;
use crate::clock::SharedClock;
use crate::store::keyspace::Keyspace;

/// Largest request (one command with its arguments) accepted, in bytes: a
/// key and a value of the largest sizes stored, and room for options.
/// A longer one is a protocol error and the connection is closed.
pub const MAX_REQUEST_BYTES: usize = MAX_VALUE_BYTES + MAX_KEY_BYTES + 64 * 1024;

/// An authenticated connection's requests. Every word takes at least 6
/// bytes on the wire (`$0\r\n\r\n`), so the byte limit bounds the words
/// too; the word limit keeps a `DEL` of many keys to a sane size.
pub const REQUEST_LIMITS: Limits = Limits {
    max_args: 64 * 1024,
    max_bytes: MAX_REQUEST_BYTES,
};

/// Requests before authentication (with tokens set): room for
/// `HELLO 3 AUTH default <token> SETNAME <name>`, and nothing a stranger
/// could use to make the server hold memory.
pub const PREAUTH_LIMITS: Limits = Limits {
    max_args: 8,
    max_bytes: 4 * 1024,
};

/// How the listener runs.
#[derive(Debug, Clone)]
pub struct RespOptions {
    /// Most open connections.
    pub max_connections: usize,
    /// Most connections not yet authenticated (with tokens set); more are
    /// refused, so strangers cannot take every slot.
    pub max_unauthenticated: usize,
    /// A connection that completes no command for this long is closed.
    pub idle_timeout: Duration,
    /// A connection that has not authenticated this long after it opened
    /// (with tokens set) is closed.
    pub auth_timeout: Duration,
    /// A client that does not take a batch of replies within this long is
    /// disconnected, so one that never reads cannot hold its slot.
    pub write_timeout: Duration,
}

/// A bound, not yet running listener.
#[derive(Debug)]
pub struct RespServer {
    /// The socket, bound.
    listener: std::net::TcpListener,
    /// Shared by the connections.
    ctx: Arc<Context>,
    /// Deadlines for each connection.
    options: RespOptions,
}

impl RespServer {
    /// Binds `addr` (port 0 picks a free port).
    pub fn bind(
        addr: SocketAddr,
        keyspace: Keyspace,
        clock: SharedClock,
        tokens: ApiTokens,
        options: &RespOptions,
    ) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        Ok(Self {
            listener,
            ctx: Arc::new(Context::new(keyspace, clock, tokens, port, options)),
            options: options.clone(),
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
                    Ok((socket, peer)) => match self.ctx.admit() {
                        Ok((slot, unauthenticated)) => {
                            let _ = socket.set_nodelay(true);
                            let ctx = self.ctx.clone();
                            let options = self.options.clone();
                            let stop = stop.clone();
                            connections.spawn(async move {
                                let _slot = slot;
                                serve(ctx, socket, Some(peer.ip()), options, unauthenticated, stop)
                                    .await
                            });
                        }
                        Err(refusal) => {
                            connections.spawn(refuse(socket, refusal));
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

/// Answers a connection over a limit as Redis does, and closes it. The
/// error fits the socket's send buffer, so a client that never reads
/// cannot hold this up.
async fn refuse(mut socket: TcpStream, refusal: &'static str) -> Ended {
    let _ = socket.write_all(refusal.as_bytes()).await;
    let _ = socket.shutdown().await;
    Ended::Closed
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

/// Replies buffered before they are written: past this, the connection
/// writes (and waits for the client to read) before it runs more of what
/// it has read, so a pipeline of GETs of large values cannot make the
/// server hold their replies all at once.
const FLUSH_BYTES: usize = 64 * 1024;
/// Writes queued at the writer before the connection waits for their
/// replies.
const FLUSH_QUEUED: usize = 1024;

/// Why a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The client closed it, or QUIT.
    Closed,
    /// No whole command within `idle_timeout` of the last one.
    Idle,
    /// Not authenticated within `auth_timeout` while tokens are set.
    AuthTimeout,
    /// The client did not take the replies within `write_timeout`.
    WriteTimeout,
    /// The client broke the protocol (its error was sent).
    Protocol,
    /// The listener stopped.
    Stopped,
    /// Reading or writing failed.
    Failed,
}

/// Serves one connection until it closes, goes idle, breaks the protocol,
/// or the listener stops.
///
/// What a client can hold is bounded: before authentication (with tokens
/// set) a request may be at most [`PREAUTH_LIMITS`] and the connection must
/// authenticate within `auth_timeout`; after it, a request is at most
/// [`MAX_REQUEST_BYTES`]. Every deadline measures progress, not bytes: the
/// idle deadline runs from the last whole command (a byte now and then does
/// not reset it), and a write must be taken whole within `write_timeout`.
pub async fn serve<S>(
    ctx: Arc<Context>,
    mut socket: S,
    peer: Option<std::net::IpAddr>,
    opts: RespOptions,
    mut unauthenticated: Option<OwnedSemaphorePermit>,
    mut stop: watch::Receiver<bool>,
) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut session = Session::new(&ctx);
    session.peer = peer;
    let mut input = BytesMut::with_capacity(if session.authenticated {
        16 * 1024
    } else {
        PREAUTH_LIMITS.max_bytes
    });
    let mut out = BytesMut::with_capacity(16 * 1024);
    let mut queue = VecDeque::new();
    let mut last_command = Instant::now();
    let mut auth_deadline = Instant::now() + opts.auth_timeout;
    loop {
        let mut broken = None;
        // Run what is buffered, until it runs out or the replies should go
        // out first.
        let mut need = 1;
        let mut starved = false;
        while !session.closing && out.len() < FLUSH_BYTES && queue.len() < FLUSH_QUEUED {
            let limits = if session.authenticated {
                REQUEST_LIMITS
            } else {
                PREAUTH_LIMITS
            };
            let args = match frame::parse(&mut input, limits) {
                Ok(Parsed::Command(args)) => args,
                Ok(Parsed::Incomplete { need: n }) => {
                    need = n;
                    starved = true;
                    break;
                }
                Err(e) => {
                    broken = Some(e);
                    break;
                }
            };
            last_command = Instant::now();
            if args.is_empty() {
                continue;
            }
            if !command::is_queued(&args[0]) {
                drain(&mut queue, session.protocol, &mut out).await;
            }
            let was_authenticated = session.authenticated;
            match command::run(&ctx, &mut session, args).await {
                Step::Reply(r) if queue.is_empty() => r.encode(session.protocol, &mut out),
                Step::Reply(r) => queue.push_back(Queued::Ready(r)),
                Step::Write(p) => queue.push_back(Queued::Write(p)),
            }
            match (was_authenticated, session.authenticated) {
                // Authenticated: it no longer counts against the
                // unauthenticated cap, and may send full-size requests.
                (false, true) => drop(unauthenticated.take()),
                // RESET without a token set again: a new deadline, and a
                // place under the cap (or the connection closes).
                (true, false) => {
                    auth_deadline = Instant::now() + opts.auth_timeout;
                    match ctx.unauthenticated.clone().try_acquire_owned() {
                        Ok(permit) => drop(unauthenticated.replace(permit)),
                        Err(_) => session.closing = true,
                    }
                }
                _ => {}
            }
        }
        drain(&mut queue, session.protocol, &mut out).await;
        if let Some(e) = &broken {
            Reply::err(e).encode(session.protocol, &mut out);
        }
        if !out.is_empty() {
            match tokio::time::timeout(opts.write_timeout, socket.write_all(&out)).await {
                Ok(Ok(())) => out.clear(),
                Ok(Err(_)) => return Ended::Failed,
                Err(_) => return Ended::WriteTimeout,
            }
        }
        if session.closing || broken.is_some() {
            let _ = tokio::time::timeout(opts.write_timeout, socket.shutdown()).await;
            if broken.is_some() {
                linger(&mut socket).await;
                return Ended::Protocol;
            }
            return Ended::Closed;
        }
        if !starved {
            // Stopped to write: what is buffered runs before reading more.
            continue;
        }
        // Room for what the request still needs (its size is checked), so
        // a large value arrives in few reads.
        input.reserve(need.min(MAX_REQUEST_BYTES));
        let idle_at = last_command + opts.idle_timeout;
        let (deadline, why) = if session.authenticated || auth_deadline >= idle_at {
            (idle_at, Ended::Idle)
        } else {
            (auth_deadline, Ended::AuthTimeout)
        };
        let read = tokio::select! {
            read = tokio::time::timeout_at(deadline, socket.read_buf(&mut input)) => read,
            _ = stop.changed() => return Ended::Stopped,
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) => return Ended::Closed,
            Ok(Err(_)) => return Ended::Failed,
            Err(_) => return why,
        }
    }
}

/// After a protocol error: reads and drops what the client still sends,
/// for a moment, before the socket closes. Closing with unread input makes
/// the kernel answer with a reset, and a reset can make the client lose
/// the error it was sent; this gives it the error and an orderly end.
/// Bounded in time and bytes, so it holds nothing for long.
async fn linger<S: AsyncRead + Unpin>(socket: &mut S) {
    const LINGER: Duration = Duration::from_secs(1);
    const MOST: usize = 4 * 1024 * 1024;
    let until = Instant::now() + LINGER;
    let mut scratch = [0u8; 16 * 1024];
    let mut dropped = 0;
    while dropped < MOST {
        match tokio::time::timeout_at(until, socket.read(&mut scratch)).await {
            Ok(Ok(n)) if n > 0 => dropped += n,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Deadlines and limits, over an in-memory stream with tokio's paused
    //! clock: every wait below is virtual time, moved by the runtime.

    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;
    use crate::clock::ManualClock;
    use crate::config::Secret;
    use crate::config::Settings;
    use crate::store::CommitMetrics;

    const TOKEN: &str = "resp-test-token-0123456789";

    fn options() -> RespOptions {
        RespOptions {
            max_connections: 8,
            max_unauthenticated: 2,
            idle_timeout: Duration::from_secs(300),
            auth_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
        }
    }

    /// A context over a fresh file; with `tokens`, AUTH needs [`TOKEN`].
    async fn context(dir: &tempfile::TempDir, tokens: bool, opts: &RespOptions) -> Arc<Context> {
        let settings = Settings {
            data_path: dir.path().join("resp.redb"),
            ..Settings::default()
        };
        let opened = crate::store::open(&settings, CommitMetrics::default())
            .await
            .unwrap();
        let tokens = if tokens {
            ApiTokens::new(&[Secret::new(TOKEN)])
        } else {
            ApiTokens::new(&[])
        };
        Arc::new(Context::new(
            opened.keyspace,
            Arc::new(ManualClock::new(1_800_000_000_000)),
            tokens,
            6380,
            opts,
        ))
    }

    fn encode(words: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", words.len()).into_bytes();
        for w in words {
            out.extend(format!("${}\r\n", w.len()).as_bytes());
            out.extend(*w);
            out.extend(b"\r\n");
        }
        out
    }

    /// Starts serving one end of a pipe of `capacity` bytes; the other end
    /// is the client's.
    fn start(
        ctx: &Arc<Context>,
        opts: &RespOptions,
        capacity: usize,
    ) -> (
        DuplexStream,
        tokio::task::JoinHandle<Ended>,
        watch::Sender<bool>,
    ) {
        let (client, server) = tokio::io::duplex(capacity);
        let (stop_tx, stop) = watch::channel(false);
        let (_slot, unauthenticated) = ctx.admit().expect("admitted");
        let task = tokio::spawn(serve(
            ctx.clone(),
            server,
            None,
            opts.clone(),
            unauthenticated,
            stop,
        ));
        (client, task, stop_tx)
    }

    /// How the connection ended; a failure, not a hang, if it never does
    /// (an hour of virtual time).
    async fn ended(task: tokio::task::JoinHandle<Ended>) -> Ended {
        tokio::time::timeout(Duration::from_secs(3600), task)
            .await
            .expect("the connection should have ended")
            .unwrap()
    }

    /// Reads until `want` bytes arrived.
    async fn read_exact(client: &mut DuplexStream, want: usize) -> Vec<u8> {
        let mut got = vec![0; want];
        client.read_exact(&mut got).await.unwrap();
        got
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_that_complete_no_command_do_not_keep_a_connection_open() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options();
        let ctx = context(&dir, false, &opts).await;
        let (mut client, task, _stop) = start(&ctx, &opts, 64 * 1024);
        client.write_all(&encode(&[b"PING"])).await.unwrap();
        assert_eq!(read_exact(&mut client, 7).await, b"+PONG\r\n");
        let last_command = Instant::now();
        // One byte of a never-ending request every 100 s.
        let trickle = b"*2\r\n$4\r\nECHO\r\n$99\r\n";
        for b in trickle {
            if task.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(100)).await;
            let _ = client.write_all(&[*b]).await;
        }
        assert_eq!(ended(task).await, Ended::Idle);
        let waited = Instant::now() - last_command;
        assert!(
            waited >= opts.idle_timeout && waited < opts.idle_timeout + Duration::from_secs(101),
            "closed {waited:?} after the last command"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_reads_is_disconnected_after_the_write_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options();
        let ctx = context(&dir, false, &opts).await;
        // The pipe holds 4 KiB: the replies to 64 echoes of 8 KiB do not fit.
        let (mut client, task, _stop) = start(&ctx, &opts, 4 * 1024);
        let value = vec![b'v'; 8 * 1024];
        let echo = encode(&[b"ECHO", &value]);
        let started = Instant::now();
        let writer = tokio::spawn(async move {
            for _ in 0..64 {
                if client.write_all(&echo).await.is_err() {
                    break;
                }
            }
            client
        });
        assert_eq!(ended(task).await, Ended::WriteTimeout);
        assert!(Instant::now() - started >= opts.write_timeout);
        drop(writer);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_must_authenticate_within_the_auth_timeout_whatever_it_sends() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options();
        let ctx = context(&dir, true, &opts).await;
        let (mut client, task, _stop) = start(&ctx, &opts, 64 * 1024);
        let opened = Instant::now();
        let noauth = b"-NOAUTH Authentication required.\r\n";
        // A command every second is progress, but not authentication.
        for _ in 0..30 {
            if client.write_all(&encode(&[b"GET", b"k"])).await.is_err() {
                break;
            }
            let mut reply = vec![0; noauth.len()];
            if client.read_exact(&mut reply).await.is_err() {
                break;
            }
            assert_eq!(reply, noauth);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(ended(task).await, Ended::AuthTimeout);
        let waited = Instant::now() - opened;
        assert!(
            waited >= opts.auth_timeout && waited <= opts.auth_timeout + Duration::from_secs(2),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_authenticated_connection_has_no_auth_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options();
        let ctx = context(&dir, true, &opts).await;
        let (mut client, task, stop) = start(&ctx, &opts, 64 * 1024);
        client
            .write_all(&encode(&[b"AUTH", TOKEN.as_bytes()]))
            .await
            .unwrap();
        assert_eq!(read_exact(&mut client, 5).await, b"+OK\r\n");
        tokio::time::sleep(opts.auth_timeout * 5).await;
        client.write_all(&encode(&[b"PING"])).await.unwrap();
        assert_eq!(read_exact(&mut client, 7).await, b"+PONG\r\n");
        stop.send(true).unwrap();
        assert_eq!(ended(task).await, Ended::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn before_auth_a_large_request_is_refused_from_its_header_and_after_auth_it_is_served() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options();
        let ctx = context(&dir, true, &opts).await;
        // A stranger declares 1.1 MB: refused before the bytes come.
        let (mut client, task, _stop) = start(&ctx, &opts, 64 * 1024);
        client
            .write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1100000\r\nvvvv")
            .await
            .unwrap();
        let mut reply = Vec::new();
        client.read_to_end(&mut reply).await.unwrap();
        assert!(
            reply.starts_with(b"-ERR Protocol error: a request of more than 4096 bytes"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
        assert_eq!(ended(task).await, Ended::Protocol);

        // Authenticated, 100 KB is an ordinary request.
        let (mut client, task, stop) = start(&ctx, &opts, 256 * 1024);
        let value = vec![b'v'; 100_000];
        let mut pipeline = encode(&[b"AUTH", TOKEN.as_bytes()]);
        pipeline.extend(encode(&[b"ECHO", &value]));
        client.write_all(&pipeline).await.unwrap();
        let want = 5 + "$100000\r\n".len() + value.len() + 2;
        let got = read_exact(&mut client, want).await;
        assert!(got.starts_with(b"+OK\r\n$100000\r\nvvv"));
        stop.send(true).unwrap();
        assert_eq!(ended(task).await, Ended::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn deep_nesting_before_auth_is_a_protocol_error_not_a_stack_overflow() {
        let opts = options();
        for tokens in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let ctx = context(&dir, tokens, &opts).await;
            let (mut client, task, _stop) = start(&ctx, &opts, 256 * 1024);
            let mut packet = b"*1\r\n".repeat(20_000);
            packet.extend(b"$1\r\nx\r\n");
            // The server answers from the first bytes and closes; the rest
            // of the packet may not be taken.
            let _ = client.write_all(&packet).await;
            let mut reply = Vec::new();
            let _ = client.read_to_end(&mut reply).await;
            assert!(
                reply.starts_with(b"-ERR Protocol error: expected '$', got '*'"),
                "{}",
                String::from_utf8_lossy(&reply)
            );
            assert_eq!(ended(task).await, Ended::Protocol);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn unauthenticated_connections_are_capped_and_authenticating_frees_a_place() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options();
        let ctx = context(&dir, true, &opts).await;
        let (mut first, _t1, _s1) = start(&ctx, &opts, 64 * 1024);
        let (_second, _t2, _s2) = start(&ctx, &opts, 64 * 1024);
        assert_eq!(
            ctx.admit().err(),
            Some(super::super::TOO_MANY_UNAUTHENTICATED),
            "a third stranger is refused"
        );
        first
            .write_all(&encode(&[b"AUTH", TOKEN.as_bytes()]))
            .await
            .unwrap();
        assert_eq!(read_exact(&mut first, 5).await, b"+OK\r\n");
        assert!(ctx.admit().is_ok(), "the authenticated one left the cap");
        // Without tokens there is no such cap.
        let open = context(&tempfile::tempdir().unwrap(), false, &opts).await;
        let held: Vec<_> = (0..5).map(|_| open.admit().unwrap()).collect();
        assert_eq!(held.len(), 5);
    }
}
