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
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::admission::Place;
use super::command::{self, MAX_KEY_BYTES, MAX_VALUE_BYTES, Pending, Step};
use super::frame::{self, Limits, Parsed, ProtocolError};
use super::reply::Reply;
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
                        Ok(slot) => {
                            let _ = socket.set_nodelay(true);
                            let ctx = self.ctx.clone();
                            let options = self.options.clone();
                            let stop = stop.clone();
                            connections.spawn(async move {
                                let _slot = slot;
                                serve(ctx, socket, Some(peer.ip()), options, stop).await
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

/// Replies buffered before they are written: past this, the connection
/// writes (and waits for the client to read) before it encodes or runs
/// more, so a pipeline of large replies (GETs, `SET … GET` of 1 MiB
/// values) never makes the server hold more than this and one reply.
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
    /// Evicted while unauthenticated, to make room for a newer connection
    /// (see [`super::admission`]).
    Evicted,
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
/// set) a request may be at most [`PREAUTH_LIMITS`], the connection must
/// authenticate within `auth_timeout` (its writes too), and it holds a
/// place among the waiting that newer connections can take
/// ([`super::admission`]); after it, a request is at most
/// [`MAX_REQUEST_BYTES`]. At most [`FLUSH_BYTES`] of replies (and one more
/// reply) are buffered. Every deadline measures progress, not bytes: the
/// idle deadline runs from the last whole command (a byte now and then does
/// not reset it), and a write must be taken whole within `write_timeout`.
pub async fn serve<S>(
    ctx: Arc<Context>,
    socket: S,
    peer: Option<std::net::IpAddr>,
    opts: RespOptions,
    stop: watch::Receiver<bool>,
) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut session = Session::new(&ctx);
    session.peer = peer;
    let place = (!session.authenticated).then(|| ctx.waiting.enter(peer));
    let mut conn = Conn {
        input: BytesMut::with_capacity(if session.authenticated {
            16 * 1024
        } else {
            PREAUTH_LIMITS.max_bytes
        }),
        out: BytesMut::with_capacity(16 * 1024),
        queue: VecDeque::new(),
        last_command: Instant::now(),
        auth_deadline: Instant::now() + opts.auth_timeout,
        place,
        socket,
        opts,
        session,
        ctx,
    };
    match conn.run(stop).await {
        Ok(never) => match never {},
        Err(Ended::Evicted) => {
            // Best effort: it is a stranger, and may not read.
            let _ = tokio::time::timeout(
                Duration::from_millis(100),
                conn.socket.write_all(EVICTED.as_bytes()),
            )
            .await;
            Ended::Evicted
        }
        Err(ended) => ended,
    }
}

/// What an evicted connection is told.
const EVICTED: &str =
    "-ERR too many connections are waiting to authenticate: authenticate promptly\r\n";

/// One connection's state.
struct Conn<S> {
    ctx: Arc<Context>,
    socket: S,
    opts: RespOptions,
    session: Session,
    /// What was read and not yet run.
    input: BytesMut,
    /// Replies encoded and not yet written.
    out: BytesMut,
    /// Replies of the commands run, in order, some waiting for a commit.
    queue: VecDeque<Queued>,
    /// When the last whole command arrived.
    last_command: Instant,
    /// When an unauthenticated connection is closed.
    auth_deadline: Instant,
    /// Its place among the connections waiting to authenticate.
    place: Option<Place>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Serves until the connection ends (the `Err`).
    async fn run(
        &mut self,
        mut stop: watch::Receiver<bool>,
    ) -> Result<std::convert::Infallible, Ended> {
        loop {
            let (broken, starved, need) = self.run_buffered().await?;
            self.drain().await?;
            if let Some(e) = &broken {
                Reply::err(e).encode(self.session.protocol, &mut self.out);
            }
            self.flush().await?;
            if self.session.closing || broken.is_some() {
                let _ = tokio::time::timeout(self.opts.write_timeout, self.socket.shutdown()).await;
                if broken.is_some() {
                    linger(&mut self.socket).await;
                    return Err(Ended::Protocol);
                }
                return Err(Ended::Closed);
            }
            if !starved {
                // Stopped to write: what is buffered runs before reading more.
                continue;
            }
            self.read_more(need, &mut stop).await?;
        }
    }

    /// Runs the whole commands buffered, until they run out, the replies
    /// should go out first, or one breaks the protocol. Returns the
    /// protocol error, whether it ran out (and then how many more bytes
    /// the next request needs).
    async fn run_buffered(&mut self) -> Result<(Option<ProtocolError>, bool, usize), Ended> {
        while !self.session.closing
            && self.out.len() < FLUSH_BYTES
            && self.queue.len() < FLUSH_QUEUED
        {
            let limits = if self.session.authenticated {
                REQUEST_LIMITS
            } else {
                PREAUTH_LIMITS
            };
            let args = match frame::parse(&mut self.input, limits) {
                Ok(Parsed::Command(args)) => args,
                Ok(Parsed::Incomplete { need }) => return Ok((None, true, need)),
                Err(e) => return Ok((Some(e), false, 0)),
            };
            self.last_command = Instant::now();
            if args.is_empty() {
                continue;
            }
            if !command::is_queued(&args) {
                self.drain().await?;
            }
            let was_authenticated = self.session.authenticated;
            match command::run(&self.ctx, &mut self.session, args).await {
                Step::Reply(r) if self.queue.is_empty() => {
                    r.encode(self.session.protocol, &mut self.out);
                }
                Step::Reply(r) => self.queue.push_back(Queued::Ready(r)),
                Step::Write(p) => self.queue.push_back(Queued::Write(p)),
            }
            match (was_authenticated, self.session.authenticated) {
                // Authenticated: it leaves the waiting, and may send
                // full-size requests.
                (false, true) => self.place = None,
                // RESET without a token set again: a new deadline, and a
                // place among the waiting.
                (true, false) => {
                    self.auth_deadline = Instant::now() + self.opts.auth_timeout;
                    self.place = Some(self.ctx.waiting.enter(self.session.peer));
                }
                _ => {}
            }
        }
        Ok((None, false, 0))
    }

    /// Waits for every queued reply in order and encodes it, writing
    /// whenever [`FLUSH_BYTES`] are buffered.
    async fn drain(&mut self) -> Result<(), Ended> {
        while let Some(q) = self.queue.pop_front() {
            let reply = match q {
                Queued::Ready(r) => r,
                Queued::Write(p) => p.await,
            };
            reply.encode(self.session.protocol, &mut self.out);
            if self.out.len() >= FLUSH_BYTES {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Writes what is buffered, within `write_timeout` (and, before
    /// authentication, the auth deadline).
    async fn flush(&mut self) -> Result<(), Ended> {
        if self.out.is_empty() {
            return Ok(());
        }
        let mut deadline = Instant::now() + self.opts.write_timeout;
        let mut why = Ended::WriteTimeout;
        if self.place.is_some() && self.auth_deadline < deadline {
            deadline = self.auth_deadline;
            why = Ended::AuthTimeout;
        }
        let write = tokio::time::timeout_at(deadline, self.socket.write_all(&self.out));
        let written = match &self.place {
            Some(place) => tokio::select! {
                w = write => w,
                () = place.evicted() => return Err(Ended::Evicted),
            },
            None => write.await,
        };
        match written {
            Ok(Ok(())) => {
                self.out.clear();
                Ok(())
            }
            Ok(Err(_)) => Err(Ended::Failed),
            Err(_) => Err(why),
        }
    }

    /// Reads more of the next request (`need` bytes of it are missing),
    /// until the idle or auth deadline.
    async fn read_more(
        &mut self,
        need: usize,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), Ended> {
        // Room for what the request still needs (its size is checked), so
        // a large value arrives in few reads.
        self.input.reserve(need.min(MAX_REQUEST_BYTES));
        let idle_at = self.last_command + self.opts.idle_timeout;
        let (deadline, why) = if self.place.is_none() || self.auth_deadline >= idle_at {
            (idle_at, Ended::Idle)
        } else {
            (self.auth_deadline, Ended::AuthTimeout)
        };
        let read = tokio::time::timeout_at(deadline, self.socket.read_buf(&mut self.input));
        let evicted = async {
            match &self.place {
                Some(place) => place.evicted().await,
                None => std::future::pending().await,
            }
        };
        let read = tokio::select! {
            read = read => read,
            () = evicted => return Err(Ended::Evicted),
            _ = stop.changed() => return Err(Ended::Stopped),
        };
        match read {
            Ok(Ok(n)) if n > 0 => Ok(()),
            Ok(Ok(_)) => Err(Ended::Closed),
            Ok(Err(_)) => Err(Ended::Failed),
            Err(_) => Err(why),
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
        start_from(ctx, opts, capacity, None)
    }

    /// [`start`], for a client at `peer`.
    fn start_from(
        ctx: &Arc<Context>,
        opts: &RespOptions,
        capacity: usize,
        peer: Option<std::net::IpAddr>,
    ) -> (
        DuplexStream,
        tokio::task::JoinHandle<Ended>,
        watch::Sender<bool>,
    ) {
        let (client, server) = tokio::io::duplex(capacity);
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(serve(ctx.clone(), server, peer, opts.clone(), stop));
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
    async fn a_newer_stranger_evicts_the_oldest_and_an_authenticated_client_is_not_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options();
        let ctx = context(&dir, true, &opts).await;
        let ip = |s: &str| Some(s.parse().unwrap());
        let (mut first, first_task, _s1) = start_from(&ctx, &opts, 64 * 1024, ip("10.0.0.1"));
        let (mut second, _t2, _s2) = start_from(&ctx, &opts, 64 * 1024, ip("10.0.0.2"));
        // Both wait; let them reach their first read.
        second.write_all(&encode(&[b"PING"])).await.unwrap();
        let noauth = b"-NOAUTH Authentication required.\r\n";
        assert_eq!(read_exact(&mut second, noauth.len()).await, noauth);
        assert_eq!(ctx.waiting(), 2);
        // A third: over the bound of two, the oldest (first) makes room.
        let (mut third, _t3, _s3) = start_from(&ctx, &opts, 64 * 1024, ip("10.0.0.3"));
        assert_eq!(ended(first_task).await, Ended::Evicted);
        let mut told = Vec::new();
        first.read_to_end(&mut told).await.unwrap();
        assert_eq!(told, EVICTED.as_bytes());
        // The second authenticates: it no longer waits, and nobody evicts it.
        second
            .write_all(&encode(&[b"AUTH", TOKEN.as_bytes()]))
            .await
            .unwrap();
        assert_eq!(read_exact(&mut second, 5).await, b"+OK\r\n");
        let (_fourth, _t4, _s4) = start_from(&ctx, &opts, 64 * 1024, ip("10.0.0.4"));
        third.write_all(&encode(&[b"PING"])).await.unwrap();
        assert_eq!(read_exact(&mut third, noauth.len()).await, noauth);
        assert_eq!(ctx.waiting(), 2);
        second.write_all(&encode(&[b"PING"])).await.unwrap();
        assert_eq!(read_exact(&mut second, 7).await, b"+PONG\r\n");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stranger_that_never_reads_is_closed_at_the_auth_deadline_not_the_write_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options();
        let ctx = context(&dir, true, &opts).await;
        // Replies to 200,000 HELLOs (NOAUTH errors) do not fit a 4 KiB pipe.
        let (mut client, task, _stop) = start(&ctx, &opts, 4 * 1024);
        let opened = Instant::now();
        let hello = encode(&[b"HELLO"]);
        let writer = tokio::spawn(async move {
            for _ in 0..200_000 {
                if client.write_all(&hello).await.is_err() {
                    break;
                }
            }
            client
        });
        assert_eq!(ended(task).await, Ended::AuthTimeout);
        assert!(Instant::now() - opened <= opts.auth_timeout + Duration::from_secs(1));
        drop(writer);
    }

    #[tokio::test(start_paused = true)]
    async fn without_tokens_nobody_waits() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options();
        let open = context(&dir, false, &opts).await;
        let held: Vec<_> = (0..5).map(|_| start(&open, &opts, 1024)).collect();
        tokio::task::yield_now().await;
        assert_eq!(open.waiting(), 0);
        assert_eq!(held.len(), 5);
    }
}
